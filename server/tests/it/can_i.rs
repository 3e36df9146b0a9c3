//! `ClusterService.AclCheck` (DESIGN §17, `resctl auth can-i`) against what the server then
//! does: a generated matrix of tokens (random policies: types, namespaces, name prefixes, DENY)
//! and requests on a 3-node TLS + ACL cluster, each asked on one node and done on another.

use proto::acl::v1 as acl;
use proto::cluster::v1 as cluster_pb;
use proto::resource::v1::resource_service_client::ResourceServiceClient;
use proto::resource::v1::{DeleteRequest, Id, ListRequest, ReadRequest, Tenancy, WriteRequest};
use tonic::Code;

use crate::acl::{artist_in, policy, token, with_token, write_as};

/// A small deterministic generator (xorshift), so a failure names a reproducible case.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next() % items.len() as u64) as usize]
    }
}

fn random_rule(g: &mut Gen) -> acl::Rule {
    acl::Rule {
        types: vec![
            (*g.pick(&["demo.*.*", "demo.v2.Artist", "demo.v2.Album", "demo.v1.*"])).into(),
        ],
        partition: (*g.pick(&["*", "default"])).into(),
        namespace: (*g.pick(&["*", "default", "elsewhere"])).into(),
        name_prefix: (*g.pick(&["", "", "a", "b-"])).into(),
        access: *g.pick(&[
            acl::Access::Deny as i32,
            acl::Access::List as i32,
            acl::Access::Read as i32,
            acl::Access::Write as i32,
        ]),
        schema: 0,
    }
}

/// The code a call ended with (OK or the refusal's).
fn code_of<T>(outcome: Result<T, tonic::Status>) -> Code {
    outcome.map_or_else(|status| status.code(), |_| Code::Ok)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn can_i_agrees_with_what_the_server_then_does() {
    let (_ca, cluster) = crate::mtls::tls_cluster(3, &["--acl-enabled"]).await;
    let management = cluster.harness_token.clone().expect("management");
    let channel = cluster.nodes[0].channel().await;
    let mut g = Gen(0x5eed_1234_abcd_0077);
    let tokens = 8;
    for t in 0..tokens {
        let rules = (0..1 + g.next() % 3).map(|_| random_rule(&mut g)).collect();
        write_as(
            &channel,
            &management,
            policy(&format!("p{t}"), rules, acl::Access::Unspecified),
        )
        .await
        .expect("policy");
        write_as(
            &channel,
            &management,
            token(
                &format!("t{t}"),
                &format!("secret-of-token-{t}-0123456789"),
                &[&format!("p{t}")],
                "",
            ),
        )
        .await
        .expect("token");
    }
    let names = ["a1", "b-1", "c1"];
    for name in names {
        write_as(&channel, &management, artist_in("default", name))
            .await
            .expect("artist");
    }
    let mut asked = 0;
    let mut allowed = 0;
    for t in 0..tokens {
        let secret = format!("secret-of-token-{t}-0123456789");
        for (v, verb) in ["read", "list", "write", "delete"].into_iter().enumerate() {
            for name in names {
                let ask_on = &cluster.nodes[(t + v) % 3];
                let do_on = cluster.nodes[(t + v + 1) % 3].channel().await;
                // The object this request acts on: deletes get one of their own.
                let target = if verb == "delete" {
                    let own = format!("{name}-del-{t}");
                    write_as(&channel, &management, artist_in("default", &own))
                        .await
                        .expect("an artist to delete");
                    own
                } else {
                    name.to_owned()
                };
                let id = artist_in("default", &target).id.expect("id");
                let list_id = Id {
                    name: String::new(),
                    ..id.clone()
                };
                let answer = ask_on
                    .cluster()
                    .await
                    .acl_check(with_token(
                        cluster_pb::AclCheckRequest {
                            id: Some(if verb == "list" {
                                list_id.clone()
                            } else {
                                id.clone()
                            }),
                            verb: verb.into(),
                            token_name: String::new(),
                        },
                        Some(&secret),
                    ))
                    .await
                    .expect("AclCheck answers any valid token")
                    .into_inner();
                // Management asking for the same token by name gets the same answer.
                let for_it = ask_on
                    .cluster()
                    .await
                    .acl_check(with_token(
                        cluster_pb::AclCheckRequest {
                            id: Some(if verb == "list" {
                                list_id.clone()
                            } else {
                                id.clone()
                            }),
                            verb: verb.into(),
                            token_name: format!("t{t}"),
                        },
                        Some(&management),
                    ))
                    .await
                    .expect("management asks for another token")
                    .into_inner();
                assert_eq!(
                    answer.allowed, for_it.allowed,
                    "t{t} {verb} {target}: --as differs"
                );
                let mut client = ResourceServiceClient::new(do_on);
                let done = match verb {
                    "read" => code_of(
                        client
                            .read(with_token(
                                ReadRequest {
                                    id: Some(id.clone()),
                                    ..Default::default()
                                },
                                Some(&secret),
                            ))
                            .await,
                    ),
                    "list" => code_of(
                        client
                            .list(with_token(
                                ListRequest {
                                    r#type: list_id.r#type.clone(),
                                    tenancy: Some(Tenancy {
                                        partition: "default".into(),
                                        namespace: "default".into(),
                                    }),
                                    ..Default::default()
                                },
                                Some(&secret),
                            ))
                            .await,
                    ),
                    "write" => code_of(
                        client
                            .write(with_token(
                                WriteRequest {
                                    resource: Some(artist_in("default", &target)),
                                },
                                Some(&secret),
                            ))
                            .await,
                    ),
                    _ => code_of(
                        client
                            .delete(with_token(
                                DeleteRequest {
                                    id: Some(id.clone()),
                                    version: String::new(),
                                },
                                Some(&secret),
                            ))
                            .await,
                    ),
                };
                assert!(
                    matches!(done, Code::Ok | Code::PermissionDenied),
                    "t{t} {verb} {target}: {done:?}"
                );
                assert_eq!(
                    answer.allowed,
                    done == Code::Ok,
                    "t{t} {verb} {target}: can-i said {} ({}), the server answered {done:?}",
                    answer.allowed,
                    answer.reason
                );
                assert!(!answer.reason.is_empty(), "a reason is given");
                asked += 1;
                allowed += usize::from(answer.allowed);
            }
        }
    }
    eprintln!("{asked} requests, {allowed} allowed");
    assert!(
        allowed > 0 && allowed < asked,
        "the matrix holds both answers"
    );
    // Asking for another token needs acl read: a token without it is refused.
    let refused = cluster.nodes[0]
        .cluster()
        .await
        .acl_check(with_token(
            cluster_pb::AclCheckRequest {
                id: artist_in("default", "a1").id,
                verb: "read".into(),
                token_name: "t1".into(),
            },
            Some("secret-of-token-0-0123456789"),
        ))
        .await
        .expect_err("--as without acl read");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    // A verb that is none is a bad request.
    let bad = cluster.nodes[0]
        .cluster()
        .await
        .acl_check(with_token(
            cluster_pb::AclCheckRequest {
                id: artist_in("default", "a1").id,
                verb: "fly".into(),
                token_name: String::new(),
            },
            Some(&management),
        ))
        .await
        .expect_err("an unknown verb");
    assert_eq!(bad.code(), Code::InvalidArgument, "{bad:?}");
}
