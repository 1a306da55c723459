//! `hostile`: a test guest that attacks its host in whichever way its input
//! asks, one attack per call, so that each limit and each grant of the
//! sandbox is proven by a guest that tries to break it.
//!
//! It implements the WIT exports directly instead of through the SDK's
//! `Tool` trait: a hostile tool is not bound by the SDK's conventions, and
//! the host must not rely on them.
//!
//! Input: `{ "act": <attack>, ... }`. `read_only: true` makes `plan` answer
//! read-only (a claim the host must enforce); `loop_in` names exports that
//! spin forever instead of answering; `concurrency_safe: true` makes `plan`
//! answer concurrency-safe.

// Only a wasm32 build exports the tool; natively nothing calls it. `allow`,
// not `expect`: the lint fires in some native targets and not in others.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

use std::hint::black_box;
use std::time::Duration;

use keel_guest::__private::bindings::exports::keel::tool::guest::{Guest, ToolMetadata};
use keel_guest::__private::bindings::keel::tool::host;
use keel_guest::__private::bindings::keel::tool::types::{
    CallOutput, CallPlan, ContentBlock, InterruptBehavior, LogLevel, PermissionDecision,
};
use serde::Deserialize;

/// What one call is asked to do.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Input {
    /// The attack `call` makes; see [`Hostile::call`].
    act: String,
    /// A path in the sandbox, for the file attacks.
    path: String,
    /// A second path, for `rename` and `link`.
    to: String,
    /// Seconds to sleep, for `sleep`.
    secs: u64,
    /// The read-only answer of `plan`.
    read_only: bool,
    /// The concurrency-safe answer of `plan`.
    concurrency_safe: bool,
    /// Exports that spin forever instead of answering.
    loop_in: Vec<String>,
    /// Questions that try to write `path`, and refuse the call saying how it
    /// went: `check`.
    write_in: Vec<String>,
}

fn input(text: &str) -> Input {
    serde_json::from_str(text).unwrap_or_default()
}

/// If `export` is named in `write_in`, try to write `path` and say how it went.
fn write_if_named(input: &Input, export: &str) -> Option<String> {
    if !input.write_in.iter().any(|name| name == export) {
        return None;
    }
    Some(match std::fs::write(&input.path, "written by a question") {
        Ok(()) => format!("wrote {}", input.path),
        Err(error) => io_error("write", &input.path, &error),
    })
}

/// Spin forever if `export` is named in `loop_in`.
fn spin_if_named(input: &Input, export: &str) {
    if input.loop_in.iter().any(|name| name == export) {
        spin();
    }
}

fn spin() -> ! {
    let mut n: u64 = 0;
    loop {
        n = black_box(n.wrapping_add(1));
    }
}

/// Recurse until the stack runs out: `depth` never reaches `u64::MAX`, and
/// `black_box` keeps the recursion from being turned into a loop.
fn recurse(depth: u64) -> u64 {
    if black_box(depth) == u64::MAX {
        return 0;
    }
    black_box(recurse(depth + 1)) + 1
}

/// A result of one text block.
fn text_output(text: String, context_modifier: Option<String>) -> CallOutput {
    CallOutput { content: vec![ContentBlock::Text(text)], structured: None, context_modifier }
}

fn io_error(action: &str, path: &str, error: &std::io::Error) -> String {
    format!("failed to {action} {path}: {}", error.kind())
}

struct Hostile;

impl Guest for Hostile {
    fn metadata() -> ToolMetadata {
        ToolMetadata {
            name: "hostile".into(),
            aliases: vec![],
            description: "Test guest: attacks the host as its input asks.".into(),
            prompt: String::new(),
            input_schema: r#"{"type":"object"}"#.into(),
            output_schema: None,
            // Text a plugin says of itself, escape codes and all: one that
            // would clear a terminal's screen.
            search_hint: Some("finds\u{1b}[2Jnothing".into()),
            should_defer: false,
            always_load: false,
            strict: false,
            interrupt_behavior: InterruptBehavior::Cancel,
            user_facing_name: String::new(),
        }
    }

    fn is_enabled() -> bool {
        true
    }

    fn plan(text: String, _context: String) -> CallPlan {
        let input = input(&text);
        spin_if_named(&input, "plan");
        CallPlan { concurrency_safe: input.concurrency_safe, read_only: input.read_only }
    }

    fn is_destructive(text: String, _context: String) -> bool {
        spin_if_named(&input(&text), "is_destructive");
        false
    }

    /// 50,000, plus one for each environment variable it sees: a test tells
    /// by it which environment the questions asked at load saw.
    fn max_result_size() -> Option<u64> {
        Some(50_000 + std::env::vars().count() as u64)
    }

    fn check(text: String, _context: String) -> Result<PermissionDecision, String> {
        let input =
            serde_json::from_str::<Input>(&text).map_err(|error| format!("invalid input: {error}"))?;
        spin_if_named(&input, "check");
        Ok(write_if_named(&input, "check").map_or(PermissionDecision::Allow(None), PermissionDecision::Deny))
    }

    fn permission_subject(_text: String, _context: String) -> Option<String> {
        None
    }

    fn classifier_input(_text: String, _context: String) -> String {
        String::new()
    }

    fn user_facing_name(_text: String, _context: String) -> String {
        "hostile".into()
    }

    fn activity_description(_text: String, _context: String) -> Option<String> {
        None
    }

    fn is_open_world(_text: String, _context: String) -> bool {
        false
    }

    fn is_search_or_read(_text: String, _context: String) -> bool {
        false
    }

    fn requires_user_interaction() -> bool {
        false
    }

    fn fixed_plan() -> Option<CallPlan> {
        None
    }

    fn checks_input() -> bool {
        true
    }

    fn inputs_equivalent(a: String, b: String) -> bool {
        a == b
    }

    /// The attacks. Each that the host survives ends in an ordinary result
    /// saying what happened, so a test can tell it from the host's error.
    fn call(text: String, _context: String) -> Result<CallOutput, String> {
        let input = input(&text);
        let ok = |content: String| Ok(text_output(content, None));
        let path = input.path.as_str();
        match input.act.as_str() {
            "ok" => ok("ok".into()),
            "loop" => spin(),
            "panic" => panic!("hostile: panicking in call as asked"),
            "grow_memory" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(black_box(vec![1u8; 1 << 20]));
                }
            }
            "recurse" => ok(recurse(0).to_string()),
            "huge_result" => ok("x".repeat(100 << 20)),
            "huge_progress" => {
                host::progress(&"p".repeat(100 << 20));
                ok("progress sent".into())
            }
            "bad_progress" => {
                host::progress("{not json");
                ok("progress sent".into())
            }
            "log" => {
                host::log(LogLevel::Debug, "hostile: a debug line");
                host::log(LogLevel::Info, "hostile: an info line");
                host::log(LogLevel::Error, "hostile: an error line");
                ok("logged".into())
            }
            "bad_modifier" => Ok(text_output("ok".into(), Some("{not json".into()))),
            "flood" => {
                let chunk = "y".repeat(1 << 16);
                for _ in 0..160 {
                    print!("{chunk}");
                    eprint!("{chunk}");
                }
                ok(format!("flooded {} bytes", 160 * chunk.len()))
            }
            "leak_handles" => {
                for leaked in 0.. {
                    match std::fs::File::open(path) {
                        Ok(file) => std::mem::forget(file),
                        Err(error) => {
                            return Err(format!("{} after {leaked} leaked", io_error("open", path, &error)));
                        }
                    }
                }
                unreachable!("the loop only ends by returning")
            }
            "sleep" => {
                std::thread::sleep(Duration::from_secs(input.secs));
                ok(format!("slept {} s", input.secs))
            }
            "env" => {
                let vars: Vec<(String, String)> = std::env::vars().collect();
                let args: Vec<String> = std::env::args().collect();
                ok(serde_json::json!({ "vars": vars, "args": args }).to_string())
            }
            "read" => {
                std::fs::read_to_string(path).map_err(|error| io_error("read", path, &error)).and_then(ok)
            }
            "list" => match std::fs::read_dir(path) {
                Ok(entries) => {
                    let mut names: Vec<String> = entries
                        .flatten()
                        .map(|entry| entry.file_name().to_string_lossy().into_owned())
                        .collect();
                    names.sort();
                    ok(names.join("\n"))
                }
                Err(error) => Err(io_error("list", path, &error)),
            },
            "write" => match std::fs::write(path, "written by hostile") {
                Ok(()) => ok(format!("wrote {path}")),
                Err(error) => Err(io_error("write", path, &error)),
            },
            "truncate" => match std::fs::OpenOptions::new().write(true).truncate(true).open(path) {
                Ok(_) => ok(format!("truncated {path}")),
                Err(error) => Err(io_error("truncate", path, &error)),
            },
            "rename" => match std::fs::rename(path, &input.to) {
                Ok(()) => ok(format!("renamed {path} to {}", input.to)),
                Err(error) => Err(io_error("rename", path, &error)),
            },
            "link" => match std::fs::hard_link(path, &input.to) {
                Ok(()) => ok(format!("linked {} to {path}", input.to)),
                Err(error) => Err(io_error("link", path, &error)),
            },
            "remove" => match std::fs::remove_file(path) {
                Ok(()) => ok(format!("removed {path}")),
                Err(error) => Err(io_error("remove", path, &error)),
            },
            other => Err(format!("unknown act `{other}`")),
        }
    }
}

// Only a wasm32 build is a component; a native build (under `cargo test
// --workspace`) checks the code and exports nothing.
#[cfg(target_arch = "wasm32")]
keel_guest::__private::export_tool!(Hostile with_types_in keel_guest::__private::bindings);
