//! `keel cache`: listing the compile cache, pruning it, and its size cap,
//! with other keel processes using the cache at the same time.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use support::bundled;

const BATCH: &str = r#"[
    {"type":"tool_use","id":"1","name":"echo","input":{"text":"still here"}},
    {"type":"tool_use","id":"2","name":"grep","input":{"pattern":"needle"}}
]"#;

/// A project with `tools/` (echo and grep), a batch, a workspace for it
/// and its own cache.
struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("tools")).unwrap();
        for tool in ["echo", "grep"] {
            std::fs::copy(bundled(tool), dir.path().join(format!("tools/keel_tool_{tool}.wasm"))).unwrap();
        }
        std::fs::write(dir.path().join("batch.json"), BATCH).unwrap();
        std::fs::create_dir(dir.path().join("workspace")).unwrap();
        std::fs::write(dir.path().join("workspace/notes.txt"), "a needle\n").unwrap();
        // The compile cache indexes a file only once it has held still for 2 s.
        std::thread::sleep(Duration::from_millis(2100));
        Project { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn cache(&self) -> PathBuf {
        self.path().join("cache")
    }

    fn plugin(&self, tool: &str) -> PathBuf {
        self.path().join(format!("tools/keel_tool_{tool}.wasm")).canonicalize().unwrap()
    }

    fn keel_ok(&self, args: &[&str]) -> String {
        support::keel_ok(&mut support::keel(self.path(), &self.cache(), args))
    }

    /// The batch's results, which are the same whatever the cache holds.
    fn run_batch(&self) {
        let stdout = self.keel_ok(&["run", "--plugins", "tools", "--workspace", "workspace", "batch.json"]);
        let message: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(message["content"][0]["content"], "still here");
        assert_eq!(message["content"][1]["content"], "notes.txt:1:a needle\n");
    }

    /// Every file of the cache that belongs to the bytes of `tool`'s
    /// plugin: its compiled code, answers and index entries.
    fn files_of(&self, tool: &str) -> Vec<PathBuf> {
        let key = blake3::hash(&std::fs::read(self.plugin(tool)).unwrap()).to_hex().to_string();
        let mut files = Vec::new();
        for dir in [self.cache(), self.cache().join("answers"), self.cache().join("index")] {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                let named = path.file_name().unwrap().to_string_lossy().starts_with(&key);
                let holds = path.parent().unwrap().ends_with("index")
                    && std::fs::read_to_string(&path).unwrap_or_default().starts_with(&key);
                if path.is_file() && (named || holds) {
                    files.push(path);
                }
            }
        }
        files
    }

    /// Make every file of `tool`'s bytes look last seen `days` ago.
    fn age(&self, tool: &str, days: u64) {
        let then = SystemTime::now() - Duration::from_secs(days * 86_400);
        for file in self.files_of(tool) {
            std::fs::File::options().write(true).open(&file).unwrap().set_modified(then).unwrap();
        }
    }
}

#[test]
fn keel_cache_lists_entries_and_prune_removes_what_no_plugin_seen_lately_points_to() {
    let project = Project::new();
    project.run_batch();
    let listing = project.keel_ok(&["cache"]);
    for tool in ["echo", "grep"] {
        let line = listing.lines().find(|line| line.ends_with(&project.plugin(tool).display().to_string()));
        let line = line.unwrap_or_else(|| panic!("{tool} is not listed:\n{listing}"));
        assert!(line.contains(" MiB") && line.contains("seen "), "{line}");
    }
    let (echo, grep) = (project.files_of("echo"), project.files_of("grep"));
    assert!(grep.iter().any(|file| file.extension().is_some_and(|ext| ext == "cwasm")), "{grep:?}");
    assert!(grep.iter().any(|file| file.starts_with(project.cache().join("index"))), "{grep:?}");
    assert!(grep.iter().any(|file| file.starts_with(project.cache().join("answers"))), "{grep:?}");

    project.age("grep", 40);
    let pruned = project.keel_ok(&["cache", "prune", "--days", "30"]);
    assert!(pruned.starts_with(&format!("removed {} files, ", grep.len())), "{pruned}");
    assert!(project.files_of("grep").is_empty(), "grep's code, answers and index entries are gone");
    assert_eq!(project.files_of("echo"), echo, "echo, seen lately, keeps all of its entries");
    project.run_batch();
}

#[test]
fn prune_and_the_size_cap_run_while_other_keel_processes_use_the_cache() {
    let project = Project::new();
    project.run_batch();
    let echo_bytes: u64 = project.files_of("echo").iter().map(|file| file.metadata().unwrap().len()).sum();
    let grep_bytes: u64 = project.files_of("grep").iter().map(|file| file.metadata().unwrap().len()).sum();
    let cap_mib = echo_bytes / (1 << 20) + 1;
    assert!(
        grep_bytes > 1 << 20,
        "grep's entries ({grep_bytes} bytes) must not fit beside echo's under the cap"
    );
    std::fs::write(project.path().join("capped.toml"), format!("[cache]\nmax_size_mib = {cap_mib}\n"))
        .unwrap();

    // Starts that run calls, prunes that remove everything, and starts
    // that enforce the cap, all at once on one cache.
    std::thread::scope(|scope| {
        let runs = scope.spawn(|| (0..6).for_each(|_| project.run_batch()));
        let prunes = scope.spawn(|| {
            for _ in 0..6 {
                project.keel_ok(&["cache", "prune", "--days", "0"]);
            }
        });
        let capped = scope.spawn(|| {
            for _ in 0..6 {
                project.keel_ok(&["list", "--config", "capped.toml", "--plugins", "tools"]);
            }
        });
        for thread in [runs, prunes, capped] {
            thread.join().unwrap();
        }
    });

    // Least recently seen goes first: grep, unseen for a day, before echo.
    project.run_batch();
    project.age("grep", 1);
    project.keel_ok(&["list", "--config", "capped.toml", "--plugins", "tools/keel_tool_echo.wasm"]);
    assert!(project.files_of("grep").is_empty(), "grep's entries are removed to meet the cap");
    assert!(!project.files_of("echo").is_empty(), "echo's, seen last, stay");
    let listing = project.keel_ok(&["cache"]);
    let total = listing.lines().last().unwrap();
    assert!(total.starts_with("1 entries, "), "{listing}");
    project.run_batch();
}

#[test]
fn a_cache_that_is_not_a_directory_is_warned_of_once_and_the_run_goes_on_without_it() {
    let project = Project::new();
    std::fs::write(project.cache(), "not a directory").unwrap();
    let args = ["run", "--plugins", "tools", "--workspace", "workspace", "batch.json"];
    let output =
        support::run(&mut support::keel(project.path(), &project.cache(), &args), Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let message: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(message["content"][1]["content"], "notes.txt:1:a needle\n");
    // One line, where each plugin's every read and write of the cache
    // warned of its own failure.
    let warnings: Vec<&str> = stderr.lines().filter(|line| line.contains("WARN")).collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].contains("no compile cache, every plugin compiled afresh: it is not a directory"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(project.cache()).unwrap(), "not a directory");
    // Listing or pruning it is refused, naming it.
    for args in [&["cache"][..], &["cache", "prune"]] {
        let output =
            support::run(&mut support::keel(project.path(), &project.cache(), args), Duration::from_secs(60));
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        let expected = format!("error: the compile cache {} is not a directory\n", project.cache().display());
        assert_eq!(String::from_utf8_lossy(&output.stderr), expected, "{args:?}");
    }
}
