//! What `keel run` does once its batch has ended: a stop signal then ends
//! it at once with the signal's status, each report is tried and each
//! failure said, and a report goes where its path led when the run began.

mod support;

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

/// `keel run ARGS` in `workspace` on `batch`, its stdout and stderr piped.
fn keel_run(workspace: &Path, args: &[&str], batch: &str) -> Child {
    std::fs::write(workspace.join("batch.json"), batch).unwrap();
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache");
    let args = [&["run"][..], args, &["batch.json"]].concat();
    support::keel(workspace, &cache, &args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn mkfifo(path: &Path) {
    let made = std::process::Command::new("mkfifo").arg(path).status().unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
}

/// The first line of the child's stdout that holds `text`.
fn wait_for_stdout(child: &mut Child, text: &str) -> BufReader<std::process::ChildStdout> {
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while stdout.read_line(&mut line).unwrap() > 0 {
        if line.contains(text) {
            return stdout;
        }
        line.clear();
    }
    panic!("keel ended before it printed {text}");
}

fn stderr_of(child: &mut Child) -> String {
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    stderr
}

#[test]
fn a_signal_while_the_reports_are_written_ends_keel_run_at_once_with_its_status() {
    let workspace = tempfile::tempdir().unwrap();
    // A pipe nobody reads: the trace's write waits for a reader forever.
    mkfifo(&workspace.path().join("trace.pipe"));
    let batch = r#"[{"type":"tool_use","id":"e1","name":"echo","input":{"text":"done"}}]"#;
    let mut child = keel_run(workspace.path(), &["--trace", "trace.pipe"], batch);
    // The results are printed before the reports are written.
    let _stdout = wait_for_stdout(&mut child, "tool_result");
    std::thread::sleep(Duration::from_millis(300));
    support::signal_child(&child, "TERM");
    let status = support::exit_within(&mut child, Duration::from_secs(10));
    let stderr = stderr_of(&mut child);
    assert_eq!(status.code(), Some(143), "{stderr}");
    assert!(stderr.contains("keel: stopped by SIGTERM"), "{stderr}");
}

#[test]
fn a_report_that_cannot_be_written_leaves_the_other_report_and_the_summary() {
    let workspace = tempfile::tempdir().unwrap();
    let batch = r#"[{"type":"tool_use","id":"e1","name":"echo","input":{"text":"done"}}]"#;
    // Every write to /dev/full fails: no space left on the device.
    let mut child =
        keel_run(workspace.path(), &["--trace", "/dev/full", "--timeline", "timeline.html"], batch);
    let status = support::exit_within(&mut child, Duration::from_secs(60));
    let stderr = stderr_of(&mut child);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("failed to write trace /dev/full"), "{stderr}");
    assert!(stderr.contains("1 call"), "the summary is printed: {stderr}");
    let timeline = std::fs::read_to_string(workspace.path().join("timeline.html")).unwrap();
    assert!(timeline.contains("e1"), "the timeline is written");
}

#[test]
fn a_report_a_tool_wrote_during_the_run_is_said_to_be_replaced() {
    let workspace = tempfile::tempdir().unwrap();
    let batch = r#"[{"type":"tool_use","id":"w1","name":"write_file","input":{"file_path":"report.html","content":"<h1>my work</h1>"}}]"#;
    let mut child = keel_run(workspace.path(), &["--timeline", "report.html"], batch);
    let status = support::exit_within(&mut child, Duration::from_secs(60));
    let stderr = stderr_of(&mut child);
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("timeline report.html changed since keel started"), "{stderr}");
}
