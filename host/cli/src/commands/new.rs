//! `keel new`: a tool crate that builds, tests and runs out of the box.
//!
//! The crate holds one tool that greets someone, its unit tests, one golden
//! fixture case and a README with the three commands an author needs. The
//! case's expectations are written with keel's own types and formats (the
//! message, the normalized event trace, the default summary), so they are
//! what `keel test` produces for the tool as generated.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use keel_host::events::PlannedGroup;
use keel_host::events::summary::{DefaultSummarizer, SummaryCall};
use keel_host::{Event, ToolResult, ToolUse};
use serde_json::{Value, json};

/// Arguments of `keel new`.
#[derive(Args)]
pub struct NewArgs {
    /// The tool's name, which is also the crate's: lowercase letters,
    /// digits, `_` and `-`, starting with a letter.
    #[arg(value_name = "NAME")]
    name: String,
    /// Where to create the crate. Default: `./NAME`.
    #[arg(long, value_name = "DIR")]
    path: Option<PathBuf>,
    /// The `guest-sdk` directory of a keel checkout, which the crate takes
    /// `keel-guest` from. Default: the one this keel was built from.
    #[arg(long, value_name = "DIR")]
    sdk: Option<PathBuf>,
}

const CARGO_TOML: &str = include_str!("new/Cargo.toml.tmpl");
const LIB_RS: &str = include_str!("new/lib.rs.tmpl");
const README: &str = include_str!("new/README.md.tmpl");

/// The target tools are built for.
const TARGET: &str = "wasm32-wasip2";

/// The fixture case every new crate starts with.
const CASE: &str = "hello";

/// The crates a new tool's crate depends on (`new/Cargo.toml.tmpl`), as
/// Rust names them: a crate of the same name would depend on itself, or
/// shadow the one it uses.
const DEPENDENCIES: &[&str] = &["keel_guest", "schemars", "serde"];

/// Names a crate cannot take: Rust's keywords and the crates of the
/// standard distribution.
const RESERVED: &[&str] = &[
    "as",
    "async",
    "await",
    "box",
    "break",
    "const",
    "continue",
    "core",
    "crate",
    "dyn",
    "else",
    "enum",
    "extern",
    "false",
    "fn",
    "for",
    "if",
    "impl",
    "in",
    "let",
    "loop",
    "match",
    "mod",
    "move",
    "mut",
    "priv",
    "proc_macro",
    "pub",
    "ref",
    "return",
    "self",
    "static",
    "std",
    "alloc",
    "struct",
    "super",
    "test",
    "trait",
    "true",
    "try",
    "type",
    "unsafe",
    "use",
    "where",
    "while",
    "yield",
];

/// Create the crate, then print the commands that build, test and run it.
pub fn run(args: &NewArgs) -> Result<()> {
    let name = args.name.as_str();
    check_name(name)?;
    let dir = args.path.clone().unwrap_or_else(|| PathBuf::from(name));
    check_free(&dir)?;
    let sdk = guest_sdk(args.sdk.as_deref())?;
    let lib = name.replace('-', "_");
    let fill = |template: &str| {
        template
            .replace("{{name}}", name)
            .replace("{{crate}}", name)
            .replace("{{lib}}", &lib)
            .replace("{{type}}", &type_name(name))
            .replace("{{sdk}}", &toml_string(&sdk.display().to_string()))
            .replace("{{sdk_shown}}", &sdk.display().to_string())
    };
    let case = Path::new("tests/fixtures").join(CASE);
    let (batch, message, events) = fixture(name);
    let files: [(PathBuf, String); 7] = [
        ("Cargo.toml".into(), fill(CARGO_TOML)),
        ("src/lib.rs".into(), fill(LIB_RS)),
        ("README.md".into(), fill(README)),
        (".gitignore".into(), "/target\n".into()),
        (case.join("batch.json"), batch),
        (case.join("expected.json"), message),
        (case.join("events.jsonl"), events),
    ];
    create_whole(&dir, &files)?;

    let wasm = format!("target/{TARGET}/release/{lib}.wasm");
    if dir == Path::new(".") {
        outln!("Created the tool `{name}` here. Next:\n")?;
    } else {
        outln!("Created the tool `{name}` in {}. Next:\n", dir.display())?;
        outln!("    cd {}", dir.display())?;
    }
    outln!("    cargo build --release --target {TARGET}")?;
    outln!("    cargo test && keel test tests/fixtures --plugins {wasm}")?;
    outln!("    keel run --plugins {wasm} tests/fixtures/{CASE}/batch.json")?;
    if !target_installed() {
        eprintln!(
            "note: the {TARGET} target is not installed, so the build will fail; \
             install it with `rustup target add {TARGET}`"
        );
    }
    Ok(())
}

/// Refuse `dir` unless it is missing or an empty directory.
fn check_free(dir: &Path) -> Result<()> {
    let shown = dir.display();
    match std::fs::read_dir(dir).map(|mut entries| entries.next().is_none()) {
        Ok(true) => Ok(()),
        Ok(false) => bail!("{shown} already exists and is not empty; choose another directory with --path"),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(_) if !dir.is_dir() => {
            bail!("{shown} exists and is not a directory; choose another directory with --path")
        }
        Err(error) => Err(error).with_context(|| format!("failed to read {shown}")),
    }
}

/// Write `files` into `dir` (missing, or an empty directory) whole or not
/// at all: they are written into a directory of their own inside it, then
/// moved into place, and a write that fails leaves `dir` as it was (or
/// missing, with any parent it needed).
fn create_whole(dir: &Path, files: &[(PathBuf, String)]) -> Result<()> {
    // The directories made here, deepest first, to remove if a write fails.
    let made: Vec<&Path> =
        dir.ancestors().take_while(|path| !path.as_os_str().is_empty() && !path.exists()).collect();
    std::fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
    let staging = dir.join(format!(".keel-new-{}", std::process::id()));
    let written = std::fs::create_dir(&staging)
        .with_context(|| format!("failed to create {}", staging.display()))
        .and_then(|()| {
            files.iter().try_for_each(|(file, contents)| {
                let (path, shown) = (staging.join(file), dir.join(file));
                let parent = path.parent().expect("every file is in the crate's directory");
                std::fs::create_dir_all(parent).with_context(|| {
                    format!("failed to create {}", shown.parent().unwrap_or(dir).display())
                })?;
                std::fs::write(&path, contents)
                    .with_context(|| format!("failed to write {}", shown.display()))
            })
        });
    if let Err(error) = written {
        let _ = std::fs::remove_dir_all(&staging);
        for made in made {
            let _ = std::fs::remove_dir(made);
        }
        return Err(error);
    }
    // Moves within one directory: each is a rename.
    let top: std::collections::BTreeSet<_> =
        files.iter().filter_map(|(file, _)| file.iter().next()).collect();
    for entry in top {
        std::fs::rename(staging.join(entry), dir.join(entry))
            .with_context(|| format!("failed to create {}", dir.join(entry).display()))?;
    }
    std::fs::remove_dir(&staging).with_context(|| format!("failed to remove {}", staging.display()))
}

fn check_name(name: &str) -> Result<()> {
    let well_formed = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if !well_formed {
        bail!(
            "`{name}` cannot name a tool: use up to 64 lowercase letters, digits, `_` and `-`, \
             starting with a letter (it names the crate too)"
        );
    }
    let crate_name = name.replace('-', "_");
    if RESERVED.contains(&crate_name.as_str()) {
        bail!("`{name}` cannot name a crate: it is reserved by Rust; pick another name");
    }
    if DEPENDENCIES.contains(&crate_name.as_str()) {
        bail!("`{name}` cannot name the tool's crate: it depends on a crate of that name; pick another name");
    }
    Ok(())
}

/// `my-tool` as `MyTool`.
fn type_name(name: &str) -> String {
    name.split(['-', '_'])
        .flat_map(|part| {
            let mut chars = part.chars();
            chars.next().map(|first| first.to_ascii_uppercase()).into_iter().chain(chars)
        })
        .collect()
}

/// A TOML basic string holding `text`.
fn toml_string(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The `guest-sdk` directory: `--sdk`, else the checkout keel was built from.
fn guest_sdk(given: Option<&Path>) -> Result<PathBuf> {
    let built_from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest-sdk");
    let dir = given.unwrap_or(&built_from);
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap_or_default();
    if !manifest.lines().any(|line| line.trim() == "name = \"keel-guest\"") {
        bail!(
            "keel-guest's source is not at {}; pass --sdk DIR, the guest-sdk directory of a keel checkout \
             (keel-guest is not on crates.io yet)",
            dir.display()
        );
    }
    dir.canonicalize().with_context(|| format!("failed to open {}", dir.display()))
}

/// Whether the standard library for [`TARGET`] is installed.
fn target_installed() -> bool {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let output =
        std::process::Command::new(rustc).args(["--print", "target-libdir", "--target", TARGET]).output();
    let Ok(output) = output else { return false };
    let libdir = String::from_utf8_lossy(&output.stdout);
    output.status.success() && !libdir.trim().is_empty() && Path::new(libdir.trim()).is_dir()
}

/// The starting fixture case: a call that succeeds and one that fails its
/// validation; the batch, and the message and event trace keel gives for it.
fn fixture(name: &str) -> (String, String, String) {
    let calls = [("toolu_1", "keel"), ("toolu_2", " ")];
    let uses: Vec<ToolUse> =
        calls.iter().map(|(id, who)| ToolUse::new(*id, name, json!({ "who": who }))).collect();
    let results = [
        ToolResult::ok("toolu_1", "Hello, keel!"),
        ToolResult::error("toolu_2", format!("Invalid input for {name}: `who` must not be empty")),
    ];
    let batch: Vec<Value> = calls
        .iter()
        .map(|(id, who)| json!({ "type": "tool_use", "id": id, "name": name, "input": { "who": who } }))
        .collect();
    let ids: Vec<String> = calls.iter().map(|(id, _)| id.to_string()).collect();
    // Both calls are concurrency-safe: one group, run together.
    let group = PlannedGroup { concurrent: true, tool_use_ids: ids.clone() };
    let mut events = vec![Event::BatchPlan { batches: vec![group] }];
    for result in &results {
        let tool_use_id = result.tool_use_id.clone();
        events.push(Event::CallStarted {
            tool_use_id: tool_use_id.clone(),
            tool: name.into(),
            activity: None,
        });
        events.push(Event::CallFinished { tool_use_id, is_error: result.is_error, figures: None });
        events.push(Event::tool_result(result));
    }
    events.push(Event::BatchFinished { calls: results.len(), errors: 1, interrupted: false });
    let summary: Vec<SummaryCall> =
        uses.iter().zip(&results).map(|(tool_use, result)| SummaryCall::new(tool_use, result)).collect();
    if let Some(label) = keel_host::events::summary::cut(&DefaultSummarizer::label(&summary)) {
        events.push(Event::Summary { tool_use_ids: ids, label });
    }
    let pretty = |value: &Value| serde_json::to_string_pretty(value).expect("JSON serializes") + "\n";
    let trace = keel_cli::fixture::normalize(&events)
        .iter()
        .map(|event| serde_json::to_string(event).expect("events serialize") + "\n")
        .collect();
    (pretty(&Value::Array(batch)), pretty(&keel_host::batch::user_message(&results)), trace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_crate_type_and_file_names() {
        assert_eq!(type_name("greet"), "Greet");
        assert_eq!(type_name("my-tool_2"), "MyTool2");
        assert!(check_name("my-tool_2").is_ok());
    }

    #[test]
    fn names_a_crate_cannot_take_are_refused_with_the_rule() {
        let error = |name: &str| check_name(name).unwrap_err().to_string();
        assert_eq!(
            error("2fast"),
            "`2fast` cannot name a tool: use up to 64 lowercase letters, digits, `_` and `-`, \
             starting with a letter (it names the crate too)"
        );
        assert!(error("Greet").starts_with("`Greet` cannot name a tool"));
        assert!(error("a b").starts_with("`a b` cannot name a tool"));
        assert_eq!(error("test"), "`test` cannot name a crate: it is reserved by Rust; pick another name");
        assert_eq!(
            error("keel-guest"),
            "`keel-guest` cannot name the tool's crate: it depends on a crate of that name; pick another name"
        );
        assert!(error("serde").starts_with("`serde` cannot name the tool's crate"));
    }

    #[test]
    fn paths_are_quoted_for_toml() {
        assert_eq!(toml_string(r#"C:\keel "x""#), r#""C:\\keel \"x\"""#);
    }
}
