//! ACLs with real processes (DESIGN §12.3): every RPC of both public services against every
//! kind of caller, generated from the descriptor set so a new RPC cannot ship unguarded; watches
//! filtered per item and ended when their token is deleted; a token made on one node works on
//! every node within a second; bad ACL input refused with the field named.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use prost::Message;
use proto::acl::v1 as acl;
use proto::cluster::v1 as cluster_pb;
use proto::cluster::v1::cluster_service_client::ClusterServiceClient;
use proto::resource::v1::resource_service_client::ResourceServiceClient;
use proto::resource::v1::{
    self as pb, DeleteRequest, Id, ListByOwnerRequest, ListRequest, MutateAndValidateRequest,
    ReadRequest, Resource, Tenancy, WatchListRequest, WriteRequest, WriteStatusRequest,
};
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic::{Code, Request};

use crate::process::Resd;

pub(crate) fn with_token<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(token) = token {
        request.metadata_mut().insert(
            proto::TOKEN_HEADER,
            token.parse().expect("a token is valid metadata"),
        );
    }
    request.set_timeout(Duration::from_secs(20));
    request
}

/// Bootstraps ACLs on `node` (waiting for it to lead) and returns the management secret.
pub(crate) async fn bootstrap(node: &Resd) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match node
            .cluster()
            .await
            .acl_bootstrap(cluster_pb::AclBootstrapRequest {})
            .await
        {
            Ok(reply) => return reply.into_inner().secret,
            Err(status) => {
                assert!(Instant::now() < deadline, "cannot bootstrap: {status:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

pub(crate) fn artist_in(namespace: &str, name: &str) -> Resource {
    Resource {
        id: Some(Id {
            uid: String::new(),
            name: name.into(),
            r#type: Some(proto::resource::v1::Type {
                group: "demo".into(),
                group_version: "v2".into(),
                kind: "Artist".into(),
            }),
            tenancy: Some(Tenancy {
                partition: "default".into(),
                namespace: namespace.into(),
            }),
        }),
        data: Some(proto::to_any(&proto::demo::v2::Artist {
            name: name.into(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

pub(crate) fn cluster_id(kind: &str, name: &str) -> Id {
    Id {
        uid: String::new(),
        name: name.into(),
        r#type: Some(proto::resource::v1::Type {
            group: if kind == "Namespace" {
                "tenancy"
            } else {
                "acl"
            }
            .into(),
            group_version: "v1".into(),
            kind: kind.into(),
        }),
        tenancy: Some(Tenancy::default()),
    }
}

pub(crate) fn policy(name: &str, rules: Vec<acl::Rule>, operator: acl::Access) -> Resource {
    Resource {
        id: Some(cluster_id("Policy", name)),
        data: Some(proto::to_any(&acl::Policy {
            acl: 0,
            join: false,
            description: String::new(),
            rules,
            operator: operator as i32,
        })),
        ..Default::default()
    }
}

pub(crate) fn demo_rule(namespace: &str, access: acl::Access) -> acl::Rule {
    acl::Rule {
        types: vec!["demo.*.*".into()],
        partition: "default".into(),
        namespace: namespace.into(),
        name_prefix: String::new(),
        access: access as i32,
        schema: 0,
    }
}

pub(crate) fn token(name: &str, secret: &str, policies: &[&str], expires_at: &str) -> Resource {
    Resource {
        id: Some(cluster_id("Token", name)),
        data: Some(proto::to_any(&acl::Token {
            description: String::new(),
            policies: policies.iter().map(|p| p.to_string()).collect(),
            expires_at: expires_at.into(),
            secret: secret.into(),
            secret_hash: String::new(),
        })),
        ..Default::default()
    }
}

/// Writes `resource` as `token`. A token written with a secret is waited for until the node
/// resolves it (its token store is a projection of what it applied, and a write answers once the
/// node that took it applied it — within a bounded wait under load), so the next request can use
/// it.
pub(crate) async fn write_as(
    channel: &Channel,
    token: &str,
    resource: Resource,
) -> Result<Resource, tonic::Status> {
    let is_token = resource
        .id
        .as_ref()
        .and_then(|id| id.r#type.as_ref())
        .is_some_and(|t| t.group == "acl" && t.kind == "Token");
    let secret = is_token
        .then_some(resource.data.as_ref())
        .flatten()
        .and_then(|any| acl::Token::decode(any.value.as_slice()).ok())
        .map(|token| token.secret)
        .filter(|secret| !secret.is_empty());
    let stored = ResourceServiceClient::new(channel.clone())
        .write(with_token(
            WriteRequest {
                resource: Some(resource),
            },
            Some(token),
        ))
        .await
        .map(|reply| reply.into_inner().resource.expect("stored"))?;
    if let Some(secret) = secret {
        let deadline = Instant::now() + Duration::from_secs(10);
        while ClusterServiceClient::new(channel.clone())
            .acl_who_am_i(with_token(cluster_pb::AclWhoAmIRequest {}, Some(&secret)))
            .await
            .is_err()
        {
            assert!(
                Instant::now() < deadline,
                "the token written was not resolvable within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(stored)
}

fn rfc3339_in(seconds: i64) -> String {
    (time::OffsetDateTime::now_utc() + time::Duration::seconds(seconds))
        .replace_nanosecond(0)
        .expect("whole seconds")
        .format(&time::format_description::well_known::Rfc3339)
        .expect("format")
}

/// The callers of the matrix, in column order.
const CALLERS: [&str; 7] = [
    "no token",
    "unknown token",
    "expired token",
    "namespace read",
    "namespace write",
    "operator read",
    "management",
];

/// The ACL world of the matrix: a node, its management secret and one secret per caller.
struct World {
    node: Resd,
    channel: Channel,
    management: String,
    secrets: BTreeMap<&'static str, Option<String>>,
}

async fn world() -> World {
    let node = Resd::start_with(&["--acl-enabled"]);
    let management = bootstrap(&node).await;
    let channel = node.channel().await;
    for resource in [
        policy(
            "ns-read",
            vec![demo_rule("default", acl::Access::Read)],
            acl::Access::Unspecified,
        ),
        policy(
            "ns-write",
            vec![demo_rule("default", acl::Access::Write)],
            acl::Access::Unspecified,
        ),
        policy("op-read", Vec::new(), acl::Access::Read),
        token("reader", "reader-secret-0123456789", &["ns-read"], ""),
        token("writer", "writer-secret-0123456789", &["ns-write"], ""),
        token("operator", "operator-secret-0123456789", &["op-read"], ""),
        token(
            "brief",
            "brief-secret-0123456789",
            &["ns-write", "op-read"],
            &rfc3339_in(2),
        ),
        artist_in("default", "miles"),
    ] {
        write_as(&channel, &management, resource)
            .await
            .expect("set up the ACL world");
    }
    let mut secrets = BTreeMap::new();
    secrets.insert("no token", None);
    secrets.insert("unknown token", Some("not-a-token-0123456789".to_owned()));
    secrets.insert("expired token", Some("brief-secret-0123456789".to_owned()));
    secrets.insert(
        "namespace read",
        Some("reader-secret-0123456789".to_owned()),
    );
    secrets.insert(
        "namespace write",
        Some("writer-secret-0123456789".to_owned()),
    );
    secrets.insert(
        "operator read",
        Some("operator-secret-0123456789".to_owned()),
    );
    secrets.insert("management", Some(management.clone()));
    // Let the brief token expire.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    World {
        node,
        channel,
        management,
        secrets,
    }
}

/// Every method of a service in the descriptor set, as `Service/Method`.
fn methods_of(service: &str) -> Vec<String> {
    let set = prost_types::FileDescriptorSet::decode(proto::FILE_DESCRIPTOR_SET)
        .expect("the descriptor set decodes");
    let (package, name) = service.rsplit_once('.').expect("package.Service");
    set.file
        .iter()
        .filter(|file| file.package() == package)
        .flat_map(|file| file.service.iter())
        .filter(|svc| svc.name() == name)
        .flat_map(|svc| svc.method.iter().map(|m| format!("{name}/{}", m.name())))
        .collect()
}

use Code::{
    Aborted, FailedPrecondition, InvalidArgument, NotFound, Ok as Served, PermissionDenied,
    Unauthenticated,
};

/// What each caller gets from each method (columns as [`CALLERS`]).
fn expectations() -> BTreeMap<&'static str, [Code; 7]> {
    const U: Code = Unauthenticated;
    const P: Code = PermissionDenied;
    BTreeMap::from([
        ("ResourceService/Read", [U, U, U, Served, Served, P, Served]),
        (
            "ResourceService/ListHistory",
            [U, U, U, Served, Served, P, Served],
        ),
        ("ResourceService/Write", [U, U, U, P, Served, P, Served]),
        (
            "ResourceService/WriteStatus",
            [U, U, U, P, Served, P, Served],
        ),
        (
            "ResourceService/List",
            [U, U, U, Served, Served, Served, Served],
        ),
        (
            "ResourceService/ListByOwner",
            [U, U, U, Served, Served, Served, Served],
        ),
        ("ResourceService/Delete", [U, U, U, P, Served, P, Served]),
        (
            "ResourceService/WatchList",
            [U, U, U, Served, Served, Served, Served],
        ),
        (
            "ResourceService/MutateAndValidate",
            [U, U, U, P, Served, P, Served],
        ),
        (
            "ClusterService/ListTypes",
            [U, U, U, Served, Served, Served, Served],
        ),
        ("ClusterService/Status", [U, U, U, P, P, Served, Served]),
        ("ClusterService/Members", [U, U, U, P, P, Served, Served]),
        // Past authorization, node 0 is refused as an argument: nothing joins.
        ("ClusterService/Join", [U, U, U, P, P, P, InvalidArgument]),
        ("ClusterService/Remove", [U, U, U, P, P, P, NotFound]),
        // Past authorization: a single node has no one to hand leadership to.
        (
            "ClusterService/TransferLeader",
            [U, U, U, P, P, P, FailedPrecondition],
        ),
        ("ClusterService/SnapshotSave", [U, U, U, P, P, P, Served]),
        // Past authorization, a garbage upload is refused: nothing is restored.
        (
            "ClusterService/SnapshotRestore",
            [U, U, U, P, P, P, InvalidArgument],
        ),
        (
            "ClusterService/ListControllers",
            [U, U, U, P, P, Served, Served],
        ),
        // Open to everyone, once: the world was bootstrapped already.
        ("ClusterService/AclBootstrap", [FailedPrecondition; 7]),
        (
            "ClusterService/AclWhoAmI",
            [U, U, U, Served, Served, Served, Served],
        ),
        // What writing the Type needs: write on it and `schema` write on what it claims.
        ("ClusterService/PlanType", [U, U, U, P, P, P, Served]),
        // What writing the policy needs: write on it and `schema` write on what it matches.
        ("ClusterService/PlanPolicy", [U, U, U, P, P, P, Served]),
        // Any token asks for itself (the answer says yes or no).
        (
            "ClusterService/AclCheck",
            [U, U, U, Served, Served, Served, Served],
        ),
    ])
}

/// The code of a server stream: its opening's, else its first message's.
async fn first_message_code<T>(
    opened: Result<tonic::Response<tonic::Streaming<T>>, tonic::Status>,
) -> Code {
    match opened {
        Err(status) => status.code(),
        Ok(stream) => match stream.into_inner().next().await {
            Some(Ok(_)) => Served,
            Some(Err(status)) => status.code(),
            None => Aborted,
        },
    }
}

/// Opens a watch of every demo.v2.Artist on `channel` as `token`.
async fn watch_artists(
    channel: &Channel,
    token: &str,
) -> Result<tonic::Streaming<pb::WatchEvent>, tonic::Status> {
    ResourceServiceClient::new(channel.clone())
        .watch_list(with_token(
            WatchListRequest {
                r#type: Some(artist_type_v2()),
                tenancy: None,
                name_prefix: String::new(),
                since_version: String::new(),
                ..WatchListRequest::default()
            },
            Some(token),
        ))
        .await
        .map(tonic::Response::into_inner)
}

/// Calls `method` as `token` and returns the code.
async fn call(world: &World, method: &str, token: Option<&str>, round: usize) -> Code {
    let mut resources = ResourceServiceClient::new(world.channel.clone());
    let mut cluster = ClusterServiceClient::new(world.channel.clone());
    let miles = || artist_in("default", "miles").id.expect("an id");
    let code = |result: Result<(), tonic::Status>| match result {
        Ok(()) => Served,
        Err(status) => status.code(),
    };
    match method {
        "ResourceService/Read" => code(
            resources
                .read(with_token(
                    ReadRequest {
                        id: Some(miles()),
                        ..Default::default()
                    },
                    token,
                ))
                .await
                .map(drop),
        ),
        "ResourceService/ListHistory" => code(
            resources
                .list_history(with_token(
                    proto::resource::v1::ListHistoryRequest {
                        id: Some(miles()),
                        ..Default::default()
                    },
                    token,
                ))
                .await
                .map(drop),
        ),
        "ResourceService/Write" => code(
            resources
                .write(with_token(
                    WriteRequest {
                        resource: Some(artist_in("default", &format!("written-{round}"))),
                    },
                    token,
                ))
                .await
                .map(drop),
        ),
        "ResourceService/WriteStatus" => {
            // demo.v1.Artist: no controller writes its statuses, so the version holds.
            let mut target = crate::support::artist("status-target");
            if let Some(id) = target.id.as_mut() {
                id.tenancy = Some(Tenancy {
                    partition: "default".into(),
                    namespace: "default".into(),
                });
            }
            let stored = write_as(&world.channel, &world.management, target)
                .await
                .expect("write the status target");
            code(
                resources
                    .write_status(with_token(
                        WriteStatusRequest {
                            id: stored.id.clone(),
                            version: stored.version.clone(),
                            key: "acl-test".into(),
                            status: Some(pb::Status {
                                observed_generation: stored.generation.clone(),
                                ..Default::default()
                            }),
                        },
                        token,
                    ))
                    .await
                    .map(drop),
            )
        }
        "ResourceService/List" => code(
            resources
                .list(with_token(
                    ListRequest {
                        r#type: Some(artist_type_v2()),
                        tenancy: Some(Tenancy {
                            partition: "default".into(),
                            namespace: "default".into(),
                        }),
                        name_prefix: String::new(),
                        ..ListRequest::default()
                    },
                    token,
                ))
                .await
                .map(drop),
        ),
        "ResourceService/ListByOwner" => code(
            resources
                .list_by_owner(with_token(
                    ListByOwnerRequest {
                        owner: Some(
                            write_as(
                                &world.channel,
                                &world.management,
                                artist_in("default", "miles"),
                            )
                            .await
                            .expect("miles")
                            .id
                            .expect("id"),
                        ),
                        ..ListByOwnerRequest::default()
                    },
                    token,
                ))
                .await
                .map(drop),
        ),
        "ResourceService/Delete" => {
            let name = format!("doomed-{round}");
            let stored = write_as(
                &world.channel,
                &world.management,
                artist_in("default", &name),
            )
            .await
            .expect("a resource to delete");
            code(
                resources
                    .delete(with_token(
                        DeleteRequest {
                            id: stored.id,
                            version: String::new(),
                        },
                        token,
                    ))
                    .await
                    .map(drop),
            )
        }
        "ResourceService/WatchList" => {
            let opened = resources
                .watch_list(with_token(
                    WatchListRequest {
                        r#type: Some(artist_type_v2()),
                        tenancy: None,
                        name_prefix: String::new(),
                        since_version: String::new(),
                        ..WatchListRequest::default()
                    },
                    token,
                ))
                .await;
            first_message_code(opened).await
        }
        "ResourceService/MutateAndValidate" => code(
            resources
                .mutate_and_validate(with_token(
                    MutateAndValidateRequest {
                        resource: Some(artist_in("default", "checked")),
                    },
                    token,
                ))
                .await
                .map(drop),
        ),
        "ClusterService/ListTypes" => code(
            cluster
                .list_types(with_token(cluster_pb::ListTypesRequest::default(), token))
                .await
                .map(drop),
        ),
        "ClusterService/Status" => code(
            cluster
                .status(with_token(cluster_pb::StatusRequest {}, token))
                .await
                .map(drop),
        ),
        "ClusterService/Members" => code(
            cluster
                .members(with_token(cluster_pb::MembersRequest {}, token))
                .await
                .map(drop),
        ),
        "ClusterService/Join" => code(
            cluster
                .join(with_token(
                    cluster_pb::JoinRequest {
                        node_id: 0,
                        api_addr: "127.0.0.1:1".into(),
                        raft_addr: "127.0.0.1:2".into(),
                        from_node: false,
                    },
                    token,
                ))
                .await
                .map(drop),
        ),
        "ClusterService/Remove" => code(
            cluster
                .remove(with_token(
                    cluster_pb::RemoveRequest {
                        node_id: 99,
                        force: false,
                    },
                    token,
                ))
                .await
                .map(drop),
        ),
        "ClusterService/TransferLeader" => code(
            cluster
                .transfer_leader(with_token(
                    cluster_pb::TransferLeaderRequest {
                        to_node_id: 0,
                        campaign: false,
                    },
                    token,
                ))
                .await
                .map(drop),
        ),
        "ClusterService/SnapshotSave" => {
            let opened = cluster
                .snapshot_save(with_token(cluster_pb::SnapshotSaveRequest {}, token))
                .await;
            first_message_code(opened).await
        }
        "ClusterService/SnapshotRestore" => {
            let chunks = tokio_stream::iter(vec![cluster_pb::SnapshotData {
                data: b"not a snapshot at all".to_vec(),
            }]);
            code(
                cluster
                    .snapshot_restore(with_token(chunks, token))
                    .await
                    .map(drop),
            )
        }
        "ClusterService/ListControllers" => code(
            cluster
                .list_controllers(with_token(
                    cluster_pb::ListControllersRequest { all_nodes: false },
                    token,
                ))
                .await
                .map(drop),
        ),
        "ClusterService/AclBootstrap" => code(
            cluster
                .acl_bootstrap(with_token(cluster_pb::AclBootstrapRequest {}, token))
                .await
                .map(drop),
        ),
        "ClusterService/AclWhoAmI" => code(
            cluster
                .acl_who_am_i(with_token(cluster_pb::AclWhoAmIRequest {}, token))
                .await
                .map(drop),
        ),
        "ClusterService/PlanType" => code(
            cluster
                .plan_type(with_token(
                    cluster_pb::PlanTypeRequest {
                        r#type: Some(crate::types::invoice_type_resource(
                            crate::types::INVOICE_PROTO,
                        )),
                    },
                    token,
                ))
                .await
                .map(drop),
        ),
        "ClusterService/PlanPolicy" => code(
            cluster
                .plan_policy(with_token(
                    cluster_pb::PlanPolicyRequest {
                        policy: Some(Resource {
                            id: Some(Id {
                                uid: String::new(),
                                name: "plan".into(),
                                r#type: Some(proto::resource::v1::Type {
                                    group: "policy".into(),
                                    group_version: "v1".into(),
                                    kind: "AdmissionPolicy".into(),
                                }),
                                tenancy: Some(Tenancy::default()),
                            }),
                            data: Some(proto::to_any(&proto::policy::v1::AdmissionPolicy {
                                r#match: Some(proto::policy::v1::Match {
                                    types: vec!["demo.*.*".into()],
                                    ..Default::default()
                                }),
                                validations: vec![proto::policy::v1::Validation {
                                    expression: "true".into(),
                                    message: "always".into(),
                                }],
                                action: proto::policy::v1::Action::Deny as i32,
                                ..Default::default()
                            })),
                            ..Default::default()
                        }),
                    },
                    token,
                ))
                .await
                .map(drop),
        ),
        "ClusterService/AclCheck" => code(
            cluster
                .acl_check(with_token(
                    cluster_pb::AclCheckRequest {
                        id: Some(artist_in("default", "miles").id.expect("id")),
                        verb: "write".into(),
                        token_name: String::new(),
                    },
                    token,
                ))
                .await
                .map(drop),
        ),
        other => panic!("{other} has no call in the ACL matrix: add one"),
    }
}

pub(crate) fn artist_type_v2() -> proto::resource::v1::Type {
    proto::resource::v1::Type {
        group: "demo".into(),
        group_version: "v2".into(),
        kind: "Artist".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_answers_every_kind_of_caller_as_designed() {
    let world = world().await;
    let expected = expectations();
    let mut methods = methods_of("resd.resource.v1.ResourceService");
    methods.extend(methods_of("resd.cluster.v1.ClusterService"));
    assert!(methods.len() >= 18, "{methods:?}");
    let mut wrong = Vec::new();
    for (round, method) in methods.iter().enumerate() {
        let Some(row) = expected.get(method.as_str()) else {
            panic!("{method} is not in the ACL matrix: decide who may call it and add it");
        };
        for (column, caller) in CALLERS.iter().enumerate() {
            let token = world.secrets[caller].as_deref();
            let got = call(&world, method, token, round * 10 + column).await;
            if got != row[column] {
                wrong.push(format!(
                    "{method} as {caller}: expected {:?}, got {got:?}",
                    row[column]
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");

    // Health and reflection stay open.
    let mut health = tonic_health::pb::health_client::HealthClient::new(world.channel.clone());
    health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health needs no token");
    drop(world.node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_acl_input_is_refused_naming_the_field_and_changes_nothing() {
    let node = Resd::start_with(&["--acl-enabled"]);
    let management = bootstrap(&node).await;
    let channel = node.channel().await;
    let refused = |result: Result<Resource, tonic::Status>, code: Code, needle: &str| {
        let status = result.expect_err("refused");
        assert_eq!(status.code(), code, "{status:?}");
        assert!(
            status.message().contains(needle),
            "{needle:?} in {status:?}"
        );
    };
    refused(
        write_as(
            &channel,
            &management,
            policy(
                "bad",
                vec![acl::Rule {
                    types: vec!["demo..".into()],
                    access: 42,
                    ..Default::default()
                }],
                acl::Access::Unspecified,
            ),
        )
        .await,
        InvalidArgument,
        "data.rules[0].access: unknown access 42",
    );
    refused(
        write_as(
            &channel,
            &management,
            token("t", "a-secret-of-enough-length", &["nope"], ""),
        )
        .await,
        InvalidArgument,
        "data.policies[0]",
    );
    refused(
        write_as(
            &channel,
            &management,
            token(
                "t",
                "a-secret-of-enough-length",
                &["global-management"],
                "2001-01-01T00:00:00Z",
            ),
        )
        .await,
        InvalidArgument,
        "in the past",
    );
    refused(
        write_as(
            &channel,
            &management,
            token("t", "short", &["global-management"], ""),
        )
        .await,
        InvalidArgument,
        "data.secret",
    );
    refused(
        write_as(
            &channel,
            &management,
            policy("global-management", Vec::new(), acl::Access::Write),
        )
        .await,
        InvalidArgument,
        "built in",
    );
    // A second bootstrap.
    let second = node
        .cluster()
        .await
        .acl_bootstrap(cluster_pb::AclBootstrapRequest {})
        .await
        .expect_err("once only");
    assert_eq!(second.code(), FailedPrecondition);
    assert!(
        second.message().contains("already bootstrapped"),
        "{second:?}"
    );
    // Empty and oversized token headers.
    for bad in ["", &"x".repeat(10 * 1024)] {
        let status = ClusterServiceClient::new(channel.clone())
            .list_types(with_token(
                cluster_pb::ListTypesRequest::default(),
                Some(bad),
            ))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Unauthenticated, "{status:?}");
    }
    // Secrets are never read back.
    let stored = ResourceServiceClient::new(channel.clone())
        .read(with_token(
            ReadRequest {
                id: Some(cluster_id("Token", "initial-management")),
                ..Default::default()
            },
            Some(&management),
        ))
        .await
        .expect("read the token")
        .into_inner()
        .resource
        .expect("a token");
    let token = acl::Token::decode(stored.data.expect("data").value.as_slice()).expect("decode");
    assert!(token.secret.is_empty(), "{token:?}");
    assert!(token.secret_hash.starts_with("sha256:"), "{token:?}");
    assert!(!token.secret_hash.contains(&management));
    // Nothing was stored by the refusals.
    let policies = ResourceServiceClient::new(channel)
        .list(with_token(
            ListRequest {
                r#type: cluster_id("Policy", "x").r#type,
                tenancy: Some(Tenancy::default()),
                name_prefix: String::new(),
                ..ListRequest::default()
            },
            Some(&management),
        ))
        .await
        .expect("list policies")
        .into_inner()
        .resources;
    assert!(policies.is_empty(), "{policies:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_see_only_what_their_token_reads_and_end_when_it_is_deleted() {
    // Node 1 bootstraps the cluster and its ACLs; nodes 2 and 3 join (with their node
    // certificates; ACLs need TLS).
    let base = tempfile::tempdir().expect("temp dir");
    let ca = crate::process::TestCa::new(3);
    let client = ca.client(Some(("client-test.pem", "client-test-key.pem")));
    let node_args = |node_id: u64, join: Option<(&str, &str)>| {
        let mut args = vec![
            "--node-id".to_owned(),
            node_id.to_string(),
            "--data-dir".to_owned(),
            base.path()
                .join(format!("node{node_id}"))
                .display()
                .to_string(),
            "--api-addr".to_owned(),
            "127.0.0.1:0".to_owned(),
            "--raft-addr".to_owned(),
            format!("127.0.0.1:{}", crate::process::free_port()),
            "--acl-enabled".to_owned(),
        ];
        args.extend(ca.node_flags(node_id));
        match join {
            None => args.push("--bootstrap".to_owned()),
            Some((addr, token)) => args.extend([
                "--join".to_owned(),
                addr.to_owned(),
                "--join-token".to_owned(),
                token.to_owned(),
            ]),
        }
        args
    };
    let secure = |args: Vec<String>| {
        let mut node = Resd::spawn(args);
        node.client_tls = Some(client.clone());
        node
    };
    let first = secure(node_args(1, None));
    let management = bootstrap(&first).await;
    let first_api = first.api_addr.to_string();
    let nodes = [
        first,
        secure(node_args(2, Some((&first_api, &management)))),
        secure(node_args(3, Some((&first_api, &management)))),
    ];
    let channel = nodes[0].channel().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let members = ClusterServiceClient::new(channel.clone())
            .members(with_token(cluster_pb::MembersRequest {}, Some(&management)))
            .await
            .map(|reply| {
                reply
                    .into_inner()
                    .members
                    .iter()
                    .filter(|m| m.voter)
                    .count()
            });
        if members.as_ref().is_ok_and(|voters| *voters == 3) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "3 voters never formed: {members:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let leader = 0;
    for resource in [
        policy(
            "ns-read",
            vec![demo_rule("default", acl::Access::Read)],
            acl::Access::Unspecified,
        ),
        Resource {
            id: Some(Id {
                tenancy: Some(Tenancy {
                    partition: "default".into(),
                    namespace: String::new(),
                }),
                ..cluster_id("Namespace", "hidden")
            }),
            data: Some(proto::to_any(&proto::tenancy::v1::Namespace::default())),
            ..Default::default()
        },
        token("reader", "reader-secret-0123456789", &["ns-read"], ""),
    ] {
        write_as(&channel, &management, resource)
            .await
            .expect("setup");
    }

    // The token works on every node within a second.
    let follower = 2;
    let follower_channel = nodes[follower].channel().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    let started = Instant::now();
    loop {
        let answer = ClusterServiceClient::new(follower_channel.clone())
            .acl_who_am_i(with_token(
                cluster_pb::AclWhoAmIRequest {},
                Some("reader-secret-0123456789"),
            ))
            .await;
        if answer.is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the token never reached node {follower}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );

    // A watch on the follower sees default/default only.
    let mut events = watch_artists(&follower_channel, "reader-secret-0123456789")
        .await
        .expect("the reader may watch");
    let first = events.next().await.expect("an event").expect("ok");
    assert!(
        matches!(first.event, Some(pb::watch_event::Event::EndOfSnapshot(_))),
        "{first:?}"
    );
    write_as(&channel, &management, artist_in("hidden", "ghost"))
        .await
        .expect("hidden write");
    write_as(&channel, &management, artist_in("default", "visible"))
        .await
        .expect("visible write");
    let next = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("an event in time")
        .expect("an event")
        .expect("ok");
    match next.event {
        Some(pb::watch_event::Event::Upsert(upsert)) => {
            let name = upsert.resource.and_then(|r| r.id).map(|id| id.name);
            assert_eq!(
                name.as_deref(),
                Some("visible"),
                "the hidden write was filtered out"
            );
        }
        other => panic!("expected the visible upsert, got {other:?}"),
    }

    // Deleting the token ends the watch with Unauthenticated within a second or so.
    ResourceServiceClient::new(channel.clone())
        .delete(with_token(
            DeleteRequest {
                id: Some(cluster_id("Token", "reader")),
                version: String::new(),
            },
            Some(&management),
        ))
        .await
        .expect("delete the token");
    let deleted_at = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match events.next().await {
                Some(Ok(_)) => continue,
                Some(Err(status)) => return status,
                None => panic!("the watch ended without a status"),
            }
        }
    })
    .await
    .expect("the watch ends");
    assert_eq!(ended.code(), Unauthenticated, "{ended:?}");
    assert!(
        deleted_at.elapsed() < Duration::from_secs(2),
        "{:?}",
        deleted_at.elapsed()
    );
    // A token that expires ends its watch too, with nothing else changing.
    write_as(
        &channel,
        &management,
        token(
            "brief",
            "brief-secret-0123456789",
            &["ns-read"],
            &rfc3339_in(2),
        ),
    )
    .await
    .expect("a brief token");
    let opening = Instant::now();
    let mut brief = loop {
        assert!(
            opening.elapsed() < Duration::from_secs(5),
            "the brief token never worked"
        );
        match watch_artists(&follower_channel, "brief-secret-0123456789").await {
            Ok(stream) => break stream,
            // The follower may not have the new token yet.
            Err(status) if status.code() == Unauthenticated => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(status) => panic!("cannot watch with the brief token: {status:?}"),
        }
    };
    let expired = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match brief.next().await {
                Some(Ok(_)) => continue,
                Some(Err(status)) => return status,
                None => panic!("the watch ended without a status"),
            }
        }
    })
    .await
    .expect("the watch ends when its token expires");
    assert_eq!(expired.code(), Unauthenticated, "{expired:?}");
    assert!(expired.message().contains("expired"), "{expired:?}");

    // Old artists list still works for management, and the cluster serves.
    assert!(
        !list_artists_as(&nodes[leader], &management)
            .await
            .is_empty()
    );
}

async fn list_artists_as(node: &Resd, token: &str) -> Vec<Resource> {
    ResourceServiceClient::new(node.channel().await)
        .list(with_token(
            ListRequest {
                r#type: Some(artist_type_v2()),
                tenancy: Some(Tenancy {
                    partition: "*".into(),
                    namespace: "*".into(),
                }),
                name_prefix: String::new(),
                ..ListRequest::default()
            },
            Some(token),
        ))
        .await
        .expect("list")
        .into_inner()
        .resources
}
