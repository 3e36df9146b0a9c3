//! Access control (DESIGN §12.3): the [`Authorizer`] that ACL hooks consult, the rules of
//! `acl.v1.Policy` resources compiled into one ([`rules`]), and the [`TokenResolver`] that turns
//! the `x-resd-token` of a request into an authorizer — [`TokenStore`], a cache of the
//! `acl.v1` resources every node keeps up to date from a watch.
//!
//! The hooks always run. With ACLs disabled every request resolves to [`Anonymous`], which
//! allows everything; controllers act as a [`ControllerIdentity`] no client can present.

#[cfg(test)]
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use proto::resource::v1::Id;

pub(crate) mod rules;
pub(crate) mod secrets;
pub(crate) mod store;

pub(crate) use rules::{MANAGEMENT_POLICY, check_policy, check_token};
pub(crate) use store::TokenStore;

#[cfg(test)]
mod tests;

/// Access level, ordered: each level includes the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) enum Access {
    #[default]
    Deny,
    List,
    Read,
    Write,
}

/// Answers the questions ACL hooks ask. Implementations must be cheap: hooks call them per item
/// when filtering lists and watches.
pub(crate) trait Authorizer: Send + Sync + fmt::Debug {
    /// Access to cluster operations (status, membership, snapshots).
    fn operator(&self) -> Access;
    /// Access to the resource `id` (its type, tenancy and name).
    fn resource(&self, id: &Id) -> Access;
    /// Who is asking, for refusals and the record of who changed what: a token's accessor,
    /// `controller/<name>`, or `anonymous` with ACLs off.
    fn identity(&self) -> &str {
        "anonymous"
    }
    /// Whether [`Self::resource`] grants at least read on every resource, whatever its id: a
    /// listing under the default read hook then needs no per-item check.
    fn reads_everything(&self) -> bool {
        false
    }
    /// Whether any resource of type `gvk` in `partition`/`namespace` whose name starts with
    /// `name_prefix` may be readable (at least listable): false only when none can be. What an
    /// open watch's grants must still allow.
    fn may_read_some(
        &self,
        gvk: &str,
        partition: &str,
        namespace: &str,
        name_prefix: &str,
    ) -> bool {
        let _ = (gvk, partition, namespace, name_prefix);
        true
    }
    /// ACL management (reading and writing tokens and policies). Never from a default policy.
    fn acl(&self) -> Access {
        Access::Deny
    }
    /// Type ownership of `gvk` (DESIGN §12.3): registering, changing or deleting the Type
    /// that claims it needs WRITE. Never from a default policy or operator access.
    fn schema(&self, gvk: &str) -> Access {
        let _ = gvk;
        Access::Deny
    }
    /// Whether a node may join the cluster with this identity's token.
    fn may_join(&self) -> bool {
        false
    }
    /// Whether this identity holds everything (the management policy, the server's own).
    fn is_management(&self) -> bool {
        false
    }
    /// Whether this is the server itself (its own steps and controllers): what no token,
    /// management's included, can be.
    fn is_server(&self) -> bool {
        false
    }
    /// Whether this identity owns every type the glob `types` matches (`schema` write, no
    /// narrower rule taking one of them away): what writing an admission policy over them needs.
    fn owns_types(&self, types: &str) -> bool {
        self.schema(types) == Access::Write
    }
    /// What decides this identity's access to `id`, in words (`AclCheck`'s reason).
    fn explain(&self, id: &Id) -> String {
        format!("this identity has {} on it", access_name(self.resource(id)))
    }
    /// The last change to the tokens and policies this identity's grants were made from: a
    /// change it authorizes is refused if they changed since (DESIGN §15's fence). `None`
    /// for identities no stored token or policy makes (the server's own, ACLs off).
    fn acl_revision(&self) -> Option<crate::resource::Version> {
        None
    }
    /// `Ok` when this identity holds everything `grant` grants, so it may store it (no
    /// escalation); else what it lacks.
    fn may_grant(&self, grant: Grant<'_>) -> Result<(), AclError> {
        let _ = grant;
        Err(AclError::PermissionDenied(
            "this identity cannot grant access".into(),
        ))
    }
}

/// What a writer of the ACL types would grant: a policy's contents, or a token's policies.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Grant<'a> {
    Policy {
        name: &'a str,
        policy: &'a proto::acl::v1::Policy,
    },
    Token {
        name: &'a str,
        token: &'a proto::acl::v1::Token,
    },
}

/// What an ACL hook answers besides "allowed".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AclError {
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// A Read hook needs the stored resource to decide; the service fetches it and asks again.
    #[error("the ACL read hook needs the stored resource to decide")]
    NeedResource,
}

/// Why a request's token does not resolve while ACLs are enabled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unauthenticated {
    /// No token, an unknown one, or an expired one.
    #[error("{0}")]
    Refused(String),
    /// This server is too busy checking unrecognised tokens: the caller should retry shortly.
    #[error("{0}")]
    NotReady(String),
    /// This server has not loaded its tokens yet (it is starting, or catching up): another
    /// member can answer.
    #[error("{0}")]
    Loading(String),
}

pub(crate) fn require_operator(
    authorizer: &dyn Authorizer,
    access: Access,
) -> Result<(), AclError> {
    if authorizer.operator() >= access {
        Ok(())
    } else {
        Err(AclError::PermissionDenied(format!(
            "token lacks operator {}",
            access_name(access)
        )))
    }
}

/// Requires `access` to the ownership of the type `gvk` (its `registry.v1.Type`).
pub(crate) fn require_schema(
    authorizer: &dyn Authorizer,
    gvk: &str,
    access: Access,
) -> Result<(), AclError> {
    if authorizer.schema(gvk) >= access {
        Ok(())
    } else {
        Err(AclError::PermissionDenied(format!(
            "token lacks schema {} on {gvk}: registering, changing or deleting the Type of {gvk} needs a policy rule with `schema: ACCESS_{}` whose types match it (the team that owns the group grants it; neither operator access nor the default policy does)",
            access_name(access),
            access_name(access).to_uppercase()
        )))
    }
}

/// Requires `access` to ACL management (tokens and policies).
pub(crate) fn require_acl(authorizer: &dyn Authorizer, access: Access) -> Result<(), AclError> {
    if authorizer.acl() >= access {
        Ok(())
    } else {
        Err(AclError::PermissionDenied(format!(
            "token lacks acl {} (a policy's `acl` field grants it; neither operator access nor the default policy does)",
            access_name(access)
        )))
    }
}

/// Requires `access` to the resource `id`: `token lacks write on demo.v2.Artist
/// default/jazz/miles-davis` otherwise.
pub(crate) fn require_resource(
    authorizer: &dyn Authorizer,
    id: &Id,
    access: Access,
) -> Result<(), AclError> {
    if authorizer.resource(id) >= access {
        return Ok(());
    }
    let gvk = id
        .r#type
        .as_ref()
        .map(crate::resource::gvk)
        .unwrap_or_default();
    let tenancy = id.tenancy.clone().unwrap_or_default();
    let place: String = [
        tenancy.partition.as_str(),
        tenancy.namespace.as_str(),
        id.name.as_str(),
    ]
    .iter()
    .filter(|part| !part.is_empty())
    .copied()
    .collect::<Vec<_>>()
    .join("/");
    Err(AclError::PermissionDenied(format!(
        "token lacks {} on {gvk} {place}",
        access_name(access)
    )))
}

pub(crate) fn access_name(access: Access) -> &'static str {
    match access {
        Access::Deny => "deny",
        Access::List => "list",
        Access::Read => "read",
        Access::Write => "write",
    }
}

/// The methods of an identity that holds everything (ACLs off, the server's own steps,
/// controllers): every access, ACL management, joining, and granting anything.
macro_rules! everything {
    () => {
        fn operator(&self) -> Access {
            Access::Write
        }
        fn resource(&self, _id: &Id) -> Access {
            Access::Write
        }
        fn reads_everything(&self) -> bool {
            true
        }
        fn acl(&self) -> Access {
            Access::Write
        }
        fn may_join(&self) -> bool {
            true
        }
        fn is_management(&self) -> bool {
            true
        }
        fn may_grant(&self, _grant: Grant<'_>) -> Result<(), AclError> {
            Ok(())
        }
        fn schema(&self, _gvk: &str) -> Access {
            Access::Write
        }
    };
}

/// Allows everything: ACLs disabled, and the privileged identity of in-process callers (bootstrap
/// steps). Not reachable from outside the crate: no client can present it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AllowAll;

/// The identity of the server's own steps ([`AllowAll`]).
pub(crate) const SERVER_IDENTITY: &str = "server";
/// What every controller's identity starts with ([`ControllerIdentity`]).
pub(crate) const CONTROLLER_IDENTITY_PREFIX: &str = "controller/";

impl Authorizer for AllowAll {
    fn identity(&self) -> &str {
        SERVER_IDENTITY
    }
    fn is_server(&self) -> bool {
        true
    }
    everything!();
}

/// The identity a controller acts with: everything allowed, recorded as `controller/<name>`.
/// Only the controller runtime makes one; no token resolves to it.
#[derive(Debug, Clone)]
pub(crate) struct ControllerIdentity {
    identity: String,
}

impl ControllerIdentity {
    pub(crate) fn new(controller: &str) -> Self {
        ControllerIdentity {
            identity: format!("{CONTROLLER_IDENTITY_PREFIX}{controller}"),
        }
    }
}

impl Authorizer for ControllerIdentity {
    fn identity(&self) -> &str {
        &self.identity
    }
    fn is_server(&self) -> bool {
        true
    }
    everything!();
}

/// ACLs disabled: everything allowed, without a token.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Anonymous;

impl Authorizer for Anonymous {
    everything!();
}

/// Key-prefix rules for tests: an operator level and rules over `resource/<gvk>/<name>` keys,
/// where the longest matching prefix wins (as in Consul's `key_prefix` rules).
#[cfg(test)]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KeyRules {
    pub operator: Access,
    pub key_prefixes: Vec<(String, Access)>,
    /// `schema` access on every group.version.Kind (Type ownership).
    pub schema: Access,
}

#[cfg(test)]
impl KeyRules {
    pub(crate) fn operator(mut self, access: Access) -> Self {
        self.operator = access;
        self
    }

    pub(crate) fn key_prefix(mut self, prefix: impl Into<String>, access: Access) -> Self {
        self.key_prefixes.push((prefix.into(), access));
        self
    }

    pub(crate) fn schema(mut self, access: Access) -> Self {
        self.schema = access;
        self
    }
}

#[cfg(test)]
impl Authorizer for KeyRules {
    fn operator(&self) -> Access {
        self.operator
    }

    fn resource(&self, id: &Id) -> Access {
        let gvk = id
            .r#type
            .as_ref()
            .map(crate::resource::gvk)
            .unwrap_or_default();
        self.key(&format!("resource/{gvk}/{}", id.name))
    }

    fn schema(&self, _gvk: &str) -> Access {
        self.schema
    }
}

#[cfg(test)]
impl KeyRules {
    pub(crate) fn key(&self, key: &str) -> Access {
        self.key_prefixes
            .iter()
            .filter(|(prefix, _)| key.starts_with(prefix.as_str()))
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|(_, access)| *access)
            .unwrap_or(Access::Deny)
    }
}

/// Turns a request's token into the authorizer its hooks consult.
pub(crate) trait TokenResolver: Send + Sync + fmt::Debug {
    fn resolve(&self, token: Option<&str>) -> Result<Arc<dyn Authorizer>, Unauthenticated>;

    /// [`Self::resolve`] for a request from `remote`: the work an unrecognised token costs is
    /// charged to that address.
    fn resolve_from(
        &self,
        token: Option<&str>,
        remote: Option<std::net::IpAddr>,
    ) -> Result<Arc<dyn Authorizer>, Unauthenticated> {
        let _ = remote;
        self.resolve(token)
    }

    /// Whether ACLs are enforced (a token is required).
    fn enabled(&self) -> bool {
        false
    }

    /// Ticks whenever tokens or policies change, so open watches re-check their token; `None`
    /// when they never change.
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// The accessor, policies and expiry of a token; `None` with ACLs off.
    fn describe(&self, _token: Option<&str>) -> Option<Result<store::TokenInfo, Unauthenticated>> {
        None
    }

    /// The authorizer of the token whose accessor is `accessor` (`AclCheck` for another
    /// token): what a request with its secret would be allowed, without its secret.
    fn named(&self, accessor: &str) -> Result<Arc<dyn Authorizer>, String> {
        let _ = accessor;
        Ok(Arc::new(Anonymous))
    }
}

/// ACLs disabled: every request, with or without a token, is allowed everything.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AclsDisabled;

impl TokenResolver for AclsDisabled {
    fn resolve(&self, _token: Option<&str>) -> Result<Arc<dyn Authorizer>, Unauthenticated> {
        Ok(Arc::new(Anonymous))
    }
}

/// ACLs enabled with a fixed table of tokens (tests).
#[cfg(test)]
#[derive(Debug, Clone, Default)]
pub(crate) struct StaticTokens {
    tokens: HashMap<String, Arc<KeyRules>>,
}

#[cfg(test)]
impl StaticTokens {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn with_token(mut self, token: impl Into<String>, policy: KeyRules) -> Self {
        self.tokens.insert(token.into(), Arc::new(policy));
        self
    }
}

#[cfg(test)]
impl TokenResolver for StaticTokens {
    fn enabled(&self) -> bool {
        true
    }

    fn resolve(&self, token: Option<&str>) -> Result<Arc<dyn Authorizer>, Unauthenticated> {
        let Some(token) = token.filter(|token| !token.is_empty()) else {
            return Err(Unauthenticated::Refused(
                "ACLs are enabled and the request has no token: pass one in the x-resd-token metadata".to_owned(),
            ));
        };
        match self.tokens.get(token) {
            Some(policy) => Ok(policy.clone() as Arc<dyn Authorizer>),
            None => Err(Unauthenticated::Refused(
                "ACL token not found: check the x-resd-token metadata".to_owned(),
            )),
        }
    }
}

/// The network an address stands for: itself (IPv4), its /64 (IPv6: one host may hold a
/// whole /64, so counting its addresses apart would count nothing).
pub(crate) fn network_of(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V4(_) => ip,
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => std::net::IpAddr::V4(v4),
            None => {
                let mut octets = v6.octets();
                octets[8..].fill(0);
                std::net::IpAddr::V6(octets.into())
            }
        },
    }
}
