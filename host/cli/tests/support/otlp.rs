//! An OTLP/HTTP receiver on loopback, as a collector would be, for the
//! tests of what `keel` exports.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::{Request, Response};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

/// One request the receiver got: its content type and body.
pub type Received = Arc<Mutex<Vec<(String, Bytes)>>>;

/// An OTLP/HTTP receiver on `127.0.0.1`: it keeps every `POST /v1/traces`
/// and answers it as a collector does. Lives as long as the test process.
pub fn receiver() -> (SocketAddr, Received) {
    let received = Received::default();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    let kept = received.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let kept = kept.clone();
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                            let kept = kept.clone();
                            async move {
                                let path = request.uri().path().to_string();
                                let content_type = request
                                    .headers()
                                    .get(hyper::header::CONTENT_TYPE)
                                    .and_then(|value| value.to_str().ok())
                                    .unwrap_or_default()
                                    .to_string();
                                let body = request.into_body().collect().await.unwrap().to_bytes();
                                let status = if path == "/v1/traces" { 200 } else { 404 };
                                let json = content_type.starts_with("application/json");
                                if status == 200 {
                                    kept.lock().unwrap().push((content_type, body));
                                }
                                let answer: Bytes = if json {
                                    Bytes::from_static(b"{}")
                                } else {
                                    ExportTraceServiceResponse::default().encode_to_vec().into()
                                };
                                let mut response = Response::new(Full::new(answer));
                                *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                                Ok::<_, std::convert::Infallible>(response)
                            }
                        });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
    });
    (addr, received)
}

/// A string attribute's value.
pub fn attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a str> {
    attributes.iter().find(|pair| pair.key == key).and_then(|pair| {
        match pair.value.as_ref()?.value.as_ref()? {
            AnyValue::StringValue(text) => Some(text.as_str()),
            _ => None,
        }
    })
}

/// The exports received so far, each of which must be protobuf.
pub fn exports(received: &Received) -> Vec<ExportTraceServiceRequest> {
    let received = received.lock().unwrap();
    received
        .iter()
        .map(|(content_type, body)| {
            assert_eq!(content_type, "application/x-protobuf", "protobuf unless asked otherwise");
            ExportTraceServiceRequest::decode(body.clone()).expect("an OTLP trace export")
        })
        .collect()
}

/// Every span of the exports received so far ([`exports`]).
pub fn spans(received: &Received) -> Vec<Span> {
    exports(received)
        .into_iter()
        .flat_map(|request| request.resource_spans)
        .flat_map(|resource| resource.scope_spans)
        .flat_map(|scope| scope.spans)
        .collect()
}
