//! The arrival order of `tools/call` requests, taken where it is known.
//!
//! rmcp hands each request to the server on a task of its own, and tasks
//! start in no particular order; only the transport sees requests in the
//! order the client sent them. So the transport gives each `tools/call` its
//! place in the host's [`CallStream`](keel_host::CallStream) as it is read, an [`Arrival`] in the
//! request's extensions, and the handler takes it from there. A request rmcp
//! refuses before it reaches the handler drops its arrival, which withdraws
//! it.
//!
//! It also writes each message it is given to send at once, where it can
//! ([`eagerly`]); and once a write finds the client's end of the output
//! closed, it takes no further request: none could be answered.
//!
//! And it answers a request that reuses the id of one not yet answered
//! itself, with an error: rmcp keeps one responder per id, so the two would
//! share one reply and the client would wait for the other for ever, while
//! the request ran all the same. And a request whose id cannot be read
//! (stood in for beneath it, [`unreadable`]), it answers with an error
//! without an id.
//!
//! [`Arrival`]: keel_host::Arrival

use std::borrow::Cow;
use std::collections::HashSet;
use std::future::Ready;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use futures::future::Either;
use rmcp::RoleServer;
use rmcp::model::{ClientNotification, ClientRequest, ErrorData, JsonRpcMessage, JsonRpcRequest, RequestId};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;

use keel_host::Arrival;

use super::fast_calls::{self, CallLane};
use super::unreadable;
use super::{Live, Shelf};

/// A `tools/call`'s place: its arrival, in the stream of the pool served
/// when it was read.
#[derive(Clone)]
pub struct Stamped {
    /// The pool it runs in.
    pub live: std::sync::Arc<Live>,
    /// Its place in that pool's stream.
    pub arrival: Arrival,
}

/// A server transport that stamps each `tools/call` with its arrival.
pub struct Arrivals<T> {
    inner: T,
    shelf: Shelf,
    /// The calls decoded beneath `inner`.
    lane: CallLane,
    /// Set once a send found the client's end of the output closed.
    gone: Arc<AtomicBool>,
    /// The ids of the client's requests not yet answered (nor cancelled).
    unanswered: Arc<Mutex<HashSet<RequestId>>>,
}

impl<T> Arrivals<T> {
    /// Stamp the requests `inner` reads, and the calls decoded beneath it
    /// into `lane` ([`fast_calls`]), with arrivals in the stream of the pool
    /// `shelf` holds as each is read.
    pub fn new(inner: T, shelf: Shelf, lane: CallLane) -> Self {
        Arrivals { inner, shelf, lane, gone: Arc::default(), unanswered: Arc::default() }
    }
}

impl<T: Transport<RoleServer>> Transport<RoleServer> for Arrivals<T> {
    type Error = T::Error;

    fn name() -> Cow<'static, str> {
        T::name()
    }

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        if let JsonRpcMessage::Response(rmcp::model::JsonRpcResponse { id, .. })
        | JsonRpcMessage::Error(rmcp::model::JsonRpcError { id: Some(id), .. }) = &item
        {
            self.unanswered.lock().unwrap_or_else(PoisonError::into_inner).remove(id);
        }
        if self.gone.load(Ordering::Relaxed) {
            return Either::Left(std::future::ready(Ok(())));
        }
        match eagerly(self.inner.send(item)) {
            Either::Left(sent) => Either::Left(std::future::ready(noted(&self.gone, sent.into_inner()))),
            Either::Right(sending) => {
                let gone = self.gone.clone();
                Either::Right(async move { noted(&gone, sending.await) })
            }
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        // With nobody to read the replies, a request would run its tool for
        // nothing: the session ends as if the client had closed its input.
        if self.gone.load(Ordering::Relaxed) {
            return None;
        }
        // Cancel-safe as the inner `receive` is: the arrival is taken only
        // once a whole message was read.
        let mut message = loop {
            let message = fast_calls::receive(&mut self.inner, &self.lane).await?;
            match &message {
                JsonRpcMessage::Request(JsonRpcRequest { id, .. }) => {
                    let fresh =
                        self.unanswered.lock().unwrap_or_else(PoisonError::into_inner).insert(id.clone());
                    if !fresh {
                        self.refuse_reused(id.clone()).await;
                        continue;
                    }
                }
                JsonRpcMessage::Notification(notification) => match &notification.notification {
                    ClientNotification::CancelledNotification(cancelled) => {
                        if let Some(id) = &cancelled.params.request_id {
                            self.unanswered.lock().unwrap_or_else(PoisonError::into_inner).remove(id);
                        }
                    }
                    ClientNotification::CustomNotification(custom)
                        if custom.method == unreadable::UNREADABLE_ID_METHOD =>
                    {
                        let message = custom.params.as_ref().and_then(|params| params["message"].as_str());
                        let message = message.unwrap_or("the request's id cannot be read").to_owned();
                        self.answer_without_id(ErrorData::invalid_request(message, None)).await;
                        continue;
                    }
                    _ => {}
                },
                _ => {}
            }
            break message;
        };
        if let JsonRpcMessage::Request(JsonRpcRequest {
            request: ClientRequest::CallToolRequest(call), ..
        }) = &mut message
        {
            let live = self.shelf.current();
            let arrival = live.stream.arrive();
            call.extensions.insert(Stamped { live, arrival });
        }
        Some(message)
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

impl<T: Transport<RoleServer>> Arrivals<T> {
    /// Answer a request that reuses `id`, the id of one not yet answered,
    /// with an error; the request itself never reaches rmcp.
    async fn refuse_reused(&mut self, id: RequestId) {
        let message = format!(
            "the id {} is that of a request not yet answered; each request in flight needs an id of its own",
            serde_json::to_string(&id).unwrap_or_default()
        );
        let error = JsonRpcMessage::error(ErrorData::invalid_request(message, None), Some(id));
        self.write_here(error, "a request that reused an id").await;
    }

    /// Send `error` with no id: the request it answers has none that can
    /// be read.
    async fn answer_without_id(&mut self, error: ErrorData) {
        self.write_here(JsonRpcMessage::error(error, None), "a request whose id cannot be read").await;
    }

    /// Write `message`, an answer the transport gives itself to `what`.
    async fn write_here(&mut self, message: TxJsonRpcMessage<RoleServer>, what: &str) {
        if !self.gone.load(Ordering::Relaxed) {
            let sent = self.inner.send(message).await;
            if let Err(error) = noted(&self.gone, sent) {
                tracing::debug!("failed to answer {what}: {error}");
            }
        }
    }
}

/// `sent`, with a reply nobody can read dropped: said once here, rather
/// than as an error of each reply still in flight.
fn noted<E: std::error::Error + 'static>(gone: &AtomicBool, sent: Result<(), E>) -> Result<(), E> {
    match sent {
        Err(error) if is_broken_pipe(&error) => {
            if !gone.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "the client closed its end of the output: replies are dropped, and no request is taken \
                     after this one"
                );
            }
            Ok(())
        }
        sent => sent,
    }
}

/// Whether a failed send says the client's end of the output is closed.
fn is_broken_pipe(error: &(impl std::error::Error + 'static)) -> bool {
    let error: &dyn std::error::Error = error;
    error.downcast_ref::<std::io::Error>().is_some_and(|error| error.kind() == std::io::ErrorKind::BrokenPipe)
}

/// `send`, begun at once: polled once before it is handed back, so that a
/// message the transport takes whole (a reply, to a pipe with room for it)
/// is written now. rmcp hands the future to a task of its own, which a
/// worker runs only after the service loop's turn ends, and often on the
/// other worker, woken for it: the reply would wait for both. What is left
/// of a send that could not finish is the future itself, polled on by that
/// task, which gives it a waker of its own then.
fn eagerly<F: Future>(send: F) -> Either<Ready<F::Output>, Pin<Box<F>>> {
    let mut send = Box::pin(send);
    match send.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => Either::Left(std::future::ready(output)),
        Poll::Pending => Either::Right(send),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rmcp::model::{CallToolResult, ContentBlock, RequestId, ServerResult};
    use rmcp::transport::async_rw::AsyncRwTransport;
    use tokio::io::{AsyncBufReadExt as _, BufReader, DuplexStream, ReadHalf, WriteHalf};

    use super::*;

    /// A reply of `text`, to request 1.
    fn reply(text: &str) -> TxJsonRpcMessage<RoleServer> {
        let result = CallToolResult::success(vec![ContentBlock::text(text)]);
        JsonRpcMessage::response(ServerResult::CallToolResult(result), RequestId::Number(1))
    }

    /// rmcp's server transport over a pipe with room for `room` bytes, and
    /// the pipe's other end, where the peer reads.
    fn server_over(
        room: usize,
    ) -> (DuplexStream, AsyncRwTransport<RoleServer, ReadHalf<DuplexStream>, WriteHalf<DuplexStream>>) {
        let (peer, ours) = tokio::io::duplex(room);
        let (read, write) = tokio::io::split(ours);
        (peer, AsyncRwTransport::new_server(read, write))
    }

    /// The one line the peer reads, as JSON.
    async fn line_read(peer: DuplexStream) -> serde_json::Value {
        let mut line = String::new();
        BufReader::new(peer).read_line(&mut line).await.expect("the peer reads a line");
        serde_json::from_str(&line).expect("the line is JSON")
    }

    #[tokio::test]
    async fn a_reply_the_pipe_has_room_for_is_written_before_anyone_awaits_it() {
        let (peer, mut transport) = server_over(64 << 10);
        let sent = eagerly(transport.send(reply("hello")));
        assert!(matches!(sent, Either::Left(_)), "the send finished at once");
        // Never polled, and gone: the reply was written all the same.
        drop(sent);
        let line = line_read(peer).await;
        assert_eq!(line["result"]["content"][0]["text"], "hello");
    }

    #[tokio::test]
    async fn a_reply_the_pipe_has_no_room_for_goes_out_once_the_peer_reads() {
        // Room for 16 bytes: the reply waits for the peer, and its first
        // poll left a waker that wakes nobody.
        let (peer, mut transport) = server_over(16);
        let text = "x".repeat(10_000);
        let sent = eagerly(transport.send(reply(&text)));
        let Either::Right(pending) = sent else {
            panic!("a send of 10 kB through 16 bytes finished at once")
        };
        let reader = tokio::spawn(line_read(peer));
        tokio::time::timeout(Duration::from_secs(10), pending)
            .await
            .expect("the send finishes once the peer reads")
            .expect("the send succeeds");
        let line = reader.await.expect("the reader does not panic");
        assert_eq!(line["result"]["content"][0]["text"], text.as_str());
    }
}
