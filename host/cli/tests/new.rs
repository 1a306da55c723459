//! `keel new` as a tool author runs it: create the crate, then build, test
//! and run it with the three commands its README gives.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn keel(args: &[&str], cwd: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(args)
        .current_dir(cwd)
        .env("KEEL_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache"))
        .env_remove("KEEL_LOG");
    command
}

/// `cargo` in `dir`, as an author would run it, with the build directory
/// shared by every run of this test so that only the first compiles the
/// dependencies.
fn cargo(args: &[&str], dir: &Path) -> Output {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command.args(args).current_dir(dir).env("CARGO_TARGET_DIR", target_dir());
    // What the outer cargo set for this test must not steer the author's build.
    for var in ["RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS", "CARGO_BUILD_TARGET", "CARGO_BUILD_TARGET_DIR"] {
        command.env_remove(var);
    }
    command.output().unwrap()
}

fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-new-target")
}

fn succeeded(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn failed(output: &Output) -> String {
    assert_eq!(output.status.code(), Some(1), "{}", String::from_utf8_lossy(&output.stdout));
    assert!(output.stdout.is_empty());
    String::from_utf8(output.stderr.clone()).unwrap()
}

#[test]
fn a_new_tool_builds_passes_its_tests_and_its_fixture_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let created = succeeded(&keel(&["new", "greet-me"], dir.path()).output().unwrap());
    let wasm = "target/wasm32-wasip2/release/greet_me.wasm";
    assert_eq!(
        created,
        format!(
            "Created the tool `greet-me` in greet-me. Next:\n\n    cd greet-me\n    \
             cargo build --release --target wasm32-wasip2\n    \
             cargo test && keel test tests/fixtures --plugins {wasm}\n    \
             keel run --plugins {wasm} tests/fixtures/hello/batch.json\n"
        )
    );
    let krate = dir.path().join("greet-me");
    let readme = std::fs::read_to_string(krate.join("README.md")).unwrap();
    for command in [
        "cargo build --release --target wasm32-wasip2".to_string(),
        format!("cargo test && keel test tests/fixtures --plugins {wasm}"),
        format!("keel run --plugins {wasm} tests/fixtures/hello/batch.json"),
    ] {
        assert!(readme.lines().any(|line| line == command), "the README gives `{command}`");
    }
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest-sdk").canonicalize().unwrap();
    assert!(
        readme.contains(&format!("\n    {}\n", sdk.display())),
        "the README says where keel-guest comes from"
    );

    // keel's own lock file pins what this workspace already downloaded, so
    // the build needs no network.
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.lock"), krate.join("Cargo.lock"))
        .unwrap();
    succeeded(&cargo(&["build", "--release", "--target", "wasm32-wasip2", "--offline"], &krate));
    let tested = succeeded(&cargo(&["test", "--offline"], &krate));
    assert!(tested.contains("test result: ok. 2 passed; 0 failed"), "{tested}");

    let wasm = target_dir().join("wasm32-wasip2/release/greet_me.wasm");
    let wasm = wasm.to_str().unwrap();
    let fixtures = succeeded(&keel(&["test", "tests/fixtures", "--plugins", wasm], &krate).output().unwrap());
    assert_eq!(fixtures, "ok      hello\n\n1 passed, 0 failed\n");
    let ran = succeeded(
        &keel(&["run", "--plugins", wasm, "tests/fixtures/hello/batch.json"], &krate).output().unwrap(),
    );
    assert_eq!(ran, std::fs::read_to_string(krate.join("tests/fixtures/hello/expected.json")).unwrap());
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&ran).unwrap()["content"][0]["content"],
        "Hello, keel!"
    );
}

#[test]
fn a_missing_wasm_target_is_named_with_the_command_that_installs_it() {
    let dir = tempfile::tempdir().unwrap();
    // A `rustc` that knows no target, as one without wasm32-wasip2 answers.
    let rustc = dir.path().join("rustc");
    std::fs::write(&rustc, "#!/bin/sh\necho \"error: no such target\" >&2\nexit 1\n").unwrap();
    std::fs::set_permissions(&rustc, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let output = keel(&["new", "t"], dir.path()).env("RUSTC", &rustc).output().unwrap();
    succeeded(&output);
    assert_eq!(
        String::from_utf8(output.stderr).unwrap(),
        "note: the wasm32-wasip2 target is not installed, so the build will fail; \
         install it with `rustup target add wasm32-wasip2`\n"
    );
    assert!(dir.path().join("t/src/lib.rs").is_file(), "the crate is created all the same");
}

#[test]
fn refuses_a_taken_directory_a_bad_name_and_a_missing_sdk() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("taken")).unwrap();
    std::fs::write(dir.path().join("taken/file"), "").unwrap();
    assert_eq!(
        failed(&keel(&["new", "taken"], dir.path()).output().unwrap()),
        "error: taken already exists and is not empty; choose another directory with --path\n"
    );
    assert_eq!(
        failed(&keel(&["new", "My Tool"], dir.path()).output().unwrap()),
        "error: `My Tool` cannot name a tool: use up to 64 lowercase letters, digits, `_` and `-`, \
         starting with a letter (it names the crate too)\n"
    );
    assert_eq!(
        failed(&keel(&["new", "t", "--sdk", "nowhere"], dir.path()).output().unwrap()),
        "error: keel-guest's source is not at nowhere; pass --sdk DIR, the guest-sdk directory of a keel \
         checkout (keel-guest is not on crates.io yet)\n"
    );
    assert!(!dir.path().join("t").exists(), "nothing is created when it fails");
}

#[test]
fn refuses_a_path_that_is_a_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("file"), "").unwrap();
    assert_eq!(
        failed(&keel(&["new", "t", "--path", "file"], dir.path()).output().unwrap()),
        "error: file exists and is not a directory; choose another directory with --path\n"
    );
}

/// `keel new` run with a limit on the size of the files it may write, so
/// that its first write larger than a kilobyte fails (EFBIG; the signal the
/// limit sends is ignored), after smaller ones have succeeded.
fn keel_new_with_file_limit(args: &str, cwd: &Path) -> Output {
    let script = format!("trap '' XFSZ; ulimit -f 1; exec \"$0\" new {args}");
    Command::new("bash")
        .args(["-c", &script, env!("CARGO_BIN_EXE_keel")])
        .current_dir(cwd)
        .env("KEEL_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("keel-cache"))
        .env_remove("KEEL_LOG")
        .output()
        .unwrap()
}

#[test]
fn a_crate_that_cannot_be_written_whole_is_not_written_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let output = keel_new_with_file_limit("t", dir.path());
    let stderr = failed(&output);
    assert!(stderr.starts_with("error: failed to write t/"), "{stderr}");
    assert!(stderr.contains("File too large"), "{stderr}");
    assert!(!dir.path().join("t").exists(), "no half-made crate is left");
    // Nor the parents made for it.
    failed(&keel_new_with_file_limit("t --path deep/er/t", dir.path()));
    assert!(!dir.path().join("deep").exists(), "no directory made for the crate is left");

    // An empty directory given to hold the crate stays as it was.
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    failed(&keel_new_with_file_limit("t --path empty", dir.path()));
    assert_eq!(std::fs::read_dir(dir.path().join("empty")).unwrap().count(), 0);

    // Given the same empty directory without the limit, the crate is made
    // in it, and nothing of the work is left beside it.
    succeeded(&keel(&["new", "t", "--path", "empty"], dir.path()).output().unwrap());
    // Made in the current directory, it tells no one to change to it.
    std::fs::create_dir(dir.path().join("here")).unwrap();
    let created = succeeded(&keel(&["new", "t", "--path", "."], &dir.path().join("here")).output().unwrap());
    assert!(created.starts_with("Created the tool `t` here. Next:\n\n    cargo build"), "{created}");
    assert!(dir.path().join("here/src/lib.rs").is_file());
    let mut made: Vec<_> = std::fs::read_dir(dir.path().join("empty"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    made.sort();
    assert_eq!(made, [".gitignore", "Cargo.toml", "README.md", "src", "tests"]);
}
