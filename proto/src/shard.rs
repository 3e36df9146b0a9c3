//! Which member of a sharded controller owns which object (DESIGN §16, "Shards"): a rendezvous
//! (highest random weight) hash of the object's type, tenancy and name with each member's name
//! — when a member comes or goes, only the objects it gains or loses move. The server filters a
//! member's watch with it and the runtime checks it before each reconcile: one function, here.

use crate::coordination::v1::ShardMap;
use crate::resource::v1::Id;

/// The holder the server leaves in a member's lease when it takes it (the member dropped out of
/// its ring): not empty, so the member waits out a whole lease before taking it back — time for
/// its view of the ring to catch up — and knows, when it does, that its view is older.
pub const LEFT_THE_RING: &str = "(taken by the server: the member left its shard ring)";

/// An object as the ring places it: its type (without the version), tenancy and name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardKey<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    pub partition: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

impl<'a> ShardKey<'a> {
    pub fn of(id: &'a Id) -> ShardKey<'a> {
        let (group, kind) = id
            .r#type
            .as_ref()
            .map_or(("", ""), |t| (t.group.as_str(), t.kind.as_str()));
        let (partition, namespace) = id
            .tenancy
            .as_ref()
            .map_or(("", ""), |t| (t.partition.as_str(), t.namespace.as_str()));
        ShardKey {
            group,
            kind,
            partition,
            namespace,
            name: &id.name,
        }
    }
}

/// FNV-1a over the parts, each ended by a 0 byte, then a finalizer that spreads every bit
/// (splitmix64's): stable across builds and machines.
fn weight(member: &str, key: &ShardKey<'_>) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [
        member,
        key.group,
        key.kind,
        key.partition,
        key.namespace,
        key.name,
    ] {
        for byte in part.bytes().chain([0]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash = (hash ^ (hash >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash = (hash ^ (hash >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

/// The member of `members` that owns `key` (none without members). Ties go to the smaller
/// name.
pub fn owner<'m>(
    members: impl IntoIterator<Item = &'m str>,
    key: &ShardKey<'_>,
) -> Option<&'m str> {
    members
        .into_iter()
        .map(|member| (weight(member, key), member))
        .max_by(|(a, left), (b, right)| a.cmp(b).then_with(|| right.cmp(left)))
        .map(|(_, member)| member)
}

/// Whether `member` owns `key` under `map`: the current ring gives it to the member and, while a
/// ring change is not acknowledged by every member, so did the last settled ring.
pub fn owns(map: &ShardMap, member: &str, key: &ShardKey<'_>) -> bool {
    let now = owner(map.members.iter().map(|m| m.name.as_str()), key) == Some(member);
    now && (map.settled_ring_version == map.ring_version
        || owner(map.settled_members.iter().map(String::as_str), key) == Some(member))
}

/// Who reconciles `key` under `map`, in words (`resctl describe`).
pub fn owner_label(map: &ShardMap, key: &ShardKey<'_>) -> String {
    let now = owner(map.members.iter().map(|m| m.name.as_str()), key);
    let settled = owner(map.settled_members.iter().map(String::as_str), key);
    let ring = map.ring_version;
    match now {
        None => format!("nobody: the ring is empty (ring {ring})"),
        Some(member) if map.settled_ring_version == ring => {
            format!("member {member} (ring {ring})")
        }
        Some(member) if settled == Some(member) => {
            format!("member {member} (ring {ring}, settling)")
        }
        Some(member) => format!(
            "moving to member {member}: it waits until every member acknowledges ring {ring} (ring {} gave it to {})",
            map.settled_ring_version,
            settled.unwrap_or("nobody")
        ),
    }
}

/// Whether two maps place every object the same way (they may differ in acknowledgements).
pub fn same_placement(a: &ShardMap, b: &ShardMap) -> bool {
    let names = |map: &ShardMap| {
        map.members
            .iter()
            .map(|m| m.name.clone())
            .collect::<Vec<_>>()
    };
    let settled = |map: &ShardMap| map.settled_ring_version == map.ring_version;
    names(a) == names(b)
        && settled(a) == settled(b)
        && (settled(a) || a.settled_members == b.settled_members)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordination::v1::ShardMember;

    fn key(name: &str) -> ShardKey<'_> {
        ShardKey {
            group: "payments",
            kind: "Invoice",
            partition: "default",
            namespace: "billing",
            name,
        }
    }

    fn map(members: &[&str], settled: &[&str], ring: u64, settled_ring: u64) -> ShardMap {
        ShardMap {
            controller: "invoices".into(),
            members: members
                .iter()
                .map(|name| ShardMember {
                    name: (*name).into(),
                    lease: format!("lease-{name}"),
                    acked_ring_version: 0,
                })
                .collect(),
            ring_version: ring,
            settled_members: settled.iter().map(|s| (*s).to_owned()).collect(),
            settled_ring_version: settled_ring,
            managed_type: None,
        }
    }

    #[test]
    fn objects_spread_over_the_members_and_only_a_leavers_move() {
        let names: Vec<String> = (0..3000).map(|n| format!("invoice-{n}")).collect();
        let three = ["a", "b", "c"];
        let mut counts = std::collections::BTreeMap::new();
        for name in &names {
            *counts
                .entry(owner(three, &key(name)).expect("an owner"))
                .or_insert(0) += 1;
        }
        for (member, count) in &counts {
            assert!((800..1200).contains(count), "{member} owns {count} of 3000");
        }
        // c leaves: only c's objects move; a's and b's stay.
        for name in &names {
            let before = owner(three, &key(name)).expect("owner");
            let after = owner(["a", "b"], &key(name)).expect("owner");
            if before != "c" {
                assert_eq!(before, after, "{name} moved though its owner stayed");
            }
        }
        assert_eq!(owner(std::iter::empty(), &key("x")), None);
    }

    #[test]
    fn during_a_handover_an_object_reaches_its_new_owner_only_once_settled() {
        let names: Vec<String> = (0..500).map(|n| format!("invoice-{n}")).collect();
        // c joined (ring 2) but not every member acknowledged it: the settled ring is {a, b}.
        let joining = map(&["a", "b", "c"], &["a", "b"], 2, 1);
        let settled = map(&["a", "b", "c"], &["a", "b", "c"], 2, 2);
        let mut moving = 0;
        for name in &names {
            let key = key(name);
            let owners: Vec<&str> = ["a", "b", "c"]
                .into_iter()
                .filter(|m| owns(&joining, m, &key))
                .collect();
            assert!(owners.len() <= 1, "{name} owned by {owners:?}");
            if owners.is_empty() {
                moving += 1;
                // Leaving its old owner (gone from it at once), not yet at c.
                assert_eq!(owner(["a", "b", "c"], &key), Some("c"));
            }
            let settled_owners: Vec<&str> = ["a", "b", "c"]
                .into_iter()
                .filter(|m| owns(&settled, m, &key))
                .collect();
            assert_eq!(settled_owners.len(), 1, "{name} once settled");
        }
        assert!(moving > 100, "about a third moves to c ({moving})");
        let moving_name = names
            .iter()
            .find(|name| owner(["a", "b", "c"], &key(name)) == Some("c"))
            .expect("one moves");
        assert!(
            owner_label(&joining, &key(moving_name)).starts_with("moving to member c"),
            "{}",
            owner_label(&joining, &key(moving_name))
        );
        assert!(owner_label(&settled, &key(moving_name)).starts_with("member c (ring 2)"));
        assert!(!same_placement(&joining, &settled));
        let mut acked = settled.clone();
        acked.members[0].acked_ring_version = 2;
        assert!(same_placement(&settled, &acked));
    }
}
