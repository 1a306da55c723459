//! Capability grants: a hostile guest tries every way out of what it was
//! granted, and the built-in `Read` is held to the same grants.

use std::path::Path;

use keel_host::config::Config;
use keel_host::tool::ResultSize;
use keel_host::{Host, ToolResult, ToolUse};
use serde_json::{Value, json};

use crate::{block_on, guest, shared_cache};

/// A workspace inside a root that also holds a secret outside it.
struct World {
    root: tempfile::TempDir,
}

const SECRET: &str = "the secret outside the workspace";

impl World {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let workspace = root.path().join("ws");
        std::fs::create_dir(&workspace).unwrap();
        std::fs::create_dir(root.path().join("outside")).unwrap();
        std::fs::write(root.path().join("outside/secret.txt"), SECRET).unwrap();
        std::fs::write(workspace.join("notes.txt"), "original").unwrap();
        std::os::unix::fs::symlink(root.path().join("outside/secret.txt"), workspace.join("link.txt"))
            .unwrap();
        std::os::unix::fs::symlink(root.path().join("outside"), workspace.join("link-dir")).unwrap();
        World { root }
    }

    fn workspace(&self) -> std::path::PathBuf {
        self.root.path().join("ws")
    }

    fn outside(&self) -> std::path::PathBuf {
        self.root.path().join("outside")
    }

    fn host(&self, config: &str) -> Host {
        let config = Config::parse(config, Path::new("keel.toml")).unwrap();
        let builder = Host::builder()
            .workspace(self.workspace())
            .plugins(guest("keel_guest_hostile"))
            .config(config)
            .cache_dir(Some(shared_cache()));
        block_on(builder.build()).unwrap()
    }

    fn notes(&self) -> String {
        std::fs::read_to_string(self.workspace().join("notes.txt")).unwrap()
    }
}

fn run(host: &Host, input: Value) -> ToolResult {
    let results = block_on(host.run_batch(&[ToolUse::new("a", "hostile", input)])).results;
    assert!(!results[0].content.text().contains(SECRET), "the secret leaked: {}", results[0].content);
    results.into_iter().next().unwrap()
}

fn error(message: &str) -> ToolResult {
    ToolResult::error("a", message)
}

#[test]
fn reads_outside_the_workspace_find_nothing() {
    let world = World::new();
    let host = world.host("");
    let secret = world.outside().join("secret.txt");
    let read = |path: &str| run(&host, json!({ "act": "read", "path": path })).content.text().into_owned();
    assert_eq!(read("/workspace/notes.txt"), "original", "the control read works");
    let absolute = secret.display().to_string();
    let attempts = [
        "/workspace/../outside/secret.txt",
        "../outside/secret.txt",
        absolute.as_str(),
        "/workspace/link.txt",
        "/workspace/link-dir/secret.txt",
    ];
    let outcomes: Vec<String> = attempts.iter().map(|path| read(path)).collect();
    assert_eq!(
        outcomes,
        [
            "failed to read /workspace/../outside/secret.txt: permission denied".to_string(),
            "failed to read ../outside/secret.txt: entity not found".to_string(),
            format!("failed to read {absolute}: entity not found"),
            "failed to read /workspace/link.txt: permission denied".to_string(),
            "failed to read /workspace/link-dir/secret.txt: permission denied".to_string(),
        ]
    );
    assert_eq!(
        run(&host, json!({ "act": "list", "path": "/workspace/link-dir" })),
        error("failed to list /workspace/link-dir: permission denied")
    );
}

#[test]
fn a_read_only_claim_is_enforced() {
    let world = World::new();
    let host = world.host("");
    let claim = |act: &str, path: &str, to: &str| {
        run(&host, json!({ "act": act, "path": path, "to": to, "read_only": true }))
    };
    assert_eq!(
        claim("write", "/workspace/new.txt", ""),
        error("failed to write /workspace/new.txt: permission denied")
    );
    assert_eq!(
        claim("write", "/workspace/notes.txt", ""),
        error("failed to write /workspace/notes.txt: permission denied")
    );
    assert_eq!(
        claim("truncate", "/workspace/notes.txt", ""),
        error("failed to truncate /workspace/notes.txt: permission denied")
    );
    assert_eq!(
        claim("rename", "/workspace/notes.txt", "/workspace/moved.txt"),
        error("failed to rename /workspace/notes.txt: permission denied")
    );
    assert_eq!(
        claim("link", "/workspace/notes.txt", "/workspace/hard.txt"),
        error("failed to link /workspace/notes.txt: permission denied")
    );
    assert_eq!(
        claim("remove", "/workspace/notes.txt", ""),
        error("failed to remove /workspace/notes.txt: permission denied")
    );
    assert_eq!(world.notes(), "original");
    let mut names: Vec<_> =
        std::fs::read_dir(world.workspace()).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["link-dir", "link.txt", "notes.txt"], "nothing was created, moved or linked");
}

#[test]
fn a_read_only_grant_narrows_every_call() {
    let world = World::new();
    let host = world.host("[plugins.hostile]\naccess = \"read-only\"\n");
    let act =
        |act: &str, to: &str| run(&host, json!({ "act": act, "path": "/workspace/notes.txt", "to": to }));
    assert_eq!(act("truncate", ""), error("failed to truncate /workspace/notes.txt: permission denied"));
    assert_eq!(
        act("rename", "/workspace/moved.txt"),
        error("failed to rename /workspace/notes.txt: permission denied")
    );
    assert_eq!(
        act("link", "/workspace/hard.txt"),
        error("failed to link /workspace/notes.txt: permission denied")
    );
    assert_eq!(act("write", ""), error("failed to write /workspace/notes.txt: permission denied"));
    assert_eq!(world.notes(), "original");
}

#[test]
fn questions_cannot_write_even_when_the_call_may() {
    let world = World::new();
    let host = world.host("");
    let write_in = |export: &str| {
        run(&host, json!({ "act": "write", "path": "/workspace/q.txt", "write_in": [export] }))
    };
    assert_eq!(
        write_in("check"),
        error("Permission to use hostile denied: failed to write /workspace/q.txt: permission denied")
    );
    assert!(!world.workspace().join("q.txt").exists());
    assert_eq!(
        run(&host, json!({ "act": "write", "path": "/workspace/q.txt" })),
        ToolResult::ok("a", "wrote /workspace/q.txt"),
        "the call itself writes"
    );
    assert_eq!(std::fs::read_to_string(world.workspace().join("q.txt")).unwrap(), "written by hostile");
}

#[test]
fn the_default_grant_writes_the_workspace() {
    // The control for the two tests above: the same acts, granted, succeed.
    let world = World::new();
    let host = world.host("");
    let act = |act: &str, path: &str, to: &str| run(&host, json!({ "act": act, "path": path, "to": to }));
    assert_eq!(
        act("link", "/workspace/notes.txt", "/workspace/hard.txt"),
        ToolResult::ok("a", "linked /workspace/hard.txt to /workspace/notes.txt")
    );
    assert_eq!(
        act("rename", "/workspace/hard.txt", "/workspace/moved.txt"),
        ToolResult::ok("a", "renamed /workspace/hard.txt to /workspace/moved.txt")
    );
    assert_eq!(
        act("truncate", "/workspace/notes.txt", ""),
        ToolResult::ok("a", "truncated /workspace/notes.txt")
    );
    assert_eq!(world.notes(), "");
    assert_eq!(std::fs::read_to_string(world.workspace().join("moved.txt")).unwrap(), "");
}

#[test]
fn the_environment_holds_only_granted_variables_and_there_are_no_args() {
    let world = World::new();
    let path = std::env::var("PATH").expect("the test runs with a PATH");
    let home = std::env::var("HOME").unwrap_or_else(|_| "/nonexistent-home".into());

    let ungranted = run(&world.host(""), json!({ "act": "env" }));
    assert_eq!(ungranted, ToolResult::ok("a", r#"{"vars":[],"args":[]}"#));
    assert!(!ungranted.content.text().contains(&path) && !ungranted.content.text().contains(&home));

    let granted = run(
        &world.host("[plugins.hostile]\nenv = [\"PATH\", \"KEEL_TEST_NEVER_SET\"]\n"),
        json!({ "act": "env" }),
    );
    let expected = json!({ "vars": [["PATH", path]], "args": [] }).to_string();
    assert_eq!(
        granted,
        ToolResult::ok("a", expected),
        "the granted variable with its host value, nothing else"
    );
}

#[test]
fn the_questions_asked_at_load_see_the_granted_environment() {
    let world = World::new();
    // `hostile`'s max-result-size counts the variables it sees.
    let max_result_size = |host: Host| host.pool().get("hostile").unwrap().tool.spec().max_result_size;
    assert_eq!(max_result_size(world.host("")), ResultSize::Chars(50_000));
    let granted = world.host("[plugins.hostile]\nenv = [\"PATH\", \"KEEL_TEST_NEVER_SET\"]\n");
    assert_eq!(max_result_size(granted), ResultSize::Chars(50_001));
}

#[test]
fn a_pattern_grants_extra_directories_each_with_its_access() {
    let world = World::new();
    let reference = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    std::fs::write(reference.path().join("ref.txt"), "reference text").unwrap();
    let config = format!(
        "[plugins.\"host*\"]\ndirs = [\n  {{ path = {:?}, mount = \"/reference\" }},\n  \
         {{ path = {:?}, mount = \"/scratch\", access = \"read-write\" }},\n]\n",
        reference.path(),
        scratch.path()
    );
    let host = world.host(&config);
    let act = |act: &str, path: &str, read_only: bool| {
        run(&host, json!({ "act": act, "path": path, "read_only": read_only }))
    };
    assert_eq!(act("read", "/reference/ref.txt", false), ToolResult::ok("a", "reference text"));
    assert_eq!(
        act("write", "/reference/new.txt", false),
        error("failed to write /reference/new.txt: permission denied")
    );
    assert_eq!(act("write", "/scratch/out.txt", false), ToolResult::ok("a", "wrote /scratch/out.txt"));
    assert_eq!(
        act("write", "/scratch/claimed.txt", true),
        error("failed to write /scratch/claimed.txt: permission denied"),
        "a read-only claim narrows a read-write directory too"
    );
    assert_eq!(std::fs::read_to_string(scratch.path().join("out.txt")).unwrap(), "written by hostile");
    assert!(!scratch.path().join("claimed.txt").exists());
    assert!(!reference.path().join("new.txt").exists());
}

#[test]
fn trust_is_granted_by_config_only() {
    let world = World::new();
    let untrusted = world.host("");
    assert!(!untrusted.pool().get("hostile").unwrap().tool.spec().trusted);
    assert!(untrusted.pool().get("Read").unwrap().tool.spec().trusted, "built-ins are trusted");
    let trusted = world.host("[plugins.hostile]\ntrusted = true\n");
    assert!(trusted.pool().get("hostile").unwrap().tool.spec().trusted);
}

#[test]
fn read_is_held_to_the_same_grants() {
    let world = World::new();
    let reference = tempfile::tempdir().unwrap();
    std::fs::write(reference.path().join("ref.txt"), "reference text\n").unwrap();
    let config =
        format!("[plugins.Read]\ndirs = [{{ path = {:?}, mount = \"/reference\" }}]\n", reference.path());
    let host = world.host(&config);
    let read = |path: &str| {
        let results =
            block_on(host.run_batch(&[ToolUse::new("r", "Read", json!({ "file_path": path }))])).results;
        assert!(!results[0].content.text().contains(SECRET), "the secret leaked: {}", results[0].content);
        results.into_iter().next().unwrap()
    };
    assert_eq!(read("/reference/ref.txt"), ToolResult::ok("r", "     1\treference text\n"));
    assert_eq!(read("notes.txt"), ToolResult::ok("r", "     1\toriginal\n"));
    for path in ["link.txt", "link-dir/secret.txt"] {
        let result = read(path);
        assert!(
            result.is_error && result.content.text().starts_with(&format!("cannot read {path}: ")),
            "{result:?}"
        );
    }
    assert_eq!(
        read("../outside/secret.txt"),
        ToolResult::error("r", "../outside/secret.txt is outside the granted directories")
    );
    // The hostile plugin has no section naming it: it does not see /reference.
    assert_eq!(
        run(&host, json!({ "act": "read", "path": "/reference/ref.txt" })),
        error("failed to read /reference/ref.txt: entity not found")
    );
}

#[test]
fn a_bad_grant_stops_the_host_naming_the_section() {
    let world = World::new();
    let config = Config::parse(
        "[plugins.hostile]\ndirs = [{ path = \"/tmp\", mount = \"/workspace\" }]\n",
        Path::new("keel.toml"),
    )
    .unwrap();
    let result =
        block_on(Host::builder().workspace(world.workspace()).config(config).cache_dir(None).build());
    assert_eq!(
        result.err().unwrap().to_string(),
        "invalid grant [plugins.\"hostile\"]: mount \"/workspace\" overlaps the workspace at /workspace"
    );
}

#[test]
fn a_section_that_grants_no_tool_of_the_run_is_warned_of_with_the_names_it_is_close_to() {
    let workspace = tempfile::tempdir().unwrap();
    let text = "[plugins.gerp]\naccess = \"read-only\"\n[plugins.\"acme_*\"]\nenv = [\"HOME\"]\n\
                [plugins.\"write_*\"]\naccess = \"read-only\"\n[plugins.Read]\naccess = \"read-only\"\n";
    let config = Config::parse(text, "keel.toml".as_ref()).unwrap();
    let host = block_on(crate::example_host(workspace.path()).config(config).build()).unwrap();
    assert_eq!(
        host.warnings(),
        [
            "`[plugins.acme_*]` grants no tool of this run",
            "`[plugins.gerp]` grants no tool of this run; did you mean grep?",
        ],
        "a section of a tool, a pattern of some, or the built-in Read's grants a tool"
    );
}

#[test]
fn a_relative_grant_that_a_link_leads_out_of_the_workspace_is_refused() {
    // What a tool with the workspace can leave for the next start: a granted
    // directory replaced by a link that climbs out.
    let world = World::new();
    std::fs::create_dir(world.workspace().join("build")).unwrap();
    std::os::unix::fs::symlink("../../outside", world.workspace().join("build/out")).unwrap();
    let config = Config::parse(
        "[plugins.hostile]\ndirs = [{ path = \"build/out\", mount = \"/out\", access = \"read-write\" }]\n",
        Path::new("keel.toml"),
    )
    .unwrap();
    let build = |config: Config| {
        block_on(Host::builder().workspace(world.workspace()).config(config).cache_dir(None).build())
    };
    let outside = world.outside().canonicalize().unwrap();
    assert_eq!(
        build(config).err().unwrap().to_string(),
        format!(
            "invalid grant [plugins.\"hostile\"]: dirs entry \"build/out\" leads outside the workspace, to {}; \
             a relative path grants a directory of the workspace: to grant one outside it on purpose, \
             write its absolute path",
            outside.display()
        )
    );
    let climbs = Config::parse(
        "[plugins.hostile]\ndirs = [{ path = \"..\", mount = \"/up\" }]\n",
        Path::new("keel.toml"),
    )
    .unwrap();
    let error = build(climbs).err().unwrap().to_string();
    assert!(
        error.starts_with("invalid grant [plugins.\"hostile\"]: dirs entry \"..\" leads outside"),
        "{error}"
    );

    // A link to another directory of the workspace still grants it, and an
    // absolute path outside is granted on purpose.
    std::fs::create_dir(world.workspace().join("real")).unwrap();
    std::os::unix::fs::symlink("../real", world.workspace().join("build/inside")).unwrap();
    let host = world.host(&format!(
        "[plugins.hostile]\ndirs = [{{ path = \"build/inside\", mount = \"/in\", access = \"read-write\" }}, \
         {{ path = {:?}, mount = \"/abs\" }}]\n",
        world.outside()
    ));
    assert_eq!(
        run(&host, json!({ "act": "write", "path": "/in/x.txt" })),
        ToolResult::ok("a", "wrote /in/x.txt")
    );
    assert!(world.workspace().join("real/x.txt").is_file());
    assert!(!world.outside().join("x.txt").exists());
}

#[test]
fn read_is_held_to_the_configured_deadline() {
    let workspace = tempfile::tempdir().unwrap();
    // Terabytes of no line at all: skipping to line 2 never ends by itself.
    let huge = std::fs::File::create(workspace.path().join("huge.log")).unwrap();
    huge.set_len(4 << 40).unwrap();
    let limits = keel_host::Limits { deadline: std::time::Duration::from_millis(300), ..Default::default() };
    let host =
        block_on(Host::builder().workspace(workspace.path()).cache_dir(None).limits(limits).build()).unwrap();
    let started = std::time::Instant::now();
    let results = block_on(host.run_batch(&[ToolUse::new(
        "r",
        "Read",
        json!({ "file_path": "huge.log", "offset": 2 }),
    )]))
    .results;
    assert_eq!(results, [ToolResult::error("r", "Read failed: deadline of 300ms exceeded")]);
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "{:?}", started.elapsed());
}

#[test]
fn a_network_root_that_is_no_file_is_refused_naming_the_key() {
    let workspace = tempfile::tempdir().unwrap();
    let config = Config::parse("[network]\nroots = [\"/dev/zero\"]\n", "keel.toml".as_ref()).unwrap();
    let Err(error) =
        block_on(Host::builder().workspace(workspace.path()).cache_dir(None).config(config).build())
    else {
        panic!("a host trusted /dev/zero as a root");
    };
    let error = error.to_string();
    assert!(error.contains("[network] roots") && error.contains("/dev/zero"), "{error}");
}
