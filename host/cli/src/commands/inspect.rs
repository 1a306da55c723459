//! `keel inspect`: one plugin as keel sees it, for its author.
//!
//! It loads the component as the host would, then asks every per-input
//! question of the contract on one sample input. A question that traps is
//! answered by its conservative fallback, as in a real run; inspect says
//! which one trapped, why, and which answer applied. The host logs those
//! traps as warnings naming the export; inspect collects them instead of
//! printing them.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, Result, anyhow};
use clap::Args;
use keel_host::config::Config;
use keel_host::load::{Access, Grants, PluginGrant, PluginTool, Runtime, default_cache_dir};
use keel_host::pool::InputSchema;
use keel_host::tool::{InterruptBehavior, PermissionDecision, ResultSize, Tool as _, ToolOrigin, ToolSpec};
use keel_host::{CONTRACT_VERSION, Limits};
use serde_json::{Map, Value, json};
use tracing_subscriber::layer::SubscriberExt as _;

/// Arguments of `keel inspect`.
#[derive(Args)]
pub struct InspectArgs {
    /// The input the per-input questions are asked about, as JSON. Default:
    /// a sample made from the input schema (its required fields, each the
    /// simplest value of its type).
    #[arg(long, value_name = "JSON")]
    input: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// The workspace the grants are resolved against. Default: the current
    /// directory.
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// The configuration file. Default: `keel.toml` in the current
    /// directory, when there is one.
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Where compiled tools are cached. Default: `$KEEL_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/keel`, else `~/.cache/keel`.
    #[arg(long, value_name = "DIR", conflicts_with = "no_cache")]
    cache_dir: Option<PathBuf>,
    /// Compile afresh and cache nothing.
    #[arg(long)]
    no_cache: bool,
    /// The `.wasm` component, or the name of a tool bundled with this build
    /// (`echo`).
    #[arg(value_name = "PLUGIN")]
    plugin: PathBuf,
}

/// The exports asked about one input, in the order a call asks them, and the
/// answer each falls back to when it traps.
const PER_INPUT: &[(&str, &str)] = &[
    ("plan", "neither concurrency-safe nor read-only"),
    ("is-destructive", "true"),
    ("check", "invalid: the call is refused"),
    ("permission-subject", "none"),
    ("classifier-input", "\"\""),
    ("activity-description", "none"),
    ("is-open-world", "false"),
    ("is-search-or-read", "false"),
    ("inputs-equivalent", "JSON equality"),
];

/// The exports asked once, at load, and their fallbacks.
const AT_LOAD: &[(&str, &str)] = &[
    ("is-enabled", "false: the tool is left out of the pool"),
    ("max-result-size", "50,000 chars"),
    ("requires-user-interaction", "false"),
    ("fixed-plan", PLAN_PER_CALL),
    ("checks-input", "true: check is asked per call"),
];

/// What `fixed-plan` answers when the tool fixed no plan, and its fallback.
const PLAN_PER_CALL: &str = "none: plan is asked per call";

/// A plan as inspect shows it, asked per input or fixed at load.
fn plan_json(concurrency_safe: bool, read_only: bool) -> Value {
    json!({ "concurrency_safe": concurrency_safe, "read_only": read_only })
}

/// What one export answered.
struct Answer {
    export: &'static str,
    answer: Value,
    /// Why it trapped, when it did; the answer is then the fallback.
    trapped: Option<String>,
    fallback: &'static str,
}

/// The file of `plugin`: the path itself, or the bundled tool of that name
/// when nothing is at the path and it is a bare name.
fn plugin_file(plugin: &Path) -> Result<PathBuf> {
    if plugin.is_file() {
        return Ok(plugin.to_path_buf());
    }
    let name = plugin.to_str().filter(|name| !name.contains(['/', '.']));
    let bundled = name.and_then(|name| {
        let file =
            super::run::bundled_tools().ok()?.join(format!("keel_tool_{}.wasm", name.replace('-', "_")));
        file.is_file().then_some(file)
    });
    bundled.ok_or_else(|| {
        anyhow!(
            "no plugin at {}; pass the path of a tool's .wasm component (cargo puts it in \
             target/wasm32-wasip2/release/), or the name of a bundled tool",
            plugin.display()
        )
    })
}

/// Load the plugin, ask its questions, print what it said.
pub fn run(args: &InspectArgs) -> Result<()> {
    let plugin = &plugin_file(&args.plugin)?;
    let workspace = match &args.workspace {
        Some(dir) => dir.clone(),
        None => std::env::current_dir()?,
    };
    let workspace = workspace
        .canonicalize()
        .with_context(|| format!("failed to open workspace {}", workspace.display()))?;
    let (config, config_path) = Config::discover(args.config.as_deref(), &std::env::current_dir()?)?;
    let limits = config.limits.apply(Limits::default());
    let grants = Grants::from_config(&config.plugins, &workspace)?;
    let cache_dir = match (&args.cache_dir, args.no_cache) {
        (_, true) => None,
        (Some(dir), false) => Some(dir.clone()),
        (None, false) => default_cache_dir(),
    };
    let given_input = args
        .input
        .as_deref()
        .map(|text| serde_json::from_str::<Value>(text).context("--input is not valid JSON"))
        .transpose()?;

    let warnings = Warnings::default();
    let subscriber = tracing_subscriber::registry().with(warnings.clone());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let report = tracing::subscriber::with_default(subscriber, || {
        // A stop signal while the plugin loads or answers ends the command.
        let _entered = runtime.enter();
        let mut signals = crate::interrupt::Signals::listen()?;
        runtime.block_on(signals.or(async {
            let engine = Arc::new(Runtime::new(&limits, cache_dir)?);
            // Asked afresh: what is shown is what the plugin answers now.
            let load = PluginTool::load_fresh(&engine, plugin, &grants, &limits);
            let plugin =
                crate::progress::shown("loading the plugin (compiling it if it is new to the cache)", load)
                    .await?;
            let at_load = warnings.take();
            let spec = plugin.spec().clone();
            let input = given_input.unwrap_or_else(|| sample(&spec.input_schema));
            let schema = InputSchema::compile(&spec.input_schema)
                .map_err(|reason| anyhow!("the input schema of `{}` is invalid: {reason}", spec.name))?;
            let answers = match schema.check(&input) {
                Ok(()) => Ok(ask(&plugin, &input, &warnings).await),
                Err(reason) => Err(reason),
            };
            anyhow::Ok(Report { plugin, spec, at_load, input, answers })
        }))
    });
    let report = crate::interrupt::end(runtime, report)?;
    let grant = grants.for_tool(&report.spec.name);
    let origin =
        config_path.map_or_else(|| "defaults; no keel.toml".to_string(), |path| path.display().to_string());
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report.to_json(plugin, &grant))?)?;
    } else {
        // What a plugin says of itself (its description, aliases, answers)
        // reaches the terminal with its control characters escaped, so that
        // it cannot clear the screen or fake a line of the report; its
        // lines stay lines.
        let text = report.to_text(plugin, &grant, &origin);
        let lines: Vec<_> = text.split('\n').map(super::printable).collect();
        out!("{}", lines.join("\n"))?;
    }
    Ok(())
}

/// Ask every per-input question of `input`, in one invocation as a call
/// does, noting which trapped.
async fn ask(plugin: &PluginTool, input: &Value, warnings: &Warnings) -> Vec<Answer> {
    let mut answers = Vec::new();
    let context = Arc::new(keel_host::context::initial());
    let mut call = match plugin.invoke(input.clone(), context).await {
        Ok(call) => call,
        Err(error) => {
            let trapped = Some(error.to_string());
            return PER_INPUT
                .iter()
                .map(|&(export, fallback)| Answer {
                    export,
                    answer: Value::Null,
                    trapped: trapped.clone(),
                    fallback,
                })
                .collect();
        }
    };
    let record = |answers: &mut Vec<Answer>, export: &'static str, answer: Value| {
        let fallback =
            PER_INPUT.iter().find(|(name, _)| *name == export).map_or("", |(_, fallback)| fallback);
        answers.push(Answer { export, answer, trapped: None, fallback });
    };
    let plan = plan_json(call.is_concurrency_safe().await, call.is_read_only().await);
    record(&mut answers, "plan", plan);
    record(&mut answers, "is-destructive", json!(call.is_destructive().await));
    let check = match call.validate_input().await {
        Err(reason) => json!({ "invalid": reason }),
        Ok(()) => match call.check_permissions().await {
            PermissionDecision::Allow(None) => json!("allow"),
            PermissionDecision::Allow(Some(updated)) => json!({ "allow_with_input": updated }),
            PermissionDecision::Deny(message) => json!({ "deny": message }),
            PermissionDecision::Ask(message) => json!({ "ask": message }),
        },
    };
    record(&mut answers, "check", check);
    record(&mut answers, "permission-subject", json!(call.permission_subject().await));
    record(&mut answers, "classifier-input", json!(call.classifier_input().await));
    record(&mut answers, "activity-description", json!(call.activity_description().await));
    record(&mut answers, "is-open-world", json!(call.is_open_world().await));
    record(&mut answers, "is-search-or-read", json!(call.is_search_or_read().await));
    drop(call);
    record(&mut answers, "inputs-equivalent", json!(plugin.inputs_equivalent(input, input).await));
    let trapped = warnings.take();
    for answer in &mut answers {
        answer.trapped = trapped.get(answer.export).and_then(Value::as_str).map(str::to_string);
    }
    answers
}

/// Everything inspect found out.
struct Report {
    plugin: PluginTool,
    spec: ToolSpec,
    /// Exports asked at load that trapped, and why.
    at_load: Map<String, Value>,
    input: Value,
    /// The answers, or why the input does not pass the schema.
    answers: Result<Vec<Answer>, String>,
}

impl Report {
    fn load_answers(&self) -> Vec<Answer> {
        let spec = &self.spec;
        let max = match spec.max_result_size {
            ResultSize::Chars(chars) => json!(chars),
            ResultSize::SelfBounded => json!("none"),
        };
        let fixed_plan = self
            .plugin
            .fixed_plan()
            .map(|(concurrency_safe, read_only)| plan_json(concurrency_safe, read_only));
        [
            ("is-enabled", json!(spec.enabled)),
            ("max-result-size", max),
            ("requires-user-interaction", json!(spec.requires_user_interaction)),
            ("fixed-plan", json!(fixed_plan)),
            ("checks-input", json!(self.plugin.checks_input())),
        ]
        .into_iter()
        .zip(AT_LOAD)
        .map(|((export, answer), &(_, fallback))| Answer {
            export,
            answer,
            trapped: self.at_load.get(export).and_then(Value::as_str).map(str::to_string),
            fallback,
        })
        .collect()
    }

    fn to_json(&self, path: &Path, grant: &PluginGrant) -> Value {
        let answers = |answers: &[Answer]| -> Value {
            answers
                .iter()
                .map(|answer| {
                    let mut entry = json!({ "export": answer.export, "answer": answer.answer });
                    if let Some(reason) = &answer.trapped {
                        entry["trapped"] = json!(reason);
                        entry["fallback"] = json!(answer.fallback);
                    }
                    entry
                })
                .collect()
        };
        let report = self.plugin.load_report();
        let mut out = json!({
            "path": path.display().to_string(),
            "contract": self.contract(),
            "tool": self.spec,
            "size": report.size,
            "compile_ms": report.compile_time.as_millis() as u64,
            "from_cache": report.from_cache,
            "at_load": answers(&self.load_answers()),
            "input": self.input,
            "grant": grant_json(grant),
        });
        match &self.answers {
            Ok(list) => out["answers"] = answers(list),
            Err(reason) => out["input_error"] = json!(reason),
        }
        out
    }

    /// The contract version the plugin was built against.
    fn contract(&self) -> &'static str {
        match self.spec.origin {
            ToolOrigin::Plugin { contract, .. } => contract,
            ToolOrigin::BuiltIn => CONTRACT_VERSION,
        }
    }

    fn to_text(&self, path: &Path, grant: &PluginGrant, config: &str) -> String {
        let spec = &self.spec;
        let report = self.plugin.load_report();
        let mut out = String::new();
        let none = |list: &[String]| if list.is_empty() { "(none)".to_string() } else { list.join(", ") };
        let _ = writeln!(out, "{} ({})", spec.name, path.display());
        let mut field = |name: &str, value: &str| {
            let _ = writeln!(out, "  {name:<14}{value}");
        };
        field("aliases", &none(&spec.aliases));
        field("description", &spec.description);
        if !spec.prompt.is_empty() {
            field("prompt", &spec.prompt);
        }
        if spec.user_facing_name != spec.name {
            field("shown as", &spec.user_facing_name);
        }
        let contract = self.contract();
        let newest = match contract {
            newest if newest == CONTRACT_VERSION => String::new(),
            "0.2.0" => format!(" (older than {CONTRACT_VERSION}: its questions do not see the context)"),
            _ => format!(" (older than {CONTRACT_VERSION}: asked its plan and check on every call)"),
        };
        field("contract", &format!("keel:tool@{contract}{newest}"));
        field("size", &format!("{} bytes", group(report.size)));
        let source = if report.from_cache { "loaded from the compile cache" } else { "compiled" };
        field("compile", &format!("{} ms, {source}", report.compile_time.as_millis()));
        let interrupt = match spec.interrupt {
            InterruptBehavior::Cancel => "cancel: an interrupt stops a running call",
            InterruptBehavior::Block => "block: a running call finishes",
        };
        field("interrupt", interrupt);
        if let Some(hint) = &spec.search_hint {
            field("search hint", hint);
        }
        let deferral = match (spec.should_defer, spec.always_load) {
            (true, false) => "deferred: listed by name until ToolSearch finds it",
            (_, true) => "always loaded in full",
            (false, false) => "listed in full",
        };
        field("listing", deferral);
        if spec.strict {
            field("strict", "yes: the provider holds input to the schema");
        }
        let _ = writeln!(out, "\ninput schema\n{}", indent(&pretty(&spec.input_schema)));
        if let Some(schema) = &spec.output_schema {
            let _ = writeln!(out, "\noutput schema\n{}", indent(&pretty(schema)));
        }
        let _ = writeln!(out, "\nanswers at load");
        write_answers(&mut out, &self.load_answers());
        let _ = writeln!(out, "\nanswers for the input {}", self.input);
        match &self.answers {
            Ok(answers) => write_answers(&mut out, answers),
            Err(reason) => {
                let _ = writeln!(
                    out,
                    "  not asked: the input does not pass the schema: {reason}\n  \
                     pass one that does with --input '<json>'"
                );
            }
        }
        let _ = writeln!(out, "\ncapabilities granted ({config})");
        for line in grant_lines(grant) {
            let _ = writeln!(out, "  {line}");
        }
        out
    }
}

fn write_answers(out: &mut String, answers: &[Answer]) {
    for answer in answers {
        // Free text is quoted, so that spaces at its ends show.
        let free_text =
            matches!(answer.export, "permission-subject" | "classifier-input" | "activity-description");
        let shown = match &answer.answer {
            Value::Null if answer.export == "fixed-plan" => PLAN_PER_CALL.into(),
            Value::Null => "none".into(),
            Value::String(text) if !free_text => text.clone(),
            other => other.to_string(),
        };
        let _ = match &answer.trapped {
            None => writeln!(out, "  {:<26}{shown}", answer.export),
            Some(reason) => {
                writeln!(
                    out,
                    "  {:<26}TRAPPED, so {} (the fallback): {reason}",
                    answer.export, answer.fallback
                )
            }
        };
    }
}

fn grant_lines(grant: &PluginGrant) -> Vec<String> {
    let access = |access: Access| match access {
        Access::ReadOnly => "read-only",
        Access::ReadWrite => "read-write",
    };
    let workspace = match grant.workspace_access {
        Access::ReadWrite => "read-write for calls that are not read-only, read-only for those that are",
        Access::ReadOnly => "read-only for every call",
    };
    let mut lines = vec![format!("workspace   {} at /workspace, {workspace}", grant.workspace.display())];
    for dir in &grant.dirs {
        lines.push(format!("directory   {} at {}, {}", dir.host.display(), dir.mount, access(dir.access)));
    }
    let env: Vec<&str> = grant.env.iter().map(|(name, _)| name.as_str()).collect();
    lines.push(format!("environment {}", if env.is_empty() { "(none)".into() } else { env.join(", ") }));
    let network: Vec<String> = grant.network.rules().iter().map(ToString::to_string).collect();
    lines
        .push(format!("network     {}", if network.is_empty() { "none".into() } else { network.join(", ") }));
    for secret in grant.network.secrets() {
        lines.push(format!(
            "secret      {} header for {}, added by the host",
            secret.header(),
            secret.origin()
        ));
    }
    let trusted = if grant.trusted {
        "yes: a max-result-size of none is honoured"
    } else {
        "no: a max-result-size of none is clamped"
    };
    lines.push(format!("trusted     {trusted}"));
    lines
}

fn grant_json(grant: &PluginGrant) -> Value {
    let access = |access: Access| match access {
        Access::ReadOnly => "read-only",
        Access::ReadWrite => "read-write",
    };
    json!({
        "workspace": grant.workspace.display().to_string(),
        "workspace_access": access(grant.workspace_access),
        "dirs": grant.dirs.iter().map(|dir| json!({
            "path": dir.host.display().to_string(),
            "mount": dir.mount,
            "access": access(dir.access),
        })).collect::<Vec<_>>(),
        "env": grant.env.iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>(),
        "network": grant.network.rules().iter().map(ToString::to_string).collect::<Vec<_>>(),
        "secrets": grant.network.secrets().iter().map(|secret| json!({
            "origin": secret.origin().to_string(),
            "header": secret.header().as_str(),
        })).collect::<Vec<_>>(),
        "trusted": grant.trusted,
    })
}

/// A sample input from a schema: its required properties, each the
/// simplest value of its type (the first of an `enum`, a `const`, the
/// `minimum` of a number).
fn sample(schema: &Value) -> Value {
    sample_at(schema, schema, 0)
}

fn sample_at(root: &Value, schema: &Value, depth: usize) -> Value {
    if depth > 16 {
        return Value::Null;
    }
    let Some(schema) = schema.as_object() else { return Value::Null };
    if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
        let target = reference.strip_prefix('#').and_then(|pointer| root.pointer(pointer));
        return target.map_or(Value::Null, |target| sample_at(root, target, depth + 1));
    }
    if let Some(value) = schema.get("const") {
        return value.clone();
    }
    if let Some(first) = schema.get("enum").and_then(Value::as_array).and_then(|values| values.first()) {
        return first.clone();
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(first) = schema.get(key).and_then(Value::as_array).and_then(|list| list.first()) {
            return sample_at(root, first, depth + 1);
        }
    }
    let kind = match schema.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        Some(Value::Array(kinds)) => {
            kinds.iter().filter_map(Value::as_str).find(|kind| *kind != "null").unwrap_or("null")
        }
        _ if schema.contains_key("properties") => "object",
        _ => "null",
    };
    match kind {
        "object" => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let required = schema.get("required").and_then(Value::as_array).into_iter().flatten();
            let fields = required.filter_map(Value::as_str).map(|name| {
                let property = properties.and_then(|properties| properties.get(name)).unwrap_or(&Value::Null);
                (name.to_string(), sample_at(root, property, depth + 1))
            });
            Value::Object(fields.collect())
        }
        "string" => json!(""),
        "integer" | "number" => schema.get("minimum").cloned().unwrap_or(json!(0)),
        "boolean" => json!(false),
        "array" => json!([]),
        _ => Value::Null,
    }
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).expect("JSON values serialize")
}

fn indent(text: &str) -> String {
    text.lines().map(|line| format!("  {line}")).collect::<Vec<_>>().join("\n")
}

/// `1234567` as `1,234,567`.
fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (at, digit) in digits.chars().enumerate() {
        if at > 0 && (digits.len() - at).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// The warnings the host logs while inspect runs: each trapped export, as
/// ``"`<export>` failed, using the conservative answer: <why>"``.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl Warnings {
    /// The exports that trapped since the last call, with why.
    fn take(&self) -> Map<String, Value> {
        let messages = std::mem::take(&mut *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        let mut trapped = Map::new();
        for message in messages {
            let parsed = message
                .strip_prefix('`')
                .and_then(|rest| rest.split_once("` failed, using the conservative answer: "));
            match parsed {
                Some((export, reason)) => {
                    trapped.entry(export.to_string()).or_insert_with(|| json!(reason));
                }
                None => eprintln!("warning: {message}"),
            }
        }
        trapped
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _context: tracing_subscriber::layer::Context<'_, S>) {
        if *event.metadata().level() > tracing::Level::WARN {
            return;
        }
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(message.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_fills_required_fields_with_the_simplest_values() {
        let schema = json!({
            "type": "object",
            "properties": {
                "pattern": { "type": "string" },
                "rounds": { "type": ["integer", "null"], "minimum": 1 },
                "mode": { "$ref": "#/$defs/Mode" },
                "optional": { "type": "string" }
            },
            "required": ["pattern", "rounds", "mode"],
            "$defs": { "Mode": { "enum": ["fast", "slow"] } }
        });
        assert_eq!(sample(&schema), json!({ "pattern": "", "rounds": 1, "mode": "fast" }));
    }

    #[test]
    fn sizes_are_grouped_by_thousands() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(group(1234567), "1,234,567");
    }
}
