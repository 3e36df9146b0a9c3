//! Pure values and rules of the resource model: type strings, name rules, tenancy constants,
//! finalizers and deletion marks, identity comparisons. No IO.
//!
//! The wire types generated in `proto` are the domain values, as in Consul's `pbresource`; this
//! module holds the rules that apply to them.

use std::fmt;

use proto::resource::v1::{Id, Tenancy, Type};

#[cfg(test)]
mod tests;

/// Longest name of a resource, partition or namespace (an RFC 1123 DNS label).
pub(crate) const MAX_NAME_LEN: usize = 63;

/// Wildcard for a tenancy field in List, WatchList and ListByOwner.
pub(crate) const WILDCARD: &str = "*";

pub(crate) const DEFAULT_PARTITION: &str = "default";
pub(crate) const DEFAULT_NAMESPACE: &str = "default";

pub(crate) use proto::meta::{
    DELETION_TIMESTAMP_KEY, FINALIZERS_KEY, add_finalizer, finalizers, has_finalizer,
    has_finalizers, is_marked_for_deletion, remove_finalizer,
};

/// Builds a [`Type`] from its three parts.
pub(crate) fn new_type(group: &str, group_version: &str, kind: &str) -> Type {
    Type {
        group: group.to_owned(),
        group_version: group_version.to_owned(),
        kind: kind.to_owned(),
    }
}

/// Formats a type as `group.group_version.Kind`.
pub(crate) fn gvk(resource_type: &Type) -> String {
    format!(
        "{}.{}.{}",
        resource_type.group, resource_type.group_version, resource_type.kind
    )
}

/// Parses `group.group_version.Kind`, checking each part.
pub(crate) fn parse_gvk(text: &str) -> Result<Type, String> {
    let parts: Vec<&str> = text.split('.').collect();
    let [group, group_version, kind] = parts.as_slice() else {
        return Err(format!(
            "{text:?} is not a type: expected group.group_version.Kind, e.g. demo.v2.Artist"
        ));
    };
    let resource_type = new_type(group, group_version, kind);
    let violations = type_violations(&resource_type);
    if violations.is_empty() {
        Ok(resource_type)
    } else {
        Err(format!(
            "{text:?} is not a valid type: {}",
            violations.join("; ")
        ))
    }
}

/// Checks the three parts of a type; one message per invalid part, naming the part.
pub(crate) fn type_violations(resource_type: &Type) -> Vec<String> {
    type_part_violations(resource_type)
        .into_iter()
        .map(|(part, why)| format!("{part} {why}"))
        .collect()
}

/// What is wrong with each part of a type: (`group`, `group_version` or `kind`, why).
pub(crate) fn type_part_violations(resource_type: &Type) -> Vec<(&'static str, String)> {
    let mut violations = Vec::new();
    if let Err(why) = check_group(&resource_type.group) {
        violations.push(("group", why));
    }
    if let Err(why) = check_group_version(&resource_type.group_version) {
        violations.push(("group_version", why));
    }
    if let Err(why) = check_kind(&resource_type.kind) {
        violations.push(("kind", why));
    }
    violations
}

/// `^[a-z][a-z\d_]+$`
pub(crate) fn check_group(group: &str) -> Result<(), String> {
    let mut chars = group.chars();
    let valid = matches!(chars.next(), Some('a'..='z'))
        && group.len() >= 2
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{group:?} is invalid: must be a lowercase letter followed by lowercase letters, digits or '_' (at least 2 characters)"
        ))
    }
}

/// `^v([a-z\d]+)?\d$`
pub(crate) fn check_group_version(group_version: &str) -> Result<(), String> {
    let bytes = group_version.as_bytes();
    let valid = bytes.len() >= 2
        && bytes[0] == b'v'
        && bytes[bytes.len() - 1].is_ascii_digit()
        && bytes[1..]
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{group_version:?} is invalid: must look like v1, v2 or v1alpha1 ('v', lowercase letters or digits, ending in a digit)"
        ))
    }
}

/// `^[A-Z][A-Za-z\d]+$`
pub(crate) fn check_kind(kind: &str) -> Result<(), String> {
    let mut chars = kind.chars();
    let valid = matches!(chars.next(), Some('A'..='Z'))
        && kind.len() >= 2
        && chars.all(|c| c.is_ascii_alphanumeric());
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{kind:?} is invalid: must be an uppercase letter followed by letters or digits (at least 2 characters)"
        ))
    }
}

/// Checks a resource, partition or namespace name: a lowercase RFC 1123 DNS label of at most
/// `max_len` characters. The message says what is wrong with this particular name.
pub(crate) fn check_name(name: &str, max_len: usize) -> Result<(), String> {
    let problem = if name.is_empty() {
        "is empty".to_owned()
    } else if name.len() > max_len {
        format!("is {} characters long, the limit is {max_len}", name.len())
    } else if let Some(c) = name.chars().find(|c| c.is_ascii_uppercase()) {
        format!("contains the uppercase letter {c:?}")
    } else if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        format!("contains {c:?}")
    } else if name.starts_with('-') || name.ends_with('-') {
        "starts or ends with '-'".to_owned()
    } else {
        return Ok(());
    };
    Err(format!(
        "{name:?} {problem}: a name is a lowercase RFC 1123 label (a-z, 0-9 and '-', starting and ending with a letter or digit, 1-{max_len} characters)"
    ))
}

/// Formats an id for messages and logs: `demo.v2.Artist/default/default/miles-davis`.
pub(crate) struct DisplayId<'a>(pub &'a Id);

impl fmt::Display for DisplayId<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let id = self.0;
        match &id.r#type {
            Some(resource_type) => write!(f, "{}", gvk(resource_type))?,
            None => write!(f, "<no type>")?,
        }
        let tenancy = id.tenancy.clone().unwrap_or_default();
        if !tenancy.partition.is_empty() {
            write!(f, "/{}", tenancy.partition)?;
        }
        if !tenancy.namespace.is_empty() {
            write!(f, "/{}", tenancy.namespace)?;
        }
        write!(f, "/{}", id.name)
    }
}

/// Whether two ids name the same stored object: same group, kind, tenancy and name. The group
/// version and the uid are not compared (storage keeps one object per name, whatever its version).
pub(crate) fn same_name(a: &Id, b: &Id) -> bool {
    let (a_type, b_type) = (
        a.r#type.clone().unwrap_or_default(),
        b.r#type.clone().unwrap_or_default(),
    );
    a_type.group == b_type.group
        && a_type.kind == b_type.kind
        && a.tenancy.clone().unwrap_or_default() == b.tenancy.clone().unwrap_or_default()
        && a.name == b.name
}

/// Whether `owner` is the resource `pattern` names: same uid, group, kind and name, and a
/// tenancy that the pattern's tenancy (fields may be [`WILDCARD`]) matches.
pub(crate) fn owner_matches(pattern: &Id, owner: &Id) -> bool {
    let (pattern_type, owner_type) = (
        pattern.r#type.clone().unwrap_or_default(),
        owner.r#type.clone().unwrap_or_default(),
    );
    pattern.uid == owner.uid
        && pattern.name == owner.name
        && pattern_type.group == owner_type.group
        && pattern_type.kind == owner_type.kind
        && tenancy_matches(
            &pattern.tenancy.clone().unwrap_or_default(),
            &owner.tenancy.clone().unwrap_or_default(),
        )
}

/// Whether a tenancy pattern (fields may be [`WILDCARD`]) matches a concrete tenancy.
pub(crate) fn tenancy_matches(pattern: &Tenancy, tenancy: &Tenancy) -> bool {
    let field = |want: &str, have: &str| want == WILDCARD || want == have;
    field(&pattern.partition, &tenancy.partition) && field(&pattern.namespace, &tenancy.namespace)
}

/// Formats a time as RFC 3339 (UTC, nanoseconds), the form of `deletionTimestamp`.
pub(crate) fn rfc3339(time: std::time::SystemTime) -> String {
    prost_types::Timestamp::from(time).to_string()
}

/// Default of `--max-resource-bytes`: the largest resource, encoded. Rules' worst cases are
/// estimated with it too (`registry::cel`).
pub(crate) const DEFAULT_MAX_RESOURCE_BYTES: usize = 4 * 1024 * 1024;

/// A storage version: the position of a change in the backend's history. For the Raft backend,
/// the log index of the entry that made the change and, for the second and later operations of
/// an entry that batches several, their position in it. Formats as `index` or
/// `index.position`; ordered by index, then position.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub index: u64,
    pub position: u32,
}

impl Version {
    pub fn new(index: u64) -> Self {
        Version { index, position: 0 }
    }

    pub fn at(index: u64, position: u32) -> Self {
        Version { index, position }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.position == 0 {
            write!(f, "{}", self.index)
        } else {
            write!(f, "{}.{}", self.index, self.position)
        }
    }
}

impl std::str::FromStr for Version {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || format!("{text:?} is not a version this server issued");
        let (index, position) = match text.split_once('.') {
            Some((index, position)) => (index, position.parse::<u32>().map_err(|_| invalid())?),
            None => (text, 0),
        };
        Ok(Version {
            index: index.parse::<u64>().map_err(|_| invalid())?,
            position,
        })
    }
}

/// One thing wrong with a request or a resource (Kubernetes' `field.Error`): the field's path
/// (`resource.data.amount_cents`) and the words for people, which name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    pub field: String,
    pub message: String,
}

impl FieldViolation {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldViolation {
            field: field.into(),
            message: message.into(),
        }
    }

    /// A violation whose message starts with the field's path (`resource.data.x is required`,
    /// `resource.data.x: …`), the form the checks below the service word theirs in.
    pub fn named(message: impl Into<String>) -> Self {
        let message = message.into();
        let field = message
            .split([' ', ':'])
            .next()
            .filter(|path| path.starts_with("resource.") || path.starts_with("data."))
            .unwrap_or_default()
            .to_owned();
        FieldViolation { field, message }
    }
}

/// A `tenancy.v1.Quota`'s `hard` key for stored bytes (DESIGN §17).
pub(crate) const QUOTA_BYTES: &str = "bytes";
/// A quota's `hard` keys for object counts start with this, then a `group.Kind` glob.
pub(crate) const QUOTA_COUNT: &str = "count/";

/// Checks the keys of a quota's `hard` (what a client writes): `bytes` or `count/<glob>`, the
/// glob over `group.Kind` (no version) or `*`.
pub(crate) fn check_quota_hard(
    hard: &std::collections::BTreeMap<String, u64>,
) -> Result<(), String> {
    for key in hard.keys() {
        let known = key == QUOTA_BYTES
            || key.strip_prefix(QUOTA_COUNT).is_some_and(|glob| {
                glob == "*"
                    || (glob.split('.').count() == 2
                        && glob.split('.').all(|part| !part.is_empty()))
            });
        if !known {
            return Err(format!(
                "data.hard key {key:?} is not `bytes` or `count/<group.Kind glob>` (like count/demo.Album, count/demo.*, count/*)"
            ));
        }
    }
    Ok(())
}

/// Everything wrong with a resource (Kubernetes' `field.ErrorList`): a refusal as data, from a
/// hook or a rule through storage and `Forward`, made into a `google.rpc.BadRequest` once, at
/// the service's edge (`service::error`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Invalid(pub Vec<FieldViolation>);

impl Invalid {
    /// One violation of `field`.
    pub fn at(field: impl Into<String>, message: impl Into<String>) -> Self {
        Invalid(vec![FieldViolation::new(field, message)])
    }

    /// Problems worded with their field first, several joined by `; ` (what the checks of a
    /// Type's schema report).
    pub fn named(problems: &str) -> Self {
        Invalid(problems.split("; ").map(FieldViolation::named).collect())
    }

    pub fn push(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldViolation::new(field, message));
    }

    /// `Ok` when nothing is wrong.
    pub fn into_result(self) -> Result<(), Invalid> {
        if self.0.is_empty() { Ok(()) } else { Err(self) }
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, violation) in self.0.iter().enumerate() {
            if n > 0 {
                f.write_str("; ")?;
            }
            f.write_str(&violation.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for Invalid {}

// Objects' history (DESIGN §18): how much a type keeps; kept by storage.

/// Default versions kept per object.
pub const DEFAULT_HISTORY_VERSIONS: u32 = 100;
/// Default age of the oldest version kept (7 days).
pub const DEFAULT_HISTORY_SECONDS: u64 = 7 * 24 * 3600;
/// Default bytes kept per object (1 MiB).
pub const DEFAULT_HISTORY_BYTES: u64 = 1 << 20;
/// How much of an object's history its type keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Versions kept per object; 0 keeps none.
    pub versions: u32,
    /// Age of the oldest version kept; 0: no limit by age.
    pub seconds: u64,
    /// Bytes kept per object (the newest version always stays); 0: no limit by bytes.
    pub bytes: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            versions: DEFAULT_HISTORY_VERSIONS,
            seconds: DEFAULT_HISTORY_SECONDS,
            bytes: DEFAULT_HISTORY_BYTES,
        }
    }
}

impl Retention {
    /// No history at all.
    pub const OFF: Retention = Retention {
        versions: 0,
        seconds: 0,
        bytes: 0,
    };

    pub fn is_off(&self) -> bool {
        self.versions == 0
    }
}
