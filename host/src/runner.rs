//! Running a batch: every `tool_use` gets exactly one `tool_result`, in order.
//!
//! For each call: resolve the name, check the input against the schema, ask
//! the tool's own `validate-input`, then `check-permissions`, then run it in a
//! fresh sandbox. Calls run one at a time, in order, and each sees the context
//! changes of the ones before it.

use serde_json::Value;

use crate::batch::{ToolResult, ToolUse};
use crate::context;
use crate::pool::{PoolEntry, ToolPool};
use crate::tool::{CallContext, CallError, Invocation, PermissionDecision};

/// What running a batch produced.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchOutcome {
    /// One result per `tool_use`, in the order of the batch.
    pub results: Vec<ToolResult>,
    /// The shared context after every modifier was applied.
    pub context: Value,
}

/// A call that passed every check, ready to run.
pub struct Prepared {
    /// The id of its `tool_use`.
    pub id: String,
    /// The name the model used.
    pub name: String,
    invocation: Box<dyn Invocation>,
    /// Whether it may run beside other safe calls.
    pub concurrency_safe: bool,
}

/// Check one call up to the point where it can run; an `Err` is its result.
pub async fn prepare(pool: &ToolPool, tool_use: &ToolUse) -> Result<Prepared, ToolResult> {
    let fail = |message: String| ToolResult::error(&tool_use.id, message);
    let Some(entry) = pool.get(&tool_use.name) else {
        return Err(fail(unknown_tool(pool, &tool_use.name)));
    };
    let name = &entry.tool.spec().name;
    let input =
        tool_use.input.as_ref().map_err(|reason| fail(format!("Invalid input for {name}: {reason}")))?;
    check_schema(entry, input).map_err(&fail)?;
    let mut invocation =
        entry.tool.invoke(input.clone()).await.map_err(|error| fail(call_failed(name, &error)))?;
    if let Err(reason) = invocation.validate_input().await {
        return Err(fail(format!("Invalid input for {name}: {reason}")));
    }
    match invocation.check_permissions().await {
        PermissionDecision::Allow(None) => {}
        PermissionDecision::Allow(Some(updated)) => {
            check_schema(entry, &updated).map_err(&fail)?;
            invocation.set_input(updated);
        }
        PermissionDecision::Deny(message) => {
            return Err(fail(format!("Permission to use {name} denied: {message}")));
        }
        PermissionDecision::Ask(message) => {
            return Err(fail(format!(
                "{name} requires approval, and no one can be asked in this run: {message}"
            )));
        }
    }
    let concurrency_safe = invocation.is_concurrency_safe().await;
    Ok(Prepared { id: tool_use.id.clone(), name: name.clone(), invocation, concurrency_safe })
}

impl Prepared {
    /// Run the call with the shared `context`.
    pub async fn run(self, cx: CallContext) -> (ToolResult, Option<Value>) {
        match self.invocation.call(cx).await {
            Ok(output) => (ToolResult::ok(&self.id, output.content), output.context_modifier),
            Err(error) => (ToolResult::error(&self.id, call_failed(&self.name, &error)), None),
        }
    }
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
        CallError::Tool(message) => message.clone(),
        other => format!("{name} failed: {other}"),
    }
}

/// Run `uses` one at a time, in order, starting from `context`.
pub async fn run_in_order(pool: &ToolPool, uses: &[ToolUse], mut context: Value) -> BatchOutcome {
    let mut results = Vec::with_capacity(uses.len());
    for tool_use in uses {
        let result = match prepare(pool, tool_use).await {
            Err(result) => result,
            Ok(prepared) => {
                let (result, modifier) = prepared.run(CallContext::new(context.clone())).await;
                if let Some(patch) = modifier {
                    context::apply(&mut context, &patch);
                }
                result
            }
        };
        results.push(result);
    }
    BatchOutcome { results, context }
}
