//! Admission policies at write time (DESIGN §17): after the type's own checks, every policy
//! that matches the write runs its validations over the object as resctl prints it, the object
//! before (`old_object`), the policy's `params` and the `request`. A DENY refuses
//! (ADMISSION_DENIED), a WARN adds a warning to the answer ([`collecting`]), an AUDIT records a
//! line (target `resd::audit`). The set of policies is the node's projection at one revision,
//! and the write is fenced on it: a policy changed before the write is stored sends it through
//! these checks again.

use std::future::Future;
use std::sync::{Arc, Mutex};

use prost_reflect::{DynamicMessage, SerializeOptions};
use proto::resource::v1::Resource;

use super::{Error, ResourceService};
use crate::registry::cel::{self, Meter, Value};
use crate::registry::policies::{Action, CompiledPolicy, Operation, PolicySet, exempt};
use crate::storage::{Consistency, Domain, Fence, Guard, StorageError};

/// A matching policy with what its validations run over (or why they cannot run).
type Job = (
    Arc<CompiledPolicy>,
    Result<Vec<(Arc<String>, Value)>, String>,
);

tokio::task_local! {
    /// The warnings of the request being answered (WARN policies), when its handler collects
    /// them.
    static WARNINGS: Arc<Mutex<Vec<String>>>;
}

/// Runs `work` collecting the warnings admission policies give it.
pub(crate) async fn collecting<F: Future>(work: F) -> (F::Output, Vec<String>) {
    let sink = Arc::new(Mutex::new(Vec::new()));
    let output = WARNINGS.scope(sink.clone(), work).await;
    let warnings = std::mem::take(&mut *sink.lock().unwrap_or_else(|p| p.into_inner()));
    (output, warnings)
}

/// Most warnings one answer carries, and characters of each: they travel in headers, which a
/// client refuses past 16 KiB.
const MAX_WARNINGS: usize = 4;
const MAX_WARNING_CHARS: usize = 300;

fn warn(message: String) {
    let message = if message.chars().count() > MAX_WARNING_CHARS {
        let cut: String = message.chars().take(MAX_WARNING_CHARS).collect();
        format!("{cut}…")
    } else {
        message
    };
    let _ = WARNINGS.try_with(|sink| {
        let mut sink = sink.lock().unwrap_or_else(|p| p.into_inner());
        // One of each, and a bounded number on one answer.
        if !sink.contains(&message) && sink.len() < MAX_WARNINGS {
            sink.push(message);
        }
    });
}

/// Why a policy refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionDenied {
    pub policy: String,
    pub message: String,
}

impl std::fmt::Display for AdmissionDenied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "admission policy {} denies this: {}",
            self.policy, self.message
        )
    }
}

/// Adds the guard on the policies a write is checked against, for a type they may apply to.
pub(super) fn fence_on(fence: &mut Fence, set: &PolicySet, group: &str, kind: &str) {
    if !exempt(group, kind) {
        fence.guards.push(Guard::Domain {
            domain: Domain::Policies,
            revision: set.revision,
        });
    }
}

impl ResourceService {
    /// The policies the node holds now (one revision: what a write is checked and fenced on).
    pub(super) fn policies_now(&self) -> Arc<PolicySet> {
        self.registry.policies().current()
    }

    /// Checks `operation` on `object` (`old` the stored object) against every policy of `set`
    /// that matches it — as stored, or as `written_as`, the version the client wrote it
    /// through (a policy over `demo.v1.*` holds for writes through v1 whatever version stores
    /// them).
    pub(super) async fn admit(
        &self,
        set: &PolicySet,
        object: &Resource,
        old: Option<&Resource>,
        operation: Operation,
        actor: &str,
        written_as: Option<&proto::resource::v1::Type>,
    ) -> Result<Vec<Guard>, Error> {
        let Some(resource_type) = object.id.as_ref().and_then(|id| id.r#type.as_ref()) else {
            return Ok(Vec::new());
        };
        if set.policies.is_empty() || exempt(&resource_type.group, &resource_type.kind) {
            return Ok(Vec::new());
        }
        let gvk = crate::resource::gvk(resource_type);
        let namespace = object
            .id
            .as_ref()
            .and_then(|id| id.tenancy.as_ref())
            .map(|t| t.namespace.clone())
            .unwrap_or_default();
        let mut matching = set.matching(&gvk, &namespace, &object.metadata, operation);
        if let Some(written) = written_as.map(crate::resource::gvk)
            && written != gvk
        {
            for policy in set.matching(&written, &namespace, &object.metadata, operation) {
                if !matching.iter().any(|p| p.name == policy.name) {
                    matching.push(policy);
                }
            }
        }
        if matching.is_empty() {
            return Ok(Vec::new());
        }
        // What each policy's params hold (read here, on this node, as applied), and the
        // guards that keep the write from being stored if they change before it is.
        let mut params = Vec::with_capacity(matching.len());
        let mut guards = Vec::new();
        for policy in &matching {
            params.push(match &policy.params {
                None => Ok(Value::Null),
                // The params' tenancy as its type's scope fills it in (`default/default`…).
                Some(id) => {
                    let (key, read) = self.params_of(id).await;
                    let version = match &read {
                        Ok(stored) => Some(stored.version.clone()),
                        Err(StorageError::NotFound) => Some(String::new()),
                        Err(StorageError::GroupVersionMismatch { stored }) => {
                            Some(stored.version.clone())
                        }
                        Err(_) => None,
                    };
                    if let (Some(key), Some(version)) = (key, version) {
                        guards.push(Guard::Resource { key, version });
                    }
                    match read {
                        Ok(stored) => Ok(Value::from_json(&self.data_json(&stored))),
                        Err(StorageError::NotFound) => Err(format!(
                            "its params {} do not exist",
                            crate::resource::DisplayId(id)
                        )),
                        Err(error) => Err(format!("its params cannot be read: {error}")),
                    }
                }
            });
        }
        // Made once, shared by every policy (values are shared, not copied).
        let object_value = self.object_value(object);
        let old_value = old.map_or(Value::Null, |old| self.object_value(old));
        let variables = |params: Value| {
            vec![
                (Arc::new("object".to_owned()), object_value.clone()),
                (Arc::new("old_object".to_owned()), old_value.clone()),
                (Arc::new("params".to_owned()), params),
                (
                    Arc::new("request".to_owned()),
                    Value::from_json(&serde_json::json!({
                        "operation": operation.name(),
                        "actor": actor,
                    })),
                ),
            ]
        };
        let jobs: Vec<Job> = matching
            .into_iter()
            .zip(params)
            .map(|(policy, params)| (policy, params.map(variables)))
            .collect();
        let run = |jobs: &[Job], budget: u64| {
            let mut meter = Meter::new(budget);
            jobs.iter()
                .map(|(policy, variables)| {
                    let outcome = match (&policy.broken, variables) {
                        (Some(broken), _) => Err(format!("it does not compile here: {broken}")),
                        (None, Err(why)) => Err(why.clone()),
                        // What a validation failed on may hold data (a key, a value): the
                        // writer is told that it failed, the log says why.
                        (None, Ok(variables)) => {
                            policy.validate(variables, &mut meter).map_err(|error| {
                                tracing::warn!(policy = %policy.name, %error, "an admission policy's validations did not run");
                                if matches!(error, cel::EvalError::OverBudget { .. }) {
                                    "its validations ran out of their cost budget on this object".to_owned()
                                } else {
                                    "its validations failed on this object (the server's log says why)".to_owned()
                                }
                            })
                        }
                    };
                    (policy.clone(), outcome)
                })
                .collect::<Vec<_>>()
        };
        // Small objects under cheap policies are checked where the request is handled (the hop
        // to the pool would cost more), within INLINE_UNITS: past them, on the pool.
        let bytes =
            prost::Message::encoded_len(object).max(old.map_or(0, prost::Message::encoded_len));
        let cheap = bytes as u64 <= cel::SMALL_DATA_BYTES
            && jobs
                .iter()
                .map(|(policy, _)| policy.small_estimate())
                .fold(0u64, u64::saturating_add)
                <= cel::INLINE_UNITS;
        let inline = cheap
            .then(|| run(&jobs, cel::INLINE_UNITS))
            .filter(|outcomes| {
                !outcomes
                    .iter()
                    .any(|(_, outcome)| matches!(outcome, Err(why) if why.contains("ran out of their cost budget")))
            });
        let outcomes = match inline {
            Some(outcomes) => outcomes,
            None => self
                .pool
                .run(move || run(&jobs, cel::REQUEST_BUDGET))
                .await
                .map_err(|error| Error::Internal(error.to_string()))?,
        };
        for (policy, outcome) in outcomes {
            match (policy.action, outcome) {
                (_, Ok(None)) => {}
                (Action::Deny, Ok(Some(message))) => {
                    return Err(Error::AdmissionDenied(AdmissionDenied {
                        policy: policy.name.clone(),
                        message,
                    }));
                }
                // Fails closed.
                (Action::Deny, Err(why)) => {
                    return Err(Error::AdmissionDenied(AdmissionDenied {
                        policy: policy.name.clone(),
                        message: format!("the policy cannot be evaluated, so it refuses: {why}"),
                    }));
                }
                (Action::Warn, Ok(Some(message))) => {
                    warn(format!("admission policy {}: {message}", policy.name));
                }
                // Fails open.
                (Action::Warn, Err(why)) => warn(format!(
                    "admission policy {} could not be evaluated and let this through: {why}",
                    policy.name
                )),
                (Action::Audit, outcome) => tracing::info!(
                    target: "resd::audit",
                    policy = %policy.name,
                    object = %crate::resource::DisplayId(object.id.as_ref().unwrap_or(&Default::default())),
                    operation = operation.name(),
                    actor,
                    outcome = %match outcome {
                        Ok(Some(message)) => message,
                        Ok(None) => "admitted".to_owned(),
                        Err(why) => format!("not evaluated (let through): {why}"),
                    },
                    "admission policy audit"
                ),
            }
        }
        Ok(guards)
    }

    /// Reads a policy's params resource, its tenancy filled in as its type's scope says.
    async fn params_of(
        &self,
        id: &proto::resource::v1::Id,
    ) -> (
        Option<crate::storage::StorageKey>,
        Result<Resource, StorageError>,
    ) {
        let mut id = id.clone();
        if self
            .scope_id(&mut id, "params", super::validate::Wildcards::Forbidden)
            .is_err()
        {
            return (None, Err(StorageError::NotFound));
        }
        let key = crate::storage::StorageKey::of(&id);
        (
            Some(key),
            self.backend.read(Consistency::Eventual, &id).await,
        )
    }

    /// A stored object as resctl prints it, for CEL: `type`, `name`, `uid`, `tenancy`,
    /// `version`, `generation`, `metadata` and `data` (its JSON, every field present, 64-bit
    /// integers as numbers; `null` when it does not decode).
    fn object_value(&self, resource: &Resource) -> Value {
        let id = resource.id.clone().unwrap_or_default();
        let tenancy = id.tenancy.clone().unwrap_or_default();
        Value::from_json(&serde_json::json!({
            "type": id.r#type.as_ref().map(crate::resource::gvk).unwrap_or_default(),
            "name": id.name,
            "uid": id.uid,
            "tenancy": {"partition": tenancy.partition, "namespace": tenancy.namespace},
            "version": resource.version,
            "generation": resource.generation,
            "metadata": resource.metadata,
            "data": self.data_json(resource),
        }))
    }

    /// A resource's data as JSON (JSON names, every field present, 64-bit integers as
    /// numbers); `null` when it does not decode.
    fn data_json(&self, resource: &Resource) -> serde_json::Value {
        resource
            .data
            .as_ref()
            .and_then(|any| {
                let name = any.type_url.rsplit('/').next()?;
                let pool = self.registry.descriptor_pool();
                let message = pool.get_message_by_name(name)?;
                let decoded = DynamicMessage::decode(message, any.value.as_slice()).ok()?;
                let options = SerializeOptions::new()
                    .stringify_64_bit_integers(false)
                    .skip_default_fields(false);
                decoded
                    .serialize_with_options(serde_json::value::Serializer, &options)
                    .ok()
            })
            .unwrap_or(serde_json::Value::Null)
    }
}

impl ResourceService {
    /// Plans the admission policy `proposed` (DESIGN §17): refused as its write would be
    /// (compile, match, access), else every stored object it matches checked against it, as an
    /// update of itself (a create or delete for policies only of those), nothing changed.
    pub(crate) async fn plan_policy(
        &self,
        authorizer: &dyn crate::acl::Authorizer,
        proposed: Option<Resource>,
    ) -> Result<proto::cluster::v1::PlanPolicyResponse, Error> {
        use proto::cluster::v1::{PlanFailure, PlanPolicyResponse};
        let proposed = proposed.ok_or_else(|| Error::invalid("policy is required"))?;
        let is_policy = proposed
            .id
            .as_ref()
            .and_then(|id| id.r#type.as_ref())
            .is_some_and(|t| {
                crate::resource::gvk(t) == crate::registry::policies::ADMISSION_POLICY
            });
        if !is_policy {
            return Err(Error::invalid(format!(
                "policy must be a {} resource",
                crate::registry::policies::ADMISSION_POLICY
            )));
        }
        // Every check of writing it, the write excepted.
        let checked = self
            .mutate_and_validate(
                authorizer,
                proto::resource::v1::MutateAndValidateRequest {
                    resource: Some(proposed),
                },
            )
            .await?
            .resource
            .unwrap_or_default();
        let name = checked
            .id
            .as_ref()
            .map(|id| id.name.clone())
            .unwrap_or_default();
        let data: proto::policy::v1::AdmissionPolicy =
            crate::registry::decode_data(&checked).map_err(Error::InvalidArgument)?;
        let mut compiled =
            crate::registry::policies::compile(&name, &data).map_err(|problems| {
                Error::invalid(
                    problems
                        .into_iter()
                        .map(|(field, why)| format!("{field}: {why}"))
                        .collect::<Vec<_>>()
                        .join("; "),
                )
            })?;
        // Planned as a DENY: whatever its action, the plan lists what its validations refuse.
        compiled.action = Action::Deny;
        let set = PolicySet {
            revision: Default::default(),
            policies: vec![Arc::new(compiled)],
        };
        let mut answer = PlanPolicyResponse::default();
        // Each kind once (its versions share the stored objects).
        let mut kinds = std::collections::BTreeSet::new();
        let globs = data
            .r#match
            .as_ref()
            .map(|m| m.types.clone())
            .unwrap_or_default();
        for registration in self.registry.types() {
            let t = &registration.resource_type;
            // Only the kinds its match can cover (any of their versions).
            let covered = globs.is_empty()
                || globs.iter().any(|glob| {
                    let (group, kind) = (
                        glob.split('.').next().unwrap_or_default(),
                        glob.rsplit('.').next().unwrap_or_default(),
                    );
                    crate::acl::rules::glob_matches(group, &t.group)
                        && crate::acl::rules::glob_matches(kind, &t.kind)
                });
            if !covered
                || exempt(&t.group, &t.kind)
                || !kinds.insert((t.group.clone(), t.kind.clone()))
            {
                continue;
            }
            let everywhere = super::migrate::every_tenancy(registration.scope);
            let mut after: Option<crate::storage::StorageKey> = None;
            loop {
                let mut page = super::plan::Page { items: Vec::new() };
                self.backend
                    .list_encoded(
                        Consistency::Strong,
                        &crate::storage::UnversionedType::of(t),
                        &everywhere,
                        "",
                        after.as_ref(),
                        &mut page,
                    )
                    .await?;
                let full = page.items.len() >= super::plan::PAGE;
                let mut last = None;
                for bytes in page.items {
                    let stored = <Resource as prost::Message>::decode(bytes.as_slice())
                        .map_err(crate::storage::undecodable)
                        .map_err(Error::from)?;
                    let id = stored.id.clone().unwrap_or_default();
                    last = Some(crate::storage::StorageKey::of(&id));
                    let gvk = id
                        .r#type
                        .as_ref()
                        .map(crate::resource::gvk)
                        .unwrap_or_default();
                    let namespace = id
                        .tenancy
                        .as_ref()
                        .map(|t| t.namespace.clone())
                        .unwrap_or_default();
                    let Some(operation) = [Operation::Update, Operation::Create, Operation::Delete]
                        .into_iter()
                        .find(|op| {
                            !set.matching(&gvk, &namespace, &stored.metadata, *op)
                                .is_empty()
                        })
                    else {
                        continue;
                    };
                    answer.checked += 1;
                    let refusal = match self
                        .admit(
                            &set,
                            &stored,
                            Some(&stored),
                            operation,
                            authorizer.identity(),
                            None,
                        )
                        .await
                    {
                        Err(Error::AdmissionDenied(denied)) => Some(denied.message),
                        Err(other) => Some(other.to_string()),
                        Ok(_) => None,
                    };
                    let Some(message) = refusal else { continue };
                    if answer.failures.len() >= super::plan::MAX_PLAN_FAILURES {
                        answer.omitted += 1;
                        continue;
                    }
                    let readable =
                        crate::acl::require_resource(authorizer, &id, crate::acl::Access::Read)
                            .is_ok();
                    answer.failures.push(if readable {
                        PlanFailure {
                            id: Some(id),
                            message,
                        }
                    } else {
                        PlanFailure {
                            id: None,
                            message: "an object this token may not read would be refused".into(),
                        }
                    });
                }
                match (full, last) {
                    (true, Some(last)) => after = Some(last),
                    _ => break,
                }
            }
        }
        Ok(answer)
    }
}
