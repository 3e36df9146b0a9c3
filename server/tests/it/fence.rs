//! DESIGN §15's fence, raced on real 3-node clusters: once a change to a Type, a token or the
//! whole state (a restore) is acknowledged, no write checked under what it replaced is stored,
//! on any node; and every snapshot saved meanwhile restores. Each race is repeated (bounded);
//! `RESD_FENCE_ROUNDS` runs more rounds.

use std::time::{Duration, Instant};

use proto::registry::v1 as registry;
use proto::resource::v1::{DeleteRequest, Id, Tenancy};
use tonic::Code;

use crate::process::Cluster;
use crate::support::{restore, save_snapshot};
use crate::types::{INVOICE_PROTO, invoice, invoice_type_resource, read, type_of, write};

/// A refusal that says nothing of the rules: a lost race, a leader changing, a deadline.
fn transient(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        Code::Aborted | Code::Unavailable | Code::DeadlineExceeded
    ) || proto::reason::of(status)
        .is_some_and(|details| details.reason == proto::reason::Reason::NotLeader)
}

/// Hands the cluster's leadership to another voter (through `node`), waiting for it.
async fn change_leader(node: &crate::process::Resd, token: Option<&str>) {
    let mut request = tonic::Request::new(proto::cluster::v1::TransferLeaderRequest {
        to_node_id: 0,
        campaign: false,
    });
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert(proto::TOKEN_HEADER, token.parse().expect("metadata"));
    }
    node.cluster()
        .await
        .transfer_leader(request)
        .await
        .expect("the leadership moves");
}

/// The version of the first event of `watch` that `wanted` picks (within 10 s each).
async fn watched(
    watch: &mut tonic::Streaming<proto::resource::v1::WatchEvent>,
    what: &str,
    wanted: impl Fn(&proto::resource::v1::watch_event::Event) -> bool,
) -> (u64, u32) {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.message())
            .await
            .unwrap_or_else(|_| panic!("{what} is watched"))
            .expect("the watch")
            .expect("an event");
        if event.event.as_ref().is_some_and(&wanted) {
            return version(&event.version);
        }
    }
}

/// Rounds of each race (more with `RESD_FENCE_ROUNDS`).
fn rounds(default: usize) -> usize {
    std::env::var("RESD_FENCE_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// A version as `(index, position)`, ordered as the server orders them.
fn version(text: &str) -> (u64, u32) {
    match text.split_once('.') {
        Some((index, position)) => (
            index.parse().expect("a version's index"),
            position.parse().expect("a version's position"),
        ),
        None => (text.parse().expect("a version"), 0),
    }
}

fn type_id() -> Id {
    invoice_type_resource(INVOICE_PROTO)
        .id
        .expect("the Type's id")
}

/// The invoice Type with or without the rule `amount_cents <= 1000`, written over its stored
/// version through `node` (the type controller writes the Type's status too: a lost race is
/// tried again). Returns the version the change was stored at.
async fn set_strict(node: &crate::process::Resd, strict: bool) -> (u64, u32) {
    for _ in 0..50 {
        let mut stored = read(node, type_id()).await.expect("the Type");
        if let Some(data) = stored.data.as_mut() {
            let mut t: registry::Type =
                prost::Message::decode(data.value.as_slice()).expect("a Type");
            t.rules
                .retain(|rule| rule.field != "amount_cents" || !rule.expression.contains("<="));
            if strict {
                t.rules.push(registry::Rule {
                    expression: "self.amount_cents <= 1000".into(),
                    message: "invoices are at most 10 euros now".into(),
                    field: "amount_cents".into(),
                });
            }
            t.descriptor_set.clear();
            *data = proto::to_any(&t);
        }
        match write(node, stored).await {
            Ok(written) => return version(&written.version),
            // A lost race with the type controller's status, or a leader changing.
            Err(status) if transient(&status) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            Err(status) => panic!("the Type does not change: {status:?}"),
        }
    }
    panic!("the Type kept changing under 50 writes");
}

/// A rule change is acknowledged, then a write through another node is judged by it, at once
/// and every time; and writers racing the changes on every node never get a write stored
/// under a rule that was replaced before the write was stored. Before the fence, 18–25 of 50
/// rounds stored a 5,000-cent invoice right after the 1,000-cent limit was acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_write_is_stored_under_a_rule_replaced_before_it_was_acknowledged() {
    let cluster = Cluster::start(3, &[]).await;
    write(&cluster.nodes[0], invoice_type_resource(INVOICE_PROTO))
        .await
        .expect("the Type");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = tokio::task::JoinSet::new();
    for (index, node) in cluster.nodes.iter().enumerate() {
        for lane in 0..2 {
            let channel = node.channel().await;
            let stop = stop.clone();
            writers.spawn(async move {
                let mut client =
                    proto::resource::v1::resource_service_client::ResourceServiceClient::new(
                        channel,
                    );
                let mut stored = Vec::new();
                let mut refused = 0;
                for n in 0..100_000 {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let name = format!("w{index}-{lane}-{n}");
                    match client
                        .write(proto::resource::v1::WriteRequest {
                            resource: Some(invoice(&name, 5000)),
                        })
                        .await
                    {
                        Ok(reply) => {
                            let written = reply.into_inner().resource.expect("resource");
                            stored.push((version(&written.version), name));
                        }
                        Err(status)
                            if status.code() == Code::InvalidArgument || transient(&status) =>
                        {
                            refused += 1
                        }
                        Err(status) => panic!("{name}: {status:?}"),
                    }
                }
                (stored, refused)
            });
        }
    }

    let mut changes = Vec::new();
    for round in 0..rounds(50) {
        if round % 10 == 5 {
            // A leader change in the middle of the race.
            change_leader(&cluster.nodes[round % 3], None).await;
        }
        let strict = round % 2 == 0;
        let by = &cluster.nodes[round % 3];
        let at = set_strict(by, strict).await;
        changes.push((at, strict));
        // At once, through another node: judged by the rule just acknowledged.
        let probe = &cluster.nodes[(round + 1) % 3];
        let mut result = write(probe, invoice(&format!("probe-{round}"), 5000)).await;
        for _ in 0..50 {
            match &result {
                Err(status) if transient(status) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    result = write(probe, invoice(&format!("probe-{round}"), 5000)).await;
                }
                _ => break,
            }
        }
        match (strict, result) {
            (true, Err(status)) => {
                assert_eq!(
                    status.code(),
                    Code::InvalidArgument,
                    "round {round}: {status:?}"
                )
            }
            (true, Ok(stored)) => panic!(
                "round {round}: stored at {} under a limit acknowledged at {at:?}",
                stored.version
            ),
            (false, Ok(_)) => {}
            (false, Err(status)) => {
                panic!("round {round}: refused under a limit removed at {at:?}: {status:?}")
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut stored = Vec::new();
    let mut refused = 0;
    while let Some(joined) = writers.join_next().await {
        let (more, more_refused) = joined.expect("a writer");
        stored.extend(more);
        refused += more_refused;
    }
    // Each stored write: the last rule change before its version must have allowed it.
    let mut violations = Vec::new();
    for (at, name) in &stored {
        let in_force = changes
            .iter()
            .filter(|(changed, _)| changed < at)
            .max_by_key(|(changed, _)| *changed)
            .is_some_and(|(_, strict)| *strict);
        if in_force {
            violations.push(format!("{name} at {at:?}"));
        }
    }
    assert!(
        violations.is_empty(),
        "{} of {} racing writes stored under the 1,000-cent limit: {violations:?}",
        violations.len(),
        stored.len()
    );
    assert!(
        !stored.is_empty() && refused > 0,
        "the race ran both ways: {} stored, {refused} refused",
        stored.len()
    );
}

/// Writers of invoices on every node, until `stop`: the version of each invoice stored.
fn invoice_writers(
    channels: Vec<tonic::transport::Channel>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    prefix: String,
) -> tokio::task::JoinSet<Vec<(u64, u32)>> {
    let mut writers = tokio::task::JoinSet::new();
    for (index, channel) in channels.into_iter().enumerate() {
        let (stop, prefix) = (stop.clone(), prefix.clone());
        writers.spawn(async move {
            let mut client =
                proto::resource::v1::resource_service_client::ResourceServiceClient::new(channel);
            let mut stored = Vec::new();
            for n in 0..100_000 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                if let Ok(reply) = client
                    .write(proto::resource::v1::WriteRequest {
                        resource: Some(invoice(&format!("{prefix}-{index}-{n}"), 10)),
                    })
                    .await
                {
                    stored.push(version(
                        &reply.into_inner().resource.expect("resource").version,
                    ));
                }
            }
            stored
        });
    }
    writers
}

/// Once a Type's deletion is acknowledged (the Type marked: its resources are being deleted),
/// no node accepts a new resource of it: neither writers racing the deletion on every node nor
/// writes sent right after its acknowledgement. Before the fence, 3–7 of 16 writes were
/// accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_type_whose_deletion_is_acknowledged_takes_no_new_resource_on_any_node() {
    use proto::resource::v1::resource_service_client::ResourceServiceClient;
    let cluster = Cluster::start(3, &[]).await;
    for round in 0..rounds(3) {
        write(&cluster.nodes[0], invoice_type_resource(INVOICE_PROTO))
            .await
            .expect("the Type");
        let mut types = ResourceServiceClient::new(cluster.nodes[0].channel().await)
            .watch_list(proto::resource::v1::WatchListRequest {
                r#type: Some(type_of("registry", "v1", "Type")),
                tenancy: Some(Tenancy::default()),
                ..Default::default()
            })
            .await
            .expect("a watch of the Types")
            .into_inner();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut channels = Vec::new();
        for node in &cluster.nodes {
            channels.push(node.channel().await);
        }
        let writers = invoice_writers(channels, stop.clone(), format!("race-{round}"));
        tokio::time::sleep(Duration::from_millis(100)).await;
        cluster.nodes[round % 3]
            .resources()
            .await
            .delete(DeleteRequest {
                id: Some(type_id()),
                version: String::new(),
            })
            .await
            .expect("the Type's deletion");
        // Right after the acknowledgement, on every node at once.
        let mut probes = tokio::task::JoinSet::new();
        for n in 0..16 {
            let channel = cluster.nodes[n % 3].channel().await;
            probes.spawn(async move {
                ResourceServiceClient::new(channel)
                    .write(proto::resource::v1::WriteRequest {
                        resource: Some(invoice(&format!("late-{round}-{n}"), 10)),
                    })
                    .await
                    .ok()
                    .and_then(|reply| reply.into_inner().resource)
                    .map(|stored| stored.version)
            });
        }
        let accepted: Vec<String> = probes.join_all().await.into_iter().flatten().collect();
        assert!(
            accepted.is_empty(),
            "round {round}: stored after the deletion was acknowledged: {accepted:?}"
        );
        // The version the Type was marked at, from the watch.
        let marked_at = watched(&mut types, "the mark", |event| {
            matches!(event, proto::resource::v1::watch_event::Event::Upsert(upsert)
            if upsert.resource.as_ref().is_some_and(|r| {
                r.metadata.contains_key(proto::meta::DELETION_TIMESTAMP_KEY)
            }))
        })
        .await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let stored: Vec<_> = writers.join_all().await.into_iter().flatten().collect();
        assert!(
            stored.iter().any(|at| *at < marked_at),
            "round {round}: the writers stored nothing before the mark: the race did not run"
        );
        let late: Vec<_> = stored.into_iter().filter(|at| *at > marked_at).collect();
        assert!(
            late.is_empty(),
            "round {round}: invoices stored after the Type was marked at {marked_at:?}: {late:?}"
        );
        // The deletion completes (its resources first) before the next round registers it
        // again.
        let deadline = Instant::now() + Duration::from_secs(30);
        while read(&cluster.nodes[0], type_id()).await.is_ok() {
            assert!(
                Instant::now() < deadline,
                "the Type's deletion did not complete"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// After a restore of a snapshot without the invoice Type is acknowledged, no node accepts an
/// invoice (before the fence: all of 15, for 125–230 ms); writers racing the restore never
/// leave an invoice behind; and every snapshot saved during the race restores (before, the
/// race made snapshots holding resources of a type they did not register).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_restore_no_node_accepts_a_type_the_snapshot_lacks() {
    let cluster = Cluster::start(3, &[]).await;
    let without = save_snapshot(&cluster.nodes[0]).await;
    let mut saved = Vec::new();
    for round in 0..rounds(3) {
        write(&cluster.nodes[0], invoice_type_resource(INVOICE_PROTO))
            .await
            .expect("the Type");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut writers = tokio::task::JoinSet::new();
        for (index, node) in cluster.nodes.iter().enumerate() {
            let channel = node.channel().await;
            let stop = stop.clone();
            writers.spawn(async move {
                let mut client =
                    proto::resource::v1::resource_service_client::ResourceServiceClient::new(
                        channel,
                    );
                for n in 0..100_000 {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let _ = client
                        .write(proto::resource::v1::WriteRequest {
                            resource: Some(invoice(&format!("r{round}-w{index}-{n}"), 10)),
                        })
                        .await;
                }
            });
        }
        // Snapshots saved while the writers race the restore.
        let saver = {
            let node = cluster.nodes[2].channel().await;
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut files = Vec::new();
                let mut client =
                    proto::cluster::v1::cluster_service_client::ClusterServiceClient::new(node);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && files.len() < 20 {
                    if let Ok(reply) = client
                        .snapshot_save(proto::cluster::v1::SnapshotSaveRequest {})
                        .await
                    {
                        let mut stream = reply.into_inner();
                        let mut file = Vec::new();
                        let mut whole = true;
                        while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
                            match chunk {
                                Ok(chunk) => file.extend_from_slice(&chunk.data),
                                Err(_) => whole = false,
                            }
                        }
                        if whole {
                            files.push(file);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                files
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        if round == 1 {
            // A leader change while the writers race toward the restore.
            change_leader(&cluster.nodes[0], None).await;
        }
        restore(&cluster.nodes[round % 3], &without)
            .await
            .expect("the restore");
        let mut accepted = Vec::new();
        for n in 0..15 {
            let node = &cluster.nodes[n % 3];
            if let Ok(stored) = write(node, invoice(&format!("after-{round}-{n}"), 10)).await {
                accepted.push(stored.version);
            }
        }
        assert!(
            accepted.is_empty(),
            "round {round}: invoices stored after the restore was acknowledged: {accepted:?}"
        );
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        while writers.join_next().await.is_some() {}
        saved.extend(saver.await.expect("the saver"));
        for (index, node) in cluster.nodes.iter().enumerate() {
            let listed = node
                .resources()
                .await
                .list(proto::resource::v1::ListRequest {
                    r#type: Some(type_of("payments", "v1", "Invoice")),
                    tenancy: Some(Tenancy {
                        partition: "*".into(),
                        namespace: "*".into(),
                    }),
                    ..Default::default()
                })
                .await;
            // The type is gone with the restore: listing it is refused as unknown.
            match listed {
                Err(status) => assert_eq!(
                    status.code(),
                    Code::InvalidArgument,
                    "round {round}: node {index}: {status:?}"
                ),
                Ok(listed) => panic!(
                    "round {round}: node {index} still lists the invoice type after the restore ({} invoices)",
                    listed.into_inner().resources.len()
                ),
            }
        }
    }
    // Every snapshot saved during the races restores (the last one restored leaves the
    // cluster as it was saved).
    assert!(!saved.is_empty(), "snapshots were saved during the races");
    for (n, file) in saved.iter().enumerate() {
        restore(&cluster.nodes[n % 3], file)
            .await
            .unwrap_or_else(|status| {
                panic!(
                    "snapshot {n} of {} does not restore: {status:?}",
                    saved.len()
                )
            });
    }
}

/// A token deleted while requests using it are in flight on three nodes: once the delete is
/// acknowledged, no node authenticates the token, and no write it authorized is stored after
/// the delete (before the fence: the token still worked on another node for up to 59 ms, by
/// luck of timing within DESIGN's one second).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_token_authorizes_nothing_once_its_deletion_is_acknowledged() {
    use crate::acl::{policy, token, with_token, write_as};
    use proto::acl::v1 as acl;
    use proto::resource::v1::resource_service_client::ResourceServiceClient;
    let (_ca, cluster) = crate::mtls::tls_cluster(3, &["--acl-enabled"]).await;
    let management = cluster.harness_token.clone().expect("management");
    let channel = cluster.nodes[0].channel().await;
    let demo = acl::Rule {
        types: vec!["demo.*.*".into()],
        partition: "*".into(),
        namespace: "*".into(),
        name_prefix: String::new(),
        access: acl::Access::Write as i32,
        schema: 0,
    };
    write_as(
        &channel,
        &management,
        policy("demo", vec![demo], acl::Access::Unspecified),
    )
    .await
    .expect("the policy");
    for round in 0..rounds(10) {
        let secret = format!("team-secret-{round:04}-0123456789");
        let accessor = format!("team-{round}");
        write_as(
            &channel,
            &management,
            token(&accessor, &secret, &["demo"], ""),
        )
        .await
        .expect("the token");
        // At once on another node, through the cluster service too.
        cluster.nodes[(round + 1) % 3]
            .cluster()
            .await
            .acl_who_am_i(with_token(
                proto::cluster::v1::AclWhoAmIRequest {},
                Some(&secret),
            ))
            .await
            .unwrap_or_else(|status| {
                panic!("round {round}: a new token on another node: {status:?}")
            });
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut writers = tokio::task::JoinSet::new();
        for (index, node) in cluster.nodes.iter().enumerate() {
            let channel = node.channel().await;
            let (stop, secret) = (stop.clone(), secret.clone());
            writers.spawn(async move {
                let mut client = ResourceServiceClient::new(channel);
                let mut stored = Vec::new();
                for n in 0..100_000 {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let artist = crate::acl::artist_in("default", &format!("t{round}-{index}-{n}"));
                    if let Ok(reply) = client
                        .write(with_token(
                            proto::resource::v1::WriteRequest {
                                resource: Some(artist),
                            },
                            Some(&secret),
                        ))
                        .await
                    {
                        stored.push(version(
                            &reply.into_inner().resource.expect("resource").version,
                        ));
                    }
                }
                stored
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        if round % 2 == 1 {
            // A leader change while the token's requests are in flight.
            change_leader(&cluster.nodes[round % 3], Some(&management)).await;
        }
        // The deletion's version, from a watch of the tokens opened before it.
        let mut tokens = ResourceServiceClient::new(channel.clone())
            .watch_list(with_token(
                proto::resource::v1::WatchListRequest {
                    r#type: Some(type_of("acl", "v1", "Token")),
                    tenancy: Some(Tenancy::default()),
                    ..Default::default()
                },
                Some(&management),
            ))
            .await
            .expect("a watch of the tokens")
            .into_inner();
        ResourceServiceClient::new(cluster.nodes[round % 3].channel().await)
            .delete(with_token(
                DeleteRequest {
                    id: Some(crate::acl::cluster_id("Token", &accessor)),
                    version: String::new(),
                },
                Some(&management),
            ))
            .await
            .expect("the token's deletion");
        let deleted_at = watched(&mut tokens, "the deletion", |event| {
            matches!(event, proto::resource::v1::watch_event::Event::Delete(delete)
                if delete.resource.as_ref().and_then(|r| r.id.as_ref())
                    .is_some_and(|id| id.name == accessor))
        })
        .await;
        // At once, on every node: the token is refused.
        for node in &cluster.nodes {
            let refused = ResourceServiceClient::new(node.channel().await)
                .write(with_token(
                    proto::resource::v1::WriteRequest {
                        resource: Some(crate::acl::artist_in("default", &format!("after-{round}"))),
                    },
                    Some(&secret),
                ))
                .await
                .expect_err("a deleted token");
            assert_eq!(
                refused.code(),
                Code::Unauthenticated,
                "round {round}: {refused:?}"
            );
            let refused = node
                .cluster()
                .await
                .acl_who_am_i(with_token(
                    proto::cluster::v1::AclWhoAmIRequest {},
                    Some(&secret),
                ))
                .await
                .expect_err("a deleted token, through the cluster service");
            assert_eq!(
                refused.code(),
                Code::Unauthenticated,
                "round {round}: {refused:?}"
            );
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut stored_any = false;
        while let Some(joined) = writers.join_next().await {
            let stored = joined.expect("a writer");
            stored_any |= !stored.is_empty();
            let late: Vec<_> = stored.into_iter().filter(|at| *at > deleted_at).collect();
            assert!(
                late.is_empty(),
                "round {round}: writes by the deleted token stored after its deletion: {late:?}"
            );
        }
        assert!(
            stored_any,
            "round {round}: the token stored nothing before its deletion: the race did not run"
        );
    }
}

/// A node that was down through a restore comes back to a state without the invoice Type (by
/// a raft snapshot, or the log): its registry still held the Type, and must not accept an
/// invoice for a moment while it catches up — it serves nothing until it has applied the
/// leader's state, and then the Type is gone with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_back_after_a_restore_forgets_the_types_the_state_lost() {
    let mut cluster = Cluster::start(3, &["--snapshot-every", "20"]).await;
    let without = save_snapshot(&cluster.nodes[0]).await;
    write(&cluster.nodes[0], invoice_type_resource(INVOICE_PROTO))
        .await
        .expect("the Type");
    write(&cluster.nodes[2], invoice("before", 10))
        .await
        .expect("node 3 holds the Type");
    cluster.nodes[2].terminate();
    restore(&cluster.nodes[0], &without)
        .await
        .expect("the restore, with two of three");
    // The log moves well past the restore (snapshots are due every 20 writes).
    for n in 0..100 {
        write(
            &cluster.nodes[n % 2],
            crate::acl::artist_in("default", &format!("after-{n}")),
        )
        .await
        .expect("a write");
    }
    cluster.nodes[2].restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut probes = 0;
    loop {
        probes += 1;
        match write(&cluster.nodes[2], invoice(&format!("late-{probes}"), 10)).await {
            Ok(stored) => panic!(
                "node 3 stored an invoice at {} after the restore removed its Type (probe {probes})",
                stored.version
            ),
            Err(status) if status.code() == Code::InvalidArgument => break,
            Err(status) => {
                assert!(
                    Instant::now() < deadline,
                    "node 3 did not come back: {status:?}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    assert!(
        read(&cluster.nodes[2], crate::types::invoice_id("before"))
            .await
            .is_err(),
        "the invoice the restore removed is gone on node 3 too"
    );
}

/// A node killed and started again rebuilds its state and its projections: the tokens it knew
/// are known again once it serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_killed_and_restarted_knows_its_tokens_again() {
    use crate::acl::with_token;
    use proto::resource::v1::resource_service_client::ResourceServiceClient;
    let (_ca, mut cluster) = crate::mtls::tls_cluster(3, &["--acl-enabled"]).await;
    let management = cluster.harness_token.clone().expect("management");
    let channel = cluster.nodes[0].channel().await;
    crate::acl::write_as(
        &channel,
        &management,
        crate::acl::artist_in("default", "before"),
    )
    .await
    .expect("a write");
    cluster.nodes[2].kill9();
    cluster.nodes[2].restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let read = ResourceServiceClient::new(cluster.nodes[2].channel().await)
            .read(with_token(
                proto::resource::v1::ReadRequest {
                    id: crate::acl::artist_in("default", "before").id,
                    ..Default::default()
                },
                Some(&management),
            ))
            .await;
        match read {
            Ok(_) => break,
            Err(status) => {
                assert_ne!(status.code(), Code::Unauthenticated, "{status:?}");
                assert!(Instant::now() < deadline, "node 3 never served: {status:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
