//! Short human descriptions of resources that every front end shows the same way: ids,
//! tenancies, the worst condition, the age derived from the uid.

use std::time::{Duration, SystemTime};

use crate::cluster::v1::{Role, Scope};
use crate::resource::v1::{Condition, Id, Resource, State, Tenancy};

/// `partition/namespace`, `partition`, or `-` for cluster-scoped resources.
pub fn tenancy_label(tenancy: Option<&Tenancy>) -> String {
    match tenancy {
        Some(tenancy) if !tenancy.namespace.is_empty() => {
            format!("{}/{}", tenancy.partition, tenancy.namespace)
        }
        Some(tenancy) if !tenancy.partition.is_empty() => tenancy.partition.clone(),
        _ => "-".to_owned(),
    }
}

/// The tenancy pattern that matches every resource of a type with `scope` (`*` fields).
pub fn every_tenancy(scope: Scope) -> Tenancy {
    let (partition, namespace) = match scope {
        Scope::Cluster => ("", ""),
        Scope::Partition => ("*", ""),
        _ => ("*", "*"),
    };
    Tenancy {
        partition: partition.to_owned(),
        namespace: namespace.to_owned(),
    }
}

/// `group.version.Kind tenancy/name`, the form errors and listings use.
pub fn id_label(id: &Id) -> String {
    let kind = id
        .r#type
        .as_ref()
        .map(crate::codec::gvk)
        .unwrap_or_else(|| "?".to_owned());
    match tenancy_label(id.tenancy.as_ref()).as_str() {
        "-" => format!("{kind} {}", id.name),
        tenancy => format!("{kind} {tenancy}/{}", id.name),
    }
}

/// `Kind/name`, the short form for trees and tables.
pub fn short_label(id: &Id) -> String {
    let kind = id.r#type.as_ref().map(|t| t.kind.as_str()).unwrap_or("?");
    format!("{kind}/{}", id.name)
}

/// How bad a condition is: false is worse than unknown, which is worse than true.
pub fn severity(state: i32) -> u8 {
    match State::try_from(state) {
        Ok(State::False) => 2,
        Ok(State::Unknown) | Err(_) => 1,
        Ok(State::True) => 0,
    }
}

/// The worst condition over every status key (ties go to the first key and condition).
pub fn worst_condition(resource: &Resource) -> Option<&Condition> {
    let mut worst: Option<&Condition> = None;
    for status in resource.status.values() {
        for condition in &status.conditions {
            if worst.is_none_or(|w| severity(condition.state) > severity(w.state)) {
                worst = Some(condition);
            }
        }
    }
    worst
}

/// `Accepted=True`, `Degraded=False`.
pub fn condition_label(condition: &Condition) -> String {
    format!("{}={}", condition.r#type, state_label(condition.state))
}

pub fn state_label(state: i32) -> &'static str {
    match State::try_from(state) {
        Ok(State::True) => "True",
        Ok(State::False) => "False",
        Ok(State::Unknown) | Err(_) => "Unknown",
    }
}

/// Whether any status key has not yet observed the resource's current generation.
pub fn is_stale(resource: &Resource) -> bool {
    resource
        .status
        .values()
        .any(|status| status.observed_generation != resource.generation)
}

/// The creation time encoded in a ULID uid (its first 10 characters are milliseconds since the
/// Unix epoch in Crockford base32).
pub fn created_at(uid: &str) -> Option<SystemTime> {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    if uid.len() != 26 {
        return None;
    }
    let mut millis: u64 = 0;
    for byte in uid.bytes().take(10) {
        let digit = ALPHABET
            .iter()
            .position(|&c| c == byte.to_ascii_uppercase())?;
        millis = millis.checked_mul(32)?.checked_add(digit as u64)?;
    }
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(millis))
}

/// A duration as kubectl shows ages: `42s`, `7m`, `3h`, `12d`.
pub fn age_label(age: Duration) -> String {
    let seconds = age.as_secs();
    match seconds {
        0..120 => format!("{seconds}s"),
        120..7_200 => format!("{}m", seconds / 60),
        7_200..172_800 => format!("{}h", seconds / 3_600),
        _ => format!("{}d", seconds / 86_400),
    }
}

/// The age of a resource from its uid, or `-` when the uid carries no time.
pub fn age_of(resource: &Resource, now: SystemTime) -> String {
    resource
        .id
        .as_ref()
        .and_then(|id| created_at(&id.uid))
        .and_then(|created| now.duration_since(created).ok())
        .map(age_label)
        .unwrap_or_else(|| "-".to_owned())
}

/// The raft role as a word.
/// A text sparkline of `values` (`▁▂▃▄▅▆▇█`), scaled to their largest; all zero is a flat `▁`
/// line.
pub fn sparkline(values: &[u64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let top = values.iter().copied().max().unwrap_or(0);
    values
        .iter()
        .map(|value| {
            if top == 0 || *value == 0 {
                BARS[0]
            } else {
                // 1..=top → bars 1..=7, so any activity shows above the baseline.
                let level = value.saturating_mul(7).div_ceil(top);
                BARS[(level as usize).clamp(1, 7)]
            }
        })
        .collect()
}

/// `1234.5/s · apply p99 1.6 ms`: a node's recent write activity.
pub fn activity_label(write_rate: f64, apply_p99_ms: f64) -> String {
    if write_rate == 0.0 {
        return "idle".to_owned();
    }
    format!("{write_rate:.1}/s · apply p99 {apply_p99_ms} ms")
}

/// A member's role as `resctl cluster members` and the dashboard both name it: its place in the
/// membership (`leader`, `voter`, `learner`), and the node's own raft state after it when that
/// says more (`voter (candidate)`, `voter (removed)`); a follower is a voter.
pub fn member_role(leader: bool, voter: bool, raft_role: Option<i32>) -> String {
    let place = if leader {
        "leader"
    } else if voter {
        "voter"
    } else {
        "learner"
    };
    match raft_role.map(Role::try_from) {
        None | Some(Ok(Role::Follower | Role::Leader | Role::Learner | Role::Unspecified)) => {
            place.to_owned()
        }
        Some(_) => format!("{place} ({})", role_label(raft_role.unwrap_or_default())),
    }
}

pub fn role_label(role: i32) -> &'static str {
    match Role::try_from(role) {
        Ok(Role::Leader) => "leader",
        Ok(Role::Follower) => "follower",
        Ok(Role::Candidate) => "candidate",
        Ok(Role::Learner) => "learner",
        Ok(Role::Shutdown) => "shutdown",
        Ok(Role::Standalone) => "standalone",
        Ok(Role::Removed) => "removed",
        Ok(Role::Unspecified) | Err(_) => "unknown",
    }
}

pub use crate::bytes_label;

#[cfg(test)]
mod tests {
    #[test]
    fn sparklines_scale_to_their_largest_value() {
        assert_eq!(sparkline(&[0, 1, 5, 10, 0]), "▁▂▅█▁");
        assert_eq!(sparkline(&[0, 0]), "▁▁");
        assert_eq!(sparkline(&[3]), "█");
        assert_eq!(activity_label(0.0, 0.0), "idle");
        assert_eq!(activity_label(12.5, 1.6), "12.5/s · apply p99 1.6 ms");
    }

    use super::*;

    #[test]
    fn a_ulid_uid_gives_its_creation_time() {
        // 01ARYZ6S41 is 1469918176385 ms (the ULID specification's example).
        let created = created_at("01ARYZ6S41TSV4RRFFQ69G5FAV").unwrap();
        assert_eq!(
            created.duration_since(SystemTime::UNIX_EPOCH).unwrap(),
            Duration::from_millis(1_469_918_176_385)
        );
        assert_eq!(created_at("not-a-ulid"), None);
    }

    #[test]
    fn ages_read_like_kubectl() {
        for (seconds, expected) in [
            (5, "5s"),
            (119, "119s"),
            (600, "10m"),
            (7_200, "2h"),
            (200_000, "2d"),
        ] {
            assert_eq!(age_label(Duration::from_secs(seconds)), expected);
        }
    }

    #[test]
    fn the_worst_condition_wins_across_status_keys() {
        let condition = |kind: &str, state: State| Condition {
            r#type: kind.into(),
            state: state as i32,
            ..Default::default()
        };
        let mut resource = Resource::default();
        assert!(worst_condition(&resource).is_none());
        resource.status.insert(
            "a".into(),
            crate::resource::v1::Status {
                conditions: vec![condition("Accepted", State::True)],
                ..Default::default()
            },
        );
        resource.status.insert(
            "b".into(),
            crate::resource::v1::Status {
                conditions: vec![
                    condition("Ready", State::Unknown),
                    condition("Synced", State::False),
                ],
                ..Default::default()
            },
        );
        assert_eq!(
            condition_label(worst_condition(&resource).unwrap()),
            "Synced=False"
        );
    }
}
