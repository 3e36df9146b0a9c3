//! The type registry: which resource types exist, how they are scoped, and the hooks (validate,
//! mutate, ACLs) the resource service runs for them.
//!
//! A [`Registry`] is built once at startup ([`Registry::builtin`]) and then shared read-only.
//! Registration errors are programming errors; they surface at startup and in tests.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, LazyLock};

use proto::resource::v1::{Id, Resource, Tenancy, Type};

use crate::acl::{self, AclError, Authorizer};
use crate::resource;

pub mod builtin;
#[cfg(test)]
mod tests;

/// Where resources of a type live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// No partition, no namespace.
    Cluster,
    /// A partition, no namespace.
    Partition,
    /// A partition and a namespace.
    Namespace,
    /// Whatever tenancy it is written to: tombstones live where the resource they replace lived.
    Any,
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Scope::Cluster => "cluster",
            Scope::Partition => "partition",
            Scope::Namespace => "namespace",
            Scope::Any => "any",
        }
    }
}

/// Validate hook: every violation in one message, naming the field (`resource.data.name is required`).
pub type ValidateHook = Arc<dyn Fn(&Resource) -> Result<(), String> + Send + Sync>;
/// Mutate hook: fills defaults into the resource before validation.
pub type MutateHook = Arc<dyn Fn(&mut Resource) -> Result<(), String> + Send + Sync>;
/// References hook: the ids a resource names that must exist, with the field naming each.
pub type ReferencesHook = Arc<dyn Fn(&Resource) -> Vec<(String, Id)> + Send + Sync>;
/// Read ACL hook. Gets the stored resource only after it answered [`AclError::NeedResource`].
pub type ReadAcl =
    Arc<dyn Fn(&dyn Authorizer, &Id, Option<&Resource>) -> Result<(), AclError> + Send + Sync>;
pub type WriteAcl = Arc<dyn Fn(&dyn Authorizer, &Resource) -> Result<(), AclError> + Send + Sync>;
pub type ListAcl = Arc<dyn Fn(&dyn Authorizer, &Tenancy) -> Result<(), AclError> + Send + Sync>;

/// ACL hooks of a type (DESIGN §12.3). The defaults: Read needs READ on the resource (type,
/// tenancy, name), Write (and Delete, WriteStatus) WRITE; List and watches are open and return
/// only what the read hook lets the caller see.
#[derive(Clone)]
pub struct Acls {
    pub read: ReadAcl,
    pub write: WriteAcl,
    pub list: ListAcl,
}

/// The default Read hook, one shared value: [`Acls::read_is_default`] recognises it.
static DEFAULT_READ: LazyLock<ReadAcl> = LazyLock::new(|| {
    Arc::new(|authorizer, id, _| acl::require_resource(authorizer, id, acl::Access::Read))
});

impl Default for Acls {
    fn default() -> Self {
        Acls {
            read: DEFAULT_READ.clone(),
            write: Arc::new(|authorizer, resource| {
                let id = resource.id.clone().unwrap_or_default();
                acl::require_resource(authorizer, &id, acl::Access::Write)
            }),
            list: Arc::new(|_, _| Ok(())),
        }
    }
}

impl Acls {
    /// Whether the Read hook is the default one (READ on the resource, nothing else), so a
    /// caller whose authorizer [reads everything](Authorizer::reads_everything) may see every
    /// resource of the type without asking per item. A type that sets its own hook (even
    /// starting from `..Acls::default()`) is not.
    pub fn read_is_default(&self) -> bool {
        Arc::ptr_eq(&self.read, &DEFAULT_READ)
    }

    /// The ACL types themselves: reading and listing need `acl` read; writing (and deleting)
    /// needs `acl` write and holding everything the written object grants (`grant` says what
    /// that is), so no token climbs above its own access through a token or policy it writes.
    pub fn acl_managed(grant: fn(&dyn Authorizer, &Resource) -> Result<(), AclError>) -> Acls {
        Acls {
            read: Arc::new(|authorizer, _, _| acl::require_acl(authorizer, acl::Access::Read)),
            write: Arc::new(move |authorizer, resource| {
                acl::require_acl(authorizer, acl::Access::Write)?;
                grant(authorizer, resource)
            }),
            list: Arc::new(|authorizer, _| acl::require_acl(authorizer, acl::Access::Read)),
        }
    }
}

/// Checks that bytes decode as the registered message.
type DecodeCheck = fn(&[u8]) -> Result<(), prost::DecodeError>;
/// Compares two encodings by their decoded messages (encodings of equal messages may differ).
type DataEq = fn(&[u8], &[u8]) -> bool;

/// One registered type.
#[derive(Clone)]
pub struct Registration {
    pub resource_type: Type,
    /// Full protobuf name of the data message, e.g. `resd.demo.v2.Artist`.
    pub message_name: String,
    pub scope: Scope,
    pub validate: Option<ValidateHook>,
    pub mutate: Option<MutateHook>,
    /// Resources a valid one refers to, which must exist when it is written (a token's
    /// policies), each with the field that names it.
    pub references: Option<ReferencesHook>,
    pub acls: Acls,
    /// Longest allowed name: tombstone names embed the deleted resource's name and uid.
    pub max_name_len: usize,
    /// Clients may not write it; only the server does (tombstones).
    pub server_written: bool,
    decode_check: DecodeCheck,
    data_eq: DataEq,
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("type", &resource::gvk(&self.resource_type))
            .field("message_name", &self.message_name)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl Registration {
    /// A registration for the data message `M` with default hooks. `gvk` is checked when the
    /// registration is added to a registry.
    pub fn new<M>(gvk: &str, scope: Scope) -> Self
    where
        M: prost::Message + prost::Name + Default + PartialEq,
    {
        let parts: Vec<&str> = gvk.split('.').collect();
        let resource_type = match parts.as_slice() {
            [group, version, kind] => resource::new_type(group, version, kind),
            _ => resource::new_type(gvk, "", ""),
        };
        Registration {
            resource_type,
            message_name: M::full_name(),
            scope,
            validate: None,
            references: None,
            mutate: None,
            acls: Acls::default(),
            max_name_len: resource::MAX_NAME_LEN,
            server_written: false,
            decode_check: |bytes| M::decode(bytes).map(|_| ()),
            data_eq: |a, b| {
                a == b || matches!((M::decode(a), M::decode(b)), (Ok(a), Ok(b)) if a == b)
            },
        }
    }

    pub fn with_references(
        mut self,
        hook: impl Fn(&Resource) -> Vec<(String, Id)> + Send + Sync + 'static,
    ) -> Self {
        self.references = Some(Arc::new(hook));
        self
    }

    pub fn with_validate(
        mut self,
        hook: impl Fn(&Resource) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        self.validate = Some(Arc::new(hook));
        self
    }

    pub fn with_mutate(
        mut self,
        hook: impl Fn(&mut Resource) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        self.mutate = Some(Arc::new(hook));
        self
    }

    pub fn with_acls(mut self, acls: Acls) -> Self {
        self.acls = acls;
        self
    }

    /// The write hook on `id` alone, before anything stored is read: a caller without the
    /// access learns nothing of what is stored (its answer does not depend on it).
    pub fn check_write_access_before_existence(
        &self,
        authorizer: &dyn Authorizer,
        id: &Id,
    ) -> Result<(), AclError> {
        (self.acls.write)(
            authorizer,
            &Resource {
                id: Some(id.clone()),
                ..Default::default()
            },
        )
    }

    pub fn gvk(&self) -> String {
        resource::gvk(&self.resource_type)
    }

    /// Checks that `data` holds this type's message: the type URL names it and the bytes decode.
    pub fn check_data(&self, data: &prost_types::Any) -> Result<(), String> {
        let got = data.type_url.rsplit('/').next().unwrap_or_default();
        if got != self.message_name {
            return Err(format!(
                "resource.data is of the wrong type: {} holds {}, got {:?}",
                self.gvk(),
                self.message_name,
                data.type_url
            ));
        }
        (self.decode_check)(&data.value).map_err(|error| {
            format!(
                "resource.data invalid: cannot decode {}: {error}",
                self.message_name
            )
        })
    }
}

impl Registration {
    /// Whether two data payloads hold the same message of this type.
    pub fn same_data(&self, a: Option<&prost_types::Any>, b: Option<&prost_types::Any>) -> bool {
        match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => a.type_url == b.type_url && (self.data_eq)(&a.value, &b.value),
            _ => false,
        }
    }
}

/// Decodes the data of a resource as `M`; absent data decodes as the default message. For hooks.
pub fn decode_data<M>(resource: &Resource) -> Result<M, String>
where
    M: prost::Message + prost::Name + Default,
{
    match &resource.data {
        None => Ok(M::default()),
        Some(any) => M::decode(any.value.as_slice()).map_err(|error| {
            format!(
                "resource.data invalid: cannot decode {}: {error}",
                M::full_name()
            )
        }),
    }
}

/// A registration error: always a programming error in the code that registers types.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegistryError {
    #[error("cannot register {gvk:?}: {why}")]
    InvalidType { gvk: String, why: String },
    #[error("cannot register {0}: the type is already registered")]
    Duplicate(String),
}

/// The set of registered types. Built at startup, then shared read-only.
#[derive(Debug, Default)]
pub struct Registry {
    types: BTreeMap<(String, String, String), Arc<Registration>>,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    /// A registry holding every built-in type.
    pub fn builtin() -> Result<Self, RegistryError> {
        let mut registry = Self::new();
        builtin::register(&mut registry)?;
        Ok(registry)
    }

    pub fn register(&mut self, registration: Registration) -> Result<(), RegistryError> {
        let gvk = registration.gvk();
        let violations = resource::type_violations(&registration.resource_type);
        if !violations.is_empty() {
            return Err(RegistryError::InvalidType {
                gvk,
                why: violations.join("; "),
            });
        }
        let resource_type = &registration.resource_type;
        let key = (
            resource_type.group.clone(),
            resource_type.group_version.clone(),
            resource_type.kind.clone(),
        );
        if self.types.contains_key(&key) {
            return Err(RegistryError::Duplicate(gvk));
        }
        self.types.insert(key, Arc::new(registration));
        Ok(())
    }

    pub fn resolve(&self, resource_type: &Type) -> Option<Arc<Registration>> {
        self.types
            .get(&(
                resource_type.group.clone(),
                resource_type.group_version.clone(),
                resource_type.kind.clone(),
            ))
            .cloned()
    }

    /// Registered types a mistyped one probably meant: kinds of the same group within two edits,
    /// those of the requested version first; otherwise the same kind in other versions.
    pub fn similar(&self, resource_type: &Type) -> Vec<String> {
        let wanted_kind = resource_type.kind.to_lowercase();
        let near: Vec<&Registration> = self
            .types
            .values()
            .map(Arc::as_ref)
            .filter(|registration| {
                let candidate = &registration.resource_type;
                candidate.group == resource_type.group
                    && edit_distance(&candidate.kind.to_lowercase(), &wanted_kind) <= 2
            })
            .collect();
        let same_version: Vec<String> = near
            .iter()
            .filter(|registration| {
                registration.resource_type.group_version == resource_type.group_version
            })
            .map(|registration| registration.gvk())
            .collect();
        if same_version.is_empty() {
            near.iter().map(|registration| registration.gvk()).collect()
        } else {
            same_version
        }
    }

    /// Every registration, ordered by group, version and kind.
    pub fn types(&self) -> impl Iterator<Item = &Arc<Registration>> {
        self.types.values()
    }
}

/// Levenshtein distance, for suggestions.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, a_char) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, b_char) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(a_char != *b_char);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}
