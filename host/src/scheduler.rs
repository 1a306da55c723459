//! Running a batch (DESIGN.md §3): plan every call, cut the batch into runs
//! of concurrency-safe calls and single unsafe calls, run each run with at
//! most `cap` calls in flight and each unsafe call alone, and hand back
//! exactly one result per `tool_use`, in order.

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
use crate::partition::{Group, partition};
use crate::pool::ToolPool;
use crate::runner::{self, NOT_STARTED, Prepared};
use crate::summary::{self, Summarizer, SummaryCall};
use crate::tool::CallContext;

/// The default concurrency cap, and what a non-numeric or zero setting means.
pub const DEFAULT_MAX_TOOL_USE_CONCURRENCY: usize = 10;

/// Calls a batch may hold live sandboxes for while they wait their turn;
/// past this, waiting calls release theirs and start afresh at their turn,
/// so one huge batch cannot exhaust the instance pool.
const MAX_WAITING_SANDBOXES: usize = 64;

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

/// Where events go.
type Events = mpsc::UnboundedSender<Event>;

fn emit(events: &Events, event: Event) {
    // A caller that stopped listening still gets its outcome.
    let _ = events.send(event);
}

/// [`emit`] an event built only when someone listens: a batch run for its
/// outcome alone spares the copies an event holds.
fn emit_with(events: &Events, event: impl FnOnce() -> Event) {
    if !events.is_closed() {
        emit(events, event());
    }
}

/// Run `uses` from `context`; events go to `events` as they happen.
pub async fn run(
    pool: Arc<ToolPool>,
    uses: Vec<ToolUse>,
    mut context: Value,
    options: RunOptions,
    events: Events,
    interrupt: Interrupt,
) -> BatchOutcome {
    let cap = options.cap.max(1);
    let fuel = options.batch_fuel.map(BatchFuel::new);
    let ids: Vec<String> = uses.iter().map(|tool_use| tool_use.id.clone()).collect();

    // Planning instantiates each call's sandbox: spread it over the workers
    // too, keeping the batch's order.
    let planned: Vec<Result<Prepared, ToolResult>> = futures::stream::iter(0..uses.len())
        .map(|index| {
            let (pool, tool_use, fuel) = (pool.clone(), uses[index].clone(), fuel.clone());
            let id = tool_use.id.clone();
            let alone = uses.len() == 1;
            async move {
                let plan = async move { runner::prepare(&pool, &tool_use, fuel.as_ref()).await };
                if alone {
                    return plan.await;
                }
                tokio::spawn(plan).await.unwrap_or_else(|_| {
                    Err(ToolResult::error(id, "the host failed while planning this call"))
                })
            }
        })
        .buffered(cap)
        .collect()
        .await;
    let safe: Vec<bool> =
        planned.iter().map(|call| matches!(call, Ok(call) if call.concurrency_safe)).collect();
    let groups = partition(&safe);
    emit_with(&events, || Event::BatchPlan {
        batches: groups.iter().map(|group| PlannedGroup::new(group, &ids)).collect(),
    });

    let mut planned: Vec<Option<Result<Prepared, ToolResult>>> = planned.into_iter().map(Some).collect();
    for call in planned.iter_mut().skip(MAX_WAITING_SANDBOXES).flatten().flatten() {
        call.park();
    }
    let thresholds: Vec<Threshold> = uses
        .iter()
        .map(|tool_use| {
            pool.get(&tool_use.name)
                .map_or_else(Threshold::default, |e| options.budget.threshold(e.tool.spec()))
        })
        .collect();
    let budget = Budgeted { budget: &options.budget, thresholds: &thresholds };
    let mut results = OrderedResults::new(ids.clone());
    for group in &groups {
        let calls: Vec<(usize, Result<Prepared, ToolResult>)> = group
            .calls
            .clone()
            .map(|index| (index, planned[index].take().expect("each call runs once")))
            .collect();
        // A run of one gains nothing from a task of its own.
        if group.concurrent && group.calls.len() > 1 {
            run_concurrently(
                &pool,
                calls,
                &mut context,
                cap,
                &events,
                &interrupt,
                &mut results,
                group,
                &budget,
            )
            .await;
        } else {
            for (index, call) in calls {
                let (result, modifier) = run_one(&pool, call, context.clone(), &events, &interrupt).await;
                let result = budget.per_tool(index, result).await;
                // Serial: the next call sees the change at once.
                if let Some(patch) = modifier {
                    context::apply(&mut context, &patch);
                }
                results.finish(index, result, &events);
            }
        }
    }
    let mut results = results.into_results();
    // What was streamed, to announce what the per-message budget replaces.
    let streamed = (!events.is_closed()).then(|| results.clone());
    options.budget.per_message(&mut results, &thresholds, &mut *options.ledger.lock().await).await;
    for (sent, kept) in streamed.iter().flatten().zip(&results) {
        if sent.content != kept.content {
            let (tool_use_id, content) = (kept.tool_use_id.clone(), kept.content.clone());
            emit(&events, Event::ToolResultReplaced { tool_use_id, content });
        }
    }
    let errors = results.iter().filter(|result| result.is_error).count();
    emit(
        &events,
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

impl Budgeted<'_> {
    async fn per_tool(&self, index: usize, result: ToolResult) -> ToolResult {
        self.budget.per_tool(result, self.thresholds[index]).await
    }
}

/// Run one concurrent group: at most `cap` calls in flight, all seeing the
/// context as it was when the group began; their modifiers are queued and
/// applied after the group in the original order, so the final context does
/// not depend on which call finished first.
///
/// Each call is a task of its own, so calls run in parallel on every worker
/// thread, not only interleaved on one. Calls start in batch order as slots
/// of the cap free up.
#[expect(clippy::too_many_arguments, reason = "one group's share of the batch state")]
async fn run_concurrently(
    pool: &Arc<ToolPool>,
    calls: Vec<(usize, Result<Prepared, ToolResult>)>,
    context: &mut Value,
    cap: usize,
    events: &Events,
    interrupt: &Interrupt,
    results: &mut OrderedResults,
    group: &Group,
    budget: &Budgeted<'_>,
) {
    let snapshot = context.clone();
    let mut queued: Vec<Option<Value>> = vec![None; group.calls.len()];
    let slots = Arc::new(tokio::sync::Semaphore::new(cap));
    let mut waiting = calls.into_iter();
    let mut next = waiting.next();
    let mut running = tokio::task::JoinSet::new();
    let mut index_of = std::collections::HashMap::new();
    loop {
        tokio::select! {
            // Start the next call as soon as a slot is free, in batch order.
            permit = slots.clone().acquire_owned(), if next.is_some() => {
                let permit = permit.expect("the semaphore is never closed");
                let (index, call) = next.take().expect("guarded by the branch condition");
                let (pool, events, interrupt) = (pool.clone(), events.clone(), interrupt.clone());
                let (snapshot, budget, threshold) = (snapshot.clone(), budget.budget.clone(), budget.thresholds[index]);
                let task = running.spawn(async move {
                    let (result, modifier) = run_one(&pool, call, snapshot, &events, &interrupt).await;
                    drop(permit);
                    (budget.per_tool(result, threshold).await, modifier)
                });
                index_of.insert(task.id(), index);
                next = waiting.next();
            }
            Some(joined) = running.join_next_with_id() => {
                let (index, result, modifier) = match joined {
                    Ok((id, (result, modifier))) => (index_of[&id], result, modifier),
                    // A call that panicked the host still gets its one result.
                    Err(error) => {
                        let index = index_of[&error.id()];
                        let id = &results.ids[index];
                        (index, ToolResult::error(id, "the host failed while running this call"), None)
                    }
                };
                queued[index - group.calls.start] = modifier;
                results.finish(index, result, events);
            }
            else => break,
        }
    }
    for patch in queued.into_iter().flatten() {
        context::apply(context, &patch);
    }
}

/// Run one planned call (or pass on its planning failure).
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
