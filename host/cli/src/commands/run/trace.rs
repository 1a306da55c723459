//! `--trace FILE`: a run in the Chrome trace-event format, the
//! `{"traceEvents": [...]}` object that Perfetto and `chrome://tracing` open.
//!
//! Tracks (threads of one process): `plan`, the batch's groups; `slot N`,
//! the calls that ran one after another in the Nth place of concurrency,
//! each an enclosing span named after its tool with a span per step inside
//! and its progress as instants; `planning N`, the steps a call took when
//! the batch was planned, before its turn. Times are µs from the earliest
//! moment of the run.

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
            let mut args = json!({ "tool": call.tool, "tool_use_id": call.tool_use_id, "text": report.text });
            if let Some(data) = &report.data {
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
/// written ([`check_writable`]).
pub fn check_reports(
    reports: &[(&str, &str, &Option<PathBuf>)],
    inputs: impl FnOnce() -> Result<Vec<(PathBuf, &'static str)>>,
) -> Result<()> {
    let reports: Vec<(&str, &str, &Path)> =
        reports.iter().filter_map(|(flag, what, path)| Some((*flag, *what, path.as_deref()?))).collect();
    if reports.is_empty() {
        return Ok(());
    }
    let inputs = inputs()?;
    for (index, &(flag, _, path)) in reports.iter().enumerate() {
        if let Some((_, what)) = inputs.iter().find(|(input, _)| same_file(path, input)) {
            bail!("{flag} {} is {what}; give the report a file of its own", path.display());
        }
        if let Some((other, _, _)) = reports[..index].iter().find(|(_, _, earlier)| same_file(path, earlier))
        {
            bail!("{other} and {flag} name the same file, {}; give each a file of its own", path.display());
        }
    }
    reports.iter().try_for_each(|(_, what, path)| check_writable(path, what))
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

/// Write `contents` to `path`: a file atomically, so that a reader sees the
/// old file or the whole new one, never half of it, at the end of `path`'s
/// links; a pipe or a device written through ([`keel_host::fs::write_to`]).
pub fn write(path: &Path, contents: &[u8], what: &str) -> Result<()> {
    let failed = || format!("failed to write {what} {}", path.display());
    // A new report gets the mode of any new file, a replaced one keeps its own.
    keel_host::fs::write_to(path, contents).with_context(failed)?;
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
/// are in its next write.
pub struct TraceFile {
    shared: Arc<Shared>,
    finished: mpsc::Sender<()>,
}

/// What the writer thread and the calls share.
struct Shared {
    path: PathBuf,
    recording: Mutex<Recording>,
    /// Held across a write, so that writes never overtake one another: each
    /// takes its copy of the recording once it holds it.
    writing: Mutex<()>,
}

impl Shared {
    fn write(&self) {
        let _writing = self.writing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let recording = self.recording.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        if let Err(error) = write(&self.path, &trace(&recording, "keel serve"), "trace") {
            tracing::warn!("{error:#}");
        }
    }
}

impl TraceFile {
    /// Start the trace at `path`, writing an empty one at once: a path that
    /// cannot be written fails here, naming it.
    pub fn create(path: &Path) -> Result<Self> {
        write(path, &trace(&Recording::default(), "keel serve"), "trace")?;
        let shared = Arc::new(Shared {
            path: path.to_path_buf(),
            recording: Mutex::new(Recording::bounded(SERVE_TRACE_CALLS)),
            writing: Mutex::new(()),
        });
        let (finished, calls) = mpsc::channel::<()>();
        let writer = shared.clone();
        std::thread::Builder::new()
            .name("keel-trace".into())
            .spawn(move || {
                while calls.recv().is_ok() {
                    let began = std::time::Instant::now();
                    while calls.try_recv().is_ok() {}
                    writer.write();
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
}

/// How long the trace writer waits after a write that took `took`: under a
/// stream of calls, one write per interval, not one after another on a core
/// the calls need; and at most a tenth of the time writing, as a file of
/// 10,000 calls takes about a fifth of a second to make.
fn pause_after(took: std::time::Duration) -> std::time::Duration {
    SERVE_TRACE_INTERVAL.saturating_sub(took).max(took * 9)
}

impl Drop for TraceFile {
    /// The server is stopping: write what the writer may not have yet.
    fn drop(&mut self) {
        self.shared.write();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_trace_writer_waits_out_the_interval_and_nine_times_a_long_write() {
        let ms = Duration::from_millis;
        assert_eq!(pause_after(ms(1)), ms(99));
        assert_eq!(pause_after(ms(10)), ms(90));
        assert_eq!(pause_after(ms(200)), ms(1_800));
    }
}
