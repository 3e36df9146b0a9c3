//! The rules of `acl.v1.Policy` (DESIGN §12.3): checking a policy or token a client writes, and
//! evaluating a token's policies against a resource or a cluster operation.
//!
//! A rule matches a resource when one of its type globs matches the resource's
//! `group.version.Kind`, its partition and namespace match (a name, or `*`/empty for any), and
//! the name starts with its `name_prefix`. Over every matching rule of every policy of a token:
//! a DENY wins, otherwise the highest access; nothing matching falls to the default policy.

use proto::acl::v1 as pb;
use proto::resource::v1::Id;

use super::Access;

/// The built-in policy that allows everything. It is not stored; tokens name it.
pub(crate) const MANAGEMENT_POLICY: &str = "global-management";

/// Longest type glob, partition/namespace pattern or name prefix a rule may hold.
const MAX_PATTERN_LEN: usize = 256;
/// Most rules one policy may hold.
const MAX_RULES: usize = 256;
/// Most policies one token may name.
const MAX_TOKEN_POLICIES: usize = 64;

/// What a rule's access field grants: `None` for unspecified (nothing).
fn access_of(value: i32) -> Result<Option<Access>, String> {
    match pb::Access::try_from(value) {
        Ok(pb::Access::Unspecified) => Ok(None),
        Ok(pb::Access::Deny) => Ok(Some(Access::Deny)),
        Ok(pb::Access::List) => Ok(Some(Access::List)),
        Ok(pb::Access::Read) => Ok(Some(Access::Read)),
        Ok(pb::Access::Write) => Ok(Some(Access::Write)),
        Err(_) => Err(format!(
            "unknown access {value} (use ACCESS_DENY, ACCESS_LIST, ACCESS_READ or ACCESS_WRITE)"
        )),
    }
}

/// Whether `glob` (with `*` matching any run of characters) matches `text`.
pub(crate) fn glob_matches(glob: &str, text: &str) -> bool {
    let mut parts = glob.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

fn check_type_glob(glob: &str) -> Result<(), String> {
    if glob.is_empty() {
        return Err("is empty (use `*` for every type)".into());
    }
    if glob.len() > MAX_PATTERN_LEN {
        return Err(format!("is longer than {MAX_PATTERN_LEN} characters"));
    }
    if glob == "*" {
        return Ok(());
    }
    let segments: Vec<&str> = glob.split('.').collect();
    if segments.len() != 3 || segments.iter().any(|segment| segment.is_empty()) {
        return Err(format!(
            "{glob:?} is not a group.version.Kind glob such as `demo.*.*` or `demo.v2.Artist`"
        ));
    }
    if let Some(bad) = glob
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '*' | '_' | '-')))
    {
        return Err(format!("{glob:?} holds {bad:?}"));
    }
    Ok(())
}

fn check_name_pattern(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() || pattern == "*" {
        return Ok(());
    }
    crate::resource::check_name(pattern, crate::resource::MAX_NAME_LEN)
        .map_err(|why| format!("{pattern:?} is neither `*` nor a valid name: {why}"))
}

/// Checks a policy a client writes; every problem names its field.
pub(crate) fn check_policy(policy: &pb::Policy) -> Result<(), String> {
    let mut problems = Vec::new();
    if policy.rules.len() > MAX_RULES {
        problems.push(format!(
            "data.rules holds {} rules, more than {MAX_RULES}",
            policy.rules.len()
        ));
    }
    if let Err(why) = access_of(policy.operator) {
        problems.push(format!("data.operator: {why}"));
    }
    match access_of(policy.acl) {
        Err(why) => problems.push(format!("data.acl: {why}")),
        Ok(Some(Access::List)) => problems.push(
            "data.acl: ACCESS_LIST means nothing for ACLs (use ACCESS_READ or ACCESS_WRITE)".into(),
        ),
        Ok(_) => {}
    }
    for (index, rule) in policy.rules.iter().enumerate() {
        let field = format!("data.rules[{index}]");
        if rule.types.is_empty() {
            problems.push(format!(
                "{field}.types is empty (use [\"*\"] for every type)"
            ));
        }
        for (at, glob) in rule.types.iter().enumerate() {
            if let Err(why) = check_type_glob(glob) {
                problems.push(format!("{field}.types[{at}] {why}"));
            }
        }
        for (name, pattern) in [
            ("partition", &rule.partition),
            ("namespace", &rule.namespace),
        ] {
            if let Err(why) = check_name_pattern(pattern) {
                problems.push(format!("{field}.{name}: {why}"));
            }
        }
        if rule.name_prefix.len() > MAX_PATTERN_LEN {
            problems.push(format!(
                "{field}.name_prefix is longer than {MAX_PATTERN_LEN} characters"
            ));
        }
        let schema = match access_of(rule.schema) {
            Err(why) => {
                problems.push(format!("{field}.schema: {why}"));
                None
            }
            Ok(Some(Access::List)) => {
                problems.push(format!(
                    "{field}.schema: ACCESS_LIST means nothing for type ownership (use ACCESS_READ or ACCESS_WRITE)"
                ));
                None
            }
            Ok(schema) => schema,
        };
        match access_of(rule.access) {
            Err(why) => problems.push(format!("{field}.access: {why}")),
            Ok(None) if schema.is_none() => problems.push(format!(
                "{field}.access is required (ACCESS_DENY, ACCESS_LIST, ACCESS_READ or ACCESS_WRITE), unless the rule sets schema"
            )),
            Ok(_) => {}
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// Parses an RFC 3339 expiry into seconds since the epoch.
pub(crate) fn parse_expiry(value: &str) -> Result<i64, String> {
    time::OffsetDateTime::parse(value, &time::format_description::well_known::Rfc3339)
        .map(|at| at.unix_timestamp())
        .map_err(|error| format!("{value:?} is not an RFC 3339 time ({error})"))
}

fn now_seconds() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// Checks a token a client writes (after its secret was hashed); every problem names its field.
/// Whether the named policies exist is checked by the service, which can read them.
pub(crate) fn check_token(token: &pb::Token) -> Result<(), String> {
    let mut problems = Vec::new();
    if token.policies.is_empty() {
        problems.push(format!(
            "data.policies is empty: name at least one policy (or {MANAGEMENT_POLICY})"
        ));
    }
    if token.policies.len() > MAX_TOKEN_POLICIES {
        problems.push(format!(
            "data.policies names more than {MAX_TOKEN_POLICIES} policies"
        ));
    }
    for (index, name) in token.policies.iter().enumerate() {
        if let Err(why) = crate::resource::check_name(name, crate::resource::MAX_NAME_LEN) {
            problems.push(format!(
                "data.policies[{index}] {name:?} is not a valid name: {why}"
            ));
        }
    }
    if !token.expires_at.is_empty() {
        match parse_expiry(&token.expires_at) {
            Err(why) => problems.push(format!("data.expires_at: {why}")),
            Ok(at) if at <= now_seconds() => problems.push(format!(
                "data.expires_at {} is in the past",
                token.expires_at
            )),
            Ok(_) => {}
        }
    }
    if !token.secret.is_empty() {
        problems.push("data.secret must be hashed before storing".into());
    }
    if !is_secret_hash(&token.secret_hash) {
        problems.push(
            "data.secret is required: give the token's secret (or keep the stored data.secret_hash)"
                .into(),
        );
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// Whether `value` is a stored secret: `sha256:<hex>` or `pbkdf2-sha256:…`
/// ([`super::secrets::StoredSecret`]).
pub(crate) fn is_secret_hash(value: &str) -> bool {
    super::secrets::StoredSecret::parse(value).is_some()
}

/// Shortest secret a writer may choose.
pub(crate) const MIN_SECRET_LEN: usize = 16;
/// Longest secret (and the longest token header the server hashes).
pub(crate) const MAX_SECRET_LEN: usize = 512;

/// The mutate step of `acl.v1.Token`: a secret given in the clear is replaced by its hash.
pub(crate) fn hash_token_secret(token: &mut pb::Token) -> Result<(), String> {
    if token.secret.is_empty() {
        return Ok(());
    }
    if token.secret.len() < MIN_SECRET_LEN || token.secret.len() > MAX_SECRET_LEN {
        return Err(format!(
            "data.secret must be {MIN_SECRET_LEN} to {MAX_SECRET_LEN} characters (got {})",
            token.secret.len()
        ));
    }
    if !token.secret.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("data.secret must be printable ASCII without spaces".into());
    }
    token.secret_hash = super::secrets::store(&token.secret)?;
    token.secret.clear();
    Ok(())
}

/// One rule, ready to match.
#[derive(Debug, Clone)]
struct Rule {
    types: Vec<String>,
    partition: Option<String>,
    namespace: Option<String>,
    name_prefix: String,
    access: Access,
}

/// What a token or a policy grants, to be checked against what its writer holds
/// ([`Grants::holds`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Granted {
    /// Whether it grants the management policy.
    pub management: bool,
    /// The policies it grants, by name.
    pub policies: Vec<(String, std::sync::Arc<CompiledPolicy>)>,
}

impl Rule {
    /// Whether every resource `other` matches, this matches too.
    fn contains(&self, other: &Rule) -> bool {
        let place = |mine: &Option<String>, theirs: &Option<String>| match (mine, theirs) {
            (None, _) => true,
            (Some(mine), Some(theirs)) => mine == theirs,
            (Some(_), None) => false,
        };
        place(&self.partition, &other.partition)
            && place(&self.namespace, &other.namespace)
            && other.name_prefix.starts_with(&self.name_prefix)
            && types_contain(&self.types, &other.types)
    }

    /// Whether some resource may match both (conservative: `true` unless they cannot).
    fn may_overlap(&self, other: &Rule) -> bool {
        let place = |mine: &Option<String>, theirs: &Option<String>| match (mine, theirs) {
            (Some(mine), Some(theirs)) => mine == theirs,
            _ => true,
        };
        place(&self.partition, &other.partition)
            && place(&self.namespace, &other.namespace)
            && (self.name_prefix.starts_with(&other.name_prefix)
                || other.name_prefix.starts_with(&self.name_prefix))
            && types_may_overlap(&self.types, &other.types)
    }

    /// The resources it matches, for people: `demo.*.* default/jazz secret-*`.
    fn describe(&self) -> String {
        format!(
            "{} {}/{}{}",
            self.types.join(","),
            self.partition.as_deref().unwrap_or("*"),
            self.namespace.as_deref().unwrap_or("*"),
            if self.name_prefix.is_empty() {
                String::new()
            } else {
                format!(" {}*", self.name_prefix)
            }
        )
    }

    fn matches(&self, gvk: &str, partition: &str, namespace: &str, name: &str) -> bool {
        self.types.iter().any(|glob| glob_matches(glob, gvk))
            && self.partition.as_deref().is_none_or(|p| p == partition)
            && self.namespace.as_deref().is_none_or(|n| n == namespace)
            && name.starts_with(&self.name_prefix)
    }
}

/// A rule's type ownership (`schema`): it applies to the rule's types only.
#[derive(Debug, Clone)]
struct SchemaRule {
    types: Vec<String>,
    access: Access,
}

impl SchemaRule {
    fn matches(&self, gvk: &str) -> bool {
        self.types.iter().any(|glob| glob_matches(glob, gvk))
    }
}

/// What [`held`] asks of a rule: its access, and how the resources it matches relate to
/// another rule's.
trait Scoped {
    fn access(&self) -> Access;
    /// Whether every resource `other` matches, this matches too.
    fn contains(&self, other: &Self) -> bool;
    /// Whether some resource may match both (conservative).
    fn may_overlap(&self, other: &Self) -> bool;
}

impl Scoped for Rule {
    fn access(&self) -> Access {
        self.access
    }
    fn contains(&self, other: &Rule) -> bool {
        Rule::contains(self, other)
    }
    fn may_overlap(&self, other: &Rule) -> bool {
        Rule::may_overlap(self, other)
    }
}

impl Scoped for SchemaRule {
    fn access(&self) -> Access {
        self.access
    }
    fn contains(&self, other: &SchemaRule) -> bool {
        types_contain(&self.types, &other.types)
    }
    fn may_overlap(&self, other: &SchemaRule) -> bool {
        types_may_overlap(&self.types, &other.types)
    }
}

/// Whether rules `mine` hold `wanted`: none of them granting less may match what it matches,
/// and either `default_suffices` or one of them covers all of it with enough.
fn held<'a, R: Scoped + 'a>(
    mine: impl Iterator<Item = &'a R> + Clone,
    wanted: &R,
    default_suffices: bool,
) -> bool {
    if mine
        .clone()
        .any(|rule| rule.access() < wanted.access() && rule.may_overlap(wanted))
    {
        return false;
    }
    default_suffices
        || mine
            .into_iter()
            .any(|rule| rule.access() >= wanted.access() && rule.contains(wanted))
}

/// Whether every type glob of `theirs` falls inside one of `mine`.
fn types_contain(mine: &[String], theirs: &[String]) -> bool {
    theirs
        .iter()
        .all(|theirs| mine.iter().any(|mine| glob_contains(mine, theirs)))
}

/// Whether some type may match a glob of each.
fn types_may_overlap(mine: &[String], theirs: &[String]) -> bool {
    mine.iter()
        .any(|mine| theirs.iter().any(|theirs| globs_may_overlap(mine, theirs)))
}

/// A policy, compiled.
#[derive(Debug, Clone)]
pub(crate) struct CompiledPolicy {
    rules: Vec<Rule>,
    schema: Vec<SchemaRule>,
    operator: Option<Access>,
    acl: Option<Access>,
    join: bool,
}

impl CompiledPolicy {
    /// Compiles a stored policy. Stored policies were checked on write; anything that still
    /// does not parse grants nothing.
    pub(crate) fn new(policy: &pb::Policy) -> CompiledPolicy {
        let pattern = |value: &str| (!value.is_empty() && value != "*").then(|| value.to_owned());
        CompiledPolicy {
            rules: policy
                .rules
                .iter()
                .filter_map(|rule| {
                    Some(Rule {
                        types: rule.types.clone(),
                        partition: pattern(&rule.partition),
                        namespace: pattern(&rule.namespace),
                        name_prefix: rule.name_prefix.clone(),
                        access: access_of(rule.access).ok().flatten()?,
                    })
                })
                .collect(),
            schema: policy
                .rules
                .iter()
                .filter_map(|rule| {
                    Some(SchemaRule {
                        types: rule.types.clone(),
                        access: access_of(rule.schema).ok().flatten()?,
                    })
                })
                .collect(),
            operator: access_of(policy.operator).ok().flatten(),
            acl: access_of(policy.acl).ok().flatten(),
            join: policy.join,
        }
    }
}

/// What a set of policies grants, falling back to `default` where no rule speaks.
#[derive(Debug, Clone)]
pub(crate) struct Grants {
    management: bool,
    policies: Vec<std::sync::Arc<CompiledPolicy>>,
    default: Access,
    /// The policies' names, in the same order (for explaining a decision).
    names: Vec<String>,
}

impl Grants {
    pub(crate) fn new(
        management: bool,
        policies: Vec<std::sync::Arc<CompiledPolicy>>,
        default: Access,
    ) -> Grants {
        Grants {
            management,
            policies,
            default,
            names: Vec::new(),
        }
    }

    /// These grants with their policies' names (in the order they were given).
    pub(crate) fn named(self, names: Vec<String>) -> Grants {
        Grants { names, ..self }
    }

    /// What decides access to `id`, in words: the rule (its policy and what it matches), the
    /// management policy, or the default.
    pub(crate) fn explain(&self, id: &Id) -> String {
        if self.management {
            return format!("the token holds the {MANAGEMENT_POLICY} policy: everything");
        }
        let gvk = id
            .r#type
            .as_ref()
            .map(crate::resource::gvk)
            .unwrap_or_default();
        let tenancy = id.tenancy.clone().unwrap_or_default();
        let name_of = |index: usize| {
            self.names
                .get(index)
                .cloned()
                .unwrap_or_else(|| format!("#{index}"))
        };
        let mut deciding: Option<(usize, usize, &Rule)> = None;
        for (p, policy) in self.policies.iter().enumerate() {
            for (r, rule) in policy.rules.iter().enumerate() {
                if !rule.matches(&gvk, &tenancy.partition, &tenancy.namespace, &id.name) {
                    continue;
                }
                let better = match deciding {
                    None => true,
                    Some((_, _, best)) => {
                        best.access != Access::Deny
                            && (rule.access == Access::Deny || rule.access > best.access)
                    }
                };
                if better {
                    deciding = Some((p, r, rule));
                }
            }
        }
        match deciding {
            Some((p, r, rule)) => format!(
                "policy {} rule {} (types {}{}{}{}) {} {}",
                name_of(p),
                r,
                rule.types.join(", "),
                rule.partition
                    .as_deref()
                    .map(|p| format!(", partition {p}"))
                    .unwrap_or_default(),
                rule.namespace
                    .as_deref()
                    .map(|n| format!(", namespace {n}"))
                    .unwrap_or_default(),
                if rule.name_prefix.is_empty() {
                    String::new()
                } else {
                    format!(", names starting {:?}", rule.name_prefix)
                },
                if rule.access == Access::Deny {
                    "denies"
                } else {
                    "grants"
                },
                if rule.access == Access::Deny {
                    String::new()
                } else {
                    crate::acl::access_name(rule.access).to_owned()
                }
            )
            .trim_end()
            .to_owned(),
            None => format!(
                "no rule of its policies ({}) matches {gvk}: the default policy gives {}",
                if self.names.is_empty() {
                    "none".to_owned()
                } else {
                    self.names.join(", ")
                },
                crate::acl::access_name(self.default)
            ),
        }
    }

    pub(crate) fn operator(&self) -> Access {
        if self.management {
            return Access::Write;
        }
        combine(self.policies.iter().filter_map(|p| p.operator)).unwrap_or(self.default)
    }

    /// ACL management: only what a policy grants (never the default).
    pub(crate) fn acl(&self) -> Access {
        if self.management {
            return Access::Write;
        }
        combine(self.policies.iter().filter_map(|p| p.acl)).unwrap_or(Access::Deny)
    }

    /// Type ownership of `gvk` (DESIGN §12.3): only what a policy grants (never the default).
    pub(crate) fn schema(&self, gvk: &str) -> Access {
        if self.management {
            return Access::Write;
        }
        combine(
            self.policies
                .iter()
                .flat_map(|p| p.schema.iter())
                .filter(|rule| rule.matches(gvk))
                .map(|rule| rule.access),
        )
        .unwrap_or(Access::Deny)
    }

    /// Whether every type the glob `types` matches is owned here (`schema` write), with no
    /// narrower rule denying or lessening one of them: what policing them needs (DESIGN §17).
    pub(crate) fn owns_types(&self, types: &str) -> bool {
        self.management
            || self.holds_schema(&SchemaRule {
                types: vec![types.to_owned()],
                access: Access::Write,
            })
    }

    /// Whether every type `wanted` matches is owned here at least as `wanted` grants: no rule
    /// of mine granting less may match one of them, and one rule of mine covers them all.
    fn holds_schema(&self, wanted: &SchemaRule) -> bool {
        // Never from the default policy.
        held(
            self.policies.iter().flat_map(|policy| policy.schema.iter()),
            wanted,
            false,
        )
    }

    /// Whether a node may join with this token: a policy says so (never the default).
    pub(crate) fn may_join(&self) -> bool {
        self.management || self.policies.iter().any(|p| p.join)
    }

    /// Whether some resource of `gvk` in `partition`/`namespace` under `name_prefix` may be
    /// listed: not when a DENY covers them all, nor when the default denies and no rule that
    /// grants at least List may match one of them.
    pub(crate) fn may_read_some(
        &self,
        gvk: &str,
        partition: &str,
        namespace: &str,
        name_prefix: &str,
    ) -> bool {
        if self.management {
            return true;
        }
        let watched = Rule {
            types: vec![gvk.to_owned()],
            partition: Some(partition.to_owned()),
            namespace: Some(namespace.to_owned()),
            name_prefix: name_prefix.to_owned(),
            access: Access::List,
        };
        let mut rules = self.policies.iter().flat_map(|policy| policy.rules.iter());
        if rules
            .clone()
            .any(|rule| rule.access == Access::Deny && rule.contains(&watched))
        {
            return false;
        }
        self.default >= Access::List
            || rules.any(|rule| rule.access >= Access::List && rule.may_overlap(&watched))
    }

    /// Whether these are the management policy's grants (everything).
    pub(crate) fn is_management(&self) -> bool {
        self.management
    }

    /// `Ok` when everything `granted` grants (its rules, operator level, ACL management and
    /// joining) these grants hold too — so a token holding these may hand `granted` to a token
    /// or a policy without gaining anything; else what they lack, for people.
    ///
    /// Conservative: a rule is held when no rule here that may match the same resources grants
    /// less (a DENY included), and either the default grants enough or one rule here covers
    /// every resource it matches with enough. Two type globs with wildcards are taken to
    /// overlap; a rule covered only by several rules together is not held.
    pub(crate) fn holds(&self, granted: &Granted) -> Result<(), String> {
        if self.management {
            return Ok(());
        }
        if granted.management {
            return Err(format!(
                "only a {MANAGEMENT_POLICY} token grants {MANAGEMENT_POLICY}"
            ));
        }
        let mut lacks = Vec::new();
        // Where nothing the granted policies say speaks, the default does: for the holder too,
        // unless one of its own rules grants less than the default there.
        let theirs = || granted.policies.iter().flat_map(|(_, p)| p.rules.iter());
        if self.default > Access::Deny {
            for rule in self.policies.iter().flat_map(|policy| policy.rules.iter()) {
                if rule.access < self.default && !theirs().any(|other| other.contains(rule)) {
                    lacks.push(format!(
                        "a limit: the default policy grants {} where this token has {} ({}), so what it grants must limit that too",
                        super::access_name(self.default),
                        super::access_name(rule.access),
                        rule.describe()
                    ));
                }
            }
            let operator_set = granted.policies.iter().any(|(_, p)| p.operator.is_some());
            if !operator_set && self.operator() < self.default {
                lacks.push(format!(
                    "operator {} (the default policy's, where the granted policies set no operator access)",
                    super::access_name(self.default)
                ));
            }
        }
        for (name, policy) in &granted.policies {
            if let Some(access) = policy.operator
                && access > Access::Deny
                && self.operator() < access
            {
                lacks.push(format!(
                    "operator {} (policy {name})",
                    super::access_name(access)
                ));
            }
            if let Some(access) = policy.acl
                && access > Access::Deny
                && self.acl() < access
            {
                lacks.push(format!(
                    "acl {} (policy {name})",
                    super::access_name(access)
                ));
            }
            if policy.join && !self.may_join() {
                lacks.push(format!("join (policy {name})"));
            }
            for rule in &policy.schema {
                if rule.access > Access::Deny && !self.holds_schema(rule) {
                    lacks.push(format!(
                        "schema {} on {} (policy {name})",
                        super::access_name(rule.access),
                        rule.types.join(",")
                    ));
                }
            }
            for (index, rule) in policy.rules.iter().enumerate() {
                if rule.access > Access::Deny && !self.holds_rule(rule) {
                    lacks.push(format!(
                        "{} on {} (rule {index} of policy {name})",
                        super::access_name(rule.access),
                        rule.describe()
                    ));
                }
            }
        }
        if lacks.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "token cannot grant what it does not hold: {}",
                lacks.join(", ")
            ))
        }
    }

    fn holds_rule(&self, wanted: &Rule) -> bool {
        held(
            self.policies.iter().flat_map(|policy| policy.rules.iter()),
            wanted,
            self.default >= wanted.access,
        )
    }

    /// Whether every resource is readable whatever its id: the management policy, or a default
    /// of at least READ with no rule granting less (a DENY wins wherever it matches, and what
    /// no rule speaks for gets the default).
    pub(crate) fn reads_everything(&self) -> bool {
        self.management
            || (self.default >= Access::Read
                && self
                    .policies
                    .iter()
                    .all(|policy| policy.rules.iter().all(|rule| rule.access >= Access::Read)))
    }

    pub(crate) fn resource(&self, id: &Id) -> Access {
        if self.management {
            return Access::Write;
        }
        let gvk = id
            .r#type
            .as_ref()
            .map(crate::resource::gvk)
            .unwrap_or_default();
        let tenancy = id.tenancy.clone().unwrap_or_default();
        combine(self.policies.iter().flat_map(|policy| {
            policy
                .rules
                .iter()
                .filter(|rule| rule.matches(&gvk, &tenancy.partition, &tenancy.namespace, &id.name))
                .map(|rule| rule.access)
        }))
        .unwrap_or(self.default)
    }
}

/// Whether every type `inner` matches, `outer` matches too. `*` is the only wildcard and no
/// literal part holds one, so `outer` matching `inner`'s text (its `*`s as characters) means
/// each of `inner`'s wildcards falls inside one of `outer`'s.
fn glob_contains(outer: &str, inner: &str) -> bool {
    glob_matches(outer, inner)
}

/// Whether some type may match both globs. Two globs with wildcards overlap unless their
/// literal starts or ends differ (`demo.*.*` and `acl.*.*` do not).
fn globs_may_overlap(a: &str, b: &str) -> bool {
    let compatible = |x: &str, y: &str, at_start: bool| {
        if at_start {
            x.starts_with(y) || y.starts_with(x)
        } else {
            x.ends_with(y) || y.ends_with(x)
        }
    };
    match (a.contains('*'), b.contains('*')) {
        (false, false) => a == b,
        (true, false) => glob_matches(a, b),
        (false, true) => glob_matches(b, a),
        (true, true) => {
            let start = |glob: &str| glob.split('*').next().unwrap_or_default().to_owned();
            let end = |glob: &str| glob.rsplit('*').next().unwrap_or_default().to_owned();
            compatible(&start(a), &start(b), true) && compatible(&end(a), &end(b), false)
        }
    }
}

/// DENY wins; otherwise the highest; `None` when nothing speaks.
fn combine(accesses: impl Iterator<Item = Access>) -> Option<Access> {
    let mut best: Option<Access> = None;
    for access in accesses {
        if access == Access::Deny {
            return Some(Access::Deny);
        }
        best = Some(best.map_or(access, |b| b.max(access)));
    }
    best
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn rule(
        types: &[&str],
        partition: &str,
        namespace: &str,
        prefix: &str,
        access: pb::Access,
    ) -> pb::Rule {
        pb::Rule {
            types: types.iter().map(|t| t.to_string()).collect(),
            partition: partition.into(),
            namespace: namespace.into(),
            name_prefix: prefix.into(),
            access: access as i32,
            schema: 0,
        }
    }

    /// Owning a glob of types means owning every type it matches: a narrower schema DENY
    /// under a broad grant takes the broad glob away (a policy over it would cover the denied
    /// type), not what stays clear of it.
    #[test]
    fn owning_types_leaves_no_narrower_rule_out() {
        let schema = |types: &str, access: pb::Access| pb::Rule {
            types: vec![types.into()],
            access: 0,
            schema: access as i32,
            ..Default::default()
        };
        let policy = CompiledPolicy::new(&pb::Policy {
            rules: vec![
                schema("demo.*.*", pb::Access::Write),
                schema("demo.v1.Payroll", pb::Access::Deny),
            ],
            ..Default::default()
        });
        let grants = Grants::new(false, vec![std::sync::Arc::new(policy)], Access::Deny);
        assert_eq!(
            grants.schema("demo.*.*"),
            Access::Write,
            "the literal check passes"
        );
        assert!(
            !grants.owns_types("demo.*.*"),
            "but the glob covers the denied type"
        );
        assert!(grants.owns_types("demo.v2.*"));
        assert!(!grants.owns_types("other.*.*"));
    }

    fn id(gvk: &str, partition: &str, namespace: &str, name: &str) -> Id {
        let parts: Vec<&str> = gvk.split('.').collect();
        Id {
            uid: String::new(),
            name: name.into(),
            r#type: Some(crate::resource::new_type(parts[0], parts[1], parts[2])),
            tenancy: Some(proto::resource::v1::Tenancy {
                partition: partition.into(),
                namespace: namespace.into(),
            }),
        }
    }

    #[test]
    fn globs_match_whole_type_names() {
        assert!(glob_matches("*", "demo.v2.Artist"));
        assert!(glob_matches("demo.*.*", "demo.v2.Artist"));
        assert!(glob_matches("demo.v2.Artist", "demo.v2.Artist"));
        assert!(glob_matches("*.Artist", "demo.v2.Artist"));
        assert!(!glob_matches("demo.v1.*", "demo.v2.Artist"));
        assert!(!glob_matches("demo.v2.Art", "demo.v2.Artist"));
        assert!(!glob_matches("tenancy.*.*", "demo.v2.Artist"));
    }

    #[test]
    fn deny_wins_then_the_highest_then_the_default() {
        let policy = CompiledPolicy::new(&pb::Policy {
            description: String::new(),
            acl: 0,
            join: false,
            rules: vec![
                rule(&["demo.*.*"], "default", "*", "", pb::Access::Read),
                rule(
                    &["demo.v2.Artist"],
                    "default",
                    "jazz",
                    "",
                    pb::Access::Write,
                ),
                rule(&["demo.v2.Artist"], "*", "*", "secret-", pb::Access::Deny),
            ],
            operator: pb::Access::Read as i32,
        });
        let grants = Grants::new(false, vec![std::sync::Arc::new(policy)], Access::Deny);
        let artist = |ns: &str, name: &str| id("demo.v2.Artist", "default", ns, name);
        assert_eq!(grants.resource(&artist("jazz", "miles")), Access::Write);
        assert_eq!(grants.resource(&artist("rock", "ringo")), Access::Read);
        assert_eq!(
            grants.resource(&artist("jazz", "secret-agent")),
            Access::Deny
        );
        assert_eq!(
            grants.resource(&id("tenancy.v1.Namespace", "default", "", "jazz")),
            Access::Deny
        );
        assert_eq!(grants.operator(), Access::Read);
        assert!(!grants.reads_everything());
        let allow = Grants::new(false, Vec::new(), Access::Write);
        assert_eq!(allow.resource(&artist("jazz", "x")), Access::Write);
        assert!(allow.reads_everything());
        assert!(Grants::new(true, Vec::new(), Access::Deny).reads_everything());
        assert!(!Grants::new(false, Vec::new(), Access::List).reads_everything());
        // A default that allows, with one rule that denies somewhere: not everything.
        let allow_but = Grants::new(
            false,
            vec![std::sync::Arc::new(CompiledPolicy::new(&pb::Policy {
                acl: 0,
                join: false,
                description: String::new(),
                rules: vec![rule(
                    &["demo.v2.Artist"],
                    "*",
                    "*",
                    "secret-",
                    pb::Access::Deny,
                )],
                operator: pb::Access::Read as i32,
            }))],
            Access::Write,
        );
        assert!(!allow_but.reads_everything());
        assert_eq!(
            allow_but.resource(&artist("jazz", "secret-x")),
            Access::Deny
        );
        assert_eq!(
            Grants::new(true, Vec::new(), Access::Deny).operator(),
            Access::Write
        );
    }

    #[test]
    fn malformed_policies_and_tokens_name_their_fields() {
        let bad = pb::Policy {
            acl: pb::Access::List as i32,
            join: false,
            description: String::new(),
            rules: vec![
                rule(&["demo..x"], "Bad_Name", "*", "", pb::Access::Read),
                pb::Rule {
                    access: 42,
                    ..rule(&["*"], "", "", "", pb::Access::Read)
                },
                rule(&[], "", "", "", pb::Access::Unspecified),
            ],
            operator: 9,
        };
        let error = check_policy(&bad).expect_err("malformed");
        for needle in [
            "data.operator: unknown access 9",
            "data.acl: ACCESS_LIST means nothing",
            "data.rules[0].types[0]",
            "data.rules[0].partition",
            "data.rules[1].access: unknown access 42",
            "data.rules[2].types is empty",
            "data.rules[2].access is required",
        ] {
            assert!(error.contains(needle), "{needle} in {error}");
        }

        let mut token = pb::Token {
            policies: vec!["readers".into()],
            secret: "short".into(),
            ..Default::default()
        };
        assert!(
            hash_token_secret(&mut token)
                .expect_err("short")
                .contains("data.secret")
        );
        token.secret = "a-long-enough-secret-value".into();
        hash_token_secret(&mut token).expect("hashed");
        assert!(token.secret.is_empty() && is_secret_hash(&token.secret_hash));
        check_token(&token).expect("valid");
        token.expires_at = "2001-01-01T00:00:00Z".into();
        assert!(
            check_token(&token)
                .expect_err("past")
                .contains("in the past")
        );
        token.expires_at = "tomorrow".into();
        assert!(
            check_token(&token)
                .expect_err("garbage")
                .contains("RFC 3339")
        );
        token.expires_at.clear();
        token.secret_hash.clear();
        assert!(
            check_token(&token)
                .expect_err("no secret")
                .contains("data.secret is required")
        );
    }

    /// A small deterministic generator (xorshift): the property below runs over the same
    /// thousands of cases every time.
    pub(crate) struct Gen(pub(crate) u64);

    impl Gen {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        pub(crate) fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
            &items[(self.next() % items.len() as u64) as usize]
        }
    }

    const TYPES: [&str; 7] = [
        "*",
        "demo.*.*",
        "demo.v2.*",
        "demo.v2.Artist",
        "*.Artist",
        "acl.*.*",
        "demo.v1.Album",
    ];
    const ACCESSES: [pb::Access; 5] = [
        pb::Access::Unspecified,
        pb::Access::Deny,
        pb::Access::List,
        pb::Access::Read,
        pb::Access::Write,
    ];

    pub(crate) fn random_policy(g: &mut Gen) -> pb::Policy {
        let rules = (0..g.next() % 4)
            .map(|_| {
                let types = (0..1 + g.next() % 2)
                    .map(|_| g.pick(&TYPES).to_string())
                    .collect();
                pb::Rule {
                    types,
                    partition: g.pick(&["", "*", "default", "p2"]).to_string(),
                    namespace: g.pick(&["", "*", "jazz", "rock"]).to_string(),
                    name_prefix: g.pick(&["", "", "secret-", "m"]).to_string(),
                    access: *g.pick(&ACCESSES[1..]) as i32,
                    schema: *g.pick(&[
                        pb::Access::Unspecified,
                        pb::Access::Unspecified,
                        pb::Access::Deny,
                        pb::Access::Read,
                        pb::Access::Write,
                    ]) as i32,
                }
            })
            .collect();
        pb::Policy {
            description: String::new(),
            rules,
            operator: *g.pick(&ACCESSES) as i32,
            acl: *g.pick(&[
                pb::Access::Unspecified,
                pb::Access::Deny,
                pb::Access::Read,
                pb::Access::Write,
            ]) as i32,
            join: g.next().is_multiple_of(4),
        }
    }

    /// Every type the generated rules can tell apart.
    const SCHEMA_TYPES: [&str; 6] = [
        "demo.v2.Artist",
        "demo.v1.Artist",
        "demo.v2.Album",
        "demo.v1.Album",
        "acl.v1.Token",
        "other.v1.Thing",
    ];

    /// Every resource the generated rules can tell apart.
    pub(crate) fn universe() -> Vec<Id> {
        let mut ids = Vec::new();
        for gvk in [
            "demo.v2.Artist",
            "demo.v1.Artist",
            "demo.v2.Album",
            "demo.v1.Album",
            "acl.v1.Token",
            "other.v1.Thing",
        ] {
            for partition in ["default", "p2"] {
                for namespace in ["jazz", "rock"] {
                    for name in ["miles", "secret-x", "other"] {
                        ids.push(id(gvk, partition, namespace, name));
                    }
                }
            }
        }
        ids
    }

    /// No escalation, as a property: whenever a writer may grant a set of policies (to a token
    /// it writes, or as a policy it writes), a token holding them gets no access the writer
    /// lacks — on any resource, to cluster operations, to ACL management, or to joining — under
    /// either default policy.
    #[test]
    fn nothing_a_writer_may_grant_exceeds_what_it_holds() {
        let mut g = Gen(0x9e37_79b9_7f4a_7c15);
        let ids = universe();
        let mut allowed = 0;
        for case in 0..4000 {
            let default = if case % 2 == 0 {
                Access::Deny
            } else {
                Access::Write
            };
            let writer_policies: Vec<std::sync::Arc<CompiledPolicy>> = (0..1 + g.next() % 2)
                .map(|_| std::sync::Arc::new(CompiledPolicy::new(&random_policy(&mut g))))
                .collect();
            let writer = Grants::new(false, writer_policies, default);
            let granted: Vec<(String, std::sync::Arc<CompiledPolicy>)> = (0..1 + g.next() % 2)
                .map(|n| {
                    (
                        format!("p{n}"),
                        std::sync::Arc::new(CompiledPolicy::new(&random_policy(&mut g))),
                    )
                })
                .collect();
            let verdict = writer.holds(&Granted {
                management: false,
                policies: granted.clone(),
            });
            let token = Grants::new(
                false,
                granted.iter().map(|(_, p)| p.clone()).collect(),
                default,
            );
            let Ok(()) = verdict else { continue };
            allowed += 1;
            for id in &ids {
                assert!(
                    token.resource(id) <= writer.resource(id),
                    "case {case}: {id:?}: the token gets {:?}, its writer holds {:?}",
                    token.resource(id),
                    writer.resource(id)
                );
            }
            assert!(
                token.operator() <= writer.operator(),
                "case {case}: operator"
            );
            assert!(token.acl() <= writer.acl(), "case {case}: acl");
            assert!(!token.may_join() || writer.may_join(), "case {case}: join");
            for gvk in SCHEMA_TYPES {
                assert!(
                    token.schema(gvk) <= writer.schema(gvk),
                    "case {case}: schema of {gvk}: the token gets {:?}, its writer holds {:?}",
                    token.schema(gvk),
                    writer.schema(gvk)
                );
            }
        }
        // The property is not vacuous: many grants were allowed (and so checked).
        assert!(allowed > 200, "only {allowed} of 4000 grants were allowed");
        // Nobody but management grants management.
        let writer = Grants::new(false, Vec::new(), Access::Write);
        assert!(
            writer
                .holds(&Granted {
                    management: true,
                    policies: Vec::new()
                })
                .is_err()
        );
        assert!(
            Grants::new(true, Vec::new(), Access::Deny)
                .holds(&Granted {
                    management: true,
                    policies: Vec::new()
                })
                .is_ok()
        );
    }

    #[test]
    fn a_writer_may_grant_within_what_it_holds_and_is_told_what_it_lacks() {
        let editor = CompiledPolicy::new(&pb::Policy {
            rules: vec![
                rule(&["demo.*.*"], "default", "jazz", "", pb::Access::Write),
                rule(&["demo.v2.Artist"], "*", "*", "secret-", pb::Access::Deny),
            ],
            acl: pb::Access::Write as i32,
            ..Default::default()
        });
        let writer = Grants::new(false, vec![std::sync::Arc::new(editor)], Access::Deny);
        let grant = |rules: Vec<pb::Rule>| Granted {
            management: false,
            policies: vec![(
                "new".into(),
                std::sync::Arc::new(CompiledPolicy::new(&pb::Policy {
                    rules,
                    ..Default::default()
                })),
            )],
        };
        // Within: the Album type of the jazz namespace.
        writer
            .holds(&grant(vec![rule(
                &["demo.v2.Album"],
                "default",
                "jazz",
                "",
                pb::Access::Read,
            )]))
            .expect("within");
        // Past a DENY the writer has.
        let why = writer
            .holds(&grant(vec![rule(
                &["demo.v2.Artist"],
                "default",
                "jazz",
                "",
                pb::Access::Read,
            )]))
            .expect_err("overlaps a deny");
        assert!(why.contains("read on demo.v2.Artist default/jazz"), "{why}");
        // Beyond its namespace, and operator access it lacks.
        let mut wider = grant(vec![rule(&["demo.*.*"], "*", "*", "", pb::Access::Write)]);
        wider.policies.push((
            "ops".into(),
            std::sync::Arc::new(CompiledPolicy::new(&pb::Policy {
                operator: pb::Access::Write as i32,
                ..Default::default()
            })),
        ));
        let why = writer.holds(&wider).expect_err("wider");
        assert!(
            why.contains("write on demo.*.* */*") && why.contains("operator write"),
            "{why}"
        );
    }

    #[test]
    fn a_watch_may_go_on_while_something_it_names_may_be_read() {
        let some = Grants::new(
            false,
            vec![std::sync::Arc::new(CompiledPolicy::new(&pb::Policy {
                rules: vec![rule(
                    &["demo.v2.Artist"],
                    "default",
                    "jazz",
                    "miles-",
                    pb::Access::Read,
                )],
                ..Default::default()
            }))],
            Access::Deny,
        );
        assert!(some.may_read_some("demo.v2.Artist", "default", "jazz", ""));
        assert!(some.may_read_some("demo.v2.Artist", "default", "jazz", "miles-d"));
        assert!(!some.may_read_some("demo.v2.Artist", "default", "jazz", "john"));
        assert!(!some.may_read_some("demo.v2.Artist", "default", "rock", ""));
        let denied = Grants::new(
            false,
            vec![std::sync::Arc::new(CompiledPolicy::new(&pb::Policy {
                rules: vec![rule(&["demo.*.*"], "default", "*", "", pb::Access::Deny)],
                ..Default::default()
            }))],
            Access::Write,
        );
        assert!(!denied.may_read_some("demo.v2.Artist", "default", "jazz", ""));
        assert!(denied.may_read_some("demo.v2.Artist", "other", "jazz", ""));
        assert!(!Grants::new(false, Vec::new(), Access::Deny).may_read_some(
            "demo.v2.Artist",
            "default",
            "jazz",
            ""
        ));
    }
}
