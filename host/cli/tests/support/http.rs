//! HTTP/1.1 requests to `keel serve --http`, one connection each, and the
//! MCP requests the tests send over them.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::{Value, json};

/// A response: status, headers (names lowercase) and body.
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The headers, names lowercase.
    pub headers: Vec<(String, String)>,
    /// The body, dechunked.
    pub body: String,
}

impl Reply {
    /// The value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }

    /// The JSON-RPC message of the body: the body itself, or the last
    /// `data:` event of a stream.
    pub fn message(&self) -> Value {
        if let Ok(value) = serde_json::from_str(&self.body) {
            return value;
        }
        let data = self
            .body
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .rfind(|data| data.starts_with('{'))
            .unwrap_or_else(|| panic!("a JSON-RPC message in {:?}", self.body));
        serde_json::from_str(data).unwrap()
    }
}

/// One HTTP/1.1 request on a connection of its own, read to its end.
pub fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nconnection: close\r\ncontent-length: {}\r\n", body.len());
    if !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("host: 127.0.0.1:{}\r\n", addr.port()));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    // A server may answer before the whole body is sent (a body over the
    // cap); a write it no longer reads is not the test's failure.
    let _ = stream.write_all(body.as_bytes());
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status =
        lines.next().and_then(|line| line.split(' ').nth(1)).and_then(|code| code.parse().ok()).unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    let chunked =
        headers.iter().any(|(name, value)| name == "transfer-encoding" && value.contains("chunked"));
    let body = if chunked { dechunk(body) } else { body.to_string() };
    Reply { status, headers, body }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else { break };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// What a client of streamable HTTP accepts.
pub const ACCEPT: (&str, &str) = ("accept", "application/json, text/event-stream");
/// A JSON body.
pub const JSON: (&str, &str) = ("content-type", "application/json");

/// An `initialize` request of a 2025-06-18 client.
pub fn initialize() -> String {
    json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": { "name": "test", "version": "1" }
    }})
    .to_string()
}

/// A stateless 2026-07-28 `tools/call`, with the headers and metadata that
/// version asks of every request.
pub fn stateless_call(addr: SocketAddr, extra: &[(&str, &str)], name: &str, arguments: &Value) -> Reply {
    stateless_call_with(addr, extra, name, arguments, &json!({}), &json!({}))
}

/// [`stateless_call`] from a client of `capabilities`, with `more` in its
/// params (`inputResponses`, `requestState`).
pub fn stateless_call_with(
    addr: SocketAddr,
    extra: &[(&str, &str)],
    name: &str,
    arguments: &Value,
    capabilities: &Value,
    more: &Value,
) -> Reply {
    let body = stateless_body(7, name, arguments, capabilities, more);
    let mut headers = stateless_headers(name);
    headers.extend_from_slice(extra);
    request(addr, "POST", "/mcp", &headers, &body)
}

/// The body of a stateless 2026-07-28 `tools/call` numbered `id`, from a
/// client of `capabilities`, with `more` in its params.
pub fn stateless_body(id: u64, name: &str, arguments: &Value, capabilities: &Value, more: &Value) -> String {
    let mut params = json!({
        "name": name, "arguments": arguments,
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": capabilities,
            "io.modelcontextprotocol/clientInfo": { "name": "test", "version": "1" }
        }
    });
    for (key, value) in more.as_object().into_iter().flatten() {
        params[key] = value.clone();
    }
    json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params }).to_string()
}

/// The headers of a stateless 2026-07-28 `tools/call` of `name`.
pub fn stateless_headers(name: &str) -> Vec<(&str, &str)> {
    vec![
        ACCEPT,
        JSON,
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", name),
    ]
}
