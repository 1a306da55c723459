//! The official MCP conformance suite (npm `@modelcontextprotocol/conformance`)
//! pointed at `keel serve --http`, one run per scenario that applies to a
//! tools server, each of which must pass. The suite is installed under the
//! target directory on first use, so this test needs `node`, `npm` and a
//! reachable package registry.
//!
//! The scenarios left out, and why:
//! - `tools-call-audio`, `tools-call-embedded-resource`,
//!   `tools-call-mixed-content`: the contract's content blocks are text and
//!   images; audio and embedded resources are not results a keel tool gives.
//! - `tools-call-sampling`, `tools-call-elicitation`,
//!   `elicitation-sep1034-defaults`, `elicitation-sep1330-enums`: a tool
//!   asking the client's model or user questions of its own is not in the
//!   contract; keel elicits only the approval of a call.
//! - `resources-*`, `prompts-*`, `completion-complete`: keel serves tools,
//!   and declares neither resources, prompts nor completions.
//!
//! `server-sse-polling` passes, but one of its checks is only informational
//! for keel: the server does not close an event stream in the middle of a
//! call for the client to resume it (rmcp's transport answers on the stream
//! the request opened).

mod support;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::{run, run_ok, serve};

/// The suite, at the version these scenarios were read from.
const SUITE: &str = "@modelcontextprotocol/conformance@0.1.16";
/// Installing it downloads a few megabytes.
const INSTALL_LIMIT: Duration = Duration::from_secs(300);
/// One scenario: a handful of requests.
const SCENARIO_LIMIT: Duration = Duration::from_secs(120);

/// Every scenario that applies to a tools server.
const SCENARIOS: &[&str] = &[
    "server-initialize",
    "ping",
    "logging-set-level",
    "tools-list",
    "tools-call-simple-text",
    "tools-call-image",
    "tools-call-error",
    "tools-call-with-logging",
    "tools-call-with-progress",
    "server-sse-multiple-streams",
    "server-sse-polling",
    "dns-rebinding-protection",
    "json-schema-2020-12",
];

/// The tools the scenarios call, built by the tests' build script.
const TOOLS: &[&str] = &["error", "image", "logging", "progress", "reconnection", "schema", "text"];

/// The suite's command line script reads `fs.globSync`, which Node gained in
/// version 22, for a command these runs do not use; on an older Node, this
/// hook hands the suite an `fs` with a stand-in so that it starts.
const FS_SHIM: &str = "export * from 'node:fs';\nimport fs from 'node:fs';\nexport default fs;\n\
                       export function globSync() { throw new Error('globSync is not available'); }\n";
const HOOKS: &str = "const shim = new URL('./fs-shim.mjs', import.meta.url).href;\n\
                     export async function resolve(specifier, context, next) {\n\
                     if ((specifier === 'fs' || specifier === 'node:fs') && \
                     (context.parentURL || '').includes('/@modelcontextprotocol/conformance/')) {\n\
                     return { url: shim, shortCircuit: true };\n}\n\
                     return next(specifier, context);\n}\n";
const REGISTER: &str = "import { register } from 'node:module';\nregister('./hooks.mjs', import.meta.url);\n";

/// The suite's entry point, installed on first use under a lock, and the
/// hook that lets it start on Node 20.
fn suite() -> (PathBuf, PathBuf) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("mcp-conformance");
    std::fs::create_dir_all(&dir).unwrap();
    let lock = File::create(dir.with_extension("lock")).unwrap();
    lock.lock().unwrap();
    let entry = dir.join("node_modules/@modelcontextprotocol/conformance/dist/index.js");
    let marker = dir.join("installed");
    if std::fs::read_to_string(&marker).ok().as_deref() != Some(SUITE) || !entry.is_file() {
        std::fs::write(dir.join("package.json"), "{ \"private\": true }\n").unwrap();
        run_ok(
            Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--loglevel=error", SUITE])
                .current_dir(&dir),
            INSTALL_LIMIT,
        );
        std::fs::write(&marker, SUITE).unwrap();
    }
    for (name, text) in [("fs-shim.mjs", FS_SHIM), ("hooks.mjs", HOOKS), ("register.mjs", REGISTER)] {
        std::fs::write(dir.join(name), text).unwrap();
    }
    (entry, dir.join("register.mjs"))
}

#[test]
fn the_official_conformance_suite_passes_every_scenario_for_a_tools_server() {
    let (entry, register) = suite();
    let workspace = tempfile::tempdir().unwrap();
    let plugins: Vec<PathBuf> =
        TOOLS.iter().map(|tool| keel_tests::guest(&format!("keel_guest_conformance_{tool}"))).collect();
    let server = serve(workspace.path(), &plugins);
    let mut failed = Vec::new();
    for scenario in SCENARIOS {
        let output = run(
            Command::new("node")
                .arg("--import")
                .arg(&register)
                .arg(&entry)
                .args(["server", "--url", &server.url, "--scenario", scenario])
                .current_dir(workspace.path()),
            SCENARIO_LIMIT,
        );
        if !output.status.success() {
            failed.push(format!(
                "{scenario} ({}):\n{}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} scenarios failed:\n\n{}",
        failed.len(),
        SCENARIOS.len(),
        failed.join("\n")
    );
}
