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
//! closed, it takes no further request: none could be answered. While more
//! than [`MAX_UNWRITTEN`] messages wait to be written, it reads no further
//! request: a client that does not read its replies stalls itself, rather
//! than the server holding every reply it cannot write.
//!
//! It keeps the ids of the requests not yet answered, and answers a request
//! that reuses one itself, with an error: rmcp keeps one responder per id, so
//! the two would share one reply and the client would wait for the other for
//! ever, while the request ran all the same. A cancelled request keeps its id
//! until its handler has finished: the transport, not rmcp, takes the
//! `notifications/cancelled` ([`Stamped::cancelled`]), and drops the reply the
//! handler gives, which rmcp, matching replies by id alone, would otherwise
//! give a later request of the same id.
//!
//! At the end of its input, or once the server is stopping, it reads no
//! more, and ends the session only once every request it read is answered,
//! so that none is left to rmcp's bounded drain. A stop interrupts the calls
//! in flight (the server's `stopping` token); at the end of the input they
//! run to their ends, each within its deadline, as a client that writes its
//! requests and closes its input (`keel serve < requests`) still reads
//! their replies. A request the server sent the client (an approval
//! question) and the client has not answered by then, or one sent after,
//! can be answered no more: it is answered here, with an error saying the
//! input ended, so that the call waiting on it goes on, denied.
//!
//! [`Arrival`]: keel_host::Arrival

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::future::Ready;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use futures::future::Either;
use rmcp::RoleServer;
use rmcp::model::{
    ClientNotification, ClientRequest, ErrorCode, ErrorData, JsonRpcMessage, JsonRpcNotification,
    JsonRpcRequest, RequestId, ServerNotification,
};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use keel_host::Arrival;

use super::fast_calls::{self, CallLane};
use super::unreadable;
use super::{Live, Shelf};

/// How many messages (replies, notifications) may wait to be written
/// before no further request is read.
pub const MAX_UNWRITTEN: usize = 256;

/// A `tools/call`'s place: its arrival, in the stream of the pool served
/// when it was read, and its cancellation.
#[derive(Clone)]
pub struct Stamped {
    /// The pool it runs in.
    pub live: std::sync::Arc<Live>,
    /// Its place in that pool's stream.
    pub arrival: Arrival,
    /// Cancelled when the client cancels the request.
    pub cancelled: CancellationToken,
}

/// A server transport that stamps each `tools/call` with its arrival.
pub struct Arrivals<T> {
    inner: T,
    shelf: Shelf,
    /// The calls decoded beneath `inner`.
    lane: CallLane,
    /// Set once a send found the client's end of the output closed.
    gone: Arc<AtomicBool>,
    /// The requests not yet answered, and the messages not yet written.
    ledger: Arc<Ledger>,
    /// The server's: cancelled when it stops (not by the end of the input,
    /// after which the calls in flight run to their ends).
    stopping: CancellationToken,
    /// Set once no further message is to be read: the input ended, or the
    /// server is stopping.
    ending: bool,
}

/// What an [`Arrivals`] keeps between its reads and its sends.
#[derive(Default)]
struct Ledger {
    /// The client's requests not yet answered, each with the token that
    /// cancels it. A cancelled request stays until its handler's reply.
    unanswered: Mutex<HashMap<RequestId, CancellationToken>>,
    /// Woken as the last request is answered.
    settled: Notify,
    /// Messages handed to the transport but not yet written.
    unwritten: AtomicUsize,
    /// Woken as one of them is written (or dropped).
    written: Notify,
    /// The server's requests to the client not yet answered or withdrawn.
    asked: Mutex<HashSet<RequestId>>,
    /// Woken as the server sends the client a request.
    asking: Notify,
}

impl Ledger {
    /// Note the reply to `id`: whether it is to be dropped, its request
    /// having been cancelled.
    fn answered(&self, id: &RequestId) -> bool {
        let mut unanswered = self.unanswered.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(cancelled) = unanswered.remove(id) else { return false };
        if unanswered.is_empty() {
            self.settled.notify_one();
        }
        cancelled.is_cancelled()
    }

    /// Once every request read is answered.
    async fn settled(&self) {
        loop {
            if self.unanswered.lock().unwrap_or_else(PoisonError::into_inner).is_empty() {
                return;
            }
            self.settled.notified().await;
        }
    }

    /// Note a message the server sends: a request to the client awaits its
    /// answer, a cancellation of one withdraws it.
    fn sending(&self, message: &TxJsonRpcMessage<RoleServer>) {
        match message {
            JsonRpcMessage::Request(request) => {
                self.asked.lock().unwrap_or_else(PoisonError::into_inner).insert(request.id.clone());
                self.asking.notify_one();
            }
            JsonRpcMessage::Notification(JsonRpcNotification {
                notification: ServerNotification::CancelledNotification(cancel),
                ..
            }) => {
                if let Some(id) = &cancel.params.request_id {
                    self.asked.lock().unwrap_or_else(PoisonError::into_inner).remove(id);
                }
            }
            _ => {}
        }
    }

    /// One of the server's requests not yet answered, no longer awaited.
    fn unanswered_ask(&self) -> Option<RequestId> {
        let mut asked = self.asked.lock().unwrap_or_else(PoisonError::into_inner);
        let id = asked.iter().next()?.clone();
        asked.remove(&id);
        Some(id)
    }

    /// Once at most [`MAX_UNWRITTEN`] messages wait to be written.
    async fn room(&self) {
        while self.unwritten.load(Ordering::Relaxed) >= MAX_UNWRITTEN {
            self.written.notified().await;
        }
    }
}

/// A message waiting to be written, counted in its [`Ledger`] until it is
/// written or dropped.
struct Unwritten(Arc<Ledger>);

impl Unwritten {
    fn new(ledger: &Arc<Ledger>) -> Self {
        ledger.unwritten.fetch_add(1, Ordering::Relaxed);
        Unwritten(ledger.clone())
    }
}

impl Drop for Unwritten {
    fn drop(&mut self) {
        self.0.unwritten.fetch_sub(1, Ordering::Relaxed);
        self.0.written.notify_one();
    }
}

impl<T> Arrivals<T> {
    /// Stamp the requests `inner` reads, and the calls decoded beneath it
    /// into `lane` ([`fast_calls`]), with arrivals in the stream of the pool
    /// `shelf` holds as each is read. At the end of the input, or once
    /// `stopping` is cancelled, the session ends when every request read is
    /// answered.
    pub fn new(inner: T, shelf: Shelf, lane: CallLane, stopping: CancellationToken) -> Self {
        Arrivals { inner, shelf, lane, gone: Arc::default(), ledger: Arc::default(), stopping, ending: false }
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
        self.ledger.sending(&item);
        if let JsonRpcMessage::Response(rmcp::model::JsonRpcResponse { id, .. })
        | JsonRpcMessage::Error(rmcp::model::JsonRpcError { id: Some(id), .. }) = &item
            && self.ledger.answered(id)
        {
            // MCP sends no response to a cancelled request.
            tracing::debug!(%id, "dropped the reply to a cancelled request");
            return Either::Left(std::future::ready(Ok(())));
        }
        if self.gone.load(Ordering::Relaxed) {
            return Either::Left(std::future::ready(Ok(())));
        }
        match eagerly(self.inner.send(item)) {
            Either::Left(sent) => Either::Left(std::future::ready(noted(&self.gone, sent.into_inner()))),
            Either::Right(sending) => {
                let gone = self.gone.clone();
                let unwritten = Unwritten::new(&self.ledger);
                Either::Right(async move {
                    let sent = noted(&gone, sending.await);
                    drop(unwritten);
                    sent
                })
            }
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        // Cancel-safe: the inner `receive` is, and a message is acted on
        // only once it was read whole.
        loop {
            // With nobody to read the replies, a request would run its tool
            // for nothing: the session ends as if the client had closed its
            // input.
            if self.gone.load(Ordering::Relaxed) {
                return None;
            }
            if self.ending || self.stopping.is_cancelled() {
                self.ending = true;
                // The client can answer no request now, whether the server
                // sent it before the end or after: each gets the answer of
                // a client that failed to give one.
                if let Some(id) = self.ledger.unanswered_ask() {
                    tracing::debug!(%id, "the input ended before the client answered the request");
                    let error = ErrorData::new(ErrorCode::INTERNAL_ERROR, "its input ended", None);
                    return Some(JsonRpcMessage::error(error, Some(id)));
                }
                tokio::select! {
                    () = self.ledger.settled() => return None,
                    () = self.ledger.asking.notified() => continue,
                }
            }
            let (inner, lane, ledger) = (&mut self.inner, &self.lane, &self.ledger);
            let read = tokio::select! {
                () = self.stopping.cancelled() => continue,
                read = async {
                    ledger.room().await;
                    fast_calls::receive(inner, lane).await
                } => read,
            };
            let Some(message) = read else {
                tracing::debug!("the input ended: the calls in flight run to their ends and are answered");
                self.ending = true;
                continue;
            };
            if let Some(message) = self.admit(message).await {
                return Some(message);
            }
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

impl<T: Transport<RoleServer>> Arrivals<T> {
    /// `message`, just read, as rmcp is to have it: a request noted as
    /// unanswered (a `tools/call` stamped with its arrival), an answer to a
    /// request of the server's noted as given, or `None` when
    /// it was dealt with here: a request reusing an id in use, refused; the
    /// cancellation of a request not yet answered, which cancels it; the
    /// stand-in for a request whose id cannot be read, answered without one.
    async fn admit(
        &mut self,
        mut message: RxJsonRpcMessage<RoleServer>,
    ) -> Option<RxJsonRpcMessage<RoleServer>> {
        let cancelled = CancellationToken::new();
        match &message {
            JsonRpcMessage::Response(rmcp::model::JsonRpcResponse { id, .. })
            | JsonRpcMessage::Error(rmcp::model::JsonRpcError { id: Some(id), .. }) => {
                self.ledger.asked.lock().unwrap_or_else(PoisonError::into_inner).remove(id);
            }
            JsonRpcMessage::Request(JsonRpcRequest { id, .. }) => {
                let fresh = {
                    let mut unanswered =
                        self.ledger.unanswered.lock().unwrap_or_else(PoisonError::into_inner);
                    let fresh = !unanswered.contains_key(id);
                    if fresh {
                        unanswered.insert(id.clone(), cancelled.clone());
                    }
                    fresh
                };
                if !fresh {
                    self.refuse_reused(id.clone()).await;
                    return None;
                }
            }
            JsonRpcMessage::Notification(notification) => match &notification.notification {
                ClientNotification::CancelledNotification(cancel) => {
                    // rmcp would forget the request, and give its reply to
                    // the next request of its id: it is cancelled here.
                    if let Some(id) = &cancel.params.request_id
                        && let Some(token) =
                            self.ledger.unanswered.lock().unwrap_or_else(PoisonError::into_inner).get(id)
                    {
                        tracing::debug!(%id, reason = cancel.params.reason, "cancelled");
                        token.cancel();
                        return None;
                    }
                }
                ClientNotification::CustomNotification(custom)
                    if custom.method == unreadable::UNREADABLE_ID_METHOD =>
                {
                    let message = custom.params.as_ref().and_then(|params| params["message"].as_str());
                    let message = message.unwrap_or("the request's id cannot be read").to_owned();
                    self.answer_without_id(ErrorData::invalid_request(message, None)).await;
                    return None;
                }
                _ => {}
            },
            _ => {}
        }
        if let JsonRpcMessage::Request(JsonRpcRequest {
            request: ClientRequest::CallToolRequest(call), ..
        }) = &mut message
        {
            let live = self.shelf.current();
            let arrival = live.stream.arrive();
            call.extensions.insert(Stamped { live, arrival, cancelled });
        }
        Some(message)
    }

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
