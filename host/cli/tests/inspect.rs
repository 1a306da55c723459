//! `keel inspect` as a tool author runs it.

use std::path::{Path, PathBuf};
use std::process::Output;

fn keel(args: &[&str], cwd: &Path) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(args)
        .current_dir(cwd)
        .env("KEEL_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache"))
        .env_remove("KEEL_LOG")
        .output()
        .unwrap()
}

fn bundled(tool: &str) -> PathBuf {
    Path::new(env!("KEEL_BUNDLED_TOOLS_DIR")).join(format!("keel_tool_{tool}.wasm"))
}

fn stdout(output: &Output) -> String {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty(), "nothing on stdout when it fails");
    String::from_utf8(output.stderr.clone()).unwrap()
}

/// `1234567` as `1,234,567`, as inspect prints sizes.
fn grouped(n: u64) -> String {
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

#[test]
fn prints_metadata_schema_answers_and_the_granted_capabilities() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    std::fs::write(dir.join("keel.toml"), "[plugins.echo]\naccess = \"read-only\"\nenv = [\"HOME\"]\n")
        .unwrap();
    let plugin = bundled("echo");
    let text = stdout(&keel(&["inspect", plugin.to_str().unwrap()], &dir));
    // The compile time is the one figure that changes from run to run.
    let text: String = text
        .lines()
        .map(|line| match line.strip_prefix("  compile       ") {
            Some(rest) => format!("  compile       <ms>{}\n", &rest[rest.find(" ms").unwrap()..]),
            None => format!("{line}\n"),
        })
        .collect();
    let size = grouped(std::fs::metadata(&plugin).unwrap().len());
    let expected = format!(
        r#"echo ({plugin})
  aliases       (none)
  description   Returns `text` unchanged.
  contract      keel:tool@0.4.0
  size          {size} bytes
  compile       <ms> ms, loaded from the compile cache
  interrupt     block: a running call finishes
  listing       listed in full

input schema
  {{
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Input",
    "description": "Input of `echo`.",
    "type": "object",
    "properties": {{
      "text": {{
        "description": "The text to hand back.",
        "type": "string"
      }}
    }},
    "additionalProperties": false,
    "required": [
      "text"
    ]
  }}

answers at load
  is-enabled                true
  max-result-size           50000
  requires-user-interaction false
  fixed-plan                {{"concurrency_safe":true,"read_only":true}}
  checks-input              false

answers for the input {{"text":""}}
  plan                      {{"concurrency_safe":true,"read_only":true}}
  is-destructive            false
  check                     allow
  permission-subject        none
  classifier-input          ""
  activity-description      none
  is-open-world             false
  is-search-or-read         false
  inputs-equivalent         true

capabilities granted ({config})
  workspace   {workspace} at /workspace, read-only for every call
  environment HOME
  network     none
  trusted     no: a max-result-size of none is clamped
"#,
        plugin = plugin.display(),
        config = dir.join("keel.toml").display(),
        workspace = dir.display(),
    );
    // The first inspect of a run may have compiled it; the shared cache has it now.
    let expected = if text.contains(", compiled\n") {
        expected.replace("loaded from the compile cache", "compiled")
    } else {
        expected
    };
    assert_eq!(text, expected);
}

#[test]
fn says_which_export_trapped_and_which_fallback_applied() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = keel_tests::guest("keel_guest_trap_queries");
    let input = r#"{"trap_in":["is_concurrency_safe","check_permissions"]}"#;
    let text = stdout(&keel(&["inspect", "--input", input, plugin.to_str().unwrap()], dir.path()));
    let answers: Vec<&str> = text
        .lines()
        .skip_while(|line| !line.starts_with("answers for the input"))
        .skip(1)
        .take_while(|line| !line.is_empty())
        .collect();
    // Each names the tool method that trapped inside the export.
    let trapped = |export: &str, fallback: &str, method: &str| {
        let line = answers.iter().find(|line| line.trim_start().starts_with(export)).unwrap();
        let prefix = format!("  {export:<26}TRAPPED, so {fallback} (the fallback): the tool crashed: ");
        assert!(line.starts_with(&prefix), "{line}");
        assert!(line.ends_with(&format!("trap_queries: trapping in `{method}` as the input asks")), "{line}");
    };
    trapped("plan ", "neither concurrency-safe nor read-only", "is_concurrency_safe");
    trapped("check ", "invalid: the call is refused", "check_permissions");
    assert!(answers.contains(&"  is-destructive            false"), "the others answer: {answers:?}");
    assert_eq!(answers.len(), 9, "every per-input export: {answers:?}");
}

#[test]
fn json_output_reports_traps_at_load_with_their_fallbacks() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = keel_tests::guest("keel_guest_trap_load");
    let report: serde_json::Value =
        serde_json::from_str(&stdout(&keel(&["inspect", "--json", plugin.to_str().unwrap()], dir.path())))
            .unwrap();
    assert_eq!(report["contract"], "0.4.0");
    assert_eq!(report["tool"]["name"], "trap_load");
    assert_eq!(report["tool"]["enabled"], false);
    let at_load: Vec<(&str, &serde_json::Value, &str)> = report["at_load"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            assert!(entry["trapped"].is_string(), "{entry}");
            (entry["export"].as_str().unwrap(), &entry["answer"], entry["fallback"].as_str().unwrap())
        })
        .collect();
    assert_eq!(
        at_load,
        [
            ("is-enabled", &serde_json::json!(false), "false: the tool is left out of the pool"),
            ("max-result-size", &serde_json::json!(50_000), "50,000 chars"),
            ("requires-user-interaction", &serde_json::json!(false), "false"),
            ("fixed-plan", &serde_json::Value::Null, "none: plan is asked per call"),
            ("checks-input", &serde_json::json!(true), "true: check is asked per call"),
        ]
    );
    assert_eq!(report["grant"]["network"], serde_json::json!([]));
}

#[test]
fn errors_say_what_failed_where_and_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        stderr(&keel(&["inspect", "missing.wasm"], dir.path())),
        "error: no plugin at missing.wasm; pass the path of a tool's .wasm component \
         (cargo puts it in target/wasm32-wasip2/release/), or the name of a bundled tool\n"
    );
    // A bare name is a bundled tool's.
    let echo = stdout(&keel(&["inspect", "echo"], dir.path()));
    assert!(echo.starts_with("echo ("), "{echo}");
    assert!(echo.lines().next().unwrap().ends_with("keel_tool_echo.wasm)"), "{echo}");

    let other = dir.path().join("other.wasm");
    let component =
        wat::parse_str(r#"(component (instance $guest) (export "keel:tool/guest@0.1.0" (instance $guest)))"#)
            .unwrap();
    std::fs::write(&other, component).unwrap();
    assert_eq!(
        stderr(&keel(&["inspect", "--no-cache", "other.wasm"], dir.path())),
        "error: failed to load plugin other.wasm: was built against keel tool contract 0.1.0, which this host \
         does not know; it loads contracts 0.2.0, 0.3.0 and 0.4.0: rebuild the tool with a keel-guest of one of them\n"
    );

    let legacy = keel_tests::guest("keel_guest_legacy");
    let report = stdout(&keel(&["inspect", legacy.to_str().unwrap()], dir.path()));
    assert!(
        report.contains(
            "  contract      keel:tool@0.2.0 (older than 0.4.0: its questions do not see the context)\n"
        ),
        "{report}"
    );
    // An older contract fixes nothing at load: both are asked per call.
    assert!(
        report.contains(
            "  fixed-plan                none: plan is asked per call\n  checks-input              true\n"
        ),
        "{report}"
    );

    std::fs::write(dir.path().join("keel.toml"), "[limits]\nfuel = 10\nmemory = 5\n").unwrap();
    let echo = bundled("echo");
    assert_eq!(
        stderr(&keel(&["inspect", echo.to_str().unwrap()], dir.path())),
        format!(
            "error: invalid config {}: unknown field `memory`, expected one of `fuel`, `deadline_ms`, \
             `memory_mib`, `table_elements`, `stack_kib`, `batch_fuel`, `transfer_mib`, `resources`, \
             `input_kib`, `network_requests`, `network_sent_mib`, `network_received_mib`, \
             `network_connect_ms`, `network_response_ms`, `network_connections`, `context_kib` (line 3, column 1)\n",
            dir.path().canonicalize().unwrap().join("keel.toml").display()
        )
    );
}

#[test]
fn what_a_plugin_says_of_itself_reaches_the_terminal_with_its_control_characters_escaped() {
    let dir = tempfile::tempdir().unwrap();
    // Its search hint would clear the screen.
    let hostile = keel_tests::guest("keel_guest_hostile");
    let report = stdout(&keel(&["inspect", hostile.to_str().unwrap()], dir.path()));
    assert!(!report.contains('\u{1b}'), "{report:?}");
    assert!(report.contains("  search hint   finds\\u{1b}[2Jnothing\n"), "{report}");
}
