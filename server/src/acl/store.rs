//! The token cache every node keeps (DESIGN §12.3): the stored `acl.v1.Policy` and
//! `acl.v1.Token` resources, indexed by secret hash, a projection of what the node applied
//! (`service::projections::Acl`: changed in apply, at each change's raft index) answering each
//! request's token without touching storage. An authorizer keeps the revision of the tokens and
//! policies it was made from: what a change it authorizes is fenced on. A change ticks
//! [`TokenResolver::changes`], so open watches re-check their token and end when it was deleted
//! or has expired.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use proto::acl::v1 as pb;
use proto::resource::v1::Id;

use super::rules::{self, CompiledPolicy, Granted, Grants, MANAGEMENT_POLICY};
use super::secrets::{self, Salt, StoredSecret};
use super::{Access, AclError, Authorizer, Grant, TokenResolver, Unauthenticated};

/// A resolved token: its accessor (the resource's name) and what its policies grant.
#[derive(Debug)]
pub(crate) struct TokenAuthorizer {
    accessor: String,
    grants: Grants,
    /// Every policy as this node knew them when the token was resolved: what a token this one
    /// writes would be granted.
    policies: Arc<HashMap<String, Arc<CompiledPolicy>>>,
    /// Of the same moment: which token holds each secret hash, and the policies tokens name.
    tokens: Arc<TokenView>,
    /// The last change to any token or policy the store had applied then: what a change this
    /// token authorizes is fenced on (DESIGN §15).
    revision: crate::resource::Version,
}

/// What the store knew of its tokens when an authorizer was made.
#[derive(Debug, Default)]
struct TokenView {
    /// Secret hash -> accessor.
    hashes: HashMap<String, String>,
    /// Policies some token names.
    named: std::collections::HashSet<String>,
}

impl Authorizer for TokenAuthorizer {
    fn operator(&self) -> Access {
        self.grants.operator()
    }
    fn resource(&self, id: &Id) -> Access {
        self.grants.resource(id)
    }
    fn identity(&self) -> &str {
        &self.accessor
    }
    fn reads_everything(&self) -> bool {
        self.grants.reads_everything()
    }
    fn acl(&self) -> Access {
        self.grants.acl()
    }
    fn may_read_some(
        &self,
        gvk: &str,
        partition: &str,
        namespace: &str,
        name_prefix: &str,
    ) -> bool {
        self.grants
            .may_read_some(gvk, partition, namespace, name_prefix)
    }
    fn may_join(&self) -> bool {
        self.grants.may_join()
    }
    fn schema(&self, gvk: &str) -> Access {
        self.grants.schema(gvk)
    }
    fn is_management(&self) -> bool {
        self.grants.is_management()
    }
    fn explain(&self, id: &Id) -> String {
        self.grants.explain(id)
    }
    fn owns_types(&self, types: &str) -> bool {
        self.grants.owns_types(types)
    }
    fn acl_revision(&self) -> Option<crate::resource::Version> {
        Some(self.revision)
    }
    fn may_grant(&self, grant: Grant<'_>) -> Result<(), AclError> {
        let granted = match grant {
            Grant::Policy { name, policy } => {
                // Tokens combine policies: changing (or deleting) one that tokens name widens
                // them as a whole (a DENY removed from one lifts a limit on the others) — the
                // writer's own token among them. Only management may.
                if self.tokens.named.contains(name) && !self.grants.is_management() {
                    return Err(AclError::PermissionDenied(format!(
                        "policy {name} is named by tokens: changing or deleting it changes what they grant together, so only a {MANAGEMENT_POLICY} token may"
                    )));
                }
                Granted {
                    management: false,
                    policies: vec![(name.to_owned(), Arc::new(CompiledPolicy::new(policy)))],
                }
            }
            Grant::Token { name, token } => {
                // A secret is one token's: a hash copied from another token would make that
                // token's secret resolve to this one (the hijack of a management secret).
                if let Some(holder) = self.tokens.hashes.get(&token.secret_hash)
                    && holder != name
                {
                    return Err(AclError::PermissionDenied(
                        "data.secret_hash is another token's: give the new token a secret of its own".into(),
                    ));
                }
                if self.grants.is_management() {
                    // Holds everything; a policy that does not exist is the references check's.
                    return Ok(());
                }
                let mut policies = Vec::with_capacity(token.policies.len());
                for name in token.policies.iter().filter(|p| *p != MANAGEMENT_POLICY) {
                    // A policy this node has not loaded yet (just written elsewhere) could
                    // grant anything: what cannot be checked is refused, never assumed empty.
                    let Some(policy) = self.policies.get(name) else {
                        return Err(AclError::PermissionDenied(format!(
                            "policy {name} is not known to this server yet, so what it grants cannot be checked; retry in a moment"
                        )));
                    };
                    policies.push((name.clone(), policy.clone()));
                }
                Granted {
                    management: token.policies.iter().any(|p| p == MANAGEMENT_POLICY),
                    policies,
                }
            }
        };
        self.grants
            .holds(&granted)
            .map_err(AclError::PermissionDenied)
    }
}

/// What `AclWhoAmI` reports of a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TokenInfo {
    pub accessor: String,
    pub policies: Vec<String>,
    pub expires_at: String,
}

#[derive(Debug)]
struct Entry {
    info: TokenInfo,
    /// Seconds since the epoch.
    expires_at: Option<i64>,
    authorizer: Arc<TokenAuthorizer>,
}

#[derive(Debug, Default)]
struct Index {
    policies: BTreeMap<String, pb::Policy>,
    tokens: BTreeMap<String, pb::Token>,
    /// The last change to any token or policy applied.
    revision: crate::resource::Version,
    /// Every policy compiled, made again only when a policy changed (a token's change, in
    /// apply, compiles nothing).
    compiled: Arc<HashMap<String, Arc<CompiledPolicy>>>,
    /// Whether a policy changed since `compiled` was made.
    policies_changed: bool,
    /// Stored secret hash -> token.
    by_hash: HashMap<String, Arc<Entry>>,
    /// The salts (and rounds) of the tokens with chosen secrets, the most used first: what a
    /// secret not found by its SHA-256 is hashed with, one by one.
    salts: Vec<(Salt, u32)>,
}

/// Chosen secrets this node has verified, by the SHA-256 of the secret presented (memory only),
/// so that each costs one slow hash per process; and budgets of slow hashes for secrets not
/// verified yet, so that strangers sending made-up tokens cannot keep the node's cores busy —
/// one per client address (a flood from one address spends its own, and a known token sent
/// from elsewhere is still verified), within a node-wide one.
#[derive(Debug)]
struct Verified {
    /// SHA-256 of a presented secret -> the stored hash it matched.
    known: HashMap<String, String>,
    /// SHA-256 of presented secrets that matched nothing since the tokens last changed.
    missed: std::collections::HashSet<String>,
    /// The node's budget: seconds of slow hashing left to spend, refilled over time.
    node: Bucket,
    /// Each client address's budget (its network: an IPv6 /64), bounded in number.
    addresses: HashMap<Option<std::net::IpAddr>, Bucket>,
    /// What one round of a slow hash costs here (seconds), as last measured: a lookup reserves
    /// its hashes' cost from the budgets before it starts, so lookups started together cannot
    /// all pass a budget none of them has spent yet.
    seconds_per_round: f64,
}

/// A round's cost before any is measured: on the high side (100,000 rounds: half a second), so
/// the first lookups reserve too much rather than too little.
const FIRST_SECONDS_PER_ROUND: f64 = 5e-6;

/// Seconds of slow hashing left, refilled at a rate up to a burst.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    left: f64,
    refilled: std::time::Instant,
}

impl Bucket {
    fn full(burst: f64) -> Bucket {
        Bucket {
            left: burst,
            refilled: std::time::Instant::now(),
        }
    }

    /// Refills for the time since the last refill; whether anything is left to spend.
    fn refill(&mut self, per_second: f64, burst: f64) -> bool {
        let now = std::time::Instant::now();
        let elapsed = now.duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        self.left = (self.left + elapsed * per_second).min(burst);
        self.left > 0.0
    }
}

/// Seconds of one core a client address may make the node spend per second hashing secrets it
/// has not verified yet (a quarter of a core, whatever a hash costs on this machine), and at
/// most in a burst; the node as a whole spends at most a core.
const SLOW_HASHING_PER_SECOND: f64 = 0.25;
const SLOW_HASHING_BURST: f64 = 0.5;
const NODE_SLOW_HASHING_PER_SECOND: f64 = 1.0;
const NODE_SLOW_HASHING_BURST: f64 = 2.0;
/// Verified (and unmatched) secrets remembered, and addresses with a budget; past it the memory
/// starts over.
const MAX_VERIFIED: usize = 4096;

/// The token cache of one node.
#[derive(Debug)]
pub(crate) struct TokenStore {
    default: Access,
    /// Whether the policies and the tokens were each listed once (before, every request is
    /// told to retry: the node is still loading).
    policies_loaded: std::sync::atomic::AtomicBool,
    tokens_loaded: std::sync::atomic::AtomicBool,
    index: RwLock<Index>,
    verified: std::sync::Mutex<Verified>,
    changes: tokio::sync::watch::Sender<u64>,
}

impl TokenStore {
    /// An empty store; `default` is what rules grant where none speaks (`deny` → Deny, `allow`
    /// → Write).
    pub(crate) fn new(default: Access) -> TokenStore {
        TokenStore {
            default,
            policies_loaded: std::sync::atomic::AtomicBool::new(false),
            tokens_loaded: std::sync::atomic::AtomicBool::new(false),
            index: RwLock::new(Index::default()),
            verified: std::sync::Mutex::new(Verified {
                known: HashMap::new(),
                missed: Default::default(),
                node: Bucket::full(NODE_SLOW_HASHING_BURST),
                addresses: HashMap::new(),
                seconds_per_round: FIRST_SECONDS_PER_ROUND,
            }),
            changes: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Records a stored policy (a new one or a change).
    #[cfg(test)]
    pub(crate) fn put_policy(&self, name: &str, policy: pb::Policy) {
        self.update(|index| {
            index.policies.insert(name.to_owned(), policy);
            index.policies_changed = true;
        });
    }

    #[cfg(test)]
    pub(crate) fn remove_policy(&self, name: &str) {
        self.update(|index| {
            index.policies.remove(name);
            index.policies_changed = true;
        });
    }

    /// Records a stored token (a new one or a change).
    #[cfg(test)]
    pub(crate) fn put_token(&self, name: &str, token: pb::Token) {
        self.update(|index| {
            index.tokens.insert(name.to_owned(), token);
        });
    }

    #[cfg(test)]
    pub(crate) fn remove_token(&self, name: &str) {
        self.update(|index| {
            index.tokens.remove(name);
        });
    }

    /// Replaces every policy (a fresh list from a watch's snapshot).
    #[cfg(test)]
    pub(crate) fn replace_policies(&self, policies: Vec<(String, pb::Policy)>) {
        self.update(|index| {
            index.policies = policies.into_iter().collect();
            index.policies_changed = true;
        });
        self.policies_loaded
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Replaces every token (a fresh list from a watch's snapshot).
    #[cfg(test)]
    pub(crate) fn replace_tokens(&self, tokens: Vec<(String, pb::Token)>) {
        self.update(|index| index.tokens = tokens.into_iter().collect());
        self.tokens_loaded
            .store(true, std::sync::atomic::Ordering::Release);
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(|p| p.into_inner())
    }

    fn update(&self, change: impl FnOnce(&mut Index)) {
        {
            let mut index = self.index.write().unwrap_or_else(|p| p.into_inner());
            change(&mut index);
            if std::mem::take(&mut index.policies_changed) {
                index.compiled = Arc::new(
                    index
                        .policies
                        .iter()
                        .map(|(name, policy)| (name.clone(), Arc::new(CompiledPolicy::new(policy))))
                        .collect(),
                );
            }
            let compiled = index.compiled.clone();
            let view = Arc::new(TokenView {
                hashes: index
                    .tokens
                    .iter()
                    .map(|(accessor, token)| (token.secret_hash.clone(), accessor.clone()))
                    .collect(),
                named: index
                    .tokens
                    .values()
                    .flat_map(|token| token.policies.iter().cloned())
                    .collect(),
            });
            let mut by_hash = HashMap::new();
            // Accessors in order: of two tokens with the same secret, the first name wins.
            for (accessor, token) in &index.tokens {
                if !rules::is_secret_hash(&token.secret_hash) {
                    continue;
                }
                let management = token.policies.iter().any(|p| p == MANAGEMENT_POLICY);
                let (names, policies): (Vec<String>, Vec<_>) = token
                    .policies
                    .iter()
                    .filter_map(|name| Some((name.clone(), compiled.get(name).cloned()?)))
                    .unzip();
                let entry = Entry {
                    info: TokenInfo {
                        accessor: accessor.clone(),
                        policies: token.policies.clone(),
                        expires_at: token.expires_at.clone(),
                    },
                    expires_at: (!token.expires_at.is_empty())
                        .then(|| rules::parse_expiry(&token.expires_at).unwrap_or(i64::MIN)),
                    authorizer: Arc::new(TokenAuthorizer {
                        accessor: accessor.clone(),
                        grants: Grants::new(management, policies, self.default).named(names),
                        policies: compiled.clone(),
                        tokens: view.clone(),
                        revision: index.revision,
                    }),
                };
                by_hash
                    .entry(token.secret_hash.clone())
                    .or_insert_with(|| Arc::new(entry));
            }
            index.by_hash = by_hash;
            let mut salts: HashMap<(Salt, u32), usize> = HashMap::new();
            for token in index.tokens.values() {
                if let Some(StoredSecret::Slow {
                    iterations, salt, ..
                }) = StoredSecret::parse(&token.secret_hash)
                {
                    *salts.entry((salt, iterations)).or_default() += 1;
                }
            }
            let mut salts: Vec<((Salt, u32), usize)> = salts.into_iter().collect();
            salts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            index.salts = salts
                .into_iter()
                .take(secrets::MAX_SALTS)
                .map(|(salt, _)| salt)
                .collect();
            if let Some((salt, _)) = index.salts.first() {
                secrets::prefer_salt(*salt);
            }
        }
        // A secret that matched nothing may match a token written since.
        self.verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .missed
            .clear();
        self.changes.send_modify(|generation| *generation += 1);
    }

    fn entry(
        &self,
        token: Option<&str>,
        remote: Option<std::net::IpAddr>,
    ) -> Result<Arc<Entry>, Unauthenticated> {
        let Some(token) = token.filter(|token| !token.is_empty()) else {
            return Err(Unauthenticated::Refused(
                "ACLs are enabled and the request has no token (send it in the x-resd-token metadata)".into(),
            ));
        };
        if token.len() > rules::MAX_SECRET_LEN {
            return Err(Unauthenticated::Refused(format!(
                "the token is {} characters long; tokens are at most {}",
                token.len(),
                rules::MAX_SECRET_LEN
            )));
        }
        let loaded = self
            .policies_loaded
            .load(std::sync::atomic::Ordering::Acquire)
            && self
                .tokens_loaded
                .load(std::sync::atomic::Ordering::Acquire);
        if !loaded {
            return Err(Unauthenticated::Loading(
                "this server is still loading its ACL tokens; retry in a moment or ask another member".into(),
            ));
        }
        let entry = self.find(token, remote)?.ok_or_else(|| {
            Unauthenticated::Refused("ACL token not found (deleted, or mistyped?)".into())
        })?;
        if let Some(expires_at) = entry.expires_at
            && expires_at <= time::OffsetDateTime::now_utc().unix_timestamp()
        {
            return Err(Unauthenticated::Refused(format!(
                "ACL token {} expired at {}",
                entry.info.accessor, entry.info.expires_at
            )));
        }
        Ok(entry)
    }

    /// The token whose secret is `secret`: by its SHA-256 (a generated secret), else by the
    /// memory of verified secrets, else by a slow hash with each salt in use, within the node's
    /// budget of slow hashes.
    fn find(
        &self,
        secret: &str,
        remote: Option<std::net::IpAddr>,
    ) -> Result<Option<Arc<Entry>>, Unauthenticated> {
        let fast = secrets::fast_hash(secret);
        let salts = {
            let index = self.read();
            if let Some(entry) = index.by_hash.get(&fast) {
                return Ok(Some(entry.clone()));
            }
            if secrets::is_generated(secret) || index.salts.is_empty() {
                return Ok(None);
            }
            let verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
            // Verified before and still stored that way (a token rewritten with the same secret
            // and another salt is verified again below).
            if let Some(entry) = verified
                .known
                .get(&fast)
                .and_then(|stored| index.by_hash.get(stored))
            {
                return Ok(Some(entry.clone()));
            }
            if verified.missed.contains(&fast) {
                return Ok(None);
            }
            index.salts.clone()
        };
        let remote = remote.map(super::network_of);
        let rounds: f64 = salts
            .iter()
            .map(|(_, iterations)| f64::from(*iterations))
            .sum();
        let reserved = {
            let mut verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
            if verified.addresses.len() >= MAX_VERIFIED && !verified.addresses.contains_key(&remote)
            {
                // Forget the addresses that have their whole budget back (nothing lost).
                verified.addresses.retain(|_, bucket| {
                    !bucket.refill(SLOW_HASHING_PER_SECOND, SLOW_HASHING_BURST)
                        || bucket.left < SLOW_HASHING_BURST
                });
                if verified.addresses.len() >= MAX_VERIFIED {
                    verified.addresses.clear();
                }
            }
            let address_has = verified
                .addresses
                .entry(remote)
                .or_insert_with(|| Bucket::full(SLOW_HASHING_BURST))
                .refill(SLOW_HASHING_PER_SECOND, SLOW_HASHING_BURST);
            let node_has = verified
                .node
                .refill(NODE_SLOW_HASHING_PER_SECOND, NODE_SLOW_HASHING_BURST);
            if !address_has || !node_has {
                return Err(Unauthenticated::NotReady(format!(
                    "this server is checking too many unrecognised tokens{} at once; retry in a second",
                    if address_has {
                        ""
                    } else {
                        " from this address"
                    }
                )));
            }
            // Reserved now, settled once measured.
            let reserved = rounds * verified.seconds_per_round;
            verified.node.left -= reserved;
            if let Some(bucket) = verified.addresses.get_mut(&remote) {
                bucket.left -= reserved;
            }
            reserved
        };
        let started = std::time::Instant::now();
        let mut hashed = 0f64;
        let charge = |store: &TokenStore, hashed: f64| {
            let spent = started.elapsed().as_secs_f64();
            let mut verified = store.verified.lock().unwrap_or_else(|p| p.into_inner());
            verified.node.left -= spent - reserved;
            if let Some(bucket) = verified.addresses.get_mut(&remote) {
                bucket.left -= spent - reserved;
            }
            if hashed > 0.0 {
                verified.seconds_per_round = spent / hashed;
            }
        };
        for (salt, iterations) in salts {
            hashed += f64::from(iterations);
            let stored = StoredSecret::Slow {
                iterations,
                salt,
                hash: secrets::slow_hash(secret, &salt, iterations),
            }
            .to_string();
            let found = self.read().by_hash.get(&stored).cloned();
            if let Some(entry) = found {
                charge(self, hashed);
                let mut verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
                if verified.known.len() >= MAX_VERIFIED {
                    verified.known.clear();
                }
                verified.known.insert(fast, stored);
                return Ok(Some(entry));
            }
        }
        charge(self, hashed);
        let mut verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        if verified.missed.len() >= MAX_VERIFIED {
            verified.missed.clear();
        }
        verified.missed.insert(fast);
        Ok(None)
    }

    /// The accessor, policies and expiry of a valid token.
    pub(crate) fn describe(&self, token: Option<&str>) -> Result<TokenInfo, Unauthenticated> {
        self.entry(token, None).map(|entry| entry.info.clone())
    }
}

/// A stored resource's data as `M` (`None`: no data, or data that does not decode).
fn decode_stored<M: prost::Message + Default>(stored: &proto::resource::v1::Resource) -> Option<M> {
    M::decode(stored.data.as_ref()?.value.as_slice()).ok()
}

/// The store follows the stored tokens and policies in apply, at their raft index, on every
/// node (DESIGN §15): `service::projections` calls these.
impl TokenStore {
    /// A committed change of a token or policy (`upsert`: written, else deleted), at `version`.
    /// One that does not decode (written so by a bug) grants nothing: it is removed.
    pub(crate) fn changed(
        &self,
        stored: &proto::resource::v1::Resource,
        upsert: bool,
        version: crate::resource::Version,
    ) {
        let Some(id) = &stored.id else { return };
        let kind = id
            .r#type
            .as_ref()
            .map(|t| t.kind.as_str())
            .unwrap_or_default();
        let name = id.name.clone();
        self.update(|index| {
            index.revision = index.revision.max(version);
            match kind {
                "Policy" => {
                    index.policies_changed = true;
                    match upsert
                        .then(|| decode_stored::<pb::Policy>(stored))
                        .flatten()
                    {
                        Some(policy) => {
                            index.policies.insert(name, policy);
                        }
                        None => {
                            index.policies.remove(&name);
                        }
                    }
                }
                "Token" => match upsert.then(|| decode_stored::<pb::Token>(stored)).flatten() {
                    Some(token) => {
                        index.tokens.insert(name, token);
                    }
                    None => {
                        index.tokens.remove(&name);
                    }
                },
                _ => {}
            }
        });
    }

    /// Every token and policy replaced by `stored`, the state at `revision`.
    pub(crate) fn reset(
        &self,
        stored: &[proto::resource::v1::Resource],
        revision: crate::resource::Version,
    ) {
        let mut policies = BTreeMap::new();
        let mut tokens = BTreeMap::new();
        for item in stored {
            let Some(id) = &item.id else { continue };
            match id.r#type.as_ref().map(|t| t.kind.as_str()) {
                Some("Policy") => {
                    if let Some(policy) = decode_stored::<pb::Policy>(item) {
                        policies.insert(id.name.clone(), policy);
                    }
                }
                Some("Token") => {
                    if let Some(token) = decode_stored::<pb::Token>(item) {
                        tokens.insert(id.name.clone(), token);
                    }
                }
                _ => {}
            }
        }
        self.update(|index| {
            index.policies = policies;
            index.policies_changed = true;
            index.tokens = tokens;
            index.revision = revision;
        });
        self.policies_loaded
            .store(true, std::sync::atomic::Ordering::Release);
        self.tokens_loaded
            .store(true, std::sync::atomic::Ordering::Release);
    }
}

impl TokenResolver for TokenStore {
    fn resolve(&self, token: Option<&str>) -> Result<Arc<dyn Authorizer>, Unauthenticated> {
        self.resolve_from(token, None)
    }

    fn resolve_from(
        &self,
        token: Option<&str>,
        remote: Option<std::net::IpAddr>,
    ) -> Result<Arc<dyn Authorizer>, Unauthenticated> {
        self.entry(token, remote)
            .map(|entry| entry.authorizer.clone() as Arc<dyn Authorizer>)
    }

    fn enabled(&self) -> bool {
        true
    }

    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.changes.subscribe())
    }

    fn describe(&self, token: Option<&str>) -> Option<Result<TokenInfo, Unauthenticated>> {
        Some(TokenStore::describe(self, token))
    }

    fn named(&self, accessor: &str) -> Result<Arc<dyn Authorizer>, String> {
        let index = self.read();
        let entry = index
            .by_hash
            .values()
            .find(|entry| entry.info.accessor == accessor)
            .cloned()
            .ok_or_else(|| {
                format!("no token is named {accessor:?} (acl.v1.Token names are accessors)")
            })?;
        if let Some(expires_at) = entry.expires_at
            && expires_at <= time::OffsetDateTime::now_utc().unix_timestamp()
        {
            return Err(format!(
                "token {accessor} expired at {}: it is allowed nothing",
                entry.info.expires_at
            ));
        }
        Ok(entry.authorizer.clone() as Arc<dyn Authorizer>)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(secret: &str, policies: &[&str], expires_at: &str) -> pb::Token {
        pb::Token {
            description: String::new(),
            policies: policies.iter().map(|p| p.to_string()).collect(),
            expires_at: expires_at.into(),
            secret: String::new(),
            secret_hash: secrets::store(secret).expect("stored"),
        }
    }

    /// A secret of the generated shape (hashed fast), named for the reader.
    fn generated(name: &str) -> String {
        let secret = secrets::fast_hash(name)[7..].to_owned();
        assert!(secrets::is_generated(&secret), "{secret}");
        secret
    }

    #[test]
    fn tokens_resolve_by_secret_until_deleted_or_expired() {
        let store = TokenStore::new(Access::Deny);
        let mut changes = TokenResolver::changes(&store).expect("changes");
        assert!(matches!(
            store.resolve(Some("anything")),
            Err(Unauthenticated::Loading(_))
        ));
        store.replace_policies(Vec::new());
        store.replace_tokens(Vec::new());
        store.put_policy(
            "ops",
            pb::Policy {
                operator: pb::Access::Read as i32,
                ..Default::default()
            },
        );
        store.put_token("alice", token(&generated("alice"), &["ops"], ""));
        store.put_token("root", token(&generated("root"), &[MANAGEMENT_POLICY], ""));
        store.put_token(
            "old",
            token(&generated("old"), &["ops"], "2001-01-01T00:00:00Z"),
        );
        assert!(changes.has_changed().unwrap_or(false));

        let alice = store.resolve(Some(&generated("alice"))).expect("alice");
        assert_eq!(alice.identity(), "alice");
        assert_eq!(alice.operator(), Access::Read);
        let root = store.resolve(Some(&generated("root"))).expect("root");
        assert_eq!(root.operator(), Access::Write);

        let error = store.resolve(Some(&generated("old"))).expect_err("expired");
        assert!(error.to_string().contains("expired"), "{error}");
        assert!(
            store
                .resolve(None)
                .expect_err("none")
                .to_string()
                .contains("no token")
        );
        assert!(
            store
                .resolve(Some("nope"))
                .expect_err("unknown")
                .to_string()
                .contains("not found")
        );
        let long = "x".repeat(10_000);
        assert!(
            store
                .resolve(Some(&long))
                .expect_err("long")
                .to_string()
                .contains("at most")
        );

        changes.mark_unchanged();
        store.remove_token("alice");
        assert!(changes.has_changed().unwrap_or(false));
        assert!(store.resolve(Some(&generated("alice"))).is_err());

        // Deleting a policy takes its grants away from the tokens that name it.
        store.put_token("bob", token(&generated("bob"), &["ops"], ""));
        store.remove_policy("ops");
        let bob = store.resolve(Some(&generated("bob"))).expect("bob");
        assert_eq!(bob.operator(), Access::Deny);
    }

    #[test]
    fn chosen_secrets_are_found_by_their_salted_hash_within_a_budget_of_slow_hashes() {
        let store = TokenStore::new(Access::Deny);
        store.replace_policies(Vec::new());
        let generated = proto::tls::new_secret().expect("secret");
        store.replace_tokens(vec![
            (
                "chosen".into(),
                token("correct-horse-battery-staple", &[], ""),
            ),
            ("generated".into(), token(&generated, &[], "")),
        ]);
        let stored = store.read().tokens["chosen"].secret_hash.clone();
        assert!(stored.starts_with("pbkdf2-sha256:"), "{stored}");
        assert!(
            store.read().tokens["generated"]
                .secret_hash
                .starts_with("sha256:")
        );
        assert_eq!(store.read().salts.len(), 1);

        let spend = |store: &TokenStore| store.verified.lock().expect("lock").node.left;
        let before = spend(&store);
        assert_eq!(
            store
                .resolve(Some("correct-horse-battery-staple"))
                .expect("chosen")
                .identity(),
            "chosen"
        );
        assert!(spend(&store) < before, "a first lookup costs a slow hash");
        // A generated secret never costs one, found or not.
        let after_first = spend(&store);
        assert_eq!(
            store
                .resolve(Some(&generated))
                .expect("generated")
                .identity(),
            "generated"
        );
        let unknown = proto::tls::new_secret().expect("secret");
        assert!(matches!(
            store.resolve(Some(&unknown)),
            Err(Unauthenticated::Refused(_))
        ));
        assert!(spend(&store) >= after_first);

        // Made-up tokens of another shape spend the budget, then wait; a verified chosen
        // secret is still found from memory.
        let mut refused_for_now = false;
        for attempt in 0..256 {
            match store.resolve(Some(&format!("made-up-token-number-{attempt}"))) {
                Err(Unauthenticated::Refused(_)) => {}
                Err(Unauthenticated::NotReady(why)) => {
                    assert!(why.contains("retry"), "{why}");
                    refused_for_now = true;
                    break;
                }
                Err(Unauthenticated::Loading(why)) => panic!("the store is loaded: {why}"),
                Ok(_) => panic!("a made-up token resolved"),
            }
        }
        assert!(refused_for_now, "the budget of slow hashes ran out");
        assert_eq!(
            store
                .resolve(Some("correct-horse-battery-staple"))
                .expect("remembered")
                .identity(),
            "chosen"
        );
        // Deleting the token forgets it, memory or not.
        store.remove_token("chosen");
        assert!(store.resolve(Some("correct-horse-battery-staple")).is_err());
    }

    /// A flood of made-up tokens from one address spends that address's budget: a chosen secret
    /// never verified on this node, sent from another address, is still verified.
    #[test]
    fn a_flood_from_one_address_does_not_lock_out_a_known_token_from_another() {
        let store = TokenStore::new(Access::Deny);
        store.replace_policies(Vec::new());
        store.replace_tokens(vec![(
            "chosen".into(),
            token("correct-horse-battery-staple", &[MANAGEMENT_POLICY], ""),
        )]);
        let attacker = Some(std::net::IpAddr::from([127, 0, 0, 2]));
        let operator = Some(std::net::IpAddr::from([127, 0, 0, 1]));
        let mut refused = 0;
        for attempt in 0..256 {
            if let Err(Unauthenticated::NotReady(why)) =
                store.resolve_from(Some(&format!("made-up-token-number-{attempt}")), attacker)
            {
                assert!(why.contains("from this address"), "{why}");
                refused += 1;
            }
        }
        assert!(
            refused > 200,
            "the attacker's budget ran out ({refused} refused)"
        );
        assert_eq!(
            store
                .resolve_from(Some("correct-horse-battery-staple"), operator)
                .expect("verified from another address")
                .identity(),
            "chosen"
        );
    }

    /// Lookups started together reserve their hashes' cost before any is spent: sixteen made-up
    /// secrets from one address at once start only as many slow hashes as its budget holds
    /// (all sixteen ran before, each seeing the budget none had charged yet).
    #[test]
    fn lookups_started_together_cannot_overdraw_the_budget() {
        let store = Arc::new(TokenStore::new(Access::Deny));
        store.replace_policies(Vec::new());
        store.replace_tokens(vec![(
            "chosen".into(),
            token("correct-horse-battery-staple", &[], ""),
        )]);
        let attacker = Some(std::net::IpAddr::from([127, 0, 0, 3]));
        let start = Arc::new(std::sync::Barrier::new(16));
        let threads: Vec<_> = (0..16)
            .map(|n| {
                let (store, start) = (store.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    store.resolve_from(Some(&format!("made-up-token-number-{n}")), attacker)
                })
            })
            .collect();
        let hashed = threads
            .into_iter()
            .map(|thread| thread.join().expect("joins"))
            .filter(|outcome| !matches!(outcome, Err(Unauthenticated::NotReady(_))))
            .count();
        assert!(hashed <= 3, "{hashed} of 16 slow hashes started at once");
        assert!(hashed >= 1, "the budget allows one");
    }

    #[test]
    fn a_token_naming_a_policy_not_loaded_yet_is_not_granted() {
        let store = TokenStore::new(Access::Deny);
        store.replace_policies(vec![(
            "delegate".into(),
            pb::Policy {
                acl: pb::Access::Write as i32,
                ..Default::default()
            },
        )]);
        store.replace_tokens(vec![(
            "delegate".into(),
            token("delegate-secret-0123456789", &["delegate"], ""),
        )]);
        let writer = store
            .resolve(Some("delegate-secret-0123456789"))
            .expect("writer");
        let naming_unknown = token("x", &["written-elsewhere"], "");
        let refused = writer
            .may_grant(Grant::Token {
                name: "x",
                token: &naming_unknown,
            })
            .expect_err("unknown policy");
        assert!(refused.to_string().contains("not known"), "{refused}");
        // A policy it holds (nothing) is fine.
        writer
            .may_grant(Grant::Token {
                name: "y",
                token: &token("y-secret-0123456789", &["delegate"], ""),
            })
            .expect("within");
    }

    /// A token's change (each one is applied in raft apply) compiles no policy again; a
    /// policy's does.
    #[test]
    fn a_token_change_compiles_no_policy_again() {
        let store = TokenStore::new(Access::Deny);
        store.replace_policies(vec![("ops".into(), pb::Policy::default())]);
        store.replace_tokens(Vec::new());
        let before = store.read().compiled.clone();
        assert_eq!(before.len(), 1);
        store.put_token("alice", token(&generated("alice"), &["ops"], ""));
        store.remove_token("alice");
        assert!(Arc::ptr_eq(&before, &store.read().compiled));
        store.put_policy("ops", pb::Policy::default());
        assert!(!Arc::ptr_eq(&before, &store.read().compiled));
    }
}
