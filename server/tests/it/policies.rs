//! Admission policies (DESIGN §17) on a real 3-node cluster: a DENY policy with params refuses
//! exactly the matching objects on every node right after its write is acknowledged (and stops
//! once its deletion is), rounds of it; a WARN policy's warning reaches gRPC and HTTP answers.

use proto::policy::v1 as pb;
use proto::resource::v1::{DeleteRequest, Id, Resource, Tenancy, Type, WriteRequest};
use tonic::Code;

fn id(gvk: &str, namespace: &str, name: &str) -> Id {
    let parts: Vec<&str> = gvk.split('.').collect();
    Id {
        uid: String::new(),
        name: name.into(),
        r#type: Some(Type {
            group: parts[0].into(),
            group_version: parts[1].into(),
            kind: parts[2].into(),
        }),
        tenancy: Some(Tenancy {
            partition: if namespace.is_empty() {
                String::new()
            } else {
                "default".into()
            },
            namespace: namespace.into(),
        }),
    }
}

fn album(name: &str, year: i32) -> Resource {
    Resource {
        id: Some(id("demo.v2.Album", "default", name)),
        data: Some(proto::to_any(&proto::demo::v2::Album {
            name: name.into(),
            year_of_release: year,
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn policy(name: &str, action: pb::Action) -> Resource {
    Resource {
        id: Some(id("policy.v1.AdmissionPolicy", "", name)),
        data: Some(proto::to_any(&pb::AdmissionPolicy {
            r#match: Some(pb::Match {
                types: vec!["demo.*.Album".into()],
                selector: "!exempt".into(),
                ..Default::default()
            }),
            params: Some(id("demo.v2.Album", "default", "threshold")),
            validations: vec![pb::Validation {
                expression: "object.data.yearOfRelease >= params.yearOfRelease".into(),
                message: "albums are from the threshold's year or later".into(),
            }],
            action: action as i32,
            ..Default::default()
        })),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deny_policy_holds_on_every_node_once_acknowledged_and_warnings_reach_every_api() {
    let cluster = crate::process::Cluster::start_with_http(3, &[]).await;
    let writer = |node: usize| {
        let cluster = &cluster;
        async move { cluster.nodes[node].resources().await }
    };
    let mut threshold = album("threshold", 1960);
    threshold.metadata.insert("exempt".into(), "yes".into());
    writer(0)
        .await
        .write(WriteRequest {
            resource: Some(threshold),
        })
        .await
        .expect("the params");
    let rounds = 10;
    for round in 0..rounds {
        let on = round % 3;
        writer(on)
            .await
            .write(WriteRequest {
                resource: Some(policy("modern-only", pb::Action::Deny)),
            })
            .await
            .expect("the policy");
        // At once, on every node: what it matches is refused, what it does not is stored.
        for node in 0..3 {
            let refused = writer(node)
                .await
                .write(WriteRequest {
                    resource: Some(album(&format!("old-{round}-{node}"), 1950)),
                })
                .await
                .expect_err("an old album under the policy");
            assert_eq!(
                refused.code(),
                Code::InvalidArgument,
                "round {round} node {node}: {refused:?}"
            );
            let details = proto::reason::of(&refused).expect("a reason");
            assert_eq!(details.reason, proto::reason::Reason::AdmissionDenied);
            assert_eq!(details.metadata["policy"], "modern-only");
            let mut exempt = album(&format!("exempt-{round}-{node}"), 1950);
            exempt.metadata.insert("exempt".into(), "yes".into());
            writer(node)
                .await
                .write(WriteRequest {
                    resource: Some(exempt),
                })
                .await
                .expect("the selector leaves it out");
        }
        writer((on + 1) % 3)
            .await
            .delete(DeleteRequest {
                id: Some(id("policy.v1.AdmissionPolicy", "", "modern-only")),
                version: String::new(),
            })
            .await
            .expect("the policy deleted");
        for node in 0..3 {
            writer(node)
                .await
                .write(WriteRequest {
                    resource: Some(album(&format!("old-{round}-{node}"), 1950)),
                })
                .await
                .unwrap_or_else(|status| {
                    panic!("round {round} node {node}: refused after the deletion: {status:?}")
                });
        }
    }

    // WARN: the write is stored, and its answer says why it would have been refused.
    writer(0)
        .await
        .write(WriteRequest {
            resource: Some(policy("modern-please", pb::Action::Warn)),
        })
        .await
        .expect("a warn policy");
    let answer = writer(1)
        .await
        .write(WriteRequest {
            resource: Some(album("warned", 1940)),
        })
        .await
        .expect("WARN admits");
    let warnings: Vec<&str> = answer
        .metadata()
        .get_all(proto::WARNING_HEADER)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("modern-please") && w.contains("threshold's year")),
        "{warnings:?}"
    );
    let body = serde_json::json!({
        "data": {"@type": "type.googleapis.com/resd.demo.v2.Album", "name": "over-http", "yearOfRelease": 1930}
    })
    .to_string();
    let (status, head, answer) = cluster.nodes[2]
        .http_send(
            "PUT",
            "/v1/resources/demo/v2/Album/over-http?partition=default&namespace=default",
            &body,
        )
        .expect("an HTTP answer");
    assert_eq!(status, 200, "{head}\n{answer}");
    assert!(
        head.lines()
            .any(|line| line.to_ascii_lowercase().starts_with("warning:")
                && line.contains("modern-please")),
        "{head}"
    );

    // A policy's status says whether it can run: its params exist, or not (and then what it
    // does meanwhile).
    let mut orphan = policy("orphan", pb::Action::Deny);
    if let Some(data) = orphan.data.as_mut() {
        let mut decoded: pb::AdmissionPolicy =
            prost::Message::decode(data.value.as_slice()).expect("decodes");
        decoded.params = Some(id("demo.v2.Album", "default", "nowhere"));
        decoded.r#match = Some(pb::Match {
            types: vec!["demo.v1.Concept".into()],
            ..Default::default()
        });
        *data = proto::to_any(&decoded);
    }
    writer(0)
        .await
        .write(WriteRequest {
            resource: Some(orphan),
        })
        .await
        .expect("a policy without its params");
    let condition = |name: &'static str| {
        let cluster = &cluster;
        async move {
            let read = cluster.nodes[0]
                .resources()
                .await
                .read(proto::resource::v1::ReadRequest {
                    id: Some(id("policy.v1.AdmissionPolicy", "", name)),
                    ..Default::default()
                })
                .await
                .expect("the policy")
                .into_inner()
                .resource
                .expect("a resource");
            read.status.get("admission").and_then(|status| {
                status
                    .conditions
                    .iter()
                    .find(|c| c.r#type == "Ready")
                    .map(|c| (c.state, c.reason.clone(), c.message.clone()))
            })
        }
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let (mut orphan_ready, mut warn_ready) = (None, None);
    while std::time::Instant::now() < deadline {
        orphan_ready = condition("orphan").await;
        warn_ready = condition("modern-please").await;
        if orphan_ready.is_some() && warn_ready.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let (state, reason, message) = orphan_ready.expect("the orphan's status");
    assert_eq!(state, proto::resource::v1::State::False as i32);
    assert_eq!(reason, "ParamsMissing");
    assert!(
        message.contains("refuses everything it matches"),
        "{message}"
    );
    let (state, _, _) = warn_ready.expect("the warn policy's status");
    assert_eq!(state, proto::resource::v1::State::True as i32);
}
