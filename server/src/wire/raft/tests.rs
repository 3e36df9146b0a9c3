//! The codec's bytes, pinned; its decoding, total.

use std::collections::{BTreeMap, BTreeSet};

use openraft::EntryPayload;

use super::*;
use crate::storage::raft::op::Op;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn node(n: u64) -> NodeAddr {
    NodeAddr {
        api_addr: format!("127.0.0.1:850{n}"),
        raft_addr: format!("127.0.0.1:930{n}"),
    }
}

fn log_id(term: u64, node: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, node), index)
}

fn membership() -> Membership<NodeId, NodeAddr> {
    let nodes: BTreeMap<NodeId, NodeAddr> = (1..=3).map(|n| (n, node(n))).collect();
    Membership::new(vec![BTreeSet::from([1, 2, 3])], nodes)
}

fn joint_membership() -> Membership<NodeId, NodeAddr> {
    let nodes: BTreeMap<NodeId, NodeAddr> = (1..=4).map(|n| (n, node(n))).collect();
    Membership::new(
        vec![BTreeSet::from([1, 2, 3]), BTreeSet::from([2, 3, 4])],
        nodes,
    )
}

fn entry(payload: EntryPayload<TypeConfig>) -> Entry {
    Entry {
        log_id: log_id(2, 1, 75),
        payload,
    }
}

fn normal() -> EntryPayload<TypeConfig> {
    EntryPayload::Normal(Command::new(Op::RestoreBegin {
        restore_id: "r1".into(),
    }))
}

fn snapshot_meta() -> SnapshotMeta {
    SnapshotMeta {
        last_log_id: Some(log_id(3, 2, 900)),
        last_membership: StoredMembership::new(Some(log_id(2, 1, 70)), joint_membership()),
        snapshot_id: "3-2-900-17".into(),
    }
}

/// Each value, encoded, against the bytes this format has always had (they began as bincode
/// of openraft's serde shapes: data directories and peers of earlier builds hold them).
#[test]
fn openraft_values_keep_their_bytes() {
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("vote", encode(&Vote::new(3, 2)), GOLDEN_VOTE),
        (
            "committed vote",
            encode(&Vote::new_committed(4, 1)),
            GOLDEN_COMMITTED_VOTE,
        ),
        ("log id", encode(&log_id(2, 1, 75)), GOLDEN_LOG_ID),
        (
            "blank entry",
            encode(&entry(EntryPayload::Blank)),
            GOLDEN_BLANK_ENTRY,
        ),
        (
            "membership entry",
            encode(&entry(EntryPayload::Membership(membership()))),
            GOLDEN_MEMBERSHIP_ENTRY,
        ),
        (
            "normal entry",
            encode(&entry(normal())),
            GOLDEN_NORMAL_ENTRY,
        ),
        (
            "stored membership",
            encode(&StoredMembership::new(Some(log_id(2, 1, 70)), membership())),
            GOLDEN_STORED_MEMBERSHIP,
        ),
    ];
    let mut changed = Vec::new();
    for (name, bytes, golden) in &cases {
        if hex(bytes) != *golden {
            changed.push(format!("{name}: {}", hex(bytes)));
        }
    }
    assert!(
        changed.is_empty(),
        "openraft values changed their bytes (bump wire::FORMAT and read the old ones, or keep \
         the bytes):\n{}",
        changed.join("\n")
    );
}

/// Every value and every raft message, through the codec and back.
#[test]
fn every_value_reads_back_as_written() {
    fn round_trip<T: Wire + PartialEq + std::fmt::Debug>(value: T) {
        let bytes = encode(&value);
        assert_eq!(decode::<T>(&bytes).as_ref(), Ok(&value), "{}", T::WHAT);
    }
    round_trip(Vote::new(3, 2));
    round_trip(Vote::new_committed(u64::MAX, 0));
    round_trip(log_id(2, 1, 75));
    round_trip(Some(log_id(2, 1, 75)));
    round_trip(None::<LogId>);
    round_trip(entry(EntryPayload::Blank));
    round_trip(entry(normal()));
    round_trip(entry(EntryPayload::Membership(joint_membership())));
    round_trip(StoredMembership::new(None, Membership::new(vec![], ())));
    round_trip(snapshot_meta());
    let request = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(5, 1),
        prev_log_id: Some(log_id(4, 1, 10)),
        entries: vec![entry(EntryPayload::Blank), entry(normal())],
        leader_commit: None,
    };
    let read: AppendEntriesRequest<TypeConfig> = decode(&encode(&request)).expect("request");
    assert_eq!(
        (
            read.vote,
            read.prev_log_id,
            &read.entries,
            read.leader_commit
        ),
        (
            request.vote,
            request.prev_log_id,
            &request.entries,
            request.leader_commit
        )
    );
    for answer in [
        AppendEntriesResponse::Success,
        AppendEntriesResponse::PartialSuccess(Some(log_id(1, 1, 1))),
        AppendEntriesResponse::PartialSuccess(None),
        AppendEntriesResponse::Conflict,
        AppendEntriesResponse::HigherVote(Vote::new(9, 3)),
    ] {
        round_trip(Ok::<_, PeerFailure>(answer));
    }
    round_trip(Err::<AppendEntriesResponse<NodeId>, _>(PeerFailure(
        "raft stopped".into(),
    )));
    round_trip(VoteRequest::new(Vote::new(6, 2), Some(log_id(5, 1, 99))));
    round_trip(Ok::<_, PeerFailure>(VoteResponse::new(
        Vote::new(6, 2),
        None,
        true,
    )));
    round_trip(Ok::<_, PeerFailure>(SnapshotResponse::new(Vote::new(7, 1))));
    let (vote, meta) = (Vote::new_committed(8, 2), snapshot_meta());
    let bytes = encode(&(vote, meta.clone()));
    assert_eq!(decode::<(Vote, SnapshotMeta)>(&bytes), Ok((vote, meta)));
}

/// Cut anywhere, a record is an error; with a byte too many, too.
#[test]
fn a_truncated_or_padded_record_is_an_error() {
    let request = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(5, 1),
        prev_log_id: Some(log_id(4, 1, 10)),
        entries: vec![
            entry(EntryPayload::Blank),
            entry(normal()),
            entry(EntryPayload::Membership(joint_membership())),
        ],
        leader_commit: Some(log_id(5, 1, 12)),
    };
    let bytes = encode(&request);
    for cut in 0..bytes.len() {
        assert!(
            decode::<AppendEntriesRequest<TypeConfig>>(&bytes[..cut]).is_err(),
            "cut at {cut} of {}",
            bytes.len()
        );
    }
    let mut padded = bytes.clone();
    padded.push(0);
    assert_eq!(
        decode::<AppendEntriesRequest<TypeConfig>>(&padded).unwrap_err(),
        WireError::Trailing {
            what: "an append-entries request",
            found: 1
        }
    );
}

/// Impossible tags and lengths are named, and a length is never trusted for an allocation.
#[test]
fn impossible_tags_and_lengths_are_refused_without_allocating() {
    let mut vote = encode(&Vote::new(1, 1));
    *vote.last_mut().unwrap() = 2;
    assert!(matches!(
        decode::<Vote>(&vote),
        Err(WireError::Tag {
            field: "bool",
            value: 2,
            ..
        })
    ));
    let mut blank = encode(&entry(EntryPayload::Blank));
    let kind = blank.len() - 4;
    blank[kind] = 9;
    assert!(matches!(
        decode::<Entry>(&blank),
        Err(WireError::Tag {
            field: "payload kind",
            value: 9,
            ..
        })
    ));
    // An append claiming 2^60 entries in a few bytes.
    let mut huge = encode(&Vote::new(1, 1));
    huge.push(0);
    huge.extend_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(matches!(
        decode::<AppendEntriesRequest<TypeConfig>>(&huge),
        Err(WireError::Truncated { .. })
    ));
    // A membership whose voter has no address.
    let lonely = Membership::<NodeId, NodeAddr>::new(vec![BTreeSet::from([1])], ());
    let mut bytes = encode(&lonely);
    let nodes = bytes.len() - (8 + 8 + 8 + 8);
    bytes.truncate(nodes);
    bytes.extend_from_slice(&0u64.to_le_bytes());
    assert!(matches!(
        decode::<Membership<NodeId, NodeAddr>>(&bytes),
        Err(WireError::Invalid { .. })
    ));
    // A normal entry whose payload is not a command.
    let mut normal = encode(&entry(EntryPayload::Blank));
    normal.truncate(normal.len() - 4);
    normal.extend_from_slice(&1u32.to_le_bytes());
    normal.extend_from_slice(&2u64.to_le_bytes());
    normal.extend_from_slice(&[0xff, 0xff]);
    assert!(matches!(
        decode::<Entry>(&normal),
        Err(WireError::Invalid {
            what: "a log entry",
            ..
        })
    ));
}

/// Every raft message against the bytes peers of earlier builds send and expect (bincode of
/// openraft's serde shapes, which this codec took over): a peer of the previous build still
/// understands this one during a rolling upgrade.
#[test]
fn raft_messages_keep_their_bytes() {
    let request = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(5, 1),
        prev_log_id: None,
        entries: vec![entry(EntryPayload::Blank), entry(normal())],
        leader_commit: Some(log_id(5, 1, 2)),
    };
    let answers = [
        AppendEntriesResponse::Success,
        AppendEntriesResponse::PartialSuccess(Some(log_id(1, 1, 1))),
        AppendEntriesResponse::Conflict,
        AppendEntriesResponse::HigherVote(Vote::new(9, 3)),
    ];
    let mut cases: Vec<(String, Vec<u8>, &str)> = vec![
        (
            "joint membership entry".into(),
            encode(&entry(EntryPayload::Membership(joint_membership()))),
            GOLDEN_JOINT_ENTRY,
        ),
        (
            "snapshot header".into(),
            encode(&(Vote::new_committed(8, 2), snapshot_meta())),
            GOLDEN_SNAPSHOT_HEADER,
        ),
        (
            "append request".into(),
            encode(&request),
            GOLDEN_APPEND_REQUEST,
        ),
        (
            "vote request".into(),
            encode(&VoteRequest::new(Vote::new(6, 2), Some(log_id(5, 1, 99)))),
            GOLDEN_VOTE_REQUEST,
        ),
        (
            "vote answer".into(),
            encode(&Ok::<_, PeerFailure>(VoteResponse::new(
                Vote::new(6, 2),
                Some(log_id(5, 1, 9)),
                false,
            ))),
            GOLDEN_VOTE_ANSWER,
        ),
        (
            "snapshot answer".into(),
            encode(&Ok::<_, PeerFailure>(SnapshotResponse::new(Vote::new(
                7, 1,
            )))),
            GOLDEN_SNAPSHOT_ANSWER,
        ),
    ];
    for (n, answer) in answers.into_iter().enumerate() {
        cases.push((
            format!("append answer {n}"),
            encode(&Ok::<_, PeerFailure>(answer)),
            GOLDEN_APPEND_ANSWERS[n],
        ));
    }
    let changed: Vec<String> = cases
        .iter()
        .filter(|(_, bytes, golden)| hex(bytes) != *golden)
        .map(|(name, bytes, _)| format!("{name}: {}", hex(bytes)))
        .collect();
    assert!(
        changed.is_empty(),
        "raft messages changed their bytes (peers of earlier builds no longer understand \
         them):\n{}",
        changed.join("\n")
    );
    let read: AppendEntriesRequest<TypeConfig> =
        decode(&unhex(GOLDEN_APPEND_REQUEST)).expect("an earlier build's append");
    assert_eq!(read.entries, request.entries);
    // An earlier build's failure (openraft's `Fatal::Stopped`) is still read as a failure.
    assert!(matches!(
        decode::<Result<SnapshotResponse<NodeId>, PeerFailure>>(&unhex(GOLDEN_OLD_FATAL)),
        Ok(Err(PeerFailure(_)))
    ));
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&text[at..at + 2], 16).expect("hex"))
        .collect()
}

const GOLDEN_VOTE: &str = "0300000000000000020000000000000000";
const GOLDEN_COMMITTED_VOTE: &str = "0400000000000000010000000000000001";
const GOLDEN_LOG_ID: &str = "020000000000000001000000000000004b00000000000000";
const GOLDEN_BLANK_ENTRY: &str = "020000000000000001000000000000004b0000000000000000000000";
const GOLDEN_MEMBERSHIP_ENTRY: &str = concat!(
    "020000000000000001000000000000004b0000000000000002000000010000000000000003000000",
    "00000000010000000000000002000000000000000300000000000000030000000000000001000000",
    "000000000e000000000000003132372e302e302e313a383530310e000000000000003132372e302e",
    "302e313a3933303102000000000000000e000000000000003132372e302e302e313a383530320e00",
    "0000000000003132372e302e302e313a3933303203000000000000000e000000000000003132372e",
    "302e302e313a383530330e000000000000003132372e302e302e313a39333033",
);
const GOLDEN_NORMAL_ENTRY: &str = concat!(
    "020000000000000001000000000000004b000000000000000100000006000000000000001a040a02",
    "7231",
);
const GOLDEN_STORED_MEMBERSHIP: &str = concat!(
    "01020000000000000001000000000000004600000000000000010000000000000003000000000000",
    "00010000000000000002000000000000000300000000000000030000000000000001000000000000",
    "000e000000000000003132372e302e302e313a383530310e000000000000003132372e302e302e31",
    "3a3933303102000000000000000e000000000000003132372e302e302e313a383530320e00000000",
    "0000003132372e302e302e313a3933303203000000000000000e000000000000003132372e302e30",
    "2e313a383530330e000000000000003132372e302e302e313a39333033",
);
const GOLDEN_JOINT_ENTRY: &str = concat!(
    "020000000000000001000000000000004b0000000000000002000000020000000000000003000000",
    "000000000100000000000000020000000000000003000000000000000300000000000000020000000000",
    "000003000000000000000400000000000000040000000000000001000000000000000e00000000000000",
    "3132372e302e302e313a383530310e000000000000003132372e302e302e313a39333031020000000000",
    "00000e000000000000003132372e302e302e313a383530320e000000000000003132372e302e302e313a",
    "3933303203000000000000000e000000000000003132372e302e302e313a383530330e00000000000000",
    "3132372e302e302e313a3933303304000000000000000e000000000000003132372e302e302e313a3835",
    "30340e000000000000003132372e302e302e313a39333034",
);
const GOLDEN_SNAPSHOT_HEADER: &str = concat!(
    "08000000000000000200000000000000010103000000000000000200000000000000840300000000",
    "00000102000000000000000100000000000000460000000000000002000000000000000300000000",
    "00000001000000000000000200000000000000030000000000000003000000000000000200000000",
    "00000003000000000000000400000000000000040000000000000001000000000000000e00000000",
    "0000003132372e302e302e313a383530310e000000000000003132372e302e302e313a3933303102",
    "000000000000000e000000000000003132372e302e302e313a383530320e00000000000000313237",
    "2e302e302e313a3933303203000000000000000e000000000000003132372e302e302e313a383530",
    "330e000000000000003132372e302e302e313a3933303304000000000000000e0000000000000031",
    "32372e302e302e313a383530340e000000000000003132372e302e302e313a393330340a00000000",
    "000000332d322d3930302d3137",
);
const GOLDEN_APPEND_REQUEST: &str = concat!(
    "0500000000000000010000000000000001000200000000000000020000000000000001000000000000",
    "004b0000000000000000000000020000000000000001000000000000004b000000000000000100000006",
    "000000000000001a040a02723101050000000000000001000000000000000200000000000000",
);
const GOLDEN_VOTE_REQUEST: &str =
    "060000000000000002000000000000000001050000000000000001000000000000006300000000000000";
const GOLDEN_APPEND_ANSWERS: [&str; 4] = [
    "0000000000000000",
    "000000000100000001010000000000000001000000000000000100000000000000",
    "0000000002000000",
    "00000000030000000900000000000000030000000000000000",
];
const GOLDEN_VOTE_ANSWER: &str = "0000000006000000000000000200000000000000000001050000000000000001000000000000000900000000000000";
const GOLDEN_SNAPSHOT_ANSWER: &str = "000000000700000000000000010000000000000000";
/// `Err(Fatal::Stopped)` as an earlier build sent it.
const GOLDEN_OLD_FATAL: &str = "0100000002000000";
