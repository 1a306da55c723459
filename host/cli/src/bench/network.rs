//! Figure 12: the network. A `fetch` call that reads 1 MiB from a loopback
//! server through the egress policy (the grant's check, the host's own
//! name resolution and address check, a connection of its own, the body
//! cap) against the same request made by a native hyper client on a
//! connection of its own. Both hand the text they read to the same result
//! budget, so what differs is the sandbox and the policy. And the policy's
//! check alone, per request.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Full};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;

use keel_host::budget::ledger::Ledger;
use keel_host::budget::{Budget, BudgetConfig, Threshold};
use keel_host::config::Config;
use keel_host::load::floor::network_check;
use keel_host::load::network::NetworkGrant;
use keel_host::{Host, ToolResult, ToolUse};

use super::{BenchOptions, Error, Figure, Result, median, runtime, tempdir};

/// The body every request reads: 1 MiB of plain text.
const BODY_BYTES: usize = 1 << 20;

/// Serve [`BODY_BYTES`] of text to every GET, on a loopback port, for as
/// long as the runtime runs.
async fn serve_body() -> Result<SocketAddr> {
    let what = Path::new("the network benchmark's server");
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .map_err(|error| Error::io("listen for", what, error))?;
    let addr = listener.local_addr().map_err(|error| Error::io("listen for", what, error))?;
    let body =
        Bytes::from((0..BODY_BYTES).map(|i| b"abcdefghijklmnopqrstuvwxyz\n"[i % 27]).collect::<Vec<u8>>());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_request: Request<hyper::body::Incoming>| {
                    let body = body.clone();
                    async move {
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("content-type", "text/plain; charset=utf-8")
                                .body(Full::new(body))
                                .expect("a valid response"),
                        )
                    }
                });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let _ = builder.serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    Ok(addr)
}

/// One GET of `url` by a native hyper client on a new connection, its body
/// read as text.
async fn native_get(addr: SocketAddr) -> Result<String> {
    let what = Path::new("the network benchmark's native client");
    let fail =
        |error: &dyn std::fmt::Display| Error::io("fetch", what, std::io::Error::other(error.to_string()));
    let stream =
        tokio::net::TcpStream::connect(addr).await.map_err(|error| Error::io("connect", what, error))?;
    let (mut send, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|error| fail(&error))?;
    tokio::spawn(connection);
    let request = Request::get(format!("http://{addr}/data"))
        .header("host", addr.to_string())
        .body(Empty::<Bytes>::new())
        .expect("a valid request");
    let response = send.send_request(request).await.map_err(|error| fail(&error))?;
    let body = response.into_body().collect().await.map_err(|error| fail(&error))?.to_bytes();
    String::from_utf8(body.to_vec()).map_err(|error| fail(&error))
}

/// Figure 12: the fetch against the native request, and the policy's check
/// alone against the native request.
pub(super) fn figures(options: &BenchOptions) -> Result<[Figure; 2]> {
    let rt = runtime(1);
    let addr = rt.block_on(serve_body())?;
    let workspace = tempdir()?;
    let origin = format!("http://{addr}");
    let config =
        Config::parse(&format!("[plugins.fetch]\nnetwork = [{origin:?}]\n"), Path::new("keel.toml"))?;
    let host = rt.block_on(
        Host::builder()
            .workspace(workspace.path())
            .plugins(options.tool("fetch"))
            .config(config)
            .cache_dir(keel_host::load::default_cache_dir())
            .build(),
    )?;
    let url = format!("{origin}/data");
    let call = [ToolUse::new("toolu_1", "fetch", json!({ "url": url }))];
    let rounds = options.scale(21, 3);
    let (mut keel, mut native) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let started = Instant::now();
        let outcome = rt.block_on(host.run_batch(&call));
        keel.push(started.elapsed().as_secs_f64() * 1e3);
        let result = &outcome.results[0];
        if result.is_error {
            return Err(Error::Failed(format!("fetch failed: {}", result.content)));
        }
        let session = tempdir()?;
        let budget = Budget::new(&BudgetConfig::default(), session.path());
        let started = Instant::now();
        let text = rt.block_on(native_get(addr))?;
        let threshold = Threshold::default();
        let mut results = [rt.block_on(budget.per_tool(ToolResult::ok("toolu_1", text), threshold))];
        rt.block_on(budget.per_message(&mut results, &[threshold], &mut Ledger::new()));
        native.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let native = median(native);
    let fetch = Figure::new(
        "network_fetch_1mib (keel fetch call / native hyper request)",
        median(keel),
        native,
        "ms",
    )
    .at_most(1.3);

    let grant = NetworkGrant::parse(&[origin], &[], |_| None).map_err(Error::Failed)?;
    let request = Request::get(&url).header("host", addr.to_string()).body(()).expect("a valid request");
    let checks = options.scale(100_000, 10_000);
    let started = Instant::now();
    for _ in 0..checks {
        let checked = network_check(&grant, std::hint::black_box(&request), IpAddr::V4(Ipv4Addr::LOCALHOST));
        std::hint::black_box(checked).map_err(Error::Failed)?;
    }
    let per_check = started.elapsed().as_secs_f64() * 1e6 / checks as f64;
    let check = Figure::new(
        "network_policy_check (per request / a native 1 MiB request)",
        per_check,
        native * 1e3,
        "µs",
    );
    Ok([fetch, check])
}
