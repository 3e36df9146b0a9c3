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
pub const MANAGEMENT_POLICY: &str = "global-management";

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
pub fn glob_matches(glob: &str, text: &str) -> bool {
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
pub fn check_policy(policy: &pb::Policy) -> Result<(), String> {
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
        match access_of(rule.access) {
            Err(why) => problems.push(format!("{field}.access: {why}")),
            Ok(None) => problems.push(format!(
                "{field}.access is required (ACCESS_DENY, ACCESS_LIST, ACCESS_READ or ACCESS_WRITE)"
            )),
            Ok(Some(_)) => {}
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// Parses an RFC 3339 expiry into seconds since the epoch.
pub fn parse_expiry(value: &str) -> Result<i64, String> {
    time::OffsetDateTime::parse(value, &time::format_description::well_known::Rfc3339)
        .map(|at| at.unix_timestamp())
        .map_err(|error| format!("{value:?} is not an RFC 3339 time ({error})"))
}

fn now_seconds() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// Checks a token a client writes (after its secret was hashed); every problem names its field.
/// Whether the named policies exist is checked by the service, which can read them.
pub fn check_token(token: &pb::Token) -> Result<(), String> {
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

/// `sha256:` and 64 lowercase hex digits.
pub fn is_secret_hash(value: &str) -> bool {
    value.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The stored form of a secret.
pub fn hash_secret(secret: &str) -> String {
    use sha2::Digest;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = sha2::Sha256::digest(secret.as_bytes());
    let mut hex = String::with_capacity(64 + 7);
    hex.push_str("sha256:");
    for byte in digest {
        hex.push(char::from(HEX[usize::from(byte >> 4)]));
        hex.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    hex
}

/// Shortest secret a writer may choose.
pub const MIN_SECRET_LEN: usize = 16;
/// Longest secret (and the longest token header the server hashes).
pub const MAX_SECRET_LEN: usize = 512;

/// The mutate step of `acl.v1.Token`: a secret given in the clear is replaced by its hash.
pub fn hash_token_secret(token: &mut pb::Token) -> Result<(), String> {
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
    token.secret_hash = hash_secret(&token.secret);
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

impl Rule {
    fn matches(&self, gvk: &str, partition: &str, namespace: &str, name: &str) -> bool {
        self.types.iter().any(|glob| glob_matches(glob, gvk))
            && self.partition.as_deref().is_none_or(|p| p == partition)
            && self.namespace.as_deref().is_none_or(|n| n == namespace)
            && name.starts_with(&self.name_prefix)
    }
}

/// A policy, compiled.
#[derive(Debug, Clone)]
pub struct CompiledPolicy {
    rules: Vec<Rule>,
    operator: Option<Access>,
}

impl CompiledPolicy {
    /// Compiles a stored policy. Stored policies were checked on write; anything that still
    /// does not parse grants nothing.
    pub fn new(policy: &pb::Policy) -> CompiledPolicy {
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
            operator: access_of(policy.operator).ok().flatten(),
        }
    }
}

/// What a set of policies grants, falling back to `default` where no rule speaks.
#[derive(Debug, Clone)]
pub struct Grants {
    management: bool,
    policies: Vec<std::sync::Arc<CompiledPolicy>>,
    default: Access,
}

impl Grants {
    pub fn new(
        management: bool,
        policies: Vec<std::sync::Arc<CompiledPolicy>>,
        default: Access,
    ) -> Grants {
        Grants {
            management,
            policies,
            default,
        }
    }

    pub fn operator(&self) -> Access {
        if self.management {
            return Access::Write;
        }
        combine(self.policies.iter().filter_map(|p| p.operator)).unwrap_or(self.default)
    }

    /// Whether every resource is readable whatever its id: the management policy, or a default
    /// of at least READ with no rule granting less (a DENY wins wherever it matches, and what
    /// no rule speaks for gets the default).
    pub fn reads_everything(&self) -> bool {
        self.management
            || (self.default >= Access::Read
                && self
                    .policies
                    .iter()
                    .all(|policy| policy.rules.iter().all(|rule| rule.access >= Access::Read)))
    }

    pub fn resource(&self, id: &Id) -> Access {
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
mod tests {
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
        }
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
    fn a_secret_hashes_to_its_sha256_in_hex() {
        assert_eq!(
            hash_secret("abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
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
}
