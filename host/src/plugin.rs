//! Loading WASM plugins, and running their calls in fresh sandboxes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use wasmtime::component::types::ComponentItem;

use crate::bindings::{self, CONTRACT_VERSION, GUEST_INTERFACE, ToolPre};
use crate::engine::{Runtime, root_cause};
use crate::error::{Error, Result};
use crate::limits::Limits;
use crate::sandbox::{Grant, QUERY_DEADLINE, QUERY_FUEL, Sandbox, SandboxState};
use crate::tool::{
    CallContext, CallError, CallOutput, InterruptBehavior, Invocation, PermissionDecision, ResultSize, Tool,
    ToolOrigin, ToolSpec,
};

/// Ask one question of the guest in the current sandbox, creating it when
/// there is none. A trap, a limit or a timeout logs a warning naming the
/// plugin, discards the sandbox (a trapped instance is never entered again),
/// and gives `$fallback`.
macro_rules! ask {
    ($questions:expr, $export:literal, $fallback:expr, |$guest:ident, $store:ident| $call:expr) => {{
        let questions = &mut $questions;
        let shared: &Shared = questions.shared;
        let answer = match questions.live().await {
            Ok(sandbox) => {
                let $guest = sandbox.tool.keel_tool_guest();
                let $store = &mut sandbox.store;
                let limit = QUERY_DEADLINE + crate::engine::EPOCH_TICK * 10;
                match tokio::time::timeout(limit, $call).await {
                    Ok(Ok(answer)) => Ok(answer),
                    Ok(Err(error)) => Err(sandbox.classify(&error, &shared.limits, QUERY_FUEL)),
                    Err(_) => Err(CallError::Limit {
                        kind: crate::limits::LimitKind::Deadline,
                        value: format!("{QUERY_DEADLINE:?}"),
                    }),
                }
            }
            Err(error) => Err(error),
        };
        match answer {
            Ok(answer) => answer,
            Err(error) => {
                tracing::warn!(plugin = %shared.name, "`{}` failed, using the conservative answer: {error}", $export);
                questions.sandbox = None;
                $fallback
            }
        }
    }};
}

/// Characters of output before persisting, for a tool that does not say.
pub const DEFAULT_MAX_RESULT_SIZE_CHARS: u64 = 50_000;

const WASM_MAGIC: &[u8] = b"\0asm";
const CORE_MODULE_VERSION: [u8; 4] = [1, 0, 0, 0];

/// How a plugin was loaded: for `keel inspect` and for tests of the cache.
#[derive(Clone, Debug)]
pub struct LoadReport {
    /// Whether compiled code came from the compile cache.
    pub from_cache: bool,
    /// How long compiling or loading the code took.
    pub compile_time: Duration,
    /// Size of the component file in bytes.
    pub size: u64,
}

/// A tool implemented by a WASM component.
pub struct PluginTool {
    spec: ToolSpec,
    shared: Arc<Shared>,
    report: LoadReport,
}

/// What every call of one plugin needs.
struct Shared {
    pre: ToolPre<SandboxState>,
    name: Arc<str>,
    limits: Limits,
    workspace: PathBuf,
}

impl PluginTool {
    /// Load the component at `path`: check it, compile it (or take it from
    /// the cache), and read its metadata once.
    pub async fn load(runtime: &Runtime, path: &Path, workspace: &Path, limits: &Limits) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|error| Error::io("read", path, error))?;
        check_header(path, &bytes)?;
        let compiled = runtime.compile(path, &bytes)?;
        check_contract(runtime, path, &compiled.component)?;
        let instance_pre = runtime
            .linker()
            .instantiate_pre(&compiled.component)
            .map_err(|error| Error::plugin(path, format!("cannot be linked: {}", root_cause(&error))))?;
        let pre = ToolPre::new(instance_pre).map_err(|error| {
            Error::plugin(path, format!("does not export the keel tool contract: {}", root_cause(&error)))
        })?;
        let file_name =
            path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        let mut shared = Shared {
            pre,
            name: file_name.into(),
            limits: limits.clone(),
            workspace: workspace.to_path_buf(),
        };
        let spec = read_spec(&mut shared, path).await?;
        shared.name = spec.name.as_str().into();
        let report = LoadReport {
            from_cache: compiled.from_cache,
            compile_time: compiled.time,
            size: bytes.len() as u64,
        };
        Ok(PluginTool { spec, shared: Arc::new(shared), report })
    }

    /// How the plugin was loaded.
    pub fn load_report(&self) -> &LoadReport {
        &self.report
    }
}

fn check_header(path: &Path, bytes: &[u8]) -> Result<()> {
    if bytes.len() < 8 || &bytes[..4] != WASM_MAGIC {
        return Err(Error::plugin(path, "not a WebAssembly file (no `\\0asm` header)"));
    }
    if bytes[4..8] == CORE_MODULE_VERSION {
        return Err(Error::plugin(
            path,
            "is a core WebAssembly module, not a component; build the tool with \
             `cargo build --target wasm32-wasip2` and the keel-guest SDK",
        ));
    }
    Ok(())
}

/// Refuse a component built against another contract version by name, before
/// a link error would say it less clearly.
fn check_contract(runtime: &Runtime, path: &Path, component: &wasmtime::component::Component) -> Result<()> {
    let exports: Vec<String> = component
        .component_type()
        .exports(runtime.engine())
        .filter(|(_, item)| matches!(item.ty, ComponentItem::ComponentInstance(_)))
        .map(|(name, _)| name.to_string())
        .collect();
    if exports.iter().any(|name| name == GUEST_INTERFACE) {
        return Ok(());
    }
    let (interface, _) = GUEST_INTERFACE.split_once('@').expect("the interface name has a version");
    if let Some(other) = exports.iter().find_map(|name| name.strip_prefix(interface)?.strip_prefix('@')) {
        return Err(Error::plugin(
            path,
            format!(
                "was built against keel tool contract {other}, but this host speaks {CONTRACT_VERSION}; \
                 rebuild the tool with a keel-guest of contract {CONTRACT_VERSION}"
            ),
        ));
    }
    let found = if exports.is_empty() { "nothing".to_string() } else { exports.join(", ") };
    Err(Error::plugin(
        path,
        format!("does not export `{GUEST_INTERFACE}` (it exports {found}); is it a keel tool?"),
    ))
}

/// Read the input-independent facts of the tool, once, in fresh instances:
/// a trap in `metadata` fails the load, a trap elsewhere gives the fallback.
async fn read_spec(shared: &mut Shared, path: &Path) -> Result<ToolSpec> {
    let mut questions = Questions::new(shared, Grant::Nothing);
    let metadata = match questions.live().await {
        Ok(sandbox) => {
            let result = sandbox.tool.keel_tool_guest().call_metadata(&mut sandbox.store).await;
            result.map_err(|error| sandbox.classify(&error, &shared.limits, QUERY_FUEL))
        }
        Err(error) => Err(error),
    }
    .map_err(|error| Error::plugin(path, format!("`metadata` failed: {error}")))?;
    questions.sandbox = None;

    let enabled = ask!(questions, "is-enabled", false, |guest, store| guest.call_is_enabled(store));
    let max_result_size =
        ask!(questions, "max-result-size", Some(DEFAULT_MAX_RESULT_SIZE_CHARS), |guest, store| {
            guest.call_max_result_size(store)
        });
    let requires_user_interaction = ask!(questions, "requires-user-interaction", false, |guest, store| {
        guest.call_requires_user_interaction(store)
    });
    spec_from_metadata(path, metadata, enabled, max_result_size, requires_user_interaction)
}

fn spec_from_metadata(
    path: &Path,
    metadata: bindings::ToolMetadata,
    enabled: bool,
    max_result_size: Option<u64>,
    requires_user_interaction: bool,
) -> Result<ToolSpec> {
    let name_ok = !metadata.name.is_empty()
        && metadata.name.len() <= 64
        && metadata.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !name_ok {
        return Err(Error::plugin(
            path,
            format!("tool name {:?} must be 1 to 64 letters, digits, `_` or `-`", metadata.name),
        ));
    }
    let parse = |what: &str, text: &str| {
        serde_json::from_str::<Value>(text).map_err(|error| {
            Error::plugin(path, format!("{what} of `{}` is not valid JSON: {error}", metadata.name))
        })
    };
    let input_schema = parse("the input schema", &metadata.input_schema)?;
    let output_schema =
        metadata.output_schema.as_deref().map(|text| parse("the output schema", text)).transpose()?;
    let user_facing_name =
        if metadata.user_facing_name.is_empty() { metadata.name.clone() } else { metadata.user_facing_name };
    Ok(ToolSpec {
        name: metadata.name,
        aliases: metadata.aliases,
        description: metadata.description,
        prompt: metadata.prompt,
        input_schema,
        output_schema,
        search_hint: metadata.search_hint,
        should_defer: metadata.should_defer,
        always_load: metadata.always_load,
        strict: metadata.strict,
        interrupt: match metadata.interrupt_behavior {
            bindings::InterruptBehavior::Cancel => InterruptBehavior::Cancel,
            bindings::InterruptBehavior::Block => InterruptBehavior::Block,
        },
        user_facing_name,
        enabled,
        max_result_size: max_result_size.map_or(ResultSize::SelfBounded, ResultSize::Chars),
        requires_user_interaction,
        origin: ToolOrigin::Plugin { path: path.to_path_buf() },
        trusted: false,
    })
}

/// A sandbox for asking questions, replaced whenever one traps.
struct Questions<'a> {
    shared: &'a Shared,
    grant: Grant,
    sandbox: Option<Sandbox>,
}

impl<'a> Questions<'a> {
    fn new(shared: &'a Shared, grant: Grant) -> Self {
        Questions { shared, grant, sandbox: None }
    }

    async fn live(&mut self) -> Result<&mut Sandbox, CallError> {
        if self.sandbox.is_none() {
            let shared = self.shared;
            let sandbox =
                Sandbox::new(&shared.pre, shared.name.clone(), &shared.limits, &shared.workspace, self.grant)
                    .await?;
            self.sandbox = Some(sandbox);
        }
        Ok(self.sandbox.as_mut().expect("just created"))
    }
}

#[async_trait]
impl Tool for PluginTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, input: Value) -> Result<Box<dyn Invocation>, CallError> {
        Ok(Box::new(PluginInvocation {
            shared: self.shared.clone(),
            input_text: input.to_string(),
            input,
            read_only: None,
            sandbox: None,
        }))
    }

    async fn inputs_equivalent(&self, a: &Value, b: &Value) -> bool {
        let mut questions = Questions::new(&self.shared, Grant::Nothing);
        let (a, b) = (a.to_string(), b.to_string());
        let fallback = a == b;
        ask!(questions, "inputs-equivalent", fallback, |guest, store| guest
            .call_inputs_equivalent(store, &a, &b))
    }
}

/// One call of a plugin. Its questions and its call share one sandbox while
/// nothing traps; the workspace is granted only once `is-read-only` has been
/// answered, read-only when the answer is true.
struct PluginInvocation {
    shared: Arc<Shared>,
    input: Value,
    input_text: String,
    read_only: Option<bool>,
    sandbox: Option<Sandbox>,
}

impl PluginInvocation {
    /// The call's grant follows its `is-read-only` answer; asking it first, in
    /// a sandbox with no filesystem, means no guest code has seen the
    /// workspace before the grant is fixed.
    async fn decide_grant(&mut self) -> bool {
        if let Some(read_only) = self.read_only {
            return read_only;
        }
        let mut questions =
            Questions { shared: &self.shared, grant: Grant::Nothing, sandbox: self.sandbox.take() };
        let input = &self.input_text;
        let read_only =
            ask!(questions, "is-read-only", false, |guest, store| guest.call_is_read_only(store, input));
        let grant = if read_only { Grant::ReadOnly } else { Grant::ReadWrite };
        self.sandbox = match questions.sandbox {
            Some(mut sandbox) => match sandbox.regrant(&self.shared.workspace, grant) {
                Ok(()) => Some(sandbox),
                Err(_) => None,
            },
            None => None,
        };
        self.read_only = Some(read_only);
        read_only
    }

    fn grant(&self) -> Grant {
        match self.read_only {
            Some(true) => Grant::ReadOnly,
            _ => Grant::ReadWrite,
        }
    }

    fn questions(&mut self) -> Questions<'_> {
        Questions { shared: &self.shared, grant: self.grant(), sandbox: self.sandbox.take() }
    }
}

/// Ask a per-input question: decide the grant first, then ask in the
/// invocation's sandbox, keeping it for the next question unless it trapped.
macro_rules! ask_input {
    ($self:ident, $export:literal, $fallback:expr, |$guest:ident, $store:ident, $input:ident| $call:expr) => {{
        $self.decide_grant().await;
        let input = $self.input_text.clone();
        let mut questions = $self.questions();
        let $input = input.as_str();
        let answer = ask!(questions, $export, $fallback, |$guest, $store| $call);
        let sandbox = questions.sandbox.take();
        $self.sandbox = sandbox;
        answer
    }};
}

#[async_trait]
impl Invocation for PluginInvocation {
    fn input(&self) -> &Value {
        &self.input
    }

    fn set_input(&mut self, input: Value) {
        self.input_text = input.to_string();
        self.input = input;
    }

    async fn is_read_only(&mut self) -> bool {
        self.decide_grant().await
    }

    fn park(&mut self) {
        self.sandbox = None;
    }

    async fn is_concurrency_safe(&mut self) -> bool {
        ask_input!(self, "is-concurrency-safe", false, |g, s, i| g.call_is_concurrency_safe(s, i))
    }

    async fn is_destructive(&mut self) -> bool {
        ask_input!(self, "is-destructive", true, |g, s, i| g.call_is_destructive(s, i))
    }

    async fn validate_input(&mut self) -> Result<(), String> {
        let trapped = Err("the tool's input check failed; the call was refused".to_string());
        ask_input!(self, "validate-input", trapped, |g, s, i| g.call_validate_input(s, i))
    }

    async fn check_permissions(&mut self) -> PermissionDecision {
        let trapped = bindings::PermissionDecision::Deny(
            "the tool's permission check failed; the call was refused".into(),
        );
        let decision =
            ask_input!(self, "check-permissions", trapped, |g, s, i| g.call_check_permissions(s, i));
        match decision {
            bindings::PermissionDecision::Allow(None) => PermissionDecision::Allow(None),
            bindings::PermissionDecision::Allow(Some(text)) => match serde_json::from_str(&text) {
                Ok(updated) => PermissionDecision::Allow(Some(updated)),
                Err(error) => PermissionDecision::Deny(format!(
                    "the tool's permission check returned an updated input that is not JSON: {error}"
                )),
            },
            bindings::PermissionDecision::Deny(message) => PermissionDecision::Deny(message),
            bindings::PermissionDecision::Ask(message) => PermissionDecision::Ask(message),
        }
    }

    async fn permission_subject(&mut self) -> Option<String> {
        ask_input!(self, "permission-subject", None, |g, s, i| g.call_permission_subject(s, i))
    }

    async fn classifier_input(&mut self) -> String {
        ask_input!(self, "classifier-input", String::new(), |g, s, i| g.call_classifier_input(s, i))
    }

    async fn activity_description(&mut self) -> Option<String> {
        ask_input!(self, "activity-description", None, |g, s, i| g.call_activity_description(s, i))
    }

    async fn is_open_world(&mut self) -> bool {
        ask_input!(self, "is-open-world", false, |g, s, i| g.call_is_open_world(s, i))
    }

    async fn is_search_or_read(&mut self) -> bool {
        ask_input!(self, "is-search-or-read", false, |g, s, i| g.call_is_search_or_read(s, i))
    }

    async fn call(mut self: Box<Self>, cx: CallContext) -> Result<CallOutput, CallError> {
        self.decide_grant().await;
        let shared = self.shared.clone();
        let limits = &shared.limits;
        let mut sandbox = match self.sandbox.take() {
            Some(sandbox) => sandbox,
            None => {
                Sandbox::new(&shared.pre, shared.name.clone(), limits, &shared.workspace, self.grant())
                    .await?
            }
        };
        sandbox.budget(limits.fuel, limits.deadline)?;
        sandbox.report_progress_to(cx.progress.clone());
        let context = cx.context.to_string();
        // The epoch deadline stops guest code; this timeout also stops a call
        // blocked in a host function, which the epoch cannot interrupt.
        let outcome = {
            let guest = sandbox.tool.keel_tool_guest();
            let call = guest.call_call(&mut sandbox.store, &self.input_text, &context);
            tokio::time::timeout(limits.deadline + crate::engine::EPOCH_TICK * 10, call).await
        };
        match outcome {
            Err(_) => Err(CallError::Limit {
                kind: crate::limits::LimitKind::Deadline,
                value: format!("{:?}", limits.deadline),
            }),
            Ok(Err(error)) => Err(sandbox.classify(&error, limits, limits.fuel)),
            Ok(Ok(Err(message))) => Err(CallError::Tool(message)),
            Ok(Ok(Ok(output))) => {
                let context_modifier = match output.context_modifier {
                    None => None,
                    Some(text) => match serde_json::from_str::<Value>(&text) {
                        Ok(patch @ Value::Object(_)) => Some(patch),
                        Ok(_) => {
                            return Err(CallError::Contract(
                                "its context modifier is not a JSON object".into(),
                            ));
                        }
                        Err(error) => {
                            return Err(CallError::Contract(format!(
                                "its context modifier is not JSON: {error}"
                            )));
                        }
                    },
                };
                Ok(CallOutput { content: output.content, context_modifier })
            }
        }
    }
}

/// Load every `.wasm` file of `path` (a file, or a directory read in sorted
/// order, not recursively).
pub fn plugin_files(path: &Path) -> Result<Vec<PathBuf>> {
    let metadata = std::fs::metadata(path).map_err(|error| Error::io("read", path, error))?;
    if metadata.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let entries = std::fs::read_dir(path).map_err(|error| Error::io("read", path, error))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|error| Error::io("read", path, error))?;
        let file = entry.path();
        if file.extension().is_some_and(|ext| ext == "wasm") && file.is_file() {
            files.push(file);
        }
    }
    files.sort();
    Ok(files)
}
