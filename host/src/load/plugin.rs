//! Loading WASM plugins, and running their calls in fresh sandboxes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::Instrument as _;
use wasmtime::component::types::ComponentItem;

use crate::content::{ContentBlock, Image};
use crate::contract::{
    DEFAULT_MAX_RESULT_SIZE_CHARS, GUEST_INTERFACE, SUPPORTED_CONTRACT_VERSIONS, WORKSPACE_MOUNT,
    supported_versions,
};
use crate::error::{Error, Result};
use crate::limits::{BatchFuel, LimitKind, Limits, Usage, units};
use crate::load::bindings::{self, GuestPre, Version};
use crate::load::engine::{Compiled, Identity, Runtime};
use crate::load::epoch::Ticker;
use crate::load::grants::{Grants, PluginGrant};
use crate::load::sandbox::{
    FuelLimit, Grant, Mounts, QUERY_DEADLINE, QUERY_FUEL, Sandbox, SandboxState, root_cause,
};
use crate::tool::{
    CallContext, CallError, CallOutput, InterruptBehavior, Invocation, PermissionDecision, ResultSize, Tool,
    ToolOrigin, ToolSpec,
};

/// Call one export of the guest as a question: in the current sandbox of
/// `$questions` (a fresh one when there is none), with a query's fuel and
/// deadline drawn from its meter. Gives `Result<answer, CallError>`; the
/// sandbox is kept for the next question only when the answer came back, so
/// a trapped instance is never entered again.
macro_rules! query {
    ($questions:expr, |$guest:ident, $store:ident| $call:expr) => {{
        let questions: &mut Questions<'_> = &mut $questions;
        let limits: &Limits = &questions.shared.limits;
        match questions.take_live().await {
            Err(error) => Err(error),
            Ok(mut sandbox) => {
                let answer = match questions.meter.reserve(Some(QUERY_FUEL)).await {
                    Err(error) => Err(error),
                    Ok(reserved) => match sandbox.budget(reserved.fuel, reserved.limit, QUERY_DEADLINE) {
                        Err(error) => Err(error),
                        Ok(()) => {
                            let outcome = {
                                let until = sandbox.export_timer();
                                let $guest = &*sandbox.tool;
                                let $store = &mut sandbox.store;
                                crate::load::sandbox::within(until, Box::pin($call)).await
                            };
                            questions.meter.settle(&reserved, Some(&sandbox));
                            match outcome {
                                Ok(Ok(answer)) => Ok(answer),
                                Ok(Err(error)) => Err(sandbox.classify(&error, limits)),
                                Err(_elapsed) => Err(sandbox.deadline_error()),
                            }
                        }
                    },
                };
                if answer.is_ok() {
                    questions.sandbox = Some(sandbox);
                }
                answer
            }
        }
    }};
}

/// Ask one question of the guest (see [`query!`]). A trap, a limit or a
/// timeout logs a warning naming the plugin and gives `$fallback`, and sets
/// `$fell_back` when given.
macro_rules! ask {
    ($questions:expr, $export:literal, $fallback:expr, |$guest:ident, $store:ident| $call:expr) => {{
        let mut fell_back = false;
        let answer = ask!($questions, $export, $fallback, fell_back, |$guest, $store| $call);
        let _ = fell_back;
        answer
    }};
    ($questions:expr, $export:literal, $fallback:expr, $fell_back:ident, |$guest:ident, $store:ident| $call:expr) => {{
        let questions: &mut Questions<'_> = &mut $questions;
        match query!(*questions, |$guest, $store| $call) {
            Ok(answer) => answer,
            Err(error) => {
                let plugin = &questions.shared.name;
                tracing::warn!(%plugin, "`{}` failed, using the conservative answer: {error}", $export);
                $fell_back = true;
                $fallback
            }
        }
    }};
}

const WASM_MAGIC: &[u8] = b"\0asm";
const CORE_MODULE_VERSION: [u8; 4] = [1, 0, 0, 0];

/// How a plugin was loaded: for `keel inspect` and for tests of the cache.
#[derive(Clone, Debug)]
pub struct LoadReport {
    /// Whether the load was served by the compile cache: its compiled code,
    /// or its load-time answers (see `answers_from_cache`).
    pub from_cache: bool,
    /// Whether the load-time answers came from the compile cache, so that
    /// the code was not loaded at all: it is, at the plugin's first call.
    pub answers_from_cache: bool,
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
    /// The linked component: set at load, or at the first call when the
    /// load-time answers came from the cache (see `deferred`).
    code: tokio::sync::OnceCell<GuestPre<SandboxState>>,
    /// Where the code comes from when it was not loaded with the plugin.
    deferred: Option<Deferred>,
    name: Arc<str>,
    /// What advances its engine's epoch, woken by each of its sandboxes.
    ticker: Option<Ticker>,
    /// The contract version the component was built against.
    contract: Version,
    /// What the tool said at load holds for every call.
    fixed: Fixed,
    limits: Limits,
    grant: PluginGrant,
    mounts: Arc<Mounts>,
}

/// Answers a tool gives once, at load, for every call (since 0.4.0): each
/// spares the export it answers on every call.
#[derive(Clone, Copy, Serialize, Deserialize)]
struct Fixed {
    /// The plan of every call: `plan` is not asked when set.
    plan: Option<bindings::CallPlan>,
    /// Whether `check` may refuse, rewrite or ask: when false, it is not
    /// asked and every input that passed the schema is allowed by the tool.
    checks_input: bool,
}

impl Fixed {
    /// What a tool that says nothing gets, and a tool whose answer trapped:
    /// every question asked of every call.
    const NONE: Fixed = Fixed { plan: None, checks_input: true };
}

/// A plugin's code, left unloaded at start: the file it was in and the
/// bytes that file held then.
struct Deferred {
    runtime: Arc<Runtime>,
    path: PathBuf,
    identity: Identity,
}

impl Shared {
    /// The linked component, loaded now if it was deferred.
    async fn pre(&self) -> Result<&GuestPre<SandboxState>, CallError> {
        if let Some(pre) = self.code.get() {
            return Ok(pre);
        }
        let load = || async {
            let Deferred { runtime, path, identity } =
                self.deferred.as_ref().expect("a plugin loaded without its code says where it is");
            let compiled = runtime.compile_identified(path, identity, |bytes| check_header(path, bytes))?;
            let pre = link(runtime, path, &compiled.component)?;
            if pre.version() != self.contract {
                return Err(Error::plugin(path, "changed its contract version since it was loaded"));
            }
            Ok(pre)
        };
        // Boxed: needed once per plugin, it would otherwise swell the future
        // of every sandbox made.
        let loaded = Box::pin(self.code.get_or_try_init(load)).await;
        loaded.map_err(|error: Error| CallError::Host(error.to_string()))
    }
}

/// The load-time answers of a plugin, as the compile cache keeps them:
/// everything its tool spec is made of, bar what the host's configuration
/// decides (the grant, trust).
#[derive(Clone, Serialize, Deserialize)]
struct LoadAnswers {
    /// The contract version the component was built against.
    contract: Version,
    metadata: bindings::ToolMetadata,
    /// A digest of the environment the questions after `metadata` saw:
    /// answers given under another environment are not reused.
    env: String,
    enabled: bool,
    max_result_size: Option<u64>,
    requires_user_interaction: bool,
    fixed: Fixed,
}

impl LoadAnswers {
    /// Under what the answers are filed, beside the bytes they are about:
    /// the questions' contract and the limits they ran under.
    fn topic(limits: &Limits) -> String {
        format!("load-answers {} {limits:?}", SUPPORTED_CONTRACT_VERSIONS.join(","))
    }

    fn env_digest(env: &[(String, String)]) -> String {
        let mut hasher = blake3::Hasher::new();
        for (name, value) in env {
            for part in [name, value] {
                hasher.update(&(part.len() as u64).to_le_bytes()).update(part.as_bytes());
            }
        }
        hasher.finalize().to_hex().to_string()
    }

    /// The tool spec of the plugin at `path` that gave these answers, under
    /// `grant`; an error names what in them is not acceptable. The tool's
    /// name and each of its aliases must be 1 to 64 letters, digits, `_` or
    /// `-`: an alias is called and matched by rules as a name is.
    fn into_spec(self, path: &Path, grant: &PluginGrant) -> Result<ToolSpec> {
        let LoadAnswers { contract, metadata, enabled, max_result_size, requires_user_interaction, .. } =
            self;
        if !is_tool_name(&metadata.name) {
            return Err(Error::plugin(
                path,
                format!(
                    "tool name {} must be 1 to 64 letters, digits, `_` or `-`",
                    shown_name(&metadata.name)
                ),
            ));
        }
        if let Some(alias) = metadata.aliases.iter().find(|alias| !is_tool_name(alias)) {
            return Err(Error::plugin(
                path,
                format!(
                    "alias {} of `{}` must be 1 to 64 letters, digits, `_` or `-`, as a tool name",
                    shown_name(alias),
                    metadata.name
                ),
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
        let user_facing_name = if metadata.user_facing_name.is_empty() {
            metadata.name.clone()
        } else {
            metadata.user_facing_name
        };
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
            origin: ToolOrigin::Plugin { path: path.to_path_buf(), contract: contract.as_str() },
            trusted: grant.trusted,
        })
    }
}

/// A name a plugin gave that breaks the rules, quoted and escaped as Rust
/// writes a string, and cut after 80 characters: an error shows what was
/// wrong without repeating ten kilobytes of it.
fn shown_name(name: &str) -> String {
    const SHOWN: usize = 80;
    match name.char_indices().nth(SHOWN) {
        Some((cut, _)) => {
            format!("{:?}… ({} bytes)", &name[..cut], name.len())
        }
        None => format!("{name:?}"),
    }
}

/// Whether a plugin's tool name, or one of its aliases, is 1 to 64 letters,
/// digits, `_` or `-`.
fn is_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl PluginTool {
    /// Load the component at `path` with the default grant (the workspace
    /// and nothing else): check it, compile it (or take it from the cache),
    /// and read its metadata once.
    pub async fn load(
        runtime: &Arc<Runtime>,
        path: &Path,
        workspace: &Path,
        limits: &Limits,
    ) -> Result<Self> {
        PluginTool::load_with_grants(runtime, path, &Grants::none(workspace), limits).await
    }

    /// [`PluginTool::load`], granting the plugin what `grants` give its tool
    /// name.
    ///
    /// A plugin whose file is unchanged since an earlier load on this
    /// engine, with the same limits, and whose load-time questions all
    /// answered then under the environment it is granted now, is not loaded
    /// at all: its answers are taken from the compile cache, and its code is
    /// loaded at its first call. Load-time questions see no files, so their
    /// answers depend on the component and that environment alone; a tool
    /// whose answers depend on the clock or on chance is asked only once per
    /// version. [`PluginTool::load_fresh`] always asks.
    pub async fn load_with_grants(
        runtime: &Arc<Runtime>,
        path: &Path,
        grants: &Grants,
        limits: &Limits,
    ) -> Result<Self> {
        match PluginTool::recall(runtime, path, grants, limits) {
            Some(plugin) => Ok(plugin),
            None => PluginTool::load_fresh(runtime, path, grants, limits).await,
        }
    }

    /// [`PluginTool::load_with_grants`], asking the guest its load-time
    /// questions whatever the cache holds.
    pub async fn load_fresh(
        runtime: &Arc<Runtime>,
        path: &Path,
        grants: &Grants,
        limits: &Limits,
    ) -> Result<Self> {
        // Compiling takes seconds of CPU: on a blocking thread, so that the
        // runtime goes on (a caller's timeout or Ctrl-C is heard meanwhile).
        let compiled = {
            let (runtime, path) = (runtime.clone(), path.to_path_buf());
            tokio::task::spawn_blocking(move || {
                runtime.compile_file(&path, |bytes| check_header(&path, bytes))
            })
            .await
            .unwrap_or_else(|failed| std::panic::resume_unwind(failed.into_panic()))?
        };
        PluginTool::from_compiled(runtime, path, compiled, grants, limits).await
    }

    /// A plugin of `compiled`, the component read from `path`: linked, and
    /// asked its load-time questions, whose answers the compile cache keeps.
    pub(crate) async fn from_compiled(
        runtime: &Arc<Runtime>,
        path: &Path,
        compiled: Compiled,
        grants: &Grants,
        limits: &Limits,
    ) -> Result<Self> {
        let pre = link(runtime, path, &compiled.component)?;
        let file_name =
            path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        let mut shared = Shared {
            contract: pre.version(),
            fixed: Fixed::NONE,
            code: tokio::sync::OnceCell::new_with(Some(pre)),
            deferred: None,
            name: file_name.into(),
            ticker: runtime.ticker(),
            limits: *limits,
            // Until its name is known, the plugin gets nothing that depends on it.
            grant: PluginGrant::workspace_only(grants.workspace()),
            mounts: Arc::new(Mounts::none()),
        };
        let (spec, answers) = read_spec(&mut shared, path, grants).await?;
        if let (Some(answers), Some(content_key)) = (answers, &compiled.content_key) {
            let answers = serde_json::to_vec(&answers).expect("load answers serialize");
            runtime.remember(content_key, &LoadAnswers::topic(limits), &answers);
        }
        let report = LoadReport {
            from_cache: compiled.from_cache,
            answers_from_cache: false,
            compile_time: compiled.time,
            size: compiled.size,
        };
        Ok(PluginTool { spec, shared: Arc::new(shared), report })
    }

    /// The plugin at `path` made from the answers the cache holds for it,
    /// its code left unloaded; `None` when there are none that apply, or
    /// they cannot be used, and the plugin must be loaded.
    fn recall(runtime: &Arc<Runtime>, path: &Path, grants: &Grants, limits: &Limits) -> Option<Self> {
        let started = std::time::Instant::now();
        let identity = runtime.identify(path)?;
        let held = runtime.recall(&identity.content_key, &LoadAnswers::topic(limits))?;
        let answers: LoadAnswers = serde_json::from_slice(&held).ok()?;
        let grant = grants.for_tool(&answers.metadata.name);
        if answers.env != LoadAnswers::env_digest(&grant.env) {
            return None;
        }
        // Failures below are the load's to report, in its words.
        let mounts = Mounts::open(&grant).ok()?;
        let name: Arc<str> = answers.metadata.name.as_str().into();
        let (contract, fixed) = (answers.contract, answers.fixed);
        let spec = answers.into_spec(path, &grant).ok()?;
        let size = identity.size;
        let deferred = Deferred { runtime: runtime.clone(), path: path.to_path_buf(), identity };
        let shared = Shared {
            code: tokio::sync::OnceCell::new(),
            deferred: Some(deferred),
            name,
            ticker: runtime.ticker(),
            contract,
            fixed,
            limits: *limits,
            grant,
            mounts: Arc::new(mounts),
        };
        let report =
            LoadReport { from_cache: true, answers_from_cache: true, compile_time: started.elapsed(), size };
        Some(PluginTool { spec, shared: Arc::new(shared), report })
    }

    /// How the plugin was loaded.
    pub fn load_report(&self) -> &LoadReport {
        &self.report
    }

    /// The plan the tool fixed at load for every call (contract 0.4.0's
    /// `fixed-plan`), as `(concurrency-safe, read-only)`; `None` when `plan`
    /// is asked per call, as it is of every tool of an older contract.
    pub fn fixed_plan(&self) -> Option<(bool, bool)> {
        self.shared.fixed.plan.map(|plan| (plan.concurrency_safe, plan.read_only))
    }

    /// Whether `check` is asked per call: false when the tool said at load
    /// that it never refuses, rewrites or asks (contract 0.4.0's
    /// `checks-input`).
    pub fn checks_input(&self) -> bool {
        self.shared.fixed.checks_input
    }
}

/// Check that `component` speaks a contract version this host loads, and
/// link it for that version. A link error gives wasmtime's whole chain of
/// messages: the outer ones name the import the host does not provide (and
/// the function of it), the innermost only says what is missing.
pub(crate) fn link(
    runtime: &Runtime,
    path: &Path,
    component: &wasmtime::component::Component,
) -> Result<GuestPre<SandboxState>> {
    let version = check_contract(runtime, path, component)?;
    let instance_pre = runtime
        .linker()
        .instantiate_pre(component)
        .map_err(|error| Error::plugin(path, format!("cannot be linked: {error:#}")))?;
    GuestPre::new(version, instance_pre).map_err(|error| {
        Error::plugin(path, format!("does not export the keel tool contract: {}", root_cause(&error)))
    })
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

/// The contract version `component` was built against, when this host loads
/// it; a component of another version is refused by name, before a link error
/// would say it less clearly.
fn check_contract(
    runtime: &Runtime,
    path: &Path,
    component: &wasmtime::component::Component,
) -> Result<Version> {
    let exports: Vec<String> = component
        .component_type()
        .exports(runtime.engine())
        .filter(|(_, item)| matches!(item.ty, ComponentItem::ComponentInstance(_)))
        .map(|(name, _)| name.to_string())
        .collect();
    let versions: Vec<&str> =
        exports.iter().filter_map(|name| name.strip_prefix(GUEST_INTERFACE)?.strip_prefix('@')).collect();
    // The newest a component exports, should it export several.
    if let Some(version) = versions.iter().rev().find_map(|number| Version::from_number(number)) {
        return Ok(version);
    }
    let supported = supported_versions();
    if let Some(other) = versions.first() {
        return Err(Error::plugin(
            path,
            format!(
                "was built against keel tool contract {other}, which this host does not know; \
                 it loads contracts {supported}: rebuild the tool with a keel-guest of one of them"
            ),
        ));
    }
    let found = if exports.is_empty() { "nothing".to_string() } else { exports.join(", ") };
    Err(Error::plugin(
        path,
        format!(
            "does not export `{GUEST_INTERFACE}@<version>` (it exports {found}); is it a keel tool? \
             This host loads contracts {supported}"
        ),
    ))
}

/// Read the input-independent facts of the tool, once, in a fresh instance
/// with no filesystem (a second one when its grant gives it an environment):
/// a trap in `metadata` fails the load, a trap elsewhere gives the fallback
/// (for `is-enabled`, false: the tool is left out).
///
/// Gives the answers too, to keep, when every question answered.
async fn read_spec(
    shared: &mut Shared,
    path: &Path,
    grants: &Grants,
) -> Result<(ToolSpec, Option<LoadAnswers>)> {
    let mut meter = Meter::unmetered();
    let mut questions = Questions::new(shared, Grant::Nothing, &mut meter);
    let metadata = query!(questions, |guest, store| guest.metadata(store))
        .map_err(|error| Error::plugin(path, format!("`metadata` failed: {error}")))?;
    let asked = questions.sandbox.take();
    // The grant follows the tool's name, known only now; the questions below
    // see the plugin's environment but still no directory. When that
    // environment is empty, as `metadata`'s was, they are asked in its
    // instance: a second one would differ only in the name its log lines
    // carry (the file's, not the tool's).
    shared.name = metadata.name.as_str().into();
    shared.grant = grants.for_tool(&metadata.name);
    shared.mounts =
        Arc::new(Mounts::open(&shared.grant).map_err(|error| Error::plugin(path, error.to_string()))?);
    let sandbox = asked.filter(|_| shared.grant.env.is_empty());
    let mut questions = Questions { shared, grant: Grant::Nothing, sandbox, meter: &mut meter };
    let mut fell_back = false;
    let enabled = ask!(questions, "is-enabled", false, fell_back, |guest, store| guest.is_enabled(store));
    let max_result_size =
        ask!(questions, "max-result-size", Some(DEFAULT_MAX_RESULT_SIZE_CHARS), fell_back, |guest, store| {
            guest.max_result_size(store)
        });
    let requires_user_interaction =
        ask!(questions, "requires-user-interaction", false, fell_back, |guest, store| {
            guest.requires_user_interaction(store)
        });
    let fixed = Fixed {
        plan: ask!(questions, "fixed-plan", Fixed::NONE.plan, fell_back, |guest, store| {
            guest.fixed_plan(store)
        }),
        checks_input: ask!(questions, "checks-input", Fixed::NONE.checks_input, fell_back, |guest, store| {
            guest.checks_input(store)
        }),
    };
    shared.fixed = fixed;
    let grant = &shared.grant;
    let answers = LoadAnswers {
        contract: shared.contract,
        metadata,
        env: LoadAnswers::env_digest(&grant.env),
        enabled,
        max_result_size,
        requires_user_interaction,
        fixed,
    };
    let kept = (!fell_back).then(|| answers.clone());
    Ok((answers.into_spec(path, grant)?, kept))
}

/// Where one invocation's fuel comes from: its own per-call budget, which
/// its questions draw on too, and, once shared, the allowance of its batch.
/// Fuel is reserved before each export call and what it left unburnt is
/// given back after, so the batch allowance counts only fuel burnt. What
/// was burnt, the memory reached and the time spent setting up sandboxes go
/// to `usage`, for the call's figures.
struct Meter {
    per_call: u64,
    left: u64,
    batch: Option<BatchFuel>,
    /// Where what it uses is recorded, once the host asked for it.
    usage: Option<Arc<Usage>>,
}

/// Fuel reserved for one export call, and the limit that bounded it.
struct Reserved {
    fuel: u64,
    limit: FuelLimit,
}

impl Meter {
    fn new(per_call: u64) -> Self {
        Meter { per_call, left: per_call, batch: None, usage: None }
    }

    /// For questions outside any call (at load, `inputs-equivalent`): each
    /// gets a query's fuel.
    fn unmetered() -> Self {
        Meter::new(u64::MAX)
    }

    /// Reserve fuel for one export call: what the call has left, at most
    /// `cap`, at most what the batch has left once the reservations out now
    /// came back ([`BatchFuel::reserve`]).
    async fn reserve(&mut self, cap: Option<u64>) -> Result<Reserved, CallError> {
        let mut limit = FuelLimit { kind: LimitKind::Fuel, fuel: self.per_call };
        let mut want = self.left;
        if let Some(cap) = cap
            && cap < want
        {
            want = cap;
            limit = FuelLimit { kind: LimitKind::Fuel, fuel: cap };
        }
        if want == 0 {
            return Err(CallError::Limit { kind: LimitKind::Fuel, value: units(self.per_call) });
        }
        let fuel = match &self.batch {
            None => want,
            Some(batch) => {
                let fuel = batch.reserve(want).await;
                if fuel == 0 {
                    return Err(CallError::Limit { kind: LimitKind::BatchFuel, value: units(batch.total()) });
                }
                if fuel < want {
                    limit = FuelLimit { kind: LimitKind::BatchFuel, fuel: batch.total() };
                }
                fuel
            }
        };
        self.left -= fuel;
        Ok(Reserved { fuel, limit })
    }

    /// Give back what an export call in `sandbox` left of `reserved`; a
    /// sandbox that failed to instantiate is counted as having burnt all it
    /// was given.
    fn settle(&mut self, reserved: &Reserved, sandbox: Option<&Sandbox>) {
        let unburnt = sandbox.map_or(0, Sandbox::fuel_left).min(reserved.fuel);
        if let Some(usage) = &self.usage {
            usage.burnt(reserved.fuel - unburnt);
            if let Some(sandbox) = sandbox {
                usage.memory(sandbox.memory_peak());
            }
        }
        self.left += unburnt;
        if let Some(batch) = &self.batch {
            batch.give_back(reserved.fuel, unburnt);
        }
    }
}

/// A sandbox for asking questions, replaced whenever one traps.
struct Questions<'a> {
    shared: &'a Shared,
    grant: Grant,
    sandbox: Option<Sandbox>,
    meter: &'a mut Meter,
}

impl<'a> Questions<'a> {
    fn new(shared: &'a Shared, grant: Grant, meter: &'a mut Meter) -> Self {
        Questions { shared, grant, sandbox: None, meter }
    }

    /// The live sandbox, taken out; a fresh one when there is none, its
    /// instantiation paid from the meter.
    async fn take_live(&mut self) -> Result<Sandbox, CallError> {
        if let Some(sandbox) = self.sandbox.take() {
            return Ok(sandbox);
        }
        let shared = self.shared;
        // Loading code left unloaded at start is part of the set-up.
        let started = self.meter.usage.as_ref().map(|_| Instant::now());
        // Before any fuel is reserved: a plugin whose code cannot be loaded
        // burns none.
        let pre = shared.pre().await?;
        let reserved = self.meter.reserve(Some(QUERY_FUEL)).await?;
        // Boxed: a future this large, kept inline, is copied whole into
        // every future that awaits it.
        let sandbox = Box::pin(Sandbox::new(
            pre,
            shared.ticker.as_ref(),
            shared.name.clone(),
            &shared.limits,
            (&shared.grant, &shared.mounts),
            self.grant,
            (reserved.fuel, reserved.limit),
        ))
        .instrument(tracing::info_span!(target: "keel_host::call", "setup"))
        .await;
        if let (Some(usage), Some(started)) = (&self.meter.usage, started) {
            usage.set_up(started, Instant::now());
        }
        // A component that failed to instantiate is counted as having burnt
        // all it was given: rare, and never in the guest's favour.
        self.meter.settle(&reserved, sandbox.as_ref().ok());
        sandbox
    }
}

#[async_trait]
impl Tool for PluginTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn always_read_only(&self) -> bool {
        self.fixed_plan().is_some_and(|(_, read_only)| read_only)
    }

    async fn invoke(&self, input: Value, context: Arc<Value>) -> Result<Box<dyn Invocation>, CallError> {
        Ok(Box::new(PluginInvocation {
            shared: self.shared.clone(),
            input_text: json_text(&input),
            input,
            context_text: json_text(&context),
            context,
            plan: None,
            checked: None,
            sandbox: None,
            meter: Meter::new(self.shared.limits.fuel),
        }))
    }

    /// Load the code if it was left unloaded at start, then run one
    /// `metadata` in a sandbox of its own, which is dropped: the code's pages
    /// and a pool slot for its instances are warm when the first call comes.
    /// The answers are not needed: they were read at load.
    async fn warm_up(&self) {
        if self.shared.code.get().is_none() {
            // On a blocking thread: loading reads and links megabytes of
            // code, which would hold the thread that runs calls, and a call
            // that arrives meanwhile would wait for it. A call of this
            // plugin that comes meanwhile waits for this load, or makes it
            // when it comes first.
            let (shared, runtime) = (self.shared.clone(), tokio::runtime::Handle::current());
            let load = move || runtime.block_on(async { shared.pre().await.is_ok() });
            if !matches!(tokio::task::spawn_blocking(load).await, Ok(true)) {
                return;
            }
        }
        let mut meter = Meter::unmetered();
        let mut questions = Questions::new(&self.shared, Grant::Nothing, &mut meter);
        let _ = query!(questions, |guest, store| guest.metadata(store));
    }

    async fn inputs_equivalent(&self, a: &Value, b: &Value) -> bool {
        let mut meter = Meter::unmetered();
        let mut questions = Questions::new(&self.shared, Grant::Nothing, &mut meter);
        let (a, b) = (json_text(a), json_text(b));
        let fallback = a == b;
        ask!(questions, "inputs-equivalent", fallback, |guest, store| guest.inputs_equivalent(store, &a, &b))
    }
}

/// One call of a plugin. `plan` is asked first, in a sandbox with no
/// filesystem, unless the tool fixed it at load; the other questions then
/// share one read-only sandbox while nothing traps. The call reuses it when
/// it is read-only, and gets a fresh sandbox with write access when it is
/// not (or when no question was asked).
struct PluginInvocation {
    shared: Arc<Shared>,
    input: Value,
    input_text: String,
    /// The context the call will run with, which every question is asked
    /// under, and its JSON text as the guest receives it.
    context: Arc<Value>,
    context_text: String,
    plan: Option<bindings::CallPlan>,
    /// The answer of `check` for the current input: the validation error, or
    /// the permission decision.
    checked: Option<Result<PermissionDecision, String>>,
    sandbox: Option<Sandbox>,
    meter: Meter,
}

/// `value` as JSON text, as a guest receives it. `serde_json::to_string`
/// writes straight into its buffer; `Display` goes through a formatter a
/// token at a time, which costs more on every call.
fn json_text(value: &Value) -> String {
    serde_json::to_string(value).expect("a JSON value always serializes")
}

/// `plan`'s answer when it fails: neither concurrency-safe nor read-only.
const CONSERVATIVE_PLAN: bindings::CallPlan =
    bindings::CallPlan { concurrency_safe: false, read_only: false };

impl PluginInvocation {
    /// The call's plan, and with it its grant: the one the tool fixed at
    /// load, else its answer to `plan`. Asking `plan` first, in a sandbox with
    /// no filesystem, means no guest code has seen a directory before the
    /// grant is fixed.
    async fn plan(&mut self) -> bindings::CallPlan {
        if let Some(plan) = self.plan.or(self.shared.fixed.plan) {
            self.plan = Some(plan);
            return plan;
        }
        let shared = &*self.shared;
        let mut questions =
            Questions { shared, grant: Grant::Nothing, sandbox: self.sandbox.take(), meter: &mut self.meter };
        let (input, context) = (&self.input_text, &self.context_text);
        let plan =
            ask!(questions, "plan", CONSERVATIVE_PLAN, |guest, store| guest.plan(store, input, context));
        self.sandbox = questions.sandbox.take();
        if let Some(sandbox) = &mut self.sandbox {
            sandbox.regrant(QUESTION_GRANT);
        }
        self.plan = Some(plan);
        plan
    }

    /// The grant of the call itself: read-only when `plan` said so, else
    /// what the plugin's grant gives.
    fn call_grant(&self) -> Grant {
        match self.plan {
            Some(plan) if plan.read_only => Grant::ReadOnly,
            _ => Grant::ReadWrite,
        }
    }
}

fn permission_decision(decision: bindings::PermissionDecision) -> PermissionDecision {
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

/// The grant of every question once `plan` is answered: read-only.
/// A question runs before the permission check and the host's rules have
/// allowed the call, so it must not be able to write anything; only the call
/// itself is given write access.
const QUESTION_GRANT: Grant = Grant::ReadOnly;

/// Ask a per-input question: decide the grant first, then ask in the
/// invocation's sandbox, keeping it for the next question unless it trapped.
/// Gives `Result<answer, CallError>`, having logged a warning on `Err`.
macro_rules! query_input {
    ($self:ident, $export:literal, |$guest:ident, $store:ident, $input:ident, $context:ident| $call:expr) => {{
        if $self.plan.is_none() {
            // Boxed: asked once, it would otherwise swell every question's future.
            Box::pin($self.plan()).await;
        }
        let mut questions = Questions {
            shared: &$self.shared,
            grant: QUESTION_GRANT,
            sandbox: $self.sandbox.take(),
            meter: &mut $self.meter,
        };
        let ($input, $context) = ($self.input_text.as_str(), $self.context_text.as_str());
        let answer = query!(questions, |$guest, $store| $call);
        $self.sandbox = questions.sandbox.take();
        if let Err(error) = &answer {
            let plugin = &$self.shared.name;
            tracing::warn!(%plugin, "`{}` failed, using the conservative answer: {error}", $export);
        }
        answer
    }};
}

/// [`query_input!`], answering `$fallback` when the question failed.
macro_rules! ask_input {
    ($self:ident, $export:literal, $fallback:expr, |$guest:ident, $store:ident, $input:ident, $context:ident| $call:expr) => {{
        match query_input!($self, $export, |$guest, $store, $input, $context| $call) {
            Ok(answer) => answer,
            Err(_) => $fallback,
        }
    }};
}

/// Why a question that failed refused the call: the batch's spent fuel
/// allowance is worth naming (every later call of the batch meets it too),
/// and so is a host that could not run the tool at all (its code could not
/// be loaded, say); anything else is the tool's own failure.
fn refusal(what: &str, error: &CallError) -> String {
    match error {
        CallError::Limit { kind: LimitKind::BatchFuel, .. } | CallError::Host(_) => {
            format!("{what} could not run: {error}")
        }
        _ => format!("{what} failed; the call was refused"),
    }
}

impl PluginInvocation {
    /// The tool's validation and permission decision for the current input,
    /// asked once; allowed as it is, unasked, when the tool said at load that
    /// it checks no input.
    async fn check(&mut self) -> Result<PermissionDecision, String> {
        if let Some(checked) = &self.checked {
            return checked.clone();
        }
        if !self.checks_input() {
            return Ok(PermissionDecision::Allow(None));
        }
        let checked = match query_input!(self, "check", |g, s, i, c| g.check(s, i, c)) {
            Err(error) => Err(refusal("the tool's input check", &error)),
            Ok(Err(message)) => Err(message),
            Ok(Ok(decision)) => Ok(permission_decision(decision)),
        };
        self.checked = Some(checked.clone());
        checked
    }
}

#[async_trait]
impl Invocation for PluginInvocation {
    fn input(&self) -> &Value {
        &self.input
    }

    fn set_input(&mut self, input: Value) {
        self.input_text = json_text(&input);
        self.input = input;
        self.checked = None;
    }

    fn set_context(&mut self, context: Arc<Value>) {
        self.context_text = json_text(&context);
        self.context = context;
        // Every answer is forgotten, and so is the sandbox they were given
        // in: the plan is asked again as it was first, in a sandbox that has
        // seen no directory.
        self.plan = None;
        self.checked = None;
        self.sandbox = None;
    }

    async fn is_read_only(&mut self) -> bool {
        self.plan().await.read_only
    }

    fn share_batch_fuel(&mut self, fuel: BatchFuel) {
        self.meter.batch = Some(fuel);
    }

    fn record_usage(&mut self) -> Option<Arc<Usage>> {
        Some(self.meter.usage.get_or_insert_with(Usage::shared).clone())
    }

    async fn is_concurrency_safe(&mut self) -> bool {
        self.plan().await.concurrency_safe
    }

    async fn is_destructive(&mut self) -> bool {
        ask_input!(self, "is-destructive", true, |g, s, i, c| g.is_destructive(s, i, c))
    }

    fn checks_input(&self) -> bool {
        self.shared.fixed.checks_input
    }

    async fn validate_input(&mut self) -> Result<(), String> {
        self.check().await.map(|_| ())
    }

    async fn check_permissions(&mut self) -> PermissionDecision {
        self.check().await.unwrap_or_else(PermissionDecision::Deny)
    }

    async fn permission_subject(&mut self) -> Option<String> {
        // A tool of a contract whose questions cannot see the context named
        // its subject as if the working directory were the workspace root.
        // When it is not, that name may point elsewhere than the call will
        // reach, so the subject is unknown: pattern `deny` and `ask` rules
        // apply to it, pattern `allow` rules do not.
        if self.shared.contract == Version::V0_2 && crate::contract::cwd(&self.context) != WORKSPACE_MOUNT {
            return None;
        }
        ask_input!(self, "permission-subject", None, |g, s, i, c| g.permission_subject(s, i, c))
    }

    async fn classifier_input(&mut self) -> String {
        ask_input!(self, "classifier-input", String::new(), |g, s, i, c| g.classifier_input(s, i, c))
    }

    async fn activity_description(&mut self) -> Option<String> {
        ask_input!(self, "activity-description", None, |g, s, i, c| g.activity_description(s, i, c))
    }

    async fn is_open_world(&mut self) -> bool {
        ask_input!(self, "is-open-world", false, |g, s, i, c| g.is_open_world(s, i, c))
    }

    async fn is_search_or_read(&mut self) -> bool {
        ask_input!(self, "is-search-or-read", false, |g, s, i, c| g.is_search_or_read(s, i, c))
    }

    async fn call(mut self: Box<Self>, cx: CallContext) -> Result<CallOutput, CallError> {
        self.plan().await;
        let this = &mut *self;
        let shared = this.shared.clone();
        let limits = &shared.limits;
        let grant = this.call_grant();
        // Asked only of a plugin that could use the answer: it is the claim
        // that opens the network.
        let open_world = !shared.grant.network.is_empty() && this.is_open_world().await;
        // The questions' sandbox is reused only when the call is read-only
        // too; a call that may write gets a fresh one (a guest caches its
        // directory handles, so a regrant would not reach them).
        let live = this.sandbox.take().filter(|sandbox| sandbox.grant() == grant);
        let mut questions = Questions { shared: &shared, grant, sandbox: live, meter: &mut this.meter };
        let mut sandbox = questions.take_live().await?;
        let reserved = this.meter.reserve(None).await?;
        sandbox.budget(reserved.fuel, reserved.limit, limits.deadline)?;
        sandbox.report_progress_to(cx.progress.clone());
        sandbox.open_network(open_world);
        sandbox.report_refusals_to(cx.refused.clone());
        sandbox.report_logs_to(cx.log.clone());
        // The questions' context, as they were given it, unless the call is
        // handed another.
        let context = if Arc::ptr_eq(&cx.context, &this.context) {
            std::mem::take(&mut this.context_text)
        } else {
            json_text(&cx.context)
        };
        // The epoch deadline stops guest code; this timer also stops a call
        // blocked in a host function, which the epoch cannot interrupt.
        let outcome = {
            let until = sandbox.export_timer();
            let call = sandbox.tool.call(&mut sandbox.store, &this.input_text, &context);
            crate::load::sandbox::within(until, Box::pin(call)).await
        };
        this.meter.settle(&reserved, Some(&sandbox));
        let output = call_output(outcome, &sandbox, limits);
        sandbox.retire();
        output
    }
}

/// What an export call of `call` in `sandbox` gave, as the host hands it on:
/// a limit, a trap or a tool error named, secrets masked, and the guest's
/// JSON texts parsed.
fn call_output(
    outcome: Result<wasmtime::Result<Result<bindings::CallOutput, String>>, tokio::time::error::Elapsed>,
    sandbox: &Sandbox,
    limits: &Limits,
) -> Result<CallOutput, CallError> {
    match outcome {
        Err(_elapsed) => Err(sandbox.deadline_error()),
        Ok(Err(error)) => Err(sandbox.classify(&error, limits)),
        Ok(Ok(Err(mut message))) => {
            sandbox.scrubber().scrub(&mut message);
            Err(CallError::Tool(message))
        }
        Ok(Ok(Ok(mut output))) => {
            let scrubber = sandbox.scrubber();
            if scrubber.is_active() {
                // A secret a server echoed was masked on its way in; one
                // that reached the guest some other way (decoded, say) is
                // masked on its way out.
                for block in &mut output.content {
                    if let bindings::ContentBlock::Text(text) = block {
                        scrubber.scrub(text);
                    }
                }
                for text in output.structured.iter_mut().chain(output.context_modifier.iter_mut()) {
                    scrubber.scrub(text);
                }
            }
            let context_modifier = match output.context_modifier {
                None => None,
                Some(text) => match serde_json::from_str::<Value>(&text) {
                    Ok(patch @ Value::Object(_)) => Some(patch),
                    Ok(_) => {
                        return Err(CallError::Contract("its context modifier is not a JSON object".into()));
                    }
                    Err(error) => {
                        return Err(CallError::Contract(format!(
                            "its context modifier is not JSON: {error}"
                        )));
                    }
                },
            };
            let structured = match output.structured {
                None => None,
                Some(text) => Some(serde_json::from_str::<Value>(&text).map_err(|error| {
                    CallError::Contract(format!("its structured value is not JSON: {error}"))
                })?),
            };
            let content = output.content.into_iter().map(content_block).collect();
            Ok(CallOutput { content, structured, context_modifier })
        }
    }
}

/// A block of a guest's output as the host holds it; whether an image is
/// what it says is checked with every tool's output (`run/call.rs`).
fn content_block(block: bindings::ContentBlock) -> ContentBlock {
    match block {
        bindings::ContentBlock::Text(text) => ContentBlock::Text(text),
        bindings::ContentBlock::Image(image) => ContentBlock::Image(Image::new(image.media_type, image.data)),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn answers(name: &str, aliases: &[&str]) -> LoadAnswers {
        LoadAnswers {
            contract: Version::V0_4,
            metadata: bindings::ToolMetadata {
                name: name.into(),
                aliases: aliases.iter().map(|alias| alias.to_string()).collect(),
                description: "A tool.".into(),
                prompt: String::new(),
                input_schema: r#"{"type":"object"}"#.into(),
                output_schema: None,
                search_hint: None,
                should_defer: false,
                always_load: false,
                strict: false,
                interrupt_behavior: bindings::InterruptBehavior::Block,
                user_facing_name: String::new(),
            },
            env: String::new(),
            enabled: true,
            max_result_size: None,
            requires_user_interaction: false,
            fixed: Fixed::NONE,
        }
    }

    fn spec_of(name: &str, aliases: &[&str]) -> Result<ToolSpec> {
        let path = Path::new("/plugins/tool.wasm");
        answers(name, aliases).into_spec(path, &PluginGrant::workspace_only(Path::new("/ws")))
    }

    #[test]
    fn an_alias_is_held_to_the_rules_of_a_tool_name() {
        let spec = spec_of("grep", &["search", "find-text_2"]).unwrap();
        assert_eq!(spec.aliases, ["search", "find-text_2"]);
        let long = "a".repeat(65);
        for bad in ["", "a b", "../x", "x\u{1b}[31m", "é", long.as_str()] {
            let error = spec_of("grep", &["search", bad]).unwrap_err().to_string();
            assert_eq!(
                error,
                format!(
                    "failed to load plugin /plugins/tool.wasm: alias {bad:?} of `grep` must be 1 to 64 \
                     letters, digits, `_` or `-`, as a tool name"
                )
            );
        }
        let error = spec_of("a b", &[]).unwrap_err().to_string();
        assert_eq!(
            error,
            r#"failed to load plugin /plugins/tool.wasm: tool name "a b" must be 1 to 64 letters, digits, `_` or `-`"#
        );
        // Ten kilobytes of a name are not repeated whole.
        let error = spec_of(&"n".repeat(10_000), &[]).unwrap_err().to_string();
        assert_eq!(
            error,
            format!(
                "failed to load plugin /plugins/tool.wasm: tool name {:?}… (10000 bytes) must be 1 to 64 letters, \
                 digits, `_` or `-`",
                "n".repeat(80)
            )
        );
    }
}
