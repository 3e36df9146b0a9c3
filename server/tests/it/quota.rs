//! Quotas (DESIGN §17) on a real 3-node cluster: writers on every node racing one quota store
//! exactly its limit, every refusal says which quota and how full it is, a quota lowered below
//! its use keeps what is stored and refuses more, deletes always pass.

use std::collections::BTreeMap;

use proto::resource::v1::resource_service_client::ResourceServiceClient;
use proto::resource::v1::{
    DeleteRequest, Id, ListRequest, ReadRequest, Resource, Tenancy, Type, WriteRequest,
};
use tonic::Code;

use crate::acl::artist_in;

fn quota(limit: u64) -> Resource {
    Resource {
        id: Some(Id {
            uid: String::new(),
            name: "artists".into(),
            r#type: Some(Type {
                group: "tenancy".into(),
                group_version: "v1".into(),
                kind: "Quota".into(),
            }),
            tenancy: Some(Tenancy {
                partition: "default".into(),
                namespace: "default".into(),
            }),
        }),
        data: Some(proto::to_any(&proto::tenancy::v1::Quota {
            hard: BTreeMap::from([("count/demo.Artist".to_owned(), limit)]),
            used: BTreeMap::new(),
        })),
        ..Default::default()
    }
}

fn used_of(resource: &Resource) -> u64 {
    let data: proto::tenancy::v1::Quota = prost::Message::decode(
        resource
            .data
            .as_ref()
            .map(|d| d.value.as_slice())
            .unwrap_or_default(),
    )
    .expect("a quota");
    data.used
        .get("count/demo.Artist")
        .copied()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writers_on_three_nodes_racing_a_quota_store_exactly_its_limit() {
    let cluster = crate::process::Cluster::start(3, &[]).await;
    let stored = cluster.nodes[0]
        .resources()
        .await
        .write(WriteRequest {
            resource: Some(quota(100)),
        })
        .await
        .expect("the quota")
        .into_inner()
        .resource
        .expect("stored");
    assert_eq!(used_of(&stored), 0);
    let quota_id = stored.id.clone().expect("id");

    let mut writers = tokio::task::JoinSet::new();
    for (index, node) in cluster.nodes.iter().enumerate() {
        let channel = node.channel().await;
        writers.spawn(async move {
            let mut client = ResourceServiceClient::new(channel);
            let (mut stored, mut refused) = (0u64, 0u64);
            for n in 0..60 {
                match client
                    .write(WriteRequest {
                        resource: Some(artist_in("default", &format!("w{index}-{n}"))),
                    })
                    .await
                {
                    Ok(_) => stored += 1,
                    Err(status) => {
                        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                        let details = proto::reason::of(&status).expect("a reason");
                        assert_eq!(details.reason, proto::reason::Reason::QuotaExceeded);
                        assert_eq!(details.metadata["quota"], "default/default/artists");
                        assert_eq!(details.metadata["key"], "count/demo.Artist");
                        assert_eq!(details.metadata["limit"], "100");
                        assert_eq!(details.metadata["used"], "100");
                        refused += 1;
                    }
                }
            }
            (stored, refused)
        });
    }
    let (mut stored, mut refused) = (0, 0);
    while let Some(outcome) = writers.join_next().await {
        let (s, r) = outcome.expect("writer");
        stored += s;
        refused += r;
    }
    assert_eq!((stored, refused), (100, 80), "exactly the limit is stored");

    // Every node holds exactly 100, and the quota says so.
    for node in &cluster.nodes {
        let mut strong = tonic::Request::new(ListRequest {
            r#type: Some(crate::acl::artist_type_v2()),
            tenancy: Some(Tenancy {
                partition: "default".into(),
                namespace: "default".into(),
            }),
            ..Default::default()
        });
        strong.metadata_mut().insert(
            "x-resd-consistency-mode",
            "consistent".parse().expect("ascii"),
        );
        let listed = node
            .resources()
            .await
            .list(strong)
            .await
            .expect("list")
            .into_inner()
            .resources;
        assert_eq!(listed.len(), 100);
    }
    let read_quota = |node: usize| {
        let (cluster, quota_id) = (&cluster, quota_id.clone());
        async move {
            // Strong: another node's default read may answer from before it applied a change.
            let mut strong = tonic::Request::new(ReadRequest {
                id: Some(quota_id),
                ..Default::default()
            });
            strong.metadata_mut().insert(
                "x-resd-consistency-mode",
                "consistent".parse().expect("ascii"),
            );
            cluster.nodes[node]
                .resources()
                .await
                .read(strong)
                .await
                .expect("the quota")
                .into_inner()
                .resource
                .expect("a resource")
        }
    };
    assert_eq!(used_of(&read_quota(1).await), 100);

    // Lowered below its use: what is stored stays, nothing more is taken, a delete passes.
    let mut lowered = quota(50);
    lowered.id = Some(quota_id.clone());
    let lowered = cluster.nodes[2]
        .resources()
        .await
        .write(WriteRequest {
            resource: Some(lowered),
        })
        .await
        .expect("lowered")
        .into_inner()
        .resource
        .expect("stored");
    assert_eq!(used_of(&lowered), 100, "recounted from the store");
    let more = cluster.nodes[1]
        .resources()
        .await
        .write(WriteRequest {
            resource: Some(artist_in("default", "one-more")),
        })
        .await
        .expect_err("over a lowered quota");
    assert_eq!(more.code(), Code::ResourceExhausted, "{more:?}");
    let victim = artist_in("default", "w0-0").id.expect("id");
    cluster.nodes[1]
        .resources()
        .await
        .delete(DeleteRequest {
            id: Some(victim),
            version: String::new(),
        })
        .await
        .expect("a delete is never refused");
    assert_eq!(used_of(&read_quota(0).await), 99);
}
