//! Types owned by teams (DESIGN §15), with real processes: a `registry.v1.Type` registered
//! through a follower takes effect on every node at once; its resources are like any other's
//! (rules, defaults, owners across built-in and registered types); it survives restarts, a new
//! node's snapshot install and an operator snapshot's restore; an incompatible update is
//! refused; deleting the Type deletes its resources and then the registration.

use std::time::{Duration, Instant};

use proto::cluster::v1::ListTypesRequest;
use proto::registry::v1 as registry;
use proto::resource::v1::{
    DeleteRequest, Id, ListRequest, ReadRequest, Resource, Tenancy, Type, WriteRequest,
};
use tonic::Code;

use crate::process::{Cluster, Resd};
use crate::support::{restore, save_snapshot};

pub(crate) const INVOICE_PROTO: &str = r#"
syntax = "proto3";
package resd.payments.v1;
// An invoice a customer owes.
message Invoice {
  // What is owed, in cents.
  int64 amount_cents = 1;
  string currency = 2;
  string customer = 3;
}
"#;

pub(crate) fn invoice_type_resource(proto: &str) -> Resource {
    Resource {
        id: Some(Id {
            name: "payments-invoice".into(),
            r#type: Some(type_of("registry", "v1", "Type")),
            tenancy: Some(Tenancy::default()),
            ..Default::default()
        }),
        data: Some(proto::to_any(&registry::Type {
            group: "payments".into(),
            group_version: "v1".into(),
            kind: "Invoice".into(),
            scope: registry::Scope::Namespace as i32,
            description: "Invoices".into(),
            proto: proto.into(),
            rules: vec![registry::Rule {
                expression: "self.amount_cents >= 0".into(),
                message: "amount_cents must not be negative".into(),
                field: "amount_cents".into(),
            }],
            defaults: vec![registry::Default {
                field: "currency".into(),
                value: "\"EUR\"".into(),
            }],
            ..Default::default()
        })),
        ..Default::default()
    }
}

pub(crate) fn type_of(group: &str, version: &str, kind: &str) -> Type {
    Type {
        group: group.into(),
        group_version: version.into(),
        kind: kind.into(),
    }
}

fn default_ns() -> Tenancy {
    Tenancy {
        partition: "default".into(),
        namespace: "default".into(),
    }
}

pub(crate) fn invoice_id(name: &str) -> Id {
    Id {
        name: name.into(),
        r#type: Some(type_of("payments", "v1", "Invoice")),
        tenancy: Some(default_ns()),
        ..Default::default()
    }
}

/// An invoice's data, encoded by hand as the registered schema says (field 1 int64, field 3
/// string): the test knows the schema only from the `.proto` text, as a team's client would.
fn invoice_data(amount_cents: i64, customer: &str) -> prost_types::Any {
    let mut value = Vec::new();
    prost::encoding::int64::encode(1, &amount_cents, &mut value);
    prost::encoding::string::encode(3, &customer.to_owned(), &mut value);
    prost_types::Any {
        type_url: "type.googleapis.com/resd.payments.v1.Invoice".into(),
        value,
    }
}

pub(crate) fn invoice(name: &str, amount_cents: i64) -> Resource {
    Resource {
        id: Some(invoice_id(name)),
        data: Some(invoice_data(amount_cents, "ACME")),
        ..Default::default()
    }
}

pub(crate) async fn write(node: &Resd, resource: Resource) -> Result<Resource, tonic::Status> {
    node.resources()
        .await
        .write(WriteRequest {
            resource: Some(resource),
        })
        .await
        .map(|reply| reply.into_inner().resource.expect("resource"))
}

pub(crate) async fn read(node: &Resd, id: Id) -> Result<Resource, tonic::Status> {
    node.resources()
        .await
        .read(ReadRequest {
            id: Some(id),
            ..Default::default()
        })
        .await
        .map(|reply| reply.into_inner().resource.expect("resource"))
}

/// The currency field (2) of an invoice's data.
fn currency(resource: &Resource) -> String {
    #[derive(Clone, PartialEq, prost::Message)]
    struct Invoice {
        #[prost(string, tag = "2")]
        currency: String,
    }
    <Invoice as prost::Message>::decode(resource.data.as_ref().expect("data").value.as_slice())
        .expect("an invoice")
        .currency
}

async fn registered(node: &Resd) -> Vec<(String, bool, String)> {
    node.cluster()
        .await
        .list_types(ListTypesRequest::default())
        .await
        .expect("types")
        .into_inner()
        .types
        .into_iter()
        .filter(|info| info.r#type.as_ref().is_some_and(|t| t.group == "payments"))
        .map(|info| (info.message_name, info.builtin, info.registered_by))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_type_registered_at_runtime_works_everywhere_and_survives_restarts_and_restores() {
    // Snapshots every 20 entries: the node added at the end gets the state as a snapshot.
    let mut cluster = Cluster::start_with_http(3, &["--snapshot-every", "20"]).await;
    let leader = cluster.wait_for_leader().await;
    let follower = (leader + 1) % 3;
    let other = (leader + 2) % 3;

    // Registered through a follower; written at once through another node.
    write(
        &cluster.nodes[follower],
        invoice_type_resource(INVOICE_PROTO),
    )
    .await
    .expect("the Type is registered");
    let stored = write(&cluster.nodes[other], invoice("acme-1", 1250))
        .await
        .expect("an invoice is accepted on another node right away");
    assert_eq!(currency(&stored), "EUR", "the default currency is set");
    for node in &cluster.nodes {
        assert_eq!(
            registered(node).await,
            vec![(
                "resd.payments.v1.Invoice".to_owned(),
                false,
                "payments-invoice".to_owned()
            )]
        );
    }

    // The HTTP API reads and writes it as JSON with the registered schema's field names.
    let (status, body) = cluster.nodes[follower]
        .http_get("/v1/resources/payments/v1/Invoice/acme-1?partition=default&namespace=default")
        .expect("HTTP answers");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(r#""amountCents":"1250""#) && body.contains(r#""currency":"EUR""#),
        "{body}"
    );

    // Reflection knows the registered message (grpcurl resolves `data`'s @type through it).
    {
        use tokio_stream::StreamExt;
        use tonic_reflection::pb::v1;
        let mut client = v1::server_reflection_client::ServerReflectionClient::new(
            cluster.nodes[other].channel().await,
        );
        let asked = tokio_stream::iter(vec![v1::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(
                v1::server_reflection_request::MessageRequest::FileContainingSymbol(
                    "resd.payments.v1.Invoice".into(),
                ),
            ),
        }]);
        let answer = client
            .server_reflection_info(asked)
            .await
            .expect("reflection")
            .into_inner()
            .next()
            .await
            .expect("an answer")
            .expect("ok");
        let Some(v1::server_reflection_response::MessageResponse::FileDescriptorResponse(files)) =
            answer.message_response
        else {
            panic!("expected the file of the invoice, got {answer:?}");
        };
        let first = <prost_types::FileDescriptorProto as prost::Message>::decode(
            files.file_descriptor_proto[0].as_slice(),
        )
        .expect("a file");
        assert_eq!(first.name(), "resd/payments/v1/Invoice.proto");
    }

    // A rule refuses, naming the field and the rule's message.
    let refused = write(&cluster.nodes[leader], invoice("acme-2", -5))
        .await
        .expect_err("negative");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("resource.data.amount_cents: amount_cents must not be negative"),
        "{refused:?}"
    );

    // Owners across built-in and registered types: an album owned by an invoice is reaped
    // with it.
    let album = Resource {
        id: Some(Id {
            name: "receipt-album".into(),
            r#type: Some(type_of("demo", "v2", "Album")),
            tenancy: Some(default_ns()),
            ..Default::default()
        }),
        owner: stored.id.clone(),
        data: Some(proto::to_any(&proto::demo::v2::Album {
            name: "Receipts".into(),
            ..Default::default()
        })),
        ..Default::default()
    };
    write(&cluster.nodes[leader], album.clone())
        .await
        .expect("an album owned by an invoice");

    // An incompatible update is refused, naming the field.
    let breaking = INVOICE_PROTO.replace("string customer = 3;", "int64 customer = 3;");
    let refused = write(&cluster.nodes[leader], invoice_type_resource(&breaking))
        .await
        .expect_err("retyped field");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("customer changes type from string to int64"),
        "{refused:?}"
    );
    // A compatible one is taken.
    let grown = INVOICE_PROTO.replace(
        "  string customer = 3;",
        "  string customer = 3;\n  string note = 4;",
    );
    write(&cluster.nodes[leader], invoice_type_resource(&grown))
        .await
        .expect("an added field is compatible");

    // Every node restarted: the type and its resources are back.
    for node in &mut cluster.nodes {
        node.terminate();
    }
    for node in &mut cluster.nodes {
        node.restart();
    }
    cluster.wait_for_members(3).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    for index in 0..3 {
        loop {
            match read(&cluster.nodes[index], invoice_id("acme-1")).await {
                Ok(invoice) => {
                    assert_eq!(currency(&invoice), "EUR");
                    break;
                }
                Err(status) => {
                    assert!(Instant::now() < deadline, "node {index}: {status:?}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    // An operator snapshot, taken with the type; the type deleted; the snapshot restored.
    let snapshot = save_snapshot(&cluster.nodes[0]).await;
    cluster.nodes[0]
        .resources()
        .await
        .delete(DeleteRequest {
            id: Some(Id {
                name: "payments-invoice".into(),
                r#type: Some(type_of("registry", "v1", "Type")),
                tenancy: Some(Tenancy::default()),
                ..Default::default()
            }),
            version: String::new(),
        })
        .await
        .expect("the Type is deleted");
    // Deleting the Type deletes its resources (and what they own), then the registration.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let invoice_gone = matches!(
            read(&cluster.nodes[0], invoice_id("acme-1")).await,
            Err(status) if status.code() == Code::NotFound || status.code() == Code::InvalidArgument
        );
        if invoice_gone && registered(&cluster.nodes[0]).await.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the Type's deletion did not complete"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let album_id = album.id.clone().expect("id");
    let deadline = Instant::now() + Duration::from_secs(30);
    while read(&cluster.nodes[0], album_id.clone()).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "the invoice's album was not reaped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let refused = write(&cluster.nodes[0], invoice("acme-3", 1))
        .await
        .expect_err("no longer registered");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");

    restore(&cluster.nodes[0], &snapshot)
        .await
        .expect("the snapshot is restored");
    let deadline = Instant::now() + Duration::from_secs(30);
    for index in 0..3 {
        loop {
            match read(&cluster.nodes[index], invoice_id("acme-1")).await {
                Ok(_) => break,
                Err(status) => {
                    assert!(
                        Instant::now() < deadline,
                        "node {index} after restore: {status:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    // A new node, which gets the state as a raft snapshot (the log before it is purged), knows
    // the type.
    let leader = cluster.wait_for_leader().await;
    for index in 0..60 {
        write(
            &cluster.nodes[leader],
            invoice(&format!("filler-{index}"), index),
        )
        .await
        .expect("an invoice");
    }
    let added = cluster.add_node(&["--snapshot-every", "20"]).await;
    cluster.wait_for_members(4).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match read(&cluster.nodes[added], invoice_id("acme-1")).await {
            Ok(_) => break,
            Err(status) => {
                assert!(Instant::now() < deadline, "the new node: {status:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let listed = cluster.nodes[added]
        .resources()
        .await
        .list(ListRequest {
            r#type: Some(type_of("payments", "v1", "Invoice")),
            tenancy: Some(default_ns()),
            name_prefix: String::new(),
            ..ListRequest::default()
        })
        .await
        .expect("list")
        .into_inner()
        .resources;
    assert_eq!(listed.len(), 61);
    let status = cluster.nodes[added].status().await.expect("status");
    assert!(
        status.snapshot_index > 0,
        "the new node installed a snapshot: {status:?}"
    );
}

/// An ACL policy on `payments.*.*` grants exactly that: the registered type, not the demo ones
/// (and registering a type needs write on `registry.v1.Type`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_rules_by_type_glob_cover_registered_types() {
    use crate::acl::{bootstrap, policy, token, with_token, write_as};
    use proto::acl::v1 as acl;
    use proto::resource::v1::resource_service_client::ResourceServiceClient;
    let node = Resd::start_with(&["--acl-enabled"]);
    let management = bootstrap(&node).await;
    let channel = node.channel().await;
    write_as(&channel, &management, invoice_type_resource(INVOICE_PROTO))
        .await
        .expect("registered");
    let payments = acl::Rule {
        types: vec!["payments.*.*".into()],
        partition: "*".into(),
        namespace: "*".into(),
        name_prefix: String::new(),
        access: acl::Access::Write as i32,
        schema: 0,
    };
    for resource in [
        policy("payments", vec![payments], acl::Access::Unspecified),
        token("team", "payments-team-secret-0123", &["payments"], ""),
    ] {
        write_as(&channel, &management, resource)
            .await
            .expect("set up");
    }
    let team = "payments-team-secret-0123";
    write_as(&channel, team, invoice("team-1", 100))
        .await
        .expect("the team writes its invoices");
    let album = Resource {
        id: Some(Id {
            name: "not-theirs".into(),
            r#type: Some(type_of("demo", "v2", "Album")),
            tenancy: Some(default_ns()),
            ..Default::default()
        }),
        data: Some(proto::to_any(&proto::demo::v2::Album::default())),
        ..Default::default()
    };
    let denied = write_as(&channel, team, album)
        .await
        .expect_err("not theirs");
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    let mut other_type = invoice_type_resource(&INVOICE_PROTO.replace("Invoice", "Receipt"));
    if let Some(id) = other_type.id.as_mut() {
        id.name = "payments-receipt".into();
    }
    other_type.data = other_type.data.map(|any| {
        let mut t =
            <registry::Type as prost::Message>::decode(any.value.as_slice()).expect("a Type");
        t.kind = "Receipt".into();
        proto::to_any(&t)
    });
    let denied = write_as(&channel, team, other_type)
        .await
        .expect_err("registering needs write on registry.v1.Type");
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    let read = ResourceServiceClient::new(channel.clone())
        .read(with_token(
            ReadRequest {
                id: Some(invoice_id("team-1")),
                ..Default::default()
            },
            Some(team),
        ))
        .await
        .expect("read back");
    assert!(read.into_inner().resource.is_some());
}

/// Attack (a tightened rule stranded data): after a rule that stored objects break was added,
/// a finalizer could not be removed even by management, and deleting the Type hung for good.
/// Ratcheting (DESIGN §15): metadata and finalizers always change; a write that leaves a
/// broken rule's field unchanged passes; one that changes it must satisfy it; deleting the
/// Type completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tightened_rule_never_strands_stored_objects() {
    let node = Resd::start();
    let type_id = invoice_type_resource(INVOICE_PROTO).id.clone();
    write(&node, invoice_type_resource(INVOICE_PROTO))
        .await
        .expect("the Type");
    let mut held = invoice("big", 5000);
    held.metadata.insert(
        proto::meta::FINALIZERS_KEY.into(),
        "payments.example.com/hold".into(),
    );
    let held = write(&node, held)
        .await
        .expect("stored under the old rules");

    // The rule tightens: amount_cents <= 1000 (the Type's controller writes it meanwhile).
    for attempt in 0..20 {
        let mut tightened = read(&node, type_id.clone().expect("id"))
            .await
            .expect("Type");
        if let Some(data) = tightened.data.as_mut() {
            let mut t: registry::Type =
                prost::Message::decode(data.value.as_slice()).expect("Type");
            t.rules.push(registry::Rule {
                expression: "self.amount_cents <= 1000".into(),
                message: "invoices are at most 10 euros now".into(),
                field: "amount_cents".into(),
            });
            t.descriptor_set.clear();
            *data = proto::to_any(&t);
        }
        match write(&node, tightened).await {
            Ok(_) => break,
            Err(status) if status.code() == Code::Aborted && attempt < 19 => continue,
            Err(status) => panic!("the rule does not tighten: {status:?}"),
        }
    }

    // A new object must satisfy it at once: the node's registry is a projection of its log, so
    // an acknowledged rule holds for the next request (DESIGN §15's fence).
    let refused = node
        .resources()
        .await
        .mutate_and_validate(proto::resource::v1::MutateAndValidateRequest {
            resource: Some(invoice("new", 5000)),
        })
        .await
        .expect_err("the tightened rule holds as soon as it is acknowledged");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    let refused = write(&node, invoice("new", 5000)).await.expect_err("new");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("at most 10 euros"),
        "{refused:?}"
    );
    let mut labelled = held.clone();
    labelled.metadata.insert("team".into(), "billing".into());
    let labelled = write(&node, labelled).await.expect("labels change");
    let mut renamed = labelled.clone();
    renamed.data = Some(invoice_data(5000, "ACME Corp"));
    let renamed = write(&node, renamed)
        .await
        .expect("a field the broken rule does not report on changes");
    let mut still_big = renamed.clone();
    still_big.data = Some(invoice_data(4000, "ACME Corp"));
    let refused = write(&node, still_big)
        .await
        .expect_err("the rule's field changes");
    assert!(
        refused.message().contains("at most 10 euros"),
        "{refused:?}"
    );

    // Deleting the Type marks the invoice; its finalizer comes off; the deletion completes.
    node.resources()
        .await
        .delete(DeleteRequest {
            id: type_id,
            version: String::new(),
        })
        .await
        .expect("the Type is deleted");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let current = read(&node, invoice_id("big")).await.expect("still held");
        if proto::meta::is_marked_for_deletion(&current) {
            let mut released = current;
            released.metadata.remove(proto::meta::FINALIZERS_KEY);
            write(&node, released)
                .await
                .expect("the finalizer comes off though the data breaks a rule");
            break;
        }
        assert!(Instant::now() < deadline, "the invoice was never marked");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !registered(&node).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the Type's deletion did not complete"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
