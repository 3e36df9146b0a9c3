//! The type registry: which resource types exist, how they are scoped, and the hooks (validate,
//! mutate, ACLs) the resource service runs for them.
//!
//! A [`Registry`] has two parts. The built-in part is made once at startup
//! ([`Registry::builtin`]); registration errors there are programming errors, surfacing at
//! startup and in tests. The dynamic part holds the types teams register at runtime as
//! `registry.v1.Type` resources (DESIGN §15, [`dynamic`]): a projection of the stored Types,
//! changed in apply at each Type's raft index (`service::projections::Types`), and read on the
//! request path by cloning one `Arc` under a lock held for no await. Each registered type keeps
//! the version of the Type it was installed from: what a change checked against it is fenced on.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, LazyLock};

use proto::resource::v1::{Id, Resource, Tenancy, Type};

use crate::acl::{self, AclError, Authorizer};
use crate::resource;

pub(crate) mod builtin;
pub(crate) mod cel;
pub(crate) mod dynamic;
pub(crate) mod policies;
pub(crate) mod pool;
#[cfg(test)]
mod tests;
pub(crate) mod versions;

/// Where resources of a type live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
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
    pub(crate) fn name(self) -> &'static str {
        match self {
            Scope::Cluster => "cluster",
            Scope::Partition => "partition",
            Scope::Namespace => "namespace",
            Scope::Any => "any",
        }
    }
}

/// Validate hook: every violation in one message, naming the field (`resource.data.name is required`).
pub(crate) type ValidateHook =
    Arc<dyn Fn(&Resource) -> Result<(), resource::Invalid> + Send + Sync>;
/// Mutate hook: fills defaults into the resource before validation.
pub(crate) type MutateHook =
    Arc<dyn Fn(&mut Resource) -> Result<(), resource::Invalid> + Send + Sync>;
/// References hook: the ids a resource names that must exist, with the field naming each.
pub(crate) type ReferencesHook = Arc<dyn Fn(&Resource) -> Vec<(String, Id)> + Send + Sync>;
/// Read ACL hook. Gets the stored resource only after it answered [`AclError::NeedResource`].
pub(crate) type ReadAcl =
    Arc<dyn Fn(&dyn Authorizer, &Id, Option<&Resource>) -> Result<(), AclError> + Send + Sync>;
pub(crate) type WriteAcl =
    Arc<dyn Fn(&dyn Authorizer, &Resource) -> Result<(), AclError> + Send + Sync>;
pub(crate) type ListAcl =
    Arc<dyn Fn(&dyn Authorizer, &Tenancy) -> Result<(), AclError> + Send + Sync>;

/// ACL hooks of a type (DESIGN §12.3). The defaults: Read needs READ on the resource (type,
/// tenancy, name), Write (and Delete, WriteStatus) WRITE; List and watches are open and return
/// only what the read hook lets the caller see.
#[derive(Clone)]
pub(crate) struct Acls {
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
    pub(crate) fn read_is_default(&self) -> bool {
        Arc::ptr_eq(&self.read, &DEFAULT_READ)
    }

    /// The ACL types themselves: reading and listing need `acl` read; writing (and deleting)
    /// needs `acl` write and holding everything the written object grants (`grant` says what
    /// that is), so no token climbs above its own access through a token or policy it writes.
    pub(crate) fn acl_managed(
        grant: fn(&dyn Authorizer, &Resource) -> Result<(), AclError>,
    ) -> Acls {
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

/// How a type's data is decoded: a message compiled into the server, or one registered at
/// runtime (decoded through its descriptor).
#[derive(Clone)]
enum DataCodec {
    Compiled {
        decode_check: DecodeCheck,
        data_eq: DataEq,
    },
    Registered(prost_reflect::MessageDescriptor),
}

/// One registered type.
#[derive(Clone)]
pub(crate) struct Registration {
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
    /// For a type registered at runtime: its Type (rules, whether it is being deleted).
    pub registered: Option<dynamic::Installed>,
    codec: DataCodec,
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
    pub(crate) fn new<M>(gvk: &str, scope: Scope) -> Self
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
            registered: None,
            codec: DataCodec::Compiled {
                decode_check: |bytes| M::decode(bytes).map(|_| ()),
                data_eq: |a, b| {
                    a == b || matches!((M::decode(a), M::decode(b)), (Ok(a), Ok(b)) if a == b)
                },
            },
        }
    }

    /// The registration of a type registered at runtime: its message through its descriptor,
    /// its defaults as the mutate hook. Its rules are not a hook: the service runs them metered,
    /// on the rule pool, after the caller is authorized (`registered.compiled.check_rules`).
    pub(crate) fn registered(installed: dynamic::Installed) -> Self {
        let compiled = installed.compiled.clone();
        let defaults = compiled.clone();
        Registration {
            resource_type: compiled.resource_type.clone(),
            message_name: compiled.message.full_name().to_owned(),
            scope: compiled.scope,
            validate: None,
            references: None,
            mutate: Some(Arc::new(move |resource: &mut Resource| {
                let Some(data) = resource.data.as_mut() else {
                    return Ok(());
                };
                if let Some(with_defaults) = defaults
                    .apply_defaults(&data.value)
                    .map_err(|why| resource::Invalid::at("resource.data", why))?
                {
                    data.value = with_defaults;
                }
                Ok(())
            })),
            acls: Acls::default(),
            max_name_len: resource::MAX_NAME_LEN,
            server_written: false,
            codec: DataCodec::Registered(compiled.message.clone()),
            registered: Some(installed),
        }
    }

    pub(crate) fn with_references(
        mut self,
        hook: impl Fn(&Resource) -> Vec<(String, Id)> + Send + Sync + 'static,
    ) -> Self {
        self.references = Some(Arc::new(hook));
        self
    }

    pub(crate) fn with_validate(
        mut self,
        hook: impl Fn(&Resource) -> Result<(), resource::Invalid> + Send + Sync + 'static,
    ) -> Self {
        self.validate = Some(Arc::new(hook));
        self
    }

    pub(crate) fn with_mutate(
        mut self,
        hook: impl Fn(&mut Resource) -> Result<(), resource::Invalid> + Send + Sync + 'static,
    ) -> Self {
        self.mutate = Some(Arc::new(hook));
        self
    }

    pub(crate) fn with_acls(mut self, acls: Acls) -> Self {
        self.acls = acls;
        self
    }

    /// The write hook on `id` alone, before anything stored is read: a caller without the
    /// access learns nothing of what is stored (its answer does not depend on it).
    pub(crate) fn check_write_access_before_existence(
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

    pub(crate) fn gvk(&self) -> String {
        resource::gvk(&self.resource_type)
    }

    /// Checks that `data` holds this type's message: the type URL names it and the bytes decode.
    pub(crate) fn check_data(&self, data: &prost_types::Any) -> Result<(), String> {
        let got = data.type_url.rsplit('/').next().unwrap_or_default();
        if got != self.message_name {
            return Err(format!(
                "resource.data is of the wrong type: {} holds {}, got {:?}",
                self.gvk(),
                self.message_name,
                data.type_url
            ));
        }
        let decoded = match &self.codec {
            DataCodec::Compiled { decode_check, .. } => decode_check(&data.value),
            DataCodec::Registered(message) => {
                match prost_reflect::DynamicMessage::decode(message.clone(), data.value.as_slice())
                {
                    Ok(decoded) => {
                        let depth = dynamic::message_depth(&decoded);
                        if depth > dynamic::MAX_SOURCE_NESTING {
                            return Err(format!(
                                "resource.data nests messages {depth} levels deep; a registered type's data may nest at most {}",
                                dynamic::MAX_SOURCE_NESTING
                            ));
                        }
                        Ok(())
                    }
                    Err(error) => Err(error),
                }
            }
        };
        decoded.map_err(|error| {
            format!(
                "resource.data invalid: cannot decode {}: {error}",
                self.message_name
            )
        })
    }
}

impl Registration {
    /// Whether two data payloads hold the same message of this type.
    pub(crate) fn same_data(
        &self,
        a: Option<&prost_types::Any>,
        b: Option<&prost_types::Any>,
    ) -> bool {
        match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => {
                a.type_url == b.type_url
                    && (a.value == b.value
                        || match &self.codec {
                            DataCodec::Compiled { data_eq, .. } => data_eq(&a.value, &b.value),
                            DataCodec::Registered(message) => {
                                let decode = |bytes: &[u8]| {
                                    prost_reflect::DynamicMessage::decode(message.clone(), bytes)
                                };
                                matches!((decode(&a.value), decode(&b.value)), (Ok(a), Ok(b)) if a == b)
                            }
                        })
            }
            _ => false,
        }
    }
}

/// Decodes the data of a resource as `M`; absent data decodes as the default message. For hooks.
pub(crate) fn decode_data<M>(resource: &Resource) -> Result<M, String>
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

type Key = (String, String, String);

fn key_of(resource_type: &Type) -> Key {
    (
        resource_type.group.clone(),
        resource_type.group_version.clone(),
        resource_type.kind.clone(),
    )
}

/// The set of registered types: the built-in ones, and those registered at runtime.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    types: BTreeMap<Key, Arc<Registration>>,
    dynamic: Arc<DynamicTypes>,
    /// The admission policies, as this node has applied them (DESIGN §17).
    policies: Arc<policies::PolicyStore>,
}

/// The types registered at runtime, as this node knows them (DESIGN §15).
#[derive(Debug)]
pub(crate) struct DynamicTypes {
    state: std::sync::RwLock<Arc<DynamicState>>,
    /// `--max-types`.
    max_types: std::sync::atomic::AtomicUsize,
    /// `--max-schema-bytes`: descriptors of every registered Type together.
    max_schema_bytes: std::sync::atomic::AtomicUsize,
    /// Built-in types' keys (a Type may not take one).
    builtin: std::sync::RwLock<std::collections::BTreeSet<Key>>,
}

impl Default for DynamicTypes {
    fn default() -> Self {
        DynamicTypes {
            state: Default::default(),
            max_types: std::sync::atomic::AtomicUsize::new(DEFAULT_MAX_TYPES),
            max_schema_bytes: std::sync::atomic::AtomicUsize::new(DEFAULT_MAX_SCHEMA_BYTES),
            builtin: Default::default(),
        }
    }
}

/// Default of `--max-types`.
pub(crate) const DEFAULT_MAX_TYPES: usize = 1000;
/// Default of `--max-schema-bytes`.
pub(crate) const DEFAULT_MAX_SCHEMA_BYTES: usize = 64 << 20;

#[derive(Debug, Default)]
struct DynamicState {
    /// The owner of each group.version.Kind: of the Types claiming it, the one created first
    /// (least uid), so every node picks the same one whatever order it learned them in.
    by_key: BTreeMap<Key, Arc<Registration>>,
    /// Every installed Type, owner of its key or not.
    by_name: BTreeMap<String, InstalledType>,
    /// The last change to any Type this state reflects.
    revision: resource::Version,
    /// The built-in descriptor set with every registered file added (ListTypes' answer), made
    /// when first asked for, and its files by name (a page of ListTypes).
    published_set: std::sync::OnceLock<(bytes::Bytes, Arc<FileIndex>)>,
    /// A pool of it without source info (the HTTP API's JSON, reflection), made when first
    /// asked for: a pool costs about ten times its descriptors, so ListTypes makes none.
    published_pool: std::sync::OnceLock<Arc<prost_reflect::DescriptorPool>>,
}

#[derive(Debug, Clone)]
struct InstalledType {
    /// A registration per served version, with its key.
    registrations: Vec<(Key, Arc<Registration>)>,
    /// A registration per version it does not serve: objects stored in one are still checked,
    /// owned, reaped and snapshotted as this Type's ([`Registry::resolve_stored`]).
    unserved: Vec<(Key, Arc<Registration>)>,
    /// The key of every version, served or not: what the Type claims.
    claims: Vec<Key>,
    /// The stored Type's uid (its version is its registrations').
    uid: String,
    /// Of its data: a write of the same data (a status) compiles nothing again.
    digest: [u8; 32],
    family: Arc<versions::Family>,
}

impl InstalledType {
    fn registration(&self, key: &Key) -> Option<&Arc<Registration>> {
        self.registrations
            .iter()
            .find(|(served, _)| served == key)
            .map(|(_, registration)| registration)
    }
}

impl DynamicState {
    /// Makes the earliest-created Type claiming `key` its owner (or nobody).
    fn elect(&mut self, key: &Key) {
        let owner = self
            .by_name
            .iter()
            .filter(|(_, installed)| installed.registration(key).is_some())
            .min_by(|a, b| (&a.1.uid, a.0).cmp(&(&b.1.uid, b.0)))
            .and_then(|(_, installed)| installed.registration(key).cloned());
        match owner {
            Some(owner) => {
                self.by_key.insert(key.clone(), owner);
            }
            None => {
                self.by_key.remove(key);
            }
        }
    }
}

impl DynamicTypes {
    fn read(&self) -> Arc<DynamicState> {
        self.state.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Applies `change` to a copy of the state and publishes the copy, if `change` says it
    /// changed something (what is published, cached per state, is then made again).
    fn update(&self, change: impl FnOnce(&mut DynamicState) -> bool) {
        self.update_with(false, change);
    }

    /// [`Self::update`]; with `same_schemas` (only versions moved: a status written on a
    /// Type), what is published is kept rather than made again.
    fn update_with(&self, same_schemas: bool, change: impl FnOnce(&mut DynamicState) -> bool) {
        let mut guard = self.state.write().unwrap_or_else(|p| p.into_inner());
        let mut next = DynamicState {
            by_key: guard.by_key.clone(),
            by_name: guard.by_name.clone(),
            revision: guard.revision,
            published_set: kept(same_schemas, &guard.published_set),
            published_pool: kept(same_schemas, &guard.published_pool),
        };
        if change(&mut next) {
            *guard = Arc::new(next);
        }
    }

    pub(crate) fn set_max_types(&self, max: usize) {
        self.max_types
            .store(max, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn set_max_schema_bytes(&self, max: usize) {
        self.max_schema_bytes
            .store(max, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the Type `name`, with `bytes` of descriptors, fits `--max-schema-bytes` beside
    /// every other registered Type (the size a node holds for all of them grows with it).
    pub(crate) fn check_schema_bytes(&self, name: &str, bytes: usize) -> Result<(), String> {
        let state = self.read();
        let others: usize = state
            .by_name
            .iter()
            .filter(|(other, _)| other.as_str() != name)
            .map(|(_, installed)| installed.family.descriptor_bytes())
            .sum();
        let max = self
            .max_schema_bytes
            .load(std::sync::atomic::Ordering::Relaxed);
        if others.saturating_add(bytes) > max {
            return Err(format!(
                "data.proto compiles to {bytes} bytes of descriptors, and the registered types hold {others}: together over the {max} bytes --max-schema-bytes allows; delete a Type, make this one smaller, or raise the limit on every server"
            ));
        }
        Ok(())
    }

    /// The registration of a version a Type claims but does not serve (none for a served one).
    fn unserved(&self, resource_type: &Type) -> Option<Arc<Registration>> {
        let key = key_of(resource_type);
        let state = self.read();
        let owner = state
            .by_name
            .iter()
            .filter(|(_, installed)| installed.unserved.iter().any(|(k, _)| *k == key))
            .min_by(|a, b| (&a.1.uid, a.0).cmp(&(&b.1.uid, b.0)))?;
        owner
            .1
            .unserved
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, registration)| registration.clone())
    }

    /// The registered type of `resource_type`, as installed now (no built-in ones).
    pub(crate) fn resolve(&self, resource_type: &Type) -> Option<Arc<Registration>> {
        self.read().by_key.get(&key_of(resource_type)).cloned()
    }

    /// The registered type a Type resource named `name` installed.
    pub(crate) fn installed(&self, name: &str) -> Option<dynamic::Installed> {
        let state = self.read();
        let installed = state.by_name.get(name)?;
        match installed.registrations.first() {
            Some((_, registration)) => registration.registered.clone(),
            // A Type serving no version it claims (elected elsewhere) still has its family.
            None => None,
        }
    }

    /// Whether a Type resource may register `resource_type` under `name` (DESIGN §15): not a
    /// built-in type, not one another Type registered, within `--max-types`.
    #[cfg(test)]
    pub(crate) fn check_claim(&self, name: &str, resource_type: &Type) -> Result<(), String> {
        self.check_claims(name, std::slice::from_ref(resource_type))
    }

    /// [`Self::check_claim`] for every version a Type claims. One Type holds every version of
    /// a kind (DESIGN §15.1): a kind another Type registered in any version is refused.
    pub(crate) fn check_claims(&self, name: &str, claimed: &[Type]) -> Result<(), String> {
        let state = self.read();
        for resource_type in claimed {
            let key = key_of(resource_type);
            let gvk = resource::gvk(resource_type);
            if self
                .builtin
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&key)
            {
                return Err(format!("data: {gvk} is a built-in type"));
            }
            // A Type already stored with this claim may still change (and be deleted), whether
            // it owns the key or lost it to one created earlier.
            let claimed_before = state
                .by_name
                .get(name)
                .is_some_and(|i| i.claims.contains(&key));
            if claimed_before {
                continue;
            }
            if let Some(owner) = state
                .by_key
                .get(&key)
                .and_then(|r| r.registered.as_ref())
                .filter(|installed| installed.name != name)
            {
                return Err(format!(
                    "data: {gvk} is already registered by Type {}",
                    owner.name
                ));
            }
            if let Some((other, theirs)) = state.by_name.iter().find(|(other, installed)| {
                other.as_str() != name
                    && installed
                        .claims
                        .iter()
                        .any(|(g, _, k)| *g == key.0 && *k == key.2)
            }) {
                let versions: Vec<&str> = theirs
                    .claims
                    .iter()
                    .map(|(_, version, _)| version.as_str())
                    .collect();
                return Err(format!(
                    "data: {}.{} is registered by Type {other} (versions {}); one Type holds every version of a kind: add {} to its data.versions",
                    key.0,
                    key.2,
                    versions.join(", "),
                    key.1
                ));
            }
        }
        let max = self.max_types.load(std::sync::atomic::Ordering::Relaxed);
        if !state.by_name.contains_key(name) && state.by_name.len() >= max {
            return Err(format!(
                "this cluster has {} registered types, the most --max-types allows ({max}); delete one or raise the limit",
                state.by_name.len()
            ));
        }
        Ok(())
    }

    /// Whether the schema a Type named `name` compiled fits beside every other registered
    /// schema: a message or enum another Type declares (two Types of one group and version
    /// share a package) would make the published descriptors unusable for every client.
    pub(crate) fn check_symbols(
        &self,
        name: &str,
        compiled: &dynamic::CompiledType,
    ) -> Result<(), String> {
        // Each Type's names were computed when it was loaded: the check costs the new Type's
        // names, whatever the number and size of the others.
        let state = self.read();
        for (other, installed) in &state.by_name {
            if other == name {
                continue;
            }
            for theirs in &installed.family.versions {
                let theirs = &theirs.compiled;
                let same_package = theirs.resource_type.group == compiled.resource_type.group
                    && theirs.resource_type.group_version == compiled.resource_type.group_version;
                let may_clash = same_package || (compiled.extends && theirs.extends);
                if !may_clash {
                    continue;
                }
                if let Some(clash) = compiled.symbols.intersection(&theirs.symbols).next() {
                    return Err(format!(
                        "data.proto declares {clash}, which Type {other} declares too (two Types of one group and version share their package; extensions share their options message's numbers)"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Installs a stored Type outside apply (a registry made to check a snapshot's records,
    /// tests), at its own version.
    pub(crate) fn install_stored(&self, stored: &Resource) {
        self.install(stored, stored.version.parse().unwrap_or_default());
    }

    /// Removes the Type `name` outside apply (tests).
    #[cfg(test)]
    pub(crate) fn remove(&self, name: &str) {
        self.uninstall(name, resource::Version::default());
    }

    /// The last change to any Type this registry holds (the fence of a change to a Type).
    pub(crate) fn revision(&self) -> resource::Version {
        self.read().revision
    }

    /// Installs what a stored `registry.v1.Type` resource registers, at `revision`: compiled
    /// again only when its data or its deletion mark changed (a status written on the Type
    /// only moves the version its writes are fenced on).
    pub(crate) fn install(&self, stored: &Resource, revision: resource::Version) {
        let Some(id) = &stored.id else { return };
        let name = id.name.as_str();
        let deleting = resource::is_marked_for_deletion(stored);
        let digest = data_digest(stored);
        let current = self.read();
        let same = current
            .by_name
            .get(name)
            .filter(|i| i.digest == digest && i.uid == id.uid);
        let kept_deleting = same
            .and_then(|i| i.registrations.first())
            .and_then(|(_, r)| r.registered.as_ref())
            .is_none_or(|r| r.deleting == deleting);
        let reused = same.map(|i| i.family.clone());
        let recompiled = reused.is_none() || !kept_deleting;
        let family = match reused {
            Some(family) => family,
            None => {
                let t = match decode_data::<proto::registry::v1::Type>(stored) {
                    Ok(t) => t,
                    Err(why) => {
                        tracing::warn!(r#type = %name, %why, "a stored Type does not decode");
                        self.uninstall(name, revision);
                        return;
                    }
                };
                match versions::Family::load_any(&t) {
                    Ok(family) => {
                        tracing::info!(r#type = %name, deleting, version = %stored.version, storage_version = %family.storage, "registered type installed");
                        Arc::new(family)
                    }
                    Err(why) => {
                        tracing::warn!(r#type = %name, %why, "a stored Type cannot be loaded; its resources are unavailable");
                        self.uninstall(name, revision);
                        return;
                    }
                }
            }
        };
        let claims: Vec<Key> = family
            .versions
            .iter()
            .map(|v| key_of(&v.compiled.resource_type))
            .collect();
        let (registrations, unserved): (Vec<_>, Vec<_>) = family
            .versions
            .iter()
            .map(|v| {
                let registration = Registration::registered(dynamic::Installed {
                    name: name.to_owned(),
                    version: stored.version.clone(),
                    compiled: v.compiled.clone(),
                    family: family.clone(),
                    deleting,
                });
                (
                    v.served,
                    (key_of(&v.compiled.resource_type), Arc::new(registration)),
                )
            })
            .partition(|(served, _)| *served);
        let registrations: Vec<(Key, Arc<Registration>)> =
            registrations.into_iter().map(|(_, r)| r).collect();
        let unserved: Vec<(Key, Arc<Registration>)> =
            unserved.into_iter().map(|(_, r)| r).collect();
        self.update_with(!recompiled, |state| {
            state.revision = state.revision.max(revision);
            let served: Vec<Key> = registrations.iter().map(|(key, _)| key.clone()).collect();
            let previous = state.by_name.insert(
                name.to_owned(),
                InstalledType {
                    registrations,
                    unserved,
                    claims,
                    uid: id.uid.clone(),
                    digest,
                    family,
                },
            );
            if let Some(previous) = previous {
                for (key, _) in &previous.registrations {
                    if !served.contains(key) {
                        state.elect(key);
                    }
                }
            }
            for key in &served {
                state.elect(key);
            }
            true
        });
    }

    /// Removes what the Type `name` registered (its deletion, at `revision`).
    pub(crate) fn uninstall(&self, name: &str, revision: resource::Version) {
        let mut removed = false;
        self.update(|state| {
            state.revision = state.revision.max(revision);
            if let Some(gone) = state.by_name.remove(name) {
                for (key, _) in &gone.registrations {
                    state.elect(key);
                }
                removed = true;
            }
            true
        });
        if removed {
            tracing::info!(r#type = name, "registered type removed");
        }
    }
}

impl DynamicTypes {
    /// Replaces every registered type with what `stored` (every stored Type) registers, the
    /// state at `revision` (a node opening, a snapshot installed, a restore).
    pub(crate) fn reset(&self, stored: &[Resource], revision: resource::Version) {
        // Each step keeps the revision the registry had: a change to a Type checked while the
        // registry is half replaced carries that older revision, and apply refuses it (the
        // state's revision is `revision` already). The new revision comes with the last step.
        let before = self.revision();
        let names: std::collections::BTreeSet<&str> = stored
            .iter()
            .filter_map(|item| item.id.as_ref().map(|id| id.name.as_str()))
            .collect();
        let gone: Vec<String> = self
            .read()
            .by_name
            .keys()
            .filter(|name| !names.contains(name.as_str()))
            .cloned()
            .collect();
        for name in gone {
            self.uninstall(&name, before);
        }
        for item in stored {
            self.install(item, before);
        }
        // A reset is the whole state: its revision is the state's, even if it is older than
        // what this node held (a restore of an earlier history).
        self.update(|state| {
            state.revision = revision;
            true
        });
    }
}

/// What a published cache keeps across an update: its value when `same_schemas`.
fn kept<T: Clone>(same_schemas: bool, lock: &std::sync::OnceLock<T>) -> std::sync::OnceLock<T> {
    match (same_schemas, lock.get()) {
        (true, Some(value)) => std::sync::OnceLock::from(value.clone()),
        _ => std::sync::OnceLock::new(),
    }
}

/// What decides whether a stored Type must be compiled again: its data.
fn data_digest(stored: &Resource) -> [u8; 32] {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    if let Some(data) = &stored.data {
        hasher.update(data.type_url.as_bytes());
        hasher.update([0]);
        hasher.update(&data.value);
    }
    hasher.finalize().into()
}

impl Registry {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// A registry holding every built-in type.
    pub(crate) fn builtin() -> Result<Self, RegistryError> {
        let mut registry = Self::new();
        builtin::register(&mut registry)?;
        Ok(registry)
    }

    /// The admission policies (a projection kept in apply).
    pub(crate) fn policies(&self) -> &Arc<policies::PolicyStore> {
        &self.policies
    }

    /// The part types registered at runtime live in.
    pub(crate) fn dynamic(&self) -> &Arc<DynamicTypes> {
        &self.dynamic
    }

    pub(crate) fn register(&mut self, registration: Registration) -> Result<(), RegistryError> {
        let gvk = registration.gvk();
        let violations = resource::type_violations(&registration.resource_type);
        if !violations.is_empty() {
            return Err(RegistryError::InvalidType {
                gvk,
                why: violations.join("; "),
            });
        }
        let key = key_of(&registration.resource_type);
        if self.types.contains_key(&key) {
            return Err(RegistryError::Duplicate(gvk));
        }
        self.dynamic
            .builtin
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone());
        self.types.insert(key, Arc::new(registration));
        Ok(())
    }

    pub(crate) fn resolve(&self, resource_type: &Type) -> Option<Arc<Registration>> {
        let key = key_of(resource_type);
        if let Some(registration) = self.types.get(&key) {
            return Some(registration.clone());
        }
        self.dynamic.read().by_key.get(&key).cloned()
    }

    /// The history a registered type's objects keep (`None`: not a registered type).
    pub(crate) fn history_of(&self, group: &str, kind: &str) -> Option<resource::Retention> {
        let dynamic = self.dynamic.read();
        let from = (group.to_owned(), String::new(), String::new());
        dynamic
            .by_key
            .range(from..)
            .take_while(|((g, _, _), _)| g == group)
            .find(|((_, _, k), _)| k == kind)
            .and_then(|(_, registration)| registration.registered.as_ref())
            .map(|installed| installed.family.history)
    }

    /// Registered types a mistyped one probably meant: kinds of the same group within two edits,
    /// those of the requested version first; otherwise the same kind in other versions.
    /// What a stored object's type is registered as: [`Self::resolve`], or a version its Type
    /// keeps but no longer serves (DESIGN §15.1: objects stay stored in it until migrated).
    /// For what checks, owns, reaps and snapshots stored objects — never for a request's type.
    pub(crate) fn resolve_stored(&self, resource_type: &Type) -> Option<Arc<Registration>> {
        self.resolve(resource_type)
            .or_else(|| self.dynamic.unserved(resource_type))
    }

    pub(crate) fn similar(&self, resource_type: &Type) -> Vec<String> {
        let wanted_kind = resource_type.kind.to_lowercase();
        let near: Vec<Arc<Registration>> = self
            .types()
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

    /// Every registration, built-in and registered, ordered by group, version and kind.
    pub(crate) fn types(&self) -> std::vec::IntoIter<Arc<Registration>> {
        let dynamic = self.dynamic.read();
        let mut all: BTreeMap<&Key, &Arc<Registration>> = self.types.iter().collect();
        all.extend(dynamic.by_key.iter());
        all.into_values().cloned().collect::<Vec<_>>().into_iter()
    }

    /// The encoded descriptor set of every data message, built-in and registered, with their
    /// imports (what ListTypes publishes).
    pub(crate) fn descriptor_set(&self) -> bytes::Bytes {
        self.published_set().0
    }

    /// How many of `registrations`, from the first, have descriptor files (theirs and their
    /// imports) of at most `max_bytes` together (at least one), and that set encoded (in the
    /// order of [`Registry::descriptor_set`]): what one page of ListTypes holds.
    pub(crate) fn descriptor_set_within(
        &self,
        registrations: &[Arc<Registration>],
        max_bytes: usize,
    ) -> (usize, bytes::Bytes) {
        let (_, index) = self.published_set();
        let mut wanted = std::collections::BTreeSet::new();
        let mut bytes = 0usize;
        let mut taken = 0;
        for registration in registrations {
            let mut adding = std::collections::BTreeSet::new();
            let mut pending: Vec<&str> = index
                .message_file
                .get(&registration.message_name)
                .map(|position| index.set.file[*position].name())
                .into_iter()
                .collect();
            while let Some(name) = pending.pop() {
                let Some(&position) = index.by_name.get(name) else {
                    continue;
                };
                if !wanted.contains(&position) && adding.insert(position) {
                    pending.extend(
                        index.set.file[position]
                            .dependency
                            .iter()
                            .map(String::as_str),
                    );
                }
            }
            let more: usize = adding
                .iter()
                .map(|position| prost::Message::encoded_len(&index.set.file[*position]) + 5)
                .sum();
            if taken > 0 && bytes.saturating_add(more) > max_bytes {
                break;
            }
            bytes = bytes.saturating_add(more);
            wanted.extend(adding);
            taken += 1;
        }
        let set = prost_types::FileDescriptorSet {
            file: wanted
                .into_iter()
                .map(|position| index.set.file[position].clone())
                .collect(),
        };
        (taken, prost::Message::encode_to_vec(&set).into())
    }

    fn published_set(&self) -> (bytes::Bytes, Arc<FileIndex>) {
        let state = self.dynamic.read();
        state
            .published_set
            .get_or_init(|| {
                let set = published_files(&state);
                let encoded = bytes::Bytes::from(prost::Message::encode_to_vec(&set));
                (encoded, Arc::new(FileIndex::of(set)))
            })
            .clone()
    }

    /// A pool of [`Registry::descriptor_set`] without source info: what converts resources of
    /// any type to and from JSON (an `Any` resolves its message in it).
    pub(crate) fn descriptor_pool(&self) -> Arc<prost_reflect::DescriptorPool> {
        let state = self.dynamic.read();
        state
            .published_pool
            .get_or_init(|| {
                let mut set = published_files(&state);
                for file in &mut set.file {
                    file.source_code_info = None;
                }
                let pool = prost_reflect::DescriptorPool::from_file_descriptor_set(set)
                    .unwrap_or_else(|error| {
                        tracing::error!(%error, "the published descriptors do not make a pool; registered types are left out of it");
                        prost_reflect::DescriptorPool::decode(proto::FILE_DESCRIPTOR_SET)
                            .unwrap_or_default()
                    });
                Arc::new(pool)
            })
            .clone()
    }
}

/// The published files, found by name and by the messages they declare.
#[derive(Debug, Default)]
struct FileIndex {
    set: prost_types::FileDescriptorSet,
    by_name: HashMap<String, usize>,
    /// A top-level message's full name -> the position of its file.
    message_file: HashMap<String, usize>,
}

impl FileIndex {
    fn of(set: prost_types::FileDescriptorSet) -> FileIndex {
        let mut by_name = HashMap::new();
        let mut message_file = HashMap::new();
        for (position, file) in set.file.iter().enumerate() {
            by_name.insert(file.name().to_owned(), position);
            for message in &file.message_type {
                let full = if file.package().is_empty() {
                    message.name().to_owned()
                } else {
                    format!("{}.{}", file.package(), message.name())
                };
                message_file.insert(full, position);
            }
        }
        FileIndex {
            set,
            by_name,
            message_file,
        }
    }
}

/// The built-in descriptor set with every registered Type's files added: each Type whose
/// names clash with none before it (two Types written at once may both declare a name; one bad
/// Type never hides the others), each file once. Its cost is the size of what it holds.
fn published_files(state: &DynamicState) -> prost_types::FileDescriptorSet {
    let mut set: prost_types::FileDescriptorSet =
        prost::Message::decode(proto::FILE_DESCRIPTOR_SET).unwrap_or_default();
    let mut names: std::collections::BTreeSet<String> =
        set.file.iter().map(|f| f.name().to_owned()).collect();
    let mut symbols: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
    for registration in state.by_key.values() {
        let Some(installed) = &registration.registered else {
            continue;
        };
        let compiled = &installed.compiled;
        if compiled
            .symbols
            .iter()
            .any(|s| symbols.contains(s.as_str()))
        {
            tracing::warn!(
                r#type = %installed.name,
                "a registered schema clashes with another: it is left out of the published descriptors"
            );
            continue;
        }
        let Ok(files) = <prost_types::FileDescriptorSet as prost::Message>::decode(
            compiled.descriptor_set.as_slice(),
        ) else {
            continue;
        };
        symbols.extend(compiled.symbols.iter().map(String::as_str));
        set.file.extend(
            files
                .file
                .into_iter()
                .filter(|file| names.insert(file.name().to_owned())),
        );
    }
    set
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
