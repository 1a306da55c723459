//! `keel.toml`: the host's configuration file.
//!
//! Every section is optional; a missing file is the defaults. Unknown keys are
//! errors naming the file and the key, so a typo never silently loosens or
//! tightens anything.
//!
//! ```toml
//! # Calls of one concurrency-safe run in flight at once (default 10).
//! max_tool_use_concurrency = 4
//!
//! [limits]          # per call; see `Limits` for each default
//! fuel = 10_000_000_000
//! deadline_ms = 30_000
//! memory_mib = 256
//!
//! [plugins."acme_*"] # grants by tool name or pattern; see `grants`
//! env = ["ACME_REGION"]
//!
//! [permissions]     # rules for calls; see `permissions`
//! deny = ["write_file(**/*.lock)"]
//!
//! [cache]
//! max_size_mib = 512  # the compile cache's cap, least recently seen out first
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::limits::Limits;
pub use crate::load::grants::PluginsConfig;

/// The file name looked for in the working directory.
pub const FILE_NAME: &str = "keel.toml";

/// The largest configuration file read. A `keel.toml` with a few hundred
/// rules and grants is tens of kilobytes; a file of megabytes is not one
/// (`/dev/zero` named by mistake would otherwise be read until memory ran
/// out).
pub const MAX_FILE_BYTES: usize = 1 << 20;

/// The largest PEM file of `[network] roots` read. A system's whole bundle
/// of certificate authorities is about 200 KB.
pub const MAX_ROOTS_FILE_BYTES: usize = 4 << 20;

/// The largest `max_tool_use_concurrency`. The engine keeps at most 1,000
/// sandboxes alive at once across all calls (`load/engine.rs`), each call in
/// flight holding one, so more calls than that never run together; and the
/// scheduler sums positions and twice the cap, which a cap near `usize::MAX`
/// overflows.
pub const MAX_TOOL_USE_CONCURRENCY: usize = 1_000;

/// The largest `stack_kib`: 256 MiB, 256 times the default, far past any
/// finite recursion of real work. The engine sets aside address space for a
/// stack of this size in each of its 1,000 sandbox slots, so a larger one
/// takes hundreds of gigabytes of it, and one near `usize::MAX` overflows.
pub const MAX_STACK_KIB: usize = 256 << 10;

/// The largest `table_elements`: ten million, a hundred times the default
/// (real tools use a few hundred). The engine sets aside 8 bytes of address
/// space per element in each of its 4,000 table slots: 320 GB at this bound,
/// within any 64-bit host's, where a thousand times more is not.
pub const MAX_TABLE_ELEMENTS: usize = 10_000_000;

/// The longest permission rule, in bytes: a path is at most 4 KiB, and a
/// pattern of hundreds of kilobytes makes a matcher larger than the glob
/// compiler builds.
pub const MAX_RULE_BYTES: usize = 4 << 10;

/// The parsed configuration.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, expecting = "a table of keel settings")]
pub struct Config {
    /// Calls of one concurrency-safe run in flight at once; overrides
    /// `KEEL_MAX_TOOL_USE_CONCURRENCY`.
    /// At most [`MAX_TOOL_USE_CONCURRENCY`].
    #[serde(default, deserialize_with = "max_tool_use_concurrency")]
    pub max_tool_use_concurrency: Option<usize>,
    /// `[budget]`: overrides of the result budgets.
    #[serde(default)]
    pub budget: crate::budget::BudgetConfig,
    /// Overrides of the per-call sandbox limits.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Capability grants per plugin, by tool name or pattern.
    #[serde(default)]
    pub plugins: PluginsConfig,
    /// `[permissions]`: rules, their default and the mode; see `permissions`.
    #[serde(default)]
    pub permissions: crate::permissions::PermissionsConfig,
    /// `[network]`: what holds for every plugin's requests.
    #[serde(default)]
    pub network: NetworkConfig,
    /// `[cache]`: the compile cache's bounds.
    #[serde(default)]
    pub cache: CacheConfig,
    /// `[registries]`: how plugins are pulled from OCI registries.
    #[serde(default)]
    pub registries: RegistriesConfig,
}

/// `[cache]`: bounds of the compile cache.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, expecting = "the `[cache]` table")]
pub struct CacheConfig {
    /// The most the compile cache may take, in MiB: at each start, on a
    /// thread of its own, the entries least recently seen are removed until
    /// it fits. At least 1: a cap of 0 would empty the cache, shared with
    /// every other run, at each start. Default: no cap.
    #[serde(default, deserialize_with = "max_size_mib")]
    pub max_size_mib: Option<std::num::NonZeroU64>,
}

/// `[registries]`: settings of `oci://` plugins.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, expecting = "the `[registries]` table")]
pub struct RegistriesConfig {
    /// Registries (`host:port`) spoken to over plain HTTP although they are
    /// not on the loopback address; a loopback registry always is.
    #[serde(default, deserialize_with = "registries")]
    pub insecure: Vec<String>,
}

/// `[network]`: settings of every plugin's requests (where each may go is
/// its own grant, in `[plugins]`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, expecting = "the `[network]` table")]
pub struct NetworkConfig {
    /// PEM files of certificate authorities TLS trusts beside the bundled
    /// Mozilla roots (a company's own CA); relative to the workspace.
    #[serde(default)]
    pub roots: Vec<PathBuf>,
}

/// `[limits]`: overrides of [`Limits`]; a key left out keeps its default.
/// A limit is at least 1, as one of 0 would stop every call (none can be
/// turned off); a count of network requests, bytes or connections may be 0,
/// which allows none.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, expecting = "the `[limits]` table")]
pub struct LimitsConfig {
    /// Fuel per call.
    #[serde(default, deserialize_with = "at_least::<1, _, _>")]
    pub fuel: Option<u64>,
    /// Wall-clock deadline per call, in milliseconds.
    #[serde(default, deserialize_with = "at_least::<1, _, _>")]
    pub deadline_ms: Option<u64>,
    /// Linear memory per call, in MiB: at most 4096, all a 32-bit memory
    /// can address.
    #[serde(default, deserialize_with = "memory_mib")]
    pub memory_mib: Option<usize>,
    /// Elements per table: at most [`MAX_TABLE_ELEMENTS`].
    #[serde(default, deserialize_with = "table_elements")]
    pub table_elements: Option<usize>,
    /// WASM stack, in KiB: at most [`MAX_STACK_KIB`].
    #[serde(default, deserialize_with = "stack_kib")]
    pub stack_kib: Option<usize>,
    /// Fuel of a whole batch, all its calls together.
    #[serde(default, deserialize_with = "at_least::<1, _, _>")]
    pub batch_fuel: Option<u64>,
    /// Bytes a guest may hand the host in one piece, in MiB.
    #[serde(default, deserialize_with = "at_least::<1, _, _>")]
    pub transfer_mib: Option<usize>,
    /// Host-side handles one call may hold at once.
    #[serde(default, deserialize_with = "at_least::<1, _, _>")]
    pub resources: Option<usize>,
    /// Bytes of one tool_use input accepted before parsing, in KiB.
    #[serde(default, deserialize_with = "at_least::<1, _, _>")]
    pub input_kib: Option<usize>,
    /// HTTP requests per call.
    #[serde(default, deserialize_with = "at_least::<0, _, _>")]
    pub network_requests: Option<usize>,
    /// Request body bytes per call, in MiB.
    #[serde(default, deserialize_with = "at_least::<0, _, _>")]
    pub network_sent_mib: Option<usize>,
    /// Response body bytes per call, in MiB.
    #[serde(default, deserialize_with = "at_least::<0, _, _>")]
    pub network_received_mib: Option<usize>,
    /// Name lookup and connection time, in milliseconds.
    #[serde(default, deserialize_with = "at_least::<1, _, _>")]
    pub network_connect_ms: Option<u64>,
    /// Time to a response, and between its body's chunks, in milliseconds.
    #[serde(default, deserialize_with = "at_least::<1, _, _>")]
    pub network_response_ms: Option<u64>,
    /// Connections open at once per call.
    #[serde(default, deserialize_with = "at_least::<0, _, _>")]
    pub network_connections: Option<usize>,
    /// Bytes of the shared context, as compact JSON text, in KiB.
    #[serde(default, deserialize_with = "at_least::<1, _, _>")]
    pub context_kib: Option<usize>,
}

impl LimitsConfig {
    /// `defaults` with these overrides applied.
    pub fn apply(&self, defaults: Limits) -> Limits {
        Limits {
            fuel: self.fuel.unwrap_or(defaults.fuel),
            deadline: self.deadline_ms.map_or(defaults.deadline, std::time::Duration::from_millis),
            memory: self.memory_mib.map_or(defaults.memory, |mib| mib.saturating_mul(1 << 20)),
            table_elements: self.table_elements.unwrap_or(defaults.table_elements),
            stack: self.stack_kib.map_or(defaults.stack, |kib| kib.saturating_mul(1 << 10)),
            batch_fuel: self.batch_fuel.unwrap_or(defaults.batch_fuel),
            transfer: self.transfer_mib.map_or(defaults.transfer, |mib| mib.saturating_mul(1 << 20)),
            resources: self.resources.unwrap_or(defaults.resources),
            input: self.input_kib.map_or(defaults.input, |kib| kib.saturating_mul(1 << 10)),
            network_requests: self.network_requests.unwrap_or(defaults.network_requests),
            network_sent: self
                .network_sent_mib
                .map_or(defaults.network_sent, |mib| mib.saturating_mul(1 << 20)),
            network_received: self
                .network_received_mib
                .map_or(defaults.network_received, |mib| mib.saturating_mul(1 << 20)),
            network_connect: self
                .network_connect_ms
                .map_or(defaults.network_connect, std::time::Duration::from_millis),
            network_response: self
                .network_response_ms
                .map_or(defaults.network_response, std::time::Duration::from_millis),
            network_connections: self.network_connections.unwrap_or(defaults.network_connections),
            context: self.context_kib.map_or(defaults.context, |kib| kib.saturating_mul(1 << 10)),
        }
    }
}

impl Config {
    /// Parse configuration text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &Path) -> Result<Self> {
        read_toml_checked(text, rule_lengths)
            .map_err(|reason| Error::Config { path: origin.to_path_buf(), reason })
    }

    /// Read `path`: a regular file of at most [`MAX_FILE_BYTES`], else an
    /// error naming what it is, or its size.
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = crate::fs::read_file_at_most(path, MAX_FILE_BYTES)
            .map_err(|error| Error::io("read", path, error))?;
        let text = String::from_utf8(bytes).map_err(|error| {
            Error::io("read", path, std::io::Error::new(std::io::ErrorKind::InvalidData, error))
        })?;
        Config::parse(&text, path)
    }

    /// `--config PATH` when given, else `keel.toml` in `dir` when the name
    /// is there, else the defaults. Returns the file read, if any. A
    /// `keel.toml` that is there and cannot be read as a file (a directory,
    /// a named pipe, a link to nothing) is an error, not the defaults: its
    /// rules would be dropped without a word.
    pub fn discover(explicit: Option<&Path>, dir: &Path) -> Result<(Self, Option<PathBuf>)> {
        if let Some(path) = explicit {
            return Ok((Config::load(path)?, Some(path.to_path_buf())));
        }
        let path = dir.join(FILE_NAME);
        match std::fs::symlink_metadata(&path) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok((Config::default(), None));
            }
            Err(error) => return Err(Error::io("read", &path, error)),
            Ok(link) if link.file_type().is_symlink() && std::fs::metadata(&path).is_err() => {
                let target = std::fs::read_link(&path).map_err(|error| Error::io("read", &path, error))?;
                let reason = format!("it is a symbolic link to {}, which cannot be read", target.display());
                let error = std::io::Error::new(std::io::ErrorKind::NotFound, reason);
                return Err(Error::io("read", &path, error));
            }
            Ok(_) => {}
        }
        Ok((Config::load(&path)?, Some(path)))
    }
}

impl NetworkConfig {
    /// The PEM file `path` of `roots` (joined to the workspace already):
    /// a regular file of at most [`MAX_ROOTS_FILE_BYTES`], with an error
    /// naming `[network] roots`.
    pub fn read_root(path: &Path) -> Result<Vec<u8>> {
        crate::fs::read_file_at_most(path, MAX_ROOTS_FILE_BYTES).map_err(|error| Error::Config {
            path: PathBuf::from("[network] roots"),
            reason: format!("failed to read {}: {error}", path.display()),
        })
    }
}

/// A whole number of at least `MIN`, with an error that says so where serde
/// would name a Rust type.
fn at_least<'de, const MIN: i64, D, T>(deserializer: D) -> std::result::Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<i64>,
{
    use serde::de::Error as _;
    let value = whole(deserializer)?;
    if value < MIN {
        return Err(D::Error::custom(if value == 0 {
            "a limit of 0 would stop every call: use 1 or more (a limit cannot be turned off)".to_owned()
        } else {
            format!("{value} is out of range: use a whole number of {MIN} or more")
        }));
    }
    T::try_from(value).map(Some).map_err(|_| D::Error::custom(format!("{value} is too large")))
}

/// An integer, as TOML has them: a whole number that fits an `i64`, with an
/// error that says so where serde would name a Rust type.
fn whole<'de, D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<i64, D::Error> {
    struct Whole;
    impl serde::de::Visitor<'_> for Whole {
        type Value = i64;
        fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            formatter.write_str("a whole number")
        }
        fn visit_i64<E: serde::de::Error>(self, value: i64) -> std::result::Result<i64, E> {
            Ok(value)
        }
        fn visit_u64<E: serde::de::Error>(self, value: u64) -> std::result::Result<i64, E> {
            i64::try_from(value).map_err(|_| E::custom(format!("{value} is too large")))
        }
    }
    deserializer.deserialize_i64(Whole)
}

/// `[cache] max_size_mib`: 1 or more. The cap removes entries other runs
/// use too, so a value that would empty the cache is refused rather than
/// taken.
fn max_size_mib<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Option<std::num::NonZeroU64>, D::Error> {
    let mib = whole(deserializer)?;
    match u64::try_from(mib).ok().and_then(std::num::NonZeroU64::new) {
        Some(mib) => Ok(Some(mib)),
        None => Err(serde::de::Error::custom(format!(
            "`max_size_mib = {mib}` would empty the compile cache, other runs' entries included, at every \
             start: use 1 or more, or leave the key out for no cap"
        ))),
    }
}

/// Registries as an `oci://` reference names them, `host[:port]`: an entry
/// with a scheme or a path could never match one, and would be ignored.
fn registries<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Vec<String>, D::Error> {
    let entries = Vec::<String>::deserialize(deserializer)?;
    let refused = entries.iter().find(|entry| {
        entry.is_empty() || entry.contains(['/', '@', '?', '#']) || entry.contains(char::is_whitespace)
    });
    match refused {
        Some(entry) => Err(serde::de::Error::custom(format!(
            "{entry:?} is not a registry: write its host and port as a reference names them, such as \
             \"registry.internal:5000\""
        ))),
        None => Ok(entries),
    }
}

/// A whole number from 1 to `most`; `refusal` says why a larger one is
/// refused, naming its key.
fn at_most<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
    most: usize,
    refusal: impl FnOnce() -> String,
) -> std::result::Result<Option<usize>, D::Error> {
    let value = at_least::<1, D, usize>(deserializer)?;
    if value.is_some_and(|value| value > most) {
        return Err(serde::de::Error::custom(refusal()));
    }
    Ok(value)
}

/// `max_tool_use_concurrency`: from 1 to [`MAX_TOOL_USE_CONCURRENCY`].
fn max_tool_use_concurrency<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Option<usize>, D::Error> {
    at_most(deserializer, MAX_TOOL_USE_CONCURRENCY, || {
        format!(
            "`max_tool_use_concurrency` is at most {MAX_TOOL_USE_CONCURRENCY}, the sandboxes alive at once: \
             more calls never run together"
        )
    })
}

/// `[limits] stack_kib`: from 1 to [`MAX_STACK_KIB`].
fn stack_kib<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Option<usize>, D::Error> {
    at_most(deserializer, MAX_STACK_KIB, || {
        format!(
            "`limits.stack_kib` is at most {MAX_STACK_KIB} (256 MiB): the engine sets aside a stack of this \
             size for each of its 1000 sandboxes"
        )
    })
}

/// `[limits] table_elements`: from 1 to [`MAX_TABLE_ELEMENTS`].
fn table_elements<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Option<usize>, D::Error> {
    at_most(deserializer, MAX_TABLE_ELEMENTS, || {
        format!(
            "`limits.table_elements` is at most {MAX_TABLE_ELEMENTS}: the engine sets aside room for this many \
             elements in each of its 4000 tables"
        )
    })
}

/// `memory_mib`: from 1 to 4096.
fn memory_mib<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Option<usize>, D::Error> {
    let mib = at_least::<1, D, usize>(deserializer)?;
    if mib.is_some_and(|mib| mib > 4096) {
        return Err(serde::de::Error::custom(
            "a sandbox's memory is at most 4096 MiB, all a 32-bit memory can address",
        ));
    }
    Ok(mib)
}

/// `text` read as TOML; on failure, what is wrong and where: `unknown field
/// \`feul\` … (line 2, column 1)`. A value of the wrong type is named by its
/// key, and a key or table given twice by its whole name.
pub fn read_toml<T: serde::de::DeserializeOwned>(text: &str) -> std::result::Result<T, String> {
    read_toml_checked(text, |_, _| Ok(()))
}

/// [`read_toml`], with `check` looking at the document (and its text)
/// before it is read into a `T`.
fn read_toml_checked<T: serde::de::DeserializeOwned>(
    text: &str,
    check: impl FnOnce(&toml::de::DeTable<'_>, &str) -> std::result::Result<(), String>,
) -> std::result::Result<T, String> {
    let document = toml::de::DeTable::parse(text).map_err(|error| described(text, &error))?;
    check(document.get_ref(), text)?;
    T::deserialize(toml::de::Deserializer::from(document)).map_err(|error| described(text, &error))
}

/// A TOML error as a config error says it, ending with where it is.
/// serde's and toml's own words name a Rust type (`expected f64`) and no key
/// (`invalid type: …`, `duplicate key`): here the key is named, and the type
/// as the file writes it.
fn described(text: &str, error: &toml::de::Error) -> String {
    let message = error.message();
    let said = match error.span() {
        Some(span) if message == "duplicate key" => duplicate(text, span),
        // Unless it says which table it expected, naming it already.
        _ if (message.starts_with("invalid type: ") || message.starts_with("invalid value: "))
            && !message.contains("`[") =>
        {
            let message = plain_type(message);
            match key_of(error) {
                Some(key) => format!("`{key}`: {message}"),
                None => message,
            }
        }
        _ => message.to_owned(),
    };
    said + &location(text, error.span())
}

/// The dotted name of the key whose value `error` is about, such as
/// `budget.per_message_chars`. toml keeps it to itself, and shows it only
/// in its own rendering of an error made without the document's text.
fn key_of(error: &toml::de::Error) -> Option<String> {
    let rendered = error.to_string();
    let key = rendered.strip_prefix(error.message())?.strip_prefix("\nin `")?.strip_suffix("`\n")?;
    Some(key.to_owned())
}

/// `message` with serde's name of a Rust number type as the file writes
/// the value: `expected f64` becomes `expected a number`.
fn plain_type(message: &str) -> String {
    let Some((head, expected)) = message.rsplit_once(", expected ") else { return message.to_owned() };
    let plain = match expected {
        "f32" | "f64" => "a number",
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" | "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => {
            "a whole number"
        }
        _ => return message.to_owned(),
    };
    format!("{head}, expected {plain}")
}

/// What toml's `duplicate key` at `span` is: `duplicate table \`[limits]\``
/// when a table header names it again, else `duplicate key \`limits.fuel\``.
/// The whole name is that of the first key written as it is, found in
/// the document as toml reads it despite the error.
fn duplicate(text: &str, span: std::ops::Range<usize>) -> String {
    let written = text.get(span.clone()).unwrap_or_default();
    let (document, _) = toml::de::DeTable::parse_recoverable(text);
    let mut first = None;
    first_key(document.get_ref(), text, written, span.start, &mut Vec::new(), &mut first);
    let name = first.map_or_else(|| written.to_owned(), |(_, path)| path.join("."));
    let line = &text[text[..span.start].rfind('\n').map_or(0, |at| at + 1)..];
    if line.trim_start().starts_with('[') {
        format!("duplicate table `[{name}]`")
    } else {
        format!("duplicate key `{name}`")
    }
}

/// The key of `table` (and of the tables in it) written as `written` that
/// starts last at or before `before`, with its path, kept in `first`.
fn first_key(
    table: &toml::de::DeTable<'_>,
    text: &str,
    written: &str,
    before: usize,
    path: &mut Vec<String>,
    first: &mut Option<(usize, Vec<String>)>,
) {
    for (key, value) in table.iter() {
        path.push(key.get_ref().to_string());
        let start = key.span().start;
        if start <= before
            && text.get(key.span()) == Some(written)
            && first.as_ref().is_none_or(|(found, _)| *found < start)
        {
            *first = Some((start, path.clone()));
        }
        match value.get_ref() {
            toml::de::DeValue::Table(inner) => first_key(inner, text, written, before, path, first),
            toml::de::DeValue::Array(items) => {
                for item in items.iter() {
                    if let toml::de::DeValue::Table(inner) = item.get_ref() {
                        first_key(inner, text, written, before, path, first);
                    }
                }
            }
            _ => {}
        }
        path.pop();
    }
}

/// Every rule of `[permissions]` is at most [`MAX_RULE_BYTES`], checked
/// before any is compiled: the glob compiler panics on a pattern whose
/// matcher would pass its size limit.
fn rule_lengths(document: &toml::de::DeTable<'_>, text: &str) -> std::result::Result<(), String> {
    use toml::de::DeValue;
    let section = document.iter().find(|(key, _)| key.get_ref() == "permissions");
    let Some((_, section)) = section else { return Ok(()) };
    let DeValue::Table(section) = section.get_ref() else { return Ok(()) };
    for (list, rules) in section.iter() {
        let DeValue::Array(rules) = rules.get_ref() else { continue };
        for rule in rules.iter() {
            if let DeValue::String(written) = rule.get_ref()
                && written.len() > MAX_RULE_BYTES
            {
                let list = list.get_ref();
                let shown = match written.char_indices().nth(80) {
                    Some((cut, _)) => format!("{:?}… ({} bytes)", &written[..cut], written.len()),
                    None => format!("{written:?}"),
                };
                return Err(format!(
                    "`permissions.{list}`: invalid permission rule {shown}: a rule is at most {MAX_RULE_BYTES} \
                     bytes{}",
                    location(text, Some(rule.span()))
                ));
            }
        }
    }
    Ok(())
}

/// ` at line L, column C` for a span of `text`.
fn location(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    let Some(span) = span else { return String::new() };
    let before = &text[..span.start.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |at| at + 1) + 1;
    format!(" (line {line}, column {column})")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn limits_override_only_what_is_set() {
        let config = Config::parse("[limits]\nfuel = 5\nmemory_mib = 8\n", Path::new("keel.toml")).unwrap();
        let limits = config.limits.apply(Limits::default());
        assert_eq!(limits.fuel, 5);
        assert_eq!(limits.memory, 8 << 20);
        assert_eq!(limits.deadline, Duration::from_secs(30));
    }

    #[test]
    fn a_limit_is_at_least_1_and_a_network_count_at_least_0() {
        let reason = |text: &str| Config::parse(text, Path::new("keel.toml")).unwrap_err().to_string();
        assert_eq!(
            reason("[limits]\ndeadline_ms = 0\n"),
            "invalid config keel.toml: a limit of 0 would stop every call: use 1 or more (a limit cannot be \
             turned off) (line 2, column 15)"
        );
        assert_eq!(
            reason("max_tool_use_concurrency = 0\n"),
            "invalid config keel.toml: a limit of 0 would stop every call: use 1 or more (a limit cannot be \
             turned off) (line 1, column 28)"
        );
        assert_eq!(
            reason("[limits]\nnetwork_requests = -1\n"),
            "invalid config keel.toml: -1 is out of range: use a whole number of 0 or more (line 2, column 20)"
        );
        assert_eq!(
            reason("[limits]\nfuel = 1.5\n"),
            "invalid config keel.toml: `limits.fuel`: invalid type: floating point `1.5`, expected a whole number \
             (line 2, column 8)"
        );
        assert_eq!(
            reason("[limits]\nmemory_mib = 4097\n"),
            "invalid config keel.toml: a sandbox's memory is at most 4096 MiB, all a 32-bit memory can address \
             (line 2, column 14)"
        );
        let text = "[limits]\nnetwork_requests = 0\nnetwork_connections = 0\ninput_kib = 18014398509481984\n";
        let limits = Config::parse(text, Path::new("keel.toml")).unwrap().limits.apply(Limits::default());
        assert_eq!((limits.network_requests, limits.network_connections), (0, 0));
        assert_eq!(limits.input, usize::MAX, "a size too large for its unit is as large as can be, not 0");
    }

    #[test]
    fn a_cache_cap_is_at_least_1_mib() {
        let reason = |text: &str| Config::parse(text, Path::new("conf/keel.toml")).unwrap_err().to_string();
        assert_eq!(
            reason("[cache]\nmax_size_mib = 0\n"),
            "invalid config conf/keel.toml: `max_size_mib = 0` would empty the compile cache, other runs' \
             entries included, at every start: use 1 or more, or leave the key out for no cap (line 2, column 16)"
        );
        assert_eq!(
            reason("[cache]\nmax_size_mib = -5\n"),
            "invalid config conf/keel.toml: `max_size_mib = -5` would empty the compile cache, other runs' \
             entries included, at every start: use 1 or more, or leave the key out for no cap (line 2, column 16)"
        );
        assert_eq!(
            reason("[cache]\nmax_size_mib = 0.5\n"),
            "invalid config conf/keel.toml: `cache.max_size_mib`: invalid type: floating point `0.5`, expected a \
             whole number (line 2, column 16)"
        );
        let config = Config::parse("[cache]\nmax_size_mib = 1\n", Path::new("keel.toml")).unwrap();
        assert_eq!(config.cache.max_size_mib, std::num::NonZeroU64::new(1));
        assert_eq!(Config::parse("[cache]\n", Path::new("keel.toml")).unwrap().cache.max_size_mib, None);
    }

    #[test]
    fn an_insecure_registry_is_a_host_and_port() {
        let config =
            Config::parse("[registries]\ninsecure = [\"registry.internal:5000\"]\n", Path::new("k.toml"));
        assert_eq!(config.unwrap().registries.insecure, ["registry.internal:5000"]);
        let error = Config::parse("[registries]\ninsecure = [\"http://x:5000\"]\n", Path::new("k.toml"));
        assert_eq!(
            error.unwrap_err().to_string(),
            "invalid config k.toml: \"http://x:5000\" is not a registry: write its host and port as a reference \
             names them, such as \"registry.internal:5000\" (line 2, column 12)"
        );
    }

    #[test]
    fn network_limits_are_keys_of_their_own() {
        let text = "[limits]\nnetwork_requests = 3\nnetwork_sent_mib = 2\nnetwork_received_mib = 5\n\
                    network_connect_ms = 1500\nnetwork_response_ms = 700\nnetwork_connections = 1\n";
        let limits = Config::parse(text, Path::new("keel.toml")).unwrap().limits.apply(Limits::default());
        assert_eq!(
            (
                limits.network_requests,
                limits.network_sent,
                limits.network_received,
                limits.network_connections
            ),
            (3, 2 << 20, 5 << 20, 1)
        );
        assert_eq!(
            (limits.network_connect, limits.network_response),
            (Duration::from_millis(1500), Duration::from_millis(700))
        );
    }

    #[test]
    fn an_unknown_key_is_an_error_naming_file_key_and_line() {
        let error = Config::parse("[limits]\nfeul = 5\n", Path::new("conf/keel.toml")).unwrap_err();
        let text = error.to_string();
        assert!(text.starts_with("invalid config conf/keel.toml: unknown field `feul`"), "{text}");
        assert!(text.ends_with("(line 2, column 1)"), "{text}");
    }

    #[test]
    fn a_section_of_the_wrong_type_is_named_as_the_table_it_must_be() {
        let reason = |text: &str| Config::parse(text, Path::new("keel.toml")).unwrap_err().to_string();
        assert_eq!(
            reason("limits = 5\n"),
            "invalid config keel.toml: invalid type: integer `5`, expected the `[limits]` table (line 1, column 10)"
        );
        assert_eq!(
            reason("[plugins]\necho = 5\n"),
            "invalid config keel.toml: invalid type: integer `5`, expected a `[plugins.NAME]` table of grants \
             (line 2, column 8)"
        );
        assert_eq!(
            reason("[plugins.echo]\ndirs = [\"data:ro\"]\n"),
            "invalid config keel.toml: `plugins.echo.dirs`: invalid type: string \"data:ro\", expected a table \
             of `path`, `mount` and optionally `access`, such as `{ path = \"data\", mount = \"/data\" }` (line 2, column 9)"
        );
    }

    #[test]
    #[cfg(unix)]
    fn a_keel_toml_that_is_there_but_no_file_is_an_error_naming_it() {
        let reason = |dir: &Path| Config::discover(None, dir).unwrap_err().to_string();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        std::fs::create_dir(&path).unwrap();
        assert_eq!(
            reason(dir.path()),
            format!("failed to read {}: it is a directory, not a file", path.display())
        );

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        std::os::unix::fs::symlink("/nonexistent/keel.toml", &path).unwrap();
        assert_eq!(
            reason(dir.path()),
            format!(
                "failed to read {}: it is a symbolic link to /nonexistent/keel.toml, which cannot be read",
                path.display()
            )
        );

        // Not opened: that would wait for a writer.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        assert!(std::process::Command::new("mkfifo").arg(&path).status().unwrap().success());
        let found = std::thread::scope(|scope| {
            let (sent, received) = std::sync::mpsc::channel();
            let dir = dir.path().to_path_buf();
            scope.spawn(move || sent.send(reason(&dir)));
            let found = received.recv_timeout(Duration::from_secs(10));
            if found.is_err() {
                // Free the reader, so that the scope can end and fail.
                drop(std::fs::OpenOptions::new().write(true).open(&path));
            }
            found
        });
        assert_eq!(
            found.expect("the pipe was opened and waited on"),
            format!("failed to read {}: it is a named pipe, not a file", path.display())
        );
    }

    #[test]
    #[cfg(unix)]
    fn a_config_named_is_a_file_of_at_most_1_mib() {
        let reason = |path: &Path| Config::discover(Some(path), Path::new(".")).unwrap_err().to_string();
        assert_eq!(
            reason(Path::new("/dev/zero")),
            "failed to read /dev/zero: it is a character device, not a file"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.toml");
        std::fs::write(&path, format!("# {}\n", "x".repeat(MAX_FILE_BYTES))).unwrap();
        assert_eq!(
            reason(&path),
            format!("failed to read {}: it is 1048579 bytes, more than the 1 MiB read", path.display())
        );
        std::fs::write(&path, format!("# {}\nmax_tool_use_concurrency = 3\n", "x".repeat(1000))).unwrap();
        assert_eq!(Config::load(&path).unwrap().max_tool_use_concurrency, Some(3));
    }

    #[test]
    #[cfg(unix)]
    fn a_root_is_a_file_and_its_errors_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let reason = |name: &str| NetworkConfig::read_root(&dir.path().join(name)).unwrap_err().to_string();
        let pipe = dir.path().join("fifo.pem");
        assert!(std::process::Command::new("mkfifo").arg(&pipe).status().unwrap().success());
        assert_eq!(
            reason("fifo.pem"),
            format!(
                "invalid config [network] roots: failed to read {}: it is a named pipe, not a file",
                pipe.display()
            )
        );
        assert_eq!(
            reason("nope.pem"),
            format!(
                "invalid config [network] roots: failed to read {}: No such file or directory (os error 2)",
                dir.path().join("nope.pem").display()
            )
        );
        std::fs::write(dir.path().join("ca.pem"), "PEM").unwrap();
        assert_eq!(NetworkConfig::read_root(&dir.path().join("ca.pem")).unwrap(), b"PEM");
    }

    #[test]
    fn the_concurrency_cap_the_stack_and_tables_have_bounds_the_engine_can_carry() {
        let reason = |text: &str| Config::parse(text, Path::new("keel.toml")).unwrap_err().to_string();
        assert_eq!(
            reason("max_tool_use_concurrency = 9223372036854775807\n"),
            "invalid config keel.toml: `max_tool_use_concurrency` is at most 1000, the sandboxes alive at once: \
             more calls never run together (line 1, column 28)"
        );
        assert_eq!(
            reason("[limits]\nstack_kib = 9223372036854775807\n"),
            "invalid config keel.toml: `limits.stack_kib` is at most 262144 (256 MiB): the engine sets aside a \
             stack of this size for each of its 1000 sandboxes (line 2, column 13)"
        );
        assert_eq!(
            reason("[limits]\ntable_elements = 9223372036854775807\n"),
            "invalid config keel.toml: `limits.table_elements` is at most 10000000: the engine sets aside room \
             for this many elements in each of its 4000 tables (line 2, column 18)"
        );
        let text =
            "max_tool_use_concurrency = 1000\n[limits]\nstack_kib = 262144\ntable_elements = 10000000\n";
        let config = Config::parse(text, Path::new("keel.toml")).unwrap();
        let limits = config.limits.apply(Limits::default());
        assert_eq!(config.max_tool_use_concurrency, Some(1000));
        assert_eq!((limits.stack, limits.table_elements), (256 << 20, 10_000_000));
    }

    #[test]
    fn a_key_or_table_given_twice_and_a_budget_of_the_wrong_type_are_named() {
        let reason = |text: &str| Config::parse(text, Path::new("keel.toml")).unwrap_err().to_string();
        assert_eq!(
            reason("[limits]\nfuel = 5\n[limits]\nfuel = 6\n"),
            "invalid config keel.toml: duplicate table `[limits]` (line 3, column 2)"
        );
        assert_eq!(
            reason("[limits]\nfuel = 5\nfuel = 6\n"),
            "invalid config keel.toml: duplicate key `limits.fuel` (line 3, column 1)"
        );
        assert_eq!(
            reason("[plugins.\"acme_*\"]\nenv = []\n[cache]\n[plugins.\"acme_*\"]\n"),
            "invalid config keel.toml: duplicate table `[plugins.acme_*]` (line 4, column 10)"
        );
        assert_eq!(
            reason("[budget]\nper_message_chars = \"x\"\n"),
            "invalid config keel.toml: `budget.per_message_chars`: invalid type: string \"x\", expected a number \
             (line 2, column 21)"
        );
        assert_eq!(
            reason("[budget.tools]\ngrep = true\n"),
            "invalid config keel.toml: `budget.tools.grep`: invalid type: boolean `true`, expected a number \
             (line 2, column 8)"
        );
    }

    #[test]
    fn a_permission_rule_is_at_most_4_kib() {
        let rule = format!("echo({})", "a".repeat(500_000));
        let text = format!("[permissions]\nallow = [\"grep\"]\ndeny = [\"{rule}\"]\n");
        assert_eq!(
            Config::parse(&text, Path::new("keel.toml")).unwrap_err().to_string(),
            format!(
                "invalid config keel.toml: `permissions.deny`: invalid permission rule {:?}… (500006 bytes): a rule \
                 is at most 4096 bytes (line 3, column 9)",
                &rule[..80]
            )
        );
        let rule = format!("echo({})", "?".repeat(MAX_RULE_BYTES - 6));
        let config = Config::parse(&format!("[permissions]\ndeny = [\"{rule}\"]\n"), Path::new("keel.toml"));
        assert_eq!(config.unwrap().permissions.deny.len(), 1);
    }

    #[test]
    fn a_missing_file_is_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Config::discover(None, dir.path()).unwrap(), (Config::default(), None));
    }

    #[test]
    fn the_context_limit_is_a_key_in_kib_of_1_or_more() {
        let limits = |text: &str| {
            Config::parse(text, Path::new("keel.toml")).map(|c| c.limits.apply(Limits::default()))
        };
        assert_eq!(limits("[limits]\ncontext_kib = 64\n").unwrap().context, 64 << 10);
        assert_eq!(limits("[limits]\n").unwrap().context, 1 << 20);
        let error = limits("[limits]\ncontext_kib = 0\n").unwrap_err().to_string();
        assert!(error.contains("a limit of 0 would stop every call"), "{error}");
    }
}
