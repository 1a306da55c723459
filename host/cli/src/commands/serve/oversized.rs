//! Requests too large to read, answered instead of dropped.
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
//! Reading every line first, it is also where a plain `tools/call` request
//! is decoded without rmcp's slower way ([`fast_calls`]).

use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use rmcp::RoleServer;
use rmcp::service::RxJsonRpcMessage;
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
                    None => self.out.extend_from_slice(&self.held),
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
                let stand_in = format!(
                    "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"{TOO_LARGE_METHOD}\",\
                     \"params\":{{\"bytes\":{size},\"limit\":{}}}}}\n",
                    self.cap
                );
                self.out.extend_from_slice(stand_in.as_bytes());
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

/// The `id` of the JSON-RPC request whose text starts with `start`, as JSON
/// text (`7`, `"abc"`), when its top-level object names one in `start`.
pub fn request_id(start: &[u8]) -> Option<String> {
    let mut scan = Scan { text: start, at: 0 };
    scan.ws();
    scan.expect(b'{')?;
    loop {
        scan.ws();
        let key = scan.string()?;
        scan.ws();
        scan.expect(b':')?;
        scan.ws();
        let value_start = scan.at;
        scan.value()?;
        if key == b"id" {
            let id = &start[value_start..scan.at];
            let is_id = id.first().is_some_and(|b| *b == b'"' || *b == b'-' || b.is_ascii_digit());
            return is_id.then(|| String::from_utf8_lossy(id).into_owned());
        }
        scan.ws();
        match scan.next()? {
            b',' => continue,
            _ => return None,
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
