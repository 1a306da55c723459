//! keel's own files in the workspace it runs in: the configuration and the
//! lock file that `keel run` reads are kept from every tool's calls.

mod support;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

/// `keel ARGS` in `cwd` with `stdin` as its input.
fn keel(args: &[&str], cwd: &Path, stdin: &str) -> Output {
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache");
    support::run_with_input(&mut support::keel(cwd, &cache, args), stdin, Duration::from_secs(600))
}

/// The text of each result of a `keel run` message.
fn results(output: &Output) -> Vec<String> {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let message: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let content = message["content"].as_array().unwrap();
    content.iter().map(|result| result["content"].as_str().unwrap().to_owned()).collect()
}

const BATCH: &str = r#"[
    {"type":"tool_use","id":"1","name":"write_file","input":{"file_path":"keel.toml","content":"[plugins.x]\n"}},
    {"type":"tool_use","id":"2","name":"edit","input":{"file_path":"keel.lock","old_string":"a","new_string":"b"}},
    {"type":"tool_use","id":"3","name":"write_file","input":{"file_path":"notes.txt","content":"x"}}
]"#;

#[test]
fn the_configuration_and_lock_keel_run_reads_are_refused_to_every_tool() {
    let workspace = tempfile::tempdir().unwrap();
    let config = "[permissions]\nallow = [\"write_file\", \"edit\"]\n";
    std::fs::write(workspace.path().join("keel.toml"), config).unwrap();
    let output = keel(&["run", "-"], workspace.path(), BATCH);
    let rest = "; no call may change keel's own files, whatever the rules say";
    assert_eq!(
        results(&output),
        [
            format!(
                "Permission to use write_file denied: keel.toml is keel's configuration, which grants what every \
                 tool may do{rest}"
            ),
            format!(
                "Permission to use edit denied: keel.lock is keel's lock file, which pins the plugins keel runs{rest}"
            ),
            "Wrote 1 byte to notes.txt".to_owned(),
        ]
    );
    assert_eq!(std::fs::read_to_string(workspace.path().join("keel.toml")).unwrap(), config);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let warning = "keel.toml, keel's configuration, is where the plugins cd, edit and write_file may write: keel \
                   refuses every call that names it, but a plugin that writes it all the same changes what keel \
                   does at its next start; keep it where no plugin may write";
    assert_eq!(stderr.matches(warning).count(), 1, "{stderr}");
}

#[test]
fn a_configuration_kept_outside_the_workspace_leaves_its_name_there_free() {
    let workspace = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let config = elsewhere.path().join("keel.toml");
    std::fs::write(&config, "[permissions]\nallow = [\"write_file\"]\n").unwrap();
    let output = keel(&["run", "--config", config.to_str().unwrap(), "-"], workspace.path(), BATCH);
    let texts = results(&output);
    assert_eq!(texts[0], "Wrote 12 bytes to keel.toml", "not the configuration of this run");
    assert_eq!(
        texts[1], "cannot edit keel.lock: No such file or directory",
        "the lock is beside the configuration"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("keel's configuration"), "{stderr}");
}
