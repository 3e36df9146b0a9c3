//! Types an attacker cannot turn against the platform (the red team's round on runtime types),
//! each against real processes: rules that would freeze every node, schemas that would
//! overflow a stack.

use std::time::{Duration, Instant};

use proto::acl::v1 as acl;
use proto::registry::v1 as registry;
use proto::resource::v1::resource_service_client::ResourceServiceClient;
use proto::resource::v1::{Id, MutateAndValidateRequest, Resource, Tenancy, Type, WriteRequest};
use tonic::Code;

use crate::acl::{policy, token, with_token, write_as};

const BLOB_PROTO: &str = r#"
syntax = "proto3";
package resd.attack.v1;
message Blob {
  repeated string items = 1;
  string blob = 2;
}
"#;

fn gvk(group: &str, version: &str, kind: &str) -> Type {
    Type {
        group: group.into(),
        group_version: version.into(),
        kind: kind.into(),
    }
}

pub(crate) fn type_resource(name: &str, t: registry::Type) -> Resource {
    Resource {
        id: Some(Id {
            name: name.into(),
            r#type: Some(gvk("registry", "v1", "Type")),
            tenancy: Some(Tenancy::default()),
            ..Default::default()
        }),
        data: Some(proto::to_any(&t)),
        ..Default::default()
    }
}

fn blob_type(rules: &[&str]) -> registry::Type {
    registry::Type {
        group: "attack".into(),
        group_version: "v1".into(),
        kind: "Blob".into(),
        scope: registry::Scope::Namespace as i32,
        proto: BLOB_PROTO.into(),
        rules: rules
            .iter()
            .map(|expression| registry::Rule {
                expression: (*expression).into(),
                message: "the blob holds".into(),
                field: String::new(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A Blob's data message, encoded by hand: `items` (field 1) and `blob` (field 2).
fn blob(name: &str, items: usize, blob: &str) -> Resource {
    let mut value = Vec::new();
    for _ in 0..items {
        value.extend_from_slice(&[0x0a, 1, b'a']);
    }
    prost::encoding::string::encode(2, &blob.to_owned(), &mut value);
    Resource {
        id: Some(Id {
            name: name.into(),
            r#type: Some(gvk("attack", "v1", "Blob")),
            tenancy: Some(Tenancy {
                partition: "default".into(),
                namespace: "default".into(),
            }),
            ..Default::default()
        }),
        data: Some(prost_types::Any {
            type_url: "type.googleapis.com/resd.attack.v1.Blob".into(),
            value,
        }),
        ..Default::default()
    }
}

/// Attack: a rule nesting `.all()` over literal lists (accepted at registration, then six
/// MutateAndValidate calls from a token with no rights froze every node). Now its worst case is
/// estimated and the Type refused; the costliest rules that are accepted run on the bounded
/// pool, only for callers who may write, and health and a management write answer within 2 s
/// on every node of a 3-node TLS + ACL cluster while writers keep that pool full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costly_rules_are_refused_or_bounded_and_the_cluster_stays_healthy() {
    let (_ca, cluster) = crate::mtls::tls_cluster(3, &["--acl-enabled"]).await;
    let leader = cluster.wait_for_leader().await;
    let management = cluster.harness_token.clone().expect("bootstrapped");
    let channel = cluster.nodes[leader].channel().await;

    // Three levels of 300-element literal lists: 27 million iterations, refused by name.
    let list = format!(
        "[{}]",
        (0..300)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    let nested = format!("{list}.all(a, {list}.all(b, {list}.all(c, a + b + c >= 0)))");
    let refused = write_as(
        &channel,
        &management,
        type_resource("attack-blob", blob_type(&[&nested])),
    )
    .await
    .expect_err("a rule over budget is refused");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("over the budget"), "{refused:?}");
    // A pattern taken from the data is refused too.
    let refused = write_as(
        &channel,
        &management,
        type_resource(
            "attack-blob",
            blob_type(&["self.blob.matches(self.items[0])"]),
        ),
    )
    .await
    .expect_err("a pattern from data is refused");
    assert!(refused.message().contains("string literal"), "{refused:?}");

    // The costliest kind of rule the estimate accepts: a pass over the largest list.
    write_as(
        &channel,
        &management,
        type_resource(
            "attack-blob",
            blob_type(&[
                "self.items.all(x, x.matches('^[a-z]+$'))",
                "self.items.exists(x, x == 'b') || self.blob.matches('^[a-z]*$')",
            ]),
        ),
    )
    .await
    .expect("a linear rule is accepted");
    // A writer of attack.*, and a token that may read nothing.
    let writer = acl::Rule {
        types: vec!["attack.*.*".into()],
        partition: "*".into(),
        namespace: "*".into(),
        name_prefix: String::new(),
        access: acl::Access::Write as i32,
        schema: 0,
    };
    write_as(
        &channel,
        &management,
        policy("attackers", vec![writer], acl::Access::Deny),
    )
    .await
    .expect("policy");
    write_as(
        &channel,
        &management,
        policy("nothing", vec![], acl::Access::Deny),
    )
    .await
    .expect("policy");
    write_as(
        &channel,
        &management,
        token("attacker", "attacker-secret-1", &["attackers"], ""),
    )
    .await
    .expect("token");
    write_as(
        &channel,
        &management,
        token("nobody", "nobody-secret-12", &["nothing"], ""),
    )
    .await
    .expect("token");

    // No rights: refused before anything of the rule runs.
    let heavy = blob("heavy", 300_000, "abc");
    let started = Instant::now();
    let denied = ResourceServiceClient::new(channel.clone())
        .mutate_and_validate(with_token(
            MutateAndValidateRequest {
                resource: Some(heavy.clone()),
            },
            Some("nobody-secret-12"),
        ))
        .await
        .expect_err("no rights");
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert!(started.elapsed() < Duration::from_secs(2));

    // Writers keep the rule pool of every node busy for a while.
    let stop = Instant::now() + Duration::from_secs(6);
    let mut attackers = Vec::new();
    for (i, node) in cluster.nodes.iter().enumerate() {
        for j in 0..3 {
            let channel = node.channel().await;
            let heavy = blob(&format!("heavy-{i}-{j}"), 300_000, "abc");
            attackers.push(tokio::spawn(async move {
                let mut calls = 0u32;
                while Instant::now() < stop && calls < 200 {
                    calls += 1;
                    let _ = ResourceServiceClient::new(channel.clone())
                        .mutate_and_validate(with_token(
                            MutateAndValidateRequest {
                                resource: Some(heavy.clone()),
                            },
                            Some("attacker-secret-1"),
                        ))
                        .await;
                }
                calls
            }));
        }
    }
    // Meanwhile: health and a management write on every node, each within 2 s.
    let mut slowest = Duration::ZERO;
    let mut round = 0;
    while Instant::now() < stop && round < 20 {
        round += 1;
        for (i, node) in cluster.nodes.iter().enumerate() {
            let started = Instant::now();
            let mut health =
                tonic_health::pb::health_client::HealthClient::new(node.channel().await);
            let mut request = tonic::Request::new(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            });
            request.set_timeout(Duration::from_secs(2));
            health
                .check(request)
                .await
                .expect("health answers within 2 s");
            let mut write = with_token(
                WriteRequest {
                    resource: Some(crate::acl::artist_in("default", &format!("probe-{i}"))),
                },
                Some(&management),
            );
            write.set_timeout(Duration::from_secs(2));
            ResourceServiceClient::new(node.channel().await)
                .write(write)
                .await
                .expect("a management write answers within 2 s");
            slowest = slowest.max(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut calls = 0;
    for attacker in attackers {
        calls += attacker.await.expect("attacker");
    }
    assert!(calls > 9, "the attackers ran ({calls} calls)");
    eprintln!("{round} rounds of probes; slowest {slowest:?}; {calls} attacking calls");

    // The rule is enforced, not skipped: a blob that breaks it is refused.
    let broken = blob("broken", 10, "ABC");
    let refused = write_as(&channel, "attacker-secret-1", {
        let mut b = broken;
        if let Some(data) = b.data.as_mut() {
            data.value.extend_from_slice(&[0x0a, 1, b'B']);
        }
        b
    })
    .await
    .expect_err("breaks the rule");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
}

/// Attack: a 6.4 KB schema whose custom option value nests 2,000 levels overflowed a worker's
/// stack in the compiler and killed the node (a dry run was enough). Now it is refused before
/// the compiler runs, and the node lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_nesting_thousands_of_levels_is_refused_and_the_node_lives() {
    let node = crate::process::Resd::start();
    let levels = 2000;
    let proto = format!(
        "syntax = \"proto3\";\npackage resd.attack.v1;\nimport \"google/protobuf/descriptor.proto\";\nmessage Deep {{ Deep d = 1; }}\nextend google.protobuf.MessageOptions {{ Deep deep = 50000; }}\nmessage Blob {{ option (deep) = {}{{}}{}; string s = 1; }}\n",
        "{ d: ".repeat(levels),
        "}".repeat(levels)
    );
    let t = registry::Type {
        proto,
        rules: Vec::new(),
        ..blob_type(&[])
    };
    for dry_run in [true, false] {
        let resource = type_resource("attack-deep", t.clone());
        let refused = if dry_run {
            node.resources()
                .await
                .mutate_and_validate(MutateAndValidateRequest {
                    resource: Some(resource),
                })
                .await
                .map(drop)
        } else {
            node.resources()
                .await
                .write(WriteRequest {
                    resource: Some(resource),
                })
                .await
                .map(drop)
        }
        .expect_err("refused");
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(
            refused.message().contains("nests more than 32"),
            "{refused:?}"
        );
    }
    let mut health = tonic_health::pb::health_client::HealthClient::new(node.channel().await);
    health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("the node lives");
}

/// A team's policy: write on its own Types (named `<team>-…`) and on its group's resources,
/// and ownership (`schema` write) of its group.
fn team_policy(team: &str) -> Resource {
    policy(
        &format!("team-{team}"),
        vec![
            acl::Rule {
                types: vec!["registry.v1.Type".into()],
                partition: "*".into(),
                namespace: "*".into(),
                name_prefix: format!("{team}-"),
                access: acl::Access::Write as i32,
                schema: 0,
            },
            acl::Rule {
                types: vec![format!("{team}.*.*")],
                partition: "*".into(),
                namespace: "*".into(),
                name_prefix: String::new(),
                access: acl::Access::Write as i32,
                schema: acl::Access::Write as i32,
            },
        ],
        acl::Access::Deny,
    )
}

fn invoice_type(group: &str) -> registry::Type {
    registry::Type {
        group: group.into(),
        group_version: "v1".into(),
        kind: "Invoice".into(),
        scope: registry::Scope::Namespace as i32,
        proto: format!(
            "syntax = \"proto3\";\npackage resd.{group}.v1;\nmessage Invoice {{ int64 amount_cents = 1; string currency = 2; }}\n"
        ),
        ..Default::default()
    }
}

/// Attack: a token allowed to write Types named `teama-*` registered `teamb.v1.Invoice`, so
/// team B's own registration was refused, and team A set defaults on (and, deleting its Type,
/// deleted) team B's invoices. Now a Type is written only by who holds `schema` write on what
/// it claims: neither a Type name, operator access nor a default policy of allow grants it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_team_cannot_claim_another_teams_group() {
    let node =
        crate::process::Resd::start_with(&["--acl-enabled", "--acl-default-policy", "allow"]);
    let management = crate::acl::bootstrap(&node).await;
    let channel = node.channel().await;
    for team in ["teama", "teamb"] {
        write_as(&channel, &management, team_policy(team))
            .await
            .expect("policy");
        write_as(
            &channel,
            &management,
            token(
                team,
                &format!("{team}-secret-0123"),
                &[&format!("team-{team}")],
                "",
            ),
        )
        .await
        .expect("token");
    }
    let operator = policy("operators", Vec::new(), acl::Access::Write);
    write_as(&channel, &management, operator)
        .await
        .expect("policy");
    write_as(
        &channel,
        &management,
        token("ops", "ops-secret-01234", &["operators"], ""),
    )
    .await
    .expect("token");

    // Team A squats team B's group under a name of its own: refused, naming what it lacks.
    let squat = write_as(
        &channel,
        "teama-secret-0123",
        type_resource("teama-invoice", invoice_type("teamb")),
    )
    .await
    .expect_err("squatting is refused");
    assert_eq!(squat.code(), Code::PermissionDenied, "{squat:?}");
    assert!(
        squat.message().contains("schema write on teamb.v1.Invoice"),
        "{squat:?}"
    );
    // Nor through a dry run.
    let dry = ResourceServiceClient::new(channel.clone())
        .mutate_and_validate(with_token(
            MutateAndValidateRequest {
                resource: Some(type_resource("teama-invoice", invoice_type("teamb"))),
            },
            Some("teama-secret-0123"),
        ))
        .await
        .expect_err("refused");
    assert_eq!(dry.code(), Code::PermissionDenied, "{dry:?}");
    // Operator write with a default policy of allow grants no ownership either.
    let ops = write_as(
        &channel,
        "ops-secret-01234",
        type_resource("ops-invoice", invoice_type("teamb")),
    )
    .await
    .expect_err("operators own no group");
    assert_eq!(ops.code(), Code::PermissionDenied, "{ops:?}");

    // Each team registers its own group.
    write_as(
        &channel,
        "teamb-secret-0123",
        type_resource("teamb-invoice", invoice_type("teamb")),
    )
    .await
    .expect("team B owns teamb");
    write_as(
        &channel,
        "teama-secret-0123",
        type_resource("teama-invoice", invoice_type("teama")),
    )
    .await
    .expect("team A owns teama");
    // Team A cannot change or delete team B's Type, even where it may write the Type resource.
    let mut widened = team_policy("teama");
    if let Some(data) = widened.data.as_mut() {
        let mut p: acl::Policy = prost::Message::decode(data.value.as_slice()).expect("policy");
        p.rules[0].name_prefix = String::new();
        *data = proto::to_any(&p);
    }
    write_as(&channel, &management, widened)
        .await
        .expect("policy");
    let mut changed = invoice_type("teamb");
    changed.description = "mine now".into();
    let refused = write_as(
        &channel,
        "teama-secret-0123",
        type_resource("teamb-invoice", changed),
    )
    .await
    .expect_err("not team A's");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    let refused = ResourceServiceClient::new(channel.clone())
        .delete(with_token(
            proto::resource::v1::DeleteRequest {
                id: type_resource("teamb-invoice", invoice_type("teamb")).id,
                version: String::new(),
            },
            Some("teama-secret-0123"),
        ))
        .await
        .expect_err("not team A's to delete");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");

    // Nobody grants ownership they lack: team A cannot hand teamb.* to a policy it writes
    // (it lacks acl write anyway; management's tokens may).
    let ok = write_as(&channel, &management, team_policy("teamc")).await;
    assert!(ok.is_ok(), "{ok:?}");
}

/// A channel to `node` whose connections come from `source` (another loopback address).
async fn channel_from(node: &crate::process::Resd, source: [u8; 4]) -> tonic::transport::Channel {
    let target = node.api_addr;
    let connector = tower::service_fn(move |_: http::Uri| async move {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(std::net::SocketAddr::from((source, 0)))?;
        let stream = socket.connect(target).await?;
        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
    });
    node.endpoint()
        .connect_with_connector(connector)
        .await
        .expect("connects")
}

/// Attack: 8 threads of made-up tokens (of a chosen secret's shape, each costing a slow hash)
/// made a management token with a chosen secret fail every call for 30 s ("checking too many
/// unrecognised tokens"). Now unrecognised tokens spend their address's budget: the flood is
/// refused and the known token, sent from elsewhere, is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unknown_tokens_does_not_lock_out_a_known_one() {
    let node = crate::process::Resd::start_with(&["--acl-enabled"]);
    let management = crate::acl::bootstrap(&node).await;
    let channel = node.channel().await;
    // A management token with a chosen secret, never used on this node yet.
    ResourceServiceClient::new(channel.clone())
        .write(with_token(
            WriteRequest {
                resource: Some(token(
                    "chosen-management",
                    "correct-horse-battery-staple",
                    &["global-management"],
                    "",
                )),
            },
            Some(&management),
        ))
        .await
        .expect("token");

    let stop = Instant::now() + Duration::from_secs(8);
    let mut flood = Vec::new();
    for worker in 0..8 {
        let channel = channel_from(&node, [127, 0, 0, 2]).await;
        flood.push(tokio::spawn(async move {
            let (mut refused, mut calls) = (0u32, 0u32);
            while Instant::now() < stop && calls < 5000 {
                calls += 1;
                let made_up = format!("made-up-secret-{worker}-{calls}");
                let result = ResourceServiceClient::new(channel.clone())
                    .read(with_token(
                        proto::resource::v1::ReadRequest {
                            id: crate::acl::artist_in("default", "x").id,
                            ..Default::default()
                        },
                        Some(&made_up),
                    ))
                    .await;
                refused += u32::from(result.is_err());
            }
            (refused, calls)
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (mut served, mut asked) = (0u32, 0u32);
    while Instant::now() < stop && asked < 40 {
        asked += 1;
        let mut request = with_token(
            WriteRequest {
                resource: Some(crate::acl::artist_in("default", &format!("probe-{asked}"))),
            },
            Some("correct-horse-battery-staple"),
        );
        request.set_timeout(Duration::from_secs(2));
        match ResourceServiceClient::new(channel.clone())
            .write(request)
            .await
        {
            Ok(_) => served += 1,
            Err(status) => eprintln!("refused: {status:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (mut refused, mut calls) = (0, 0);
    for worker in flood {
        let (r, c) = worker.await.expect("flood");
        refused += r;
        calls += c;
    }
    eprintln!("management served {served} of {asked}; the flood refused {refused} of {calls}");
    assert!(calls > 100, "the flood ran ({calls} calls)");
    assert_eq!(refused, calls, "no made-up token was accepted");
    assert!(
        served * 10 >= asked * 9,
        "the known token was served {served} times of {asked}"
    );
}

fn report(name: &str, data: proto::coordination::v1::Replica) -> Resource {
    Resource {
        id: Some(Id {
            name: name.into(),
            r#type: Some(gvk("coordination", "v1", "Replica")),
            tenancy: Some(Tenancy {
                partition: "default".into(),
                namespace: "default".into(),
            }),
            ..Default::default()
        }),
        data: Some(proto::to_any(&data)),
        ..Default::default()
    }
}

/// Attack: a tenant's Replica report claimed the built-in `type` controller and its finalizer,
/// with `report_every_seconds: 4294967295` and an identity holding ANSI escapes: it was shown
/// as holding the lease, blamed by `delete --wait`, never went stale and cleared the operator's
/// terminal. Now a report is a claim the server checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_controller_reports_are_refused() {
    let node = crate::process::Resd::start_with(&["--acl-enabled"]);
    let management = crate::acl::bootstrap(&node).await;
    let channel = node.channel().await;
    let rule = |types: &str| acl::Rule {
        types: vec![types.into()],
        partition: "*".into(),
        namespace: "*".into(),
        name_prefix: String::new(),
        access: acl::Access::Write as i32,
        schema: 0,
    };
    write_as(
        &channel,
        &management,
        policy(
            "reporters",
            vec![rule("coordination.v1.Replica"), rule("demo.*.*")],
            acl::Access::Deny,
        ),
    )
    .await
    .expect("policy");
    write_as(
        &channel,
        &management,
        token("tenant", "tenant-secret-012", &["reporters"], ""),
    )
    .await
    .expect("token");
    let honest = proto::coordination::v1::Replica {
        controller: "artist-sync".into(),
        identity: "artist-sync-1".into(),
        host: "host-a".into(),
        managed_type: Some(gvk("demo", "v2", "Artist")),
        finalizers: vec!["demo.example.com/sync".into()],
        report_every_seconds: 10,
        ..Default::default()
    };
    let cases: Vec<(&str, proto::coordination::v1::Replica, Code, &str)> = vec![
        (
            "built-in controller",
            proto::coordination::v1::Replica {
                controller: "type".into(),
                managed_type: Some(gvk("registry", "v1", "Type")),
                finalizers: vec!["registry.resd.io/type-cleanup".into()],
                ..honest.clone()
            },
            Code::PermissionDenied,
            "built into the server",
        ),
        (
            "another group's finalizer",
            proto::coordination::v1::Replica {
                finalizers: vec!["registry.resd.io/type-cleanup".into()],
                ..honest.clone()
            },
            Code::PermissionDenied,
            "not under a domain of group demo",
        ),
        (
            "a type it may not write",
            proto::coordination::v1::Replica {
                managed_type: Some(gvk("registry", "v1", "Type")),
                finalizers: Vec::new(),
                ..honest.clone()
            },
            Code::PermissionDenied,
            "types its token may write",
        ),
        (
            "an interval of 136 years",
            proto::coordination::v1::Replica {
                report_every_seconds: u32::MAX,
                ..honest.clone()
            },
            Code::InvalidArgument,
            "at least every 300 seconds",
        ),
        (
            "escapes in its identity",
            proto::coordination::v1::Replica {
                identity: "\u{1b}[2J\u{1b}[Hroot".into(),
                ..honest.clone()
            },
            Code::InvalidArgument,
            "control characters",
        ),
    ];
    for (what, data, code, says) in cases {
        let refused = write_as(&channel, "tenant-secret-012", report("forged", data))
            .await
            .expect_err(what);
        assert_eq!(refused.code(), code, "{what}: {refused:?}");
        assert!(refused.message().contains(says), "{what}: {refused:?}");
    }
    // Not even the management token may claim a controller the server runs itself.
    let refused = write_as(
        &channel,
        &management,
        report(
            "forged-by-management",
            proto::coordination::v1::Replica {
                controller: "reaper".into(),
                managed_type: Some(gvk("demo", "v2", "Artist")),
                finalizers: Vec::new(),
                ..honest.clone()
            },
        ),
    )
    .await
    .expect_err("management claims the reaper");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("built into the server"),
        "{refused:?}"
    );
    write_as(&channel, "tenant-secret-012", report("honest", honest))
        .await
        .expect("an honest report is accepted");
}

/// The resident memory of a process, in bytes (Linux).
fn rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// A Type of `fields` fields, each named with `pad` more characters.
fn wide_type(group: &str, fields: usize, pad: usize) -> registry::Type {
    let padding = "x".repeat(pad);
    let body: String = (1..=fields)
        .map(|i| {
            // 19000-19999 are reserved by protobuf.
            let number = if i >= 19_000 { i + 1000 } else { i };
            format!("int64 f{padding}{i}={number};\n")
        })
        .collect();
    registry::Type {
        group: group.into(),
        group_version: "v1".into(),
        kind: "Wide".into(),
        scope: registry::Scope::Namespace as i32,
        proto: format!(
            "syntax = \"proto3\";\npackage resd.{group}.v1;\nmessage Wide {{\n{body}}}\n"
        ),
        ..Default::default()
    }
}

/// Attack: five Types of 40,000 fields (938 KB each) took every node from 26 MB to 1.1 GB;
/// one ListTypes took it to 1.77 GB and 7.6 s, and each later Type write took 5-13 s. Now a
/// schema has at most 10,000 fields, and the most a tenant can register that way grows a node
/// by less than 256 MiB, with ListTypes and Type writes staying cheap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn field_bloat_is_refused_and_what_is_allowed_stays_cheap() {
    let node = crate::process::Resd::start();
    let pid = node.pid().expect("running");
    let refused = node
        .resources()
        .await
        .write(WriteRequest {
            resource: Some(type_resource("bloat", wide_type("bloat", 40_000, 0))),
        })
        .await
        .expect_err("40,000 fields");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("at most 10000"), "{refused:?}");

    let before = rss_of(pid);
    let mut slowest_write = Duration::ZERO;
    for i in 0..5 {
        let started = Instant::now();
        node.resources()
            .await
            .write(WriteRequest {
                resource: Some(type_resource(
                    &format!("wide-{i}"),
                    wide_type(&format!("wide{i}"), 10_000, 70),
                )),
            })
            .await
            .expect("10,000 fields are allowed");
        slowest_write = slowest_write.max(started.elapsed());
    }
    let mut slowest_list = Duration::ZERO;
    for _ in 0..3 {
        let started = Instant::now();
        node.cluster()
            .await
            .max_decoding_message_size(256 << 20)
            .list_types(proto::cluster::v1::ListTypesRequest::default())
            .await
            .expect("types");
        slowest_list = slowest_list.max(started.elapsed());
    }
    // What the allocator still holds of the garbage made meanwhile is returned within its
    // decay time (10 s, later on a machine busy with other tests): the growth that counts is
    // what stays, the least seen over the next half minute.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut grown = u64::MAX;
    for _ in 0..30 {
        grown = grown.min(rss_of(pid).saturating_sub(before));
        if grown < 256 << 20 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!(
        "RSS grew {} MiB; slowest Type write {slowest_write:?}; slowest ListTypes {slowest_list:?}",
        grown >> 20
    );
    assert!(grown < 256 << 20, "RSS grew {} MiB", grown >> 20);
}

/// `--max-schema-bytes` bounds the descriptors of every registered Type together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_past_max_schema_bytes_are_refused() {
    let node = crate::process::Resd::start_with(&["--max-schema-bytes", "60000"]);
    let write = |resource: Resource| {
        let node = &node;
        async move {
            node.resources()
                .await
                .write(WriteRequest {
                    resource: Some(resource),
                })
                .await
        }
    };
    write(type_resource("small", wide_type("small", 100, 0)))
        .await
        .expect("fits");
    let refused = write(type_resource("large", wide_type("large", 2000, 10)))
        .await
        .expect_err("over --max-schema-bytes");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("--max-schema-bytes"),
        "{refused:?}"
    );
}

/// ListTypes pages: every type once, in order, each page with the descriptors its types need
/// (and only those), the unpaged answer unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_types_pages_carry_what_their_types_need() {
    let node = crate::process::Resd::start();
    for i in 0..3 {
        node.resources()
            .await
            .write(WriteRequest {
                resource: Some(type_resource(
                    &format!("wide-{i}"),
                    wide_type(&format!("wide{i}"), 20, 0),
                )),
            })
            .await
            .expect("Type");
    }
    let everything = node
        .cluster()
        .await
        .list_types(proto::cluster::v1::ListTypesRequest::default())
        .await
        .expect("types")
        .into_inner();
    assert!(everything.next_page_token.is_empty());
    let mut paged = Vec::new();
    let mut token = String::new();
    for _ in 0..100 {
        let page = node
            .cluster()
            .await
            .list_types(proto::cluster::v1::ListTypesRequest {
                page_size: 4,
                page_token: token.clone(),
            })
            .await
            .expect("page")
            .into_inner();
        assert!(page.types.len() <= 4);
        let pool = prost_reflect::DescriptorPool::decode(page.file_descriptor_set.as_ref())
            .expect("a page's descriptors make a pool");
        for info in &page.types {
            assert!(
                pool.get_message_by_name(&info.message_name).is_some(),
                "{} is described on its page",
                info.message_name
            );
        }
        assert!(page.file_descriptor_set.len() < everything.file_descriptor_set.len());
        paged.extend(page.types);
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert!(token.is_empty(), "the pages end");
    assert_eq!(paged, everything.types);
}

/// A page of ListTypes is bounded in descriptor bytes as well as in types: six Types of about
/// 400 KB of descriptors each come in more than one page of 500, none much over 2 MiB (a page
/// of 500 such Types was up to the whole registry, ~64 MiB at the default limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_types_pages_are_bounded_in_bytes() {
    let node = crate::process::Resd::start();
    for i in 0..6 {
        node.resources()
            .await
            .write(WriteRequest {
                resource: Some(type_resource(
                    &format!("heavy-{i}"),
                    wide_type(&format!("heavy{i}"), 8_000, 30),
                )),
            })
            .await
            .expect("Type");
    }
    let (mut pages, mut heavy, mut token) = (0, 0, String::new());
    for _ in 0..100 {
        let page = node
            .cluster()
            .await
            .list_types(proto::cluster::v1::ListTypesRequest {
                page_size: 500,
                page_token: token.clone(),
            })
            .await
            .expect("page")
            .into_inner();
        pages += 1;
        assert!(
            page.file_descriptor_set.len() < (2 << 20) + (600 << 10),
            "a page of {} bytes",
            page.file_descriptor_set.len()
        );
        heavy += page
            .types
            .iter()
            .filter(|info| info.message_name.contains(".heavy"))
            .count();
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert!(pages >= 2, "{pages} pages");
    assert_eq!(heavy, 6, "every Type once");
}
