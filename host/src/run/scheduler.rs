//! Running a batch (README, "How a batch runs"): plan every call, cut the
//! batch into runs of concurrency-safe calls and single unsafe calls, run
//! each run with at most `cap` calls in flight and each unsafe call alone,
//! and hand back exactly one result per `tool_use`, in order.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::mpsc;

use crate::batch::{ToolResult, ToolUse};
use crate::budget::ledger::Ledger;
use crate::budget::{Budget, Threshold};
use crate::events::Event;
use crate::events::figures::{Outcome, Step};
use crate::events::summary::{self, Summarizer, SummaryCall};
use crate::limits::BatchFuel;
use crate::pool::ToolPool;
use crate::run::call::{self, Finished, NOT_STARTED, PLANNING_PANICKED, Prepared, RUN_PANICKED, Steps};
use crate::run::context::{self, Bounded, Refused};
use crate::run::interrupt::Interrupt;
use crate::run::partition::{Admission, partition};
use crate::tool::CallContext;

/// The default concurrency cap, and what a non-numeric or zero setting means.
pub const DEFAULT_MAX_TOOL_USE_CONCURRENCY: usize = 10;

/// Calls planned ahead of the first call still waiting to start: twice the
/// cap, and at least this. A planned call holds a live sandbox until it
/// runs, so the window bounds them: enough to refill every slot of the cap,
/// few enough to stay warm in the caches (a window of 64 ran 1,000 safe calls
/// 15% slower than one of 16). A batch no longer than the window is planned
/// whole before its first call starts.
const MIN_PLANNING_WINDOW: usize = 16;

/// Calls one task plans together once a batch's first calls are planned:
/// claimed under one taking of the batch's lock, planned one after another,
/// and kept under one more. The window is refilled a chunk at a time, once a
/// chunk's worth of calls has started. A task per call took the lock twice
/// for every call and was spawned for every call, and on 2 workers the
/// batch's state then crossed between the cores at each turn (1,000 safe
/// calls on 2 workers ran 8% faster in chunks of 8: README, Performance).
/// The batch's first calls are each planned by a task of their own, so that
/// they start soonest, on every core.
const PLANNING_CHUNK: usize = 8;

/// How long planning one call of a chunk may take before it is kept at once,
/// not with the rest of its chunk: a tool whose `plan` runs in a sandbox of
/// its own takes longer than this, and a call ready to start then does not
/// wait for the chunk's other calls as well. A tool whose plan is fixed
/// plans a call in a microsecond or two.
const SLOW_PLAN: Duration = Duration::from_micros(10);

/// How long a task goes on with one call after another before it hands the
/// next to a task of its own and ends: see [`Batch::work`].
const HAND_OVER_AFTER: Duration = Duration::from_millis(1);

/// Calls planned ahead of the first not yet started, under `cap`: see
/// [`MIN_PLANNING_WINDOW`].
pub(crate) fn planning_window(cap: usize) -> usize {
    // Saturating: a cap an embedder or the environment sets past what
    // `keel.toml` takes must not overflow.
    cap.max(1).saturating_mul(2).max(MIN_PLANNING_WINDOW)
}

/// The concurrency cap: `configured` when set and positive, else
/// `KEEL_MAX_TOOL_USE_CONCURRENCY`, else 10. A non-numeric or zero value
/// means 10.
pub fn max_tool_use_concurrency(configured: Option<usize>) -> usize {
    match configured {
        Some(cap) if cap > 0 => cap,
        _ => parse_cap(std::env::var("KEEL_MAX_TOOL_USE_CONCURRENCY").ok().as_deref()),
    }
}

fn parse_cap(value: Option<&str>) -> usize {
    value
        .and_then(|text| text.trim().parse::<usize>().ok())
        .filter(|&cap| cap > 0)
        .unwrap_or(DEFAULT_MAX_TOOL_USE_CONCURRENCY)
}

/// How a batch runs.
#[derive(Clone)]
pub struct RunOptions {
    /// Calls of one concurrency-safe run in flight at once.
    pub cap: usize,
    /// Fuel the whole batch may burn, shared by its calls; `None`: no batch
    /// allowance beyond each call's own.
    pub batch_fuel: Option<u64>,
    /// The most bytes of JSON text one call's input may hold
    /// ([`Limits::input`](crate::Limits::input)).
    pub max_input: usize,
    /// The most bytes of JSON text context modifiers may make the shared
    /// context ([`Limits::context`](crate::Limits::context)).
    pub max_context: usize,
    /// The result budgets.
    pub budget: Budget,
    /// Every budget decision so far, shared by the batches of a session;
    /// `None` keeps none (see [`HostBuilder::without_ledger`]).
    ///
    /// [`HostBuilder::without_ledger`]: crate::HostBuilder::without_ledger
    pub ledger: Option<Arc<tokio::sync::Mutex<Ledger>>>,
    /// Labels each batch once it finished.
    pub summarizer: Arc<dyn Summarizer>,
}

impl RunOptions {
    /// The per-message budget over `results`, by the ledger, or with none
    /// kept.
    pub(crate) async fn per_message(&self, results: &mut [ToolResult], thresholds: &[Threshold]) {
        match &self.ledger {
            Some(ledger) => self.budget.per_message(results, thresholds, &mut *ledger.lock().await).await,
            None => self.budget.per_message(results, thresholds, &mut Ledger::new()).await,
        }
    }
}

/// What running a batch produced.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchOutcome {
    /// One result per `tool_use`, in the order of the batch.
    pub results: Vec<ToolResult>,
    /// The shared context after every modifier was applied.
    pub context: Value,
}

/// Where a batch's events go.
#[derive(Clone)]
pub(crate) enum Events {
    /// To a reader of the batch, who may stop listening.
    Channel(mpsc::UnboundedSender<Event>),
    /// To a function, called as each event happens.
    Sink(Arc<dyn Fn(Event) + Send + Sync>),
    /// To a function, only what a running tool reports itself (progress,
    /// log lines and refused requests: [`Event::is_report`]) and each call's
    /// start, without its activity, and end, with its figures.
    Lean(Arc<dyn Fn(Event) + Send + Sync>),
    /// Nowhere: nobody reads them.
    Nobody,
}

impl Events {
    /// Whether nobody reads the whole course of a call (any more): its
    /// start with the activity the tool is asked for, and its result. A
    /// lean reader reads neither.
    fn is_closed(&self) -> bool {
        match self {
            Events::Channel(sender) => sender.is_closed(),
            Events::Sink(_) => false,
            Events::Lean(_) | Events::Nobody => true,
        }
    }

    /// Whether anyone reads what a running tool reports, and when each call
    /// starts and ends (with its figures).
    pub(crate) fn reads_reports(&self) -> bool {
        matches!(self, Events::Lean(_)) || !self.is_closed()
    }
}

pub(crate) fn emit(events: &Events, event: Event) {
    match events {
        // A caller that stopped listening still gets its outcome.
        Events::Channel(sender) => {
            let _ = sender.send(event);
        }
        Events::Sink(sink) => sink(event),
        Events::Lean(sink)
            if event.is_report()
                || matches!(event, Event::CallStarted { .. } | Event::CallFinished { .. }) =>
        {
            sink(event)
        }
        Events::Lean(_) | Events::Nobody => {}
    }
}

/// [`emit`] an event of a call's course built only when someone listens: a
/// batch run for its outcome alone spares the copies an event holds.
fn emit_with(events: &Events, event: impl FnOnce() -> Event) {
    if !events.is_closed() {
        emit(events, event());
    }
}

/// [`emit`] an event a lean reader reads too (a report of a running tool,
/// a call's start or end), built only when someone listens.
fn emit_lean_with(events: &Events, event: impl FnOnce() -> Event) {
    if events.reads_reports() {
        emit(events, event());
    }
}

/// Run `uses` from `context`; events go to `events` as they happen.
///
/// Planning (which instantiates each call's sandbox and asks its `plan`)
/// runs ahead of execution by a window of twice the cap (at least 16 calls), so every
/// call instantiates its tool once, and a long batch holds a bounded number
/// of sandboxes. The `batch_plan` event goes out once every call is planned:
/// before the first call starts, unless the batch is longer than the window.
pub(crate) async fn run(
    pool: Arc<ToolPool>,
    uses: Cow<'_, [ToolUse]>,
    context: Value,
    options: Arc<RunOptions>,
    events: Events,
    interrupt: Interrupt,
) -> BatchOutcome {
    if uses.len() > 1 {
        // The batch's tasks share the calls; a batch handed over whole is
        // not copied for them.
        let uses: Arc<[ToolUse]> = uses.into_owned().into();
        let (results, thresholds, context) =
            run_many(&pool, uses.clone(), context, &options, &events, &interrupt).await;
        return finish(&uses, results, &thresholds, context, &options, &events, &interrupt).await;
    }
    let (results, thresholds, context) = match uses.first() {
        // Nothing to plan or run: no task would ever report the batch done.
        None => {
            emit_with(&events, || Event::BatchPlan { batches: Vec::new() });
            (Vec::new(), Vec::new(), context)
        }
        Some(tool_use) => {
            let (ran, context) = run_alone(&pool, tool_use, context, &options, &events, &interrupt).await;
            (vec![ran.result], vec![ran.threshold], context)
        }
    };
    finish(&uses, results, &thresholds, context, &options, &events, &interrupt).await
}

/// A batch of one call: planned, then run at once, with no partition to
/// keep and no order to restore.
async fn run_alone(
    pool: &Arc<ToolPool>,
    tool_use: &ToolUse,
    context: Value,
    options: &RunOptions,
    events: &Events,
    interrupt: &Interrupt,
) -> (Ran, Value) {
    let fuel = options.batch_fuel.map(BatchFuel::new);
    let mut context = Bounded::new(context, options.max_context);
    let shared = context.value().clone();
    let figures = events.reads_reports();
    let call = call::prepare(pool, tool_use, &shared, fuel.as_ref(), options.max_input, figures).await;
    emit_with(events, || {
        let safe = [matches!(&call, Ok(call) if call.concurrency_safe)];
        let ids = std::slice::from_ref(&tool_use.id);
        Event::BatchPlan { batches: partition(&safe).iter().map(|group| group.planned(ids)).collect() }
    });
    // Boxed, as in `run_one`: a future awaited inline is moved whole into
    // the future awaiting it, and that one into the next, at each start.
    // The call's own copies are gone when its modifier is accepted: the
    // context is changed in place.
    let accept = |patch: Value| context.apply(&patch);
    let ran = Box::pin(run_call(pool, call, shared, accept, &options.budget, events, interrupt)).await;
    emit_with(events, || Event::tool_result(&ran.result));
    (ran, context.into_value())
}

/// A batch of any length: see [`Batch`].
async fn run_many(
    pool: &Arc<ToolPool>,
    uses: Arc<[ToolUse]>,
    context: Value,
    options: &Arc<RunOptions>,
    events: &Events,
    interrupt: &Interrupt,
) -> (Vec<ToolResult>, Vec<Threshold>, Value) {
    let cap = options.cap.max(1);
    let ids: Vec<String> = uses.iter().map(|tool_use| tool_use.id.clone()).collect();
    let count = uses.len();
    let batch = Arc::new(Batch {
        pool: pool.clone(),
        uses,
        events: events.clone(),
        interrupt: interrupt.clone(),
        options: options.clone(),
        fuel: options.batch_fuel.map(BatchFuel::new),
        window: planning_window(cap),
        state: Mutex::new(State {
            calls: (0..count).map(|_| Slot::Unplanned).collect(),
            safe: vec![false; count],
            planning: 0,
            planned: 0,
            started: false,
            next: 0,
            admission: Admission::new(cap, context, options.max_context),
            results: OrderedResults::new(ids),
            thresholds: vec![Threshold::default(); count],
            finished: 0,
        }),
        done: tokio::sync::Notify::new(),
    });
    // The first calls are each planned by a task of their own: see
    // [`PLANNING_CHUNK`].
    for index in batch.lock().plan_ahead(&batch) {
        tokio::spawn(Box::pin(batch.clone().plan(index..index + 1)));
    }
    batch.done.notified().await;
    let mut state = batch.lock();
    state.admission.close_run();
    let results = std::mem::replace(&mut state.results, OrderedResults::new(Vec::new()));
    let thresholds = std::mem::take(&mut state.thresholds);
    (results.into_results(), thresholds, state.admission.take_context())
}

/// The end of every batch: the per-message budget over all its results,
/// `batch_finished`, and a label made off the critical path.
async fn finish(
    uses: &[ToolUse],
    mut results: Vec<ToolResult>,
    thresholds: &[Threshold],
    context: Value,
    options: &RunOptions,
    events: &Events,
    interrupt: &Interrupt,
) -> BatchOutcome {
    // What was streamed, to announce what the per-message budget replaces.
    let streamed = (!events.is_closed()).then(|| results.clone());
    options.per_message(&mut results, thresholds).await;
    for (sent, kept) in streamed.iter().flatten().zip(&results) {
        if sent.content != kept.content {
            let (tool_use_id, content) = (kept.tool_use_id.clone(), kept.content.clone());
            emit(events, Event::ToolResultReplaced { tool_use_id, content });
        }
    }
    let errors = results.iter().filter(|result| result.is_error).count();
    emit(
        events,
        Event::BatchFinished { calls: results.len(), errors, interrupted: interrupt.is_interrupted() },
    );

    // Off the critical path: the outcome is handed back now, and the label
    // follows as an event whenever (and if ever) it is ready. Nobody
    // listening, nothing to label.
    if events.is_closed() {
        return BatchOutcome { results, context };
    }
    let calls =
        uses.iter().zip(&results).map(|(tool_use, result)| SummaryCall::new(tool_use, result)).collect();
    let labelling = summary::spawn(options.summarizer.clone(), calls, summary::DEFAULT_SUMMARY_TIMEOUT);
    let events = events.clone();
    tokio::spawn(async move {
        if let Ok(Some(summary)) = labelling.await {
            emit(&events, Event::Summary { tool_use_ids: summary.tool_use_ids, label: summary.label });
        }
    });
    BatchOutcome { results, context }
}

/// A batch being run, shared by the tasks that run it.
///
/// A task plans a call (past the first window, a chunk of calls: see
/// [`PLANNING_CHUNK`]) and then runs whatever its planning let start; a task
/// that finishes a call goes on with the next call whose turn it is, and
/// hands any others it can start to tasks of their own. Nothing waits on a
/// coordinator: the state below decides, under one lock, which calls may
/// start.
///
/// Each call is planned under the shared context as it is when its planning
/// begins. When its turn comes under another context (a call before it
/// changed it), it is planned again under that one before it starts, so
/// every question it is asked sees the context it runs with.
///
/// The partition ([`crate::run::partition`]) is made as calls are planned, in order: a
/// safe call joins the run in flight, if there is one, and starts once
/// fewer than `cap` calls run; any other call waits for the run to finish
/// and then runs alone. Calls of one run all see the context as it was when
/// the run began; their modifiers are queued and applied when it ends, in
/// the batch's order, so the final context does not depend on which call
/// finished first. Planning runs at most a window ahead of the first call
/// not yet started ([`MIN_PLANNING_WINDOW`]), refilled a chunk at a time.
struct Batch {
    pool: Arc<ToolPool>,
    uses: Arc<[ToolUse]>,
    events: Events,
    interrupt: Interrupt,
    options: Arc<RunOptions>,
    fuel: Option<BatchFuel>,
    /// Calls planned ahead: see [`MIN_PLANNING_WINDOW`].
    window: usize,
    state: Mutex<State>,
    /// Signalled once every call has its result.
    done: tokio::sync::Notify,
}

/// Where a call is.
enum Slot {
    /// Not yet planned.
    Unplanned,
    /// Being planned by a task.
    Planning,
    /// Planned, waiting for its turn.
    Waiting(Result<Prepared, ToolResult>),
    /// Being planned again under the context its turn came with.
    Replanning,
    /// Started (or finished).
    Started,
}

struct State {
    calls: Vec<Slot>,
    /// Whether each planned call is concurrency-safe.
    safe: Vec<bool>,
    /// Calls whose planning was handed to a task: `0..planning`.
    planning: usize,
    /// Calls planned so far.
    planned: usize,
    /// Whether calls may start: once the window is full or every call is
    /// planned, so that a batch no longer than the window is planned whole
    /// (and its `batch_plan` sent) before its first call starts.
    started: bool,
    /// The first call not yet started.
    next: usize,
    /// Which call may start now, and the context it sees.
    admission: Admission,
    results: OrderedResults,
    /// The per-tool budget of each finished call.
    thresholds: Vec<Threshold>,
    finished: usize,
}

/// A call whose turn has come, with the context it sees; or, when `replan`
/// is set, one to plan again under that context before it may start.
struct Start {
    index: usize,
    call: Result<Prepared, ToolResult>,
    context: Arc<Value>,
    replan: bool,
}

/// What a task was doing with a call, should it panic.
#[derive(Clone, Copy)]
enum Doing {
    Replanning,
    Running,
}

impl Batch {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every change to the state is made whole under the lock; a panic
        // elsewhere cannot leave it half-changed.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Plan the calls of `calls` that no other task took, then run whatever
    /// their planning let start.
    async fn plan(self: Arc<Self>, calls: std::ops::Range<usize>) {
        let claimed = self.lock().claim(calls);
        if let Some((claimed, context)) = claimed {
            let (starts, plans) = self.plan_claimed(claimed, context).await;
            self.work(starts, plans).await;
        }
    }

    /// Plan the calls `claimed` by this task under `context`, in order, and
    /// keep them together (a call whose planning was slow at once, see
    /// [`SLOW_PLAN`]): what may start now, and what to plan next.
    async fn plan_claimed(
        self: &Arc<Self>,
        claimed: Vec<usize>,
        context: Arc<Value>,
    ) -> (Vec<Start>, std::ops::Range<usize>) {
        let (fuel, max_input) = (self.fuel.as_ref(), self.options.max_input);
        let figures = self.events.reads_reports();
        let mut planning = Planning { batch: self, planned: Vec::new(), done: 0, claimed };
        while let Some(&index) = planning.claimed.get(planning.done) {
            // The last call is kept with the rest whatever its planning took.
            let more = planning.done + 1 < planning.claimed.len();
            let started = more.then(Instant::now);
            let call = call::prepare(&self.pool, &self.uses[index], &context, fuel, max_input, figures).await;
            planning.planned.push((index, call));
            planning.done += 1;
            if started.is_some_and(|started| started.elapsed() > SLOW_PLAN) {
                let (starts, plans) = self.lock().planned(self, std::mem::take(&mut planning.planned));
                self.spawn(starts, plans);
            }
        }
        let planned = std::mem::take(&mut planning.planned);
        planning.claimed.clear();
        self.lock().planned(self, planned)
    }

    /// Run the first of `starts` here and hand the rest, and the planning of
    /// `plans`, to tasks of their own; then go on with the next call whose
    /// turn comes when this one finishes, for as long as there is one.
    ///
    /// With nothing to run, the task plans the next call itself if that
    /// call's planning task has not begun: a task spawned on a busy worker
    /// may wait there long after another worker ran out of calls.
    ///
    /// A call that finishes in its first poll never returns `Pending`, so a
    /// task going on from call to call would hold its thread until the
    /// batch ended, and every other task there (on a current-thread
    /// runtime, all of them) would wait. Once the task has gone on for
    /// [`HAND_OVER_AFTER`], it hands its next call to a new task, which
    /// waits only behind the tasks ready before it, and ends. `yield_now`
    /// would not do: it defers the task until the runtime next polls its
    /// I/O driver, every 61 tasks, while the call it holds keeps a place of
    /// the cap.
    async fn work(self: &Arc<Self>, mut starts: Vec<Start>, mut plans: std::ops::Range<usize>) {
        let began = Instant::now();
        loop {
            let mine = if starts.is_empty() { None } else { Some(starts.swap_remove(0)) };
            if mine.is_some() && began.elapsed() >= HAND_OVER_AFTER {
                starts.extend(mine);
                self.spawn(starts, plans);
                return;
            }
            self.spawn(starts, plans);
            let Some(Start { index, call, context, replan }) = mine else {
                let Some((index, context)) = self.lock().claim_next() else { return };
                (starts, plans) = self.plan_claimed(vec![index], context).await;
                continue;
            };
            if replan {
                let guard = Failing { batch: self, index, doing: Doing::Replanning };
                let Ok(mut call) = call else { unreachable!("only a planned call is planned again") };
                call.replan(context).await;
                std::mem::forget(guard);
                (starts, plans) = self.lock().replanned(self, index, Ok(call));
                continue;
            }
            let guard = Failing { batch: self, index, doing: Doing::Running };
            let accept = |patch| self.lock().admission.accept(index as u64, patch);
            let (budget, events) = (&self.options.budget, &self.events);
            let ran = run_call(&self.pool, call, context, accept, budget, events, &self.interrupt).await;
            std::mem::forget(guard);
            (starts, plans) = self.lock().finished(self, index, ran);
        }
    }

    fn spawn(self: &Arc<Self>, starts: Vec<Start>, plans: std::ops::Range<usize>) {
        // Boxed: a task's future is moved whole into the task and over
        // again when it completes; these are about 2 KB.
        for start in starts {
            let batch = self.clone();
            tokio::spawn(Box::pin(async move { batch.work(vec![start], 0..0).await }));
        }
        // A chunk of calls to a task: see [`PLANNING_CHUNK`].
        let mut from = plans.start;
        while from < plans.end {
            let to = (from + PLANNING_CHUNK).min(plans.end);
            tokio::spawn(Box::pin(self.clone().plan(from..to)));
            from = to;
        }
    }
}

/// The calls one task claimed to plan, in order: the first `done` of them
/// planned, and those of these not yet kept. Should the task panic, the
/// call it was planning gets its one result as a planning failure, the
/// calls planned before it are kept, and those after it are left for
/// another task to plan.
struct Planning<'a> {
    batch: &'a Arc<Batch>,
    claimed: Vec<usize>,
    done: usize,
    planned: Vec<(usize, Result<Prepared, ToolResult>)>,
}

impl Drop for Planning<'_> {
    fn drop(&mut self) {
        // Dropped without a panic, the task was cancelled: the runtime is
        // shutting down, and nobody is left to wait for the batch.
        if self.claimed.is_empty()
            || !std::thread::panicking()
            || tokio::runtime::Handle::try_current().is_err()
        {
            return;
        }
        let batch = self.batch;
        let mut planned = std::mem::take(&mut self.planned);
        let (failed, rest) = match self.claimed[self.done..] {
            [failed, ref rest @ ..] => (failed, rest),
            [] => unreachable!("a task that planned every call it claimed has kept them"),
        };
        planned.push((failed, Err(ToolResult::error(&batch.uses[failed].id, PLANNING_PANICKED))));
        let (starts, plans) = {
            let mut state = batch.lock();
            state.unclaim(rest);
            state.planned(batch, planned)
        };
        batch.spawn(starts, plans);
    }
}

/// Gives call `index` its one result if the task handling it panics: a
/// failed replanning or a failed run. Forgotten once the step returned.
struct Failing<'a> {
    batch: &'a Arc<Batch>,
    index: usize,
    doing: Doing,
}

impl Drop for Failing<'_> {
    fn drop(&mut self) {
        // Dropped without a panic, the task was cancelled: the runtime is
        // shutting down, and nobody is left to wait for the batch.
        if !std::thread::panicking() || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let (batch, index) = (self.batch, self.index);
        let id = &batch.uses[index].id;
        let failed = ToolResult::error(id, PLANNING_PANICKED);
        let (starts, plans) = match self.doing {
            Doing::Running => batch.lock().finished(batch, index, Ran::panicked(id)),
            Doing::Replanning => batch.lock().replanned(batch, index, Err(failed)),
        };
        batch.spawn(starts, plans);
    }
}

impl State {
    /// Take the calls of `calls` that no task took yet, to plan, with the
    /// shared context as it is now, which they are planned under; `None`
    /// when every one was taken.
    fn claim(&mut self, calls: std::ops::Range<usize>) -> Option<(Vec<usize>, Arc<Value>)> {
        let claimed: Vec<usize> =
            calls.filter(|&index| matches!(self.calls[index], Slot::Unplanned)).collect();
        if claimed.is_empty() {
            return None;
        }
        for &index in &claimed {
            self.calls[index] = Slot::Planning;
        }
        Some((claimed, self.admission.context().clone()))
    }

    /// The first call not yet started, taken to plan with its context, if
    /// its planning was handed to a task that has not begun it.
    fn claim_next(&mut self) -> Option<(usize, Arc<Value>)> {
        let index = self.next;
        if index >= self.planning {
            return None;
        }
        self.claim(index..index + 1).map(|(_, context)| (index, context))
    }

    /// Give `calls`, claimed but not planned, back for another task to plan:
    /// the task that took them can plan no more. Each is planned by the task
    /// that finds it the next to start (see [`State::claim_next`]).
    fn unclaim(&mut self, calls: &[usize]) {
        for &index in calls {
            self.calls[index] = Slot::Unplanned;
        }
    }

    /// The calls of `planned` are planned: keep them, announce the plan once
    /// every call is, and say what may start now.
    fn planned(
        &mut self,
        batch: &Batch,
        planned: Vec<(usize, Result<Prepared, ToolResult>)>,
    ) -> (Vec<Start>, std::ops::Range<usize>) {
        for (index, call) in planned {
            self.wait(index, call);
            self.planned += 1;
        }
        if self.planned == self.calls.len() {
            let ids = &self.results.ids;
            emit_with(&batch.events, || {
                let groups = partition(&self.safe);
                Event::BatchPlan { batches: groups.iter().map(|group| group.planned(ids)).collect() }
            });
        }
        self.pump(batch)
    }

    /// Call `index` is planned again, under the context its turn came with:
    /// keep it, and say what may start now.
    fn replanned(
        &mut self,
        batch: &Batch,
        index: usize,
        call: Result<Prepared, ToolResult>,
    ) -> (Vec<Start>, std::ops::Range<usize>) {
        self.wait(index, call);
        self.pump(batch)
    }

    /// Keep call `index`, planned, to wait for its turn.
    fn wait(&mut self, index: usize, call: Result<Prepared, ToolResult>) {
        self.safe[index] = matches!(&call, Ok(call) if call.concurrency_safe);
        self.calls[index] = Slot::Waiting(call);
    }

    /// Call `index` finished (its modifier was accepted as it ended): release
    /// its result in order, keep its budget, and say what may start now.
    fn finished(&mut self, batch: &Batch, index: usize, ran: Ran) -> (Vec<Start>, std::ops::Range<usize>) {
        self.admission.finish();
        self.thresholds[index] = ran.threshold;
        self.results.finish(index, ran.result, &batch.events);
        self.finished += 1;
        if self.finished == self.calls.len() {
            batch.done.notify_one();
        }
        self.pump(batch)
    }

    /// Start every waiting call whose turn it is, in order: safe calls while
    /// fewer than `cap` run and no call runs alone; another call only when
    /// nothing runs. A call whose turn comes under another context than it
    /// was planned under is handed back to be planned again, and the calls
    /// after it wait. Then plan ahead up to the window.
    fn pump(&mut self, batch: &Batch) -> (Vec<Start>, std::ops::Range<usize>) {
        let mut starts = Vec::new();
        if !self.started {
            let ahead =
                self.calls[self.next..].iter().take_while(|slot| matches!(slot, Slot::Waiting(_))).count();
            self.started = self.planned == self.calls.len() || ahead >= batch.window;
        }
        while self.started && self.next < self.calls.len() {
            let index = self.next;
            let Slot::Waiting(waiting) = &self.calls[index] else { break };
            let Some(context) = self.admission.ready(self.safe[index]) else { break };
            if waiting.as_ref().is_ok_and(|call| !call.planned_under(&context)) {
                let Slot::Waiting(call) = std::mem::replace(&mut self.calls[index], Slot::Replanning) else {
                    unreachable!("the call was seen waiting")
                };
                starts.push(Start { index, call, context, replan: true });
                break;
            }
            let context = self.admission.start(self.safe[index]).expect("the call was just seen ready");
            let Slot::Waiting(call) = std::mem::replace(&mut self.calls[index], Slot::Started) else {
                unreachable!("the call was seen waiting")
            };
            self.next += 1;
            starts.push(Start { index, call, context, replan: false });
        }
        (starts, self.plan_ahead(batch))
    }

    /// The calls to plan now: up to a window past the first not started,
    /// once a chunk's worth of them has room (see [`PLANNING_CHUNK`]), or
    /// the rest of the batch.
    fn plan_ahead(&mut self, batch: &Batch) -> std::ops::Range<usize> {
        let until = self.next.saturating_add(batch.window).min(self.calls.len());
        if until < self.calls.len() && until < self.planning + PLANNING_CHUNK {
            return self.planning..self.planning;
        }
        let plans = self.planning..until.max(self.planning);
        self.planning = plans.end;
        plans
    }
}

/// What one call's step from its turn to its result produced.
pub(crate) struct Ran {
    pub(crate) result: ToolResult,
    /// The per-tool budget its result was held to, which the per-message
    /// budget goes on from.
    pub(crate) threshold: Threshold,
}

impl Ran {
    /// The result of a call whose run panicked in the host.
    pub(crate) fn panicked(id: &str) -> Self {
        Ran { result: ToolResult::error(id, RUN_PANICKED), threshold: Threshold::default() }
    }
}

/// Run one planned call (or pass on its planning failure), hand its
/// context modifier, if it returned one, to `accept`, hold its result to its
/// tool's budget, and send `call_finished` with the call's figures: every
/// call's step from its turn to its result, in a batch or in a stream of
/// calls arriving one by one ([`crate::Arrival::run`]).
///
/// A modifier `accept` refuses (it would take the shared context past its
/// limit) fails the call: its result is an error saying so, and the
/// context is as it was.
pub(crate) async fn run_call(
    pool: &ToolPool,
    call: Result<Prepared, ToolResult>,
    context: Arc<Value>,
    accept: impl FnOnce(Value) -> Result<(), Refused>,
    budget: &Budget,
    events: &Events,
    interrupt: &Interrupt,
) -> Ran {
    // A call that failed planning produced no output to hold.
    let call = match call {
        Ok(call) => call,
        Err(result) => return Ran { result, threshold: Threshold::default() },
    };
    let threshold = budget.threshold(call.entry.tool.spec());
    let Finished { mut result, modifier, mut recorder, span, entry } =
        match run_one(pool, call, context, events, interrupt).await {
            Ok(finished) => finished,
            Err(result) => return Ran { result, threshold },
        };
    if let Some(Err(refused)) = modifier.map(accept) {
        recorder.outcome = Outcome::Limit;
        result = ToolResult::error(
            &result.tool_use_id,
            context::modifier_refused(&entry.tool.spec().name, &refused),
        );
    }
    let mut steps = Steps { recorder: &mut recorder, span: &span };
    let result = steps.time(Step::Budget, budget.per_tool(result, threshold)).await;
    let figures = recorder.is_on().then(|| recorder.figures(&entry.tool.spec().name));
    if let Some(figures) = figures.as_ref().filter(|_| !span.is_disabled()) {
        span.record("outcome", figures.outcome.as_str());
        if let (Some(fuel), Some(memory_peak)) = (figures.fuel, figures.memory_peak) {
            span.record("fuel", fuel);
            span.record("memory_peak", memory_peak);
        }
    }
    emit_lean_with(events, || Event::CallFinished {
        tool_use_id: result.tool_use_id.clone(),
        is_error: result.is_error,
        figures: figures.map(Box::new),
    });
    Ran { result, threshold }
}

/// Run a planned call from its start; an `Err` is the result of a call an
/// interrupt kept from starting.
async fn run_one(
    pool: &ToolPool,
    mut call: Prepared,
    context: Arc<Value>,
    events: &Events,
    interrupt: &Interrupt,
) -> Result<Finished, ToolResult> {
    if interrupt.is_interrupted() {
        return Err(ToolResult::error(&call.id, NOT_STARTED));
    }
    // Only a reader of the whole course shows the activity: without one,
    // spare the guest the question.
    let activity = if events.is_closed() { None } else { call.activity().await };
    emit_lean_with(events, || Event::CallStarted {
        tool_use_id: call.id.clone(),
        tool: call.name().to_owned(),
        activity,
    });
    // What the tool reports goes nowhere, at no cost, when nobody reads it.
    let cx = if events.reads_reports() {
        reporting(context, events, call.id.clone())
    } else {
        CallContext::shared(context)
    };
    // Boxed: a call's steps make a future of about 2 KB, which, awaited
    // inline, every future above it would hold and move again (README,
    // Performance: levers kept).
    Ok(Box::pin(call.run(pool, cx, interrupt)).await)
}

/// The context of a call `id` whose reports `events` reads: each one goes
/// there as an event naming the call.
fn reporting(context: Arc<Value>, events: &Events, id: String) -> CallContext {
    let (progress_events, progress_id) = (events.clone(), id.clone());
    let (refusal_events, refusal_id) = (events.clone(), id.clone());
    let (log_events, log_id) = (events.clone(), id);
    CallContext {
        context,
        progress: Arc::new(move |data| {
            emit(&progress_events, Event::Progress { tool_use_id: progress_id.clone(), data });
        }),
        refused: Arc::new(move |refusal| {
            emit(
                &refusal_events,
                Event::NetworkRefused {
                    tool_use_id: refusal_id.clone(),
                    method: refusal.method.clone(),
                    url: refusal.url.clone(),
                    reason: refusal.reason.clone(),
                },
            );
        }),
        log: Arc::new(move |level, message| {
            emit_lean_with(&log_events, || Event::ToolLog {
                tool_use_id: log_id.clone(),
                level,
                message: message.to_owned(),
            });
        }),
    }
}

/// Results as they finish, released in the batch's order: a finished call
/// waits for the calls before it.
struct OrderedResults {
    ids: Vec<String>,
    slots: Vec<Option<ToolResult>>,
    released: usize,
}

impl OrderedResults {
    fn new(ids: Vec<String>) -> Self {
        OrderedResults { slots: vec![None; ids.len()], ids, released: 0 }
    }

    fn finish(&mut self, index: usize, result: ToolResult, events: &Events) {
        self.slots[index] = Some(result);
        while let Some(Some(result)) = self.slots.get(self.released) {
            emit_with(events, || Event::tool_result(result));
            self.released += 1;
        }
    }

    fn into_results(self) -> Vec<ToolResult> {
        self.slots.into_iter().map(|slot| slot.expect("every call has a result")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_defaults_to_ten_for_missing_non_numeric_or_zero_values() {
        assert_eq!(parse_cap(None), 10);
        assert_eq!(parse_cap(Some("")), 10);
        assert_eq!(parse_cap(Some("lots")), 10);
        assert_eq!(parse_cap(Some("0")), 10);
        assert_eq!(parse_cap(Some("-3")), 10);
        assert_eq!(parse_cap(Some("3")), 3);
        assert_eq!(parse_cap(Some(" 25 ")), 25);
    }

    #[test]
    fn a_cap_past_what_keel_toml_takes_does_not_overflow_the_window() {
        assert_eq!(planning_window(usize::MAX), usize::MAX);
        assert_eq!(planning_window(parse_cap(Some("9223372036854775807"))), usize::MAX - 1);
    }

    #[test]
    fn a_configured_cap_wins_unless_zero() {
        assert_eq!(max_tool_use_concurrency(Some(4)), 4);
    }
}
