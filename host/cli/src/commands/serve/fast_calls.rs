//! `tools/call` requests on stdio decoded by keel; every other message by
//! rmcp.
//!
//! rmcp decodes a line by trying each kind of message, then each kind of
//! request, in turn (serde's untagged enums), buffering the message and
//! building an error for every kind that does not fit. For a `tools/call`
//! that costs several times what decoding the message itself does, and
//! more than a tenth of the server's CPU per call. The lines are read
//! beneath rmcp's transport ([`BoundedLines`]); one that is a plain
//! `tools/call` request, the four members of a JSON-RPC request and no
//! other, is decoded there by [`decode`] into the very message rmcp would
//! make of it, with rmcp's own types, and is put in the [`CallLane`]
//! instead of passed on. [`receive`] takes it from there. Every other line,
//! and any `tools/call` that [`decode`] does not take whole, goes to rmcp's
//! transport as before, with its error replies and compatibility rules.
//!
//! Order is kept: a line is decoded only once the transport has read every
//! line before it, and the transport reads no line after it until the
//! message is taken.
//!
//! [`BoundedLines`]: super::unreadable::BoundedLines

use std::future::poll_fn;
use std::pin::pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;

use rmcp::RoleServer;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientRequest, JsonRpcMessage, JsonRpcRequest, RequestId,
};
use rmcp::service::RxJsonRpcMessage;
use rmcp::transport::Transport;
use serde::Deserialize;
use serde_json::value::RawValue;

/// Where a line decoded beneath the transport waits for [`receive`]: one
/// message at most, as the lines stop there until it is taken.
#[derive(Clone, Default)]
pub struct CallLane(Arc<Mutex<Option<RxJsonRpcMessage<RoleServer>>>>);

impl CallLane {
    /// Leave `message` for [`receive`].
    pub fn put(&self, message: RxJsonRpcMessage<RoleServer>) {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        debug_assert!(slot.is_none(), "a decoded message was left untaken");
        *slot = Some(message);
    }

    /// The message left, if any.
    pub fn take(&self) -> Option<RxJsonRpcMessage<RoleServer>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// The next message of `transport`, whose lines are read by a
/// [`BoundedLines`] that puts the calls it decodes in `lane`.
///
/// Cancel-safe as the transport's own `receive` is: a message is taken
/// from the lane only when it is returned.
///
/// [`BoundedLines`]: super::unreadable::BoundedLines
pub async fn receive<T: Transport<RoleServer>>(
    transport: &mut T,
    lane: &CallLane,
) -> Option<RxJsonRpcMessage<RoleServer>> {
    if let Some(message) = lane.take() {
        return Some(message);
    }
    let mut receiving = pin!(transport.receive());
    // The lines stop where a call was decoded: the transport's read then
    // waits, and the call is what comes next.
    poll_fn(|cx| match receiving.as_mut().poll(cx) {
        Poll::Ready(message) => Poll::Ready(message),
        Poll::Pending => lane.take().map_or(Poll::Pending, |message| Poll::Ready(Some(message))),
    })
    .await
}

/// The message rmcp makes of `line` when it is a `tools/call` request with
/// exactly the members `jsonrpc` (`"2.0"`), `id`, `method` and `params`,
/// each written without escapes where it is a name; `None` for any other
/// line, which is left to rmcp.
pub fn decode(line: &[u8]) -> Option<RxJsonRpcMessage<RoleServer>> {
    /// A request's members, `params` left as text. Any other member (a
    /// `result`, an `error`) leaves the line to rmcp, which knows what to
    /// make of it.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Head<'a> {
        jsonrpc: &'a str,
        id: RequestId,
        method: &'a str,
        #[serde(borrow)]
        params: &'a RawValue,
    }
    let head: Head<'_> = serde_json::from_slice(line).ok()?;
    if head.jsonrpc != "2.0" || head.method != "tools/call" {
        return None;
    }
    // rmcp reads a request's `params` through a wrapper that takes `_meta`
    // out into the request's extensions and flattens the rest, which
    // buffers them; read directly, then moved there, they make the same
    // request at half the cost.
    let mut params: CallToolRequestParams = serde_json::from_str(head.params.get()).ok()?;
    let meta = params.meta.take();
    let mut call = CallToolRequest::new(params);
    if let Some(meta) = meta {
        call.extensions.insert(meta);
    }
    Some(JsonRpcMessage::Request(JsonRpcRequest::new(head.id, ClientRequest::CallToolRequest(call))))
}

#[cfg(test)]
mod tests {
    use rmcp::model::{ClientNotification, RequestMetaObject};
    use rmcp::transport::async_rw::AsyncRwTransport;
    use tokio::io::AsyncWriteExt as _;

    use super::super::unreadable::BoundedLines;
    use super::*;

    /// What rmcp's transport makes of `line`.
    fn rmcp_decodes(line: &str) -> RxJsonRpcMessage<RoleServer> {
        serde_json::from_str(line).unwrap_or_else(|error| panic!("rmcp refuses {line}: {error}"))
    }

    #[test]
    fn a_call_decodes_to_the_message_rmcp_makes() {
        for line in [
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}"#,
            r#"{"method":"tools/call","params":{"name":"echo"},"id":"a\"b","jsonrpc":"2.0"}"#,
            r#" { "jsonrpc" : "2.0" , "id" : 1e2 , "method" : "tools/call" , "params" : { "name" : "e\u0063ho" } } "#,
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"a":[1,{"b":null}]},"_meta":{"progressToken":"p-1","x":{"y":2}}}}"#,
            "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\"}}\r\n",
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"_meta":null,"name":"echo","unknown":[1],"requestState":"s"}}"#,
        ] {
            let fast = decode(line.as_bytes()).unwrap_or_else(|| panic!("decoded: {line}"));
            assert_same_call(fast, rmcp_decodes(line), line);
        }
    }

    /// `fast` is the call rmcp decoded as `expected` from `line`: the same
    /// text, and the same parts, since a handler reads the `_meta` (a
    /// progress token) from the extensions.
    fn assert_same_call(
        fast: RxJsonRpcMessage<RoleServer>,
        expected: RxJsonRpcMessage<RoleServer>,
        line: &str,
    ) {
        assert_eq!(
            serde_json::to_string(&fast).unwrap(),
            serde_json::to_string(&expected).unwrap(),
            "{line}"
        );
        let (fast, expected) = (call_of(fast), call_of(expected));
        assert_eq!(fast.params, expected.params, "{line}");
        assert_eq!(
            fast.extensions.get::<RequestMetaObject>(),
            expected.extensions.get::<RequestMetaObject>(),
            "{line}"
        );
    }

    fn call_of(message: RxJsonRpcMessage<RoleServer>) -> CallToolRequest {
        match message {
            JsonRpcMessage::Request(JsonRpcRequest {
                request: ClientRequest::CallToolRequest(call), ..
            }) => call,
            other => panic!("not a call: {other:?}"),
        }
    }

    /// Lines a byte or two away from calls: whatever [`decode`] takes is
    /// what rmcp makes of it.
    #[test]
    fn a_mutated_call_is_decoded_as_rmcp_decodes_it_or_left_to_rmcp() {
        let seeds = [
            r#"{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"echo","arguments":{"text":"a\"b","n":[1,2.5,null,true]},"_meta":{"progressToken":"t"}}}"#,
            r#"{"params":{"_meta":{},"name":"grep","arguments":{}},"method":"tools/call","id":"x-1","jsonrpc":"2.0"}"#,
        ];
        // Bytes that keep a mutant close to JSON.
        let alphabet = br#"{}[]":,0123456789-.eE \u_abcdefmnrstx"#;
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |below: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % below as u64) as usize
        };
        let (mut decoded, mut tried) = (0, 0);
        for seed in seeds {
            for _ in 0..4000 {
                let mut line = seed.as_bytes().to_vec();
                for _ in 0..1 + next(2) {
                    let at = next(line.len());
                    match next(3) {
                        0 => {
                            line.remove(at);
                        }
                        1 => line.insert(at, alphabet[next(alphabet.len())]),
                        _ => line[at] = alphabet[next(alphabet.len())],
                    }
                }
                tried += 1;
                let Some(fast) = decode(&line) else { continue };
                decoded += 1;
                // Made of ASCII bytes only: every mutant is text.
                let text = std::str::from_utf8(&line).expect("an ASCII line");
                assert_same_call(fast, rmcp_decodes(text), text);
            }
        }
        // Enough of the mutants stay calls for the comparison to mean something.
        assert!(decoded * 20 > tried, "{decoded} of {tried} decoded");
    }

    #[test]
    fn anything_but_a_plain_call_is_left_to_rmcp() {
        for line in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"echo"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"},"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"},"extra":1}"#,
            r#"{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"echo"}}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"echo"}}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"method":"tools/call","params":{"name":"echo"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools\/call","params":{"name":"echo"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/call","params":{"name":"echo"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","name":"b"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","_meta":"x"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":null}"#,
            "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\"}}",
            r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"}}]"#,
            "not json",
        ] {
            assert!(decode(line.as_bytes()).is_none(), "{line}");
        }
    }

    /// Messages in the order `receive` gives them, for `input` written in
    /// pieces of `piece` bytes.
    async fn received(input: &str, piece: usize) -> Vec<String> {
        let (mut client, server) = tokio::io::duplex(64);
        let lane = CallLane::default();
        let lines = BoundedLines::new(server, 200).decoding_calls(lane.clone());
        let mut transport = AsyncRwTransport::new_server(lines, tokio::io::sink()).with_max_line_length(200);
        let input = input.as_bytes().to_vec();
        let writer = tokio::spawn(async move {
            for part in input.chunks(piece) {
                client.write_all(part).await.unwrap();
            }
        });
        let mut out = Vec::new();
        while let Some(message) = receive(&mut transport, &lane).await {
            out.push(match message {
                JsonRpcMessage::Request(request) => {
                    let kind = match &request.request {
                        ClientRequest::CallToolRequest(call) => format!("call {}", call.params.name),
                        other => other.method().to_owned(),
                    };
                    format!("{kind} #{}", request.id)
                }
                JsonRpcMessage::Notification(notification) => match notification.notification {
                    ClientNotification::InitializedNotification(_) => "initialized".to_owned(),
                    other => format!("{other:?}"),
                },
                other => format!("{other:?}"),
            });
        }
        writer.await.unwrap();
        assert!(lane.take().is_none(), "nothing is left in the lane");
        out
    }

    #[tokio::test]
    async fn calls_and_other_messages_arrive_in_the_order_sent() {
        let call = |id: u32, name: &str| {
            format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"{name}\"}}}}\n"
            )
        };
        let input = [
            "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n".to_owned(),
            call(1, "a"),
            call(2, "b"),
            "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/list\"}\n".to_owned(),
            // Left to rmcp: a member the fast decoding does not know.
            "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"tools/call\",\"params\":{\"name\":\"c\"},\"x\":1}\n"
                .to_owned(),
            call(5, "d"),
            "not json, which rmcp passes over\n".to_owned(),
            format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"tools/call\",\"params\":{{\"name\":\"{}\"}}}}\n",
                "x".repeat(300)
            ),
            call(7, "e"),
        ]
        .concat();
        let expected = [
            "initialized",
            "call a #1",
            "call b #2",
            "tools/list #3",
            "call c #4",
            "call d #5",
            // The line past the cap, replaced by a request naming it.
            "keel/message-too-large #6",
            "call e #7",
        ];
        for piece in [1, 7, 64, input.len()] {
            assert_eq!(received(&input, piece).await, expected, "written {piece} bytes at a time");
        }
    }

    #[tokio::test]
    async fn a_receive_cancelled_mid_line_loses_nothing() {
        let (mut client, server) = tokio::io::duplex(256);
        let lane = CallLane::default();
        let lines = BoundedLines::new(server, 1 << 10).decoding_calls(lane.clone());
        let mut transport = AsyncRwTransport::new_server(lines, tokio::io::sink());
        let line =
            "{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\"}}\n";
        let (first, rest) = line.split_at(30);
        client.write_all(first.as_bytes()).await.unwrap();
        let waited =
            tokio::time::timeout(std::time::Duration::from_millis(20), receive(&mut transport, &lane)).await;
        assert!(waited.is_err(), "half a line is no message");
        client.write_all(rest.as_bytes()).await.unwrap();
        drop(client);
        let message = receive(&mut transport, &lane).await.expect("the call, once whole");
        assert_eq!(
            serde_json::to_string(&message).unwrap(),
            serde_json::to_string(&rmcp_decodes(line)).unwrap()
        );
        assert!(receive(&mut transport, &lane).await.is_none(), "then the end");
    }
}
