//! A loopback HTTP/1.1 server for the tests of guests' outbound HTTP: fixed
//! routes a test can predict the answer of, routes that misbehave on
//! purpose (a response that never comes, a body that stalls), and a record
//! of every request that reached it, so a test can also prove that a refused
//! request never left the host.
//!
//! It runs on a thread of its own with its own tokio runtime, so that sync
//! and async tests use it alike; dropping the [`TestServer`] stops it and
//! closes every connection it holds.
//!
//! ```no_run
//! use keel_tests::http_server::TestServer;
//!
//! let server = TestServer::start();
//! let url = server.url("/hello"); // "http://127.0.0.1:PORT/hello"
//! // ... a guest fetches `url` ...
//! assert_eq!(server.requests()[0].path, "/hello");
//! ```
//!
//! # Routes
//!
//! Query values are percent-decoded (see [`percent_encode`]).
//!
//! - `/hello`: 200, `text/plain`, [`HELLO`].
//! - `/echo`: 200, `application/json`:
//!   `{"method": .., "path": .., "headers": [[name, value], ..], "body": ..}`,
//!   the request as received (header names lowercase, as HTTP/1.1 makes no
//!   case distinction and the server reads them that way; values verbatim,
//!   `Authorization` included; the body as lossy UTF-8).
//! - `/echo-header?name=X`: 200 with the value of request header `X` as the
//!   body and as the response header `x-echo` (several values joined by
//!   `, `); an empty body and no `x-echo` when the request has no `X`.
//! - `/echo-header-name?name=X`: 200, empty, with a header named after each
//!   space-separated word of the value of request header `X` that is a
//!   header name, with the value `x` (as any server that reflects what it
//!   was sent in a header's name; the name goes out lowercase).
//! - `/trailer?name=X&body=TEXT`: 200, chunked, the body `TEXT` (empty when
//!   not given) and then the trailer `x-echo` with the value of request
//!   header `X` (several joined by `, `; none when the request has no `X`).
//!   Over HTTP/1.1 a server sends trailers only to a request with
//!   `TE: trailers`.
//! - `/redirect?to=URL`: 302 with `Location: URL`.
//! - `/bytes?n=N`: 200, `Content-Length: N`, N bytes of `a` sent in chunks of
//!   [`CHUNK`].
//! - `/never`: never answers; holds the connection until the server is
//!   dropped, or [`GIVE_UP`] passes and it closes the connection.
//! - `/stall-body`: 200 with `Content-Length: 1000`, then the first 10 bytes
//!   of the body, then nothing until the server is dropped or [`GIVE_UP`]
//!   passes, when it closes the connection.
//! - `/html`: 200, `text/html`, [`HTML`]: a title, a script, a style and
//!   paragraphs.
//! - `/status?code=N`: status N, empty body.
//! - Anything else: 404 `not found`. A route missing its query value or given
//!   one it cannot read: 400 saying which.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, LOCATION};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::oneshot;
use tokio::time::Sleep;

/// The body of `/hello`.
pub const HELLO: &str = "hello from the test server";

/// The body of `/html`.
pub const HTML: &str = "<!doctype html>\n\
<html>\n\
<head>\n\
<title>The test page</title>\n\
<style>p { color: #333; }</style>\n\
<script>document.title = 'changed by a script';</script>\n\
</head>\n\
<body>\n\
<h1>A heading</h1>\n\
<p>The first paragraph.</p>\n\
<p>The second paragraph, with <a href=\"/hello\">a link</a>.</p>\n\
</body>\n\
</html>\n";

/// The size of the chunks `/bytes` sends: small enough that a large body
/// arrives in many frames, as a real download does.
pub const CHUNK: usize = 16 << 10;

/// How long `/never` and `/stall-body` hold a connection before closing it:
/// far longer than any client timeout a test sets, and short enough that a
/// server a test forgot to drop does not hold a connection forever.
pub const GIVE_UP: Duration = Duration::from_secs(60);

/// The declared length of `/stall-body`'s body, and how much of it is sent.
const STALL_DECLARED: u64 = 1000;
const STALL_SENT: usize = 10;

/// One request as it reached the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// Such as `GET`.
    pub method: String,
    /// The path with its query, such as `/echo-header?name=x-a`.
    pub path: String,
    /// Header names (lowercase) and values (lossy UTF-8), in the order
    /// received.
    pub headers: Vec<(String, String)>,
    /// The body, as much of it as arrived.
    pub body: Vec<u8>,
    /// The protocol it came over: `HTTP/1.1`, `HTTP/2.0`.
    pub version: String,
}

impl Recorded {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
    }
}

/// A running server; dropping it stops it.
pub struct TestServer {
    addr: SocketAddr,
    scheme: &'static str,
    recorded: Arc<Mutex<Vec<Recorded>>>,
    accepted: Arc<AtomicUsize>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl TestServer {
    /// A server on `127.0.0.1` at a free port.
    pub fn start() -> TestServer {
        TestServer::start_on("127.0.0.1:0")
    }

    /// A server on `addr`, such as `"[::1]:0"`. Panics when it cannot bind;
    /// [`TestServer::try_start_on`] hands the error back instead.
    pub fn start_on(addr: impl ToSocketAddrs) -> TestServer {
        TestServer::try_start_on(addr)
            .unwrap_or_else(|error| panic!("failed to start the test server: {error}"))
    }

    /// A server on `addr`, or the error binding it, for a test that skips
    /// where (say) IPv6 is not available.
    pub fn try_start_on(addr: impl ToSocketAddrs) -> io::Result<TestServer> {
        TestServer::launch(addr, None)
    }

    /// A server on `127.0.0.1` at a free port that speaks TLS with the
    /// certificate of `tests/certs/` (signed by `tests/certs/ca.pem`, for
    /// `127.0.0.1` and `localhost`), offering HTTP/2 and HTTP/1.1 by ALPN.
    pub fn start_tls() -> TestServer {
        TestServer::launch("127.0.0.1:0", Some(tls_acceptor()))
            .unwrap_or_else(|error| panic!("failed to start the test server: {error}"))
    }

    fn launch(addr: impl ToSocketAddrs, tls: Option<tokio_rustls::TlsAcceptor>) -> io::Result<TestServer> {
        // Bound here, not on the thread, so a test knows the port at once and
        // a failure to bind is the caller's to see.
        let scheme_is_tls = tls.is_some();
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let recorded = Arc::new(Mutex::new(Vec::new()));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (stop, stopped) = oneshot::channel();
        let (record, count) = (Arc::clone(&recorded), Arc::clone(&accepted));
        let thread = std::thread::Builder::new().name(format!("test-http-server-{}", addr.port())).spawn(
            move || {
                runtime.block_on(serve(listener, record, count, stopped, tls));
                // Dropping the runtime drops every connection task, closing
                // the connections `/never` and `/stall-body` hold.
                drop(runtime);
            },
        )?;
        let scheme = if scheme_is_tls { "https" } else { "http" };
        Ok(TestServer { addr, scheme, recorded, accepted, stop: Some(stop), thread: Some(thread) })
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL of `path` on this server: `http://127.0.0.1:PORT/path`
    /// (`https://` for [`TestServer::start_tls`])
    /// (`http://[::1]:PORT/path` on IPv6). A path without a leading `/` gets
    /// one.
    pub fn url(&self, path: &str) -> String {
        let slash = if path.starts_with('/') { "" } else { "/" };
        format!("{}://{}{slash}{path}", self.scheme, self.addr)
    }

    /// Every request that reached the server so far, in the order each was
    /// received whole.
    pub fn requests(&self) -> Vec<Recorded> {
        self.recorded.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// How many connections the server accepted so far.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            // An error only means the server's thread is already gone.
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            // A panic on the server's thread is reported where it happened;
            // a second panic here, maybe during a failing test's unwind, would
            // only abort the process.
            let _ = thread.join();
        }
    }
}

/// `text` percent-encoded for a query value, such as the `to` of
/// `/redirect?to=`: every byte but unreserved ones (`A-Z a-z 0-9 - . _ ~`).
pub fn percent_encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let escaped = (bytes[at] == b'%')
            .then(|| text.get(at + 1..at + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                decoded.push(byte);
                at += 3;
            }
            None => {
                decoded.push(bytes[at]);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// The percent-decoded value of query parameter `name`.
fn query_value(query: Option<&str>, name: &str) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(key) == name).then(|| percent_decode(value))
    })
}

/// The TLS set-up of [`TestServer::start_tls`], from `tests/certs/`.
fn tls_acceptor() -> tokio_rustls::TlsAcceptor {
    tokio_rustls::TlsAcceptor::from(tls_config(&[b"h2", b"http/1.1"]))
}

/// A server's TLS set-up with the certificate of `tests/certs/`, which
/// `tests/certs/ca.pem` signed, offering the protocols of `alpn`.
pub fn tls_config(alpn: &[&[u8]]) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("certs");
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(dir.join("server.pem"))
        .and_then(|certs| certs.collect())
        .expect("tests/certs/server.pem holds the server's certificate");
    let key =
        PrivateKeyDer::from_pem_file(dir.join("server.key")).expect("tests/certs/server.key holds its key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("the test certificate and key match");
    config.alpn_protocols = alpn.iter().map(|protocol| protocol.to_vec()).collect();
    Arc::new(config)
}

async fn serve(
    listener: std::net::TcpListener,
    recorded: Arc<Mutex<Vec<Recorded>>>,
    count: Arc<AtomicUsize>,
    mut stopped: oneshot::Receiver<()>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let listener = tokio::net::TcpListener::from_std(listener).expect("a non-blocking listener");
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => {
                // A failed accept (the client gave up, or no descriptors are
                // left) loses that one connection only.
                let Ok((stream, _)) = accepted else { continue };
                count.fetch_add(1, Ordering::SeqCst);
                let recorded = Arc::clone(&recorded);
                let tls = tls.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| respond(request, Arc::clone(&recorded)));
                    // A connection the client broke off ends here; the server
                    // goes on with the others.
                    match tls {
                        None => {
                            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                        }
                        Some(tls) => {
                            let Ok(stream) = tls.accept(stream).await else { return };
                            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                    }
                });
            }
        }
    }
}

/// What closes a connection without a response: `/never` giving up.
type Error = Box<dyn std::error::Error + Send + Sync>;

async fn respond(
    request: Request<Incoming>,
    recorded: Arc<Mutex<Vec<Recorded>>>,
) -> Result<Response<Body>, Error> {
    let (parts, mut incoming) = request.into_parts();
    let mut body = Vec::new();
    while let Some(Ok(frame)) = incoming.frame().await {
        if let Ok(data) = frame.into_data() {
            body.extend_from_slice(&data);
        }
    }
    let path =
        parts.uri.path_and_query().map_or_else(|| parts.uri.path().to_string(), |path| path.to_string());
    let headers: Vec<(String, String)> = parts
        .headers
        .iter()
        .map(|(name, value)| {
            (name.as_str().to_string(), String::from_utf8_lossy(value.as_bytes()).into_owned())
        })
        .collect();
    let version = format!("{:?}", parts.version);
    let request = Recorded { method: parts.method.to_string(), path, headers, body, version };
    recorded.lock().unwrap_or_else(PoisonError::into_inner).push(request.clone());

    let query = parts.uri.query();
    Ok(match parts.uri.path() {
        "/hello" => text(StatusCode::OK, "text/plain", HELLO),
        "/echo" => {
            let headers: Vec<[&str; 2]> =
                request.headers.iter().map(|(name, value)| [name.as_str(), value.as_str()]).collect();
            let echo = serde_json::json!({
                "method": request.method,
                "path": request.path,
                "headers": headers,
                "body": String::from_utf8_lossy(&request.body),
            });
            text(StatusCode::OK, "application/json", echo.to_string())
        }
        "/echo-header" => match query_value(query, "name") {
            None => bad_request("give the header to echo as ?name=X"),
            Some(name) => {
                let values: Vec<&[u8]> =
                    parts.headers.get_all(name.as_str()).iter().map(HeaderValue::as_bytes).collect();
                let value = values.join(&b", "[..]);
                let mut response = text(StatusCode::OK, "text/plain", value.clone());
                if !values.is_empty() {
                    let echoed =
                        HeaderValue::from_bytes(&value).expect("joined header values are a header value");
                    response.headers_mut().insert("x-echo", echoed);
                }
                response
            }
        },
        "/echo-header-name" => match query_value(query, "name") {
            None => bad_request("give the header to echo as ?name=X"),
            Some(name) => {
                let mut response = text(StatusCode::OK, "text/plain", "");
                for value in parts.headers.get_all(name.as_str()) {
                    let words = value.as_bytes().split(|&byte| byte == b' ');
                    for word in words.filter_map(|word| hyper::header::HeaderName::from_bytes(word).ok()) {
                        response.headers_mut().append(word, HeaderValue::from_static("x"));
                    }
                }
                response
            }
        },
        "/trailer" => match query_value(query, "name") {
            None => bad_request("give the header to echo as ?name=X"),
            Some(name) => {
                let values: Vec<&[u8]> =
                    parts.headers.get_all(name.as_str()).iter().map(HeaderValue::as_bytes).collect();
                let mut trailers = hyper::HeaderMap::new();
                if !values.is_empty() {
                    let echoed = HeaderValue::from_bytes(&values.join(&b", "[..]))
                        .expect("joined header values are a header value");
                    trailers.insert("x-echo", echoed);
                }
                let data = Bytes::from(query_value(query, "body").unwrap_or_default());
                let mut response =
                    Response::new(Body::Trailed { data: Some(data), trailers: Some(trailers) });
                response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
                response.headers_mut().insert(hyper::header::TRAILER, HeaderValue::from_static("x-echo"));
                response
            }
        },
        "/redirect" => match query_value(query, "to").map(HeaderValue::try_from) {
            Some(Ok(location)) => {
                let mut response = text(StatusCode::FOUND, "text/plain", "");
                response.headers_mut().insert(LOCATION, location);
                response
            }
            _ => bad_request("give the target as ?to=URL, percent-encoded"),
        },
        "/bytes" => match query_value(query, "n").and_then(|n| n.parse::<u64>().ok()) {
            Some(n) => {
                let mut response = Response::new(Body::Repeat { remaining: n });
                response.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(n));
                response
                    .headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
                response
            }
            None => bad_request("give the length as ?n=N"),
        },
        "/never" => {
            tokio::time::sleep(GIVE_UP).await;
            return Err("/never gave up".into());
        }
        "/stall-body" => {
            let mut response = Response::new(Body::Stall {
                first: Some(Bytes::from(vec![b'a'; STALL_SENT])),
                sleep: Box::pin(tokio::time::sleep(GIVE_UP)),
            });
            response.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(STALL_DECLARED));
            response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            response
        }
        "/html" => text(StatusCode::OK, "text/html; charset=utf-8", HTML),
        "/status" => match query_value(query, "code").and_then(|code| code.parse::<u16>().ok()) {
            Some(code) => match StatusCode::from_u16(code) {
                Ok(status) => text(status, "text/plain", ""),
                Err(_) => bad_request("give a status code of 100 to 999"),
            },
            None => bad_request("give the status as ?code=N"),
        },
        _ => text(StatusCode::NOT_FOUND, "text/plain", "not found"),
    })
}

fn text(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Body::Full(Some(body.into())));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn bad_request(message: &'static str) -> Response<Body> {
    text(StatusCode::BAD_REQUEST, "text/plain", message)
}

/// The server's response bodies.
enum Body {
    /// All at once.
    Full(Option<Bytes>),
    /// `remaining` more bytes of `a`, [`CHUNK`] at a time.
    Repeat { remaining: u64 },
    /// `first`, then nothing until `sleep` ends, then the end: short of the
    /// declared length, so the connection is closed.
    Stall { first: Option<Bytes>, sleep: Pin<Box<Sleep>> },
    /// `data`, of no declared length, then `trailers`.
    Trailed { data: Option<Bytes>, trailers: Option<hyper::HeaderMap> },
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let frame = match self.get_mut() {
            Body::Trailed { data, trailers } => {
                let frame = match data.take() {
                    Some(data) => Some(Frame::data(data)),
                    None => trailers.take().map(Frame::trailers),
                };
                return Poll::Ready(frame.map(Ok));
            }
            Body::Full(bytes) => bytes.take(),
            Body::Repeat { remaining: 0 } => None,
            Body::Repeat { remaining } => {
                let chunk = (*remaining).min(CHUNK as u64);
                *remaining -= chunk;
                Some(Bytes::from(vec![b'a'; chunk as usize]))
            }
            Body::Stall { first, sleep } => match first.take() {
                Some(first) => Some(first),
                None => {
                    std::task::ready!(sleep.as_mut().poll(cx));
                    None
                }
            },
        };
        Poll::Ready(frame.map(|data| Ok(Frame::data(data))))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(bytes) => SizeHint::with_exact(bytes.as_ref().map_or(0, |bytes| bytes.len() as u64)),
            Body::Repeat { remaining } => SizeHint::with_exact(*remaining),
            Body::Stall { .. } => SizeHint::with_exact(STALL_DECLARED),
            Body::Trailed { .. } => SizeHint::default(),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full(bytes) => bytes.is_none(),
            Body::Repeat { remaining } => *remaining == 0,
            Body::Stall { .. } => false,
            Body::Trailed { data, trailers } => data.is_none() && trailers.is_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{ErrorKind, Read, Write};
    use std::net::TcpStream;
    use std::time::Instant;

    use super::*;

    /// A client that holds its connection: reads fail after ten seconds
    /// rather than hang a broken test.
    fn connect(server: &TestServer) -> TcpStream {
        let stream = TcpStream::connect(server.addr()).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        stream
    }

    /// The head (status line and headers) and body of the response to
    /// `request`, which asks the server to close the connection after it.
    fn exchange(server: &TestServer, request: &str) -> (String, Vec<u8>) {
        let mut stream = connect(server);
        stream.write_all(request.as_bytes()).unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).unwrap();
        let end = response.windows(4).position(|window| window == b"\r\n\r\n").expect("a whole head");
        let body = response.split_off(end + 4);
        (String::from_utf8(response).unwrap(), body)
    }

    fn get(server: &TestServer, path: &str) -> (String, Vec<u8>) {
        exchange(server, &format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"))
    }

    /// The value of header `name` (lowercase) in `head`.
    fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
        head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name).then(|| value.trim())
        })
    }

    fn status_line(head: &str) -> &str {
        head.lines().next().unwrap()
    }

    #[test]
    fn hello_answers_its_text_and_the_request_is_recorded() {
        let server = TestServer::start();
        let (head, body) = get(&server, "/hello");
        assert_eq!(status_line(&head), "HTTP/1.1 200 OK");
        assert_eq!(header(&head, "content-type"), Some("text/plain"));
        assert_eq!(String::from_utf8(body).unwrap(), HELLO);
        assert_eq!(
            server.requests(),
            [Recorded {
                method: "GET".into(),
                path: "/hello".into(),
                headers: vec![("host".into(), "test".into()), ("connection".into(), "close".into())],
                body: vec![],
                version: "HTTP/1.1".into(),
            }]
        );
    }

    #[test]
    fn echo_hands_back_the_request_authorization_included() {
        let server = TestServer::start();
        let (head, body) = exchange(
            &server,
            "POST /echo?x=1 HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer s3cret\r\n\
             Content-Length: 5\r\nConnection: close\r\n\r\nhello",
        );
        assert_eq!(status_line(&head), "HTTP/1.1 200 OK");
        assert_eq!(header(&head, "content-type"), Some("application/json"));
        let echo: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            echo,
            serde_json::json!({
                "method": "POST",
                "path": "/echo?x=1",
                "headers": [
                    ["host", "test"],
                    ["authorization", "Bearer s3cret"],
                    ["content-length", "5"],
                    ["connection", "close"],
                ],
                "body": "hello",
            })
        );
        let recorded = server.requests();
        assert_eq!(recorded.len(), 1);
        assert_eq!(recorded[0].header("Authorization"), Some("Bearer s3cret"));
        assert_eq!(recorded[0].body, b"hello");
    }

    #[test]
    fn echo_header_answers_the_value_as_body_and_header() {
        let server = TestServer::start();
        let (head, body) = exchange(
            &server,
            "GET /echo-header?name=x-probe HTTP/1.1\r\nHost: test\r\nX-Probe: abc\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(status_line(&head), "HTTP/1.1 200 OK");
        assert_eq!(header(&head, "x-echo"), Some("abc"));
        assert_eq!(body, b"abc");
        let (head, body) = get(&server, "/echo-header?name=x-absent");
        assert_eq!(
            (status_line(&head), header(&head, "x-echo"), body.as_slice()),
            ("HTTP/1.1 200 OK", None, &b""[..])
        );
    }

    #[test]
    fn bytes_streams_n_bytes_under_their_content_length() {
        let server = TestServer::start();
        let (head, body) = get(&server, "/bytes?n=100000");
        assert_eq!(status_line(&head), "HTTP/1.1 200 OK");
        assert_eq!(header(&head, "content-length"), Some("100000"));
        assert_eq!(header(&head, "transfer-encoding"), None);
        assert_eq!(body.len(), 100_000);
        assert!(body.iter().all(|&byte| byte == b'a'));
    }

    #[test]
    fn redirect_status_and_unknown_paths_answer_as_asked() {
        let server = TestServer::start();
        let target = server.url("/hello?a=1&b=2");
        let (head, _) = get(&server, &format!("/redirect?to={}", percent_encode(&target)));
        assert_eq!(status_line(&head), "HTTP/1.1 302 Found");
        assert_eq!(header(&head, "location"), Some(target.as_str()));
        let (head, _) = get(&server, "/status?code=503");
        assert_eq!(status_line(&head), "HTTP/1.1 503 Service Unavailable");
        let (head, body) = get(&server, "/nowhere");
        assert_eq!((status_line(&head), body.as_slice()), ("HTTP/1.1 404 Not Found", &b"not found"[..]));
        let (head, _) = get(&server, "/bytes");
        assert_eq!(status_line(&head), "HTTP/1.1 400 Bad Request");
    }

    #[test]
    fn html_is_a_page_with_a_title_a_script_a_style_and_paragraphs() {
        let server = TestServer::start();
        let (head, body) = get(&server, "/html");
        assert_eq!(header(&head, "content-type"), Some("text/html; charset=utf-8"));
        assert_eq!(String::from_utf8(body).unwrap(), HTML);
        for part in ["<title>", "<script>", "<style>", "<p>"] {
            assert!(HTML.contains(part), "{part}");
        }
    }

    #[test]
    fn stall_body_sends_ten_of_its_thousand_bytes_then_nothing() {
        let server = TestServer::start();
        let mut stream = connect(&server);
        stream.write_all(b"GET /stall-body HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
        let mut received = Vec::new();
        let mut buffer = [0; 1024];
        let head_end = loop {
            let n = stream.read(&mut buffer).unwrap();
            assert_ne!(n, 0, "the connection closed early: {:?}", String::from_utf8_lossy(&received));
            received.extend_from_slice(&buffer[..n]);
            if let Some(end) = received.windows(4).position(|window| window == b"\r\n\r\n")
                && received.len() >= end + 4 + STALL_SENT
            {
                break end + 4;
            }
        };
        let head = String::from_utf8_lossy(&received[..head_end]).into_owned();
        assert_eq!(header(&head, "content-length"), Some("1000"));
        assert_eq!(&received[head_end..], b"aaaaaaaaaa");
        stream.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let error = stream.read(&mut buffer).unwrap_err();
        assert!(matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut), "{error}");
    }

    #[test]
    fn dropping_the_server_closes_a_connection_never_answered() {
        let server = TestServer::start();
        let mut stream = connect(&server);
        stream.write_all(b"GET /never HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.requests().is_empty() {
            assert!(Instant::now() < deadline, "the request never reached the server");
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(server);
        let mut buffer = [0; 64];
        match stream.read(&mut buffer) {
            Ok(n) => assert_eq!(n, 0, "no response: {:?}", String::from_utf8_lossy(&buffer[..n])),
            Err(error) => assert_eq!(error.kind(), ErrorKind::ConnectionReset, "{error}"),
        }
    }

    #[test]
    fn url_names_a_path_on_the_server() {
        let server = TestServer::start();
        let port = server.port();
        assert_eq!(server.url("/a?b=1"), format!("http://127.0.0.1:{port}/a?b=1"));
        assert_eq!(server.url("a"), format!("http://127.0.0.1:{port}/a"));
        match TestServer::try_start_on("[::1]:0") {
            Ok(server) => assert_eq!(server.url("/a"), format!("http://[::1]:{}/a", server.port())),
            Err(error) => eprintln!("no IPv6 loopback here, skipping its URL: {error}"),
        }
    }

    #[test]
    fn a_percent_encoded_value_decodes_to_itself() {
        let text = "http://127.0.0.1:80/a b?c=d&e=é%";
        assert_eq!(percent_encode("a/b c"), "a%2Fb%20c");
        assert_eq!(
            query_value(Some(&format!("x=1&to={}", percent_encode(text))), "to").as_deref(),
            Some(text)
        );
        assert_eq!(query_value(Some("to=%zz%4"), "to").as_deref(), Some("%zz%4"));
        assert_eq!(query_value(Some("x=1"), "to"), None);
    }
}
