//! The fence of a write sent under a lease (DESIGN §16, "Fenced writes"): a singleton replica
//! sends, with every Write, WriteStatus and Delete, the lease it holds as
//! `<partition>/<namespace>/<lease name>@<transitions>` ([`crate::FENCE_HEADER`]); the server
//! stores the write only while that lease exists and has changed hands exactly `transitions`
//! times. The runtime writes it, the server parses it: one grammar, here.

use std::fmt;

/// A lease and the number of times it had changed hands when its holder took it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseFence {
    pub partition: String,
    pub namespace: String,
    /// The `coordination.v1.Lease`'s name.
    pub name: String,
    pub transitions: u64,
}

/// Why a fence does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "malformed fence {text:?}: {why}; expected <partition>/<namespace>/<lease name>@<transitions>, e.g. default/default/my-controller@3"
)]
pub struct FenceError {
    pub text: String,
    pub why: &'static str,
}

/// Longest fence accepted (three names of at most 63 and 253 characters and a number).
const MAX_FENCE_BYTES: usize = 512;

impl LeaseFence {
    pub fn parse(text: &str) -> Result<LeaseFence, FenceError> {
        let error = |why| FenceError {
            text: text.chars().take(80).collect(),
            why,
        };
        if text.len() > MAX_FENCE_BYTES {
            return Err(error("longer than 512 bytes"));
        }
        let (path, transitions) = text
            .rsplit_once('@')
            .ok_or_else(|| error("no `@<transitions>`"))?;
        if transitions.is_empty() || !transitions.bytes().all(|b| b.is_ascii_digit()) {
            return Err(error("the transitions after `@` are not a whole number"));
        }
        let transitions = transitions
            .parse::<u64>()
            .map_err(|_| error("the transitions after `@` are too large"))?;
        let mut parts = path.split('/');
        let (Some(partition), Some(namespace), Some(name), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(error("not three names separated by `/`"));
        };
        for part in [partition, namespace, name] {
            if part.is_empty() {
                return Err(error("a name is empty"));
            }
            if !part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            {
                return Err(error(
                    "a name holds a character other than a-z, 0-9, `-` and `.`",
                ));
            }
        }
        Ok(LeaseFence {
            partition: partition.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            transitions,
        })
    }
}

impl fmt::Display for LeaseFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}@{}",
            self.partition, self.namespace, self.name, self.transitions
        )
    }
}

/// The fence a replica's writes carry, shared between what takes and loses the lease (the
/// runtime's election) and what sends the writes (a client made with it). Empty: the replica
/// holds no lease, and a client made with the cell refuses to write rather than write
/// unfenced.
#[derive(Debug, Clone, Default)]
pub struct FenceCell(std::sync::Arc<std::sync::Mutex<Option<LeaseFence>>>);

impl FenceCell {
    pub fn get(&self) -> Option<LeaseFence> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set(&self, fence: Option<LeaseFence>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = fence;
    }

    /// Empties the cell if it still holds `fence` (a refusal of writes sent under it must not
    /// empty a newer one).
    pub fn revoke(&self, fence: &LeaseFence) {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if held.as_ref() == Some(fence) {
            *held = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_reads_back_what_it_writes() {
        let fence = LeaseFence {
            partition: "default".into(),
            namespace: "billing".into(),
            name: "invoice-controller".into(),
            transitions: 7,
        };
        assert_eq!(fence.to_string(), "default/billing/invoice-controller@7");
        assert_eq!(LeaseFence::parse(&fence.to_string()), Ok(fence));
    }

    #[test]
    fn malformed_fences_say_what_is_wrong() {
        for (text, why) in [
            ("default/billing/lease", "no `@<transitions>`"),
            (
                "default/billing/lease@",
                "the transitions after `@` are not a whole number",
            ),
            (
                "default/billing/lease@-1",
                "the transitions after `@` are not a whole number",
            ),
            (
                "default/billing/lease@ 1",
                "the transitions after `@` are not a whole number",
            ),
            (
                "default/billing/lease@99999999999999999999",
                "the transitions after `@` are too large",
            ),
            ("billing/lease@1", "not three names separated by `/`"),
            ("a/b/c/d@1", "not three names separated by `/`"),
            ("default//lease@1", "a name is empty"),
            (
                "default/Billing/lease@1",
                "a name holds a character other than a-z, 0-9, `-` and `.`",
            ),
            (
                "default/billing/le\u{7}ase@1",
                "a name holds a character other than a-z, 0-9, `-` and `.`",
            ),
        ] {
            let error = LeaseFence::parse(text).unwrap_err();
            assert_eq!(error.why, why, "{text:?}");
            assert!(
                error.to_string().contains("expected <partition>"),
                "{error}"
            );
        }
        assert_eq!(
            LeaseFence::parse(&"a".repeat(600)).unwrap_err().why,
            "longer than 512 bytes"
        );
    }
}
