//! Round trips of every raft value through its protobuf form, and malformed messages refused.

use prost::Message;
use proto::raft::v1 as pb;
use proto::resource::v1::{Id, Resource, Tenancy};

use std::sync::Arc;

use super::*;
use crate::storage::Version;
use crate::storage::conformance::Fixture;

fn artist(name: &str) -> Resource {
    Fixture::new().artist(name)
}

fn id(name: &str) -> Id {
    artist(name).id.expect("fixture id")
}

/// A fence of every kind of guard.
fn fence() -> Fence {
    Fence {
        guards: vec![
            Guard::Resource {
                key: StorageKey::of(&id("invoice")),
                version: "41".into(),
            },
            Guard::Domain {
                domain: Domain::Types,
                revision: Version::at(40, 2),
            },
            Guard::Domain {
                domain: Domain::Acl,
                revision: Version::new(7),
            },
            Guard::Domain {
                domain: Domain::Policies,
                revision: Version::at(39, 1),
            },
        ],
    }
}

fn tagged(change: Change) -> Tagged {
    Tagged::new(change, "controller/demo-artist")
}

#[test]
fn every_op_round_trips_through_the_log_encoding() {
    let ops = [
        Op::Changes(vec![tagged(Change::Write(
            Arc::new(artist("a")),
            WriteCondition::Version,
        ))]),
        Op::Changes(vec![tagged(Change::Delete {
            id: id("a"),
            version: "7".into(),
        })]),
        Op::Changes(vec![
            tagged(Change::Write(Arc::new(artist("a")), WriteCondition::Merged)),
            Tagged {
                request_id: None,
                change: Change::Delete {
                    id: id("b"),
                    version: "9.1".into(),
                },
                actor: String::new(),
                fence: Default::default(),
                keep: None,
            },
            tagged(Change::Delete {
                id: id("c"),
                version: "10".into(),
            })
            .fenced(&fence())
            .kept(Some(Keep {
                time_ms: 1_700_000_000_123,
                retention: Retention::default(),
                node_bytes: 1 << 30,
            })),
        ]),
        Op::RestoreBegin {
            restore_id: "r1".into(),
        },
        Op::RestoreChunk {
            restore_id: "r1".into(),
            resources: vec![artist("a"), artist("b")],
            history: vec![(
                proto::resource::v1::HistoryEntry {
                    resource: Some(artist("a")),
                    actor: "alice".into(),
                    version: "3".into(),
                    operation: 1,
                    time: None,
                },
                1_700_000_000_000,
            )],
        },
        Op::RestoreCommit {
            restore_id: "r1".into(),
        },
    ];
    for op in ops {
        assert_eq!(decode_op(&encode_op(&op)), Ok(op.clone()), "{op:?}");
    }
}

#[test]
fn changes_are_encoded_byte_for_byte_as_their_protobuf_messages() {
    let mut big = artist("big");
    if let Some(data) = big.data.as_mut() {
        data.value = vec![7; 300];
    }
    big.metadata.insert("finalizers".into(), "a b".into());
    let write = |resource: &Resource, condition| {
        tagged(Change::Write(Arc::new(resource.clone()), condition))
    };
    let delete = Change::Delete {
        id: id("b"),
        version: "9.1".into(),
    };
    let anonymous = |change| Tagged {
        request_id: None,
        change,
        actor: String::new(),
        fence: Default::default(),
        keep: None,
    };
    let ops = [
        Op::Changes(Vec::new()),
        Op::Changes(vec![write(&big, WriteCondition::Version)]),
        Op::Changes(vec![write(&big, WriteCondition::Merged)]),
        Op::Changes(vec![write(&big, WriteCondition::Version).fenced(&fence())]),
        Op::Changes(vec![write(&big, WriteCondition::Version).kept(Some(
            Keep {
                time_ms: -5,
                retention: Retention::OFF,
                node_bytes: 7,
            },
        ))]),
        Op::Changes(vec![
            write(&big, WriteCondition::Merged)
                .fenced(&fence())
                .kept(Some(Keep {
                    time_ms: 1_700_000_000_000,
                    retention: Retention::default(),
                    node_bytes: 1 << 30,
                })),
            tagged(delete.clone()).fenced(&fence()),
        ]),
        Op::Changes(vec![anonymous(Change::Write(
            Arc::new(artist("a")),
            WriteCondition::Version,
        ))]),
        Op::Changes(vec![tagged(delete.clone())]),
        Op::Changes(vec![
            write(&artist("a"), WriteCondition::Merged),
            anonymous(delete.clone()),
            write(&big, WriteCondition::Version),
            tagged(delete),
        ]),
        Op::Changes(
            (0..200)
                .map(|_| write(&big, WriteCondition::Merged))
                .collect(),
        ),
    ];
    for op in ops {
        assert_eq!(
            encode_op(&op),
            command_of(&op).encode_to_vec(),
            "{} changes",
            op.change_count()
        );
    }
}

#[test]
fn malformed_log_entries_are_errors_not_defaults() {
    let cases = [
        pb::Command { command: None },
        pb::Command {
            command: Some(pb::command::Command::WriteCas(pb::WriteCas {
                resource: None,
                request_id: String::new(),
                actor: String::new(),
                merged: true,
                guards: Vec::new(),
                history: None,
            })),
        },
        // A guard of a domain this build does not know, and an empty one.
        pb::Command {
            command: Some(pb::command::Command::WriteCas(pb::WriteCas {
                resource: Some(artist("a")),
                request_id: String::new(),
                actor: String::new(),
                merged: false,
                guards: vec![pb::Guard {
                    guard: Some(pb::guard::Guard::Domain(pb::DomainGuard {
                        domain: "weather".into(),
                        index: 1,
                        position: 0,
                    })),
                }],
                history: None,
            })),
        },
        pb::Command {
            command: Some(pb::command::Command::DeleteCas(pb::DeleteCas {
                id: Some(id("a")),
                version: "1".into(),
                request_id: String::new(),
                actor: String::new(),
                guards: vec![pb::Guard { guard: None }],
                history: None,
            })),
        },
        pb::Command {
            command: Some(pb::command::Command::DeleteCas(pb::DeleteCas {
                id: None,
                version: "1".into(),
                request_id: String::new(),
                actor: String::new(),
                guards: Vec::new(),
                history: None,
            })),
        },
        pb::Command {
            command: Some(pb::command::Command::Batch(pb::Batch {
                operations: vec![],
            })),
        },
        pb::Command {
            command: Some(pb::command::Command::Batch(pb::Batch {
                operations: vec![pb::BatchOperation { operation: None }],
            })),
        },
    ];
    for command in cases {
        let error = decode_op(&command.encode_to_vec()).expect_err("malformed");
        assert!(matches!(error, CodecError::Shape { .. }), "{error}");
    }
    assert!(matches!(
        decode_op(&[0xff, 0xff, 0xff]),
        Err(CodecError::Protobuf { .. })
    ));
}

#[test]
fn every_storage_error_survives_the_wire() {
    let errors = [
        StorageError::NotFound,
        StorageError::CasFailure,
        StorageError::WrongUid,
        StorageError::GroupVersionMismatch {
            stored: Box::new(artist("a")),
        },
        StorageError::Inconsistent("no leader".into()),
        StorageError::WatchClosed("reset".into()),
        StorageError::ResumeUnavailable("too old".into()),
        StorageError::Rejected("name too long".into()),
        StorageError::MissingTenancy("namespace \"gone\" not found".into()),
        StorageError::Removed(String::from("removed").into()),
        StorageError::CatchingUp(crate::storage::CatchingUp {
            why: "catching up: applied 3 of 9".into(),
            applied: Some(3),
            target: Some(9),
        }),
        StorageError::Damaged("damaged".into()),
        StorageError::Invalid(crate::resource::Invalid(vec![
            crate::resource::FieldViolation::new(
                "resource.data.amount_cents",
                "resource.data.amount_cents: at most 1000",
            ),
            crate::resource::FieldViolation::new(
                "resource.data.name",
                "resource.data.name is required",
            ),
        ])),
        StorageError::Fenced(Fenced {
            kind: FenceKind::Schema,
            why: "the Type changed".into(),
            at: 41,
        }),
        StorageError::Fenced(Fenced {
            kind: FenceKind::Acl,
            why: "a token changed".into(),
            at: 42,
        }),
        StorageError::QuotaExceeded(crate::storage::quota::QuotaExceeded {
            quota: "default/jazz/limits".into(),
            key: "count/demo.*".into(),
            limit: 100,
            used: 100,
            wanted: 101,
        }),
        StorageError::Internal("disk".into()),
    ];
    for error in errors {
        let back = error_of(failure_of(&error));
        assert_eq!(format!("{back:?}"), format!("{error:?}"));
    }
}

/// A change naming a missing tenancy is REJECTED to a peer of an earlier build (which refuses
/// it as invalid, as before) and keeps its reason for this one.
#[test]
fn a_missing_tenancy_is_rejected_for_earlier_builds_and_keeps_its_reason() {
    let sent = failure_of(&StorageError::MissingTenancy("namespace missing".into()));
    assert_eq!(sent.code, Code::Rejected as i32);
    assert_eq!(sent.reason, "TENANCY_NOT_FOUND");
    let earlier = pb::StorageFailure {
        reason: String::new(),
        ..sent.clone()
    };
    assert!(matches!(error_of(earlier), StorageError::Rejected(_)));
    assert!(matches!(error_of(sent), StorageError::MissingTenancy(_)));
}

/// A shutting-down node answers its peers INCONSISTENT, which peers of earlier builds (that
/// read SHUTTING_DOWN as a final storage failure) retry on the next leader, as this one does.
#[test]
fn shutting_down_travels_as_inconsistent_for_peers_of_earlier_builds() {
    let sent = failure_of(&StorageError::ShuttingDown(
        "this node is shutting down".into(),
    ));
    assert!(matches!(
        error_of(sent),
        StorageError::Inconsistent(why) if why == "this node is shutting down"
    ));
}

#[test]
fn forwarded_values_round_trip() {
    let requests = [
        Request::Change(tagged(Change::Write(
            Arc::new(artist("a")),
            WriteCondition::Merged,
        ))),
        Request::Change(tagged(Change::Delete {
            id: id("a"),
            version: "3".into(),
        })),
        Request::Read(id("a")),
        Request::List(ListQuery {
            resource_type: UnversionedType {
                group: "demo".into(),
                kind: "Artist".into(),
            },
            tenancy: Tenancy {
                partition: "*".into(),
                namespace: "*".into(),
            },
            name_prefix: "a".into(),
        }),
        Request::ReadIndex,
    ];
    for request in requests {
        assert_eq!(request_of(forward_request_of(&request)), Ok(request));
    }
    let replies: [ReplyResult; 5] = [
        Ok(Reply::Resource(artist("a"))),
        Ok(Reply::Resources(vec![artist("a")])),
        Ok(Reply::Done),
        Ok(Reply::ReadIndex(42)),
        Err(StorageError::WrongUid),
    ];
    for reply in replies {
        let back = reply_of(forward_response_of(&reply));
        assert_eq!(format!("{back:?}"), format!("{reply:?}"));
    }
    assert!(request_of(pb::ForwardRequest { request: None }).is_err());
    assert!(reply_of(pb::ForwardResponse { response: None }).is_err());
}

#[test]
fn a_request_id_that_is_not_a_ulid_is_malformed() {
    let command = pb::Command {
        command: Some(pb::command::Command::WriteCas(pb::WriteCas {
            resource: Some(artist("a")),
            request_id: "not-a-ulid".into(),
            actor: String::new(),
            merged: false,
            guards: Vec::new(),
            history: None,
        })),
    };
    assert!(matches!(
        decode_op(&command.encode_to_vec()),
        Err(CodecError::Shape { .. })
    ));
}

#[test]
fn a_remembered_outcome_answers_a_retry_as_the_first_attempt_was_answered() {
    let sent = artist("a");
    let mut stored = sent.clone();
    stored.version = "42".into();
    let retry = Change::Write(Arc::new(sent), WriteCondition::Version);
    let remembered = encode_remembered(&Ok(Applied::Written(stored.clone())));
    assert!(
        remembered.len() < 16,
        "a write is remembered by its version only"
    );
    match remembered_result(&remembered, &retry) {
        Ok(Applied::Written(resource)) => assert_eq!(resource, stored),
        other => panic!("{other:?}"),
    }
    let failed = encode_remembered(&Err(StorageError::CasFailure));
    assert!(matches!(
        remembered_result(&failed, &retry),
        Err(StorageError::CasFailure)
    ));
    let done = encode_remembered(&Ok(Applied::Done));
    assert!(matches!(
        remembered_result(&done, &retry),
        Ok(Applied::Done)
    ));
}

/// A log entry of changes, pinned byte for byte: the log format (and what followers of earlier
/// builds read) changes only with a failure here, and then with `wire::FORMAT`.
#[test]
fn change_entries_keep_their_bytes() {
    let fixed_id = |name: &str| Id {
        name: name.into(),
        uid: "01J00000000000000000000000".into(),
        r#type: Some(proto::resource::v1::Type {
            group: "demo".into(),
            group_version: "v2".into(),
            kind: "Artist".into(),
        }),
        tenancy: Some(Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        }),
    };
    let resource = Resource {
        id: Some(fixed_id("a")),
        generation: "01J00000000000000000000001".into(),
        metadata: [("team".to_owned(), "billing".to_owned())].into(),
        ..Resource::default()
    };
    let request_id = Some(RequestId(
        ulid::Ulid::from_string("01J00000000000000000000002").expect("ulid"),
    ));
    let write = Tagged {
        request_id,
        change: Change::Write(Arc::new(resource), WriteCondition::Merged),
        actor: "alice".into(),
        fence: Default::default(),
        keep: None,
    };
    let delete = Tagged {
        request_id: None,
        change: Change::Delete {
            id: fixed_id("b"),
            version: "7".into(),
        },
        actor: String::new(),
        fence: Default::default(),
        keep: None,
    };
    let hex = |bytes: Vec<u8>| -> String { bytes.iter().map(|b| format!("{b:02x}")).collect() };
    let one = hex(encode_op(&Op::Changes(vec![write.clone()])));
    let batch = hex(encode_op(&Op::Changes(vec![write, delete])));
    assert_eq!(one, GOLDEN_ONE_WRITE, "one write");
    assert_eq!(batch, GOLDEN_BATCH, "a batch of a write and a delete");
}

const GOLDEN_ONE_WRITE: &str = concat!(
    "0a9d010a760a470a1a30314a30303030303030303030303030303030303030303030301201611a12",
    "0a0464656d6f120276321a0641727469737422120a0764656661756c74120764656661756c74221a",
    "30314a30303030303030303030303030303030303030303030312a0f0a047465616d120762696c6c",
    "696e67121a30314a30303030303030303030303030303030303030303030321a05616c6963652001",
);
const GOLDEN_BATCH: &str = concat!(
    "32f3010aa0010a9d010a760a470a1a30314a30303030303030303030303030303030303030303030",
    "301201611a120a0464656d6f120276321a0641727469737422120a0764656661756c741207646566",
    "61756c74221a30314a30303030303030303030303030303030303030303030312a0f0a047465616d",
    "120762696c6c696e67121a30314a30303030303030303030303030303030303030303030321a0561",
    "6c69636520010a4e124c0a470a1a30314a3030303030303030303030303030303030303030303030",
    "1201621a120a0464656d6f120276321a0641727469737422120a0764656661756c74120764656661",
    "756c74120137",
);

mod properties {
    //! Random log entries of changes: every one decodes to what was encoded, and the hand-written
    //! encoding is byte for byte prost's (`wire::changes` against `codec::command_of`).

    use proptest::prelude::*;

    use super::*;

    fn name() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9-]{0,20}"
    }

    fn resource() -> impl Strategy<Value = Resource> {
        (
            name(),
            name(),
            prop::collection::btree_map("[a-z]{1,8}", "[ -~]{0,16}", 0..4),
            prop::collection::vec(any::<u8>(), 0..300),
            "[0-9]{0,6}",
            prop::option::of(name()),
        )
            .prop_map(|(name, namespace, metadata, data, version, owner)| {
                let mut resource = Fixture::new().resource(
                    "v2",
                    "Artist",
                    Tenancy {
                        partition: "default".into(),
                        namespace,
                    },
                    &name,
                );
                resource.metadata = metadata;
                resource.version = version;
                if let Some(value) = resource.data.as_mut() {
                    value.value = data;
                } else {
                    resource.data = Some(prost_types::Any {
                        type_url: "type.googleapis.com/resd.demo.v2.Artist".into(),
                        value: data,
                    });
                }
                resource.owner = owner.map(|owner| id(&owner));
                resource
            })
    }

    fn guard() -> impl Strategy<Value = Guard> {
        prop_oneof![
            (name(), "[0-9]{1,5}").prop_map(|(n, version)| Guard::Resource {
                key: StorageKey::of(&id(&n)),
                version,
            }),
            (
                prop::sample::select(Domain::ALL.to_vec()),
                1u64..1_000_000,
                0u32..64
            )
                .prop_map(|(domain, index, position)| Guard::Domain {
                    domain,
                    revision: Version::at(index, position),
                }),
            (name(), name(), any::<u64>()).prop_map(|(namespace, n, transitions)| Guard::Lease {
                key: StorageKey {
                    group: "coordination".into(),
                    kind: "Lease".into(),
                    partition: "default".into(),
                    namespace,
                    name: n,
                },
                transitions,
            }),
        ]
    }

    fn change() -> impl Strategy<Value = Tagged> {
        let change = prop_oneof![
            (resource(), any::<bool>()).prop_map(|(resource, merged)| Change::Write(
                Arc::new(resource),
                if merged {
                    WriteCondition::Merged
                } else {
                    WriteCondition::Version
                }
            )),
            (name(), "[0-9]{1,6}(\\.[0-9]{1,3})?").prop_map(|(n, version)| Change::Delete {
                id: id(&n),
                version
            }),
        ];
        (
            change,
            any::<bool>(),
            "[a-z/-]{0,24}",
            prop::collection::vec(guard(), 0..4),
        )
            .prop_map(|(change, identified, actor, guards)| Tagged {
                request_id: identified.then(RequestId::new),
                change,
                actor,
                fence: Fence { guards },
                keep: None,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        #[test]
        fn change_entries_round_trip_and_match_prost(changes in prop::collection::vec(change(), 1..12)) {
            let op = Op::Changes(changes);
            let encoded = encode_op(&op);
            prop_assert_eq!(&encoded, &command_of(&op).encode_to_vec());
            prop_assert_eq!(decode_op(&encoded), Ok(op));
        }

        #[test]
        fn arbitrary_bytes_decode_or_are_refused_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_op(&bytes);
        }
    }
}
