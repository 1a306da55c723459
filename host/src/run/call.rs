//! One call, step by step: resolve the name, check the input against the
//! schema, ask the per-input questions (planning), then at its turn ask the
//! tool's own `check` (validation, then its permission decision), then the host's
//! [permission rules](crate::permissions), and run it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use serde_json::Value;

use crate::batch::{ToolResult, ToolUse};
use crate::content::{Content, ContentBlock};
use crate::events::figures::{Outcome, Recorder, Step};
use crate::limits::{BatchFuel, input_too_large};
use crate::permissions::PendingCall;
use crate::pool::{PoolEntry, ToolPool};
use crate::run::interrupt::Interrupt;
use crate::tool::{
    CallContext, CallError, CallOutput, InterruptBehavior, Invocation, PermissionDecision, ToolSpec,
};

/// The result text of a call that never started because of an interrupt.
pub const NOT_STARTED: &str = "Interrupted: the call was not started.";
/// The result text of a running call stopped by an interrupt.
pub const STOPPED: &str = "Interrupted: the call was stopped before it finished.";
/// The result text of a call whose planning panicked in the host.
pub(crate) const PLANNING_PANICKED: &str = "the host failed while planning this call";
/// The result text of a call whose run panicked in the host.
pub(crate) const RUN_PANICKED: &str = "the host failed while running this call";

/// A call whose tool and input are known good, planned but not yet run.
pub struct Prepared {
    /// The id of its `tool_use`.
    pub id: String,
    /// Its tool, resolved once: nothing after planning looks it up again.
    pub entry: Arc<PoolEntry>,
    /// Whether it may run beside other safe calls: its input passed the
    /// schema and `plan` said so without trapping.
    pub concurrency_safe: bool,
    /// The context its questions were asked under.
    context: Arc<Value>,
    invocation: Box<dyn Invocation>,
    /// Its steps so far, for its figures.
    pub(crate) recorder: Recorder,
    /// Its `tracing` span, from planning to its result.
    pub(crate) span: tracing::Span,
}

/// A finished call: its result, its change to the shared context, and its
/// steps so far.
pub(crate) struct Finished {
    pub(crate) result: ToolResult,
    pub(crate) modifier: Option<Value>,
    pub(crate) recorder: Recorder,
    pub(crate) span: tracing::Span,
    /// Its tool.
    pub(crate) entry: Arc<PoolEntry>,
}

/// Plan one call under `context`, the shared context as it is now: resolve
/// it, refuse it when its tool needs a person and the run has no one to ask
/// (`requires-user-interaction`), hold its input to `max_input` bytes of JSON
/// text and to the schema, and ask whether it is concurrency-safe. An `Err`
/// is the call's result. Its figures are recorded when `figures` is set, or
/// a subscriber takes its span.
pub async fn prepare(
    pool: &ToolPool,
    tool_use: &ToolUse,
    context: &Arc<Value>,
    fuel: Option<&BatchFuel>,
    max_input: usize,
    figures: bool,
) -> Result<Prepared, ToolResult> {
    let fail = |message: String| ToolResult::error(&tool_use.id, message);
    let Some(entry) = pool.get(&tool_use.name) else {
        return Err(fail(unknown_tool(pool, &tool_use.name)));
    };
    let spec = entry.tool.spec();
    if spec.requires_user_interaction && !pool.permissions().is_interactive_for(&tool_use.id) {
        return Err(fail(format!(
            "{} needs a person to interact with, and this run has no one to ask",
            spec.name
        )));
    }
    let input = tool_use
        .input
        .as_ref()
        .map_err(|reason| fail(format!("Invalid input for {}: {reason}", spec.name)))?;
    let size = json_size(input);
    if size > max_input {
        let reason = input_too_large(max_input, "the input", size);
        return Err(fail(format!("Invalid input for {}: {reason}", spec.name)));
    }
    check_schema(entry, input).map_err(&fail)?;
    let span = tracing::info_span!(
        target: "keel_host::call",
        "call",
        otel.name = %spec.name,
        tool = %spec.name,
        tool_use_id = %tool_use.id,
        outcome = tracing::field::Empty,
        fuel = tracing::field::Empty,
        memory_peak = tracing::field::Empty,
    );
    let mut recorder =
        if figures || !span.is_disabled() { Recorder::new(size as u64) } else { Recorder::off() };
    let recording = recorder.is_on();
    let questions = async {
        let mut invocation = entry
            .tool
            .invoke(input.clone(), context.clone())
            .await
            .map_err(|error| fail(call_failed(&spec.name, &error)))?;
        // Before any question, so that its fuel is counted too.
        let usage = if recording { invocation.record_usage() } else { None };
        if let Some(fuel) = fuel {
            invocation.share_batch_fuel(fuel.clone());
        }
        let concurrency_safe = invocation.is_concurrency_safe().await;
        Ok((invocation, concurrency_safe, usage))
    };
    let mut steps = Steps { recorder: &mut recorder, span: &span };
    let (invocation, concurrency_safe, usage) = steps.time(Step::Questions, questions).await?;
    recorder.watch(usage);
    Ok(Prepared {
        id: tool_use.id.clone(),
        entry: entry.clone(),
        concurrency_safe,
        context: context.clone(),
        invocation,
        recorder,
        span,
    })
}

/// Whether `a` and `b` are the same context: most often the very same
/// snapshot, else equal JSON.
pub(crate) fn same_context(a: &Arc<Value>, b: &Arc<Value>) -> bool {
    Arc::ptr_eq(a, b) || a == b
}

impl Prepared {
    /// Whether its questions were asked under `context`, the one it would
    /// start with.
    pub(crate) fn planned_under(&self, context: &Arc<Value>) -> bool {
        same_context(&self.context, context)
    }

    /// Plan it again under `context`, which an earlier call's modifier made:
    /// every answer given under the old context is forgotten, and whether it
    /// is concurrency-safe is asked again.
    pub(crate) async fn replan(&mut self, context: Arc<Value>) {
        self.invocation.set_context(context.clone());
        self.context = context;
        let mut steps = Steps { recorder: &mut self.recorder, span: &self.span };
        self.concurrency_safe = steps.time(Step::Questions, self.invocation.is_concurrency_safe()).await;
    }

    /// The tool's name (the real one, when the call used an alias).
    pub fn name(&self) -> &str {
        &self.entry.tool.spec().name
    }

    /// A short phrase for a progress display.
    pub async fn activity(&mut self) -> Option<String> {
        let mut steps = Steps { recorder: &mut self.recorder, span: &self.span };
        steps.time(Step::Questions, self.invocation.activity_description()).await
    }

    /// At the call's turn: the tool's own validation, then its permission
    /// check (only when validation passed) and the host's rules, then the
    /// call itself. An interrupt stops a `cancel` call; a `block` call runs
    /// to its end.
    pub(crate) async fn run(self, pool: &ToolPool, cx: CallContext, interrupt: &Interrupt) -> Finished {
        let Prepared { id, entry, invocation, context, mut recorder, span, .. } = self;
        let (result, modifier) = {
            let steps = Steps { recorder: &mut recorder, span: &span };
            match run_steps(pool, &id, &entry, invocation, &context, cx, interrupt, steps).await {
                Ok((result, modifier)) => (result, modifier),
                Err((outcome, message)) => {
                    recorder.outcome = outcome;
                    (ToolResult::error(&id, message), None)
                }
            }
        };
        Finished { result, modifier, recorder, span, entry }
    }
}

/// Where a call's steps are recorded and traced.
pub(crate) struct Steps<'a> {
    pub(crate) recorder: &'a mut Recorder,
    pub(crate) span: &'a tracing::Span,
}

impl Steps<'_> {
    /// Run `step`, timed and inside a span of its own.
    pub(crate) fn time<F: Future>(&mut self, step: Step, work: F) -> Timed<'_, F> {
        // A call nobody traces has no step spans to enter on every poll.
        let span = (!self.span.is_disabled()).then(|| step_span(self.span, step));
        Timed { started: self.recorder.start(), recorder: self.recorder, step, span, work: Some(work) }
    }
}

pin_project_lite::pin_project! {
    /// A step's work, polled where it lies: an `async fn` taking it would
    /// move it once more, into its own state, before the first poll, and a
    /// call has five steps (README, Performance). Like
    /// [`tracing::Instrument`], it is inside its span when polled and when
    /// dropped: a sandbox dropped unfinished logs what its guest wrote.
    pub(crate) struct Timed<'a, F> {
        // `None` only as it is dropped.
        #[pin]
        work: Option<F>,
        recorder: &'a mut Recorder,
        step: Step,
        started: Option<Instant>,
        span: Option<tracing::Span>,
    }

    impl<F> PinnedDrop for Timed<'_, F> {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            let _entered = this.span.as_ref().map(tracing::Span::enter);
            this.work.set(None);
        }
    }
}

impl<F: Future> Future for Timed<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let entered = this.span.as_ref().map(tracing::Span::enter);
        let work = this.work.as_pin_mut().expect("the work is there until the step is dropped");
        let output = std::task::ready!(work.poll(cx));
        drop(entered);
        this.recorder.record(*this.step, *this.started);
        Poll::Ready(output)
    }
}

/// The span of one step of a call, a child of the call's span, made by the
/// subscriber that made the call's (the step may run on a thread whose
/// default subscriber is another, which knows no such parent).
fn step_span(call: &tracing::Span, step: Step) -> tracing::Span {
    let make = || match step {
        Step::Questions => tracing::info_span!(target: "keel_host::call", parent: call, "questions"),
        Step::Setup => tracing::info_span!(target: "keel_host::call", parent: call, "setup"),
        Step::Permission => tracing::info_span!(target: "keel_host::call", parent: call, "permission"),
        Step::Call => tracing::info_span!(target: "keel_host::call", parent: call, "tool_call"),
        Step::Budget => tracing::info_span!(target: "keel_host::call", parent: call, "budget"),
    };
    call.with_subscriber(|(_, dispatch)| tracing::dispatcher::with_default(dispatch, make))
        .unwrap_or_else(tracing::Span::none)
}

/// [`Prepared::run`]'s steps; an `Err` is how the call ended and its
/// result's text.
#[allow(clippy::too_many_arguments)]
async fn run_steps(
    pool: &ToolPool,
    id: &str,
    entry: &PoolEntry,
    mut invocation: Box<dyn Invocation>,
    context: &Arc<Value>,
    cx: CallContext,
    interrupt: &Interrupt,
    mut steps: Steps<'_>,
) -> Result<(ToolResult, Option<Value>), (Outcome, String)> {
    let spec = entry.tool.spec();
    let name = &spec.name;
    // The questions below see the context the call runs with, whoever
    // started it.
    if !same_context(context, &cx.context) {
        invocation.set_context(cx.context.clone());
    }
    // A tool that checks no input is not asked to.
    let decision = if invocation.checks_input() {
        steps
            .time(Step::Questions, async {
                if let Err(reason) = invocation.validate_input().await {
                    return Err((Outcome::Invalid, format!("Invalid input for {name}: {reason}")));
                }
                Ok(invocation.check_permissions().await)
            })
            .await?
    } else {
        PermissionDecision::Allow(None)
    };
    let tool_asks = match decision {
        PermissionDecision::Allow(None) => None,
        PermissionDecision::Allow(Some(updated)) => {
            check_schema(entry, &updated).map_err(|reason| (Outcome::Invalid, reason))?;
            invocation.set_input(updated);
            None
        }
        PermissionDecision::Deny(message) => {
            return Err((Outcome::Denied, format!("Permission to use {name} denied: {message}")));
        }
        PermissionDecision::Ask(message) => Some(message),
    };
    steps
        .time(Step::Permission, authorize(pool, id, spec, &mut *invocation, tool_asks, interrupt))
        .await
        .map_err(|message| {
            let outcome = if message == NOT_STARTED { Outcome::Interrupted } else { Outcome::Denied };
            (outcome, message)
        })?;
    let call = invocation.call(cx);
    let outcome = steps
        .time(Step::Call, async {
            match spec.interrupt {
                InterruptBehavior::Block => Some(call.await),
                // The call first: most finish in their first poll, before
                // the interrupt needs a waiter.
                InterruptBehavior::Cancel => tokio::select! {
                    biased;
                    outcome = call => Some(outcome),
                    () = interrupt.interrupted() => None,
                },
            }
        })
        .await
        .ok_or((Outcome::Interrupted, STOPPED.to_owned()))?;
    let output = outcome.map_err(|error| (outcome_of(&error), call_failed(name, &error)))?;
    steps.recorder.bytes_out = output_size(&output);
    result_of(entry, id, output).map_err(|error| (outcome_of(&error), call_failed(name, &error)))
}

/// How a call that failed with `error` ended.
fn outcome_of(error: &CallError) -> Outcome {
    match error {
        CallError::Tool(_) => Outcome::Error,
        CallError::Limit { .. } => Outcome::Limit,
        CallError::Trap(_) | CallError::Contract(_) | CallError::Host(_) => Outcome::Crashed,
    }
}

/// The bytes of an output's text and images.
fn output_size(output: &CallOutput) -> u64 {
    let blocks: usize = output
        .content
        .iter()
        .map(|block| match block {
            ContentBlock::Text(text) => text.len(),
            ContentBlock::Image(image) => image.data.len(),
        })
        .sum();
    blocks as u64
}

/// A call's output as its result: every image checked against its media
/// type, the structured value against the tool's output schema (and shown
/// as its JSON text when the tool gave no text), and text alone kept as text.
fn result_of(
    entry: &PoolEntry,
    id: &str,
    output: CallOutput,
) -> Result<(ToolResult, Option<Value>), CallError> {
    let CallOutput { mut content, structured, context_modifier } = output;
    let mut images = 0;
    for block in &content {
        if let ContentBlock::Image(image) = block {
            images += 1;
            image.check().map_err(|reason| CallError::Contract(format!("its image {images} {reason}")))?;
        }
    }
    if let Some(value) = &structured {
        let Some(schema) = &entry.output_schema else {
            return Err(CallError::Contract(
                "it returned a structured value but declares no output schema".into(),
            ));
        };
        schema.check(value).map_err(|reason| {
            CallError::Contract(format!("its structured value does not match its output schema: {reason}"))
        })?;
        if !content.iter().any(|block| matches!(block, ContentBlock::Text(_))) {
            let text = serde_json::to_string(value).expect("a JSON value serializes");
            content.insert(0, ContentBlock::Text(text));
        }
    }
    let mut result = ToolResult::ok(id, Content::from_blocks(content));
    result.structured = structured;
    Ok((result, context_modifier))
}

/// The host's permission rules on top of the tool's own answer (see
/// [`crate::permissions`]); the tool is asked for its permission subject only
/// when a rule or a prompt wants it. A call waiting for approval that is
/// interrupted never starts.
async fn authorize(
    pool: &ToolPool,
    tool_use_id: &str,
    spec: &ToolSpec,
    invocation: &mut dyn Invocation,
    tool_asks: Option<String>,
    interrupt: &Interrupt,
) -> Result<(), String> {
    let permissions = pool.permissions();
    let subject = if permissions.wants_subject(spec, tool_asks.is_some()) {
        invocation.permission_subject().await
    } else {
        None
    };
    let call = PendingCall { tool_use_id, spec, input: invocation.input(), subject, tool_asks };
    tokio::select! {
        biased;
        verdict = permissions.authorize(call) => verdict,
        () = interrupt.interrupted() => Err(NOT_STARTED.into()),
    }
}

/// The bytes of `value` as compact JSON text, counted, not kept.
pub(crate) fn json_size(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, value).expect("a JSON value serializes");
    count.0
}

fn check_schema(entry: &PoolEntry, input: &Value) -> Result<(), String> {
    let name = &entry.tool.spec().name;
    entry.schema.check(input).map_err(|reason| format!("Invalid input for {name}: {reason}"))
}

fn unknown_tool(pool: &ToolPool, name: &str) -> String {
    match pool.close_names(name).as_slice() {
        [] => format!("No such tool: {name}"),
        close => format!("No such tool: {name}. Did you mean {}?", close.join(", ")),
    }
}

fn call_failed(name: &str, error: &CallError) -> String {
    match error {
        // An error result tells the model what went wrong; an empty one
        // would tell it nothing, not even which tool failed.
        CallError::Tool(message) if message.trim().is_empty() => {
            format!("{name} failed without saying why (its error message was empty)")
        }
        CallError::Tool(message) => message.clone(),
        other => format!("{name} failed: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Logs as it is dropped, as a sandbox logs what its guest wrote.
    struct LogsWhenDropped;

    impl Drop for LogsWhenDropped {
        fn drop(&mut self) {
            tracing::info!("dropped");
        }
    }

    #[test]
    fn a_tools_empty_error_says_which_tool_failed() {
        assert_eq!(
            call_failed("grep", &CallError::Tool(" \n".into())),
            "grep failed without saying why (its error message was empty)"
        );
        assert_eq!(call_failed("grep", &CallError::Tool("no such file".into())), "no such file");
    }

    #[test]
    fn a_step_dropped_unfinished_drops_its_work_inside_its_span() {
        let log = keel_tests::Log::default();
        log.capture(|| {
            let call = tracing::info_span!("call");
            let mut recorder = Recorder::new(0);
            let mut steps = Steps { recorder: &mut recorder, span: &call };
            let held = LogsWhenDropped;
            let work = async move {
                let _held = held;
                std::future::pending::<()>().await
            };
            let mut step = Box::pin(steps.time(Step::Call, work));
            let mut cx = Context::from_waker(std::task::Waker::noop());
            assert!(step.as_mut().poll(&mut cx).is_pending());
            drop(step);
        });
        assert_eq!(log.text(), " INFO call:tool_call: dropped\n");
    }
}
