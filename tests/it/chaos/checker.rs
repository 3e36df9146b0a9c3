//! A Wing–Gong–Lowe linearizability checker for one compare-and-swap register.
//!
//! Each operation has an invocation and (if it is known to have finished) a return time. An
//! operation whose client saw no answer (a timeout, an unreachable node) took effect at some
//! point after its invocation (`happened`, when the caller knows it did), or may have or not.
//! The search linearizes operations one at a time — only ones invoked before every unlinearized
//! operation with a return time returned — memoizing (linearized set, register value) so the
//! same situation is never explored twice, and gives up (inconclusive) past a state budget.

use std::collections::HashSet;

/// What an operation did to the register, as the client saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Call {
    /// Read this value (`None`: the register does not exist).
    Read(Option<u64>),
    /// Wrote this value unconditionally.
    Write(u64),
    /// Set `new` if the value was `expected`; `succeeded` says whether it did.
    Cas {
        expected: Option<u64>,
        new: u64,
        succeeded: bool,
    },
}

/// One operation of the history.
#[derive(Clone, Debug)]
pub(super) struct Operation {
    pub call: Call,
    /// Nanoseconds since the start of the run.
    pub invoked: u64,
    /// `None` when the client saw no answer.
    pub returned: Option<u64>,
    /// With no answer: whether it is known to have taken effect (else it may not have).
    pub happened: bool,
}

impl Operation {
    fn returned_or_never(&self) -> u64 {
        self.returned.unwrap_or(u64::MAX)
    }

    /// Whether the search must linearize it.
    fn required(&self) -> bool {
        self.returned.is_some() || self.happened
    }

    /// The register after this operation took effect on `state`, if it could.
    fn step(&self, state: Option<u64>) -> Option<Option<u64>> {
        let answered = self.returned.is_some();
        match &self.call {
            Call::Read(value) => (*value == state).then_some(state),
            Call::Write(value) => Some(Some(*value)),
            Call::Cas {
                expected,
                new,
                succeeded,
            } => match (*succeeded || !answered, *expected == state) {
                // A failed CAS took effect as a read that saw something else.
                (false, false) => Some(state),
                (true, true) => Some(Some(*new)),
                _ => None,
            },
        }
    }
}

/// A set of operation indexes.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Bits(Vec<u64>);

impl Bits {
    fn new(size: usize) -> Self {
        Bits(vec![0; size.div_ceil(64)])
    }
    fn contains(&self, index: usize) -> bool {
        self.0[index / 64] & (1 << (index % 64)) != 0
    }
    fn with(&self, index: usize) -> Self {
        let mut next = self.clone();
        next.0[index / 64] |= 1 << (index % 64);
        next
    }
}

/// States explored at most before the search gives up as inconclusive.
const STATE_BUDGET: usize = 2_000_000;

/// Whether the history is linearizable from `initial`; `Err` says how far the search got.
pub(super) fn check(initial: Option<u64>, operations: &[Operation]) -> Result<(), String> {
    let mut operations = operations.to_vec();
    operations.sort_by_key(|operation| operation.invoked);
    let required: Vec<usize> = (0..operations.len())
        .filter(|&index| operations[index].required())
        .collect();
    let mut seen: HashSet<(Bits, Option<u64>)> = HashSet::new();
    // Depth-first, with an explicit stack: (linearized, value, how many required are done).
    let mut stack = vec![(Bits::new(operations.len()), initial, 0usize)];
    let mut deepest = 0;
    while let Some((done, state, required_done)) = stack.pop() {
        if required_done == required.len() {
            return Ok(());
        }
        deepest = deepest.max(required_done);
        if seen.len() > STATE_BUDGET {
            return Err(format!(
                "inconclusive: {STATE_BUDGET} states explored, {deepest} of {} operations ordered",
                required.len()
            ));
        }
        // The earliest return among operations not yet linearized bounds what can go next.
        let horizon = operations
            .iter()
            .enumerate()
            .filter(|(index, _)| !done.contains(*index))
            .map(|(_, operation)| operation.returned_or_never())
            .min()
            .unwrap_or(u64::MAX);
        for (index, operation) in operations.iter().enumerate() {
            if operation.invoked > horizon {
                break;
            }
            if done.contains(index) {
                continue;
            }
            if let Some(next) = operation.step(state) {
                let linearized = done.with(index);
                if seen.insert((linearized.clone(), next)) {
                    let required_done = required_done + usize::from(operation.required());
                    stack.push((linearized, next, required_done));
                }
            }
        }
    }
    Err(format!(
        "not linearizable: at most {deepest} of {} completed operations could be ordered",
        required.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(call: Call, invoked: u64, returned: Option<u64>) -> Operation {
        Operation {
            call,
            invoked,
            returned,
            happened: false,
        }
    }

    #[test]
    fn sequential_writes_and_reads_are_linearizable() {
        let history = [
            op(Call::Write(1), 0, Some(1)),
            op(Call::Read(Some(1)), 2, Some(3)),
            op(
                Call::Cas {
                    expected: Some(1),
                    new: 2,
                    succeeded: true,
                },
                4,
                Some(5),
            ),
            op(Call::Read(Some(2)), 6, Some(7)),
        ];
        assert_eq!(check(None, &history), Ok(()));
    }

    #[test]
    fn a_stale_read_after_a_completed_write_is_caught() {
        let history = [
            op(Call::Write(1), 0, Some(1)),
            op(Call::Write(2), 2, Some(3)),
            op(Call::Read(Some(1)), 4, Some(5)),
        ];
        assert!(check(None, &history).is_err());
    }

    #[test]
    fn concurrent_operations_may_be_ordered_either_way() {
        let history = [
            op(Call::Write(1), 0, Some(10)),
            op(Call::Write(2), 1, Some(9)),
            op(Call::Read(Some(1)), 11, Some(12)),
        ];
        assert_eq!(check(None, &history), Ok(()));
    }

    #[test]
    fn a_cas_reported_failed_whose_effect_is_seen_is_caught() {
        // The bug exactly-once forwarding fixes: ABORTED although the CAS was applied.
        let history = [
            op(Call::Write(1), 0, Some(1)),
            op(
                Call::Cas {
                    expected: Some(1),
                    new: 2,
                    succeeded: false,
                },
                2,
                Some(3),
            ),
            op(Call::Read(Some(2)), 4, Some(5)),
        ];
        assert!(check(None, &history).is_err());
    }

    #[test]
    fn an_operation_with_an_unknown_outcome_may_or_may_not_have_happened() {
        let took_effect = [
            op(Call::Write(1), 0, None),
            op(Call::Read(Some(1)), 5, Some(6)),
        ];
        assert_eq!(check(None, &took_effect), Ok(()));
        let did_not = [
            op(Call::Write(1), 0, None),
            op(Call::Read(None), 5, Some(6)),
        ];
        assert_eq!(check(None, &did_not), Ok(()));
        // But not before it was invoked.
        let too_early = [
            op(Call::Read(Some(1)), 0, Some(1)),
            op(Call::Write(1), 5, None),
        ];
        assert!(check(None, &too_early).is_err());
    }

    #[test]
    fn an_operation_known_to_have_happened_must_be_placed() {
        let mut happened = op(Call::Write(1), 0, None);
        happened.happened = true;
        // Its value is never read: fine, as long as it fits somewhere.
        let history = [happened.clone(), op(Call::Read(Some(1)), 5, Some(6))];
        assert_eq!(check(None, &history), Ok(()));
        // A read after its invocation that cannot have preceded it, and none after: still fine
        // (it happened after the read)…
        let later = [happened.clone(), op(Call::Read(None), 5, Some(6))];
        assert_eq!(check(None, &later), Ok(()));
        // …but not when a later write was read afterwards and it must come before.
        let mut cas = op(
            Call::Cas {
                expected: Some(1),
                new: 2,
                succeeded: true,
            },
            0,
            None,
        );
        cas.happened = true;
        let impossible = [
            cas,
            op(Call::Read(None), 5, Some(6)),
            op(Call::Write(3), 7, Some(8)),
        ];
        assert!(check(None, &impossible).is_err());
    }
}
