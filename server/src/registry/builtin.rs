//! The built-in types: tombstones, tenancy (partitions and namespaces) and the demo types that
//! mirror Consul's demo package.

use proto::acl::v1 as acl_v1;
use proto::demo::{v1 as demo_v1, v2 as demo_v2};
use proto::internal::v1 as internal_v1;
use proto::registry::v1 as registry_v1;
use proto::resource::v1::{Id, Resource};
use proto::tenancy::v1 as tenancy_v1;

use std::sync::Arc;

use super::{Acls, Registration, Registry, RegistryError, Scope, decode_data};
use crate::acl::{self, Access, AclError, Authorizer};
use crate::resource::{self, Invalid};

pub(crate) const TOMBSTONE: &str = "internal.v1.Tombstone";
/// The record that ACLs were bootstrapped (one, named [`ACL_BOOTSTRAP_NAME`]).
pub(crate) const ACL_BOOTSTRAP: &str = "internal.v1.AclBootstrap";
pub(crate) const ACL_BOOTSTRAP_NAME: &str = "acl-bootstrap";
/// The records of removed members (`node-<id>`).
pub(crate) const REMOVED_MEMBER: &str = "internal.v1.RemovedMember";
/// The group of the types only the server writes (tombstones).
pub(crate) const INTERNAL_GROUP: &str = "internal";
pub(crate) const PARTITION: &str = "tenancy.v1.Partition";
pub(crate) const NAMESPACE: &str = "tenancy.v1.Namespace";
pub(crate) const QUOTA: &str = "tenancy.v1.Quota";
pub(crate) const ACL_POLICY: &str = "acl.v1.Policy";
pub(crate) const ACL_TOKEN: &str = "acl.v1.Token";
/// Types registered at runtime (DESIGN §15).
pub(crate) const REGISTRY_TYPE: &str = "registry.v1.Type";

/// The type of [`REGISTRY_TYPE`] resources.
pub(crate) fn registry_type() -> proto::resource::v1::Type {
    resource::new_type("registry", "v1", "Type")
}
/// Leases of controllers placed across replicas (DESIGN §16).
pub(crate) const LEASE: &str = "coordination.v1.Lease";
/// What each replica of a controller outside the server reports of itself (DESIGN §16).
pub(crate) const REPLICA: &str = "coordination.v1.Replica";
/// Which member of a sharded controller reconciles which object (DESIGN §16).
pub(crate) const SHARD_MAP: &str = "coordination.v1.ShardMap";
/// Most members one ShardMap holds (more joining replicas wait outside the ring).
pub(crate) const MAX_SHARD_MEMBERS: usize = 256;
/// What a controller did and why (DESIGN §18).
pub(crate) const EVENT: &str = "events.v1.Event";
/// The finalizer the type controller holds on every Type: released once every resource of the
/// type is deleted.
pub(crate) const TYPE_FINALIZER: &str = "registry.resd.io/type-cleanup";

/// Longest tombstone name: `tombstone-` + a resource name + `-` + a 26-character uid.
pub(crate) const MAX_TOMBSTONE_NAME_LEN: usize = 10 + resource::MAX_NAME_LEN + 1 + 26;

pub(crate) fn register(registry: &mut Registry) -> Result<(), RegistryError> {
    let mut tombstone = Registration::new::<internal_v1::Tombstone>(TOMBSTONE, Scope::Any);
    tombstone.max_name_len = MAX_TOMBSTONE_NAME_LEN;
    tombstone.server_written = true;
    registry.register(tombstone)?;
    let mut bootstrapped =
        Registration::new::<internal_v1::AclBootstrap>(ACL_BOOTSTRAP, Scope::Cluster).with_acls(
            Acls::acl_managed(|authorizer, _| {
                // Deleting it would reopen bootstrap: management only (it is never written).
                if authorizer.is_management() {
                    Ok(())
                } else {
                    Err(AclError::PermissionDenied(format!(
                        "only a {} token may delete the record of the ACL bootstrap",
                        acl::MANAGEMENT_POLICY
                    )))
                }
            }),
        );
    bootstrapped.server_written = true;
    registry.register(bootstrapped)?;
    let mut removed =
        Registration::new::<internal_v1::RemovedMember>(REMOVED_MEMBER, Scope::Cluster);
    removed.server_written = true;
    registry.register(removed)?;

    registry.register(Registration::new::<tenancy_v1::Partition>(
        PARTITION,
        Scope::Cluster,
    ))?;
    registry.register(Registration::new::<tenancy_v1::Namespace>(
        NAMESPACE,
        Scope::Partition,
    ))?;
    registry.register(
        Registration::new::<tenancy_v1::Quota>(QUOTA, Scope::Any)
            .with_acls(quota_acls())
            .with_validate(validate_quota),
    )?;

    registry.register(
        Registration::new::<acl_v1::Policy>(ACL_POLICY, Scope::Cluster)
            .with_acls(Acls::acl_managed(may_grant_policy))
            .with_validate(validate_policy),
    )?;
    registry.register(
        Registration::new::<acl_v1::Token>(ACL_TOKEN, Scope::Cluster)
            .with_acls(Acls::acl_managed(may_grant_token))
            .with_mutate(mutate_token)
            .with_validate(validate_token)
            .with_references(token_policies),
    )?;

    registry.register(
        Registration::new::<proto::policy::v1::AdmissionPolicy>(
            super::policies::ADMISSION_POLICY,
            Scope::Cluster,
        )
        .with_acls(admission_policy_acls())
        .with_validate(validate_admission_policy),
    )?;

    registry.register(Registration::new::<proto::coordination::v1::Lease>(
        LEASE,
        Scope::Namespace,
    ))?;
    registry.register(
        Registration::new::<proto::coordination::v1::Replica>(REPLICA, Scope::Namespace)
            .with_validate(validate_replica)
            .with_acls(replica_acls()),
    )?;
    registry.register(
        Registration::new::<proto::coordination::v1::ShardMap>(SHARD_MAP, Scope::Namespace)
            .with_validate(validate_shard_map)
            .with_acls(shard_map_acls()),
    )?;

    registry.register(
        Registration::new::<proto::events::v1::Event>(EVENT, Scope::Namespace)
            .with_validate(validate_event)
            .with_acls(event_acls()),
    )?;

    let types = registry.dynamic().clone();
    registry.register(
        Registration::new::<registry_v1::Type>(REGISTRY_TYPE, Scope::Cluster)
            .with_acls(type_acls())
            .with_mutate(compile_type)
            .with_validate(move |resource| validate_type(&types, resource)),
    )?;

    registry.register(
        Registration::new::<demo_v2::Artist>("demo.v2.Artist", Scope::Namespace)
            .with_acls(demo_acls(false))
            .with_validate(validate_artist_v2)
            .with_mutate(mutate_artist_v2),
    )?;
    registry.register(
        Registration::new::<demo_v2::Album>("demo.v2.Album", Scope::Namespace)
            .with_acls(demo_acls(false)),
    )?;
    registry.register(
        Registration::new::<demo_v1::Artist>("demo.v1.Artist", Scope::Namespace)
            .with_acls(demo_acls(false)),
    )?;
    registry.register(
        Registration::new::<demo_v1::Album>("demo.v1.Album", Scope::Namespace)
            .with_acls(demo_acls(false)),
    )?;
    registry.register(
        Registration::new::<demo_v1::Concept>("demo.v1.Concept", Scope::Namespace)
            .with_acls(demo_acls(false)),
    )?;
    registry.register(
        Registration::new::<demo_v1::RecordLabel>("demo.v1.RecordLabel", Scope::Partition)
            .with_acls(demo_acls(true)),
    )?;
    registry.register(
        Registration::new::<demo_v1::Executive>("demo.v1.Executive", Scope::Cluster)
            .with_acls(demo_acls(false)),
    )?;
    Ok(())
}

/// The controllers the server runs itself: no report may claim them (DESIGN §16).
pub(crate) const BUILTIN_CONTROLLERS: [&str; 10] = [
    "reaper",
    "shards",
    "event-expiry",
    "admission-policies",
    "namespace",
    "replica-reports",
    "type",
    "demo-artist",
    "demo-album",
    "demo-concept-observer",
];
/// Longest interval a report may name (0 means the default, 10 s).
pub(crate) const MAX_REPORT_EVERY_SECONDS: u32 = 300;

/// Whether `text` holds a control character (C0, DEL or C1): what could move an operator's
/// cursor, clear a terminal or forge a line.
pub(crate) fn has_control(text: &str) -> bool {
    text.chars().any(char::is_control)
}

/// A report's shape (DESIGN §16): names without control characters, an interval within
/// 1–300 seconds (0: the default).
/// A quota lives in a namespace or at a partition (never cluster-wide), and limits `bytes` or
/// `count/<group.Kind glob>` (DESIGN §17). `used` is the server's: whatever is written there
/// is replaced when the quota is stored.
fn validate_quota(resource: &Resource) -> Result<(), Invalid> {
    let quota: tenancy_v1::Quota = data_of(resource)?;
    let tenancy = resource
        .id
        .as_ref()
        .and_then(|id| id.tenancy.clone())
        .unwrap_or_default();
    let mut problems = Invalid::default();
    if tenancy.partition.is_empty() {
        problems.push(
            "resource.id.tenancy",
            "a quota lives in a namespace (it counts that namespace) or at a partition (it counts every namespace of it): give it a partition, and a namespace or none",
        );
    }
    if let Err(why) = resource::check_quota_hard(&quota.hard) {
        problems.push("resource.data.hard", why);
    }
    problems.into_result()
}

/// An admission policy compiles: its match, params and every validation (DESIGN §17), each
/// refusal naming its field.
fn validate_admission_policy(resource: &Resource) -> Result<(), Invalid> {
    let policy: proto::policy::v1::AdmissionPolicy = data_of(resource)?;
    let name = resource
        .id
        .as_ref()
        .map(|id| id.name.as_str())
        .unwrap_or_default();
    match super::policies::compile(name, &policy) {
        Ok(_) => Ok(()),
        Err(problems) => Err(Invalid(
            problems
                .into_iter()
                .map(|(field, why)| resource::FieldViolation::new(field, why))
                .collect(),
        )),
    }
}

/// Writing (or deleting) an admission policy needs write on it and `schema` write on every
/// type its match can cover (DESIGN §17): a team cannot police another team's types.
fn admission_policy_acls() -> Acls {
    Acls {
        write: Arc::new(|authorizer: &dyn Authorizer, resource: &Resource| {
            let id = resource.id.clone().unwrap_or_default();
            acl::require_resource(authorizer, &id, Access::Write)?;
            let Some(data) = resource.data.as_ref() else {
                return Ok(());
            };
            let policy: proto::policy::v1::AdmissionPolicy =
                prost::Message::decode(data.value.as_slice()).map_err(|error| {
                    AclError::PermissionDenied(format!("resource.data does not decode: {error}"))
                })?;
            // Its params become data its validations (and their refusals) read: the writer must
            // be able to read them.
            if let Some(params) = &policy.params {
                acl::require_resource(authorizer, params, Access::Read).map_err(|error| {
                    AclError::PermissionDenied(format!(
                        "a policy's params are read by its validations, so its writer must be able to read them: {error}"
                    ))
                })?;
            }
            let globs = match &policy.r#match {
                Some(m) if !m.types.is_empty() => m.types.clone(),
                _ => vec!["*.*.*".to_owned()],
            };
            for glob in globs {
                if !authorizer.owns_types(&glob) {
                    return Err(AclError::PermissionDenied(format!(
                        "token lacks schema write on {glob}: a policy over a type needs the type's ownership (a policy rule with `schema: ACCESS_WRITE` whose types contain {glob}; no types means every type)"
                    )));
                }
            }
            Ok(())
        }),
        ..Acls::default()
    }
}

/// Quotas are the platform's: writing one needs operator write (a team that may write its
/// namespace may not raise its own limits); reading one, read on it.
fn quota_acls() -> Acls {
    Acls {
        write: Arc::new(|authorizer: &dyn Authorizer, resource: &Resource| {
            acl::require_operator(authorizer, Access::Write).map_err(|error| {
                AclError::PermissionDenied(format!(
                    "writing a quota needs operator write (a namespace's writers may not raise their own limits): {error}"
                ))
            })?;
            let id = resource.id.clone().unwrap_or_default();
            acl::require_resource(authorizer, &id, Access::Write)
        }),
        ..Acls::default()
    }
}

#[cfg(test)]
#[test]
fn quota_limits_are_bytes_or_counts_of_globs() {
    for good in ["bytes", "count/demo.Album", "count/demo.*", "count/*"] {
        let hard = [(good.to_owned(), 1)].into();
        assert_eq!(resource::check_quota_hard(&hard), Ok(()), "{good}");
    }
    for bad in [
        "count",
        "count/",
        "objects",
        "count/demo.v2.Album",
        "count/demo.",
    ] {
        let hard = [(bad.to_owned(), 1)].into();
        assert!(resource::check_quota_hard(&hard).is_err(), "{bad}");
    }
}

/// Names a client writes for people to read (reports, shard maps): without control characters
/// and at most 253 bytes each. `field` is its place under `resource.data` (`[]`: one of a list).
fn check_printable<'a>(
    problems: &mut Invalid,
    named: impl IntoIterator<Item = (&'a str, &'a str)>,
) {
    for (field, value) in named {
        let path = format!("resource.data.{}", field.trim_end_matches("[]"));
        if has_control(value) {
            problems.push(
                &path,
                format!(
                    "resource.data.{field} {:?} holds control characters",
                    value.escape_default().to_string()
                ),
            );
        }
        if value.len() > 253 {
            problems.push(
                &path,
                format!(
                    "resource.data.{field} is {} bytes long; at most 253",
                    value.len()
                ),
            );
        }
    }
}

fn validate_replica(resource: &Resource) -> Result<(), Invalid> {
    let report: proto::coordination::v1::Replica = data_of(resource)?;
    let mut problems = Invalid::default();
    let mut named = vec![
        ("controller", report.controller.as_str()),
        ("identity", report.identity.as_str()),
        ("host", report.host.as_str()),
        ("lease", report.lease.as_str()),
    ];
    named.extend(
        report
            .finalizers
            .iter()
            .map(|f| ("finalizers[]", f.as_str())),
    );
    check_printable(&mut problems, named);
    if report.controller.is_empty() {
        problems.push(
            "resource.data.controller",
            "resource.data.controller is required",
        );
    }
    if report.report_every_seconds > MAX_REPORT_EVERY_SECONDS {
        problems.push(
            "resource.data.report_every_seconds",
            format!(
                "resource.data.report_every_seconds is {}; a replica reports at least every {MAX_REPORT_EVERY_SECONDS} seconds (0 means every 10)",
                report.report_every_seconds
            ),
        );
    }
    // A shard member's lease is its own, named after its controller and identity: the server
    // takes it when the member drops out of the ring, so a report may not point it at a lease
    // of anyone else's.
    if report.placement() == proto::coordination::v1::ReplicaPlacement::Sharded {
        let own = runtime::report::member_name(&report.controller, &report.identity);
        if let Err(why) = resource::check_name(&report.controller, resource::MAX_NAME_LEN) {
            problems.push(
                "resource.data.controller",
                format!("a sharded controller's name names its ShardMap: {why}"),
            );
        }
        if report.identity.is_empty() {
            problems.push(
                "resource.data.identity",
                "a sharded member names its identity (resource.data.identity)",
            );
        } else if resource.id.as_ref().is_some_and(|id| id.name != own) {
            problems.push(
                "resource.id.name",
                format!(
                    "a sharded member's report is named {own:?} (after its controller and identity): one report per member"
                ),
            );
        } else if report.lease != own {
            problems.push(
                "resource.data.lease",
                format!(
                    "a sharded member's lease is its own, {own:?} (named after its controller and identity), not {:?}",
                    report.lease.escape_default().to_string()
                ),
            );
        }
    }
    problems.into_result()
}

/// Longest event reason and message.
const MAX_EVENT_REASON: usize = 128;
const MAX_EVENT_MESSAGE: usize = 4096;

/// An Event names the object it regards (in its own namespace: `default/default` for an object
/// of cluster or partition scope), a one-word reason, a message people can read.
fn validate_event(resource: &Resource) -> Result<(), Invalid> {
    let event: proto::events::v1::Event = data_of(resource)?;
    let mut problems = Invalid::default();
    match &event.regarding {
        None => problems.push(
            "resource.data.regarding",
            "resource.data.regarding is required: the id of the object the event is about",
        ),
        Some(regarding) => {
            if regarding.r#type.is_none() || regarding.name.is_empty() {
                problems.push(
                    "resource.data.regarding",
                    "resource.data.regarding needs a type and a name",
                );
            }
            let at = regarding.tenancy.clone().unwrap_or_default();
            let expected = if at.namespace.is_empty() {
                (
                    resource::DEFAULT_PARTITION.to_owned(),
                    resource::DEFAULT_NAMESPACE.to_owned(),
                )
            } else {
                (at.partition.clone(), at.namespace.clone())
            };
            let tenancy = resource
                .id
                .as_ref()
                .and_then(|id| id.tenancy.clone())
                .unwrap_or_default();
            if (tenancy.partition.clone(), tenancy.namespace.clone()) != expected {
                problems.push(
                    "resource.id.tenancy",
                    format!(
                        "an event lives in the namespace of the object it regards ({}/{}), not {}/{}",
                        expected.0, expected.1, tenancy.partition, tenancy.namespace
                    ),
                );
            }
        }
    }
    if event.reason.is_empty()
        || event.reason.len() > MAX_EVENT_REASON
        || !event.reason.chars().all(|c| c.is_ascii_alphanumeric())
    {
        problems.push(
            "resource.data.reason",
            format!(
                "resource.data.reason {:?} must be one word of letters and digits, 1 to {MAX_EVENT_REASON} long (`Cascaded`)",
                event.reason.escape_default().to_string()
            ),
        );
    }
    if has_control(&event.message) {
        problems.push(
            "resource.data.message",
            "resource.data.message holds control characters (an operator's terminal shows it)",
        );
    }
    if event.message.len() > MAX_EVENT_MESSAGE {
        problems.push(
            "resource.data.message",
            format!(
                "resource.data.message is {} bytes long; at most {MAX_EVENT_MESSAGE}",
                event.message.len()
            ),
        );
    }
    if event.reporter.len() > 253 || has_control(&event.reporter) {
        problems.push(
            "resource.data.reporter",
            "resource.data.reporter must be at most 253 characters without control characters",
        );
    }
    problems.into_result()
}

/// A resource's data as `M`, or what is wrong with it (as the field `resource.data`).
fn data_of<M>(resource: &Resource) -> Result<M, Invalid>
where
    M: prost::Message + Default + prost::Name,
{
    decode_data(resource).map_err(|why| Invalid::at("resource.data", why))
}

/// A report is a claim checked by the server (DESIGN §16): it may name only a controller of a
/// type its writer may write (never a built-in controller), and only finalizers under a domain
/// of that type's group.
/// Writing an event needs write on `events.v1.Event` where it lives; only the server's own
/// identities may record as a built-in controller (`controller/reaper`…).
fn event_acls() -> Acls {
    Acls {
        write: Arc::new(|authorizer: &dyn Authorizer, resource: &Resource| {
            let id = resource.id.clone().unwrap_or_default();
            acl::require_resource(authorizer, &id, Access::Write)?;
            if resource.data.is_none() || authorizer.is_server() {
                return Ok(());
            }
            let event: proto::events::v1::Event =
                decode_data(resource).map_err(AclError::PermissionDenied)?;
            let claimed = event
                .reporter
                .strip_prefix("controller/")
                .unwrap_or(&event.reporter);
            if BUILTIN_CONTROLLERS.contains(&claimed) {
                return Err(AclError::PermissionDenied(format!(
                    "reporter {:?} is a controller built into the server: only the server records as it",
                    event.reporter
                )));
            }
            Ok(())
        }),
        ..Acls::default()
    }
}

/// A ShardMap is the server's (its `shards` controller) to keep; an operator may repair one by
/// hand; a team's token — whatever it may write otherwise — may only read it: writing it would
/// hand another member's objects to a replica of its choosing.
fn shard_map_acls() -> Acls {
    Acls {
        write: Arc::new(|authorizer: &dyn Authorizer, resource: &Resource| {
            let id = resource.id.clone().unwrap_or_default();
            acl::require_resource(authorizer, &id, Access::Write)?;
            if authorizer.is_server() || acl::require_operator(authorizer, Access::Write).is_ok() {
                return Ok(());
            }
            Err(AclError::PermissionDenied(
                "a coordination.v1.ShardMap is kept by the server's `shards` controller from its members' reports; only an operator may write one by hand".into(),
            ))
        }),
        ..Acls::default()
    }
}

/// A ShardMap names its controller and at most [`MAX_SHARD_MEMBERS`] members by printable names.
fn validate_shard_map(resource: &Resource) -> Result<(), Invalid> {
    let map: proto::coordination::v1::ShardMap = data_of(resource)?;
    let mut problems = Invalid::default();
    if map.controller.is_empty() {
        problems.push(
            "resource.data.controller",
            "resource.data.controller is required",
        );
    }
    if map.members.len() > MAX_SHARD_MEMBERS || map.settled_members.len() > MAX_SHARD_MEMBERS {
        problems.push(
            "resource.data.members",
            format!("a ShardMap holds at most {MAX_SHARD_MEMBERS} members"),
        );
    }
    let names = std::iter::once(("controller", map.controller.as_str()))
        .chain(map.members.iter().flat_map(|m| {
            [
                ("members[].name", m.name.as_str()),
                ("members[].lease", m.lease.as_str()),
            ]
        }))
        .chain(
            map.settled_members
                .iter()
                .map(|m| ("settled_members[]", m.as_str())),
        );
    check_printable(&mut problems, names);
    problems.into_result()
}

fn replica_acls() -> Acls {
    Acls {
        write: Arc::new(|authorizer: &dyn Authorizer, resource: &Resource| {
            let id = resource.id.clone().unwrap_or_default();
            acl::require_resource(authorizer, &id, Access::Write)?;
            // The server's own identities (the reaper, the namespace controller, management)
            // may delete any report, a forged one stored before these checks included.
            if resource.data.is_none() || authorizer.is_server() {
                return Ok(());
            }
            let report: proto::coordination::v1::Replica =
                decode_data(resource).map_err(AclError::PermissionDenied)?;
            // Not even management's token: only the server runs its own controllers.
            if BUILTIN_CONTROLLERS.contains(&report.controller.as_str()) {
                return Err(AclError::PermissionDenied(format!(
                    "controller {:?} is built into the server: no report may claim it",
                    report.controller
                )));
            }
            if authorizer.is_management() {
                return Ok(());
            }
            let Some(managed) = report.managed_type.as_ref() else {
                return Err(AclError::PermissionDenied(
                    "a report names the type its controller manages (data.managed_type): what it may claim is checked against it".into(),
                ));
            };
            let managed_id = Id {
                uid: String::new(),
                name: String::new(),
                r#type: Some(managed.clone()),
                tenancy: id.tenancy.clone(),
            };
            acl::require_resource(authorizer, &managed_id, Access::Write).map_err(|error| {
                AclError::PermissionDenied(format!(
                    "a report may claim only controllers of types its token may write: {error}"
                ))
            })?;
            for finalizer in &report.finalizers {
                let domain = finalizer.split('/').next().unwrap_or_default();
                let ours = domain == managed.group
                    || domain
                        .strip_prefix(managed.group.as_str())
                        .is_some_and(|rest| rest.starts_with('.'));
                if !ours || !finalizer.contains('/') {
                    return Err(AclError::PermissionDenied(format!(
                        "finalizer {:?} is not under a domain of group {} (like {}.example.com/NAME): a report claims only its own type's finalizers",
                        finalizer.escape_default().to_string(),
                        managed.group,
                        managed.group
                    )));
                }
            }
            Ok(())
        }),
        ..Acls::default()
    }
}

/// A Type is written (and deleted) by who may write the Type resource and holds `schema` write
/// on the group.version.Kind it claims (DESIGN §12.3). Called with only an id (before anything
/// costly), it checks the first; with data, both.
fn type_acls() -> Acls {
    Acls {
        write: Arc::new(|authorizer: &dyn Authorizer, resource: &Resource| {
            let id = resource.id.clone().unwrap_or_default();
            acl::require_resource(authorizer, &id, Access::Write)?;
            if resource.data.is_some() {
                let t: registry_v1::Type = decode_data(resource).map_err(|why| {
                    AclError::PermissionDenied(format!(
                        "the Type's claim cannot be read, so its ownership cannot be checked: {why}"
                    ))
                })?;
                for gvk in claimed_gvks(&t) {
                    acl::require_schema(authorizer, &gvk, Access::Write)?;
                }
            }
            Ok(())
        }),
        ..Acls::default()
    }
}

/// Every group.version.Kind a Type claims: its one, or one per version (DESIGN §15.1).
fn claimed_gvks(t: &registry_v1::Type) -> Vec<String> {
    if t.versions.is_empty() {
        vec![format!("{}.{}.{}", t.group, t.group_version, t.kind)]
    } else {
        t.versions
            .iter()
            .map(|v| format!("{}.{}.{}", t.group, v.name, t.kind))
            .collect()
    }
}

/// Compiles a Type's `.proto` source in the request handler (before proposing), storing the
/// descriptor set beside it: every node then loads the same compiled schema.
fn compile_type(resource: &mut Resource) -> Result<(), Invalid> {
    let written: registry_v1::Type = data_of(resource)?;
    let compiled =
        super::dynamic::compile(&written).map_err(|why| Invalid::named(&in_resource(&why)))?;
    resource.data = Some(proto::to_any(&compiled));
    Ok(())
}

/// Problems found in a Type's data (`data.…`, several joined by `; `), each named as a field
/// of the resource (`resource.data.…`).
fn in_resource(problems: &str) -> String {
    format!(
        "resource.{}",
        problems.replace("; data.", "; resource.data.")
    )
}

/// A Type may claim its group.version.Kind (not built in, not another Type's, within
/// `--max-types`), and an update of one stays compatible with what it replaces.
fn validate_type(types: &super::DynamicTypes, resource: &Resource) -> Result<(), Invalid> {
    let t: registry_v1::Type = data_of(resource)?;
    let name = resource
        .id
        .as_ref()
        .map(|id| id.name.as_str())
        .unwrap_or_default();
    let family =
        super::versions::Family::load_any(&t).map_err(|why| Invalid::named(&in_resource(&why)))?;
    let claimed: Vec<_> = family
        .versions
        .iter()
        .map(|v| v.compiled.resource_type.clone())
        .collect();
    types
        .check_claims(name, &claimed)
        .map_err(|why| Invalid::named(&format!("resource.{why}")))?;
    if let Some(installed) = types.installed(name) {
        super::versions::check_update(&installed.family, &family)
            .map_err(|why| Invalid::at("resource.data", format!("resource.data: {why}")))?;
    }
    for version in &family.versions {
        types
            .check_symbols(name, &version.compiled)
            .map_err(|why| Invalid::named(&format!("resource.{why}")))?;
    }
    types
        .check_schema_bytes(name, family.descriptor_bytes())
        .map_err(|why| Invalid::named(&format!("resource.{why}")))?;
    Ok(())
}

/// The id of the tombstone that records the deletion of `deleted`.
pub(crate) fn tombstone_id(deleted: &Id) -> Id {
    Id {
        uid: String::new(),
        name: format!("tombstone-{}-{}", deleted.name, deleted.uid.to_lowercase()),
        r#type: Some(resource::new_type(INTERNAL_GROUP, "v1", "Tombstone")),
        tenancy: deleted.tenancy.clone(),
    }
}

/// The group of `Partition` and `Namespace`.
pub(crate) const TENANCY_GROUP: &str = "tenancy";

pub(crate) fn partition_id(name: &str) -> Id {
    Id {
        uid: String::new(),
        name: name.to_owned(),
        r#type: Some(resource::new_type(TENANCY_GROUP, "v1", "Partition")),
        tenancy: Some(Default::default()),
    }
}

pub(crate) fn namespace_id(partition: &str, name: &str) -> Id {
    Id {
        uid: String::new(),
        name: name.to_owned(),
        r#type: Some(resource::new_type(TENANCY_GROUP, "v1", "Namespace")),
        tenancy: Some(proto::resource::v1::Tenancy {
            partition: partition.to_owned(),
            namespace: String::new(),
        }),
    }
}

/// Demo ACLs are the defaults; with `read_needs_data` (RecordLabel) the Read hook asks for the
/// stored resource before it decides, to exercise that path of the service.
fn demo_acls(read_needs_data: bool) -> Acls {
    let defaults = Acls::default();
    if !read_needs_data {
        return defaults;
    }
    Acls {
        read: Arc::new(
            move |authorizer: &dyn Authorizer, id: &Id, stored: Option<&Resource>| {
                if stored.is_none() {
                    return Err(AclError::NeedResource);
                }
                acl::require_resource(authorizer, id, Access::Read)
            },
        ),
        ..defaults
    }
}

fn validate_artist_v2(resource: &Resource) -> Result<(), Invalid> {
    let artist: demo_v2::Artist = data_of(resource)?;
    let mut violations = Invalid::default();
    if artist.name.is_empty() {
        violations.push("resource.data.name", "resource.data.name is required");
    }
    for (member, role) in &artist.group_members {
        if member.is_empty() {
            violations.push(
                "resource.data.group_members",
                format!("resource.data.group_members has an empty member name (role {role:?})"),
            );
        }
    }
    violations.into_result()
}

fn mutate_artist_v2(resource: &mut Resource) -> Result<(), Invalid> {
    let Some(data) = &resource.data else {
        return Ok(());
    };
    let mut artist: demo_v2::Artist = data_of(resource)?;
    if artist.genre == demo_v2::Genre::Unspecified as i32 {
        artist.genre = demo_v2::Genre::Disco as i32;
        resource.data = Some(prost_types::Any {
            type_url: data.type_url.clone(),
            value: prost::Message::encode_to_vec(&artist),
        });
    }
    Ok(())
}

fn validate_policy(resource: &Resource) -> Result<(), Invalid> {
    let policy: acl_v1::Policy = data_of(resource)?;
    let name = resource
        .id
        .as_ref()
        .map(|id| id.name.as_str())
        .unwrap_or_default();
    if name == acl::MANAGEMENT_POLICY {
        return Err(Invalid::at(
            "resource.id.name",
            format!("resource.id.name: {name} is built in and cannot be written"),
        ));
    }
    acl::check_policy(&policy).map_err(|why| Invalid::named(&format!("resource.{why}")))
}

/// Replaces a token's clear secret by its hash before anything else sees it.
fn mutate_token(resource: &mut Resource) -> Result<(), Invalid> {
    let mut token: acl_v1::Token = data_of(resource)?;
    if token.secret.is_empty() {
        return Ok(());
    }
    acl::rules::hash_token_secret(&mut token)
        .map_err(|why| Invalid::named(&format!("resource.{why}")))?;
    resource.data = Some(proto::to_any(&token));
    Ok(())
}

/// Whether `authorizer` holds everything the policy `resource` holds grants.
fn may_grant_policy(authorizer: &dyn Authorizer, resource: &Resource) -> Result<(), AclError> {
    if resource.data.is_none() {
        // An access probe by id (before existence is looked at): see may_grant_token.
        return Ok(());
    }
    let policy: acl_v1::Policy = decode_data(resource).map_err(AclError::PermissionDenied)?;
    let name = resource
        .id
        .as_ref()
        .map(|id| id.name.as_str())
        .unwrap_or_default();
    authorizer.may_grant(acl::Grant::Policy {
        name,
        policy: &policy,
    })
}

/// Whether `authorizer` holds everything the token `resource` holds grants.
fn may_grant_token(authorizer: &dyn Authorizer, resource: &Resource) -> Result<(), AclError> {
    if resource.data.is_none() {
        // An access probe by id (before existence is looked at): the grant is checked on the
        // stored token, or on the written one.
        return Ok(());
    }
    let token: acl_v1::Token = decode_data(resource).map_err(AclError::PermissionDenied)?;
    let name = resource
        .id
        .as_ref()
        .map(|id| id.name.as_str())
        .unwrap_or_default();
    authorizer.may_grant(acl::Grant::Token {
        name,
        token: &token,
    })
}

fn validate_token(resource: &Resource) -> Result<(), Invalid> {
    let token: acl_v1::Token = data_of(resource)?;
    acl::check_token(&token).map_err(|why| Invalid::named(&format!("resource.{why}")))
}

/// The stored policies a token names (the built-in one is not stored).
fn token_policies(resource: &Resource) -> Vec<(String, Id)> {
    let Ok(token) = decode_data::<acl_v1::Token>(resource) else {
        return Vec::new();
    };
    token
        .policies
        .iter()
        .enumerate()
        .filter(|(_, name)| name.as_str() != acl::MANAGEMENT_POLICY)
        .map(|(index, name)| {
            (
                format!("resource.data.policies[{index}]"),
                Id {
                    uid: String::new(),
                    name: name.clone(),
                    r#type: Some(resource::new_type("acl", "v1", "Policy")),
                    tenancy: Some(Default::default()),
                },
            )
        })
        .collect()
}
