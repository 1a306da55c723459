//! The arrival order of `tools/call` requests, taken where it is known.
//!
//! rmcp hands each request to the server on a task of its own, and tasks
//! start in no particular order; only the transport sees requests in the
//! order the client sent them. So the transport gives each `tools/call` its
//! place in the host's [`CallStream`] as it is read, an [`Arrival`] in the
//! request's extensions, and the handler takes it from there. A request rmcp
//! refuses before it reaches the handler drops its arrival, which withdraws
//! it.
//!
//! [`Arrival`]: keel_host::Arrival

use std::borrow::Cow;

use rmcp::RoleServer;
use rmcp::model::{ClientRequest, JsonRpcMessage, JsonRpcRequest};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;

use keel_host::Arrival;

use super::fast_calls::{self, CallLane};
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
}

impl<T> Arrivals<T> {
    /// Stamp the requests `inner` reads, and the calls decoded beneath it
    /// into `lane` ([`fast_calls`]), with arrivals in the stream of the pool
    /// `shelf` holds as each is read.
    pub fn new(inner: T, shelf: Shelf, lane: CallLane) -> Self {
        Arrivals { inner, shelf, lane }
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
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        // Cancel-safe as the inner `receive` is: the arrival is taken only
        // once a whole message was read.
        let mut message = fast_calls::receive(&mut self.inner, &self.lane).await?;
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
