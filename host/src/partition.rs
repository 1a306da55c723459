//! Cutting a batch into runs that may go in parallel and calls that must go
//! alone (seed §3): a pure function of each call's safety.

use std::ops::Range;

use serde::Serialize;

/// One group of the plan: a run of concurrency-safe calls, or one call that
/// must run alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Group {
    /// Whether the calls may overlap.
    pub concurrent: bool,
    /// The calls, as positions in the batch.
    pub calls: Range<usize>,
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn group(concurrent: bool, calls: Range<usize>) -> Group {
        Group { concurrent, calls }
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
