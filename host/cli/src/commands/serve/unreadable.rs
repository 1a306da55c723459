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
//! Every other line is read here as rmcp would read it, and what rmcp reads
//! goes to it read ([`fast_calls`]). A request rmcp cannot read is replaced
//! by one of method [`INVALID_METHOD`] ([`stand_in_for`]): a line that is not
//! JSON, which rmcp ignores; one that is not a JSON-RPC 2.0 request (a
//! `jsonrpc` other than `"2.0"`, a `method` that is no string, `params` that
//! are no object), which rmcp answers without its id; one that serde cannot
//! read (a lone surrogate escaped in a string, arrays and objects nested past
//! its recursion limit), which rmcp ignores. Either way the client would wait
//! for a reply forever; it gets an error of its request's id naming what is
//! wrong. A request whose `id` is there but is neither a string nor an
//! integer rmcp can hold (`1.5`, `2^64`, an object) cannot be answered by
//! its id: it is replaced by a notification of method
//! [`UNREADABLE_ID_METHOD`], which the transport answers with an error
//! without an id, naming the id. A line without an id or a `method` (a reply,
//! or what a peer echoed of one) is left to rmcp, so an error never answers
//! an error. A last line that the end of the input cuts off without a newline
//! is read as if it had one.
//!
//! Reading every line first, it is also where a plain `tools/call` request
//! is decoded without rmcp's slower way ([`fast_calls`]).

use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use rmcp::RoleServer;
use rmcp::model::{ErrorCode, RequestId};
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

/// The method of the notification that stands in for a request whose `id`
/// cannot be read; its params are the `message` of the error, which has no
/// id.
pub const UNREADABLE_ID_METHOD: &str = "keel/unreadable-id";

/// How much of an id that cannot be read an error quotes.
const ID_QUOTED_CHARS: usize = 64;

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
                    None => match examine(&self.held) {
                        // What rmcp reads is read once, here, where there
                        // is a lane to hand it over in.
                        Line::Read(message) if self.lane.is_some() => decoded = Some(message),
                        Line::Replaced(stand_in) => self.out.extend_from_slice(stand_in.as_bytes()),
                        Line::Read(_) | Line::AsIs => self.out.extend_from_slice(&self.held),
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
        match id_of(&leading_members(&self.held)) {
            Id::Readable(id) => {
                let params = serde_json::json!({ "bytes": size, "limit": self.cap });
                self.out.extend_from_slice(request_line(&id, TOO_LARGE_METHOD, &params).as_bytes());
            }
            Id::Unreadable(why) => {
                let message = format!("{why}; the request, {size} bytes, is over the limit of {}", self.cap);
                let params = serde_json::json!({ "message": message });
                self.out.extend_from_slice(notification_line(UNREADABLE_ID_METHOD, &params).as_bytes());
            }
            Id::Absent => tracing::warn!(
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
                // The end: a last line without a newline ends here. rmcp's
                // transport would drop it unread.
                if this.skipping.is_some() || !this.held.is_empty() {
                    let (_, decoded) = this.take(b"\n");
                    if let (Some(call), Some(lane)) = (decoded, &this.lane) {
                        lane.put(call);
                        return Poll::Pending;
                    }
                    continue;
                }
                return Poll::Ready(Ok(()));
            }
        }
    }
}

/// What becomes of a whole line.
#[allow(
    clippy::large_enum_variant,
    reason = "handed back once, never kept: boxing the message would cost an allocation a line"
)]
enum Line {
    /// Passed on as it is, for rmcp to read, or ignore.
    AsIs,
    /// Read: the message rmcp makes of it.
    Read(RxJsonRpcMessage<RoleServer>),
    /// A request rmcp cannot read, replaced by this stand-in line.
    Replaced(String),
}

/// What becomes of `line`: read as rmcp reads it; or, when rmcp cannot read
/// it, replaced ([`stand_in_for`]) or passed on.
fn examine(line: &[u8]) -> Line {
    match serde_json::from_slice::<RxJsonRpcMessage<RoleServer>>(line) {
        Ok(message) => Line::Read(message),
        Err(error) => stand_in_for(line, &error).map_or(Line::AsIs, Line::Replaced),
    }
}

/// In place of `line`, when it is a request (it names an `id` and a
/// `method`) that rmcp fails to read with `error`: a request of its id and
/// method [`INVALID_METHOD`] whose params are the error owed to it
/// ([`fault`]), or, when the id itself cannot be read, a notification of
/// method [`UNREADABLE_ID_METHOD`] naming it. `None` for every other line.
fn stand_in_for(line: &[u8], error: &serde_json::Error) -> Option<String> {
    let members = leading_members(line);
    members.iter().any(|(key, _)| *key == b"method").then_some(())?;
    match id_of(&members) {
        Id::Absent => None,
        Id::Readable(id) => {
            let (code, message) = fault(line).unwrap_or_else(|| unreadable(error));
            let params = serde_json::json!({ "code": code.0, "message": message });
            Some(request_line(&id, INVALID_METHOD, &params))
        }
        Id::Unreadable(why) => {
            Some(notification_line(UNREADABLE_ID_METHOD, &serde_json::json!({ "message": why })))
        }
    }
}

/// The error owed to a request whose members are what JSON-RPC 2.0 asks
/// but that rmcp fails to read with `error`: serde cannot read a value in
/// it, or what MCP makes of it.
fn unreadable(error: &serde_json::Error) -> (ErrorCode, String) {
    if error.to_string().starts_with("recursion limit exceeded") {
        (ErrorCode::INVALID_REQUEST, format!("the request is nested too deeply to read: {error}"))
    } else if error.is_syntax() || error.is_eof() {
        (ErrorCode::PARSE_ERROR, format!("the request is not valid JSON: {error}"))
    } else {
        (ErrorCode::INVALID_REQUEST, format!("the request is not one MCP defines: {error}"))
    }
}

/// The line of a JSON-RPC request of `id` (JSON text), `method` and `params`.
fn request_line(id: &str, method: &str, params: &serde_json::Value) -> String {
    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"{method}\",\"params\":{params}}}\n")
}

/// The line of a JSON-RPC notification of `method` and `params`.
fn notification_line(method: &str, params: &serde_json::Value) -> String {
    format!("{{\"jsonrpc\":\"2.0\",\"method\":\"{method}\",\"params\":{params}}}\n")
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

/// A request's `id`, as far as it can be read.
enum Id {
    /// None, or `null`: a notification, or a line with no id to answer.
    Absent,
    /// One rmcp reads, as the JSON text that writes it.
    Readable(String),
    /// One rmcp cannot read, and why, naming it.
    Unreadable(String),
}

/// The `id` among `members` (see [`leading_members`]): one a request may
/// have, a string or an integer within 64 bits, as rmcp reads it.
fn id_of(members: &[(&[u8], &[u8])]) -> Id {
    let Some((_, text)) = members.iter().find(|(key, _)| *key == b"id") else { return Id::Absent };
    if *text == b"null" {
        return Id::Absent;
    }
    match serde_json::from_slice::<RequestId>(text) {
        Ok(id) => Id::Readable(serde_json::to_string(&id).expect("an id serializes")),
        Err(_) => {
            let text = String::from_utf8_lossy(text);
            let quoted = match text.char_indices().nth(ID_QUOTED_CHARS) {
                Some((at, _)) => format!("{}… ({} bytes)", &text[..at], text.len()),
                None => text.into_owned(),
            };
            Id::Unreadable(format!(
                "the request's id {quoted} cannot be read: an id must be a string or an integer from {} to {}",
                i64::MIN,
                i64::MAX
            ))
        }
    }
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

    /// In place of `line`, the stand-in of [`stand_in_for`], when rmcp
    /// cannot read it.
    fn stand_in(line: &[u8]) -> Option<String> {
        let error = serde_json::from_slice::<RxJsonRpcMessage<RoleServer>>(line).err()?;
        stand_in_for(line, &error)
    }

    /// The `id` of the request whose text starts with `start`, as JSON text
    /// (`7`, `"abc"`), when it names one there that rmcp can read.
    fn request_id(start: &[u8]) -> Option<String> {
        match id_of(&leading_members(start)) {
            Id::Readable(id) => Some(id),
            Id::Absent | Id::Unreadable(_) => None,
        }
    }

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
        // As rmcp reads it, and written as JSON: never the text as it came.
        assert_eq!(request_id(br#"{"id":1e2,"method":"x"}"#).as_deref(), Some("100"));
        assert_eq!(request_id(br#"{"id":"\u0041","method":"x"}"#).as_deref(), Some(r#""A""#));
        for unreadable in
            [&br#"{"id":1x,"method":"x"}"#[..], br#"{"id":1.5,"method":"x"}"#, br#"{"id":true}"#]
        {
            assert_eq!(request_id(unreadable), None, "{}", String::from_utf8_lossy(unreadable));
        }
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
        // What serde cannot read within a request whose members are right.
        let surrogate = r#"{"jsonrpc":"2.0","id":3,"method":"ping","params":{"x":"a\ud800b"}}"#;
        assert_eq!(
            replaced(surrogate),
            Some((
                json!(3),
                json!(-32700),
                json!("the request is not valid JSON: unexpected end of hex escape at line 1 column 63")
            ))
        );
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":"d","method":"tools/call","params":{{"name":"echo","arguments":{{"d":{}{}}}}}}}"#,
            "[".repeat(130),
            "]".repeat(130)
        );
        assert_eq!(
            replaced(&deep),
            Some((
                json!("d"),
                json!(-32600),
                json!(
                    "the request is nested too deeply to read: recursion limit exceeded at line 1 column 214"
                )
            ))
        );
        // What rmcp reads, it answers; a line with no id or no method has
        // no one to answer, or is a reply, and is left to it too.
        for line in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":null}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized","params":[]}"#,
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32700,"message":"x"}"#,
            r#"{"jsonrpc":"2.0","method":"tools/call","params":{"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
            "not json",
            "",
        ] {
            assert_eq!(replaced(line), None, "{line}");
        }
    }

    #[test]
    fn a_request_whose_id_cannot_be_read_is_replaced_by_a_notice_naming_the_id() {
        let noticed = |line: &str| {
            let stand_in: Value = serde_json::from_str(&stand_in(line.as_bytes())?).unwrap();
            assert_eq!(stand_in["method"], UNREADABLE_ID_METHOD, "{line}");
            assert!(stand_in.get("id").is_none(), "a notification: {stand_in}");
            Some(stand_in["params"]["message"].as_str().unwrap().to_owned())
        };
        let why = |id: &str| {
            format!(
                "the request's id {id} cannot be read: an id must be a string or an integer from \
                 -9223372036854775808 to 9223372036854775807"
            )
        };
        for id in ["1.5", "18446744073709551616", "{\"a\":1}", "true", "1x", r#""\ud800""#] {
            let line = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
            assert_eq!(noticed(&line), Some(why(id)), "{line}");
        }
        let long = "1".repeat(401);
        let line = format!(r#"{{"jsonrpc":"2.0","id":{long},"method":"ping"}}"#);
        assert_eq!(noticed(&line), Some(why(&format!("{}… (401 bytes)", &long[..64]))));
        // A reply, or a notification, is never answered.
        assert_eq!(noticed(r#"{"jsonrpc":"2.0","id":1.5,"result":{}}"#), None);
        assert_eq!(noticed(r#"{"jsonrpc":"2.0","id":null,"method":"ping","params":7}"#), None);
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
    async fn lines_within_the_cap_pass_unchanged_and_the_last_is_ended_with_a_newline() {
        let input = "{\"a\":1}\n{\"b\":2}\npartial";
        // rmcp's transport drops a last line without one.
        assert_eq!(read_all(input.as_bytes(), 100).await, format!("{input}\n"));
        assert_eq!(read_all(b"{\"a\":1}\n", 100).await, "{\"a\":1}\n", "nothing is added to a line ended");
    }

    #[tokio::test]
    async fn a_last_line_past_the_cap_without_a_newline_is_replaced_too() {
        let big =
            format!(r#"{{"jsonrpc":"2.0","id":4,"method":"ping","params":{{"t":"{}"}}}}"#, "x".repeat(500));
        let out = read_all(big.as_bytes(), 100).await;
        let stand_in: Value = serde_json::from_str(&out).unwrap();
        assert_eq!((&stand_in["id"], &stand_in["method"]), (&json!(4), &json!(TOO_LARGE_METHOD)));
    }
}
