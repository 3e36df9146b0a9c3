//! Access control: the [`Authorizer`] that ACL hooks consult, the [`Policy`] it is usually backed
//! by, and the [`TokenResolver`] that turns the `x-resd-token` of a request into an authorizer.
//!
//! The hooks always run. With ACLs disabled every token resolves to [`AllowAll`], so the hooks
//! allow everything; controllers and bootstrap run with [`AllowAll`] as their privileged identity.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

#[cfg(test)]
mod tests;

/// Access level, ordered: each level includes the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Access {
    #[default]
    Deny,
    List,
    Read,
    Write,
}

/// Answers the questions ACL hooks ask. Implementations must be cheap: hooks call them per item
/// when filtering lists and watches.
pub trait Authorizer: Send + Sync + fmt::Debug {
    fn operator(&self) -> Access;
    /// Access to a key; hooks build keys like `resource/demo.v2.Artist/miles`.
    fn key(&self, key: &str) -> Access;
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

/// The request carried no token, or one that is not known, while ACLs are enabled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unauthenticated(pub String);

pub fn require_operator(authorizer: &dyn Authorizer, access: Access) -> Result<(), AclError> {
    if authorizer.operator() >= access {
        Ok(())
    } else {
        Err(AclError::PermissionDenied(format!(
            "token lacks operator:{}",
            access_name(access)
        )))
    }
}

pub fn require_key(authorizer: &dyn Authorizer, key: &str, access: Access) -> Result<(), AclError> {
    if authorizer.key(key) >= access {
        Ok(())
    } else {
        Err(AclError::PermissionDenied(format!(
            "token lacks key:{} on {key:?}",
            access_name(access)
        )))
    }
}

fn access_name(access: Access) -> &'static str {
    match access {
        Access::Deny => "deny",
        Access::List => "list",
        Access::Read => "read",
        Access::Write => "write",
    }
}

/// Allows everything: ACLs disabled, and the privileged identity of in-process callers.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

impl Authorizer for AllowAll {
    fn operator(&self) -> Access {
        Access::Write
    }
    fn key(&self, _key: &str) -> Access {
        Access::Write
    }
}

/// A set of rules: an operator level and key-prefix rules, where the longest matching prefix
/// wins (as in Consul's `key_prefix` rules).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    pub operator: Access,
    pub key_prefixes: Vec<(String, Access)>,
}

impl Policy {
    pub fn operator(mut self, access: Access) -> Self {
        self.operator = access;
        self
    }

    pub fn key_prefix(mut self, prefix: impl Into<String>, access: Access) -> Self {
        self.key_prefixes.push((prefix.into(), access));
        self
    }
}

impl Authorizer for Policy {
    fn operator(&self) -> Access {
        self.operator
    }

    fn key(&self, key: &str) -> Access {
        self.key_prefixes
            .iter()
            .filter(|(prefix, _)| key.starts_with(prefix.as_str()))
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|(_, access)| *access)
            .unwrap_or(Access::Deny)
    }
}

/// Turns a request's token into the authorizer its hooks consult.
pub trait TokenResolver: Send + Sync + fmt::Debug {
    fn resolve(&self, token: Option<&str>) -> Result<Arc<dyn Authorizer>, Unauthenticated>;
}

/// ACLs disabled: every request, with or without a token, is allowed everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct AclsDisabled;

impl TokenResolver for AclsDisabled {
    fn resolve(&self, _token: Option<&str>) -> Result<Arc<dyn Authorizer>, Unauthenticated> {
        Ok(Arc::new(AllowAll))
    }
}

/// ACLs enabled with a fixed table of tokens.
#[derive(Debug, Clone, Default)]
pub struct StaticTokens {
    tokens: HashMap<String, Arc<Policy>>,
}

impl StaticTokens {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_token(mut self, token: impl Into<String>, policy: Policy) -> Self {
        self.tokens.insert(token.into(), Arc::new(policy));
        self
    }
}

impl TokenResolver for StaticTokens {
    fn resolve(&self, token: Option<&str>) -> Result<Arc<dyn Authorizer>, Unauthenticated> {
        let Some(token) = token.filter(|token| !token.is_empty()) else {
            return Err(Unauthenticated(
                "ACLs are enabled and the request has no token: pass one in the x-resd-token metadata".to_owned(),
            ));
        };
        match self.tokens.get(token) {
            Some(policy) => Ok(policy.clone() as Arc<dyn Authorizer>),
            None => Err(Unauthenticated(
                "ACL token not found: check the x-resd-token metadata".to_owned(),
            )),
        }
    }
}
