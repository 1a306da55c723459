//! The host-side tool abstraction.
//!
//! The pool, the runner and the budgets see tools only through [`Tool`] and
//! [`Invocation`]: a WASM plugin and a native built-in look the same to them.
//! Every method of [`Invocation`] has the conservative answer of the contract
//! as its default, so an implementation only states what it knows.

use std::fmt;
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;

use crate::content::ContentBlock;
use crate::limits::{BatchFuel, LimitKind, Usage};

/// Everything about a tool that does not depend on its input, read once.
#[derive(Clone, Debug, Serialize)]
pub struct ToolSpec {
    /// The name the model calls the tool by.
    pub name: String,
    /// Former names that still resolve to this tool.
    pub aliases: Vec<String>,
    /// What the tool does, for the model.
    pub description: String,
    /// Longer usage guidance for the model; may be empty.
    pub prompt: String,
    /// JSON Schema of the input.
    pub input_schema: Value,
    /// JSON Schema of structured output, if any.
    pub output_schema: Option<Value>,
    /// Phrase a keyword search for deferred tools matches.
    pub search_hint: Option<String>,
    /// Listed by name only until searched for.
    pub should_defer: bool,
    /// Always listed in full, even when deferred.
    pub always_load: bool,
    /// Ask the provider to hold input strictly to the schema.
    pub strict: bool,
    /// What an interrupt does to a running call.
    pub interrupt: InterruptBehavior,
    /// Name shown to people.
    pub user_facing_name: String,
    /// Whether the tool is offered to the model at all.
    pub enabled: bool,
    /// Characters of output before the result is persisted.
    pub max_result_size: ResultSize,
    /// Whether the tool needs a person at the keyboard.
    pub requires_user_interaction: bool,
    /// Where the tool comes from.
    pub origin: ToolOrigin,
    /// Whether the host trusts the tool to bound its own output: built-ins,
    /// and plugins the config marks `trusted`.
    pub trusted: bool,
}

impl ToolSpec {
    /// The spec of a native tool (see [`HostBuilder::tool`]): its name, what
    /// it does, the JSON Schema of its input, and for the rest what a plugin
    /// that declares nothing gets: no aliases, prompt or search hint, listed
    /// in full, interrupts wait for it (`block`), enabled, persisted past
    /// 50,000 characters, no person needed. It is built in, so trusted.
    ///
    /// [`HostBuilder::tool`]: crate::HostBuilder::tool
    pub fn native(name: &str, description: &str, input_schema: Value) -> Self {
        ToolSpec {
            name: name.into(),
            aliases: Vec::new(),
            description: description.into(),
            prompt: String::new(),
            input_schema,
            output_schema: None,
            search_hint: None,
            should_defer: false,
            always_load: false,
            strict: false,
            interrupt: InterruptBehavior::Block,
            user_facing_name: name.into(),
            enabled: true,
            max_result_size: ResultSize::Chars(crate::contract::DEFAULT_MAX_RESULT_SIZE_CHARS),
            requires_user_interaction: false,
            origin: ToolOrigin::BuiltIn,
            trusted: true,
        }
    }
}

/// Where a tool comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum ToolOrigin {
    /// Native code inside keel.
    BuiltIn,
    /// A WASM component loaded from this file.
    Plugin {
        /// The component file.
        path: std::path::PathBuf,
        /// The contract version the component was built against.
        contract: &'static str,
    },
}

/// What an interrupt does to a running call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InterruptBehavior {
    /// Stop the call; its result says it was interrupted.
    Cancel,
    /// Let the call finish.
    Block,
}

/// How large a tool's result may grow before it is persisted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultSize {
    /// At most this many characters.
    Chars(u64),
    /// The tool bounds its own output and is never persisted (`Infinity` in
    /// the runtime keel follows), as `Read` does.
    SelfBounded,
}

/// A tool's own permission decision for one input.
#[derive(Clone, Debug, PartialEq)]
pub enum PermissionDecision {
    /// Go ahead, with this input when it is `Some`.
    Allow(Option<Value>),
    /// Refuse with this message.
    Deny(String),
    /// Ask the user with this message.
    Ask(String),
}

/// A successful call's output.
#[derive(Clone, Debug, PartialEq)]
pub struct CallOutput {
    /// What the model reads, in order: text and image blocks.
    pub content: Vec<ContentBlock>,
    /// A structured value, for a tool that declares an output schema; the
    /// host checks it against that schema.
    pub structured: Option<Value>,
    /// A JSON merge patch for the shared context.
    pub context_modifier: Option<Value>,
}

impl CallOutput {
    /// An output of one text block, with no structured value or context change.
    pub fn text(text: impl Into<String>) -> Self {
        CallOutput {
            content: vec![ContentBlock::Text(text.into())],
            structured: None,
            context_modifier: None,
        }
    }

    /// Its text blocks joined by newlines, images left out.
    pub fn to_text(&self) -> String {
        crate::content::text_of(&self.content)
    }
}

/// Why a call produced no output.
#[derive(Clone, Debug, PartialEq)]
pub enum CallError {
    /// The tool ran and reported an error.
    Tool(String),
    /// A sandbox limit was reached.
    Limit {
        /// Which limit.
        kind: LimitKind,
        /// Its value, as a person would write it.
        value: String,
    },
    /// The tool trapped (crashed).
    Trap(String),
    /// The tool broke the contract, for example with a malformed context
    /// modifier.
    Contract(String),
    /// The host could not run the call.
    Host(String),
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Tool(message) => f.write_str(message),
            CallError::Limit { kind, value } => write!(f, "{kind} of {value} exceeded"),
            CallError::Trap(reason) => write!(f, "the tool crashed: {reason}"),
            CallError::Contract(reason) => write!(f, "the tool broke the keel contract: {reason}"),
            CallError::Host(reason) => write!(f, "the host could not run the tool: {reason}"),
        }
    }
}

/// A progress report sent by a running call.
pub type ProgressSink = Arc<dyn Fn(Value) + Send + Sync>;

/// An HTTP request of a running call that the host refused before sending
/// anything: what it was, and the rule or limit that refused it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkRefusal {
    /// Its method: `GET`, `POST`.
    pub method: String,
    /// Its URL.
    pub url: String,
    /// Why it was refused, naming the rule or the limit.
    pub reason: String,
}

/// Where a call's refused requests are reported, the moment they are refused.
pub type RefusalSink = Arc<dyn Fn(&NetworkRefusal) + Send + Sync>;

/// How much a tool's log line matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LogLevel {
    /// Step-by-step detail.
    Trace,
    /// Detail for the tool's author.
    Debug,
    /// What the tool is doing.
    Info,
    /// Something worth a look.
    Warn,
    /// Something failed.
    Error,
}

/// Where a running call's log lines go, as the tool sends them (they go to
/// the host's log too).
pub type LogSink = Arc<dyn Fn(LogLevel, &str) + Send + Sync>;

/// What a call is given besides its input.
#[derive(Clone)]
pub struct CallContext {
    /// The shared context object (`cwd` and whatever tools added): one
    /// snapshot, shared by every call of a concurrent run.
    pub context: Arc<Value>,
    /// Where progress reports go, the moment the tool sends them.
    pub progress: ProgressSink,
    /// Where refused network requests are reported.
    pub refused: RefusalSink,
    /// Where the call's log lines go.
    pub log: LogSink,
}

impl CallContext {
    /// A context that drops progress reports and refusals.
    pub fn new(context: Value) -> Self {
        CallContext::shared(Arc::new(context))
    }

    /// [`CallContext::new`] with a context already shared. The sinks that
    /// drop everything are made once and shared: a call that reports to
    /// nobody allocates none.
    pub fn shared(context: Arc<Value>) -> Self {
        static DROPPED: LazyLock<(ProgressSink, RefusalSink, LogSink)> =
            LazyLock::new(|| (Arc::new(|_| {}), Arc::new(|_| {}), Arc::new(|_, _| {})));
        let (progress, refused, log) = &*DROPPED;
        CallContext { context, progress: progress.clone(), refused: refused.clone(), log: log.clone() }
    }

    /// This context, sending progress reports to `sink`.
    pub fn with_progress(self, sink: ProgressSink) -> Self {
        CallContext { progress: sink, ..self }
    }
}

/// A tool: something the model can call.
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    /// The input-independent facts.
    fn spec(&self) -> &ToolSpec;

    /// Begin one call on `input`, to run with `context` (the shared context
    /// as the call is planned): the returned invocation answers the
    /// per-input questions under that context and then runs the call. For a
    /// plugin this is one fresh sandbox, replaced by another if a question
    /// traps.
    async fn invoke(&self, input: Value, context: Arc<Value>) -> Result<Box<dyn Invocation>, CallError>;

    /// Whether every call runs read-only whatever its input, because the
    /// sandbox holds it to that: a plugin that fixed a read-only plan at
    /// load gets a read-only grant for every call. Default: false.
    fn always_read_only(&self) -> bool {
        false
    }

    /// Whether two inputs ask for the same thing. Default: equal JSON.
    async fn inputs_equivalent(&self, a: &Value, b: &Value) -> bool {
        a == b
    }

    /// Get ready for a first call: do now what the first call would
    /// otherwise do first, such as loading code left unloaded at start.
    /// Called again once every tool of the pool has been, to touch what a
    /// first call touches after the others' loads have cooled it. Never
    /// required; a failure is the first call's to report. Default: nothing.
    async fn warm_up(&self) {}
}

/// One call of a tool on one input, under one context: the per-input
/// questions, then the call. Every answer is about the input and the context
/// together; the host asks again after [`Invocation::set_context`].
///
/// Each default is the conservative answer (README, "Write a tool"), which is also what
/// a plugin's answer falls back to when it traps.
#[async_trait]
pub trait Invocation: Send {
    /// The input this call will run with (updated by a permission decision).
    fn input(&self) -> &Value;

    /// May run beside other safe calls. Default: false.
    async fn is_concurrency_safe(&mut self) -> bool {
        false
    }

    /// Writes nothing; a read-only call gets read-only access. Default: false.
    async fn is_read_only(&mut self) -> bool {
        false
    }

    /// Irreversible. Default: true.
    async fn is_destructive(&mut self) -> bool {
        true
    }

    /// Whether [`Invocation::validate_input`] and
    /// [`Invocation::check_permissions`] may answer anything but "valid" and
    /// "allow as is". When this says `false`, the host asks neither.
    /// Default: true.
    fn checks_input(&self) -> bool {
        true
    }

    /// The tool's own checks beyond the schema. Default: ok.
    async fn validate_input(&mut self) -> Result<(), String> {
        Ok(())
    }

    /// The tool's permission decision; only asked after validation passed.
    /// Default: allow as is.
    async fn check_permissions(&mut self) -> PermissionDecision {
        PermissionDecision::Allow(None)
    }

    /// The string permission rules match against. Default: none.
    async fn permission_subject(&mut self) -> Option<String> {
        None
    }

    /// A compact form for a safety classifier. Default: empty.
    async fn classifier_input(&mut self) -> String {
        String::new()
    }

    /// A short phrase shown beside live progress. Default: none.
    async fn activity_description(&mut self) -> Option<String> {
        None
    }

    /// Reaches beyond the workspace. Default: false.
    async fn is_open_world(&mut self) -> bool {
        false
    }

    /// A search or a read a UI may fold. Default: false.
    async fn is_search_or_read(&mut self) -> bool {
        false
    }

    /// Replace the input, after a permission decision updated it.
    fn set_input(&mut self, input: Value);

    /// The context the call will run with changed since the invocation
    /// began (an earlier call's modifier applied): every answer given under
    /// the old one is forgotten, and the questions are asked again under
    /// this one.
    fn set_context(&mut self, context: Arc<Value>);

    /// Draw this call's fuel, its questions included, from `fuel`, the
    /// allowance of the whole batch. Default: nothing to draw (native tools
    /// burn no fuel).
    fn share_batch_fuel(&mut self, fuel: BatchFuel) {
        let _ = fuel;
    }

    /// Record what this call's sandboxes use (fuel, memory, set-up time)
    /// from now on, for the call's figures
    /// ([`CallFigures`](crate::events::CallFigures)), and say where. Asked
    /// at most once, before any question, and only when someone reads the
    /// figures: an invocation never asked records nothing. Default: none (a
    /// native tool has no sandbox).
    fn record_usage(&mut self) -> Option<Arc<Usage>> {
        None
    }

    /// Run the call.
    async fn call(self: Box<Self>, cx: CallContext) -> Result<CallOutput, CallError>;
}
