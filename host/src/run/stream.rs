//! Calls that arrive one at a time, such as an MCP server's `tools/call`
//! requests, run by the rules of a batch.
//!
//! See [`CallStream`].

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::FutureExt as _;

use serde_json::Value;
use tokio::sync::oneshot;

use crate::batch::{ToolResult, ToolUse};
use crate::events::Event;
use crate::limits::BatchFuel;
use crate::pool::ToolPool;
use crate::run::call::{self, NOT_STARTED, PLANNING_PANICKED};
use crate::run::context::Refused;
use crate::run::interrupt::Interrupt;
use crate::run::partition::Admission;
use crate::run::scheduler::{self, Events, Ran, RunOptions};

/// Where calls arriving one by one are admitted. Made by
/// [`Host::stream`](crate::Host::stream); clones share the stream.
///
/// Every call takes its [`Arrival`] the moment it arrives, so arrivals are
/// in arrival order, and the stream is a batch that never ends: a call is
/// planned as a batch plans its calls, at most a planning window ahead of
/// the oldest call not yet started; it starts by the partition rule
/// (`Admission`) in arrival order, so a stream of safe calls never starves
/// an unsafe one and an unsafe call never jumps ahead of the safe calls
/// before it; it runs as a batch runs each call, with the same cap; and its
/// result is held to the budgets as a message of its own. Context modifiers
/// apply as in a batch: a call that ran alone changes the context at once;
/// the modifiers of a concurrent run are applied in arrival order when the
/// run ends, which for a stream is when its last call finished.
///
/// A call whose planning fails (an unknown tool, an input the schema
/// refuses) answers at once: it has nothing to run, so it takes no turn.
#[derive(Clone)]
pub struct CallStream {
    shared: Arc<Shared>,
}

struct Shared {
    pool: Arc<ToolPool>,
    options: Arc<RunOptions>,
    /// Calls planned ahead of the first not yet started, as in a batch.
    window: usize,
    state: Mutex<State>,
}

struct State {
    next_number: u64,
    /// Calls not yet started, oldest first.
    waiting: VecDeque<Waiter>,
    admission: Admission,
    /// On a stream put in another's place ([`CallStream::following`]), until
    /// every call of that one has ended: no call here starts before then,
    /// and the context then carries on from where that one left it.
    after: Option<Arc<Handoff>>,
    /// On a stream another was put in place of: told when its last call has
    /// ended, and from then on where calls still arriving here go.
    then: Option<Arc<Handoff>>,
    /// Whether this stream has handed on to the one in its place.
    handed_on: bool,
}

/// Where a stream that was replaced hands on to the stream in its place.
struct Handoff {
    /// The context the replaced stream left, once its last call ended.
    left: Mutex<Option<Value>>,
    /// The stream in its place.
    next: Arc<Shared>,
}

struct Waiter {
    number: u64,
    step: Step,
}

enum Step {
    /// Arrived, not yet allowed to plan: a whole window of calls waits
    /// ahead of it.
    Queued(Option<oneshot::Sender<()>>),
    /// Being planned.
    Planning,
    /// Planned under `context`, waiting for its turn.
    Planned { safe: bool, context: Arc<Value>, turn: oneshot::Sender<Go> },
    /// Being planned again: its turn came under another context.
    Replanning,
}

/// What a planned call is told when it comes to the front.
enum Go {
    /// It starts now.
    Turn(Turn),
    /// Its turn comes under this context, not the one it was planned under:
    /// it is planned again under this one first.
    Replan(Arc<Value>),
}

impl CallStream {
    pub(crate) fn new(pool: Arc<ToolPool>, options: Arc<RunOptions>, context: Value) -> Self {
        let window = scheduler::planning_window(options.cap);
        let admission = Admission::new(options.cap, context, options.max_context);
        let state = State {
            next_number: 0,
            waiting: VecDeque::new(),
            admission,
            after: None,
            then: None,
            handed_on: false,
        };
        CallStream { shared: Arc::new(Shared { pool, options, window, state: Mutex::new(state) }) }
    }

    /// A stream of `pool` in the place of `previous` (a pool reloaded):
    /// calls arriving here are planned at once, but none starts before every
    /// call that arrived in `previous` has ended, so the order of arrival
    /// holds across the two; the context then carries on from where
    /// `previous` left it, modifiers of its last calls included. A call
    /// that arrives in `previous` after it has handed on arrives here.
    pub(crate) fn following(
        pool: Arc<ToolPool>,
        options: Arc<RunOptions>,
        previous: &CallStream,
    ) -> CallStream {
        let stream = CallStream::new(pool, options, previous.context());
        let handoff = Arc::new(Handoff { left: Mutex::new(None), next: stream.shared.clone() });
        stream.shared.lock().after = Some(handoff.clone());
        let mut state = previous.shared.lock();
        if state.handed_on {
            // Replaced before: its successor is the one to follow. Not
            // reached through the server, which replaces the current one.
            drop(state);
            return stream;
        }
        state.then = Some(handoff);
        previous.shared.pump(&mut state);
        drop(state);
        stream
    }

    /// A place in the arrival order for a call arriving now. Dropping every
    /// clone of it before the call starts withdraws the call.
    pub fn arrive(&self) -> Arrival {
        let mut state = self.shared.lock();
        if state.handed_on
            && let Some(next) = state.then.as_ref().map(|handoff| handoff.next.clone())
        {
            drop(state);
            return CallStream { shared: next }.arrive();
        }
        let number = state.next_number;
        state.next_number += 1;
        let step = if state.waiting.len() < self.shared.window { Step::Planning } else { Step::Queued(None) };
        state.waiting.push_back(Waiter { number, step });
        Arrival(Arc::new(Place { stream: self.shared.clone(), number, taken: AtomicBool::new(false) }))
    }

    /// The shared context as it is now: every modifier of a call that ran
    /// alone, and of every run that ended, applied.
    pub fn context(&self) -> Value {
        Value::clone(self.shared.lock().admission.context())
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every change to the state is made whole under the lock; a panic
        // elsewhere cannot leave it half-changed.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Start the oldest planned calls for as long as the rule lets them (a
    /// call whose turn comes under another context than it was planned
    /// under is sent back to plan again, and the calls behind it wait), then
    /// allow the queued calls now within the window to plan.
    fn pump(self: &Arc<Self>, state: &mut State) {
        if let Some(handoff) = state.after.take() {
            let left = handoff.left.lock().unwrap_or_else(PoisonError::into_inner).take();
            match left {
                Some(context) => state.admission.carry_on(context),
                None => state.after = Some(handoff),
            }
        }
        while let Some(Waiter { step: Step::Planned { safe, context: planned, .. }, .. }) =
            state.waiting.front().filter(|_| state.after.is_none())
        {
            let safe = *safe;
            let Some(context) = state.admission.ready(safe) else { break };
            if !call::same_context(planned, &context) {
                let front = state.waiting.front_mut().expect("the front was just seen");
                let Step::Planned { turn, .. } = std::mem::replace(&mut front.step, Step::Replanning) else {
                    unreachable!("the front was seen planned")
                };
                // A caller gone meanwhile withdraws itself.
                let _ = turn.send(Go::Replan(context));
                break;
            }
            let context = state.admission.start(safe).expect("the call was just seen ready");
            let waiter = state.waiting.pop_front().expect("the front was just seen");
            let Step::Planned { turn, .. } = waiter.step else { unreachable!("the front was seen planned") };
            let started = Turn { stream: self.clone(), number: waiter.number, context, armed: true };
            // A caller that stopped waiting left its receiver behind; its
            // turn comes back and is given up at once, under this lock.
            if let Err(Go::Turn(mut started)) = turn.send(Go::Turn(started)) {
                started.armed = false;
                state.leave();
            }
        }
        for waiter in state.waiting.iter_mut().take(self.window) {
            if let Step::Queued(wake) = &mut waiter.step {
                if let Some(wake) = wake.take() {
                    // A caller gone meanwhile withdraws itself.
                    let _ = wake.send(());
                }
                waiter.step = Step::Planning;
            }
        }
        if !state.handed_on
            && state.after.is_none()
            && state.waiting.is_empty()
            && state.admission.is_idle()
            && let Some(handoff) = &state.then
        {
            // Every call that arrived here has ended: the stream in this
            // one's place starts from the context they left.
            state.handed_on = true;
            *handoff.left.lock().unwrap_or_else(PoisonError::into_inner) =
                Some(Value::clone(state.admission.context()));
            let next = handoff.next.clone();
            let mut next_state = next.lock();
            next.pump(&mut next_state);
        }
    }
}

impl State {
    fn waiter(&mut self, number: u64) -> Option<&mut Waiter> {
        self.waiting.iter_mut().find(|waiter| waiter.number == number)
    }

    /// A call that ran finished; its modifier, if any, was accepted as it
    /// ended ([`Turn::accept`]).
    fn leave(&mut self) {
        self.admission.finish();
        if self.admission.is_idle() {
            self.admission.close_run();
        }
    }
}

/// Where the events of a call arriving on its own go
/// ([`Arrival::run`]), and which of them.
#[derive(Clone)]
pub struct EventSink(Events);

impl EventSink {
    /// Every event of the call, as it happens: its start (the tool is asked
    /// for its activity), what it reports, its end and its result.
    pub fn every(sink: std::sync::Arc<dyn Fn(Event) + Send + Sync>) -> Self {
        EventSink(Events::Sink(sink))
    }

    /// Only what the running tool reports ([`Event::is_report`]), and each
    /// call's `call_started` (without its activity: the tool is not asked
    /// for it) and `call_finished` with its figures; no `tool_result` is
    /// built. What a server that forwards progress to its client, or counts
    /// its calls, needs.
    pub fn lean(sink: std::sync::Arc<dyn Fn(Event) + Send + Sync>) -> Self {
        EventSink(Events::Lean(sink))
    }
}

/// A call's place in the arrival order; see [`CallStream::arrive`]. Clones
/// share the place.
#[derive(Clone)]
pub struct Arrival(Arc<Place>);

struct Place {
    stream: Arc<Shared>,
    number: u64,
    /// Whether a call was run from this place: a place holds one call.
    taken: AtomicBool,
}

impl Arrival {
    /// The place's number: its position in the arrival order, from 0.
    pub fn number(&self) -> u64 {
        self.0.number
    }

    /// Run `tool_use` from its arrival to its result, the way a batch runs
    /// each call: planned (within the window), then at its turn the tool's
    /// own checks, the host's permission rules, the call in a fresh sandbox
    /// and the result budgets, with the result as a message of its own.
    /// The call's batch fuel allowance is its own. `events`, when given,
    /// gets `call_started`, each `progress` the moment the tool reports it,
    /// `call_finished` with the call's figures and `tool_result`, or the
    /// lean part of them ([`EventSink::lean`]); unless it gets them all, the
    /// tool is not asked for its activity.
    ///
    /// An interrupt before the call starts means it never starts; while it
    /// runs, it stops a call whose tool's interrupt behaviour is `cancel`,
    /// and a `block` call runs to its end. Dropping the future gives the
    /// call's place or turn up.
    ///
    /// An arrival holds one call: a second `run` of it, or of a clone, is
    /// answered with an error and runs nothing.
    pub async fn run(
        self,
        tool_use: ToolUse,
        events: Option<EventSink>,
        interrupt: &Interrupt,
    ) -> ToolResult {
        let events = events.map_or(Events::Nobody, |sink| sink.0);
        if self.0.taken.swap(true, Ordering::Relaxed) {
            let message = "the host ran this call from an arrival that had already run one";
            return finished(&events, ToolResult::error(&tool_use.id, message));
        }
        let not_started = || ToolResult::error(&tool_use.id, NOT_STARTED);
        let stream = self.0.stream.clone();
        // However this ends before the call starts (a failed plan, an
        // interrupt, the future dropped), its place is given up, even while
        // another clone of the arrival lives on.
        let place = Withdraw(&self.0);
        let queued = {
            let mut state = stream.lock();
            let waiter = state.waiter(self.0.number).expect("a place is in the queue until its call runs");
            match &mut waiter.step {
                Step::Queued(wake) => {
                    let (sender, receiver) = oneshot::channel();
                    *wake = Some(sender);
                    Some(receiver)
                }
                Step::Planning => None,
                Step::Planned { .. } | Step::Replanning => unreachable!("a place is planned by its one call"),
            }
        };
        if let Some(queued) = queued {
            tokio::select! {
                biased;
                () = interrupt.interrupted() => return finished(&events, not_started()),
                woken = queued => woken.expect("a queued call is allowed to plan or withdrawn, never dropped"),
            }
        }

        let fuel = stream.options.batch_fuel.map(BatchFuel::new);
        let context = stream.lock().admission.context().clone();
        let (pool, max_input) = (&stream.pool, stream.options.max_input);
        let figures = events.reads_reports();
        let planning = call::prepare(pool, &tool_use, &context, fuel.as_ref(), max_input, figures);
        // A panic in the host still gives the call its one result, as in a
        // batch, and the request its answer.
        let mut planned = match AssertUnwindSafe(planning).catch_unwind().await {
            Ok(Ok(planned)) => planned,
            // Nothing to run: the place is given up.
            Ok(Err(result)) => return finished(&events, result),
            Err(_) => return finished(&events, ToolResult::error(&tool_use.id, PLANNING_PANICKED)),
        };
        let mut context = context;
        let turn = loop {
            let (sender, receiver) = oneshot::channel();
            {
                let mut state = stream.lock();
                let waiter =
                    state.waiter(self.0.number).expect("a place is in the queue until its call runs");
                let safe = planned.concurrency_safe;
                waiter.step = Step::Planned { safe, context: context.clone(), turn: sender };
                stream.pump(&mut state);
            }
            let go = tokio::select! {
                biased;
                go = receiver => go.expect("a planned call is started or withdrawn, never dropped"),
                () = interrupt.interrupted() => return finished(&events, not_started()),
            };
            match go {
                Go::Turn(turn) => break turn,
                Go::Replan(now) => {
                    let replanning = planned.replan(now.clone());
                    if AssertUnwindSafe(replanning).catch_unwind().await.is_err() {
                        return finished(&events, ToolResult::error(&tool_use.id, PLANNING_PANICKED));
                    }
                    context = now;
                }
            }
        };
        // Started: nothing left to withdraw.
        std::mem::forget(place);

        let running = scheduler::run_call(
            &stream.pool,
            Ok(planned),
            turn.context.clone(),
            |patch| turn.accept(patch),
            &stream.options.budget,
            &events,
            interrupt,
        );
        let ran = AssertUnwindSafe(running).catch_unwind().await;
        let Ran { result, threshold } = ran.unwrap_or_else(|_| Ran::panicked(&tool_use.id));
        turn.finish();
        let mut results = [result];
        stream.options.per_message(&mut results, &[threshold]).await;
        let [result] = results;
        finished(&events, result)
    }
}

/// Send `result`'s `tool_result` event, and hand it back.
fn finished(events: &Events, result: ToolResult) -> ToolResult {
    scheduler::emit(events, Event::tool_result(&result));
    result
}

impl Place {
    /// Leave the queue, if still in it, and let the calls behind go on.
    fn withdraw(&self) {
        let mut state = self.stream.lock();
        if let Some(at) = state.waiting.iter().position(|waiter| waiter.number == self.number) {
            state.waiting.remove(at);
            self.stream.pump(&mut state);
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.withdraw();
    }
}

/// Withdraws its place when dropped; a no-op once the call started.
struct Withdraw<'a>(&'a Place);

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        self.0.withdraw();
    }
}

/// A call's turn to run, with the context it sees. [`Turn::accept`] takes
/// the call's modifier as it ends; [`Turn::finish`], or dropping it, gives
/// the turn back.
struct Turn {
    stream: Arc<Shared>,
    number: u64,
    context: Arc<Value>,
    armed: bool,
}

impl Turn {
    /// The call returned `modifier`: see [`Admission::accept`].
    fn accept(&self, modifier: Value) -> Result<(), Refused> {
        self.stream.lock().admission.accept(self.number, modifier)
    }

    fn finish(mut self) {
        self.release();
    }

    fn release(&mut self) {
        if !std::mem::replace(&mut self.armed, false) {
            return;
        }
        let mut state = self.stream.lock();
        state.leave();
        self.stream.pump(&mut state);
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.release();
    }
}
