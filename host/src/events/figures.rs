//! What one call cost (README, "Seeing a run"): the wall time of each step,
//! the fuel it burnt, the largest memory its sandboxes reached, the bytes in
//! and out, and how it ended. `call_finished` carries them.
//!
//! Every time is on one clock, [`now_us`]: microseconds since the Unix epoch,
//! read off a monotonic clock, so the steps of every call of a process line
//! up, and a trace of one server can be laid beside another's.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::limits::Usage;

/// Now, in microseconds since the Unix epoch: the wall clock read once per
/// process, advanced by a monotonic clock, so it never goes back.
pub fn now_us() -> u64 {
    at_us(Instant::now())
}

/// `instant` on the clock of [`now_us`].
pub fn at_us(instant: Instant) -> u64 {
    static ORIGIN: OnceLock<(Instant, u64)> = OnceLock::new();
    let (origin, origin_us) = *ORIGIN.get_or_init(|| {
        let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        (Instant::now(), micros(since_epoch))
    });
    match instant.checked_duration_since(origin) {
        Some(after) => origin_us + micros(after),
        None => origin_us.saturating_sub(micros(origin - instant)),
    }
}

fn micros(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// A step of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// The tool's answers about this input: planning (`plan`), then at the
    /// call's turn its own validation and permission decision.
    Questions,
    /// Instantiating a fresh sandbox, cut out of the step that needed it.
    Setup,
    /// The host's permission rules, and a person's answer when one is asked.
    Permission,
    /// The call itself.
    Call,
    /// The result held to its tool's budget (persisted when oversized).
    Budget,
}

impl Step {
    /// Every step, in the order a call goes through them.
    pub const ALL: [Step; 5] = [Step::Questions, Step::Setup, Step::Permission, Step::Call, Step::Budget];

    /// Its name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Questions => "questions",
            Step::Setup => "setup",
            Step::Permission => "permission",
            Step::Call => "call",
            Step::Budget => "budget",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It returned a result.
    Ok,
    /// Its input was refused: by the schema, or by the tool's validation.
    Invalid,
    /// Permission was denied: by the tool, a rule, or a person.
    Denied,
    /// The tool ran and reported an error.
    Error,
    /// A sandbox limit stopped it: fuel, memory, the deadline.
    Limit,
    /// The tool trapped, broke the contract, or the host could not run it.
    Crashed,
    /// An interrupt stopped it, or kept it from starting.
    Interrupted,
}

impl Outcome {
    /// Its name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Invalid => "invalid",
            Outcome::Denied => "denied",
            Outcome::Error => "error",
            Outcome::Limit => "limit",
            Outcome::Crashed => "crashed",
            Outcome::Interrupted => "interrupted",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When one piece of a step ran, on the clock of [`now_us`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct StepTime {
    /// Which step.
    pub step: Step,
    /// When it began.
    pub start_us: u64,
    /// How long it took.
    pub duration_us: u64,
}

impl StepTime {
    /// When it ended.
    pub fn end_us(&self) -> u64 {
        self.start_us + self.duration_us
    }
}

/// What one call cost, and how it ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CallFigures {
    /// The tool's name (the real one, when the call used an alias).
    pub tool: String,
    /// The pieces of its steps, in time order, none overlapping. A step may
    /// come more than once: questions when planned and again at its turn, a
    /// setup cut out of the step that needed a sandbox. A call planned ahead
    /// waits between its planning and its turn.
    pub steps: Vec<StepTime>,
    /// Fuel burnt by every export call of its sandboxes, questions
    /// included; `None` for a native tool.
    pub fuel: Option<u64>,
    /// The largest linear memory any of its sandboxes reached, in bytes;
    /// `None` for a native tool.
    pub memory_peak: Option<u64>,
    /// Bytes of the input's JSON text.
    pub bytes_in: u64,
    /// Bytes of the output the tool returned, text and images, before any
    /// budget.
    pub bytes_out: u64,
    /// How it ended.
    pub outcome: Outcome,
}

impl CallFigures {
    /// The time spent in `step`, all its pieces together.
    pub fn duration_us(&self, step: Step) -> u64 {
        self.steps.iter().filter(|time| time.step == step).map(|time| time.duration_us).sum()
    }

    /// When its first step began.
    pub fn start_us(&self) -> u64 {
        self.steps.first().map_or(0, |time| time.start_us)
    }

    /// When its last step ended.
    pub fn end_us(&self) -> u64 {
        self.steps.last().map_or(0, StepTime::end_us)
    }
}

/// A call's steps as it goes, made into [`CallFigures`] when it ended. One
/// made [`Recorder::off`] reads no clock: a call whose figures nobody reads
/// does not pay for them.
#[derive(Debug)]
pub(crate) struct Recorder {
    on: bool,
    steps: Vec<(Step, Instant, Instant)>,
    usage: Option<Arc<Usage>>,
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
    pub(crate) outcome: Outcome,
}

impl Recorder {
    /// A recorder of a call whose input is `bytes_in` bytes of JSON text.
    pub(crate) fn new(bytes_in: u64) -> Self {
        let steps = Vec::with_capacity(8);
        Recorder { on: true, steps, usage: None, bytes_in, bytes_out: 0, outcome: Outcome::Ok }
    }

    /// A recorder that records nothing.
    pub(crate) fn off() -> Self {
        let (steps, usage) = (Vec::new(), None);
        Recorder { on: false, steps, usage, bytes_in: 0, bytes_out: 0, outcome: Outcome::Ok }
    }

    /// Whether it records.
    pub(crate) fn is_on(&self) -> bool {
        self.on
    }

    /// Now, for a step beginning, when it records.
    pub(crate) fn start(&self) -> Option<Instant> {
        self.on.then(Instant::now)
    }

    /// Report what `usage` records too.
    pub(crate) fn watch(&mut self, usage: Option<Arc<Usage>>) {
        self.usage = usage;
    }

    /// `step` ran from `start` ([`Recorder::start`]) until now.
    pub(crate) fn record(&mut self, step: Step, start: Option<Instant>) {
        if let Some(start) = start {
            self.steps.push((step, start, Instant::now()));
        }
    }

    /// The figures of `tool`'s call: each step with the sandbox set-ups
    /// that fell inside it cut out as steps of their own.
    pub(crate) fn figures(self, tool: &str) -> CallFigures {
        let mut setups = self.usage.as_ref().map(|usage| usage.take_setups()).unwrap_or_default();
        setups.sort_by_key(|&(start, _)| start);
        let mut steps = Vec::with_capacity(self.steps.len() + 2 * setups.len());
        let mut piece = |step: Step, start: Instant, end: Instant| {
            let start_us = at_us(start);
            steps.push(StepTime { step, start_us, duration_us: at_us(end).saturating_sub(start_us) });
        };
        for (step, start, end) in self.steps {
            let inside: Vec<_> =
                setups.iter().filter(|&&(from, until)| from >= start && until <= end).collect();
            if inside.is_empty() {
                // A step is kept however short: every step a call went
                // through has its piece.
                piece(step, start, end);
                continue;
            }
            let mut from = start;
            for &&(setup_start, setup_end) in &inside {
                if setup_start > from {
                    piece(step, from, setup_start);
                }
                piece(Step::Setup, setup_start, setup_end);
                from = setup_end.max(from);
            }
            if end > from {
                piece(step, from, end);
            }
        }
        let usage = self.usage.as_deref();
        CallFigures {
            tool: tool.to_owned(),
            steps,
            fuel: usage.map(Usage::fuel),
            memory_peak: usage.map(Usage::memory_peak),
            bytes_in: self.bytes_in,
            bytes_out: self.bytes_out,
            outcome: self.outcome,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_clock_is_the_wall_clock_and_never_goes_back() {
        let wall = micros(SystemTime::now().duration_since(UNIX_EPOCH).unwrap());
        let (a, b) = (now_us(), now_us());
        assert!(a <= b);
        assert!(a.abs_diff(wall) < 5_000_000, "{a} is far from the wall clock {wall}");
        let earlier = Instant::now() - Duration::from_millis(3);
        assert!(at_us(earlier) + 2_000 < now_us());
    }

    #[test]
    fn a_setup_inside_a_step_is_cut_out_of_it() {
        let t = Instant::now();
        let ms = |n| t + Duration::from_millis(n);
        let usage = Usage::shared();
        usage.set_up(ms(2), ms(5));
        usage.set_up(ms(12), ms(13));
        usage.burnt(40);
        usage.burnt(2);
        usage.memory(65536);
        usage.memory(1024);
        let mut recorder = Recorder::new(17);
        recorder.watch(Some(usage));
        recorder.steps = vec![
            (Step::Questions, ms(1), ms(6)),
            (Step::Permission, ms(8), ms(9)),
            (Step::Call, ms(10), ms(20)),
            (Step::Budget, ms(20), ms(21)),
        ];
        let figures = recorder.figures("echo");
        let steps: Vec<(Step, u64)> =
            figures.steps.iter().map(|time| (time.step, time.duration_us / 1000)).collect();
        assert_eq!(
            steps,
            [
                (Step::Questions, 1),
                (Step::Setup, 3),
                (Step::Questions, 1),
                (Step::Permission, 1),
                (Step::Call, 2),
                (Step::Setup, 1),
                (Step::Call, 7),
                (Step::Budget, 1),
            ]
        );
        assert_eq!(figures.duration_us(Step::Questions) / 1000, 2);
        assert_eq!((figures.end_us() - figures.start_us()) / 1000, 20);
        assert_eq!((figures.fuel, figures.memory_peak, figures.bytes_in), (Some(42), Some(65536), 17));
        for pair in figures.steps.windows(2) {
            assert!(pair[0].end_us() <= pair[1].start_us, "{pair:?} overlap");
        }
    }

    #[test]
    fn figures_serialize_with_snake_case_names() {
        let figures = CallFigures {
            tool: "echo".into(),
            steps: vec![StepTime { step: Step::Call, start_us: 5, duration_us: 7 }],
            fuel: None,
            memory_peak: None,
            bytes_in: 2,
            bytes_out: 3,
            outcome: Outcome::Crashed,
        };
        assert_eq!(
            serde_json::to_string(&figures).unwrap(),
            r#"{"tool":"echo","steps":[{"step":"call","start_us":5,"duration_us":7}],"fuel":null,"memory_peak":null,"bytes_in":2,"bytes_out":3,"outcome":"crashed"}"#
        );
    }
}
