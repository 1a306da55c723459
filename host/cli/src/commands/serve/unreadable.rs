//! Requests that cannot be read, answered instead of dropped.
//!
//! A message on stdio is one line, and a line past [`MAX_MESSAGE_BYTES`] is
//! never buffered. rmcp's transport would drop it with a log line, and its
//! client would wait for a reply forever. [`BoundedLines`] sits under the
//! transport instead: it passes every line through, but one that grows past
//! the cap is cut off, its `id` read from the start of it, and a short
//! request of method [`TOO_LARGE_METHOD`] with that id put in its place, which
//! the server answers with an error naming the cap. A line whose id cannot be
//! found in its first [`ID_SCAN_BYTES`] (or that is no request) is dropped
//! with a warning, as there is no one to answer.
//!
//! A request rmcp cannot read for another reason is replaced the same way,
//! by one of method [`INVALID_METHOD`] ([`stand_in`]): a line that is not
//! JSON, which rmcp ignores, or one that is not a JSON-RPC 2.0 request (a
//! `jsonrpc` other than `"2.0"`, a `method` that is no string, `params` that
//! are no object), which rmcp answers without its id. Either way the client
//! would wait for a reply forever; it gets a parse or invalid-request error
//! of its request's id naming what is wrong. A line without an id or a
//! `method` (a reply, or what a peer echoed of one) is left to rmcp, so an
//! error never answers an error.
//!
//! Reading every line first, it is also where a plain `tools/call` request
//! is decoded without rmcp's slower way ([`fast_calls`]).

use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use rmcp::RoleServer;
use rmcp::model::ErrorCode;
use rmcp::service::RxJsonRpcMessage;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, ReadBuf};

use super::fast_calls::{self, CallLane};

/// The largest message read from stdio: 16 MiB, four times the input cap,
/// for a request whose input the host would refuse anyway with a clear error.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// How much of an oversized line is kept to find its `id`: JSON-RPC
/// messages put `id` near the start.
pub const ID_SCAN_BYTES: usize = 64 << 10;

/// The method of the request that stands in for one too large to read.
pub const TOO_LARGE_METHOD: &str = "keel/message-too-large";

/// The method of the request that stands in for one rmcp cannot read; its
/// params are the error's `code` and `message`.
pub const INVALID_METHOD: &str = "keel/invalid-request";

/// Reads lines from `inner`, replacing any longer than the cap. A line is
/// held until it ends (as the transport above would buffer it anyway), so
/// the transport never sees part of one.
pub struct BoundedLines<R> {
    inner: R,
    cap: usize,
    /// The current line, while it is within the cap.
    held: Vec<u8>,
    /// Within an oversized line: its size so far, skipped to its end; `held`
    /// keeps its first [`ID_SCAN_BYTES`].
    skipping: Option<usize>,
    /// Whole lines to hand out before reading more.
    out: Vec<u8>,
    /// Where `out` has been handed out up to.
    given: usize,
    /// The buffer reads go into, kept from read to read.
    chunk: Box<[u8]>,
    /// The part of `chunk` read but not yet taken into lines.
    unread: Range<usize>,
    /// Where a `tools/call` line decoded here goes instead of being handed
    /// out ([`fast_calls`]).
    lane: Option<CallLane>,
}

impl<R> BoundedLines<R> {
    /// Lines of `inner` of at most `cap` bytes.
    pub fn new(inner: R, cap: usize) -> Self {
        let chunk = vec![0; 64 << 10].into_boxed_slice();
        BoundedLines {
            inner,
            cap,
            held: Vec::new(),
            skipping: None,
            out: Vec::new(),
            given: 0,
            chunk,
            unread: 0..0,
            lane: None,
        }
    }

    /// Also decode each whole line that is a plain `tools/call` request, and
    /// put it in `lane` instead of handing it out ([`fast_calls`]). A read
    /// that puts one there is left pending, with no wake-up: whoever reads
    /// these lines must take it from the lane then ([`fast_calls::receive`]).
    pub fn decoding_calls(mut self, lane: CallLane) -> Self {
        self.lane = Some(lane);
        self
    }

    /// Take `data`, just read, up to the end of its first line: how many
    /// bytes were taken, and the call decoded if that line was one.
    fn take(&mut self, data: &[u8]) -> (usize, Option<RxJsonRpcMessage<RoleServer>>) {
        let newline = data.iter().position(|&b| b == b'\n');
        let (part, ends) = match newline {
            Some(at) => (&data[..=at], true),
            None => (data, false),
        };
        match &mut self.skipping {
            Some(size) => *size += part.len(),
            None if self.held.len() + part.len() > self.cap => {
                let size = self.held.len() + part.len();
                self.held.extend_from_slice(
                    &part[..ID_SCAN_BYTES.saturating_sub(self.held.len()).min(part.len())],
                );
                self.held.truncate(ID_SCAN_BYTES);
                self.skipping = Some(size);
            }
            None => self.held.extend_from_slice(part),
        }
        let mut decoded = None;
        if ends {
            match self.skipping.take() {
                Some(size) => self.replace(size),
                None => match self.lane.as_ref().and_then(|_| fast_calls::decode(&self.held)) {
                    Some(call) => decoded = Some(call),
                    None => match stand_in(&self.held) {
                        Some(stand_in) => self.out.extend_from_slice(stand_in.as_bytes()),
                        None => self.out.extend_from_slice(&self.held),
                    },
                },
            }
            self.held.clear();
        }
        (part.len(), decoded)
    }

    /// Hand out, in place of an oversized line of `size` bytes whose start
    /// is `held`, a request of the same id asking for the error.
    fn replace(&mut self, size: usize) {
        match request_id(&self.held) {
            Some(id) => {
                let params = serde_json::json!({ "bytes": size, "limit": self.cap });
                self.out.extend_from_slice(request_line(&id, TOO_LARGE_METHOD, &params).as_bytes());
            }
            None => tracing::warn!(
                bytes = size,
                "dropped a message over the {} byte limit: no request id to answer in its start",
                self.cap
            ),
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for BoundedLines<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.given < this.out.len() {
                let n = (this.out.len() - this.given).min(buf.remaining());
                buf.put_slice(&this.out[this.given..this.given + n]);
                this.given += n;
                if this.given == this.out.len() {
                    this.out.clear();
                    this.given = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if !this.unread.is_empty() {
                // One line at a time: a call decoded here must come after
                // every line handed out before it, and before any after it.
                let chunk = std::mem::take(&mut this.chunk);
                let (taken, decoded) = this.take(&chunk[this.unread.clone()]);
                this.chunk = chunk;
                this.unread.start += taken;
                if let (Some(call), Some(lane)) = (decoded, &this.lane) {
                    lane.put(call);
                    return Poll::Pending;
                }
                continue;
            }
            let mut read = ReadBuf::new(&mut this.chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            let filled = read.filled().len();
            this.unread = 0..filled;
            if filled == 0 {
                // The end: a last line without a newline goes as it is.
                if this.skipping.is_none() && !this.held.is_empty() {
                    this.out.append(&mut this.held);
                    continue;
                }
                return Poll::Ready(Ok(()));
            }
        }
    }
}

/// In place of `line`, a request of its id and method [`INVALID_METHOD`]
/// whose params are the error owed to it, when `line` is a request (it
/// names an `id` and a `method`) that rmcp cannot read: not JSON, or not a
/// JSON-RPC 2.0 request ([`fault`]). `None` for every other line.
pub fn stand_in(line: &[u8]) -> Option<String> {
    let (code, message) = fault(line)?;
    let members = leading_members(line);
    let id = id_of(&members)?;
    members.iter().any(|(key, _)| *key == b"method").then_some(())?;
    // Only what rmcp refuses: whatever it reads is its to answer.
    if serde_json::from_slice::<RxJsonRpcMessage<RoleServer>>(line).is_ok() {
        return None;
    }
    let params = serde_json::json!({ "code": code.0, "message": message });
    Some(request_line(&id, INVALID_METHOD, &params))
}

/// The line of a JSON-RPC request of `id` (JSON text), `method` and `params`.
fn request_line(id: &str, method: &str, params: &serde_json::Value) -> String {
    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"{method}\",\"params\":{params}}}\n")
}

/// What is wrong with `line` as a JSON-RPC 2.0 request, as the error
/// that says so: not JSON at all, or a `jsonrpc`, `method` or `params` that
/// is not what JSON-RPC 2.0 (with MCP's object params) has. `None` when
/// none of these is wrong, or the line is no JSON object.
fn fault(line: &[u8]) -> Option<(ErrorCode, String)> {
    /// The members that make a request; any other is let be.
    #[derive(Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow)]
        jsonrpc: Option<&'a RawValue>,
        #[serde(borrow)]
        method: Option<&'a RawValue>,
        #[serde(borrow)]
        params: Option<&'a RawValue>,
    }
    let envelope: Envelope<'_> = match serde_json::from_slice(line) {
        Ok(envelope) => envelope,
        Err(error) if error.is_syntax() || error.is_eof() => {
            return Some((ErrorCode::PARSE_ERROR, format!("the request is not valid JSON: {error}")));
        }
        Err(_) => return None,
    };
    fn text(member: Option<&RawValue>) -> Option<&str> {
        member.map(RawValue::get)
    }
    let wrong = if text(envelope.jsonrpc) != Some(r#""2.0""#) {
        r#"`jsonrpc` must be "2.0""#
    } else if !text(envelope.method).is_some_and(|method| method.starts_with('"')) {
        "`method` must be a string"
    } else if text(envelope.params).is_some_and(|params| !params.starts_with('{')) {
        "`params` must be an object"
    } else {
        return None;
    };
    Some((ErrorCode::INVALID_REQUEST, format!("the request is not a JSON-RPC 2.0 request: {wrong}")))
}

/// The `id` of the JSON-RPC request whose text starts with `start`, as JSON
/// text (`7`, `"abc"`), when its top-level object names one in `start`.
pub fn request_id(start: &[u8]) -> Option<String> {
    id_of(&leading_members(start))
}

/// The `id` among `members` (see [`leading_members`]) as JSON text, when it
/// is one a request may have: a string or a number.
fn id_of(members: &[(&[u8], &[u8])]) -> Option<String> {
    let (_, id) = members.iter().find(|(key, _)| *key == b"id")?;
    let is_id = id.first().is_some_and(|b| *b == b'"' || *b == b'-' || b.is_ascii_digit());
    is_id.then(|| String::from_utf8_lossy(id).into_owned())
}

/// The members of the JSON object whose text starts with `start`, in order,
/// as far as each is whole there: its key's raw bytes and its value's text.
fn leading_members(start: &[u8]) -> Vec<(&[u8], &[u8])> {
    let mut members = Vec::new();
    let mut scan = Scan { text: start, at: 0 };
    scan.ws();
    if scan.expect(b'{').is_none() {
        return members;
    }
    loop {
        let member = (|| {
            scan.ws();
            let key = scan.string()?;
            scan.ws();
            scan.expect(b':')?;
            scan.ws();
            let value_start = scan.at;
            scan.value()?;
            Some((key, &start[value_start..scan.at]))
        })();
        let Some(member) = member else { return members };
        members.push(member);
        scan.ws();
        if scan.next() != Some(b',') {
            return members;
        }
    }
}

/// A cursor over JSON text that may stop anywhere: every step gives `None`
/// when the text runs out.
struct Scan<'a> {
    text: &'a [u8],
    at: usize,
}

impl<'a> Scan<'a> {
    fn next(&mut self) -> Option<u8> {
        let byte = *self.text.get(self.at)?;
        self.at += 1;
        Some(byte)
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn ws(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.next()? == byte).then_some(())
    }

    /// A string; its raw bytes between the quotes.
    fn string(&mut self) -> Option<&'a [u8]> {
        self.expect(b'"')?;
        let start = self.at;
        loop {
            match self.next()? {
                b'\\' => {
                    self.next()?;
                }
                b'"' => {
                    let text: &'a [u8] = self.text;
                    return Some(&text[start..self.at - 1]);
                }
                _ => {}
            }
        }
    }

    /// Any value, skipped.
    fn value(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match self.peek()? {
                        b'"' => {
                            self.string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.at += 1;
                                return Some(());
                            }
                        }
                        _ => {}
                    }
                    self.at += 1;
                }
            }
            _ => {
                let start = self.at;
                while self
                    .peek()
                    .is_some_and(|b| !matches!(b, b',' | b'}' | b']') && !b.is_ascii_whitespace())
                {
                    self.at += 1;
                }
                // A number or literal cut by the end of the text is not whole.
                (self.at > start && self.at < self.text.len()).then_some(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use tokio::io::AsyncReadExt as _;

    use super::*;

    #[test]
    fn the_top_level_id_is_found_wherever_it_is() {
        assert_eq!(request_id(br#"{"jsonrpc":"2.0","id":7,"method":"x"}"#).as_deref(), Some("7"));
        assert_eq!(
            request_id(br#"{"method":"x","params":{"id":9,"a":[1,{"id":3}]},"id":"a\"b""#).as_deref(),
            Some(r#""a\"b""#)
        );
        assert_eq!(request_id(br#" { "id" : -12 , "#).as_deref(), Some("-12"));
        assert_eq!(request_id(br#"{"method":"x","params":{"text":"aaaa"#), None, "cut before the id");
        assert_eq!(request_id(br#"{"id":12"#), None, "a number cut short is not known whole");
        assert_eq!(request_id(br#"{"id":null,"method":"x"}"#), None, "a notification has no id to answer");
        assert_eq!(request_id(b"[1,2]"), None);
    }

    #[test]
    fn a_request_rmcp_cannot_read_is_replaced_by_one_asking_for_its_error() {
        let replaced = |line: &str| {
            let stand_in: Value = serde_json::from_str(&stand_in(line.as_bytes())?).unwrap();
            assert_eq!(stand_in["method"], INVALID_METHOD);
            Some((
                stand_in["id"].clone(),
                stand_in["params"]["code"].clone(),
                stand_in["params"]["message"].clone(),
            ))
        };
        assert_eq!(
            replaced(
                r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":}}}"#
            ),
            Some((
                json!(7),
                json!(-32700),
                json!("the request is not valid JSON: expected value at line 1 column 91")
            ))
        );
        let invalid = |wrong: &str| format!("the request is not a JSON-RPC 2.0 request: {wrong}");
        assert_eq!(
            replaced(r#"{"jsonrpc":"1.0","id":"a","method":"ping"}"#),
            Some((json!("a"), json!(-32600), json!(invalid(r#"`jsonrpc` must be "2.0""#))))
        );
        assert_eq!(
            replaced(r#"{"jsonrpc":"2.0","id":1,"method":["ping"]}"#),
            Some((json!(1), json!(-32600), json!(invalid("`method` must be a string"))))
        );
        assert_eq!(
            replaced(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":[]}"#),
            Some((json!(1), json!(-32600), json!(invalid("`params` must be an object"))))
        );
        // What rmcp reads, it answers; a line with no id or no method has
        // no one to answer, or is a reply, and is left to it too.
        for line in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":null}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized","params":[]}"#,
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32700,"message":"x"}"#,
            r#"{"jsonrpc":"2.0","method":"tools/call","params":{"#,
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping","params":[]}"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
            "not json",
            "",
        ] {
            assert_eq!(replaced(line), None, "{line}");
        }
    }

    async fn read_all(input: &[u8], cap: usize) -> String {
        let mut out = String::new();
        BoundedLines::new(input, cap).read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn a_line_past_the_cap_is_replaced_by_a_request_naming_it() {
        let big = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"tools/call\",\"params\":{{\"t\":\"{}\"}}}}\n",
            "x".repeat(500)
        );
        let input = format!("{{\"id\":1}}\n{big}{{\"id\":2}}\n");
        let out = read_all(input.as_bytes(), 100).await;
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "{\"id\":1}");
        assert_eq!(
            lines[1],
            format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"{TOO_LARGE_METHOD}\",\"params\":{{\"bytes\":{},\"limit\":100}}}}",
                big.len()
            )
        );
        assert_eq!(lines[2], "{\"id\":2}", "the next line is read as it was");
        assert_eq!(lines.len(), 3, "nothing of the big line reaches the transport");
    }

    #[tokio::test]
    async fn lines_within_the_cap_pass_unchanged() {
        let input = "{\"a\":1}\n{\"b\":2}\npartial";
        assert_eq!(read_all(input.as_bytes(), 100).await, input);
    }
}
