//! The `keel` binary as a user runs it.

mod support;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

/// `keel ARGS` in `cwd` with `stdin` as its input, however it ends.
fn keel(args: &[&str], cwd: &Path, stdin: &str) -> Output {
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache");
    support::run_with_input(&mut support::keel(cwd, &cache, args), stdin, KEEL_LIMIT)
}

/// How long one `keel` command of these tests may take: `keel bench
/// --quick` among them compiles fifty plugins on a cold cache.
const KEEL_LIMIT: Duration = Duration::from_secs(600);

#[test]
fn runs_a_batch_from_stdin_with_the_bundled_tools_from_any_directory() {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("a.txt"), "alpha\nbeta\n").unwrap();
    let batch = r#"[
        {"type":"tool_use","id":"1","name":"grep","input":{"pattern":"bet"}},
        {"type":"tool_use","id":"2","name":"write_file","input":{"file_path":"b.txt","content":"x"}},
        {"type":"tool_use","id":"3","name":"nope","input":{}}
    ]"#;
    let output = keel(&["run", "-"], workspace.path(), batch);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let message: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        message,
        serde_json::json!({
            "role": "user",
            "content": [
                { "type": "tool_result", "tool_use_id": "1", "content": "a.txt:2:beta\n" },
                { "type": "tool_result", "tool_use_id": "2", "content": "Wrote 1 byte to b.txt" },
                { "type": "tool_result", "tool_use_id": "3", "content": "No such tool: nope", "is_error": true }
            ]
        })
    );
    assert_eq!(std::fs::read_to_string(workspace.path().join("b.txt")).unwrap(), "x");
}

#[test]
fn a_bad_batch_file_fails_naming_the_file_and_block_with_nothing_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("batch.json"), r#"[{"id":"a","name":"grep"},{"id":7,"name":"grep"}]"#)
        .unwrap();
    let output = keel(&["run", "batch.json"], dir.path(), "");
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "error: failed to read batch batch.json: [1]: `id` must be a non-empty string\n"
    );
}

#[test]
fn an_override_that_takes_no_effect_is_warned_of_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keel.toml"), "[budget]\ntools = { echo = 0 }\n").unwrap();
    let batch = r#"[{"type":"tool_use","id":"a","name":"echo","input":{"text":"hi"}}]"#;
    let output = keel(&["run", "-"], dir.path(), batch);
    assert_eq!(output.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let warning =
        "ignoring `[budget.tools] echo = 0` in the config: only a finite positive number takes effect";
    assert_eq!(stderr.matches(warning).count(), 1, "{stderr}");
}

#[test]
fn a_failing_command_whose_stderr_is_gone_still_exits_with_its_status() {
    let dir = tempfile::tempdir().unwrap();
    // A pipe nobody reads: every write to it fails.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut child =
        support::keel(dir.path(), &dir.path().join("cache"), &["run", "--plugins", "missing.wasm", "-"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(writer)
            .spawn()
            .unwrap();
    let status = support::exit_within(&mut child, KEEL_LIMIT);
    assert_eq!(status.code(), Some(1), "{status}");
}

#[test]
fn a_command_whose_stdout_is_gone_ends_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let batch = r#"[{"type":"tool_use","id":"1","name":"grep","input":{"pattern":"x"}}]"#;
    std::fs::write(dir.path().join("batch.json"), batch).unwrap();
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache");
    let bench = ["bench", "--quick", "--json", "--only", "per_call_overhead"];
    for args in [&["run", "batch.json"][..], &["run", "--events", "batch.json"], &["list"], &bench] {
        // A pipe nobody reads, as `keel run … | head` leaves once `head`
        // has what it wants.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut child = support::keel(dir.path(), &cache, args)
            .stdin(std::process::Stdio::null())
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let status = support::exit_within(&mut child, KEEL_LIMIT);
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert_eq!(status.code(), Some(141), "keel {args:?}: {status}\n{stderr}");
        assert!(!stderr.contains("panicked") && !stderr.contains("error"), "keel {args:?}: {stderr}");
    }
}

#[test]
fn a_bad_plugin_fails_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("evil.wasm"), b"MZ\x90\x00").unwrap();
    let output = keel(&["run", "--plugins", "evil.wasm", "-"], dir.path(), "[]");
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.starts_with("error: failed to load plugin evil.wasm: not a WebAssembly file"), "{stderr}");
}

#[test]
fn logs_to_a_file_are_plain_text() {
    let workspace = tempfile::tempdir().unwrap();
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache");
    let mut command = support::keel(workspace.path(), &cache, &["run", "-"]);
    command.env("KEEL_LOG", "debug").env_remove("NO_COLOR");
    let batch = r#"[{"type":"tool_use","id":"1","name":"echo","input":{"text":"hi"}}]"#;
    let output = support::run_with_input(&mut command, batch, KEEL_LIMIT);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("DEBUG"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "colour codes in a log that is not a terminal: {stderr:?}");
}

#[test]
fn a_plugin_directory_without_a_plugin_is_named_in_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("tools")).unwrap();
    std::fs::write(dir.path().join("tools/README.md"), "not a plugin").unwrap();
    let output = keel(&["run", "--plugins", "tools", "-"], dir.path(), "[]");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(" WARN tools holds no plugin: no .wasm file in it\n"), "{stderr}");
}

#[test]
fn a_missing_workspace_fails_naming_it_and_its_reason_once() {
    let dir = tempfile::tempdir().unwrap();
    let output = keel(&["run", "--workspace", "gone", "-"], dir.path(), "[]");
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr, "error: failed to open workspace gone: No such file or directory (os error 2)\n");
}

#[test]
fn bench_quick_prints_one_json_figure_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let output = keel(&["bench", "--quick", "--json"], dir.path(), "");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(!stderr.contains("measuring"), "no progress line off a terminal: {stderr}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let figures: Vec<serde_json::Value> =
        stdout.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    let names: Vec<&str> =
        figures.iter().map(|f| f["name"].as_str().unwrap().split(' ').next().unwrap()).collect();
    let all_workers = format!("throughput_{}_workers", std::thread::available_parallelism().unwrap());
    assert_eq!(
        names,
        [
            "per_call_overhead",
            "per_call_overhead_after_idle",
            "throughput_1_workers",
            &all_workers,
            "batch_speedup",
            "startup_50_plugins",
            "first_call_after_warm_start",
            "first_call_after_warm_start_vs_idle",
            "first_call_warm_up_50_plugins",
            "tool_work_hash_10mb",
            "tool_work_hash_10mb_unmetered",
            "guest_compute_sha256_1mib",
            "budget_per_message_10x1mb",
            "rich_result_image_2mib",
            "memory_rss",
            "network_fetch_1mib",
            "network_policy_check",
            "mcp_stdio_round_trip_p50",
            "mcp_stdio_server_cpu_per_call",
            "mcp_stdio_round_trip_p50_no_sandbox",
            "mcp_stdio_server_cpu_per_call_no_sandbox",
            "mcp_stdio_burst_200",
            "mcp_stdio_burst_200_answered",
            "mcp_http_p50",
            "mcp_http_p99",
            "mcp_http_calls_per_s_1_clients",
            "mcp_http_calls_per_s_10_clients",
            "mcp_http_calls_per_s_100_clients",
            "mcp_http_p50_no_sandbox",
            "mcp_http_calls_per_s_10_clients_no_sandbox",
            "mcp_http_two_replicas",
            "mcp_http_burst_200",
            "mcp_http_burst_200_answered",
            "mcp_http_serve_rss_idle_50_plugins",
            "mcp_http_serve_rss_growth",
        ]
    );
    for figure in &figures {
        for key in ["keel", "baseline", "ratio"] {
            assert!(figure[key].is_f64(), "{key} of {figure}");
        }
        assert!(figure["unit"].is_string() && figure.get("target").is_some() && figure.get("met").is_some());
    }
    // Not one call of a burst is lost, however slow the machine.
    for figure in figures.iter().filter(|f| f["name"].as_str().unwrap().contains("_answered")) {
        assert_eq!(figure["keel"], figure["baseline"], "{figure}");
    }
}

/// What `keel ARGS` (shell words) shows when run in `cwd` on a terminal of
/// its own, which `script` (util-linux) makes, with `cache` as its compile
/// cache; panics unless it succeeds.
fn on_a_terminal(args: &str, cwd: &Path, cache: &Path) -> String {
    let command = format!("'{}' {args}", env!("CARGO_BIN_EXE_keel"));
    let mut script = std::process::Command::new("script");
    script.args(["-qec", &command, "/dev/null"]).current_dir(cwd).env("KEEL_CACHE_DIR", cache);
    let output = support::run(&mut script, KEEL_LIMIT);
    let shown = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "keel {args}: {}\n{shown}", output.status);
    shown
}

#[test]
fn bench_on_a_terminal_says_what_it_is_measuring() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache");
    let shown = on_a_terminal("bench --quick --only per_call_overhead", dir.path(), &cache);
    assert!(shown.contains("measuring per_call_overhead ("), "{shown}");
    // Each figure is printed on a line the progress line was cleared from.
    let rows: Vec<&str> = shown
        .split(['\r', '\n'])
        .map(|line| line.trim_start_matches("\x1b[2K"))
        .filter(|line| line.starts_with("per_call_overhead"))
        .collect();
    assert_eq!(rows.len(), 2, "{shown}");
    assert!(rows[1].starts_with("per_call_overhead_after_idle"), "{shown}");
}

#[test]
fn a_run_on_a_terminal_says_it_is_loading_plugins_while_it_compiles_them() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("batch.json"),
        r#"[{"type":"tool_use","id":"1","name":"grep","input":{"pattern":"x"}}]"#,
    )
    .unwrap();
    // A cache of its own, empty: the plugin is compiled, which takes a
    // while even in a fast build.
    let args = format!("run --plugins '{}' batch.json", support::bundled("grep").display());
    let shown = on_a_terminal(&args, dir.path(), &dir.path().join("cache"));
    assert!(shown.contains("loading plugins (compiling those new to the cache) ("), "{shown}");
    // The line is cleared before the message is printed.
    let message = shown.lines().find(|line| line.contains("\"role\"")).expect("the message is shown");
    assert_eq!(message.trim_start_matches("\x1b[2K").trim(), r#""role": "user","#, "{shown}");
}

/// Wait until `child` has handlers for `SIGINT` and `SIGTERM`: its
/// `/proc/<pid>/status` counts both among the signals it catches.
fn wait_for_stop_handlers(child: &mut std::process::Child) {
    let both = (1 << (2 - 1)) | (1 << (15 - 1));
    let started = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("keel ended ({status}) before it caught SIGINT and SIGTERM");
        }
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
        let caught = status.lines().find_map(|line| line.strip_prefix("SigCgt:")).unwrap();
        if u64::from_str_radix(caught.trim(), 16).unwrap() & both == both {
            return;
        }
        assert!(started.elapsed() < KEEL_LIMIT, "keel never caught SIGINT and SIGTERM");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_stop_signal_while_the_plugins_load_stops_the_command_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let batch =
        r#"[{"type":"tool_use","id":"1","name":"write_file","input":{"file_path":"b.txt","content":"x"}}]"#;
    std::fs::write(dir.path().join("batch.json"), batch).unwrap();
    // No cache: every bundled tool is compiled, which takes seconds.
    let interrupted = ("INT", 130, "keel: interrupted while starting\n");
    let terminated = ("TERM", 143, "keel: stopped by SIGTERM while starting\n");
    for (args, (signal, code, said)) in [
        (&["run", "--no-cache", "batch.json"][..], interrupted),
        (&["run", "--no-cache", "batch.json"], terminated),
        (&["list", "--no-cache"], interrupted),
        (&["lock", "--no-cache"], interrupted),
    ] {
        let mut child = support::keel(dir.path(), &dir.path().join("cache"), args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        wait_for_stop_handlers(&mut child);
        // Well into the start: the first plugins compiling.
        std::thread::sleep(Duration::from_millis(200));
        support::signal_child(&child, signal);
        let status = support::exit_within(&mut child, Duration::from_secs(10));
        let output = child.wait_with_output().unwrap();
        assert_eq!(status.code(), Some(code), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
        assert_eq!(String::from_utf8_lossy(&output.stderr), said, "{args:?} SIG{signal}");
        assert!(output.stdout.is_empty(), "{args:?}");
    }
    assert!(!dir.path().join("b.txt").exists(), "the call ran");
    assert!(!dir.path().join("keel.lock").exists(), "the lock was written");
}

#[test]
fn a_stop_signal_once_the_batch_began_interrupts_its_calls_and_the_run_ends_with_their_results() {
    use std::io::BufRead as _;

    // Ctrl-C from a person, SIGTERM from a process manager: either way every
    // call gets its result, and the exit status says the run was stopped.
    for (signal, status, said) in
        [("INT", 130, "keel: interrupted"), ("TERM", 143, "keel: stopped by SIGTERM")]
    {
        let dir = tempfile::tempdir().unwrap();
        let batch = r#"[
            {"type":"tool_use","id":"1","name":"sleep","input":{"ms":60000}},
            {"type":"tool_use","id":"2","name":"write_file","input":{"file_path":"b.txt","content":"x"}}
        ]"#;
        std::fs::write(dir.path().join("batch.json"), batch).unwrap();
        let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache");
        let mut child = support::keel(dir.path(), &cache, &["run", "--events", "batch.json"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Read on a thread of its own, so a run that never starts the call
        // fails the test at the bound below rather than hanging it.
        let (lines, events) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines.send(serde_json::from_str::<serde_json::Value>(&line).unwrap());
            }
        });
        let mut seen = Vec::new();
        while !seen.iter().any(|event: &serde_json::Value| event["type"] == "call_started") {
            seen.push(events.recv_timeout(KEEL_LIMIT).expect("the sleep starts"));
        }
        support::signal_child(&child, signal);
        let exit = support::exit_within(&mut child, Duration::from_secs(30));
        let stderr = String::from_utf8(child.wait_with_output().unwrap().stderr).unwrap();
        assert_eq!(exit.code(), Some(status), "SIG{signal}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert!(lines[0].starts_with("2 calls, 2 errors, "), "SIG{signal}: {stderr}");
        assert_eq!(lines[1..], [said], "SIG{signal}");
        seen.extend(events.iter());
        let texts: Vec<&str> = seen
            .iter()
            .filter(|event| event["type"] == "tool_result")
            .map(|event| event["content"].as_str().unwrap())
            .collect();
        assert_eq!(
            texts,
            [
                "Interrupted: the call was stopped before it finished.",
                "Interrupted: the call was not started."
            ],
            "SIG{signal}: {seen:?}"
        );
        assert!(!dir.path().join("b.txt").exists());
    }
}

#[test]
fn bench_compares_keel_with_another_stdio_mcp_server() {
    let dir = tempfile::tempdir().unwrap();
    // The native echo server the MCP figures measure keel against is a real
    // rmcp server on stdio: here it stands for the server a user runs today.
    // It writes down whether it runs with transparent huge pages, which
    // `keel` turns off for itself and not for the server it compares, and
    // counts its starts.
    let (thp, starts) = (dir.path().join("thp.txt"), dir.path().join("starts.txt"));
    let server = format!(
        "sh -c 'grep THP_enabled /proc/self/status > {}; echo start >> {}; exec {} bench --serve-native-echo'",
        thp.display(),
        starts.display(),
        env!("CARGO_BIN_EXE_keel")
    );
    // `--tools` relative to where keel was started, though `keel serve` runs
    // from a directory of its own.
    let bundled = support::bundled("echo");
    std::os::unix::fs::symlink(bundled.parent().unwrap(), dir.path().join("tools")).unwrap();
    let args = ["bench", "--quick", "--json", "--tools", "tools", "--mcp-server", &server, "--tool", "echo"];
    let output = keel(&[&args[..], &["--arguments", r#"{"text":"hi"}"#]].concat(), dir.path(), "");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let figures: Vec<serde_json::Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let names: Vec<&str> =
        figures.iter().map(|f| f["name"].as_str().unwrap().split(' ').next().unwrap()).collect();
    assert_eq!(
        names,
        [
            "mcp_stdio_round_trip_p50",
            "mcp_stdio_server_cpu_per_call",
            "mcp_stdio_burst_200",
            "mcp_stdio_burst_200_answered",
            "mcp_stdio_burst_200_answered",
            "mcp_stdio_first_call",
            "mcp_stdio_start_to_first_reply"
        ]
    );
    assert!(figures[0]["name"].as_str().unwrap().contains(&format!("{server}: echo")), "{}", figures[0]);
    // The whole start holds the handshake and the first call: more than the
    // first call alone, for either server.
    let (first, start) = (&figures[5], &figures[6]);
    for side in ["keel", "baseline"] {
        assert!(start[side].as_f64().unwrap() > first[side].as_f64().unwrap(), "{first} {start}");
    }
    // Started once before the start that is measured, so that a launcher's
    // first run (a download, a cache filled) is not what the figures show.
    assert_eq!(std::fs::read_to_string(&starts).unwrap(), "start\nstart\n");
    // As this test's own process, which never turned them off.
    let own = std::fs::read_to_string("/proc/self/status").unwrap();
    let own = own.lines().find(|line| line.starts_with("THP_enabled:")).unwrap();
    assert_eq!(std::fs::read_to_string(&thp).unwrap().trim_end(), own);

    // A tool it does not have is named in the error, and nothing is measured.
    let args = ["bench", "--quick", "--mcp-server", &server, "--tool", "nope"];
    let output = keel(&args, dir.path(), "");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("could not call nope with {}"), "{stderr}");
    // A server that does not start is named, and the table, with no row
    // to hold, is not begun.
    let output = keel(&["bench", "--mcp-server", "false", "--tool", "echo"], dir.path(), "");
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "");
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "error: `false` did not start as an MCP server on stdio (run by `sh -c`): it closed its stdout \
         without answering `initialize`\n"
    );
}

#[test]
fn the_configured_input_cap_applies_before_parsing_and_fails_only_that_call() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keel.toml"), "[limits]\ninput_kib = 1\n").unwrap();
    let big = "x".repeat(2000);
    let batch = format!(
        r#"[{{"id":"big","name":"echo","input":{{"text":"{big}"}}}},{{"id":"small","name":"echo","input":{{"text":"hi"}}}}]"#
    );
    let output = keel(&["run", "-"], dir.path(), &batch);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let message: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let big = &message["content"][0];
    assert_eq!(big["is_error"], true);
    assert!(big["content"].as_str().unwrap().contains("input size limit of 1 KiB exceeded"), "{big}");
    assert_eq!(message["content"][1]["content"], "hi");
}

#[test]
fn a_batch_that_is_not_utf8_fails_naming_the_offset() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("batch.json"), b"[{\"id\":\"a\xff\"}]").unwrap();
    let output = keel(&["run", "batch.json"], dir.path(), "");
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "error: failed to read batch batch.json: not UTF-8 text: invalid byte at offset 9\n"
    );
}

/// `keel run` with the test guest `rich` alone, on `batch`: the parsed stdout.
fn run_rich(args: &[&str], batch: &str) -> serde_json::Value {
    let workspace = tempfile::tempdir().unwrap();
    let rich = keel_tests::guest("keel_guest_rich");
    let mut all = vec!["run", "--plugins", rich.to_str().unwrap()];
    all.extend_from_slice(args);
    all.push("-");
    let output = keel(&all, workspace.path(), batch);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

const RICH_BATCH: &str = r#"[
    {"type":"tool_use","id":"1","name":"rich","input":{"mode":"image"}},
    {"type":"tool_use","id":"2","name":"rich","input":{"mode":"structured","value":{"count":3}}},
    {"type":"tool_use","id":"3","name":"rich","input":{"mode":"structured","value":{"count":"x"}}}
]"#;

#[test]
fn images_and_structured_values_print_as_tool_result_content() {
    let message = run_rich(&[], RICH_BATCH);
    let data =
        message["content"][0]["content"][1]["source"]["data"].as_str().expect("an image block").to_owned();
    assert_eq!(
        message,
        serde_json::json!({
            "role": "user",
            "content": [
                { "type": "tool_result", "tool_use_id": "1", "content": [
                    { "type": "text", "text": "a tiny image" },
                    { "type": "image", "source": { "type": "base64", "media_type": "image/png", "data": data } }
                ] },
                { "type": "tool_result", "tool_use_id": "2", "content": "{\"count\":3}" },
                { "type": "tool_result", "tool_use_id": "3", "is_error": true, "content":
                    "rich failed: the tool broke the keel contract: its structured value does not match its \
                     output schema: /count: \"x\" is not of type \"integer\" (rule: type)" }
            ]
        })
    );
    // The PNG signature, base64-encoded.
    assert!(data.starts_with("iVBORw0KGgo"), "{data}");
}

#[test]
fn an_openai_assistant_message_runs_and_its_results_go_back_as_tool_messages() {
    let workspace = tempfile::tempdir().unwrap();
    let message = r#"{"role":"assistant","content":null,"tool_calls":[
        {"id":"call_a","type":"function","function":{"name":"echo","arguments":"{\"text\":\"hi\"}"}},
        {"id":"call_b","type":"function","function":{"name":"echo","arguments":"{\"text\":"}}]}"#;
    let output = keel(&["run", "--format", "openai", "-"], workspace.path(), message);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let messages: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(messages[0], serde_json::json!({ "role": "tool", "tool_call_id": "call_a", "content": "hi" }));
    assert_eq!(messages[1]["tool_call_id"], "call_b");
    let broken = messages[1]["content"].as_str().unwrap();
    assert!(broken.starts_with("Invalid input for echo: the input is not valid JSON: "), "{broken}");
}

#[test]
fn the_openai_format_carries_the_text_and_names_a_left_out_image() {
    let messages = run_rich(&["--format", "openai"], RICH_BATCH);
    assert_eq!(messages[0]["role"], "tool");
    assert_eq!(messages[0]["tool_call_id"], "1");
    let text = messages[0]["content"].as_str().unwrap();
    let (first, second) = text.split_once('\n').expect("two lines");
    assert_eq!(first, "a tiny image");
    assert!(
        second.starts_with("[an image (image/png, ")
            && second.ends_with("was left out: this format carries text only]")
    );
    assert_eq!(messages[1]["content"], "{\"count\":3}");
}

#[test]
fn the_events_carry_a_structured_value_beside_its_text() {
    let workspace = tempfile::tempdir().unwrap();
    let rich = keel_tests::guest("keel_guest_rich");
    let batch = r#"[{"type":"tool_use","id":"2","name":"rich","input":{"mode":"text-and-structured","value":{"count":3}}}]"#;
    let output =
        keel(&["run", "--events", "--plugins", rich.to_str().unwrap(), "-"], workspace.path(), batch);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let result = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .find(|event| event["type"] == "tool_result")
        .expect("a tool_result event");
    assert_eq!(result["content"], "see the value");
    assert_eq!(result["structured_content"], serde_json::json!({ "count": 3 }));
}

#[test]
fn list_shows_a_tools_output_schema() {
    let workspace = tempfile::tempdir().unwrap();
    let output = keel(&["list", "--format", "json"], workspace.path(), "");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let tools: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout).unwrap();
    let wc = tools.iter().find(|tool| tool["name"] == "wc").expect("wc is bundled");
    let schema = &wc["output_schema"];
    for field in ["lines", "words", "bytes"] {
        assert!(schema["properties"][field].is_object(), "{schema}");
    }
    let origin = &wc["origin"];
    assert_eq!(origin["contract"], "0.4.0", "{origin}");
}

#[test]
fn keel_test_names_a_missing_expectation_and_counts_the_cases_that_failed() {
    let dir = tempfile::tempdir().unwrap();
    for case in ["a", "b"] {
        std::fs::create_dir_all(dir.path().join("cases").join(case)).unwrap();
        std::fs::write(
            dir.path().join("cases").join(case).join("batch.json"),
            r#"[{"type":"tool_use","id":"1","name":"echo","input":{"text":"hi"}}]"#,
        )
        .unwrap();
    }
    let output = keel(&["test", "cases"], dir.path(), "");
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("--- cases/a/expected.json (missing)\n+++ actual\n"), "{stdout}");
    assert!(stdout.contains("--- cases/b/events.jsonl (missing)\n+++ actual\n"), "{stdout}");
    assert!(stdout.ends_with("to accept the new output: KEEL_BLESS=1 keel test cases\n"), "{stdout}");
    assert_eq!(String::from_utf8_lossy(&output.stderr), "error: 2 fixture cases failed\n");

    // Blessed, they pass; a case whose batch cannot be read still fails,
    // with no word of blessing, which cannot mend it.
    std::fs::create_dir_all(dir.path().join("cases/c")).unwrap();
    std::fs::write(dir.path().join("cases/c/batch.json"), "not json").unwrap();
    for flags in [&["test", "--bless", "cases"][..], &["test", "cases"]] {
        let output = keel(flags, dir.path(), "");
        assert_eq!(output.status.code(), Some(1));
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(stdout.contains("ok      a\nok      b\nFAILED  c: failed to read batch"), "{stdout}");
        assert!(stdout.ends_with("2 passed, 1 failed\n"), "{stdout}");
    }
    std::fs::remove_dir_all(dir.path().join("cases/c")).unwrap();

    // A case's batch file given for the case is named as what it is.
    let output = keel(&["test", "cases/a/batch.json"], dir.path(), "");
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "error: cases/a/batch.json is a file; give a fixture case (a directory holding batch.json) or a \
         directory of cases\n"
    );
}

#[test]
fn keel_test_and_inspect_stop_on_a_stop_signal() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("cases/a")).unwrap();
    std::fs::write(
        dir.path().join("cases/a/batch.json"),
        r#"[{"type":"tool_use","id":"1","name":"sleep","input":{"ms":60000}}]"#,
    )
    .unwrap();
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache");
    // A case that sleeps a minute, and an inspection that compiles its
    // plugin afresh: each is stopped where it is.
    let grep = support::bundled("grep");
    for (args, signal, code, said) in [
        (&["test", "cases"][..], "TERM", 143, "keel: stopped by SIGTERM\n"),
        (
            &["inspect", "--no-cache", grep.to_str().unwrap()],
            "INT",
            130,
            "keel: interrupted while starting\n",
        ),
    ] {
        let mut child = support::keel(dir.path(), &cache, args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        wait_for_stop_handlers(&mut child);
        std::thread::sleep(Duration::from_millis(100));
        support::signal_child(&child, signal);
        let status = support::exit_within(&mut child, Duration::from_secs(10));
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.ends_with(said), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}: {}", String::from_utf8_lossy(&output.stdout));
    }
}
