//! Golden batch fixtures: a batch in, the exact `tool_result` message and
//! event trace out, compared byte for byte.
//!
//! A case is a directory holding:
//!
//! | file | what |
//! |---|---|
//! | `batch.json` | the batch, as for `keel run` |
//! | `workspace/` | copied to a fresh directory the case runs in (optional) |
//! | `keel.toml` | the host configuration for the case (optional) |
//! | `case.toml` | how to drive the case (optional): `interrupt_on_progress = "<tool_use id>"` interrupts the batch at that call's first progress report; `[[generate]]` tables (`path`, `line`, `lines`) write files of `lines` copies of `line` into the workspace, for cases that need megabytes without committing them; `serve = "site"` serves that directory of the case over HTTP on a loopback port for the run (see below) |
//! | `expected.json` | the user message of `tool_result` blocks |
//! | `events.jsonl` | the event trace, one JSON object a line |
//!
//! A case that serves a directory names its server `${SERVER}`
//! (`http://127.0.0.1:PORT`) in `batch.json` and `keel.toml`; what the run
//! produces says `${SERVER}` where the server's origin appeared, and
//! `${SERVER_ADDR}` for its bare address, so the expectations do not depend
//! on the port.
//!
//! The trace is normalized so it does not depend on timing: events are
//! grouped by call in batch order (a call's own events keep their order), and
//! each group's results follow its calls.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use keel_host::batch::{parse_batch_bytes, user_message};
use keel_host::config::{Config, read_toml};
use keel_host::{Error, Event, HostBuilder, Result};

/// The environment variable that makes a fixture run rewrite expectations.
pub const BLESS_VAR: &str = "KEEL_BLESS";

const BATCH: &str = "batch.json";
const EXPECTED_MESSAGE: &str = "expected.json";
const EXPECTED_EVENTS: &str = "events.jsonl";
/// What a case writes for its server's origin.
const SERVER: &str = "${SERVER}";
/// What a case's expectations say for its server's bare address.
const SERVER_ADDR: &str = "${SERVER_ADDR}";

/// One fixture case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Case {
    /// The case's name: its directory's name.
    pub name: String,
    /// Its directory.
    pub dir: PathBuf,
}

/// How to drive a case, from its `case.toml`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Driver {
    /// Interrupt the batch when this call first reports progress.
    interrupt_on_progress: Option<String>,
    /// Files to write into the workspace before the run.
    #[serde(default)]
    generate: Vec<Generated>,
    /// A directory of the case to serve over HTTP for the run.
    serve: Option<PathBuf>,
}

/// A file a case writes into its workspace: `lines` copies of `line`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Generated {
    path: PathBuf,
    line: String,
    lines: usize,
}

/// What a case produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Produced {
    /// The user message, pretty JSON with a final newline.
    pub message: String,
    /// The normalized event trace, one JSON object a line.
    pub events: String,
}

/// The cases under `dir`: `dir` itself when it holds a `batch.json`, else
/// each subdirectory that does, sorted by name.
pub fn discover(dir: &Path) -> Result<Vec<Case>> {
    let case = |dir: &Path| Case {
        name: dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned()),
        dir: dir.to_path_buf(),
    };
    if dir.join(BATCH).is_file() {
        return Ok(vec![case(dir)]);
    }
    let entries = std::fs::read_dir(dir).map_err(|error| Error::io("read", dir, error))?;
    let mut cases = Vec::new();
    for entry in entries {
        let path = entry.map_err(|error| Error::io("read", dir, error))?.path();
        if path.join(BATCH).is_file() {
            cases.push(case(&path));
        }
    }
    cases.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(cases)
}

impl Case {
    /// Run the case with a host from `builder` (plugins, cache), in a fresh
    /// copy of its workspace, under its own `keel.toml` when it has one.
    pub async fn run(&self, builder: HostBuilder) -> Result<Produced> {
        let driver = self.driver()?;
        let server = match &driver.serve {
            Some(site) => Some(site::serve(self.dir.join(site)).await?),
            None => None,
        };
        let origin = server.as_ref().map(site::Site::origin);
        let expand = |text: String| match &origin {
            Some(origin) => text.replace(SERVER, origin),
            None => text,
        };
        let batch_path = self.dir.join(BATCH);
        let text =
            std::fs::read_to_string(&batch_path).map_err(|error| Error::io("read", &batch_path, error))?;
        let bytes = expand(text).into_bytes();
        let config_path = self.dir.join(keel_host::config::FILE_NAME);
        let config = if config_path.is_file() {
            let text = std::fs::read_to_string(&config_path)
                .map_err(|error| Error::io("read", &config_path, error))?;
            Config::parse(&expand(text), &config_path)?
        } else {
            Config::default()
        };
        let max_input = config.limits.apply(keel_host::Limits::default()).input;
        let uses = parse_batch_bytes(&bytes, &batch_path.display().to_string(), max_input)?;
        if let Some(target) = &driver.interrupt_on_progress
            && !uses.iter().any(|tool_use| &tool_use.id == target)
        {
            let reason =
                format!("`interrupt_on_progress` names {target:?}, which is no tool_use id of {BATCH}");
            return Err(Error::Config { path: self.dir.join("case.toml"), reason });
        }
        let workspace =
            tempfile::tempdir().map_err(|error| Error::io("create", std::env::temp_dir(), error))?;
        let source = self.dir.join("workspace");
        if source.is_dir() {
            copy_tree(&source, workspace.path())?;
        }
        for file in &driver.generate {
            if let Some(link) = first_link(workspace.path(), &file.path) {
                let reason = format!(
                    "the `generate` path {} goes through the symbolic link {} of the case's workspace; \
                     generated files are written in its real directories only",
                    file.path.display(),
                    link.display()
                );
                return Err(Error::Config { path: self.dir.join("case.toml"), reason });
            }
            let path = workspace.path().join(&file.path);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|error| Error::io("create", parent, error))?;
            }
            let contents = format!("{}\n", file.line).repeat(file.lines);
            std::fs::write(&path, contents).map_err(|error| Error::io("write", &path, error))?;
        }
        let host = builder.workspace(workspace.path()).config(config).build().await?;

        let mut run = host.start_batch(uses, keel_host::context::initial());
        let interrupter = run.interrupter();
        let mut events = Vec::new();
        while let Some(event) = run.next_event().await {
            if let (Some(target), Event::Progress { tool_use_id, .. }) =
                (&driver.interrupt_on_progress, &event)
                && target == tool_use_id
            {
                interrupter.interrupt();
            }
            events.push(event);
        }
        let outcome = run.finish().await;
        let message = pretty(&user_message(&outcome.results));
        let events: String = normalize(&events).iter().map(|event| to_line(event) + "\n").collect();
        let (message, events) = match &server {
            Some(server) => (server.hide(&message), server.hide(&events)),
            None => (message, events),
        };
        Ok(Produced { message, events })
    }

    fn driver(&self) -> Result<Driver> {
        let path = self.dir.join("case.toml");
        if !path.is_file() {
            return Ok(Driver::default());
        }
        let text = std::fs::read_to_string(&path).map_err(|error| Error::io("read", &path, error))?;
        let driver: Driver =
            read_toml(&text).map_err(|reason| Error::Config { path: path.clone(), reason })?;
        if let Some(file) = driver.generate.iter().find(|file| !stays_below(&file.path)) {
            let reason = format!(
                "a `generate` path is relative and stays inside the workspace, which {} does not",
                file.path.display()
            );
            return Err(Error::Config { path, reason });
        }
        for file in &driver.generate {
            let size = (file.line.len() as u64 + 1).saturating_mul(file.lines as u64);
            if size > MAX_GENERATED {
                let reason = format!(
                    "`generate` {}: {} lines of {} bytes make {size} bytes, over the {} MiB a generated \
                     file may hold",
                    file.path.display(),
                    file.lines,
                    file.line.len() + 1,
                    MAX_GENERATED >> 20
                );
                return Err(Error::Config { path, reason });
            }
        }
        Ok(driver)
    }

    /// Compare with the expectations on disk: `Ok` when both match, else a
    /// unified diff of each file that differs (a missing or unreadable file counts
    /// as empty, and its header says which).
    pub fn compare(&self, produced: &Produced) -> std::result::Result<(), String> {
        let mut report = String::new();
        for (file, actual) in [(EXPECTED_MESSAGE, &produced.message), (EXPECTED_EVENTS, &produced.events)] {
            let path = self.dir.join(file);
            let (expected, shown) = match std::fs::read_to_string(&path) {
                Ok(expected) => (expected, path.display().to_string()),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                    (String::new(), format!("{} (missing)", path.display()))
                }
                Err(error) => (String::new(), format!("{} (unreadable: {error})", path.display())),
            };
            if &expected != actual {
                let diff = similar::TextDiff::from_lines(expected.as_str(), actual.as_str());
                report.push_str(&diff.unified_diff().context_radius(3).header(&shown, "actual").to_string());
            }
        }
        if report.is_empty() { Ok(()) } else { Err(report) }
    }

    /// Write `produced` as the case's expectations, atomically.
    pub fn bless(&self, produced: &Produced) -> Result<()> {
        for (file, contents) in [(EXPECTED_MESSAGE, &produced.message), (EXPECTED_EVENTS, &produced.events)] {
            let path = self.dir.join(file);
            keel_host::fs::write_atomically(&path, contents.as_bytes())
                .map_err(|error| Error::io("write", &path, error))?;
        }
        Ok(())
    }
}

/// Whether `KEEL_BLESS` asks to rewrite expectations (any value but empty
/// or `0`).
pub fn bless_requested() -> bool {
    std::env::var(BLESS_VAR).is_ok_and(|value| !value.is_empty() && value != "0")
}

/// Order a run's events so they do not depend on timing: the plan; then for
/// each group, each call's events in batch order followed by the group's
/// results in batch order; then everything after the last result. Each
/// call's figures, which are timings, are left out.
pub fn normalize(events: &[Event]) -> Vec<Event> {
    let events: Vec<Event> = events.iter().cloned().map(without_figures).collect();
    let events = events.as_slice();
    let groups: Vec<Vec<String>> = events
        .iter()
        .find_map(|event| match event {
            Event::BatchPlan { batches } => {
                Some(batches.iter().map(|group| group.tool_use_ids.clone()).collect())
            }
            _ => None,
        })
        .unwrap_or_default();
    let mut ordered: Vec<Event> =
        events.iter().filter(|event| matches!(event, Event::BatchPlan { .. })).cloned().collect();
    for group in &groups {
        for id in group {
            ordered.extend(call_events(events, id, Stage::Running));
        }
        for id in group {
            ordered.extend(call_events(events, id, Stage::Result));
        }
    }
    for id in groups.iter().flatten() {
        ordered.extend(call_events(events, id, Stage::Replaced));
    }
    ordered.extend(
        events
            .iter()
            .filter(|event| event.tool_use_id().is_none() && !matches!(event, Event::BatchPlan { .. }))
            .cloned(),
    );
    ordered
}

/// `event` with no figures.
fn without_figures(event: Event) -> Event {
    match event {
        Event::CallFinished { tool_use_id, is_error, .. } => {
            Event::CallFinished { tool_use_id, is_error, figures: None }
        }
        other => other,
    }
}

/// Where an event about one call belongs in a normalized trace.
#[derive(PartialEq)]
enum Stage {
    /// Started, progress, finished: with the call, inside its group.
    Running,
    /// Its result: after every call of the group.
    Result,
    /// A per-message replacement: after every result of the batch.
    Replaced,
}

fn stage(event: &Event) -> Stage {
    match event {
        Event::ToolResult { .. } => Stage::Result,
        Event::ToolResultReplaced { .. } => Stage::Replaced,
        _ => Stage::Running,
    }
}

/// The events of call `id` at `wanted` stage, in their own order.
fn call_events<'a>(events: &'a [Event], id: &'a str, wanted: Stage) -> impl Iterator<Item = Event> + 'a {
    events.iter().filter(move |event| event.tool_use_id() == Some(id) && stage(event) == wanted).cloned()
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).expect("JSON values serialize") + "\n"
}

fn to_line(event: &Event) -> String {
    serde_json::to_string(event).expect("events serialize")
}

/// The most bytes a `generate` entry may write: far more than a case needs,
/// and a bound on what a case from elsewhere can make a test run allocate.
const MAX_GENERATED: u64 = 256 << 20;

/// The first part of `path` (relative, [`stays_below`]) that is a symbolic
/// link under `root`, as a path relative to `root`: writing there would
/// follow it, wherever it leads. The file itself counts too.
fn first_link(root: &Path, path: &Path) -> Option<PathBuf> {
    let mut walked = PathBuf::new();
    for part in path.components() {
        walked.push(part);
        let metadata = std::fs::symlink_metadata(root.join(&walked)).ok()?;
        if metadata.file_type().is_symlink() {
            return Some(walked);
        }
    }
    None
}

/// Whether `path` is relative and never climbs out of where it is joined.
fn stays_below(path: &Path) -> bool {
    path.components()
        .all(|part| matches!(part, std::path::Component::Normal(_) | std::path::Component::CurDir))
}

/// Copy the tree `from` into `to`, a symbolic link as a link (to the same
/// target), so that the run meets the links a case holds as `keel run` would.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    let entries = std::fs::read_dir(from).map_err(|error| Error::io("read", from, error))?;
    for entry in entries {
        let entry = entry.map_err(|error| Error::io("read", from, error))?;
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().map_err(|error| Error::io("read", &source, error))?;
        if kind.is_symlink() {
            let link = std::fs::read_link(&source).map_err(|error| Error::io("read", &source, error))?;
            copy_link(&link, &target)?;
        } else if kind.is_dir() {
            std::fs::create_dir_all(&target).map_err(|error| Error::io("create", &target, error))?;
            copy_tree(&source, &target)?;
        } else {
            std::fs::copy(&source, &target).map_err(|error| Error::io("copy", &source, error))?;
        }
    }
    Ok(())
}

#[cfg(unix)]
fn copy_link(link: &Path, target: &Path) -> Result<()> {
    std::os::unix::fs::symlink(link, target).map_err(|error| Error::io("create", target, error))
}

#[cfg(not(unix))]
fn copy_link(_: &Path, target: &Path) -> Result<()> {
    Err(Error::Failed(format!("{}: a case's workspace holds symbolic links only on Unix", target.display())))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use keel_host::events::PlannedGroup;

    fn started(id: &str) -> Event {
        Event::CallStarted { tool_use_id: id.into(), tool: "sleep".into(), activity: None }
    }
    fn progress(id: &str, step: u32) -> Event {
        Event::Progress { tool_use_id: id.into(), data: json!({ "step": step }) }
    }
    fn finished(id: &str) -> Event {
        Event::CallFinished { tool_use_id: id.into(), is_error: false, figures: None }
    }
    fn result(id: &str) -> Event {
        Event::ToolResult {
            tool_use_id: id.into(),
            content: id.into(),
            structured_content: None,
            is_error: false,
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_workspace_is_copied_with_its_links_as_links() {
        let case = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "secret").unwrap();
        std::fs::create_dir(case.path().join("sub")).unwrap();
        std::fs::write(case.path().join("sub/a.txt"), "a").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), case.path().join("leak")).unwrap();
        let copy = tempfile::tempdir().unwrap();
        copy_tree(case.path(), copy.path()).unwrap();
        assert_eq!(std::fs::read_to_string(copy.path().join("sub/a.txt")).unwrap(), "a");
        let leak = copy.path().join("leak");
        assert!(std::fs::symlink_metadata(&leak).unwrap().file_type().is_symlink(), "a link stays a link");
        assert_eq!(std::fs::read_link(&leak).unwrap(), outside.path().join("secret"));
    }

    fn case_of(files: &[(&str, &str)]) -> (tempfile::TempDir, Case) {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let case = Case { name: "c".into(), dir: dir.path().to_path_buf() };
        (dir, case)
    }

    #[tokio::test]
    async fn a_case_that_interrupts_on_a_call_the_batch_lacks_is_refused_naming_it() {
        let batch = r#"[{"type": "tool_use", "id": "a", "name": "Read", "input": {"file_path": "x"}}]"#;
        let (_dir, case) = case_of(&[(BATCH, batch), ("case.toml", "interrupt_on_progress = \"nope\"\n")]);
        let error = case.run(keel_host::Host::builder().cache_dir(None)).await.err().unwrap().to_string();
        assert!(
            error.contains("`interrupt_on_progress` names \"nope\", which is no tool_use id of"),
            "{error}"
        );
        assert!(error.contains("case.toml"), "{error}");
    }

    #[tokio::test]
    async fn a_case_that_generates_a_file_outside_its_workspace_is_refused() {
        for path in ["../x.txt", "/tmp/x.txt"] {
            let toml = format!("[[generate]]\npath = {path:?}\nline = \"x\"\nlines = 1\n");
            let (_dir, case) = case_of(&[(BATCH, "[]"), ("case.toml", &toml)]);
            let error = case.run(keel_host::Host::builder().cache_dir(None)).await.err().unwrap().to_string();
            assert!(error.contains(&format!("which {path} does not")), "{error}");
        }
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_case_that_generates_a_file_through_a_link_of_its_workspace_is_refused() {
        let outside = tempfile::tempdir().unwrap();
        let toml = "[[generate]]\npath = \"out/x.txt\"\nline = \"x\"\nlines = 1\n";
        let (_dir, case) = case_of(&[(BATCH, "[]"), ("case.toml", toml), ("workspace/kept.txt", "")]);
        std::os::unix::fs::symlink(outside.path(), case.dir.join("workspace/out")).unwrap();
        let error = case.run(keel_host::Host::builder().cache_dir(None)).await.err().unwrap().to_string();
        assert!(error.contains("goes through the symbolic link out of the case's workspace"), "{error}");
        assert!(!outside.path().join("x.txt").exists());
    }

    #[tokio::test]
    async fn a_case_that_generates_more_than_a_file_may_hold_is_refused_before_it_runs() {
        let toml = "[[generate]]\npath = \"big.txt\"\nline = \"x\"\nlines = 4000000000000000000\n";
        let (_dir, case) = case_of(&[(BATCH, "[]"), ("case.toml", toml)]);
        let error = case.run(keel_host::Host::builder().cache_dir(None)).await.err().unwrap().to_string();
        assert!(error.contains("over the 256 MiB a generated file may hold"), "{error}");
    }

    #[test]
    fn normalizing_removes_the_finishing_order_but_keeps_each_calls_own_order() {
        let plan = Event::BatchPlan {
            batches: vec![
                PlannedGroup { concurrent: true, tool_use_ids: vec!["a".into(), "b".into()] },
                PlannedGroup { concurrent: false, tool_use_ids: vec!["c".into()] },
            ],
        };
        let done = Event::BatchFinished { calls: 3, errors: 0, interrupted: false };
        let b_first = [
            plan.clone(),
            started("a"),
            started("b"),
            progress("b", 1),
            progress("a", 1),
            progress("b", 2),
            finished("b"),
            finished("a"),
            result("a"),
            result("b"),
            started("c"),
            finished("c"),
            result("c"),
            done.clone(),
        ];
        let expected = vec![
            plan,
            started("a"),
            progress("a", 1),
            finished("a"),
            started("b"),
            progress("b", 1),
            progress("b", 2),
            finished("b"),
            result("a"),
            result("b"),
            started("c"),
            finished("c"),
            result("c"),
            done,
        ];
        assert_eq!(normalize(&b_first), expected);
        let mut a_first = b_first.to_vec();
        a_first.swap(6, 7);
        a_first.swap(1, 2);
        assert_eq!(normalize(&a_first), expected);
    }
}

/// The loopback HTTP server a case may run for its tools to fetch from.
mod site {
    use std::path::{Component, Path, PathBuf};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::{SERVER, SERVER_ADDR};
    use keel_host::{Error, Result};

    /// Bytes of a request head the server reads; a fixture's requests are
    /// small.
    const MAX_HEAD: usize = 16 << 10;

    /// A running server; dropping it stops it.
    pub struct Site {
        addr: std::net::SocketAddr,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for Site {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    impl Site {
        /// `http://127.0.0.1:PORT`.
        pub fn origin(&self) -> String {
            format!("http://{}", self.addr)
        }

        /// `text` with the server's origin and address replaced by the
        /// placeholders the expectations use.
        pub fn hide(&self, text: &str) -> String {
            text.replace(&self.origin(), SERVER).replace(&self.addr.to_string(), SERVER_ADDR)
        }
    }

    /// Serve the files of `root` on a loopback port: `GET /a/b.html` is
    /// `root/a/b.html`, with its content type by extension; anything else is
    /// `404` or `405`. One request per connection.
    pub async fn serve(root: PathBuf) -> Result<Site> {
        if !root.is_dir() {
            return Err(Error::io("serve", &root, std::io::Error::from(std::io::ErrorKind::NotFound)));
        }
        let listener =
            TcpListener::bind(("127.0.0.1", 0)).await.map_err(|error| Error::io("serve", &root, error))?;
        let addr = listener.local_addr().map_err(|error| Error::io("serve", &root, error))?;
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let root = root.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let response = respond(&root, &String::from_utf8_lossy(&head));
                    let _ = stream.write_all(&response).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Ok(Site { addr, task })
    }

    fn respond(root: &Path, head: &str) -> Vec<u8> {
        let mut words = head.lines().next().unwrap_or_default().split(' ');
        let (method, target) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
        if method != "GET" {
            return reply("405 Method Not Allowed", "text/plain", b"only GET is served\n");
        }
        let path = target.split(['?', '#']).next().unwrap_or_default().trim_start_matches('/');
        let relative = Path::new(path);
        if !relative.components().all(|part| matches!(part, Component::Normal(_))) {
            return reply("404 Not Found", "text/plain", b"not found\n");
        }
        match std::fs::read(root.join(relative)) {
            Ok(body) => reply("200 OK", content_type(relative), &body),
            Err(_) => reply("404 Not Found", "text/plain", b"not found\n"),
        }
    }

    fn content_type(path: &Path) -> &'static str {
        match path.extension().and_then(|ext| ext.to_str()) {
            Some("html" | "htm") => "text/html; charset=utf-8",
            Some("json") => "application/json",
            Some("png") => "image/png",
            Some("txt" | "md") => "text/plain; charset=utf-8",
            _ => "application/octet-stream",
        }
    }

    fn reply(status: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(body);
        out
    }
}
