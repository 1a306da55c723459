//! Running a batch (DESIGN.md §3): plan every call, cut the batch into runs
//! of concurrency-safe calls and single unsafe calls, run each run with at
//! most `cap` calls in flight and each unsafe call alone, and hand back
//! exactly one result per `tool_use`, in order.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use futures::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::batch::{ToolResult, ToolUse};
use crate::budget::{Budget, Threshold};
use crate::context;
use crate::events::{Event, PlannedGroup};
use crate::ledger::Ledger;
use crate::limits::BatchFuel;
use crate::partition::partition;
use crate::pool::ToolPool;
use crate::runner::{self, NOT_STARTED, Prepared};
use crate::summary::{self, Summarizer, SummaryCall};
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
    /// The result budgets.
    pub budget: Budget,
    /// Every budget decision so far, shared by the batches of a session.
    pub ledger: Arc<tokio::sync::Mutex<Ledger>>,
    /// Labels each batch once it finished.
    pub summarizer: Arc<dyn Summarizer>,
}

/// Interrupts a running batch: calls not started are not started, running
/// `cancel` calls stop, `block` calls run to their end. Every call still gets
/// exactly one result.
#[derive(Clone, Debug, Default)]
pub struct Interrupt(CancellationToken);

impl Interrupt {
    /// A fresh, untriggered interrupt.
    pub fn new() -> Self {
        Interrupt::default()
    }

    /// Interrupt the batch.
    pub fn interrupt(&self) {
        self.0.cancel();
    }

    /// Whether the batch was interrupted.
    pub fn is_interrupted(&self) -> bool {
        self.0.is_cancelled()
    }

    /// Resolves once the batch is interrupted.
    pub async fn interrupted(&self) {
        self.0.cancelled().await;
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
    /// Nowhere: nobody reads them.
    Nobody,
}

impl Events {
    /// Whether nobody reads events (any more).
    fn is_closed(&self) -> bool {
        match self {
            Events::Channel(sender) => sender.is_closed(),
            Events::Sink(_) => false,
            Events::Nobody => true,
        }
    }
}

pub(crate) fn emit(events: &Events, event: Event) {
    match events {
        // A caller that stopped listening still gets its outcome.
        Events::Channel(sender) => {
            let _ = sender.send(event);
        }
        Events::Sink(sink) => sink(event),
        Events::Nobody => {}
    }
}

/// [`emit`] an event built only when someone listens: a batch run for its
/// outcome alone spares the copies an event holds.
fn emit_with(events: &Events, event: impl FnOnce() -> Event) {
    if !events.is_closed() {
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
    uses: &[ToolUse],
    context: Value,
    options: RunOptions,
    events: Events,
    interrupt: Interrupt,
) -> BatchOutcome {
    let thresholds: Vec<Threshold> =
        uses.iter().map(|tool_use| options.budget.threshold_in(&pool, &tool_use.name)).collect();
    let (results, context) = match uses {
        [tool_use] => {
            let (result, context) =
                run_alone(&pool, tool_use, context, &options, thresholds[0], &events, &interrupt).await;
            (vec![result], context)
        }
        _ => run_many(&pool, uses, context, &options, &thresholds, &events, &interrupt).await,
    };
    finish(uses, results, &thresholds, context, &options, &events, &interrupt).await
}

/// A batch of one call: planned, then run at once, with no partition to
/// keep and no order to restore.
async fn run_alone(
    pool: &Arc<ToolPool>,
    tool_use: &ToolUse,
    mut context: Value,
    options: &RunOptions,
    threshold: Threshold,
    events: &Events,
    interrupt: &Interrupt,
) -> (ToolResult, Value) {
    let fuel = options.batch_fuel.map(BatchFuel::new);
    let call = runner::prepare(pool, tool_use, fuel.as_ref()).await;
    emit_with(events, || {
        let safe = [matches!(&call, Ok(call) if call.concurrency_safe)];
        let ids = std::slice::from_ref(&tool_use.id);
        Event::BatchPlan {
            batches: partition(&safe).iter().map(|group| PlannedGroup::new(group, ids)).collect(),
        }
    });
    let (result, modifier) =
        run_call(pool, call, context.clone(), &options.budget, threshold, events, interrupt).await;
    emit_with(events, || Event::tool_result(&result));
    if let Some(patch) = modifier {
        context::apply(&mut context, &patch);
    }
    (result, context)
}

/// A batch of any length: see [`Execution`].
async fn run_many(
    pool: &Arc<ToolPool>,
    uses: &[ToolUse],
    context: Value,
    options: &RunOptions,
    thresholds: &[Threshold],
    events: &Events,
    interrupt: &Interrupt,
) -> (Vec<ToolResult>, Value) {
    let cap = options.cap.max(1);
    let fuel = options.batch_fuel.map(BatchFuel::new);
    let ids: Vec<String> = uses.iter().map(|tool_use| tool_use.id.clone()).collect();

    // Planning spreads over the workers too, keeping the batch's order.
    let mut planner = futures::stream::iter(uses.iter().cloned())
        .map(|tool_use| {
            let (pool, fuel) = (pool.clone(), fuel.clone());
            let id = tool_use.id.clone();
            let plan = async move { runner::prepare(&pool, &tool_use, fuel.as_ref()).await };
            async move {
                tokio::spawn(plan).await.unwrap_or_else(|_| {
                    Err(ToolResult::error(id, "the host failed while planning this call"))
                })
            }
        })
        .buffered(cap);

    let mut batch = Execution {
        pool,
        events,
        interrupt,
        budget: Budgeted { budget: &options.budget, thresholds },
        cap,
        window: (2 * cap).max(MIN_PLANNING_WINDOW),
        context,
        waiting: VecDeque::new(),
        safe: Vec::with_capacity(uses.len()),
        planned_all: false,
        started: false,
        running: tokio::task::JoinSet::new(),
        index_of: HashMap::new(),
        group: None,
        results: OrderedResults::new(ids.clone()),
    };
    loop {
        batch.start_what_can_start().await;
        if batch.planned_all && batch.waiting.is_empty() && batch.running.is_empty() {
            break;
        }
        let may_plan = !batch.planned_all && batch.waiting.len() < batch.window;
        tokio::select! {
            planned = planner.next(), if may_plan => match planned {
                Some(call) => batch.planned(call),
                None => {
                    batch.planned_all = true;
                    let groups = partition(&batch.safe);
                    emit_with(events, || Event::BatchPlan {
                        batches: groups.iter().map(|group| PlannedGroup::new(group, &ids)).collect(),
                    });
                }
            },
            Some(joined) = batch.running.join_next_with_id() => batch.joined(joined),
            else => break,
        }
    }
    batch.close_group();
    let Execution { context, results, .. } = batch;
    (results.into_results(), context)
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
    options.budget.per_message(&mut results, thresholds, &mut *options.ledger.lock().await).await;
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

/// The per-tool budget of each call of the batch, by position.
struct Budgeted<'a> {
    budget: &'a Budget,
    thresholds: &'a [Threshold],
}

/// What a call running in a task of its own hands back.
type Finished = (usize, ToolResult, Option<Value>);

/// A batch being run: calls planned and waiting in order, the calls of the
/// current concurrent run in flight, and the results so far.
///
/// The partition (DESIGN.md §3) is made as calls arrive: a safe call joins
/// the run in flight, if there is one, and starts once fewer than `cap`
/// calls run; any other call waits for the run to finish and then runs
/// alone. Calls of one run all see the context as it was when the run began;
/// their modifiers are queued and applied when it ends, in the batch's
/// order, so the final context does not depend on which call finished first.
/// Each call of a run is a task of its own, so calls run in parallel on
/// every worker thread, not only interleaved on one.
struct Execution<'a> {
    pool: &'a Arc<ToolPool>,
    events: &'a Events,
    interrupt: &'a Interrupt,
    budget: Budgeted<'a>,
    cap: usize,
    /// Calls planned ahead: see [`MIN_PLANNING_WINDOW`].
    window: usize,
    /// The shared context, up to the last run that ended.
    context: Value,
    /// Planned calls not started yet, in order, each with its position.
    waiting: VecDeque<(usize, Result<Prepared, ToolResult>)>,
    /// Whether each call planned so far is concurrency-safe.
    safe: Vec<bool>,
    planned_all: bool,
    /// Whether the first call has started: once the window is full or
    /// every call is planned.
    started: bool,
    running: tokio::task::JoinSet<Finished>,
    index_of: HashMap<tokio::task::Id, usize>,
    /// The concurrent run in flight, if any.
    group: Option<ConcurrentRun>,
    results: OrderedResults,
}

/// A concurrent run: the context its calls see, and their modifiers.
struct ConcurrentRun {
    snapshot: Value,
    queued: Vec<(usize, Value)>,
}

impl Execution<'_> {
    fn planned(&mut self, call: Result<Prepared, ToolResult>) {
        let index = self.safe.len();
        self.safe.push(matches!(&call, Ok(call) if call.concurrency_safe));
        self.waiting.push_back((index, call));
    }

    /// Start every waiting call whose turn it is, in order: safe calls while
    /// fewer than `cap` run; another call only when nothing runs, awaited
    /// here. A safe call that would run alone (nothing runs, and the next
    /// call is not safe) is awaited here too: a run of one gains nothing
    /// from a task of its own.
    async fn start_what_can_start(&mut self) {
        self.started |= self.planned_all || self.waiting.len() >= self.window;
        if !self.started {
            return;
        }
        while let Some(&(index, _)) = self.waiting.front() {
            let next_safe = match self.waiting.get(1) {
                Some(&(next, _)) => Some(self.safe[next]),
                None if self.planned_all => Some(false),
                None => None,
            };
            let lone = self.group.is_none() && next_safe == Some(false);
            if self.safe[index] && !lone {
                if self.running.len() >= self.cap {
                    return;
                }
                let (index, call) = self.waiting.pop_front().expect("a call is waiting");
                self.spawn(index, call);
            } else {
                if !self.running.is_empty() {
                    return;
                }
                self.close_group();
                let (index, call) = self.waiting.pop_front().expect("a call is waiting");
                let threshold = self.budget.thresholds[index];
                let (result, modifier) = run_call(
                    self.pool,
                    call,
                    self.context.clone(),
                    self.budget.budget,
                    threshold,
                    self.events,
                    self.interrupt,
                )
                .await;
                // Serial: the next call sees the change at once.
                if let Some(patch) = modifier {
                    context::apply(&mut self.context, &patch);
                }
                self.results.finish(index, result, self.events);
            }
        }
    }

    /// Start a safe call in a task of its own, in the current run.
    fn spawn(&mut self, index: usize, call: Result<Prepared, ToolResult>) {
        let context = &self.context;
        let run =
            self.group.get_or_insert_with(|| ConcurrentRun { snapshot: context.clone(), queued: Vec::new() });
        let (pool, events, interrupt) = (self.pool.clone(), self.events.clone(), self.interrupt.clone());
        let (snapshot, budget, threshold) =
            (run.snapshot.clone(), self.budget.budget.clone(), self.budget.thresholds[index]);
        let task = self.running.spawn(async move {
            let (result, modifier) =
                run_call(&pool, call, snapshot, &budget, threshold, &events, &interrupt).await;
            (index, result, modifier)
        });
        self.index_of.insert(task.id(), index);
    }

    fn joined(&mut self, joined: Result<(tokio::task::Id, Finished), tokio::task::JoinError>) {
        let (index, result, modifier) = match joined {
            Ok((id, finished)) => {
                self.index_of.remove(&id);
                finished
            }
            // A call that panicked the host still gets its one result.
            Err(error) => {
                let index = self.index_of.remove(&error.id()).expect("every task has an index");
                let id = &self.results.ids[index];
                (index, ToolResult::error(id, "the host failed while running this call"), None)
            }
        };
        if let (Some(run), Some(patch)) = (&mut self.group, modifier) {
            run.queued.push((index, patch));
        }
        self.results.finish(index, result, self.events);
    }

    /// End the concurrent run, if one was in flight: apply its queued
    /// modifiers in the batch's order.
    fn close_group(&mut self) {
        if let Some(mut run) = self.group.take() {
            run.queued.sort_by_key(|&(index, _)| index);
            for (_, patch) in run.queued {
                context::apply(&mut self.context, &patch);
            }
        }
    }
}

/// Run one planned call (or pass on its planning failure), and hold its
/// result to the per-tool budget: every call's step from its turn to its
/// result, in a batch or on its own ([`crate::PlannedCall::run`]).
pub(crate) async fn run_call(
    pool: &ToolPool,
    call: Result<Prepared, ToolResult>,
    context: Value,
    budget: &Budget,
    threshold: Threshold,
    events: &Events,
    interrupt: &Interrupt,
) -> (ToolResult, Option<Value>) {
    let (result, modifier) = run_one(pool, call, context, events, interrupt).await;
    (budget.per_tool(result, threshold).await, modifier)
}

async fn run_one(
    pool: &ToolPool,
    call: Result<Prepared, ToolResult>,
    context: Value,
    events: &Events,
    interrupt: &Interrupt,
) -> (ToolResult, Option<Value>) {
    let mut call = match call {
        Ok(call) => call,
        Err(result) => return (result, None),
    };
    if interrupt.is_interrupted() {
        return (ToolResult::error(&call.id, NOT_STARTED), None);
    }
    let id = call.id.clone();
    // Only an event reader shows the activity: without one, spare the guest
    // the question.
    let activity = if events.is_closed() { None } else { call.activity().await };
    emit_with(events, || Event::CallStarted { tool_use_id: id.clone(), tool: call.name.clone(), activity });
    let progress_events = events.clone();
    let progress_id = id.clone();
    let cx = CallContext {
        context,
        progress: Arc::new(move |data| {
            emit(&progress_events, Event::Progress { tool_use_id: progress_id.clone(), data });
        }),
    };
    let (result, modifier) = call.run(pool, cx, interrupt).await;
    emit_with(events, || Event::CallFinished { tool_use_id: id, is_error: result.is_error });
    (result, modifier)
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
    fn a_configured_cap_wins_unless_zero() {
        assert_eq!(max_tool_use_concurrency(Some(4)), 4);
    }
}
