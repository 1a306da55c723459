//! `--trace FILE`: a run in the Chrome trace-event format, the
//! `{"traceEvents": [...]}` object that Perfetto and `chrome://tracing` open.
//!
//! Tracks (threads of one process): `plan`, the batch's groups; `slot N`,
//! the calls that ran one after another in the Nth place of concurrency,
//! each an enclosing span named after its tool with a span per step inside
//! and its progress as instants; `planning N`, the steps a call took when
//! the batch was planned, before its turn. Times are µs from the earliest
//! moment of the run.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};

use anyhow::{Context as _, Result, bail};
use keel_host::Event;
use serde_json::{Value, json};

use super::record::{Group, Layout, Placed, Recording};

/// The process every track belongs to.
const PID: u64 = 1;
/// The track of the plan's groups; slots come after it.
const PLAN_TID: usize = 0;

/// The JSON text of the trace of `recording`, named `process` (`keel run`,
/// `keel serve`). Each event is written as it is made, and the trace is
/// never held as a tree of values: 20,000 calls make 160,000 events.
pub fn trace(recording: &Recording, process: &str) -> Vec<u8> {
    let layout = Layout::of(recording);
    let slot_tid = |slot: usize| slot + 1;
    let planning_tid = |lane: usize| layout.slots + lane + 1;
    let mut events = Events::default();
    events.push(&json!({
        "name": "process_name", "ph": "M", "pid": PID, "tid": PLAN_TID, "args": { "name": process }
    }));
    let mut track = |tid: usize, name: String| {
        events.push(
            &json!({ "name": "thread_name", "ph": "M", "pid": PID, "tid": tid, "args": { "name": name } }),
        );
        events.push(&json!({ "name": "thread_sort_index", "ph": "M", "pid": PID, "tid": tid, "args": { "sort_index": tid } }));
    };
    if !layout.groups.is_empty() {
        track(PLAN_TID, "plan".into());
    }
    for slot in 0..layout.slots {
        track(slot_tid(slot), format!("slot {}", slot + 1));
    }
    for lane in 0..layout.planning_lanes {
        track(planning_tid(lane), format!("planning {}", lane + 1));
    }
    for Group { group, label, span } in &layout.groups {
        let Some((start, end)) = span else { continue };
        events.push(&json!({
            "name": label, "cat": "plan", "ph": "X", "pid": PID, "tid": PLAN_TID,
            "ts": layout.relative(*start), "dur": end - start,
            "args": { "concurrent": group.concurrent, "tool_use_ids": group.tool_use_ids },
        }));
    }
    for placed in &layout.calls {
        let call = placed.call;
        let ids = json!({ "tool": call.tool, "tool_use_id": call.tool_use_id });
        if let Some(((start, end), slot)) = placed.turn {
            events.push(&json!({
                "name": call.tool, "cat": "tool", "ph": "X", "pid": PID, "tid": slot_tid(slot),
                "ts": layout.relative(start), "dur": end - start, "args": figures_args(placed),
            }));
            for step in &placed.steps {
                events.push(&step_event(&layout, step, slot_tid(slot), &ids));
            }
        }
        if let Some(lane) = placed.planning_lane {
            for step in &placed.planning {
                events.push(&step_event(&layout, step, planning_tid(lane), &ids));
            }
        }
        let tid = match (placed.turn, placed.planning_lane) {
            (Some((_, slot)), _) => slot_tid(slot),
            (None, Some(lane)) => planning_tid(lane),
            (None, None) => continue,
        };
        for report in &call.reports {
            let mut args =
                json!({ "tool": call.tool, "tool_use_id": call.tool_use_id, "text": report.text() });
            if let Some(data) = report.data() {
                args["data"] = data.clone();
            }
            events.push(&json!({
                "name": report.kind, "cat": report.kind, "ph": "i", "s": "t", "pid": PID, "tid": tid,
                "ts": layout.relative(report.at_us), "args": args,
            }));
        }
    }
    events.finish()
}

/// A trace's JSON text as its events are added: `{"traceEvents":[…],"displayTimeUnit":"ms"}`.
#[derive(Default)]
struct Events {
    text: Vec<u8>,
}

impl Events {
    fn push(&mut self, event: &Value) {
        self.text.push(if self.text.is_empty() { b'[' } else { b',' });
        serde_json::to_writer(&mut self.text, event).expect("JSON values serialize");
    }

    fn finish(self) -> Vec<u8> {
        let events = if self.text.is_empty() { b"[".to_vec() } else { self.text };
        [&b"{\"traceEvents\":"[..], &events, b"],\"displayTimeUnit\":\"ms\"}"].concat()
    }
}

/// A complete event for one step of a call.
fn step_event(layout: &Layout<'_>, step: &keel_host::events::StepTime, tid: usize, ids: &Value) -> Value {
    let name = step.step.as_str();
    json!({
        "name": name, "cat": name, "ph": "X", "pid": PID, "tid": tid,
        "ts": layout.relative(step.start_us), "dur": step.duration_us, "args": ids,
    })
}

/// A call's figures, as the `args` of its span.
fn figures_args(placed: &Placed<'_>) -> Value {
    let call = placed.call;
    let mut args = json!({ "tool": call.tool, "tool_use_id": call.tool_use_id, "outcome": call.outcome() });
    if let Some(activity) = &call.activity {
        args["activity"] = activity.clone().into();
    }
    if call.reports_left_out > 0 {
        args["reports_left_out"] = call.reports_left_out.into();
    }
    if let Some(figures) = &call.figures {
        args["fuel"] = json!(figures.fuel);
        args["memory_peak"] = json!(figures.memory_peak);
        args["bytes_in"] = figures.bytes_in.into();
        args["bytes_out"] = figures.bytes_out.into();
    }
    args
}

/// Check that `path` is not a directory, and that a file can be made beside
/// the file it leads to, or, for a pipe or a device, that it may be opened
/// for writing (so that a run does not go to waste on a trace it cannot
/// write), naming `path` and the system's reason when it cannot.
fn check_writable(path: &Path, what: &str) -> Result<()> {
    let failed = || format!("failed to write {what} {}", path.display());
    match std::fs::metadata(path) {
        Ok(metadata) if metadata.is_dir() => {
            // The system's own words, as for the other reasons below.
            let error = std::io::Error::from_raw_os_error(libc::EISDIR);
            return Err(error).with_context(failed);
        }
        // A socket is no file to open: the system says so as it would at
        // the end of the run.
        #[cfg(unix)]
        Ok(metadata) if std::os::unix::fs::FileTypeExt::is_socket(&metadata.file_type()) => {
            return Err(std::io::Error::from_raw_os_error(libc::ENXIO)).with_context(failed);
        }
        // Not opened here: a pipe's reader would see it closed.
        Ok(metadata) if !metadata.is_file() => return may_write(path).with_context(failed),
        _ => {}
    }
    let target = match path.canonicalize() {
        Ok(target) => target,
        Err(_) => keel_host::fs::link_target(path).with_context(failed)?,
    };
    let dir = match target.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let probe = dir.join(format!(".keel-{}-{}.probe", std::process::id(), nanos.subsec_nanos()));
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        // Not ours, but the directory holds files.
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(error).with_context(failed),
    }
}

/// Whether this process may open `path` for writing, asked without opening
/// it (`access(2)`).
fn may_write(path: &Path) -> std::io::Result<()> {
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: `path` is a NUL-terminated string that outlives the call,
    // which only reads it.
    if unsafe { libc::access(path.as_ptr(), libc::W_OK) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Refuse, before anything runs, a report file (each given by its flag,
/// what it is called in errors, and its path if asked for) that names one
/// of `inputs` (each with what it is; listed only when a report is asked
/// for) or the file of a report before it, since it would replace what the
/// command reads or what the other report wrote; then one that cannot be
/// written ([`check_writable`]). Gives each report's [`Target`], in the
/// order given (`None` where none was asked for).
pub fn check_reports(
    reports: &[(&str, &'static str, &Option<PathBuf>)],
    inputs: impl FnOnce() -> Result<Vec<(PathBuf, &'static str)>>,
) -> Result<Vec<Option<Target>>> {
    let asked: Vec<(&str, &str, &Path)> =
        reports.iter().filter_map(|(flag, what, path)| Some((*flag, *what, path.as_deref()?))).collect();
    if asked.is_empty() {
        return Ok(reports.iter().map(|_| None).collect());
    }
    let inputs = inputs()?;
    for (index, &(flag, _, path)) in asked.iter().enumerate() {
        if let Some((_, what)) = inputs.iter().find(|(input, _)| same_file(path, input)) {
            bail!("{flag} {} is {what}; give the report a file of its own", path.display());
        }
        if let Some((other, _, _)) = asked[..index].iter().find(|(_, _, earlier)| same_file(path, earlier)) {
            bail!("{other} and {flag} name the same file, {}; give each a file of its own", path.display());
        }
    }
    asked.iter().try_for_each(|(_, what, path)| check_writable(path, what))?;
    reports
        .iter()
        .map(|(_, what, path)| path.as_deref().map(|path| Target::resolve(path, what)).transpose())
        .collect()
}

/// Whether `a` and `b` name one file: the same file when both exist (links
/// followed), else the same name in the same directory when neither does.
fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        (Err(_), Err(_)) => {
            let resolved = |path: &Path| {
                let dir = path.parent().filter(|dir| !dir.as_os_str().is_empty()).unwrap_or(Path::new("."));
                Some(dir.canonicalize().ok()?.join(path.file_name()?))
            };
            resolved(a).is_some_and(|a| Some(a) == resolved(b))
        }
        _ => false,
    }
}

/// Where a report is written, found once, before the run: the end of the
/// links of the path given, so that a link a tool makes there while the
/// run goes on cannot send the report elsewhere (out of the workspace),
/// and what was there then, so that a file a tool wrote meanwhile is not
/// replaced unsaid.
pub struct Target {
    /// The path given.
    path: PathBuf,
    /// What the report is called in messages (`trace`, `timeline`).
    what: &'static str,
    /// Where it led when the run began.
    resolved: PathBuf,
    /// The regular file there when the run began, or after keel last wrote
    /// it.
    seen: Mutex<Option<Seen>>,
}

/// A regular file as it was: a tool that wrote it since changed one of
/// these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    device: u64,
    inode: u64,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl Seen {
    fn of(path: &Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt as _;
        let metadata = std::fs::symlink_metadata(path).ok().filter(std::fs::Metadata::is_file)?;
        Some(Seen {
            device: metadata.dev(),
            inode: metadata.ino(),
            len: metadata.len(),
            modified: metadata.modified().ok(),
        })
    }
}

/// The end of `path`'s links: the file it names, or, when none exists yet,
/// the name in the directory a new file would be made in.
fn resolve(path: &Path) -> std::io::Result<PathBuf> {
    if let Ok(resolved) = path.canonicalize() {
        return Ok(resolved);
    }
    let target = keel_host::fs::link_target(path)?;
    let dir = match target.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    match (dir.canonicalize(), target.file_name()) {
        (Ok(dir), Some(name)) => Ok(dir.join(name)),
        _ => Ok(target),
    }
}

impl Target {
    /// The report `what` at `path`, as it is now.
    pub fn resolve(path: &Path, what: &'static str) -> Result<Self> {
        let resolved = resolve(path).with_context(|| format!("failed to write {what} {}", path.display()))?;
        let seen = Mutex::new(Seen::of(&resolved));
        Ok(Target { path: path.to_path_buf(), what, resolved, seen })
    }

    /// The path given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Write `contents` where the path led when the run began: a regular
    /// file, or no file yet, atomically, so that a reader sees the old file
    /// or the whole new one, never half of it (the temporary file is
    /// removed should a signal end keel meanwhile); a pipe or a device
    /// written through. Refused when the path now leads elsewhere; a file
    /// changed since keel saw it is said to be replaced.
    pub fn write(&self, contents: &[u8]) -> Result<()> {
        let failed = || format!("failed to write {} {}", self.what, self.path.display());
        let now = resolve(&self.path).with_context(failed)?;
        if now != self.resolved {
            bail!(
                "{}: it now leads to {}, not to {} as when keel started; a link made since is not followed",
                failed(),
                now.display(),
                self.resolved.display()
            );
        }
        let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let found = Seen::of(&self.resolved);
        if found.is_some() && found != *seen {
            let _ = writeln!(
                std::io::stderr().lock(),
                "keel: {} {} changed since keel started (a tool wrote it?); the {} replaces it",
                self.what,
                crate::commands::printable(&self.path.display().to_string()),
                self.what
            );
        }
        let metadata = std::fs::metadata(&self.resolved);
        if metadata.as_ref().is_ok_and(|metadata| !metadata.is_file()) {
            // A pipe, a device, a directory (whose open fails as the
            // system says): written through, never replaced.
            let mut file =
                std::fs::OpenOptions::new().write(true).open(&self.resolved).with_context(failed)?;
            std::io::Write::write_all(&mut file, contents).with_context(failed)?;
            return Ok(());
        }
        replace(&self.resolved, contents, metadata.ok()).with_context(failed)?;
        *seen = Seen::of(&self.resolved);
        Ok(())
    }
}

/// Write `contents` to a hidden temporary file beside `target` and rename
/// it over `target` (which is not followed, should it be a link). A new
/// report gets the mode of any new file, a replaced one (`replaced`)
/// keeps its own.
fn replace(target: &Path, contents: &[u8], replaced: Option<std::fs::Metadata>) -> std::io::Result<()> {
    let dir = target.parent().unwrap_or(Path::new("."));
    let name = target.file_name().map_or_else(Default::default, |name| name.to_string_lossy());
    let prefix = format!(".{name}.");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".tmp");
    {
        use std::os::unix::fs::PermissionsExt as _;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let mut temp = builder.tempfile_in(dir)?;
    let _staging = crate::interrupt::Staging::of(temp.path());
    if let Some(replaced) = replaced {
        temp.as_file().set_permissions(replaced.permissions())?;
    }
    std::io::Write::write_all(&mut temp, contents)?;
    temp.as_file().sync_all()?;
    temp.persist(target).map_err(|error| error.error)?;
    Ok(())
}

/// How many calls `keel serve --trace` keeps in its file: the latest, so
/// that the file of a long-lived server stays a size a viewer opens.
pub const SERVE_TRACE_CALLS: usize = 10_000;

/// The least time between two writes of `keel serve --trace`: a file of
/// 10,000 calls is megabytes, and a busy server finishes thousands of calls
/// a second.
const SERVE_TRACE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// `keel serve --trace FILE`: the calls served so far (the last
/// [`SERVE_TRACE_CALLS`]), written again after each call finishes, at most
/// once per [`SERVE_TRACE_INTERVAL`] and nine times as long as the last
/// write took ([`pause_after`]). The writing happens on a thread of its
/// own, off every call's path; calls that finish while it writes or waits
/// are in its next write, and those after the last in the write of
/// [`TraceFile::finish`].
pub struct TraceFile {
    shared: Arc<Shared>,
    finished: mpsc::Sender<()>,
}

/// What the writer thread and the calls share.
struct Shared {
    target: Target,
    recording: Mutex<Recording>,
    /// Held across a write, so that writes never overtake one another: each
    /// takes its copy of the recording once it holds it. True once the last
    /// write began: the writer thread writes no more.
    writing: Mutex<bool>,
}

impl Shared {
    /// Write the file, unless the last write began; `last` makes this one
    /// the last.
    fn write(&self, last: bool) {
        let mut ended = self.writing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if *ended {
            return;
        }
        *ended = last;
        let recording = self.recording.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        if let Err(error) = self.target.write(&trace(&recording, "keel serve")) {
            tracing::warn!("{error:#}");
        }
    }
}

impl TraceFile {
    /// Start the trace at `target`, writing an empty one at once: a path
    /// that cannot be written fails here, naming it.
    pub fn create(target: Target) -> Result<Self> {
        target.write(&trace(&Recording::default(), "keel serve"))?;
        let shared = Arc::new(Shared {
            target,
            recording: Mutex::new(Recording::bounded(SERVE_TRACE_CALLS, SERVE_REPORTS_PER_CALL)),
            writing: Mutex::new(false),
        });
        let (finished, calls) = mpsc::channel::<()>();
        let writer = shared.clone();
        std::thread::Builder::new()
            .name("keel-trace".into())
            .spawn(move || {
                while calls.recv().is_ok() {
                    let began = std::time::Instant::now();
                    while calls.try_recv().is_ok() {}
                    writer.write(false);
                    std::thread::sleep(pause_after(began.elapsed()));
                }
            })
            .context("failed to start the trace writer")?;
        Ok(TraceFile { shared, finished })
    }

    /// Keep `event`; once a call finished, write the file again.
    pub fn record(&self, event: &Event) {
        self.shared.recording.lock().unwrap_or_else(std::sync::PoisonError::into_inner).record(event);
        if matches!(event, Event::CallFinished { .. }) {
            let _ = self.finished.send(());
        }
    }

    /// The server stopped: write every call kept, whatever the writer
    /// thread wrote last, once a write under way ends; the writer writes
    /// no more. Said on stderr when it takes long; a signal then ends it
    /// ([`crate::interrupt::exit_on_signal`]), leaving the file as it was.
    pub fn finish(&self) {
        let calls =
            self.shared.recording.lock().unwrap_or_else(std::sync::PoisonError::into_inner).calls.len();
        let what = format!(
            "writing the trace of the last {} to {}",
            crate::commands::counted(calls, "call"),
            crate::commands::printable(&self.shared.target.path().display().to_string())
        );
        crate::interrupt::said_if_slow(what, || self.shared.write(true));
    }
}

/// How many reports (progress, log lines) `keel serve --trace` keeps of
/// each call: the file keeps 10,000 calls, and a tool chooses how much it
/// reports.
const SERVE_REPORTS_PER_CALL: usize = 16;

/// How long the trace writer waits after a write that took `took`: under a
/// stream of calls, one write per interval, not one after another on a core
/// the calls need; and at most a tenth of the time writing, as a file of
/// 10,000 calls takes about a fifth of a second to make.
fn pause_after(took: std::time::Duration) -> std::time::Duration {
    SERVE_TRACE_INTERVAL.saturating_sub(took).max(took * 9)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn finished(id: &str) -> Event {
        Event::CallFinished { tool_use_id: id.into(), is_error: false, figures: None }
    }

    #[test]
    fn the_last_write_of_the_serve_trace_has_every_call_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("serve.trace.json");
        let trace = TraceFile::create(Target::resolve(&path, "trace").unwrap()).unwrap();
        for id in ["a", "b", "c"] {
            trace.record(&Event::CallStarted { tool_use_id: id.into(), tool: "echo".into(), activity: None });
            trace.record(&finished(id));
        }
        trace.finish();
        // The writer thread, woken by the last calls, writes no more.
        trace.record(&finished("late"));
        std::thread::sleep(Duration::from_millis(300));
        let written: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let ids: Vec<&str> = written["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|event| event["cat"] == "tool")
            .map(|event| event["args"]["tool_use_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["a", "b", "c"]);
        let names: Vec<_> =
            std::fs::read_dir(dir.path()).unwrap().map(|entry| entry.unwrap().file_name()).collect();
        assert_eq!(names, ["serve.trace.json"]);
    }

    #[test]
    fn a_report_is_not_written_where_a_link_made_during_the_run_leads() {
        let dir = tempfile::tempdir().unwrap();
        let (workspace, outside) = (dir.path().join("ws"), dir.path().join("outside"));
        std::fs::create_dir_all(&workspace).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("victim.txt"), "keep me").unwrap();
        let path = workspace.join("timeline.html");
        std::fs::write(&path, "old").unwrap();
        let target = Target::resolve(&path, "timeline").unwrap();
        // A tool replaces the report's file with a link out of the workspace.
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("../outside/victim.txt", &path).unwrap();
        let error = target.write(b"<html>").unwrap_err();
        assert!(format!("{error:#}").contains("a link made since is not followed"), "{error:#}");
        assert_eq!(std::fs::read_to_string(outside.join("victim.txt")).unwrap(), "keep me");
        // A link the user made before the run is followed.
        let target = Target::resolve(&path, "timeline").unwrap();
        target.write(b"<html>").unwrap();
        assert_eq!(std::fs::read_to_string(outside.join("victim.txt")).unwrap(), "<html>");
    }

    #[test]
    fn the_trace_writer_waits_out_the_interval_and_nine_times_a_long_write() {
        let ms = Duration::from_millis;
        assert_eq!(pause_after(ms(1)), ms(99));
        assert_eq!(pause_after(ms(10)), ms(90));
        assert_eq!(pause_after(ms(200)), ms(1_800));
    }
}
