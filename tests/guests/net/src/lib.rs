//! `net`: a test guest that reaches for the network itself, through
//! `wasi:http` driven directly with the `wasip2` bindings (not the SDK's
//! client), a raw TCP connect and a name lookup, and reports what the host
//! let through, so that the host's egress checks are proven against a real
//! component.
//!
//! # Input
//!
//! ```json
//! {
//!   "requests": [{ "method": "GET", "url": "http://127.0.0.1:PORT/path?q",
//!                  "headers": [["name", "value"]], "body": "text",
//!                  "trailers": [["name", "value"]], "path": "?q" }],
//!   "socket": "127.0.0.1:PORT",
//!   "lookup": "localhost",
//!   "open_world": true,
//!   "request_in_question": "http://127.0.0.1:PORT/hello",
//!   "concurrent": false
//! }
//! ```
//!
//! Every field is optional: `requests` defaults to none, a request's
//! `method` to `GET`, its `headers` to none, its `body` to empty, its
//! `trailers` to none and its `path` (sent as given, in place of the URL's
//! path and query) to the URL's; `open_world` (the answer of
//! `is_open_world`) to true. A request's body is written to the
//! outgoing-body stream in chunks of at most [`WRITE_CHUNK`] bytes with
//! `blocking-write-and-flush`, then finished with its trailers, if any.
//!
//! Requests run one after the other, each awaited before the next starts;
//! with `"concurrent": true` every request is started (`handle`, its body
//! sent) before any is awaited, then all are polled together and each
//! response's body is read as soon as its head arrives.
//!
//! # Output
//!
//! One text block holding a JSON array: an entry per request, in order,
//! `{"status": 200, "headers": [["name", "value"], ...], "body": "<text>"}`
//! (header values and the body as lossy UTF-8, the whole body read up to
//! [`MAX_BODY`]; with `"trailers": [["name", "value"], ...]` when the
//! response has any) or `{"error": "<message>"}`; then `{"socket": "ok"}` or
//! `{"socket": "<error>"}` when `socket` is given (a
//! [`std::net::TcpStream::connect`]); then `{"lookup": "<addresses>"}` (the
//! IP addresses `(lookup, 80)` resolves to, joined by `", "`) or
//! `{"lookup": "<error>"}` when `lookup` is given.
//!
//! # Errors
//!
//! A host that refuses a request (not granted, a private address, a limit
//! reached, a timeout) answers `error-code.internal-error(some(message))`:
//! from `outgoing-handler.handle`, from the response future, or as the error
//! of a body stream (read with `http-error-code`). That message is the
//! entry's `error`, verbatim. A body stream error without an HTTP error code
//! (how wasmtime-wasi-http 48 hands every body failure over) gives its debug
//! string without the `internal error: ` prefix and any backtrace
//! ([`plain_message`]). Any other error code is given in its `Debug`
//! form, such as `ErrorCode::ConnectionRefused`; a URL the guest cannot split
//! into scheme, authority and path is refused before any request is made.
//!
//! # A request in question
//!
//! With `request_in_question`, the answers about the input (`plan`, which
//! asks `is_concurrency_safe` and `is_read_only`, and `validate_input`) make a
//! `GET` to that URL, once per sandbox. Each question may run in another
//! sandbox than the call, so the outcome reaches the caller through
//! validation: `validate_input` fails with
//! `a question got the network: GET <url> answered <status>` when the
//! request got through, and passes when the host refused it. The call itself
//! does not make that request.
//!
//! Not concurrency-safe, read-only (it never needs write access), not
//! destructive.

use std::cell::RefCell;
use std::net::{TcpStream, ToSocketAddrs};

use keel_guest::{Context, Output, Result, Tool, Value, bail, json};
use schemars::JsonSchema;
use serde::Deserialize;
use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    ErrorCode, Fields, FutureIncomingResponse, HeaderError, IncomingBody, IncomingResponse, IoError, Method,
    OutgoingBody, OutgoingRequest, Scheme, http_error_code,
};
use wasip2::io::poll;
use wasip2::io::streams::StreamError;

/// The most of a response body the guest keeps: 64 MiB, far above anything a
/// test sends, so that a host's own body limit is what a test sees first.
pub const MAX_BODY: usize = 64 << 20;

/// The largest write to an outgoing-body stream: `blocking-write-and-flush`
/// takes at most 4096 bytes at a time.
pub const WRITE_CHUNK: usize = 4096;

/// The most asked of a response body stream per read.
const READ_CHUNK: u64 = 64 << 10;

/// Input of `net`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// The HTTP requests to make, in order.
    #[serde(default)]
    pub requests: Vec<Request>,
    /// An address (`127.0.0.1:PORT`) to open a raw TCP connection to.
    #[serde(default)]
    pub socket: Option<String>,
    /// A host name to look up.
    #[serde(default)]
    pub lookup: Option<String>,
    /// The answer of `is_open_world`. Default: true.
    #[serde(default = "yes")]
    pub open_world: bool,
    /// A URL the answers about this input `GET` before the call.
    #[serde(default)]
    pub request_in_question: Option<String>,
    /// Start every request before awaiting any. Default: false.
    #[serde(default)]
    pub concurrent: bool,
}

fn yes() -> bool {
    true
}

/// One HTTP request.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// The method, such as `GET` or `POST`. Default: `GET`.
    #[serde(default = "get")]
    pub method: String,
    /// An absolute URL: `http://host[:port]/path?query`.
    pub url: String,
    /// Header names and values, sent in this order.
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    /// The request body as text. Default: empty.
    #[serde(default)]
    pub body: Option<String>,
    /// Trailer names and values, sent when the body is finished. Default:
    /// none.
    #[serde(default)]
    pub trailers: Vec<(String, String)>,
    /// The path and query to send as they are, in place of the URL's: how a
    /// guest sends a path such as `?q=1`, which `wasi:http` takes.
    #[serde(default)]
    pub path: Option<String>,
}

fn get() -> String {
    "GET".to_string()
}

impl Request {
    fn get(url: &str) -> Self {
        Request {
            method: get(),
            url: url.to_string(),
            headers: Vec::new(),
            body: None,
            trailers: Vec::new(),
            path: None,
        }
    }
}

/// A URL split as `wasi:http` takes it.
#[derive(Debug, PartialEq, Eq)]
pub struct Target {
    /// `http`, `https` or another scheme.
    pub scheme: String,
    /// `host[:port]`.
    pub authority: String,
    /// The path and query, `/` at least.
    pub path_with_query: String,
}

/// Split `url` into scheme, authority and path with query, dropping a
/// fragment; no percent-decoding or other normalising, so the host sees the
/// URL as given.
pub fn split_url(url: &str) -> Result<Target, String> {
    let invalid = || format!("invalid url `{url}`: give scheme://host[:port]/path");
    let url_without_fragment = url.split('#').next().unwrap_or(url);
    let (scheme, rest) = url_without_fragment.split_once("://").ok_or_else(invalid)?;
    let (authority, path_with_query) = match rest.find(['/', '?']) {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    if scheme.is_empty() || authority.is_empty() {
        return Err(invalid());
    }
    let path_with_query = match path_with_query {
        "" => "/".to_string(),
        query if query.starts_with('?') => format!("/{query}"),
        path => path.to_string(),
    };
    Ok(Target { scheme: scheme.to_string(), authority: authority.to_string(), path_with_query })
}

fn method(name: &str) -> Method {
    match name {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "CONNECT" => Method::Connect,
        "OPTIONS" => Method::Options,
        "TRACE" => Method::Trace,
        "PATCH" => Method::Patch,
        other => Method::Other(other.to_string()),
    }
}

fn scheme(name: &str) -> Scheme {
    match name {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        other => Scheme::Other(other.to_string()),
    }
}

/// The text of an error code: a host's refusal verbatim, anything else in
/// its `Debug` form.
fn describe(code: &ErrorCode) -> String {
    match code {
        ErrorCode::InternalError(Some(message)) => message.clone(),
        other => format!("{other:?}"),
    }
}

/// The text of a stream's failure: its HTTP error code when it has one, else
/// [`plain_message`] of its debug string.
fn describe_io(error: &IoError) -> String {
    match http_error_code(error) {
        Some(code) => describe(&code),
        None => plain_message(&error.to_debug_string()).to_string(),
    }
}

/// The message in the debug string of a stream error that carries no HTTP
/// error code. wasmtime-wasi-http 48 hands a body stream's failure over that
/// way, even an `internal-error`: its debug string is `internal error:
/// <message>`, followed by a backtrace when the host captures them. The
/// message is what the host said, so the prefix and backtrace go.
pub fn plain_message(debug: &str) -> &str {
    let message = debug.split_once("\nStack backtrace:").map_or(debug, |(message, _)| message).trim_end();
    message.strip_prefix("internal error: ").unwrap_or(message)
}

/// A response, its body and trailers read whole.
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    trailers: Vec<(String, String)>,
}

fn pairs(fields: &[(String, String)]) -> Vec<Value> {
    fields.iter().map(|(name, value)| json!([name, value])).collect()
}

impl Response {
    fn to_json(&self) -> Value {
        let mut entry = json!({
            "status": self.status,
            "headers": pairs(&self.headers),
            "body": String::from_utf8_lossy(&self.body),
        });
        if !self.trailers.is_empty() {
            entry["trailers"] = Value::Array(pairs(&self.trailers));
        }
        entry
    }
}

/// Send `request`: hand it to `outgoing-handler.handle`, then write and
/// finish its body, so a body larger than the stream's buffer still flows.
fn start(request: &Request) -> Result<FutureIncomingResponse, String> {
    let target = split_url(&request.url)?;
    let headers = fields(&request.headers).map_err(|error| format!("invalid headers: {error:?}"))?;
    let outgoing = OutgoingRequest::new(headers);
    outgoing
        .set_method(&method(&request.method))
        .map_err(|()| format!("invalid method `{}`", request.method))?;
    outgoing
        .set_scheme(Some(&scheme(&target.scheme)))
        .map_err(|()| format!("invalid scheme `{}`", target.scheme))?;
    outgoing
        .set_authority(Some(&target.authority))
        .map_err(|()| format!("invalid authority `{}`", target.authority))?;
    let path = request.path.as_ref().unwrap_or(&target.path_with_query);
    outgoing.set_path_with_query(Some(path)).map_err(|()| format!("invalid path `{path}`"))?;
    let body = outgoing.body().map_err(|()| "the request body was already taken".to_string())?;
    let future = outgoing_handler::handle(outgoing, None).map_err(|code| describe(&code))?;
    let trailers = match request.trailers.as_slice() {
        [] => None,
        trailers => Some(fields(trailers).map_err(|error| format!("invalid trailers: {error:?}"))?),
    };
    match send_body(body, request.body.as_deref().unwrap_or_default().as_bytes(), trailers) {
        // A stream closed without an error of its own: the response future
        // says why (or the server answered without reading it all).
        Ok(()) | Err(None) => Ok(future),
        Err(Some(message)) => Err(message),
    }
}

/// Header or trailer fields of `pairs`, in their order.
fn fields(pairs: &[(String, String)]) -> Result<Fields, HeaderError> {
    let entries: Vec<(String, Vec<u8>)> =
        pairs.iter().map(|(name, value)| (name.clone(), value.clone().into_bytes())).collect();
    Fields::from_list(&entries)
}

/// Write `bytes` to `body` and finish it with `trailers`. `Err(None)` is a
/// stream the host closed without saying why.
fn send_body(body: OutgoingBody, bytes: &[u8], trailers: Option<Fields>) -> Result<(), Option<String>> {
    {
        // The stream is the body's child: it must be gone before `finish`.
        let stream =
            body.write().map_err(|()| Some("the request body stream was already taken".to_string()))?;
        for chunk in bytes.chunks(WRITE_CHUNK) {
            stream.blocking_write_and_flush(chunk).map_err(|error| match error {
                StreamError::LastOperationFailed(error) => Some(describe_io(&error)),
                StreamError::Closed => None,
            })?;
        }
    }
    OutgoingBody::finish(body, trailers).map_err(|code| Some(describe(&code)))
}

/// Await `future` and read the whole response.
fn receive(future: FutureIncomingResponse) -> Result<Response, String> {
    let response = loop {
        match future.get() {
            Some(Ok(Ok(response))) => break response,
            Some(Ok(Err(code))) => return Err(describe(&code)),
            Some(Err(())) => return Err("the response was already taken".to_string()),
            None => future.subscribe().block(),
        }
    };
    // Done with as soon as it has handed the response over.
    drop(future);
    read(&response)
}

fn read(response: &IncomingResponse) -> Result<Response, String> {
    let status = response.status();
    let headers = response
        .headers()
        .entries()
        .into_iter()
        .map(|(name, value)| (name, String::from_utf8_lossy(&value).into_owned()))
        .collect();
    let body = response.consume().map_err(|()| "the response body was already taken".to_string())?;
    let bytes = read_body(&body)?;
    Ok(Response { status, headers, body: bytes, trailers: trailers(body)? })
}

/// The trailers of a body read to its end.
fn trailers(body: IncomingBody) -> Result<Vec<(String, String)>, String> {
    let future = IncomingBody::finish(body);
    let fields = loop {
        match future.get() {
            Some(Ok(Ok(fields))) => break fields,
            Some(Ok(Err(code))) => return Err(describe(&code)),
            Some(Err(())) => return Err("the trailers were already taken".to_string()),
            None => future.subscribe().block(),
        }
    };
    let entries = fields.map(|fields| fields.entries()).unwrap_or_default();
    Ok(entries
        .into_iter()
        .map(|(name, value)| (name, String::from_utf8_lossy(&value).into_owned()))
        .collect())
}

fn read_body(body: &IncomingBody) -> Result<Vec<u8>, String> {
    let stream = body.stream().map_err(|()| "the response body stream was already taken".to_string())?;
    let mut bytes = Vec::new();
    loop {
        match stream.blocking_read(READ_CHUNK) {
            Ok(chunk) if bytes.len() + chunk.len() > MAX_BODY => {
                return Err(format!("the response body exceeds {} MiB", MAX_BODY >> 20));
            }
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(StreamError::Closed) => return Ok(bytes),
            Err(StreamError::LastOperationFailed(error)) => return Err(describe_io(&error)),
        }
    }
}

fn entry(outcome: Result<Response, String>) -> Value {
    match outcome {
        Ok(response) => response.to_json(),
        Err(message) => json!({ "error": message }),
    }
}

/// Each request started and awaited before the next.
fn one_by_one(requests: &[Request]) -> Vec<Value> {
    requests.iter().map(|request| entry(start(request).and_then(receive))).collect()
}

/// Every request started, then all awaited together, each read as soon as its
/// response arrives so that it frees its connection for the others.
fn all_at_once(requests: &[Request]) -> Vec<Value> {
    let mut entries: Vec<Option<Value>> = vec![None; requests.len()];
    let mut pending = Vec::new();
    for (index, request) in requests.iter().enumerate() {
        match start(request) {
            Ok(future) => pending.push((index, future)),
            Err(message) => entries[index] = Some(entry(Err(message))),
        }
    }
    while !pending.is_empty() {
        let mut ready = {
            // Each pollable is its future's child: gone before the future is.
            let pollables: Vec<_> = pending.iter().map(|(_, future)| future.subscribe()).collect();
            poll::poll(&pollables.iter().collect::<Vec<_>>())
        };
        ready.sort_unstable();
        ready.dedup();
        for position in ready.into_iter().rev() {
            let (index, future) = pending.remove(position as usize);
            entries[index] = Some(entry(receive(future)));
        }
    }
    entries.into_iter().map(|entry| entry.expect("every request has an entry")).collect()
}

thread_local! {
    /// The request in question this sandbox made: its URL, and its status or
    /// the host's refusal.
    static QUESTION: RefCell<Option<(String, Result<u16, String>)>> = const { RefCell::new(None) };
}

/// The outcome of the `GET` in question, made on the first question about
/// `url` in this sandbox.
fn question(url: &str) -> Result<u16, String> {
    QUESTION.with_borrow_mut(|asked| match asked {
        Some((asked_url, outcome)) if asked_url == url => outcome.clone(),
        _ => {
            let outcome = start(&Request::get(url)).and_then(receive).map(|response| response.status);
            asked.insert((url.to_string(), outcome)).1.clone()
        }
    })
}

fn ask(input: &Input) {
    if let Some(url) = &input.request_in_question {
        let _ = question(url);
    }
}

/// The `net` tool.
pub struct Net;

impl Tool for Net {
    type Input = Input;
    const NAME: &str = "net";
    const DESCRIPTION: &str = "Test guest: makes the HTTP requests, TCP connect and name lookup its input \
        names, through wasi:http and wasi:sockets directly, and reports each outcome.";

    fn is_concurrency_safe(input: &Input, _cx: &Context) -> bool {
        ask(input);
        false
    }

    fn is_read_only(input: &Input, _cx: &Context) -> bool {
        ask(input);
        true
    }

    fn is_destructive(_input: &Input, _cx: &Context) -> bool {
        false
    }

    fn is_open_world(input: &Input, _cx: &Context) -> bool {
        input.open_world
    }

    fn validate_input(input: &Input, _cx: &Context) -> Result<()> {
        if let Some(url) = &input.request_in_question
            && let Ok(status) = question(url)
        {
            bail!("a question got the network: GET {url} answered {status}");
        }
        Ok(())
    }

    fn call(input: Input, _cx: &Context) -> Result<Output> {
        let mut entries =
            if input.concurrent { all_at_once(&input.requests) } else { one_by_one(&input.requests) };
        if let Some(address) = &input.socket {
            let outcome = match TcpStream::connect(address.as_str()) {
                Ok(_) => "ok".to_string(),
                Err(error) => error.to_string(),
            };
            entries.push(json!({ "socket": outcome }));
        }
        if let Some(name) = &input.lookup {
            let outcome = match (name.as_str(), 80).to_socket_addrs() {
                Ok(addresses) => {
                    addresses.map(|address| address.ip().to_string()).collect::<Vec<_>>().join(", ")
                }
                Err(error) => error.to_string(),
            };
            entries.push(json!({ "lookup": outcome }));
        }
        Ok(Output::text(Value::Array(entries).to_string()))
    }
}

keel_guest::export!(Net);

#[cfg(test)]
mod tests {
    use super::*;

    fn target(scheme: &str, authority: &str, path_with_query: &str) -> Target {
        Target {
            scheme: scheme.to_string(),
            authority: authority.to_string(),
            path_with_query: path_with_query.to_string(),
        }
    }

    #[test]
    fn a_url_splits_into_scheme_authority_and_path() {
        assert_eq!(
            split_url("http://127.0.0.1:8080/echo?x=1"),
            Ok(target("http", "127.0.0.1:8080", "/echo?x=1"))
        );
        assert_eq!(split_url("https://example.com"), Ok(target("https", "example.com", "/")));
        assert_eq!(split_url("http://[::1]:9/a#frag"), Ok(target("http", "[::1]:9", "/a")));
        assert_eq!(split_url("http://h?q=1"), Ok(target("http", "h", "/?q=1")));
    }

    #[test]
    fn a_url_without_scheme_or_host_is_refused() {
        for url in ["127.0.0.1:80/x", "http:///x", "://h/x"] {
            assert_eq!(
                split_url(url),
                Err(format!("invalid url `{url}`: give scheme://host[:port]/path")),
                "{url}"
            );
        }
    }

    #[test]
    fn the_defaults_are_a_get_without_headers_and_an_open_world() {
        let input: Input = serde_json::from_value(json!({ "requests": [{ "url": "http://h/" }] })).unwrap();
        assert_eq!(input.requests[0].method, "GET");
        assert!(input.requests[0].headers.is_empty() && input.requests[0].body.is_none());
        assert!(Net::is_open_world(&input, &Context::workspace_root()));
        assert!(!input.concurrent);
        let input: Input = serde_json::from_value(json!({ "open_world": false })).unwrap();
        assert!(input.requests.is_empty());
        assert!(!Net::is_open_world(&input, &Context::workspace_root()));
    }

    #[test]
    fn the_plan_is_read_only_and_never_concurrent() {
        let input: Input = serde_json::from_value(json!({})).unwrap();
        let cx = Context::workspace_root();
        assert!(Net::is_read_only(&input, &cx));
        assert!(!Net::is_concurrency_safe(&input, &cx));
        assert!(!Net::is_destructive(&input, &cx));
        assert!(Net::validate_input(&input, &cx).is_ok());
    }

    #[test]
    fn a_stream_error_without_a_code_is_the_hosts_message() {
        let debug = "internal error: response body limit reached\nStack backtrace:\n   0: capture\n";
        assert_eq!(plain_message(debug), "response body limit reached");
        assert_eq!(plain_message("internal error: not granted"), "not granted");
        assert_eq!(plain_message("connection read timeout"), "connection read timeout");
    }

    #[test]
    fn a_response_is_an_entry_of_status_headers_and_lossy_body() {
        let response = Response {
            status: 200,
            headers: vec![("x-a".into(), "1".into())],
            body: b"hi\xff".to_vec(),
            trailers: Vec::new(),
        };
        assert_eq!(
            entry(Ok(response)),
            json!({ "status": 200, "headers": [["x-a", "1"]], "body": "hi\u{fffd}" })
        );
        let response = Response {
            status: 200,
            headers: Vec::new(),
            body: Vec::new(),
            trailers: vec![("x-t".into(), "2".into())],
        };
        assert_eq!(
            entry(Ok(response)),
            json!({ "status": 200, "headers": [], "body": "", "trailers": [["x-t", "2"]] })
        );
        assert_eq!(entry(Err("refused".into())), json!({ "error": "refused" }));
    }
}
