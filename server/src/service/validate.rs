//! Shape checks of requests and the tenancy rules of scopes. Every check reports every violation
//! it finds, each naming its field.

use proto::resource::v1::{Id, Reference, Tenancy, Type};

use super::error::FieldViolation;
use crate::registry::{Registry, Scope, builtin};
use crate::resource;

/// Collects violations, each of a field, and turns them into one [`resource::Invalid`] (typed
/// data below the service; a `google.rpc.BadRequest` once it reaches the wire).
#[derive(Debug, Default)]
pub(super) struct Violations(Vec<FieldViolation>);

impl Violations {
    /// A violation of `field` (a path in the request: `resource.id.name`), said in `message`.
    pub(super) fn push(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldViolation {
            field: field.into(),
            message: message.into(),
        });
    }

    pub(super) fn finish(self) -> Result<(), resource::Invalid> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(resource::Invalid(self.0))
        }
    }
}

/// Whether `*` is accepted in tenancy fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Wildcards {
    Allowed,
    Forbidden,
}

pub(super) fn check_type(violations: &mut Violations, field: &str, resource_type: Option<&Type>) {
    match resource_type {
        None => violations.push(field, format!("{field} is required")),
        Some(resource_type) => {
            for (part, why) in resource::type_part_violations(resource_type) {
                violations.push(format!("{field}.{part}"), format!("{field}.{part} {why}"));
            }
        }
    }
}

/// Whether a tenancy may be left out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Absent {
    /// Left out means empty: the defaults of the type's scope (ids, as in Consul 1.18).
    Defaults,
    /// It must be there (List, condition references).
    Required,
}

pub(super) fn check_tenancy(
    violations: &mut Violations,
    field: &str,
    tenancy: Option<&Tenancy>,
    wildcards: Wildcards,
    absent: Absent,
) {
    let Some(tenancy) = tenancy else {
        if absent == Absent::Required {
            violations.push(
                field,
                format!(
                    "{field} is required (send an empty tenancy for the defaults of the type's scope)"
                ),
            );
        }
        return;
    };
    for (part, value) in [
        ("partition", &tenancy.partition),
        ("namespace", &tenancy.namespace),
    ] {
        if value.is_empty() || (wildcards == Wildcards::Allowed && value == resource::WILDCARD) {
            continue;
        }
        if value == resource::WILDCARD {
            violations.push(
                format!("{field}.{part}"),
                format!("{field}.{part} cannot be the wildcard \"*\" here"),
            );
        } else if let Err(why) = resource::check_name(value, resource::MAX_NAME_LEN) {
            violations.push(
                format!("{field}.{part}"),
                format!("{field}.{part} invalid: {why}"),
            );
        }
    }
}

/// The longest name a type allows: tombstone names are longer than other names.
fn max_name_len(registry: &Registry, resource_type: Option<&Type>) -> usize {
    resource_type
        .and_then(|t| registry.resolve_stored(t))
        .map(|registration| registration.max_name_len)
        .unwrap_or(resource::MAX_NAME_LEN)
}

/// Checks that an id has a valid type, name and tenancy. The uid is the server's business and is
/// not checked.
pub(super) fn check_id(
    violations: &mut Violations,
    field: &str,
    id: Option<&Id>,
    wildcards: Wildcards,
    registry: &Registry,
) {
    let Some(id) = id else {
        violations.push(field, format!("{field} is required"));
        return;
    };
    check_type(violations, &format!("{field}.type"), id.r#type.as_ref());
    if let Err(why) = resource::check_name(&id.name, max_name_len(registry, id.r#type.as_ref())) {
        violations.push(
            format!("{field}.name"),
            format!("{field}.name invalid: {why}"),
        );
    }
    check_tenancy(
        violations,
        &format!("{field}.tenancy"),
        id.tenancy.as_ref(),
        wildcards,
        Absent::Defaults,
    );
}

/// Checks a resource's id and, if it has one, its owner's id (no wildcards), reporting every
/// violation of both.
pub(super) fn check_resource_ids(
    resource: &proto::resource::v1::Resource,
    registry: &Registry,
) -> Result<(), resource::Invalid> {
    let mut violations = Violations::default();
    check_id(
        &mut violations,
        "resource.id",
        resource.id.as_ref(),
        Wildcards::Forbidden,
        registry,
    );
    if let Some(owner) = &resource.owner {
        check_id(
            &mut violations,
            "resource.owner",
            Some(owner),
            Wildcards::Forbidden,
            registry,
        );
    }
    violations.finish()
}

pub(super) fn check_reference(violations: &mut Violations, field: &str, reference: &Reference) {
    check_type(
        violations,
        &format!("{field}.type"),
        reference.r#type.as_ref(),
    );
    if let Err(why) = resource::check_name(&reference.name, builtin::MAX_TOMBSTONE_NAME_LEN) {
        violations.push(
            format!("{field}.name"),
            format!("{field}.name invalid: {why}"),
        );
    }
    check_tenancy(
        violations,
        &format!("{field}.tenancy"),
        reference.tenancy.as_ref(),
        Wildcards::Forbidden,
        Absent::Required,
    );
}

/// Checks a List or WatchList name prefix: the start of a name, so lowercase letters, digits
/// and '-' only.
pub(super) fn check_name_prefix(violations: &mut Violations, prefix: &str) {
    if let Some(c) = prefix
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        violations.push(
            "name_prefix",
            format!(
                "name_prefix invalid: {prefix:?} contains {c:?}: names are lowercase RFC 1123 labels (a-z, 0-9 and '-'), so no name starts with it"
            ),
        );
    }
}

/// A selector over metadata (DESIGN §3): `None` when empty (everything matches); a violation
/// naming the column where it does not parse.
pub(super) fn check_selector(
    violations: &mut Violations,
    selector: &str,
) -> Option<proto::selector::Selector> {
    match proto::selector::Selector::parse(selector) {
        Ok(parsed) if parsed.is_empty() => None,
        Ok(parsed) => Some(parsed),
        Err(error) => {
            violations.push("selector", error.to_string());
            None
        }
    }
}

/// Applies the defaults of a scope to a tenancy and rejects the parts the scope does not have.
/// With wildcards, `*` is kept where the scope has the part and dropped where it does not.
pub(super) fn apply_scope(
    field: &str,
    gvk: &str,
    scope: Scope,
    tenancy: &mut Tenancy,
    wildcards: Wildcards,
) -> Result<(), resource::Invalid> {
    let is_wildcard = |value: &str| wildcards == Wildcards::Allowed && value == resource::WILDCARD;
    let mut violations = Violations::default();
    match scope {
        Scope::Namespace => {
            if tenancy.partition.is_empty() {
                tenancy.partition = resource::DEFAULT_PARTITION.into();
            }
            if tenancy.namespace.is_empty() {
                tenancy.namespace = resource::DEFAULT_NAMESPACE.into();
            }
        }
        Scope::Partition => {
            if tenancy.partition.is_empty() {
                tenancy.partition = resource::DEFAULT_PARTITION.into();
            }
            if is_wildcard(&tenancy.namespace) {
                tenancy.namespace.clear();
            } else if !tenancy.namespace.is_empty() {
                violations.push(
                    format!("{field}.namespace"),
                    format!(
                        "{field}.namespace: partition scoped resource {gvk} cannot have a namespace, got {:?}",
                        tenancy.namespace
                    ),
                );
            }
        }
        Scope::Cluster => {
            for (part, value) in [
                ("partition", &mut tenancy.partition),
                ("namespace", &mut tenancy.namespace),
            ] {
                if is_wildcard(value) {
                    value.clear();
                } else if !value.is_empty() {
                    violations.push(
                        format!("{field}.{part}"),
                        format!(
                            "{field}.{part}: cluster scoped resource {gvk} cannot have a {part}, got {value:?}"
                        ),
                    );
                }
            }
        }
        Scope::Any => {}
    }
    violations.finish()
}

/// Checks `observed_generation`-style ULIDs.
pub(super) fn check_ulid(violations: &mut Violations, field: &str, value: &str) {
    if value.is_empty() {
        violations.push(field, format!("{field} is required"));
    } else if ulid::Ulid::from_string(value).is_err() {
        violations.push(field, format!("{field} invalid: {value:?} is not a ULID"));
    }
}
