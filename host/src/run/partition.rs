//! Cutting calls into runs that may go in parallel and calls that must go
//! alone (README, "How a batch runs"), in its two forms: [`partition`], the
//! plan of a whole batch, a pure function of each call's safety; and
//! [`Admission`], the same rule kept live as calls start and finish, with the
//! shared context their modifiers change. A batch and a stream of calls
//! arriving one at a time (`keel serve`) both start their calls through it.

use std::ops::Range;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::events::PlannedGroup;
use crate::run::context::{self, Bounded, Refused};

/// One group of the plan: a run of concurrency-safe calls, or one call that
/// must run alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Group {
    /// Whether the calls may overlap.
    pub concurrent: bool,
    /// The calls, as positions in the batch.
    pub calls: Range<usize>,
}

impl Group {
    /// The group as an event names it: by the `tool_use` ids of its calls,
    /// of a batch whose ids are `ids`.
    pub(crate) fn planned(&self, ids: &[String]) -> PlannedGroup {
        PlannedGroup { concurrent: self.concurrent, tool_use_ids: ids[self.calls.clone()].to_vec() }
    }
}

/// Walk the calls in order: a safe call joins the previous group when that
/// group is safe; anything else starts a new group. The result alternates
/// runs of safe calls with single unsafe calls.
pub fn partition(safe: &[bool]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for (index, &safe) in safe.iter().enumerate() {
        match groups.last_mut() {
            Some(last) if safe && last.concurrent => last.calls.end = index + 1,
            _ => groups.push(Group { concurrent: safe, calls: index..index + 1 }),
        }
    }
    groups
}

/// The partition rule, live: which call may start now, and the context it
/// sees. Calls ask in their order, the oldest waiting call first; a caller
/// asks for the next only once the one before it started.
///
/// A safe call joins the run in flight, if any, while fewer than `cap` calls
/// run and no call runs alone; any other call starts only when nothing runs,
/// and then runs alone. Calls of one run all see the context as it was when
/// the run began; their modifiers are queued and applied, in the calls'
/// order, when the run ends ([`Admission::close_run`]); the modifier of a
/// call that runs alone applies as it is accepted, so the next call sees it.
///
/// The context is held to its limit ([`Limits::context`]): a modifier that
/// would take it past the limit is refused as it is accepted
/// ([`Admission::accept`]), while its call can still be told, and the
/// context stays as it was. A queued modifier is counted at its full size
/// until its run ends, so that what a run queues is bounded too.
///
/// [`Limits::context`]: crate::Limits::context
pub(crate) struct Admission {
    cap: usize,
    running: usize,
    /// Whether the call running is one that runs alone.
    alone: bool,
    /// The concurrent run in flight, if any.
    run: Option<ConcurrentRun>,
    /// The shared context, up to the last run that ended: shared with the
    /// calls planned or started under it until a modifier changes it.
    context: Bounded,
}

/// A concurrent run: the context its calls see, and their modifiers by the
/// calls' positions.
struct ConcurrentRun {
    snapshot: Arc<Value>,
    queued: Vec<(u64, Value)>,
    /// The bytes of `queued`, as compact JSON text.
    queued_bytes: usize,
}

impl Admission {
    /// At most `cap` calls of a run at once (at least one), from `context`,
    /// which modifiers may make at most `max_context` bytes of JSON text.
    pub(crate) fn new(cap: usize, context: Value, max_context: usize) -> Self {
        let context = Bounded::new(context, max_context);
        Admission { cap: cap.max(1), running: 0, alone: false, run: None, context }
    }

    /// Whether the oldest waiting call, safe or not, may start now: the
    /// context it would run with, or `None` while it must wait. Nothing
    /// starts: a caller whose call was planned under another context plans
    /// it again under this one first (README, "How a batch runs").
    pub(crate) fn ready(&mut self, safe: bool) -> Option<Arc<Value>> {
        if self.alone {
            return None;
        }
        if safe {
            if self.running >= self.cap {
                return None;
            }
            // A run in flight began under the context as it is: its
            // modifiers apply only when it ends.
            return Some(self.run.as_ref().map_or(self.context.value(), |run| &run.snapshot).clone());
        }
        if self.running > 0 {
            return None;
        }
        self.close_run();
        Some(self.context.value().clone())
    }

    /// Start the oldest waiting call, safe or not, if the rule lets it start
    /// now: the context it runs with (the one [`Admission::ready`] gave), or
    /// `None` while it must wait.
    pub(crate) fn start(&mut self, safe: bool) -> Option<Arc<Value>> {
        let context = self.ready(safe)?;
        if safe {
            self.run.get_or_insert_with(|| ConcurrentRun {
                snapshot: context.clone(),
                queued: Vec::new(),
                queued_bytes: 0,
            });
        } else {
            self.alone = true;
        }
        self.running += 1;
        Some(context)
    }

    /// The call at `position` (in the calls' order), still running, returned
    /// `modifier`: applied now if it runs alone, else queued for the end of
    /// its run; refused, and the context left as it was, if it would take
    /// the context past its limit.
    pub(crate) fn accept(&mut self, position: u64, modifier: Value) -> Result<(), Refused> {
        match &mut self.run {
            Some(run) if !self.alone => {
                let size = context::size(&modifier);
                self.context.admit_queued(run.queued_bytes, size)?;
                run.queued_bytes += size;
                run.queued.push((position, modifier));
                Ok(())
            }
            _ => self.context.apply(&modifier),
        }
    }

    /// A call that started finished; its modifier, if any, was accepted
    /// before ([`Admission::accept`]).
    pub(crate) fn finish(&mut self) {
        self.running -= 1;
        self.alone = false;
    }

    /// Whether no call runs.
    pub(crate) fn is_idle(&self) -> bool {
        self.running == 0
    }

    /// End the concurrent run, if one was in flight: apply its queued
    /// modifiers in the calls' order. Later safe calls start a new run.
    pub(crate) fn close_run(&mut self) {
        if let Some(mut run) = self.run.take() {
            run.queued.sort_by_key(|&(position, _)| position);
            self.context.apply_queued(run.queued.iter().map(|(_, patch)| patch));
        }
    }

    /// The shared context, with every closed run's modifiers applied: what
    /// a call planned now is planned under.
    pub(crate) fn context(&self) -> &Arc<Value> {
        self.context.value()
    }

    /// Carry on from `context`, as it was left by the calls of another
    /// admission (a stream a reload replaced), before any call here starts.
    pub(crate) fn carry_on(&mut self, context: Value) {
        debug_assert!(self.is_idle() && self.run.is_none(), "a context carried on under a running call");
        self.context.replace(context);
    }

    /// The shared context, taken once the last run is closed.
    pub(crate) fn take_context(&mut self) -> Value {
        self.context.take()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn group(concurrent: bool, calls: Range<usize>) -> Group {
        Group { concurrent, calls }
    }

    /// The call at `position` ends with `modifier`, which must be accepted.
    fn end(admission: &mut Admission, position: u64, modifier: Option<Value>) {
        if let Some(modifier) = modifier {
            admission.accept(position, modifier).unwrap();
        }
        admission.finish();
    }

    #[test]
    fn safe_calls_start_together_up_to_the_cap_and_an_unsafe_one_waits_for_them() {
        let mut admission = Admission::new(2, json!({}), 1 << 20);
        assert!(admission.start(true).is_some());
        assert!(admission.start(true).is_some());
        assert!(admission.start(true).is_none(), "a third would pass the cap of 2");
        end(&mut admission, 0, None);
        assert!(admission.start(false).is_none(), "an unsafe call waits for the run before it");
        end(&mut admission, 1, None);
        assert!(admission.start(false).is_some());
        assert!(admission.start(true).is_none(), "nothing starts beside a call running alone");
        end(&mut admission, 2, None);
        assert!(admission.is_idle());
    }

    #[test]
    fn a_lone_calls_change_is_seen_at_once_and_a_runs_changes_apply_in_order_when_it_ends() {
        let mut admission = Admission::new(10, json!({ "cwd": "/workspace" }), 1 << 20);
        admission.start(false).unwrap();
        end(&mut admission, 0, Some(json!({ "cwd": "/workspace/src" })));
        let (a, b) = (admission.start(true).unwrap(), admission.start(true).unwrap());
        assert_eq!(*a, json!({ "cwd": "/workspace/src" }), "the lone call's change is seen at once");
        assert!(Arc::ptr_eq(&a, &b), "the calls of a run share one snapshot");
        end(&mut admission, 2, Some(json!({ "last": "b" })));
        end(&mut admission, 1, Some(json!({ "last": "a" })));
        assert_eq!(**admission.context(), json!({ "cwd": "/workspace/src" }), "queued while the run is open");
        admission.close_run();
        assert_eq!(
            **admission.context(),
            json!({ "cwd": "/workspace/src", "last": "b" }),
            "applied in the calls' order: b came last, so its change wins"
        );
    }

    #[test]
    fn ready_names_the_context_a_call_would_start_with_and_starts_nothing() {
        let mut admission = Admission::new(2, json!({ "cwd": "/workspace" }), 1 << 20);
        let planned = admission.context().clone();
        let ready = admission.ready(true).unwrap();
        assert!(Arc::ptr_eq(&planned, &ready), "no change: the very context it was planned under");
        assert!(admission.is_idle(), "asking starts nothing");
        admission.start(false).unwrap();
        assert!(admission.ready(true).is_none(), "nothing is ready beside a call running alone");
        end(&mut admission, 0, Some(json!({ "cwd": "/workspace/secrets" })));
        let ready = admission.ready(false).unwrap();
        assert!(!Arc::ptr_eq(&planned, &ready), "the lone call's change makes a new context");
        assert_eq!(*ready, json!({ "cwd": "/workspace/secrets" }));
        let run = admission.start(true).unwrap();
        end(&mut admission, 1, Some(json!({ "cwd": "/workspace/other" })));
        assert_eq!(admission.ready(true).unwrap(), run, "a safe call joins the run as it began");
        assert_eq!(*admission.ready(false).unwrap(), json!({ "cwd": "/workspace/other" }), "the run closed");
    }

    #[test]
    fn a_change_past_the_context_limit_is_refused_as_it_is_accepted_and_the_context_stays() {
        let start = json!({ "cwd": "/workspace" });
        let mut admission = Admission::new(10, start.clone(), 100);
        admission.start(false).unwrap();
        let refused = admission.accept(0, json!({ "pad": "x".repeat(100) })).unwrap_err();
        assert_eq!(refused, Refused::Modifier { limit: 100, size: 110 });
        admission.finish();
        assert_eq!(**admission.context(), start, "a lone call's change past the limit is not applied");

        // A run of three: each change fits, not all three together. The
        // one past the limit is refused; the others apply when it ends.
        for _ in 0..3 {
            admission.start(true).unwrap();
        }
        let part = |key: &str| json!({ key: "x".repeat(30) });
        admission.accept(1, part("a")).unwrap();
        admission.accept(3, part("c")).unwrap();
        let refused = admission.accept(2, part("b")).unwrap_err();
        assert_eq!(refused, Refused::Run { limit: 100, context: 20, queued: 76, modifier: 38 });
        (0..3).for_each(|_| admission.finish());
        admission.close_run();
        let (a, c) = ("x".repeat(30), "x".repeat(30));
        assert_eq!(**admission.context(), json!({ "cwd": "/workspace", "a": a, "c": c }));
    }

    #[test]
    fn safe_runs_alternate_with_single_unsafe_calls() {
        assert_eq!(
            partition(&[true, true, false, false, true, false, true, true, true]),
            [
                group(true, 0..2),
                group(false, 2..3),
                group(false, 3..4),
                group(true, 4..5),
                group(false, 5..6),
                group(true, 6..9),
            ]
        );
        assert_eq!(partition(&[]), []);
    }

    proptest! {
        #[test]
        fn the_plan_is_a_partition_in_order(safe in proptest::collection::vec(any::<bool>(), 0..200)) {
            let groups = partition(&safe);
            let flattened: Vec<usize> = groups.iter().flat_map(|g| g.calls.clone()).collect();
            prop_assert_eq!(flattened, (0..safe.len()).collect::<Vec<_>>());
        }

        #[test]
        fn no_group_of_two_or_more_holds_an_unsafe_call(safe in proptest::collection::vec(any::<bool>(), 0..200)) {
            for group in partition(&safe) {
                if group.calls.len() >= 2 {
                    prop_assert!(group.concurrent);
                    prop_assert!(safe[group.calls.clone()].iter().all(|&s| s));
                }
                prop_assert_eq!(group.concurrent, safe[group.calls.start]);
            }
        }

        #[test]
        fn no_two_adjacent_groups_are_both_safe(safe in proptest::collection::vec(any::<bool>(), 0..200)) {
            let groups = partition(&safe);
            for pair in groups.windows(2) {
                prop_assert!(!(pair[0].concurrent && pair[1].concurrent));
            }
        }
    }
}
