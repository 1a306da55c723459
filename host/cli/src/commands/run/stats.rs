//! What `keel run` says on stderr once a batch finished: one summary line,
//! or with `--stats` a table of every call's figures.

use std::fmt::Write as _;

use keel_host::events::Step;

use super::record::{CallRecord, Recording};
use crate::commands::{counted, printable, size};

/// `5 calls, 1 error, 412 ms; slowest: grep (t3) 230 ms`: the calls of the
/// batch, those whose result is an error, the batch's wall time, and the
/// call whose turn took longest. Its tool and id are as the model wrote
/// them: printed on a terminal, the line goes through [`printable`].
pub fn summary(recording: &Recording, calls: usize, errors: usize, wall_us: u64) -> String {
    let mut line = format!("{}, {}, {}", counted(calls, "call"), counted(errors, "error"), duration(wall_us));
    let slowest =
        recording.calls.iter().filter_map(|call| Some((call.wall_us()?, call))).max_by_key(|(wall, _)| *wall);
    if let Some((wall, call)) = slowest {
        let _ = write!(line, "; slowest: {} ({}) {}", call.tool, call.tool_use_id, duration(wall));
    }
    line
}

/// The columns of `--stats`.
const COLUMNS: [&str; 13] = [
    "tool",
    "id",
    "outcome",
    "wall",
    "questions",
    "setup",
    "permission",
    "call",
    "budget",
    "fuel",
    "memory",
    "in",
    "out",
];

/// One row per call of the batch, in batch order: its tool and id (their
/// control characters escaped, [`printable`]), outcome,
/// the wall time of its turn, the time of each step, fuel burnt, peak
/// memory and bytes in and out. A native tool burns no fuel and has no
/// memory of its own (`-`); a call refused before it was planned has only
/// its outcome.
pub fn table(recording: &Recording) -> String {
    let rows: Vec<[String; 13]> = recording.in_order().into_iter().map(row).collect();
    let mut widths = COLUMNS.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut table = String::new();
    for row in std::iter::once(COLUMNS.map(String::from)).chain(rows) {
        let mut line = String::new();
        for (index, (cell, width)) in row.iter().zip(widths).enumerate() {
            // Names left, figures right.
            if index < 3 {
                let _ = write!(line, "{cell:<width$}  ");
            } else {
                let _ = write!(line, "{cell:>width$}  ");
            }
        }
        table.push_str(line.trim_end());
        table.push('\n');
    }
    table
}

fn row(call: &CallRecord) -> [String; 13] {
    let none = || "-".to_string();
    let step = |step: Step| call.figures.as_ref().map_or_else(none, |_| millis(call.step_us(step)));
    let figures = call.figures.as_ref();
    [
        printable(&call.tool).into_owned(),
        printable(&call.tool_use_id).into_owned(),
        call.outcome(),
        call.wall_us().map_or_else(none, millis),
        step(Step::Questions),
        step(Step::Setup),
        step(Step::Permission),
        step(Step::Call),
        step(Step::Budget),
        figures.and_then(|figures| figures.fuel).map_or_else(none, |fuel| fuel.to_string()),
        figures.and_then(|figures| figures.memory_peak).map_or_else(none, size),
        figures.map_or_else(none, |figures| size(figures.bytes_in)),
        figures.map_or_else(none, |figures| size(figures.bytes_out)),
    ]
}

/// `us` in milliseconds with three decimals, as a table column.
fn millis(us: u64) -> String {
    format!("{}.{:03}", us / 1000, us % 1000)
}

/// `us` for a person: `412 µs`, `3.2 ms`, `41 ms`, `1.25 s`.
pub fn duration(us: u64) -> String {
    match us {
        0..1_000 => format!("{us} µs"),
        1_000..10_000 => format!("{:.1} ms", us as f64 / 1e3),
        10_000..1_000_000 => format!("{} ms", (us + 500) / 1000),
        _ => format!("{:.2} s", us as f64 / 1e6),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(duration(412), "412 µs");
        assert_eq!(duration(3_240), "3.2 ms");
        assert_eq!(duration(412_400), "412 ms");
        assert_eq!(duration(1_250_000), "1.25 s");
        assert_eq!(millis(3_240), "3.240");
        assert_eq!(size(3_482), "3.4 KiB");
    }

    #[test]
    fn the_summary_counts_calls_and_errors_and_names_the_slowest() {
        let mut recording = Recording::default();
        let started = |id: &str, tool: &str| keel_host::Event::CallStarted {
            tool_use_id: id.into(),
            tool: tool.into(),
            activity: None,
        };
        let finished = |id: &str| keel_host::Event::CallFinished {
            tool_use_id: id.into(),
            is_error: false,
            figures: None,
        };
        recording.record_at(&started("t1", "grep"), 1_000);
        recording.record_at(&started("t2", "sleep"), 1_000);
        recording.record_at(&finished("t1"), 2_000);
        recording.record_at(&finished("t2"), 231_000);
        assert_eq!(
            summary(&recording, 3, 1, 412_000),
            "3 calls, 1 error, 412 ms; slowest: sleep (t2) 230 ms"
        );
        assert_eq!(summary(&Recording::default(), 1, 0, 900), "1 call, 0 errors, 900 µs");
    }
}
