//! A run's events kept with the moment each arrived, and laid out on time
//! for the trace (`--trace`), the timeline (`--timeline`) and the summary.
//!
//! A call's steps come timed in its `call_finished` figures; `call_started`,
//! `call_finished` and what the tool reports are timed here, on receipt,
//! with the same clock ([`now_us`]): events reach a sink as they happen.

use std::collections::{HashMap, VecDeque};

use keel_host::Event;
use keel_host::events::{CallFigures, PlannedGroup, Step, StepTime, now_us};
use serde_json::Value;

/// What a run reported, call by call.
#[derive(Clone, Debug, Default)]
pub struct Recording {
    /// The groups of the batch's plan; empty for calls that arrive one by
    /// one (`keel serve`).
    pub plan: Vec<PlannedGroup>,
    /// Every call heard of, in the order it was first heard of.
    pub calls: VecDeque<CallRecord>,
    /// The tool each `tool_use` names, for calls refused before they were
    /// planned (they report only their result).
    names: HashMap<String, String>,
    /// At most this many calls are kept, the oldest finished ones dropped
    /// first; `None` keeps every call.
    limit: Option<usize>,
    /// The `seq` of the latest call heard of under each id still kept:
    /// `calls` is in `seq` order, so a call is found by a binary search.
    /// A batch's results arrive in its order once every call started, so a
    /// scan from either end would cross most of a large batch for each.
    seqs: HashMap<String, u64>,
    /// The `seq` the next call heard of gets.
    next_seq: u64,
    /// At most this many reports are kept of each call ([`CallRecord::reports`]).
    reports_per_call: usize,
}

/// One call as the run reported it.
#[derive(Clone, Debug, Default)]
pub struct CallRecord {
    /// Its `tool_use` id.
    pub tool_use_id: String,
    /// The tool's name.
    pub tool: String,
    /// What it was doing, when the tool said.
    pub activity: Option<String>,
    /// When its `call_started` arrived.
    pub started_us: Option<u64>,
    /// When its `call_finished` arrived.
    pub finished_us: Option<u64>,
    /// Its figures, once finished.
    pub figures: Option<CallFigures>,
    /// Whether its result is an error, once it has one.
    pub is_error: Option<bool>,
    /// The first line of its result when that is an error, shortened.
    pub error: Option<String>,
    /// What the tool reported as it ran, in order: the first and the
    /// latest, at most as many as the recording keeps of a call.
    pub reports: Vec<Report>,
    /// How many reports were left out between those kept.
    pub reports_left_out: u64,
    /// When it was first heard of, counted in calls.
    seq: u64,
}

/// One thing a running tool reported.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// When it arrived.
    pub at_us: u64,
    /// `progress`, `log` or `network refused`.
    pub kind: &'static str,
    /// What it said, kept once.
    said: Said,
}

/// What a report said: a progress report's data when it is small, else
/// its text, cut.
#[derive(Clone, Debug, PartialEq)]
enum Said {
    Text(String),
    Data(Value),
}

/// A progress report's message: its `message`, or the report when it is a
/// string.
fn message(data: &Value) -> Option<&str> {
    match data {
        Value::String(text) => Some(text),
        other => other.get("message").and_then(Value::as_str),
    }
}

/// How large a progress report's JSON may be and be kept whole: a tool
/// may send a megabyte of progress in every call, and a report file has
/// room for the gist of it only.
const REPORT_BYTES: usize = 1024;

/// How much of a report's text is kept when it is cut.
const REPORT_CHARS: usize = 200;

/// How many reports a batch's recording keeps of each call: the first half
/// and the latest half.
pub const REPORTS_PER_CALL: usize = 64;

impl Report {
    /// What it said: a progress report's message (its JSON text when it has
    /// none), a log line, the refused request and why.
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        match &self.said {
            Said::Text(text) => text.into(),
            Said::Data(data) => message(data).map_or_else(|| data.to_string().into(), Into::into),
        }
    }

    /// A progress report's data, when it was small enough to keep.
    pub fn data(&self) -> Option<&Value> {
        match &self.said {
            Said::Data(data) => Some(data),
            Said::Text(_) => None,
        }
    }

    /// A progress report of `data`: kept whole when small, else its text, cut.
    fn progress(at_us: u64, data: &Value) -> Self {
        let json = serde_json::to_string(data).unwrap_or_default();
        let said = if json.len() <= REPORT_BYTES {
            Said::Data(data.clone())
        } else {
            Said::Text(shorten(message(data).unwrap_or(&json), REPORT_CHARS))
        };
        Report { at_us, kind: "progress", said }
    }

    /// A report of `kind` that said `text`, cut.
    fn text_of(at_us: u64, kind: &'static str, text: &str) -> Self {
        Report { at_us, kind, said: Said::Text(shorten(text, REPORT_CHARS)) }
    }
}

impl Recording {
    /// A recording of one batch, whose `tool_use` blocks name these tools
    /// (`(id, tool)`).
    pub fn of_batch<'a>(names: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let names = names.into_iter().map(|(id, tool)| (id.to_string(), tool.to_string())).collect();
        Recording { names, reports_per_call: REPORTS_PER_CALL, ..Recording::default() }
    }

    /// A recording of calls arriving one by one that keeps the last `limit`,
    /// and at most `reports_per_call` reports of each.
    pub fn bounded(limit: usize, reports_per_call: usize) -> Self {
        Recording { limit: Some(limit), reports_per_call, ..Recording::default() }
    }

    /// This recording, keeping no reports: what only the summary and the
    /// figures read.
    pub fn without_reports(self) -> Self {
        Recording { reports_per_call: 0, ..self }
    }

    /// Keep `event`, which arrived now.
    pub fn record(&mut self, event: &Event) {
        self.record_at(event, now_us());
    }

    /// Keep `event`, which arrived at `at_us`.
    pub fn record_at(&mut self, event: &Event, at_us: u64) {
        match event {
            Event::BatchPlan { batches } => self.plan.clone_from(batches),
            Event::CallStarted { tool_use_id, tool, activity } => {
                let call = self.call(tool_use_id);
                call.tool.clone_from(tool);
                call.activity.clone_from(activity);
                call.started_us = Some(at_us);
            }
            Event::CallFinished { tool_use_id, is_error, figures } => {
                let call = self.call(tool_use_id);
                call.finished_us = Some(at_us);
                call.is_error = Some(*is_error);
                if let Some(figures) = figures {
                    call.tool.clone_from(&figures.tool);
                    call.figures = Some((**figures).clone());
                }
                self.trim();
            }
            Event::ToolResult { tool_use_id, is_error, content, .. } => {
                let call = self.call(tool_use_id);
                call.is_error = Some(*is_error);
                if *is_error {
                    call.error = content.text().lines().next().map(|line| shorten(line, ERROR_CHARS));
                }
                self.trim();
            }
            // What the tools report is kept only for a report file.
            _ if self.reports_per_call == 0 => {}
            Event::Progress { tool_use_id, data } => {
                self.report(tool_use_id, Report::progress(at_us, data));
            }
            Event::ToolLog { tool_use_id, level, message } => {
                let text = format!("{level:?}: {message}").to_lowercase();
                self.report(tool_use_id, Report::text_of(at_us, "log", &text));
            }
            Event::NetworkRefused { tool_use_id, method, url, reason } => {
                let text = format!("refused {method} {url}: {reason}");
                self.report(tool_use_id, Report::text_of(at_us, "network refused", &text));
            }
            _ => {}
        }
    }

    /// Keep `report` of the call `id`: once it has as many as are kept, the
    /// oldest after the first half makes room, and is counted.
    fn report(&mut self, id: &str, report: Report) {
        let (kept, first) = (self.reports_per_call, self.reports_per_call / 2);
        let call = self.call(id);
        if call.reports.len() >= kept {
            call.reports.remove(first);
            call.reports_left_out += 1;
        }
        call.reports.push(report);
    }

    /// The call `id`, new if unheard of.
    fn call(&mut self, id: &str) -> &mut CallRecord {
        let kept =
            self.seqs.get(id).and_then(|seq| self.calls.binary_search_by_key(seq, |call| call.seq).ok());
        let index = match kept {
            Some(index) => index,
            None => {
                let seq = self.next_seq;
                self.next_seq += 1;
                self.seqs.insert(id.to_string(), seq);
                let tool = self.names.get(id).cloned().unwrap_or_default();
                self.calls.push_back(CallRecord {
                    tool_use_id: id.to_string(),
                    tool,
                    seq,
                    ..CallRecord::default()
                });
                self.calls.len() - 1
            }
        };
        &mut self.calls[index]
    }

    /// Drop the oldest finished calls over the limit (a call refused
    /// before it was planned finishes with its result).
    fn trim(&mut self) {
        let Some(limit) = self.limit else { return };
        while self.calls.len() > limit {
            match self.calls.iter().position(|call| call.finished_us.is_some() || call.is_error.is_some()) {
                Some(index) => {
                    let call = self.calls.remove(index).expect("found above");
                    if self.seqs.get(&call.tool_use_id) == Some(&call.seq) {
                        self.seqs.remove(&call.tool_use_id);
                    }
                }
                None => break,
            }
        }
    }

    /// Every call of the batch's plan in batch order, then any others; a
    /// stream's calls in the order they arrived.
    pub fn in_order(&self) -> Vec<&CallRecord> {
        let by_id: HashMap<&str, &CallRecord> =
            self.calls.iter().map(|call| (call.tool_use_id.as_str(), call)).collect();
        let planned: Vec<&CallRecord> = self
            .plan
            .iter()
            .flat_map(|group| &group.tool_use_ids)
            .filter_map(|id| by_id.get(id.as_str()).copied())
            .collect();
        let in_plan: std::collections::HashSet<&str> =
            planned.iter().map(|call| call.tool_use_id.as_str()).collect();
        let others = self.calls.iter().filter(|call| !in_plan.contains(call.tool_use_id.as_str()));
        planned.into_iter().chain(others).collect()
    }
}

impl CallRecord {
    /// Its steps when it was planned, and those of its turn. The turn
    /// begins a little before its `call_started` (a replan, the activity
    /// question), so the split is the widest gap between two steps before
    /// `call_started`: planning is one stretch of work, and the wait for the
    /// turn comes after it. A call that never started (interrupted first)
    /// only planned.
    pub fn split_steps(&self) -> (Vec<StepTime>, Vec<StepTime>) {
        let Some(figures) = &self.figures else { return (Vec::new(), Vec::new()) };
        let steps = &figures.steps;
        let Some(started) = self.started_us else { return (steps.clone(), Vec::new()) };
        let before = steps.iter().take_while(|step| step.start_us < started).count();
        let split = (1..=before.min(steps.len().saturating_sub(1)))
            .max_by_key(|&index| steps[index].start_us.saturating_sub(steps[index - 1].end_us()))
            .unwrap_or(0);
        (steps[..split].to_vec(), steps[split..].to_vec())
    }

    /// The span of its turn: from its `call_started` (or its first step of
    /// the turn) to its last step, or, without figures, the moment its
    /// `call_finished` was received (which may be later than the call's
    /// end, and later than the start of the call after it); `None` for a
    /// call that never had a turn.
    pub fn turn(&self) -> Option<(u64, u64)> {
        let (_, turn) = self.split_steps();
        let first = turn.first().map(|step| step.start_us);
        let last = turn.iter().map(|step| step.end_us()).max();
        let start = match (self.started_us, first) {
            (Some(started), Some(first)) => started.min(first),
            (started, first) => started.or(first)?,
        };
        let end = last.or(self.finished_us).unwrap_or(start).max(start);
        Some((start, end))
    }

    /// How long its turn took, in µs.
    pub fn wall_us(&self) -> Option<u64> {
        self.turn().map(|(start, end)| end - start)
    }

    /// Its outcome's word: the figures', else `error` or `ok` from its
    /// result, else `unfinished`.
    pub fn outcome(&self) -> String {
        match (&self.figures, self.is_error) {
            (Some(figures), _) => figures.outcome.to_string(),
            (None, Some(true)) => "error".into(),
            (None, Some(false)) => "ok".into(),
            (None, None) => "unfinished".into(),
        }
    }

    /// The time it spent in `step`, in µs.
    pub fn step_us(&self, step: Step) -> u64 {
        self.figures.as_ref().map_or(0, |figures| figures.duration_us(step))
    }
}

/// How much of an error's first line is kept.
const ERROR_CHARS: usize = 120;

/// `text` cut to `chars` characters, with `…` when cut.
pub fn shorten(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// A label for a group of the plan: `concurrent run (3 calls)`, or `alone:
/// write_file` with `tool`, the tool of its one call when it was heard of.
pub fn group_label(group: &PlannedGroup, tool: Option<&str>) -> String {
    match group.tool_use_ids.as_slice() {
        [id] if !group.concurrent => format!("alone: {}", tool.unwrap_or(id)),
        ids => format!("concurrent run ({})", crate::commands::counted(ids.len(), "call")),
    }
}

/// Greedy slot assignment: each interval `(start, end)`, taken by start,
/// gets the lowest-numbered slot free by then (one whose last interval
/// ended at or before its start). Returns each interval's slot, in the
/// order given, and the number of slots.
pub fn assign_slots(intervals: &[(u64, u64)]) -> (Vec<usize>, usize) {
    let mut order: Vec<usize> = (0..intervals.len()).collect();
    order.sort_by_key(|&index| (intervals[index].0, intervals[index].1));
    let mut ends: Vec<u64> = Vec::new();
    let mut slots = vec![0; intervals.len()];
    for index in order {
        let (start, end) = intervals[index];
        let slot = match ends.iter().position(|&free_at| free_at <= start) {
            Some(slot) => slot,
            None => {
                ends.push(0);
                ends.len() - 1
            }
        };
        ends[slot] = end.max(start);
        slots[index] = slot;
    }
    (slots, ends.len())
}

/// Where the calls of a recording go on time.
pub struct Layout<'a> {
    /// The earliest moment of the recording: every time is shown from it.
    pub origin_us: u64,
    /// The latest.
    pub end_us: u64,
    /// The calls, in order ([`Recording::in_order`]).
    pub calls: Vec<Placed<'a>>,
    /// How many slots their turns need.
    pub slots: usize,
    /// How many lanes their planning needs.
    pub planning_lanes: usize,
    /// The plan's groups.
    pub groups: Vec<Group<'a>>,
}

/// One group of the plan placed.
pub struct Group<'a> {
    /// The group.
    pub group: &'a PlannedGroup,
    /// Its label ([`group_label`]).
    pub label: String,
    /// From the first start of a turn of its calls to the last end; `None`
    /// when none of its calls had a turn.
    pub span: Option<(u64, u64)>,
}

/// One call placed.
pub struct Placed<'a> {
    /// The call.
    pub call: &'a CallRecord,
    /// The steps it took when it was planned, before its turn.
    pub planning: Vec<StepTime>,
    /// The steps from its turn on.
    pub steps: Vec<StepTime>,
    /// Its turn, and the slot it ran in; `None` for a call that never
    /// started.
    pub turn: Option<((u64, u64), usize)>,
    /// The planning lane of its planning steps.
    pub planning_lane: Option<usize>,
}

impl<'a> Layout<'a> {
    /// Lay `recording` out.
    pub fn of(recording: &'a Recording) -> Self {
        let calls = recording.in_order();
        let split: Vec<_> = calls.iter().map(|call| call.split_steps()).collect();
        let turns: Vec<Option<(u64, u64)>> = calls.iter().map(|call| call.turn()).collect();
        let with_turn: Vec<(u64, u64)> = turns.iter().flatten().copied().collect();
        let (turn_slots, slots) = assign_slots(&with_turn);
        let planning_spans: Vec<Option<(u64, u64)>> = split
            .iter()
            .map(|(planning, _)| {
                let start = planning.first()?.start_us;
                let end = planning.iter().map(|step| step.end_us()).max()?;
                Some((start, end))
            })
            .collect();
        let (planning_slots, planning_lanes) =
            assign_slots(&planning_spans.iter().flatten().copied().collect::<Vec<_>>());
        let (mut turn_slots, mut planning_slots) = (turn_slots.into_iter(), planning_slots.into_iter());
        let mut times: Vec<u64> = Vec::new();
        let placed: Vec<Placed<'a>> = calls
            .into_iter()
            .zip(split)
            .zip(turns.iter().zip(&planning_spans))
            .map(|((call, (planning, steps)), (turn, planning_span))| {
                times.extend(turn.iter().flat_map(|(start, end)| [*start, *end]));
                times.extend(planning_span.iter().flat_map(|(start, end)| [*start, *end]));
                times.extend(call.reports.iter().map(|report| report.at_us));
                Placed {
                    call,
                    planning,
                    steps,
                    turn: turn.map(|turn| (turn, turn_slots.next().expect("a slot per turn"))),
                    planning_lane: planning_span.map(|_| planning_slots.next().expect("a lane per planning")),
                }
            })
            .collect();
        let origin_us = times.iter().copied().min().unwrap_or(0);
        let end_us = times.iter().copied().max().unwrap_or(0);
        // Each group's calls looked up by id: a batch of 20,000 calls in
        // one group, or 20,000 alone, is not searched once per call.
        let index: HashMap<&str, usize> =
            placed.iter().enumerate().map(|(at, placed)| (placed.call.tool_use_id.as_str(), at)).collect();
        let groups = recording
            .plan
            .iter()
            .map(|group| {
                let members: Vec<&Placed<'a>> = group
                    .tool_use_ids
                    .iter()
                    .filter_map(|id| Some(&placed[*index.get(id.as_str())?]))
                    .collect();
                let spans: Vec<(u64, u64)> =
                    members.iter().filter_map(|placed| Some(placed.turn?.0)).collect();
                let span = spans.iter().map(|span| span.0).min().zip(spans.iter().map(|span| span.1).max());
                let tool = members.first().map(|placed| placed.call.tool.as_str());
                Group { group, label: group_label(group, tool), span }
            })
            .collect();
        Layout { origin_us, end_us, calls: placed, slots, planning_lanes, groups }
    }

    /// `at_us` from the origin.
    pub fn relative(&self, at_us: u64) -> u64 {
        at_us.saturating_sub(self.origin_us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_host::events::Outcome;

    fn step(step: Step, start_us: u64, duration_us: u64) -> StepTime {
        StepTime { step, start_us, duration_us }
    }

    #[test]
    fn a_call_keeps_its_first_and_latest_reports_each_once_and_cut_and_none_without_reports() {
        let progress = |text: String| Event::Progress {
            tool_use_id: "p".into(),
            data: serde_json::json!({ "message": text, "progress": 1 }),
        };
        let mut recording = Recording::of_batch([]);
        for at in 0..100 {
            recording.record_at(
                &progress(format!("{at}:{}", "x".repeat(if at == 99 { 100_000 } else { 10 }))),
                at,
            );
        }
        let call = &recording.calls[0];
        assert_eq!(call.reports.len(), REPORTS_PER_CALL);
        assert_eq!(call.reports_left_out, 100 - REPORTS_PER_CALL as u64);
        let at: Vec<u64> = call.reports.iter().map(|report| report.at_us).collect();
        assert_eq!(at[..2], [0, 1]);
        assert_eq!(at[REPORTS_PER_CALL / 2], 100 - REPORTS_PER_CALL as u64 / 2);
        // A small report keeps its data, whose message is its text; a large
        // one only the start of its text.
        assert_eq!(call.reports[0].text(), format!("0:{}", "x".repeat(10)));
        assert_eq!(call.reports[0].data().unwrap()["progress"], 1);
        let last = call.reports.last().unwrap();
        assert!(last.data().is_none() && last.text().chars().count() == REPORT_CHARS + 1);

        let mut recording = Recording::of_batch([]).without_reports();
        recording.record_at(&progress("a".into()), 1);
        assert!(recording.calls.is_empty());
    }

    #[test]
    fn a_bounded_recording_keeps_the_latest_finished_calls_and_every_running_one() {
        let mut recording = Recording::bounded(2, 1);
        let started =
            |id: &str| Event::CallStarted { tool_use_id: id.into(), tool: "sleep".into(), activity: None };
        let finished =
            |id: &str| Event::CallFinished { tool_use_id: id.into(), is_error: false, figures: None };
        recording.record_at(&started("running"), 1);
        for (at, id) in ["a", "b", "c"].into_iter().enumerate() {
            recording.record_at(&started(id), at as u64);
            recording.record_at(&finished(id), at as u64 + 1);
        }
        let kept: Vec<&str> = recording.calls.iter().map(|call| call.tool_use_id.as_str()).collect();
        assert_eq!(kept, ["running", "c"]);
    }

    #[test]
    fn each_event_finds_the_latest_call_of_its_id() {
        let started =
            |id: &str| Event::CallStarted { tool_use_id: id.into(), tool: "echo".into(), activity: None };
        let finished =
            |id: &str| Event::CallFinished { tool_use_id: id.into(), is_error: false, figures: None };
        // A batch's results arrive in its order, after every call started.
        let mut recording = Recording::of_batch([]);
        for (at, id) in ["a", "b", "c"].into_iter().enumerate() {
            recording.record_at(&started(id), at as u64);
        }
        for (at, id) in ["c", "a", "b"].into_iter().enumerate() {
            recording.record_at(&finished(id), 10 + at as u64);
        }
        let finished_at: Vec<_> =
            recording.calls.iter().map(|call| (call.tool_use_id.as_str(), call.finished_us)).collect();
        assert_eq!(finished_at, [("a", Some(11)), ("b", Some(12)), ("c", Some(10))]);
        // A call dropped by the bound, heard of again, is a new one.
        let mut recording = Recording::bounded(1, 1);
        for (at, id) in ["a", "b", "a"].into_iter().enumerate() {
            recording.record_at(&started(id), 2 * at as u64);
            recording.record_at(&finished(id), 2 * at as u64 + 1);
        }
        let kept: Vec<_> =
            recording.calls.iter().map(|call| (call.tool_use_id.as_str(), call.started_us)).collect();
        assert_eq!(kept, [("a", Some(4))]);
    }

    #[test]
    fn a_call_planned_early_waits_between_its_planning_and_its_turn() {
        let steps = vec![
            step(Step::Questions, 0, 8),
            step(Step::Setup, 8, 495),
            step(Step::Questions, 503, 90),
            // Its turn: the activity asked, then its checks, a little before
            // its `call_started` arrived.
            step(Step::Questions, 47_941, 87),
            step(Step::Questions, 48_032, 31),
            step(Step::Permission, 48_064, 6),
            step(Step::Call, 48_071, 1_158),
            step(Step::Budget, 49_230, 4),
        ];
        let figures = CallFigures {
            tool: "write_file".into(),
            steps: steps.clone(),
            fuel: Some(1),
            memory_peak: Some(1),
            bytes_in: 1,
            bytes_out: 1,
            outcome: Outcome::Ok,
        };
        let call = CallRecord {
            started_us: Some(48_030),
            finished_us: Some(49_240),
            figures: Some(figures),
            ..CallRecord::default()
        };
        let (planning, turn) = call.split_steps();
        assert_eq!((planning.as_slice(), turn.as_slice()), steps.split_at(3));
        // It ends with its last step; its `call_finished` arrived later.
        assert_eq!(call.turn(), Some((47_941, 49_234)));
        assert_eq!(call.wall_us(), Some(1_293));
    }

    #[test]
    fn slots_are_reused_once_free_and_added_only_for_overlaps() {
        // a and b overlap; c starts as a ends and takes its slot; d overlaps
        // b and c.
        let (slots, count) = assign_slots(&[(0, 10), (5, 20), (10, 15), (12, 30)]);
        assert_eq!(slots, [0, 1, 0, 2]);
        assert_eq!(count, 3);
    }

    #[test]
    fn slots_are_assigned_by_start_whatever_the_order_given() {
        let (slots, count) = assign_slots(&[(20, 30), (0, 25), (26, 40)]);
        assert_eq!(slots, [1, 0, 0]);
        assert_eq!(count, 2);
        assert_eq!(assign_slots(&[]), (vec![], 0));
    }

    #[test]
    fn calls_one_after_another_share_one_slot() {
        let (slots, count) = assign_slots(&[(0, 5), (5, 9), (9, 9), (9, 12)]);
        assert_eq!(slots, [0, 0, 0, 0]);
        assert_eq!(count, 1);
    }
}
