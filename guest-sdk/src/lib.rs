//! Write a tool for keel: one type, one trait impl, one macro line.
//!
//! A keel tool is a Rust crate built for `wasm32-wasip2` into one `.wasm`
//! component. The input is a plain Rust type: its JSON Schema is derived with
//! [`schemars`], and the host checks every call's input against it before the
//! tool sees it.
//!
//! ```
//! use keel_guest::{Context, Output, Result, Tool};
//! use schemars::JsonSchema;
//! use serde::Deserialize;
//!
//! #[derive(Deserialize, JsonSchema)]
//! struct Input { /** Who to greet. */ name: String }
//!
//! struct Hello;
//! impl Tool for Hello {
//!     type Input = Input;
//!     const NAME: &str = "hello";
//!     const DESCRIPTION: &str = "Greets someone by name.";
//!     fn call(input: Input, _cx: &Context) -> Result<Output> {
//!         Ok(format!("Hello, {}!", input.name).into())
//!     }
//! }
//! keel_guest::export!(Hello);
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip2` (the crate is a
//! `cdylib`) and run it with `keel run --plugins target/wasm32-wasip2/release/`.
//!
//! # Questions before the call
//!
//! Before a call runs, the host asks the tool about its input: may it run
//! beside others ([`Tool::is_concurrency_safe`]), does it write
//! ([`Tool::is_read_only`]), is it allowed ([`Tool::check_permissions`]), what
//! does a permission rule match ([`Tool::permission_subject`]) and so on.
//! Every such question receives the [`Context`] the call will run with, the
//! same one [`Tool::call`] receives, so an answer about a path resolves it
//! exactly as the call will: with [`Context::resolve`], against the working
//! directory a `cd` earlier in the batch may have changed.
//!
//! # Output
//!
//! A call returns an [`Output`]: the [`Block`]s the model reads, text and
//! [`Image`]s in order, an optional structured value (for a tool that
//! declares an output schema with [`Tool::output_schema`] and
//! [`schema_for`]), and an optional change to the shared context.
//!
//! ```
//! use keel_guest::{Context, Image, Output, Result, Tool};
//! # use schemars::JsonSchema;
//! # use serde::Deserialize;
//! # #[derive(Deserialize, JsonSchema)]
//! # struct Input {}
//! # const PNG: &[u8] = &[];
//! # struct Chart;
//! # impl Tool for Chart {
//! #     type Input = Input;
//! #     const NAME: &str = "chart";
//! #     const DESCRIPTION: &str = "Draws a chart.";
//! fn call(_input: Input, _cx: &Context) -> Result<Output> {
//!     Ok(Output::text("The chart:").with_image(Image::png(PNG)))
//! }
//! # }
//! ```
//!
//! # Defaults
//!
//! Every method of [`Tool`] but [`Tool::call`] has a default, and each default is
//! the *conservative* answer: a tool that forgets to declare something is
//! treated as slower and riskier, never faster and looser. A tool that does not
//! say it is concurrency-safe runs alone; one that does not say it is read-only
//! gets write access only where the host grants it and is assumed to write.
//!
//! # Files
//!
//! The host mounts the workspace at `/workspace` (read-only for a call whose
//! [`Tool::is_read_only`] is true). [`Context::resolve`] turns a path from the
//! input into the path to open, and [`Context::workspace_relative`] names it
//! for [`Tool::permission_subject`]: relative to the workspace root and
//! normalized, whatever the working directory, so a rule written against the
//! workspace (`write_file(secrets/**)`) holds after a `cd`.
//!
//! # Outbound HTTP
//!
//! [`http`] is a small blocking client over `wasi:http`. The host checks every
//! request before it leaves (is the destination granted, is it a private
//! address, how much is left of the call's limits) and a refusal arrives as an
//! [`http::Error`] whose message is the host's reason; a tool's `?` hands it
//! to the model as it is. A tool that reaches the network answers
//! [`Tool::is_open_world`] with `true`: the host gives a call that answers
//! `false` (the default) no network at all.
//!
//! ```no_run
//! use keel_guest::{Context, Output, Result, Tool, bail, http};
//! # use schemars::JsonSchema;
//! # use serde::Deserialize;
//! # #[derive(Deserialize, JsonSchema)]
//! # struct Input { url: String }
//! # struct Fetch;
//! # impl Tool for Fetch {
//! #     type Input = Input;
//! #     const NAME: &str = "fetch";
//! #     const DESCRIPTION: &str = "Fetches a URL.";
//!
//! fn call(input: Input, _cx: &Context) -> Result<Output> {
//!     let response = http::get(&input.url)?;
//!     if !response.is_success() {
//!         bail!("{} answered {}", input.url, response.status);
//!     }
//!     Ok(Output::text(response.text()?))
//! }
//! # }
//! ```
//!
//! Redirects are handed back, not followed, unless the request asks with
//! [`http::Request::follow_redirects`]; a body is read whole only up to a cap
//! ([`http::Request::max_body`], 10 MiB by default) and a longer one is an
//! error, not a shortened body.
//!
//! # Contract version
//!
//! The component exports the interface `keel:tool/guest@`[`CONTRACT_VERSION`]
//! (`wit/v0.4.0/tool.wit` in the keel repository). A host loads the versions
//! it supports and refuses any other at load with a message naming them,
//! instead of failing at the first call.
#![deny(missing_docs)]

// The generated bindings name this crate by its absolute path, as they must
// from the tool crates that expand `export!`.
extern crate self as keel_guest;

use std::fmt;
use std::path::{Component, Path, PathBuf};

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use serde_json::{Value, json};

/// The version of the WIT contract (`keel:tool`) this SDK builds against.
pub const CONTRACT_VERSION: &str = "0.4.0";

/// Where the host mounts the workspace inside the sandbox.
pub const WORKSPACE_MOUNT: &str = "/workspace";

/// The default for [`Tool::MAX_RESULT_SIZE`]: results longer than this many
/// characters are persisted by the host and replaced by a preview.
pub const DEFAULT_MAX_RESULT_SIZE_CHARS: u64 = 50_000;

/// How every call of a tool may run, when that does not depend on the
/// input: see [`Tool::FIXED_PLAN`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Whether a call may run beside other concurrency-safe calls.
    pub concurrency_safe: bool,
    /// Whether a call writes nothing; the host then grants it read-only access.
    pub read_only: bool,
}

impl Plan {
    /// Concurrency-safe and read-only: a tool that only reads or computes.
    pub const SAFE_READ_ONLY: Plan = Plan { concurrency_safe: true, read_only: true };
}

/// What the host does with a running call when the batch is interrupted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interrupt {
    /// Stop the call promptly; its result says it was interrupted.
    Cancel,
    /// Let the call finish. The default: stopping a tool midway may leave its
    /// work half done.
    Block,
}

/// A tool's decision on whether one call may go ahead.
#[derive(Clone, Debug, PartialEq)]
pub enum Permission {
    /// Go ahead with the input as it is.
    Allow,
    /// Go ahead, but with this input instead (for example, a normalised path).
    AllowWithInput(Value),
    /// Refuse, telling the model why.
    Deny(String),
    /// Ask the user first, saying what is being asked.
    Ask(String),
}

/// An error a tool returns; the host hands its message to the model as a
/// failed tool result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error(String);

impl Error {
    /// An error with this message.
    pub fn msg(message: impl fmt::Display) -> Self {
        Error(message.to_string())
    }

    /// An I/O error about `subject` (a path, usually): `failed to read a.txt:
    /// No such file or directory`. The OS error number is left out: inside the
    /// sandbox it is a WASI number that means nothing to a model.
    pub fn io(action: &str, subject: impl fmt::Display, error: &std::io::Error) -> Self {
        let text = error.to_string();
        let text = match text.rfind(" (os error ") {
            Some(at) if text.ends_with(')') => &text[..at],
            _ => &text,
        };
        Error(format!("{action} {subject}: {text}"))
    }

    /// The message the model will read.
    pub fn message(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<E: std::error::Error> From<E> for Error {
    fn from(error: E) -> Self {
        Error(error.to_string())
    }
}

/// Return early with an [`Error`] built like `format!`.
///
/// ```
/// fn check(n: u32) -> keel_guest::Result<u32> {
///     if n == 0 {
///         keel_guest::bail!("`n` must be positive, got {n}");
///     }
///     Ok(n)
/// }
/// assert_eq!(check(0).unwrap_err().message(), "`n` must be positive, got 0");
/// ```
#[macro_export]
macro_rules! bail {
    ($($arg:tt)*) => {
        return ::core::result::Result::Err($crate::Error::msg(::std::format!($($arg)*)))
    };
}

/// The result type of a tool's methods.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The JSON Schema of `T`, derived as the input schema is: what
/// [`Tool::output_schema`] returns for a tool with structured output.
///
/// ```
/// use keel_guest::Value;
/// use schemars::JsonSchema;
///
/// #[derive(JsonSchema)]
/// struct Counts { /** Lines in the file. */ lines: u64 }
///
/// let schema = keel_guest::schema_for::<Counts>();
/// assert_eq!(schema["properties"]["lines"]["description"], "Lines in the file.");
/// assert_eq!(schema["required"], Value::from(vec!["lines"]));
/// ```
pub fn schema_for<T: JsonSchema>() -> Value {
    serde_json::to_value(schemars::schema_for!(T)).expect("a derived schema is valid JSON")
}

/// An image a tool hands back: encoded bytes and what they are.
///
/// The host checks that `data` holds an image of `media_type` and refuses the
/// result otherwise, so label the bytes with what they are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    /// The media type of `data`: `image/png`, `image/jpeg`, `image/gif` or
    /// `image/webp`.
    pub media_type: String,
    /// The encoded image.
    pub data: Vec<u8>,
}

impl Image {
    /// An image of the given media type.
    pub fn new(media_type: impl Into<String>, data: impl Into<Vec<u8>>) -> Self {
        Image { media_type: media_type.into(), data: data.into() }
    }

    /// A PNG image (`image/png`).
    pub fn png(data: impl Into<Vec<u8>>) -> Self {
        Image::new("image/png", data)
    }

    /// A JPEG image (`image/jpeg`).
    pub fn jpeg(data: impl Into<Vec<u8>>) -> Self {
        Image::new("image/jpeg", data)
    }

    /// A GIF image (`image/gif`).
    pub fn gif(data: impl Into<Vec<u8>>) -> Self {
        Image::new("image/gif", data)
    }

    /// A WebP image (`image/webp`).
    pub fn webp(data: impl Into<Vec<u8>>) -> Self {
        Image::new("image/webp", data)
    }
}

/// One block of a call's result, in the order the model reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Block {
    /// Text.
    Text(String),
    /// An image.
    Image(Image),
}

/// What a successful call hands back.
///
/// ```
/// use keel_guest::{Block, Image, Output, OutputText, json};
///
/// let output = Output::text("Two files written")
///     .with_image(Image::png(vec![0x89, b'P', b'N', b'G']))
///     .with_context_modifier(json!({ "files_written": 2 }));
/// assert!(matches!(output.content.as_slice(), [Block::Text(_), Block::Image(_)]));
/// assert_eq!(output.text(), "Two files written");
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Output {
    /// What the model reads, in order: text and image blocks.
    pub content: Vec<Block>,
    /// A structured value: only for a tool whose [`Tool::output_schema`] is
    /// declared, and the host checks the value against that schema. With no
    /// text block, the model reads the value's JSON text.
    pub structured: Option<Value>,
    /// A change to the shared context, applied by the host as a JSON merge
    /// patch (RFC 7396) before the calls that follow see it.
    pub context_modifier: Option<Value>,
}

impl Output {
    /// An output of one text block.
    pub fn text(content: impl Into<String>) -> Self {
        Output::default().with_text(content)
    }

    /// An output of one image block.
    pub fn image(image: Image) -> Self {
        Output::default().with_image(image)
    }

    /// An output whose structured value is `value` and that has no text
    /// block: the host shows the model the value's JSON text. The tool must
    /// declare the value's schema with [`Tool::output_schema`].
    ///
    /// Fails only when `value` cannot be represented as JSON (a map with
    /// non-string keys, say).
    pub fn structured<T: Serialize>(value: &T) -> Result<Output> {
        Ok(Output { structured: Some(serde_json::to_value(value)?), ..Output::default() })
    }

    /// Append a text block.
    pub fn with_text(mut self, text: impl Into<String>) -> Self {
        self.content.push(Block::Text(text.into()));
        self
    }

    /// Append an image block.
    pub fn with_image(mut self, image: Image) -> Self {
        self.content.push(Block::Image(image));
        self
    }

    /// Attach a context change: a JSON object merged into the shared context.
    pub fn with_context_modifier(mut self, patch: Value) -> Self {
        self.context_modifier = Some(patch);
        self
    }
}

/// The text of an [`Output`]: `output.text()`, the text blocks joined, handy
/// in a tool's tests.
///
/// It is a trait method only because `Output::text` already names the
/// constructor and one type cannot have both as inherent items. [`export!`]
/// brings the trait into scope in the module it is written in (and so in a
/// `mod tests` that imports `super::*`); elsewhere import it:
/// `use keel_guest::OutputText;`.
pub trait OutputText {
    /// The text blocks, joined with a newline between each two; images are
    /// left out.
    fn text(&self) -> String;
}

impl OutputText for Output {
    fn text(&self) -> String {
        let texts: Vec<&str> = self
            .content
            .iter()
            .filter_map(|block| match block {
                Block::Text(text) => Some(text.as_str()),
                Block::Image(_) => None,
            })
            .collect();
        texts.join("\n")
    }
}

impl From<String> for Output {
    fn from(content: String) -> Self {
        Output::text(content)
    }
}

impl From<&str> for Output {
    fn from(content: &str) -> Self {
        Output::text(content)
    }
}

/// The shared context of a batch, as the host passed it to this call.
#[derive(Clone, Debug, PartialEq)]
pub struct Context {
    value: Value,
}

impl Context {
    /// Wrap a context object; tests use this to call a tool natively.
    pub fn new(value: Value) -> Self {
        Context { value }
    }

    /// A context whose working directory is the workspace root.
    pub fn workspace_root() -> Self {
        Context::new(json!({ "cwd": WORKSPACE_MOUNT }))
    }

    /// The working directory as the tool sees it.
    pub fn cwd(&self) -> &str {
        self.value.get("cwd").and_then(Value::as_str).unwrap_or(WORKSPACE_MOUNT)
    }

    /// Resolve a path from the input against the working directory, without
    /// touching the filesystem: `.` and `..` are folded lexically, so the result
    /// never climbs above `/`. Absolute paths are kept.
    pub fn resolve(&self, path: impl AsRef<Path>) -> PathBuf {
        let mut out = PathBuf::from("/");
        for part in Path::new(self.cwd()).join(path).components() {
            match part {
                Component::Normal(name) => out.push(name),
                Component::ParentDir => {
                    out.pop();
                }
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            }
        }
        out
    }

    /// A path from the input named as a permission subject: resolved against
    /// the working directory exactly as [`Context::resolve`] does, then
    /// relative to the workspace root and normalized. The root itself is
    /// `.`; a path outside the workspace keeps its absolute normalized form.
    ///
    /// A rule such as `write_file(secrets/**)` is written against the workspace,
    /// so a subject named this way matches it whatever the working directory.
    ///
    /// ```
    /// use keel_guest::{Context, json};
    ///
    /// let cx = Context::new(json!({ "cwd": "/workspace/secrets" }));
    /// assert_eq!(cx.workspace_relative("k.txt"), "secrets/k.txt");
    /// assert_eq!(cx.workspace_relative(".."), ".");
    /// assert_eq!(cx.workspace_relative("/etc/passwd"), "/etc/passwd");
    /// ```
    pub fn workspace_relative(&self, path: impl AsRef<Path>) -> String {
        let resolved = self.resolve(path);
        match resolved.strip_prefix(WORKSPACE_MOUNT) {
            Ok(rest) if rest.as_os_str().is_empty() => ".".to_string(),
            Ok(rest) => rest.display().to_string(),
            Err(_) => resolved.display().to_string(),
        }
    }

    /// A value of the context by key, such as one a tool added earlier.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.value.get(key)
    }

    /// The whole context object.
    pub fn as_value(&self) -> &Value {
        &self.value
    }
}

/// One tool. Implement it on a type and export the type with [`export!`].
///
/// Only `Input`, `NAME`, `DESCRIPTION` and [`Tool::call`] are required; every
/// other item has the conservative default described on it.
///
/// Every question about one input receives the [`Context`] the call will run
/// with, the one [`Tool::call`] then receives: resolve a path from the input
/// with [`Context::resolve`] in an answer exactly as in the call, and name a
/// path subject with [`Context::workspace_relative`]. The host asks again
/// when the context changes before the call's turn.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a keel tool: it does not implement `keel_guest::Tool`",
    label = "`keel_guest::export!` needs a type that implements `keel_guest::Tool`",
    note = "write `impl keel_guest::Tool for {Self}`, giving at least `Input`, `NAME`, \
            `DESCRIPTION` and `call`"
)]
pub trait Tool {
    /// The input the model sends; its JSON Schema is derived with schemars.
    /// Doc comments on its fields become the schema's descriptions.
    type Input: DeserializeOwned + JsonSchema + 'static;

    /// The name the model calls the tool by: letters, digits, `_` and `-`.
    const NAME: &'static str;
    /// What the tool does, for the model.
    const DESCRIPTION: &'static str;
    /// Longer usage guidance for the model. Default: none.
    const PROMPT: &'static str = "";
    /// Former names that still reach this tool, each held to the rules of
    /// [`Tool::NAME`] (a plugin with another is refused). A `deny` rule that
    /// names an alias covers the tool; `allow` and `ask` rules match its own
    /// name only. Default: none.
    const ALIASES: &'static [&'static str] = &[];
    /// A 3–10 word phrase a search for deferred tools matches. Default: none.
    const SEARCH_HINT: Option<&'static str> = None;
    /// List the tool by name only until a search asks for it. Default: false.
    const SHOULD_DEFER: bool = false;
    /// Send the full definition even when deferred. Default: false.
    const ALWAYS_LOAD: bool = false;
    /// Ask the model provider to hold input strictly to the schema. Default: false.
    const STRICT: bool = false;
    /// What an interrupt does to a running call. Default: [`Interrupt::Block`].
    const INTERRUPT: Interrupt = Interrupt::Block;
    /// The name shown to people. Default: [`Tool::NAME`].
    const USER_FACING_NAME: &'static str = "";
    /// Characters of output before the host persists the result and shows a
    /// preview; `None` claims the tool bounds its own output, which the host
    /// honours only for plugins it trusts. Default: 50,000.
    const MAX_RESULT_SIZE: Option<u64> = Some(DEFAULT_MAX_RESULT_SIZE_CHARS);
    /// Whether the tool needs a person at the keyboard. Default: false.
    const REQUIRES_USER_INTERACTION: bool = false;
    /// The plan of every call, when it is the same whatever the input and
    /// the context: the host reads it once, at load, and then never asks
    /// [`Tool::is_concurrency_safe`] or [`Tool::is_read_only`], whose defaults
    /// give its answer. A call then costs one export less. The read-only
    /// claim is enforced as it is when asked. A tool that overrides either
    /// question must answer as the plan says: a call for which it answers
    /// otherwise fails, naming both, and is not run. Default: none, asked of
    /// each call.
    const FIXED_PLAN: Option<Plan> = None;
    /// Whether [`Tool::validate_input`] or [`Tool::check_permissions`] may
    /// refuse an input, rewrite it or ask the user. When false the host never
    /// asks them: every input that passes the schema is valid and allowed by
    /// the tool (the host's permission rules still apply), and a call costs
    /// one export less. A tool that overrides either and yet refuses, asks
    /// or rewrites fails that call, naming the claim, and the call is not
    /// run. Default: true.
    const CHECKS_INPUT: bool = true;
    /// Whether the SDK holds the tool to [`Tool::FIXED_PLAN`] and
    /// [`Tool::CHECKS_INPUT`] in each call, asking the questions they answer
    /// once more there. Only a test guest that traps when the host asks one
    /// of them turns it off. Default: true.
    #[doc(hidden)]
    const HOLD_CLAIMS: bool = true;

    /// JSON Schema of structured output, if the tool has one: usually
    /// `Some(keel_guest::schema_for::<MyOutput>())`. The host checks every
    /// [`Output::structured`] value against it. Default: none.
    fn output_schema() -> Option<Value> {
        None
    }

    /// Whether the tool is offered at all. Default: true.
    fn is_enabled() -> bool {
        true
    }

    /// Whether this call may run beside other safe calls. Default:
    /// [`Tool::FIXED_PLAN`]'s answer, else false.
    fn is_concurrency_safe(_input: &Self::Input, _cx: &Context) -> bool {
        Self::FIXED_PLAN.is_some_and(|plan| plan.concurrency_safe)
    }

    /// Whether this call writes nothing. Default: [`Tool::FIXED_PLAN`]'s
    /// answer, else false. When true the call is given read-only access: the
    /// claim is enforced, not trusted.
    fn is_read_only(_input: &Self::Input, _cx: &Context) -> bool {
        Self::FIXED_PLAN.is_some_and(|plan| plan.read_only)
    }

    /// Whether this call does something irreversible. Default: false.
    fn is_destructive(_input: &Self::Input, _cx: &Context) -> bool {
        false
    }

    /// Checks beyond the schema; the error is shown to the model. Default: ok.
    fn validate_input(_input: &Self::Input, _cx: &Context) -> Result<()> {
        Ok(())
    }

    /// The tool's permission decision, asked only after validation passed.
    /// Default: allow, input unchanged.
    fn check_permissions(_input: &Self::Input, _cx: &Context) -> Permission {
        Permission::Allow
    }

    /// The string a rule such as `Shell(git *)` matches. Default: none. A
    /// path is named with [`Context::workspace_relative`], so a rule written
    /// against the workspace holds after a `cd`.
    fn permission_subject(_input: &Self::Input, _cx: &Context) -> Option<String> {
        None
    }

    /// A compact form of the input for a safety classifier. Default: empty,
    /// which skips the classifier: safety-relevant tools must override it.
    fn classifier_input(_input: &Self::Input, _cx: &Context) -> String {
        String::new()
    }

    /// The name shown to people for this call. Default: the tool's name.
    fn user_facing_name(_input: &Self::Input, _cx: &Context) -> String {
        if Self::USER_FACING_NAME.is_empty() { Self::NAME } else { Self::USER_FACING_NAME }.to_string()
    }

    /// A short phrase shown beside live progress. Default: none.
    fn activity_description(_input: &Self::Input, _cx: &Context) -> Option<String> {
        None
    }

    /// Whether the call reaches beyond the workspace. Default: false.
    fn is_open_world(_input: &Self::Input, _cx: &Context) -> bool {
        false
    }

    /// Whether the call is a search or a read a UI may fold. Default: false.
    fn is_search_or_read(_input: &Self::Input, _cx: &Context) -> bool {
        false
    }

    /// Whether two inputs ask for the same thing. Default: equal JSON.
    fn inputs_equivalent(a: &Value, b: &Value) -> bool {
        a == b
    }

    /// Run the tool, in the context its questions saw.
    fn call(input: Self::Input, cx: &Context) -> Result<Output>;
}

/// Send progress of the running call to the host, which forwards it at once.
///
/// Outside a keel sandbox (in native unit tests) it does nothing.
pub fn progress(data: &Value) {
    #[cfg(target_arch = "wasm32")]
    __private::bindings::keel::tool::host::progress(&data.to_string());
    #[cfg(not(target_arch = "wasm32"))]
    let _ = data;
}

/// A progress report in the shape of MCP's `notifications/progress`: a
/// count so far, the total when it is known, and a line for a person.
///
/// The host shows it as a bar with its message (`keel run` on a terminal)
/// and `keel serve` sends it on to an MCP client as `progress`, `total` and
/// `message`. Each report of a call should count higher than the one before.
///
/// ```
/// use keel_guest::Progress;
///
/// let report = Progress::new(3).total(8).message("copied 3 of 8 files");
/// assert_eq!(report.to_value(), keel_guest::json!({ "progress": 3, "total": 8, "message": "copied 3 of 8 files" }));
/// report.report();
/// ```
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Progress {
    progress: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    total: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
}

impl Progress {
    /// A report of `progress` done so far, with no total and no message.
    pub fn new(progress: u64) -> Self {
        Progress { progress, total: None, message: None }
    }

    /// How much there is to do in all, in the unit of the count.
    pub fn total(mut self, total: u64) -> Self {
        self.total = Some(total);
        self
    }

    /// A short line saying what is being done now.
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }

    /// The report as the JSON the host receives.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a progress report is plain JSON")
    }

    /// Send the report to the host ([`progress`]).
    pub fn report(&self) {
        progress(&self.to_value());
    }
}

/// Write to the host's log, tagged with the tool's name.
///
/// Outside a keel sandbox (in native unit tests) it does nothing.
pub mod log {
    macro_rules! level {
        ($(#[$doc:meta] $name:ident => $level:ident,)*) => {$(
            #[$doc]
            pub fn $name(message: &str) {
                #[cfg(target_arch = "wasm32")]
                {
                    use crate::__private::bindings::keel::tool::types::LogLevel;
                    crate::__private::bindings::keel::tool::host::log(LogLevel::$level, message);
                }
                #[cfg(not(target_arch = "wasm32"))]
                let _ = message;
            }
        )*};
    }
    level! {
        /// Log a trace message.
        trace => Trace,
        /// Log a debug message.
        debug => Debug,
        /// Log an informational message.
        info => Info,
        /// Log a warning.
        warn => Warn,
        /// Log an error.
        error => Error,
    }
}

/// Export a type implementing [`Tool`] as the component's tool.
///
/// Write it once per crate, at the top level: `keel_guest::export!(MyTool);`
/// It also brings [`OutputText`] into scope there, so `output.text()` works in
/// the crate root and in a `mod tests` that imports `super::*`.
#[macro_export]
macro_rules! export {
    ($tool:ty $(,)?) => {
        // `output.text()` in the tool's module and its tests, without an import.
        #[allow(unused_imports)]
        use $crate::OutputText as _;
        const _: () = {
            struct __KeelExport;
            impl $crate::__private::Exports for __KeelExport {
                type Tool = $tool;
            }
            // Only a wasm32 build is a component; a native build (the tool's
            // unit tests) checks the type but exports nothing.
            #[cfg(target_arch = "wasm32")]
            $crate::__private::export_tool!(
                __KeelExport with_types_in $crate::__private::bindings
            );
        };
    };
    () => {
        ::core::compile_error!(
            "`keel_guest::export!` needs the tool type: `keel_guest::export!(MyTool);`"
        );
    };
    ($tool:ty, $($more:tt)+) => {
        ::core::compile_error!(::core::concat!(
            "`keel_guest::export!` takes one tool type, got `",
            ::core::stringify!($tool, $($more)+),
            "`: a component exports exactly one tool, so give each tool a crate of its own"
        ));
    };
    ($($other:tt)+) => {
        ::core::compile_error!(::core::concat!(
            "`keel_guest::export!` takes the tool's type, as in ",
            "`keel_guest::export!(MyTool);`, got `",
            ::core::stringify!($($other)+),
            "`"
        ));
    };
}

pub mod http;

#[doc(hidden)]
pub mod __private;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_leave_out_the_os_error_number() {
        let error = std::io::Error::from_raw_os_error(2);
        assert_eq!(
            Error::io("failed to read", "a.txt", &error).message(),
            "failed to read a.txt: No such file or directory"
        );
        let error = std::io::Error::other("disk on fire");
        assert_eq!(Error::io("failed to write", "b", &error).message(), "failed to write b: disk on fire");
    }

    #[test]
    fn resolve_folds_dots_against_the_working_directory() {
        let cx = Context::new(json!({ "cwd": "/workspace/src" }));
        assert_eq!(cx.resolve("a.rs"), PathBuf::from("/workspace/src/a.rs"));
        assert_eq!(cx.resolve("../b/./c.rs"), PathBuf::from("/workspace/b/c.rs"));
        assert_eq!(cx.resolve("../../../../etc"), PathBuf::from("/etc"));
        assert_eq!(cx.resolve("/workspace/x"), PathBuf::from("/workspace/x"));
        assert_eq!(Context::new(json!({})).cwd(), WORKSPACE_MOUNT);
    }

    #[test]
    fn workspace_relative_names_a_path_from_the_workspace_root() {
        let secrets = Context::new(json!({ "cwd": "/workspace/secrets" }));
        assert_eq!(secrets.workspace_relative("k.txt"), "secrets/k.txt");
        assert_eq!(secrets.workspace_relative("./deep/../k.txt"), "secrets/k.txt");
        assert_eq!(secrets.workspace_relative("../src/a.rs"), "src/a.rs");
        assert_eq!(secrets.workspace_relative(".."), ".");
        assert_eq!(secrets.workspace_relative("/workspace/secrets/k.txt"), "secrets/k.txt");

        let root = Context::workspace_root();
        assert_eq!(root.workspace_relative("./a/../secrets/k.txt"), "secrets/k.txt");
        assert_eq!(root.workspace_relative("."), ".");
        assert_eq!(root.workspace_relative(""), ".");
        assert_eq!(root.workspace_relative("/workspace"), ".");
        assert_eq!(root.workspace_relative("dir/"), "dir");
    }

    #[test]
    fn workspace_relative_keeps_a_path_outside_the_workspace_absolute() {
        let secrets = Context::new(json!({ "cwd": "/workspace/secrets" }));
        assert_eq!(secrets.workspace_relative("/etc/passwd"), "/etc/passwd");
        assert_eq!(secrets.workspace_relative("../../etc/./passwd"), "/etc/passwd");
        assert_eq!(secrets.workspace_relative("../../../.."), "/");
        // A sibling whose name starts with the mount's is outside it.
        assert_eq!(secrets.workspace_relative("/workspace2/k.txt"), "/workspace2/k.txt");
    }

    #[test]
    fn output_builders_append_blocks_in_order() {
        let output = Output::text("one").with_image(Image::gif(vec![1])).with_text("two");
        assert_eq!(
            output.content,
            [
                Block::Text("one".into()),
                Block::Image(Image::new("image/gif", [1])),
                Block::Text("two".into())
            ]
        );
        assert_eq!(output.text(), "one\ntwo");
        assert_eq!(Output::image(Image::png([1, 2])).text(), "");
        assert_eq!(Output::from("hi"), Output::text("hi"));
        assert_eq!(Output::from(String::from("hi")).content, [Block::Text("hi".into())]);
    }

    #[test]
    fn image_constructors_label_the_bytes() {
        assert_eq!(Image::png([0]).media_type, "image/png");
        assert_eq!(Image::jpeg([0]).media_type, "image/jpeg");
        assert_eq!(Image::gif([0]).media_type, "image/gif");
        assert_eq!(Image::webp([0]).media_type, "image/webp");
        assert_eq!(Image::new("image/png", vec![7, 8]).data, [7, 8]);
    }

    #[test]
    fn structured_output_has_a_value_and_no_text_block() {
        #[derive(Serialize)]
        struct Counts {
            lines: u64,
        }
        let output = Output::structured(&Counts { lines: 3 }).unwrap();
        assert_eq!(output.structured, Some(json!({ "lines": 3 })));
        assert!(output.content.is_empty());
        assert_eq!(output.context_modifier, None);

        let mut bad = std::collections::HashMap::new();
        bad.insert(vec![1u8], 1);
        assert!(Output::structured(&bad).is_err(), "a map with non-string keys is not JSON");
    }

    #[test]
    fn progress_reports_serialize_in_the_mcp_shape() {
        assert_eq!(Progress::new(2).to_value().to_string(), r#"{"progress":2}"#);
        assert_eq!(
            Progress::new(2).total(8).message("step 2 of 8").to_value().to_string(),
            r#"{"progress":2,"total":8,"message":"step 2 of 8"}"#
        );
        assert_eq!(
            Progress::new(0).message("starting").to_value().to_string(),
            r#"{"progress":0,"message":"starting"}"#
        );
    }

    #[test]
    fn schema_for_derives_as_the_input_schema_is() {
        #[derive(JsonSchema)]
        #[expect(dead_code, reason = "only its schema is used")]
        struct Counts {
            /// Lines.
            lines: u64,
        }
        let schema = schema_for::<Counts>();
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["properties"]["lines"]["description"], "Lines.");
        assert_eq!(schema.to_string(), __private::input_schema::<Counts>());
    }
}

/// The README's examples, compiled as doctests so they cannot drift.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
