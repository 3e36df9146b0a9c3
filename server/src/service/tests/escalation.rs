//! No escalation through the resource service (DESIGN §12.3), as a property over generated
//! policies, tokens and requests: whatever a token with `acl` write does through Write, Delete
//! and WriteStatus — creating tokens, creating or rewriting policies, changing which policies a
//! token names (its own included), deleting policies — no token ends up with access, on any
//! resource, to cluster operations, to ACL management or to joining, above what it had before
//! and above what the writer held. The token store is the real one, a projection of what is stored.

use proto::acl::v1 as pb;

use super::*;
use crate::acl::rules::tests::{Gen, random_policy, universe};
use crate::acl::{Access, TokenResolver, TokenStore};

fn acl_id(kind: &str, name: &str) -> Id {
    Id {
        uid: String::new(),
        name: name.into(),
        r#type: Some(resource::new_type("acl", "v1", kind)),
        tenancy: Some(Tenancy::default()),
    }
}

fn policy(name: &str, policy: &pb::Policy) -> Resource {
    Resource {
        id: Some(acl_id("Policy", name)),
        data: Some(proto::to_any(policy)),
        ..Default::default()
    }
}

fn token(name: &str, secret: &str, policies: &[String]) -> Resource {
    Resource {
        id: Some(acl_id("Token", name)),
        data: Some(proto::to_any(&pb::Token {
            policies: policies.to_vec(),
            secret: secret.into(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// A generated policy the service accepts (the rule algebra's generator also makes globs that
/// only the algebra takes).
fn valid_policy(g: &mut Gen) -> pb::Policy {
    let mut policy = random_policy(g);
    for rule in &mut policy.rules {
        for glob in &mut rule.types {
            if glob.split('.').count() == 2 {
                *glob = format!("*.{glob}");
            }
        }
    }
    policy
}

/// What a token may do, at every point the property looks at.
#[derive(Debug, Clone, PartialEq)]
struct Reach {
    resources: Vec<Access>,
    operator: Access,
    acl: Access,
    join: bool,
}

fn reach(authorizer: &dyn Authorizer, ids: &[Id]) -> Reach {
    Reach {
        resources: ids.iter().map(|id| authorizer.resource(id)).collect(),
        operator: authorizer.operator(),
        acl: authorizer.acl(),
        join: authorizer.may_join(),
    }
}

#[tokio::test]
async fn no_request_a_token_makes_lifts_any_token_above_its_writer() {
    let ids = universe();
    let mut g = Gen(0x2545_f491_4f6c_dd1d);
    let (mut done, mut refused) = (0, 0);
    for case in 0..200 {
        let default = if case % 2 == 0 {
            Access::Deny
        } else {
            Access::Write
        };
        let h = harness().await;
        // The real store, following what is stored as every node's does (a projection).
        let store = Arc::new(TokenStore::new(default));
        h.service
            .project(Arc::new(crate::service::projections::Acl(store.clone())))
            .expect("the store follows the stored tokens");
        // Three policies; tokens "a" and "b" naming some of them; the writer "w" naming one or
        // two and always holding acl write (else every attempt is refused, vacuously).
        let names: Vec<String> = (0..3).map(|n| format!("p{n}")).collect();
        for name in &names {
            h.write(policy(name, &valid_policy(&mut g)))
                .await
                .expect("policy");
        }
        // Policies no token names: the writer may rewrite and delete them.
        let free: Vec<String> = (0..2).map(|n| format!("q{n}")).collect();
        for name in &free {
            h.write(policy(name, &valid_policy(&mut g)))
                .await
                .expect("policy");
        }
        let mut writer_policy = valid_policy(&mut g);
        writer_policy.acl = pb::Access::Write as i32;
        if case % 3 != 0 {
            // A broad writer, so that many grants are within what it holds.
            writer_policy.rules.push(pb::Rule {
                types: vec!["*".into()],
                partition: "*".into(),
                namespace: "*".into(),
                name_prefix: String::new(),
                access: pb::Access::Write as i32,
                schema: 0,
            });
        }
        h.write(policy("writer", &writer_policy))
            .await
            .expect("writer policy");
        let secret = |n: u64| {
            format!(
                "{:064x}",
                u128::from(n) * 0x9e37_79b9_7f4a_7c15_u128 + 0x1234_5678_9abc_def0
            )
        };
        // One to three of the policies (a token names at least one).
        let some = |g: &mut Gen| -> Vec<String> {
            let first = g.next() as usize % names.len();
            let mut picked = vec![names[first].clone()];
            picked.extend(
                names
                    .iter()
                    .enumerate()
                    .filter(|(n, _)| *n != first && g.next().is_multiple_of(2))
                    .map(|(_, name)| name.clone()),
            );
            picked
        };
        let mut writer_names = vec!["writer".to_owned()];
        if case % 2 == 1 {
            writer_names.extend(some(&mut g).into_iter().take(1));
        }
        let tokens = [
            ("w", secret(3 * case + 1), writer_names),
            ("a", secret(3 * case + 2), some(&mut g)),
            ("b", secret(3 * case + 3), some(&mut g)),
        ];
        for (name, secret, policies) in &tokens {
            h.write(token(name, secret, policies)).await.expect("token");
        }
        let writer = store.resolve(Some(&tokens[0].1)).expect("writer");
        let writer_reach = reach(writer.as_ref(), &ids);
        let before: Vec<Option<Reach>> = tokens
            .iter()
            .map(|(_, secret, _)| {
                store
                    .resolve(Some(secret))
                    .ok()
                    .map(|a| reach(a.as_ref(), &ids))
            })
            .collect();

        // One or two requests of the writer, each generated.
        let new_secret = secret(1_000_000 + case);
        for step in 0..1 + g.next() % 3 {
            // Resolved per request, as the server does (the writer may have changed itself).
            let Ok(writer) = store.resolve(Some(&tokens[0].1)) else {
                break;
            };
            let target = g.pick(&["w", "a", "b", "new"]).to_string();
            let result = match g.next() % 6 {
                0 => {
                    let mut granted = some(&mut g);
                    if g.next().is_multiple_of(4) {
                        granted.push(crate::acl::MANAGEMENT_POLICY.into());
                    }
                    let secret = tokens
                        .iter()
                        .find(|(name, _, _)| *name == target)
                        .map_or(new_secret.clone(), |(_, secret, _)| secret.clone());
                    h.write_as(writer.as_ref(), token(&target, &secret, &granted))
                        .await
                        .map(drop)
                }
                1 => {
                    let name = g
                        .pick(&[names.as_slice(), free.as_slice()].concat())
                        .clone();
                    h.write_as(writer.as_ref(), policy(&name, &valid_policy(&mut g)))
                        .await
                        .map(drop)
                }
                2 => {
                    // A new policy, then a new token naming it.
                    let name = format!("new-{step}");
                    match h
                        .write_as(writer.as_ref(), policy(&name, &valid_policy(&mut g)))
                        .await
                    {
                        Ok(_) => h
                            .write_as(writer.as_ref(), token("new", &new_secret, &[name]))
                            .await
                            .map(drop),
                        Err(error) => Err(error),
                    }
                }
                3 => {
                    let name = g
                        .pick(&[names.as_slice(), free.as_slice()].concat())
                        .clone();
                    h.delete_as(writer.as_ref(), &acl_id("Policy", &name), "")
                        .await
                }
                4 => {
                    h.delete_as(writer.as_ref(), &acl_id("Token", &target), "")
                        .await
                }
                _ => {
                    let generation = match h.read(&acl_id("Token", &target)).await {
                        Ok(stored) => stored.generation,
                        Err(_) => "01ARZ3NDEKTSV4RRFFQ69G5FAV".into(),
                    };
                    let status = Status {
                        observed_generation: generation,
                        conditions: Vec::new(),
                        ..Default::default()
                    };
                    h.write_status_as(writer.as_ref(), &acl_id("Token", &target), "", "x", status)
                        .await
                        .map(drop)
                }
            };
            match &result {
                Ok(()) => done += 1,
                Err(
                    Error::PermissionDenied(_)
                    | Error::InvalidArgument(_)
                    | Error::NotFound(_)
                    | Error::FailedPrecondition(_),
                ) => refused += 1,
                Err(other) => panic!("case {case}: unexpected {other:?}"),
            }
        }

        let everyone = tokens
            .iter()
            .map(|(name, secret, _)| (*name, secret.clone()))
            .chain([("new", new_secret)]);
        for (index, (name, secret)) in everyone.enumerate() {
            let Ok(after) = store.resolve(Some(&secret)) else {
                continue;
            };
            let after = reach(after.as_ref(), &ids);
            let had = before.get(index).cloned().flatten();
            let bound = |level: Access, had: Option<Access>, writer: Access| {
                level <= writer.max(had.unwrap_or(Access::Deny))
            };
            for (i, id) in ids.iter().enumerate() {
                assert!(
                    bound(
                        after.resources[i],
                        had.as_ref().map(|r| r.resources[i]),
                        writer_reach.resources[i]
                    ),
                    "case {case}: token {name} gets {:?} on {id:?}; it had {:?}, its writer holds {:?}",
                    after.resources[i],
                    had.as_ref().map(|r| r.resources[i]),
                    writer_reach.resources[i]
                );
            }
            assert!(
                bound(
                    after.operator,
                    had.as_ref().map(|r| r.operator),
                    writer_reach.operator
                ),
                "case {case}: {name} operator"
            );
            assert!(
                bound(after.acl, had.as_ref().map(|r| r.acl), writer_reach.acl),
                "case {case}: {name} acl"
            );
            assert!(
                !after.join || writer_reach.join || had.as_ref().is_some_and(|r| r.join),
                "case {case}: {name} join"
            );
        }
    }
    // Not vacuous: many requests were carried out, and many refused.
    assert!(done > 40 && refused > 40, "{done} done, {refused} refused");
}
