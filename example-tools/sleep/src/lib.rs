//! `sleep`: wait, in steps, reporting progress after each — the simplest tool
//! with a visible duration, for showing concurrency and interrupts.

use std::time::Duration;

use keel_guest::{Context, Interrupt, Output, Plan, Result, Tool, bail, json};
use schemars::JsonSchema;
use serde::Deserialize;

/// Longest sleep one call may ask for.
pub const MAX_MS: u64 = 600_000;

/// Most steps one call may ask for: a progress report a millisecond over
/// the longest sleep.
pub const MAX_STEPS: u32 = 600_000;

/// Input of `sleep`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// How long to sleep in all, in milliseconds.
    pub ms: u64,
    /// In how many equal steps; progress is reported after each. Default: 1.
    #[serde(default)]
    pub steps: Option<u32>,
}

/// The `sleep` tool.
pub struct Sleep;

impl Tool for Sleep {
    type Input = Input;
    const NAME: &str = "sleep";
    const DESCRIPTION: &str = "Waits for `ms` milliseconds, in `steps` equal steps, reporting \
        progress after each step.";
    const FIXED_PLAN: Option<Plan> = Some(Plan::SAFE_READ_ONLY);
    const INTERRUPT: Interrupt = Interrupt::Cancel;

    fn is_destructive(_input: &Input, _cx: &Context) -> bool {
        false
    }

    fn validate_input(input: &Input, _cx: &Context) -> Result<()> {
        if input.ms > MAX_MS {
            bail!("`ms` must be at most {MAX_MS}");
        }
        match input.steps {
            Some(0) => bail!("`steps` must be at least 1"),
            Some(steps) if steps > MAX_STEPS => bail!("`steps` must be at most {MAX_STEPS}"),
            _ => Ok(()),
        }
    }

    fn activity_description(input: &Input, _cx: &Context) -> Option<String> {
        Some(format!("Sleeping {} ms", input.ms))
    }

    fn call(input: Input, _cx: &Context) -> Result<Output> {
        let steps = input.steps.unwrap_or(1);
        for (step, pause) in schedule(input.ms, steps).enumerate() {
            std::thread::sleep(pause);
            keel_guest::progress(&json!({ "step": step + 1, "steps": steps }));
        }
        Ok(Output::text(format!("Slept {} ms", input.ms)))
    }
}

/// The pause before each step: `ms` split into `steps` parts that add up.
pub fn schedule(ms: u64, steps: u32) -> impl Iterator<Item = Duration> {
    let steps = u64::from(steps.max(1));
    (0..steps).map(move |step| Duration::from_millis(ms * (step + 1) / steps - ms * step / steps))
}

keel_guest::export!(Sleep);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_add_up_to_the_whole_sleep() {
        let schedule: Vec<Duration> = schedule(100, 3).collect();
        assert_eq!(schedule.len(), 3);
        assert_eq!(schedule.iter().sum::<Duration>(), Duration::from_millis(100));
    }

    #[test]
    fn sleeps_and_says_so() {
        let out = Sleep::call(Input { ms: 5, steps: Some(2) }, &Context::workspace_root()).unwrap();
        assert_eq!(out.text(), "Slept 5 ms");
    }

    #[test]
    fn refuses_zero_steps_and_overlong_sleeps() {
        let error =
            Sleep::validate_input(&Input { ms: 1, steps: Some(0) }, &Context::workspace_root()).unwrap_err();
        assert_eq!(error.message(), "`steps` must be at least 1");
        let error = Sleep::validate_input(&Input { ms: MAX_MS + 1, steps: None }, &Context::workspace_root())
            .unwrap_err();
        assert_eq!(error.message(), "`ms` must be at most 600000");
        let error =
            Sleep::validate_input(&Input { ms: 1, steps: Some(u32::MAX) }, &Context::workspace_root())
                .unwrap_err();
        assert_eq!(error.message(), "`steps` must be at most 600000");
    }
}
