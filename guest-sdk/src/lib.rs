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
//! input into the path to open.
//!
//! # Contract version
//!
//! The component exports the interface `keel:tool/guest@`[`CONTRACT_VERSION`];
//! a host built for another version refuses it at load with a message naming
//! both versions, instead of failing at the first call.
#![deny(missing_docs)]

// The generated bindings name this crate by its absolute path, as they must
// from the tool crates that expand `export!`.
extern crate self as keel_guest;

use std::fmt;
use std::path::{Component, Path, PathBuf};

use schemars::JsonSchema;
use serde::de::DeserializeOwned;

pub use serde_json::{Value, json};

/// The version of the WIT contract (`keel:tool`) this SDK builds against.
pub const CONTRACT_VERSION: &str = "0.2.0";

/// Where the host mounts the workspace inside the sandbox.
pub const WORKSPACE_MOUNT: &str = "/workspace";

/// The default for [`Tool::MAX_RESULT_SIZE`]: results longer than this many
/// characters are persisted by the host and replaced by a preview.
pub const DEFAULT_MAX_RESULT_SIZE_CHARS: u64 = 50_000;

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

/// What a successful call hands back.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Output {
    /// The text the model reads as the tool result.
    pub content: String,
    /// A change to the shared context, applied by the host as a JSON merge
    /// patch (RFC 7396) before the calls that follow see it.
    pub context_modifier: Option<Value>,
}

impl Output {
    /// An output of plain text with no context change.
    pub fn text(content: impl Into<String>) -> Self {
        Output { content: content.into(), context_modifier: None }
    }

    /// Attach a context change: a JSON object merged into the shared context.
    pub fn with_context_modifier(mut self, patch: Value) -> Self {
        self.context_modifier = Some(patch);
        self
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
    /// Former names that still reach this tool. Default: none.
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

    /// JSON Schema of structured output, if the tool has one. Default: none.
    fn output_schema() -> Option<Value> {
        None
    }

    /// Whether the tool is offered at all. Default: true.
    fn is_enabled() -> bool {
        true
    }

    /// Whether this call may run beside other safe calls. Default: false.
    fn is_concurrency_safe(_input: &Self::Input) -> bool {
        false
    }

    /// Whether this call writes nothing. Default: false. When true the call is
    /// given read-only access: the claim is enforced, not trusted.
    fn is_read_only(_input: &Self::Input) -> bool {
        false
    }

    /// Whether this call does something irreversible. Default: false.
    fn is_destructive(_input: &Self::Input) -> bool {
        false
    }

    /// Checks beyond the schema; the error is shown to the model. Default: ok.
    fn validate_input(_input: &Self::Input) -> Result<()> {
        Ok(())
    }

    /// The tool's permission decision, asked only after validation passed.
    /// Default: allow, input unchanged.
    fn check_permissions(_input: &Self::Input) -> Permission {
        Permission::Allow
    }

    /// The string a rule such as `Shell(git *)` matches. Default: none.
    fn permission_subject(_input: &Self::Input) -> Option<String> {
        None
    }

    /// A compact form of the input for a safety classifier. Default: empty,
    /// which skips the classifier: safety-relevant tools must override it.
    fn classifier_input(_input: &Self::Input) -> String {
        String::new()
    }

    /// The name shown to people for this call. Default: the tool's name.
    fn user_facing_name(_input: &Self::Input) -> String {
        if Self::USER_FACING_NAME.is_empty() { Self::NAME } else { Self::USER_FACING_NAME }.to_string()
    }

    /// A short phrase shown beside live progress. Default: none.
    fn activity_description(_input: &Self::Input) -> Option<String> {
        None
    }

    /// Whether the call reaches beyond the workspace. Default: false.
    fn is_open_world(_input: &Self::Input) -> bool {
        false
    }

    /// Whether the call is a search or a read a UI may fold. Default: false.
    fn is_search_or_read(_input: &Self::Input) -> bool {
        false
    }

    /// Whether two inputs ask for the same thing. Default: equal JSON.
    fn inputs_equivalent(a: &Value, b: &Value) -> bool {
        a == b
    }

    /// Run the tool.
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
#[macro_export]
macro_rules! export {
    ($tool:ty $(,)?) => {
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
}

/// The README's examples, compiled as doctests so they cannot drift.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
