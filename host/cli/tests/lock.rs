//! Pinned plugins: `keel lock`, a lock's refusals, `--locked`, and the
//! `sha256` key of a `[plugins.X]` section.

mod support;

use std::path::{Path, PathBuf};

use support::bundled;

/// A project: a `tools/` directory of plugins and its own compile cache.
struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new(tools: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("tools")).unwrap();
        let project = Project { dir };
        for tool in tools {
            project.install(tool, tool);
        }
        project
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Put the bundled tool `tool` in `tools/` under the file name of `name`.
    fn install(&self, name: &str, tool: &str) -> PathBuf {
        let file = self.path().join(format!("tools/keel_tool_{name}.wasm"));
        std::fs::copy(bundled(tool), &file).unwrap();
        file
    }

    fn keel_ok(&self, args: &[&str]) -> String {
        support::keel_ok(&mut support::keel(self.path(), &self.path().join("cache"), args))
    }

    /// The stderr of `keel args`, which must fail.
    fn keel_fails(&self, args: &[&str]) -> String {
        support::keel_fails(&mut support::keel(self.path(), &self.path().join("cache"), args))
    }
}

fn sha256(path: &Path) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(std::fs::read(path).unwrap()).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The names of the tools `keel list` prints.
fn listed(stdout: &str) -> Vec<String> {
    let tools: Vec<serde_json::Value> = serde_json::from_str(stdout).unwrap();
    tools.iter().map(|tool| tool["name"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn keel_lock_says_how_many_plugins_it_pinned() {
    let project = Project::new(&["echo"]);
    let mut lock =
        support::keel(project.path(), &project.path().join("cache"), &["lock", "--plugins", "tools"]);
    let output = support::run(&mut lock, std::time::Duration::from_secs(120));
    assert!(output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.ends_with("keel.lock: 1 plugin pinned\n"), "{stderr}");
}

#[test]
fn keel_lock_records_name_source_digest_and_contract_of_every_plugin() {
    let project = Project::new(&["echo", "grep"]);
    project.keel_ok(&["lock", "--plugins", "tools"]);
    let lock = std::fs::read_to_string(project.path().join("keel.lock")).unwrap();
    let echo = sha256(&project.path().join("tools/keel_tool_echo.wasm"));
    let grep = sha256(&project.path().join("tools/keel_tool_grep.wasm"));
    assert_eq!(
        lock,
        format!(
            "# Written by `keel lock`: the plugins this project runs, pinned by digest.\nversion = 1\n\n\
             [[plugin]]\nname = \"echo\"\nsource = \"tools/keel_tool_echo.wasm\"\nsha256 = \"{echo}\"\ncontract = \"0.4.0\"\n\n\
             [[plugin]]\nname = \"grep\"\nsource = \"tools/keel_tool_grep.wasm\"\nsha256 = \"{grep}\"\ncontract = \"0.4.0\"\n"
        )
    );
    assert_eq!(
        listed(&project.keel_ok(&["list", "--plugins", "tools", "--locked"])),
        ["Read", "echo", "grep"]
    );
}

#[test]
fn one_component_given_twice_is_pinned_once_and_two_components_of_one_name_are_refused() {
    let project = Project::new(&["echo"]);
    // The same file twice: the pool keeps one, and the lock pins it once, so
    // that the runs after it read the lock it wrote.
    let args = ["lock", "--plugins", "tools", "--plugins", "tools/keel_tool_echo.wasm"];
    let mut lock = support::keel(project.path(), &project.path().join("cache"), &args);
    let output = support::run(&mut lock, std::time::Duration::from_secs(120));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(output.status.success() && stderr.ends_with("keel.lock: 1 plugin pinned\n"), "{stderr}");
    assert_eq!(listed(&project.keel_ok(&["list", "--plugins", "tools", "--locked"])), ["Read", "echo"]);

    // Another component of the same name beside it: a lock could pin only one.
    std::fs::remove_file(project.path().join("keel.lock")).unwrap();
    let elsewhere = project.path().join("other");
    std::fs::create_dir(&elsewhere).unwrap();
    let mut bytes = std::fs::read(bundled("echo")).unwrap();
    // A custom section appended: a valid component with other bytes.
    bytes.extend_from_slice(&[0, 7, 5, b'x', b'-', b'k', b'e', b'l', 0]);
    std::fs::write(elsewhere.join("echo.wasm"), &bytes).unwrap();
    let stderr = project.keel_fails(&["lock", "--plugins", "tools", "--plugins", "other"]);
    assert_eq!(
        stderr.trim_end(),
        "error: refused plugin other/echo.wasm: its tool echo is also the tool of tools/keel_tool_echo.wasm, \
         another component; a lock pins one component per tool name, so give only one of them"
    );
    assert!(!project.path().join("keel.lock").exists());
}

#[test]
fn a_tampered_plugin_under_a_lock_is_refused_naming_the_file_and_both_digests() {
    let project = Project::new(&["echo", "grep"]);
    project.keel_ok(&["lock", "--plugins", "tools"]);
    let pinned = sha256(&project.path().join("tools/keel_tool_grep.wasm"));
    // Warm the cache first: a refusal must not depend on the file being read.
    project.keel_ok(&["list", "--plugins", "tools"]);

    // Other bytes under the pinned file's name: another tool altogether.
    let file = project.install("grep", "wc");
    let actual = sha256(&file);
    let stderr = project.keel_fails(&["list", "--plugins", "tools"]);
    let lock = project.path().join("keel.lock").canonicalize().unwrap();
    assert_eq!(
        stderr.trim_end(),
        format!(
            "error: refused plugin tools/keel_tool_grep.wasm: {} pins sha256 {pinned}, but the file's component has sha256 {actual}",
            lock.display()
        )
    );
    // The same bytes the lock pins load again.
    project.install("grep", "grep");
    assert_eq!(listed(&project.keel_ok(&["list", "--plugins", "tools"])), ["Read", "echo", "grep"]);
}

#[test]
fn a_plugin_the_lock_pins_by_name_is_refused_from_another_file_with_other_bytes() {
    let project = Project::new(&["echo"]);
    project.keel_ok(&["lock", "--plugins", "tools"]);
    // Another build of a tool named `echo` is not the one locked, wherever it is.
    let elsewhere = tempfile::tempdir().unwrap();
    let impostor = elsewhere.path().join("echo.wasm");
    std::fs::copy(bundled("echo"), &impostor).unwrap();
    let mut bytes = std::fs::read(&impostor).unwrap();
    // A custom section appended: a valid component with other bytes.
    bytes.extend_from_slice(&[0, 7, 5, b'x', b'-', b'k', b'e', b'l', 0]);
    std::fs::write(&impostor, &bytes).unwrap();
    let stderr = project.keel_fails(&["list", "--plugins", impostor.to_str().unwrap()]);
    assert!(stderr.contains(&format!("refused plugin {}", impostor.display())), "{stderr}");
    assert!(
        stderr.contains(&format!("but the file's component has sha256 {}", sha256(&impostor))),
        "{stderr}"
    );
}

#[test]
fn locked_refuses_a_plugin_the_lock_does_not_name_and_an_entry_whose_plugin_is_missing() {
    let project = Project::new(&["echo", "grep"]);
    let stderr = project.keel_fails(&["list", "--plugins", "tools", "--locked"]);
    assert_eq!(
        stderr.trim_end(),
        format!(
            "error: --locked needs a lock, and there is none at {}; run `keel lock` to write one",
            project.path().join("keel.lock").display()
        )
    );
    project.keel_ok(&["lock", "--plugins", "tools"]);
    let lock = project.path().join("keel.lock").canonicalize().unwrap();

    project.install("wc", "wc");
    let stderr = project.keel_fails(&["list", "--plugins", "tools", "--locked"]);
    assert_eq!(
        stderr.trim_end(),
        format!(
            "error: refused plugin tools/keel_tool_wc.wasm: {} does not name its tool wc (--locked); run `keel lock` to pin it",
            lock.display()
        )
    );
    // Without --locked, a plugin the lock does not name loads.
    assert_eq!(listed(&project.keel_ok(&["list", "--plugins", "tools"])), ["Read", "echo", "grep", "wc"]);

    std::fs::remove_file(project.path().join("tools/keel_tool_wc.wasm")).unwrap();
    std::fs::remove_file(project.path().join("tools/keel_tool_echo.wasm")).unwrap();
    let batch = project.path().join("batch.json");
    std::fs::write(&batch, r#"[{"type":"tool_use","id":"1","name":"grep","input":{"pattern":"x"}}]"#)
        .unwrap();
    let stderr = project.keel_fails(&["run", "--plugins", "tools", "--locked", batch.to_str().unwrap()]);
    assert_eq!(
        stderr.trim_end(),
        format!(
            "error: {} pins echo (from tools/keel_tool_echo.wasm), which this run does not load (--locked)",
            lock.display()
        )
    );
}

#[test]
fn a_sha256_key_pins_one_plugin_without_a_lock() {
    let project = Project::new(&["echo", "grep"]);
    let echo = sha256(&project.path().join("tools/keel_tool_echo.wasm"));
    std::fs::write(project.path().join("keel.toml"), format!("[plugins.echo]\nsha256 = \"{echo}\"\n"))
        .unwrap();
    assert_eq!(listed(&project.keel_ok(&["list", "--plugins", "tools"])), ["Read", "echo", "grep"]);

    let wrong = "0".repeat(64);
    std::fs::write(project.path().join("keel.toml"), format!("[plugins.echo]\nsha256 = \"{wrong}\"\n"))
        .unwrap();
    let stderr = project.keel_fails(&["list", "--plugins", "tools"]);
    assert_eq!(
        stderr.trim_end(),
        format!(
            "error: refused plugin tools/keel_tool_echo.wasm: [plugins.echo] pins sha256 {wrong}, but the file's component has sha256 {echo}"
        )
    );
}
