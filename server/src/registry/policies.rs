//! Admission policies (DESIGN §17): a platform team's CEL checks over the objects of types it
//! does not own. `PolicyStore` is what a node decides from — a projection of the stored
//! `policy.v1.AdmissionPolicy` resources, changed only in apply (`service::projections`) and
//! fenced like the registry (`storage::Domain::Policies`) — and `compile` is the one check of a
//! policy, run when it is written and when it is installed.

use std::sync::{Arc, RwLock};

use proto::policy::v1 as pb;
use proto::resource::v1::{Id, Resource};

use super::cel::{self, EvalError, Meter, Program, Value};
use crate::acl::rules::glob_matches;
use crate::resource::Version;

/// The type of admission policies.
pub(crate) const ADMISSION_POLICY: &str = "policy.v1.AdmissionPolicy";
/// What a validation's expression may name.
const VARIABLES: [&str; 4] = ["object", "old_object", "params", "request"];
/// Most validations a policy holds, and bytes of any text in it.
const MAX_VALIDATIONS: usize = 64;
const MAX_TEXT: usize = 4096;
/// Most type and namespace globs a match holds.
const MAX_GLOBS: usize = 64;

/// Whether no policy applies to objects of `group`/`kind`: the ACLs, the registry, the
/// policies themselves, quotas and the server's own records.
pub(crate) fn exempt(group: &str, kind: &str) -> bool {
    matches!(group, "acl" | "registry" | "policy" | "internal")
        || (group == "tenancy" && kind == "Quota")
}

/// What a write does to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    Create,
    Update,
    Delete,
}

impl Operation {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }

    fn of(operation: i32) -> Option<Operation> {
        match pb::Operation::try_from(operation).ok()? {
            pb::Operation::Create => Some(Operation::Create),
            pb::Operation::Update => Some(Operation::Update),
            pb::Operation::Delete => Some(Operation::Delete),
            pb::Operation::Unspecified => None,
        }
    }
}

/// What a policy does with an object its validations refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Deny,
    Warn,
    Audit,
}

#[derive(Debug)]
struct Validation {
    program: Program,
    message: String,
}

/// A stored policy, checked and ready to run.
#[derive(Debug)]
pub(crate) struct CompiledPolicy {
    pub name: String,
    pub action: Action,
    types: Vec<String>,
    namespaces: Vec<String>,
    selector: Option<proto::selector::Selector>,
    operations: Vec<Operation>,
    pub params: Option<Id>,
    validations: Vec<Validation>,
    /// Why a stored policy cannot run here (it did not compile): a DENY then refuses what it
    /// matches, a WARN or AUDIT lets it through.
    pub broken: Option<String>,
}

/// The checked parts of a policy, or everything wrong with it (`field: why`).
pub(crate) fn compile(
    name: &str,
    policy: &pb::AdmissionPolicy,
) -> Result<CompiledPolicy, Vec<(String, String)>> {
    let mut problems: Vec<(String, String)> = Vec::new();
    let mut problem =
        |field: &str, why: String| problems.push((format!("resource.data.{field}"), why));
    let action = match pb::Action::try_from(policy.action) {
        Ok(pb::Action::Deny) => Action::Deny,
        Ok(pb::Action::Warn) => Action::Warn,
        Ok(pb::Action::Audit) => Action::Audit,
        _ => {
            problem(
                "action",
                "action is required: ACTION_DENY, ACTION_WARN or ACTION_AUDIT".into(),
            );
            Action::Deny
        }
    };
    let matching = policy.r#match.clone().unwrap_or_default();
    if matching.types.len() > MAX_GLOBS || matching.namespaces.len() > MAX_GLOBS {
        problem(
            "match",
            format!("a match holds at most {MAX_GLOBS} types and {MAX_GLOBS} namespaces"),
        );
    }
    for (index, glob) in matching.types.iter().enumerate() {
        let parts: Vec<&str> = glob.split('.').collect();
        if parts.len() != 3 || parts.iter().any(|part| part.is_empty()) || glob.len() > 200 {
            problem(
                &format!("match.types[{index}]"),
                format!("{glob:?} is not a group.version.Kind glob (like demo.*.*, demo.v2.Album)"),
            );
            continue;
        }
        let literal_group = !parts[0].contains('*');
        if literal_group && exempt(parts[0], if parts[2].contains('*') { "" } else { parts[2] }) {
            problem(
                &format!("match.types[{index}]"),
                format!(
                    "{glob:?} names types no policy applies to (acl.*, registry.*, policy.*, internal.*, tenancy.v1.Quota)"
                ),
            );
        }
    }
    for (index, namespace) in matching.namespaces.iter().enumerate() {
        if namespace.is_empty() || namespace.len() > 200 {
            problem(
                &format!("match.namespaces[{index}]"),
                "a namespace name or glob is required".into(),
            );
        }
    }
    let selector = if matching.selector.trim().is_empty() {
        None
    } else {
        match proto::selector::Selector::parse(&matching.selector) {
            Ok(selector) => Some(selector),
            Err(error) => {
                problem(
                    "match.selector",
                    format!("the selector does not parse: {error}"),
                );
                None
            }
        }
    };
    let mut operations = Vec::new();
    for (index, operation) in matching.operations.iter().enumerate() {
        match Operation::of(*operation) {
            Some(op) => operations.push(op),
            None => problem(
                &format!("match.operations[{index}]"),
                "an operation is OPERATION_CREATE, OPERATION_UPDATE or OPERATION_DELETE".into(),
            ),
        }
    }
    if let Some(params) = &policy.params {
        let named = params.r#type.is_some() && !params.name.is_empty();
        if !named {
            problem(
                "params",
                "params names a resource: its type and name (and tenancy)".into(),
            );
        }
        // The platform's own records (tokens, Types, policies, quotas) are never params.
        if let Some(t) = &params.r#type
            && exempt(&t.group, &t.kind)
        {
            problem(
                "params.type",
                format!(
                    "{}.{}.{} cannot be a policy's params (acl, registry, policy, internal and quota records are not data for policies)",
                    t.group, t.group_version, t.kind
                ),
            );
        }
    }
    if policy.validations.is_empty() {
        problem("validations", "at least one validation is required".into());
    }
    if policy.validations.len() > MAX_VALIDATIONS {
        problem(
            "validations",
            format!("at most {MAX_VALIDATIONS} validations"),
        );
    }
    let mut validations = Vec::new();
    for (index, validation) in policy.validations.iter().enumerate().take(MAX_VALIDATIONS) {
        let at = format!("validations[{index}]");
        if validation.message.trim().is_empty() {
            problem(
                &format!("{at}.message"),
                "a message is required: what a refused writer reads".into(),
            );
        }
        if validation.expression.len() > MAX_TEXT || validation.message.len() > MAX_TEXT {
            problem(
                &at,
                format!("an expression or message is at most {MAX_TEXT} bytes"),
            );
            continue;
        }
        let expression = match cel::parse(&validation.expression) {
            Ok(expression) => expression,
            Err(why) => {
                problem(
                    &format!("{at}.expression"),
                    format!("{:?} does not compile: {why}", validation.expression),
                );
                continue;
            }
        };
        let nesting = super::dynamic::nesting_depth(&expression);
        if nesting > super::dynamic::MAX_RULE_DEPTH {
            problem(
                &format!("{at}.expression"),
                format!(
                    "nests {nesting} levels deep; at most {}",
                    super::dynamic::MAX_RULE_DEPTH
                ),
            );
            continue;
        }
        // A policy knows no schema (it may match any type): its validations are estimated over
        // any object as large as a resource may be, against a request's whole budget.
        match cel::prepare_over(expression, &VARIABLES) {
            Ok(program) if program.estimate > cel::REQUEST_BUDGET => problem(
                &format!("{at}.expression"),
                format!(
                    "{:?} may cost up to {} units on an object of {} bytes, over the budget of {} per request: a comprehension nested in another over the object's lists costs the product of their sizes",
                    validation.expression,
                    program.estimate,
                    cel::MAX_DATA_BYTES,
                    cel::REQUEST_BUDGET
                ),
            ),
            Ok(program) => validations.push(Validation {
                program,
                message: validation.message.clone(),
            }),
            Err(why) => problem(
                &format!("{at}.expression"),
                format!("{:?}: {why}", validation.expression),
            ),
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(CompiledPolicy {
        name: name.to_owned(),
        action,
        types: matching.types,
        namespaces: matching.namespaces,
        selector,
        operations,
        params: policy.params.clone(),
        validations,
        broken: None,
    })
}

impl CompiledPolicy {
    /// Whether it applies to `operation` on an object of `gvk` in `namespace` with `labels`.
    pub(crate) fn matches(
        &self,
        gvk: &str,
        namespace: &str,
        labels: &std::collections::BTreeMap<String, String>,
        operation: Operation,
    ) -> bool {
        (self.types.is_empty() || self.types.iter().any(|glob| glob_matches(glob, gvk)))
            && (self.namespaces.is_empty()
                || self
                    .namespaces
                    .iter()
                    .any(|glob| glob_matches(glob, namespace)))
            && (self.operations.is_empty() || self.operations.contains(&operation))
            && self.selector.as_ref().is_none_or(|s| s.matches(labels))
    }

    /// The worst case of its validations on data of at most `cel::SMALL_DATA_BYTES`.
    pub(crate) fn small_estimate(&self) -> u64 {
        self.validations
            .iter()
            .map(|v| v.program.small_estimate)
            .fold(0, u64::saturating_add)
    }

    /// Runs the validations over `variables` (`object`, `old_object`, `params`, `request`):
    /// the message of the first that does not hold, or `None`.
    pub(crate) fn validate(
        &self,
        variables: &[(Arc<String>, Value)],
        meter: &mut Meter,
    ) -> Result<Option<String>, EvalError> {
        for validation in &self.validations {
            let mut rule_meter = Meter::new(meter.left());
            let outcome =
                cel::Evaluator::new(&validation.program, variables.to_vec(), &mut rule_meter).run();
            meter.spend(rule_meter.used());
            match outcome? {
                Value::Bool(true) => {}
                Value::Bool(false) => return Ok(Some(validation.message.clone())),
                other => {
                    return Err(EvalError::Runtime(format!(
                        "a validation gave {} where true or false was expected",
                        other.type_name()
                    )));
                }
            }
        }
        Ok(None)
    }
}

/// Every stored policy as this node has applied them, at the revision of the last change.
#[derive(Debug, Default)]
pub(crate) struct PolicySet {
    pub revision: Version,
    pub policies: Vec<Arc<CompiledPolicy>>,
}

impl PolicySet {
    /// The policies that apply to `operation` on an object of `gvk` in `namespace` with `labels`.
    pub(crate) fn matching(
        &self,
        gvk: &str,
        namespace: &str,
        labels: &std::collections::BTreeMap<String, String>,
        operation: Operation,
    ) -> Vec<Arc<CompiledPolicy>> {
        self.policies
            .iter()
            .filter(|policy| policy.matches(gvk, namespace, labels, operation))
            .cloned()
            .collect()
    }
}

/// The projection of the stored policies (`service::projections::Policies`).
#[derive(Debug, Default)]
pub(crate) struct PolicyStore {
    state: RwLock<Arc<PolicySet>>,
}

fn installed(stored: &Resource) -> Option<Arc<CompiledPolicy>> {
    let name = stored.id.as_ref()?.name.clone();
    let data = stored.data.as_ref()?;
    let compiled = match prost::Message::decode(data.value.as_slice()) {
        Ok(policy) => {
            let policy: pb::AdmissionPolicy = policy;
            compile(&name, &policy).unwrap_or_else(|problems| broken(&name, &policy, &problems))
        }
        Err(error) => broken(
            &name,
            &pb::AdmissionPolicy {
                action: pb::Action::Deny as i32,
                ..Default::default()
            },
            &[("resource.data".into(), format!("does not decode: {error}"))],
        ),
    };
    Some(Arc::new(compiled))
}

/// A stored policy that does not compile here: it keeps its match and action, and runs nothing.
fn broken(
    name: &str,
    policy: &pb::AdmissionPolicy,
    problems: &[(String, String)],
) -> CompiledPolicy {
    let matching = policy.r#match.clone().unwrap_or_default();
    CompiledPolicy {
        name: name.to_owned(),
        action: match pb::Action::try_from(policy.action) {
            Ok(pb::Action::Warn) => Action::Warn,
            Ok(pb::Action::Audit) => Action::Audit,
            _ => Action::Deny,
        },
        types: matching.types,
        namespaces: matching.namespaces,
        selector: proto::selector::Selector::parse(&matching.selector).ok(),
        operations: matching
            .operations
            .iter()
            .filter_map(|o| Operation::of(*o))
            .collect(),
        params: None,
        validations: Vec::new(),
        broken: Some(
            problems
                .iter()
                .map(|(field, why)| format!("{field}: {why}"))
                .collect::<Vec<_>>()
                .join("; "),
        ),
    }
}

impl PolicyStore {
    pub(crate) fn current(&self) -> Arc<PolicySet> {
        self.state.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn replace(&self, change: impl FnOnce(&mut Vec<Arc<CompiledPolicy>>), revision: Version) {
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        let mut policies = state.policies.clone();
        change(&mut policies);
        policies.sort_by(|a, b| a.name.cmp(&b.name));
        *state = Arc::new(PolicySet { revision, policies });
    }

    /// A policy written (created or changed), at `version`.
    pub(crate) fn install(&self, stored: &Resource, version: Version) {
        let Some(policy) = installed(stored) else {
            return;
        };
        self.replace(
            |policies| {
                policies.retain(|p| p.name != policy.name);
                policies.push(policy);
            },
            version,
        );
    }

    /// A policy deleted, at `version`.
    pub(crate) fn uninstall(&self, name: &str, version: Version) {
        self.replace(|policies| policies.retain(|p| p.name != name), version);
    }

    /// Every stored policy, afresh (a snapshot installed, a restore), at `revision`.
    pub(crate) fn reset(&self, stored: &[Resource], revision: Version) {
        let fresh: Vec<_> = stored.iter().filter_map(installed).collect();
        self.replace(|policies| *policies = fresh, revision);
    }
}
