//! Admission of calls that arrive one by one: the partition of a batch
//! (DESIGN.md §3), kept over an open-ended stream of requests.
//!
//! Every call takes a [`Ticket`] the moment it arrives, so tickets are in
//! arrival order. Once planned, it asks to be admitted as [`Mode::Shared`]
//! (concurrency-safe) or [`Mode::Exclusive`] (anything else). Admission is
//! first come, first served: the oldest waiting ticket goes first, and no
//! later ticket passes it, so a stream of safe calls never starves an unsafe
//! one and an unsafe call never jumps ahead of the safe calls before it.
//! Shared calls run beside each other, at most `cap` at once; an exclusive
//! call runs alone. A call still being planned holds back every later one,
//! as a batch's plan comes before its run.
//!
//! The gate also keeps the shared context, as a batch does: an exclusive
//! call's context modifier applies when it finishes, so the next call sees
//! it; the modifiers of shared calls are queued and applied in arrival order
//! once no shared call is running, so the context does not depend on which
//! one finished first.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::oneshot;

/// How a call runs beside others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Beside other shared calls, up to the cap: a concurrency-safe call.
    Shared,
    /// Alone.
    Exclusive,
}

impl Mode {
    /// The mode of a call that is concurrency-safe or not.
    pub fn of(concurrency_safe: bool) -> Self {
        if concurrency_safe { Mode::Shared } else { Mode::Exclusive }
    }
}

/// Admits calls in arrival order under the partition rules; see the
/// [module docs](self).
#[derive(Clone)]
pub struct Gate {
    inner: Arc<Inner>,
}

struct Inner {
    cap: usize,
    state: Mutex<State>,
}

struct State {
    next_ticket: u64,
    /// Tickets not yet admitted, oldest first.
    waiting: VecDeque<Waiter>,
    shared: usize,
    exclusive: bool,
    context: Value,
    /// Modifiers of shared calls, by ticket, until no shared call runs.
    queued: BTreeMap<u64, Value>,
}

struct Waiter {
    ticket: u64,
    /// `None` while the call is being planned.
    wants: Option<(Mode, oneshot::Sender<Slot>)>,
}

impl Gate {
    /// A gate admitting at most `cap` shared calls at once (at least one),
    /// starting from `context`.
    pub fn new(cap: usize, context: Value) -> Self {
        let state = State {
            next_ticket: 0,
            waiting: VecDeque::new(),
            shared: 0,
            exclusive: false,
            context,
            queued: BTreeMap::new(),
        };
        Gate { inner: Arc::new(Inner { cap: cap.max(1), state: Mutex::new(state) }) }
    }

    /// A ticket for a call arriving now. Dropping it before admission
    /// withdraws the call.
    pub fn arrive(&self) -> Ticket {
        let mut state = self.inner.lock();
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.waiting.push_back(Waiter { ticket, wants: None });
        Ticket(Arc::new(TicketInner { gate: self.inner.clone(), number: ticket }))
    }

    /// The context as it is now.
    #[cfg(test)]
    pub fn context(&self) -> Value {
        self.inner.lock().context.clone()
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is left consistent at every unlock; a panic elsewhere
        // while holding it cannot break it.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Admit waiting calls, oldest first, for as long as the oldest fits.
    fn admit(self: &Arc<Self>, state: &mut State) {
        while let Some(Waiter { wants: Some((mode, _)), .. }) = state.waiting.front() {
            let fits = match mode {
                Mode::Shared => !state.exclusive && state.shared < self.cap,
                Mode::Exclusive => !state.exclusive && state.shared == 0,
            };
            if !fits {
                return;
            }
            let waiter = state.waiting.pop_front().expect("the front was just seen");
            let (mode, sender) = waiter.wants.expect("the front wants admission");
            state.enter(mode);
            let slot = Slot {
                gate: self.clone(),
                ticket: waiter.ticket,
                mode,
                context: state.context.clone(),
                armed: true,
            };
            // A caller that stopped waiting left its receiver behind; the
            // slot comes back and is given up at once, under this lock.
            if let Err(mut slot) = sender.send(slot) {
                slot.armed = false;
                state.leave(slot.ticket, mode, None);
            }
        }
    }
}

impl State {
    fn enter(&mut self, mode: Mode) {
        match mode {
            Mode::Shared => self.shared += 1,
            Mode::Exclusive => self.exclusive = true,
        }
    }

    fn leave(&mut self, ticket: u64, mode: Mode, modifier: Option<Value>) {
        match mode {
            Mode::Exclusive => {
                self.exclusive = false;
                if let Some(patch) = modifier {
                    keel_host::context::apply(&mut self.context, &patch);
                }
            }
            Mode::Shared => {
                self.shared -= 1;
                if let Some(patch) = modifier {
                    self.queued.insert(ticket, patch);
                }
                if self.shared == 0 {
                    for patch in std::mem::take(&mut self.queued).into_values() {
                        keel_host::context::apply(&mut self.context, &patch);
                    }
                }
            }
        }
    }
}

/// A call's place in the arrival order. Clones share the place; when the
/// last is dropped before admission, the call is withdrawn.
#[derive(Clone)]
pub struct Ticket(Arc<TicketInner>);

struct TicketInner {
    gate: Arc<Inner>,
    number: u64,
}

impl Ticket {
    /// The ticket's number: its position in the arrival order, from 0.
    pub fn number(&self) -> u64 {
        self.0.number
    }

    /// Wait for the call's turn to run as `mode`. The slot must be held
    /// while the call runs.
    pub async fn admit(self, mode: Mode) -> Slot {
        let (sender, receiver) = oneshot::channel();
        {
            let gate = &self.0.gate;
            let mut state = gate.lock();
            let waiter = state
                .waiting
                .iter_mut()
                .find(|waiter| waiter.ticket == self.0.number)
                .expect("a ticket waits until it is admitted");
            assert!(waiter.wants.is_none(), "a ticket is admitted once");
            waiter.wants = Some((mode, sender));
            gate.admit(&mut state);
        }
        // While this future lives the ticket lives, so its waiter leaves the
        // queue only by being sent its slot.
        let slot = receiver.await.expect("a waiting ticket is admitted or withdrawn, never dropped");
        drop(self);
        slot
    }
}

impl Drop for TicketInner {
    fn drop(&mut self) {
        let mut state = self.gate.lock();
        if let Some(at) = state.waiting.iter().position(|waiter| waiter.ticket == self.number) {
            state.waiting.remove(at);
            self.gate.admit(&mut state);
        }
    }
}

/// A call's turn to run. [`Slot::finish`] gives it back with the call's
/// context modifier; dropping it gives it back without one.
pub struct Slot {
    gate: Arc<Inner>,
    ticket: u64,
    mode: Mode,
    context: Value,
    armed: bool,
}

impl Slot {
    /// The context the call runs with: as it was when the call was admitted.
    pub fn context(&self) -> &Value {
        &self.context
    }

    /// The call finished: apply its modifier (see the [module docs](self))
    /// and let the next calls in.
    pub fn finish(mut self, modifier: Option<Value>) {
        self.release(modifier);
    }

    fn release(&mut self, modifier: Option<Value>) {
        if !std::mem::replace(&mut self.armed, false) {
            return;
        }
        let mut state = self.gate.lock();
        state.leave(self.ticket, self.mode, modifier);
        self.gate.admit(&mut state);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.release(None);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::FutureExt;
    use serde_json::json;

    use super::*;

    /// Whether `future` is ready without waiting.
    fn now<F: std::future::Future>(future: F) -> Option<F::Output> {
        future.now_or_never()
    }

    /// Admission of `ticket` as `mode`, polled once: ready or still waiting.
    fn admit(ticket: &Ticket, mode: Mode) -> tokio::task::JoinHandle<Slot> {
        tokio::spawn(ticket.clone().admit(mode))
    }

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    #[tokio::test]
    async fn shared_calls_overlap_up_to_the_cap() {
        let gate = Gate::new(2, json!({}));
        let tickets: Vec<Ticket> = (0..3).map(|_| gate.arrive()).collect();
        let a = now(tickets[0].clone().admit(Mode::Shared)).expect("the first shared call goes at once");
        let b = now(tickets[1].clone().admit(Mode::Shared)).expect("the second fits under the cap");
        let third = admit(&tickets[2], Mode::Shared);
        settle().await;
        assert!(!third.is_finished(), "a third would pass the cap of 2");
        drop(a);
        let c = third.await.unwrap();
        drop((b, c));
    }

    #[tokio::test]
    async fn an_exclusive_call_waits_for_those_before_and_holds_back_those_after() {
        let gate = Gate::new(10, json!({}));
        let (first, writer, last) = (gate.arrive(), gate.arrive(), gate.arrive());
        let first = now(first.admit(Mode::Shared)).unwrap();
        let writer = admit(&writer, Mode::Exclusive);
        let last = admit(&last, Mode::Shared);
        settle().await;
        assert!(!writer.is_finished(), "the exclusive call waits for the shared one before it");
        assert!(!last.is_finished(), "a later shared call does not pass the waiting exclusive one");
        drop(first);
        let writer = writer.await.unwrap();
        settle().await;
        assert!(!last.is_finished(), "nothing runs beside an exclusive call");
        drop(writer);
        drop(last.await.unwrap());
    }

    #[tokio::test]
    async fn a_call_still_being_planned_holds_back_later_arrivals_until_withdrawn() {
        let gate = Gate::new(10, json!({}));
        let (planning, later) = (gate.arrive(), gate.arrive());
        let later = admit(&later, Mode::Shared);
        settle().await;
        assert!(!later.is_finished(), "arrival order holds while the earlier call is planned");
        drop(planning);
        drop(later.await.unwrap());
    }

    #[tokio::test]
    async fn a_caller_that_stops_waiting_gives_its_place_up() {
        let gate = Gate::new(10, json!({}));
        let (writer, gone, next) = (gate.arrive(), gate.arrive(), gate.arrive());
        let writer = now(writer.admit(Mode::Exclusive)).unwrap();
        let gone = admit(&gone, Mode::Exclusive);
        let next = admit(&next, Mode::Exclusive);
        settle().await;
        gone.abort();
        assert!(matches!(gone.await, Err(error) if error.is_cancelled()));
        drop(writer);
        drop(next.await.unwrap());
        assert!(now(gate.arrive().admit(Mode::Exclusive)).is_some(), "no slot was left taken");
    }

    #[tokio::test]
    async fn modifiers_apply_at_once_when_exclusive_and_in_arrival_order_after_shared_runs() {
        let gate = Gate::new(10, json!({ "cwd": "/workspace" }));
        let writer = now(gate.arrive().admit(Mode::Exclusive)).unwrap();
        writer.finish(Some(json!({ "cwd": "/workspace/src" })));
        let (a, b) = (gate.arrive(), gate.arrive());
        let a = now(a.admit(Mode::Shared)).unwrap();
        let b = now(b.admit(Mode::Shared)).unwrap();
        assert_eq!(a.context(), &json!({ "cwd": "/workspace/src" }), "the exclusive change is seen at once");
        b.finish(Some(json!({ "last": "b" })));
        assert_eq!(gate.context(), json!({ "cwd": "/workspace/src" }), "queued while a shared call runs");
        a.finish(Some(json!({ "last": "a" })));
        assert_eq!(
            gate.context(),
            json!({ "cwd": "/workspace/src", "last": "b" }),
            "applied in arrival order: b arrived last, so its change wins"
        );
    }
}
