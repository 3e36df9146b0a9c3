//! Write, MutateAndValidate and WriteStatus.

use std::sync::Arc;

use prost::Message;
use proto::resource::v1::{
    MutateAndValidateRequest, MutateAndValidateResponse, Resource, WriteRequest, WriteResponse,
    WriteStatusRequest, WriteStatusResponse,
};

use super::validate::{self, Violations, Wildcards};
use super::{
    Error, ResourceService, TenancyState, VersionConflict, convert, new_ulid, now_timestamp,
    retry_blind,
};
use crate::acl::Authorizer;
use crate::registry::Registration;
use crate::registry::cel::{self, Meter};
use crate::registry::dynamic::{RuleFailure, Violation};
use crate::resource::{self, DELETION_TIMESTAMP_KEY, DisplayId, FINALIZERS_KEY};
use crate::storage::{Consistency, Fence, StorageError};

/// What one write attempt came to.
enum Attempt {
    Written(Box<Resource>),
    /// The local read disagreed with the request; read strongly and try again.
    Reread,
}

/// A resource that passed every check up to the storage write.
struct PreparedWrite {
    resource: Resource,
    registration: Arc<Registration>,
    tenancy: TenancyState,
    /// Who writes: recorded with the change.
    actor: String,
    /// Units of the request's rule budget its rules spent.
    rules_used: u64,
    /// Rules the written data breaks: refused on a create; on an update, unless ratcheting
    /// lets them pass (the stored object broke them too and their field is unchanged).
    violations: Vec<Violation>,
    /// What the checks were made against (DESIGN §15's fence).
    fence: Fence,
    /// The admission policies it is checked against (DESIGN §17), at the revision its fence
    /// names.
    policies: Arc<crate::registry::policies::PolicySet>,
}

/// The type's mutate and validate hooks, then a registered type's rules (metered): the units
/// the rules spent, and the rules that do not hold (an update may still pass them by
/// ratcheting, decided once the stored object is known).
/// Runs the write hooks and the rules of `registration` on `resource`, the rules within `budget`.
/// Setting defaults is idempotent, so a run that ran out of an inline budget can run again.
fn run_hooks(
    registration: &Registration,
    resource: &mut Resource,
    budget: u64,
) -> Result<(u64, Vec<Violation>), Error> {
    if let Some(mutate) = &registration.mutate {
        mutate(resource)?;
    }
    if let Some(validate) = &registration.validate {
        validate(resource)?;
    }
    let Some(registered) = &registration.registered else {
        return Ok((0, Vec::new()));
    };
    let data = resource
        .data
        .as_ref()
        .map(|d| d.value.as_slice())
        .unwrap_or_default();
    let mut meter = Meter::new(budget);
    match registered.compiled.check_rules(data, None, &mut meter) {
        Ok(()) => Ok((meter.used(), Vec::new())),
        Err(RuleFailure::Violations(violations)) if violations.iter().all(|v| v.rule.is_some()) => {
            Ok((meter.used(), violations))
        }
        Err(failure) => Err(failure.into()),
    }
}

impl ResourceService {
    pub(crate) async fn write(
        &self,
        authorizer: &dyn Authorizer,
        request: WriteRequest,
    ) -> Result<WriteResponse, Error> {
        let resource = &request.resource;
        self.refenced(|| self.write_checked(authorizer, resource.clone()))
            .await
    }

    /// One write, every check made once.
    async fn write_checked(
        &self,
        authorizer: &dyn Authorizer,
        resource: Option<Resource>,
    ) -> Result<WriteResponse, Error> {
        let prepared = self.prepare_write(authorizer, resource).await?;
        let blind = prepared.resource.version.is_empty();
        // The first attempt reads the stored resource locally: cheap, and safe because the
        // storage CAS only accepts the write if that read was current. A mismatch seen by this
        // read is re-checked with a strong read before it is reported; retries read strongly.
        let prepared = &prepared;
        let stored = retry_blind(blind, |attempt| async move {
            let consistency = if attempt == 0 {
                Consistency::Eventual
            } else {
                Consistency::Strong
            };
            match self.write_once(authorizer, prepared, consistency).await? {
                Attempt::Written(stored) => Ok(stored),
                Attempt::Reread => match self
                    .write_once(authorizer, prepared, Consistency::Strong)
                    .await?
                {
                    Attempt::Written(stored) => Ok(stored),
                    Attempt::Reread => Err(Error::Internal(
                        "a strong read asked to be read again".into(),
                    )),
                },
            }
        })
        .await?;
        Ok(WriteResponse {
            resource: Some(*stored),
        })
    }

    /// Runs every check of Write up to and including the hooks, and returns the mutated resource
    /// without storing it.
    pub(crate) async fn mutate_and_validate(
        &self,
        authorizer: &dyn Authorizer,
        request: MutateAndValidateRequest,
    ) -> Result<MutateAndValidateResponse, Error> {
        let prepared = self.prepare_write(authorizer, request.resource).await?;
        refuse_violations(prepared.violations.clone())?;
        let id = prepared.resource.id.clone().unwrap_or_default();
        let existing = self.read_stored_with(&id, Consistency::Eventual).await?;
        // Written in a version that is not the storage version: judged by the storage
        // version's rules too, as the write would be (DESIGN §15.1); nothing is stored.
        let in_storage = if convert::family_of(&prepared.registration)
            .is_some_and(|family| family.storage != convert::group_version_of(&prepared.resource))
        {
            self.in_storage_version(&prepared, prepared.resource.clone(), existing.as_ref())
                .await?
                .0
        } else {
            prepared.resource.clone()
        };
        // And by the admission policies, as the write would be (a dry run says what the write
        // would be told).
        let marked = existing
            .as_ref()
            .is_some_and(resource::is_marked_for_deletion);
        if !marked {
            self.admit(
                &prepared.policies,
                &in_storage,
                existing.as_ref(),
                if existing.is_some() {
                    crate::registry::policies::Operation::Update
                } else {
                    crate::registry::policies::Operation::Create
                },
                &prepared.actor,
                prepared
                    .resource
                    .id
                    .as_ref()
                    .and_then(|id| id.r#type.as_ref()),
            )
            .await?;
        }
        Ok(MutateAndValidateResponse {
            resource: Some(prepared.resource),
        })
    }

    /// Shape → type registered → tenancy scope and defaults → data type → mutate → validate →
    /// ACL write → tenancy exists.
    async fn prepare_write(
        &self,
        authorizer: &dyn Authorizer,
        resource: Option<Resource>,
    ) -> Result<PreparedWrite, Error> {
        let mut resource = resource.ok_or_else(|| Error::invalid("resource is required"))?;
        // Before anything is checked against the registry: a Type that changes later fences
        // this change off.
        let types = self.registry.dynamic().revision();
        let size = resource.encoded_len();
        if size > self.max_resource_bytes {
            return Err(Error::invalid(format!(
                "resource is {size} bytes encoded, over the limit of {} bytes: store large payloads elsewhere and reference them",
                self.max_resource_bytes
            )));
        }

        validate::check_resource_ids(&resource, &self.registry)?;

        let mut id = resource.id.take().unwrap_or_default();
        let registration = self.scope_id(&mut id, "resource.id", Wildcards::Forbidden)?;
        resource.id = Some(id);
        if registration.server_written {
            return Err(Error::invalid(format!(
                "resource.id.type {} is written by the server only",
                registration.gvk()
            )));
        }
        if let Some(owner) = resource.owner.as_mut() {
            let owner_registration =
                self.scope_id(owner, "resource.owner", Wildcards::Forbidden)?;
            // Owning makes the owner's deletion reap this: the writer must be able to read it
            // (and an owner it cannot read tells it nothing, not even its uid).
            match (owner_registration.acls.read)(authorizer, owner, None) {
                Err(crate::acl::AclError::NeedResource) => {
                    match self.backend.read(Consistency::Eventual, owner).await {
                        Ok(stored) => {
                            (owner_registration.acls.read)(authorizer, owner, Some(&stored))
                                .map_err(|error| owner_refused(owner, error))?
                        }
                        // A missing owner is the create's business (it says so).
                        Err(StorageError::NotFound) => {}
                        Err(error) => return Err(error.into()),
                    }
                }
                other => other.map_err(|error| owner_refused(owner, error))?,
            }
        }

        if let Some(data) = &resource.data {
            registration
                .check_data(data)
                .map_err(Error::InvalidArgument)?;
        }
        // A tenant's code (a schema to compile, rules to evaluate) runs only for a caller who
        // may write the resource, and on the rule pool, never on an async worker — but for
        // small data under rules cheap on it (estimated at registration), where the hop would
        // cost more than the check.
        let is_type = registration.gvk() == crate::registry::builtin::REGISTRY_TYPE;
        let data_bytes = resource.data.as_ref().map_or(0, |d| d.value.len());
        let costly = is_type
            || registration
                .registered
                .as_ref()
                .is_some_and(|registered| !registered.compiled.checks_inline(data_bytes, false));
        if registration.registered.is_some()
            && let Some(id) = &resource.id
        {
            // Rules run only for a caller who may write the resource.
            registration.check_write_access_before_existence(authorizer, id)?;
        }
        if costly && is_type {
            // Who may write the Type and owns the group.version.Kind it claims.
            (registration.acls.write)(authorizer, &resource)?;
        }
        // Checked inline, rules never spend past INLINE_UNITS: one that would (the estimate
        // was wrong) is checked again on the pool with the request's whole budget.
        let inline = if costly {
            None
        } else {
            match run_hooks(&registration, &mut resource, cel::INLINE_UNITS) {
                Err(Error::RuleCost(_)) if registration.registered.is_some() => None,
                done => Some(done?),
            }
        };
        let (rules_used, violations) = match inline {
            Some(done) => done,
            None => {
                let hooks = registration.clone();
                let (checked, outcome) = self
                    .pool
                    .run(move || {
                        let outcome = run_hooks(&hooks, &mut resource, cel::REQUEST_BUDGET);
                        (resource, outcome)
                    })
                    .await
                    .map_err(|error| Error::Internal(error.to_string()))?;
                resource = checked;
                outcome?
            }
        };
        (registration.acls.write)(authorizer, &resource)?;
        if let Some(references) = &registration.references {
            for (field, id) in references(&resource) {
                match self.backend.read(Consistency::Eventual, &id).await {
                    Ok(_) | Err(StorageError::GroupVersionMismatch { .. }) => {}
                    Err(StorageError::NotFound) => {
                        return Err(Error::invalid(format!(
                            "{field}: {} does not exist",
                            DisplayId(&id)
                        )));
                    }
                    Err(error) => return Err(error.into()),
                }
            }
        }

        let tenancy = resource
            .id
            .as_ref()
            .and_then(|id| id.tenancy.clone())
            .unwrap_or_default();
        let tenancy = match self.tenancy_state(registration.scope, &tenancy).await {
            Err(Error::TenancyNotFound(message)) => {
                return Err(Error::WriteToMissingTenancy(message));
            }
            other => other?,
        };
        let mut fence = Self::fence(authorizer, &registration, is_type.then_some(types));
        fence.guards.extend(self.lease_guard(authorizer).await?);
        let policies = self.policies_now();
        if let Some(t) = resource.id.as_ref().and_then(|id| id.r#type.as_ref()) {
            super::policy::fence_on(&mut fence, &policies, &t.group, &t.kind);
        }
        Ok(PreparedWrite {
            resource,
            registration,
            tenancy,
            actor: authorizer.identity().to_owned(),
            rules_used,
            violations,
            fence,
            policies,
        })
    }

    /// One attempt at the storage write: decides create or update against what is stored now.
    async fn write_once(
        &self,
        authorizer: &dyn Authorizer,
        prepared: &PreparedWrite,
        consistency: Consistency,
    ) -> Result<Attempt, Error> {
        // A copy: the prepared resource stays as the client sent it, for the next attempt.
        let mut input = prepared.resource.clone();
        let id = input.id.clone().unwrap_or_default();
        let local = consistency == Consistency::Eventual;
        match self.read_stored_with(&id, consistency).await? {
            None if local && !input.version.is_empty() => Ok(Attempt::Reread),
            // Boxed, like the finishing delete below: rarer paths with large futures of their
            // own, kept out of the future every update carries.
            None => {
                let stored = Box::pin(self.create(input, prepared)).await?;
                Ok(Attempt::Written(Box::new(
                    self.answer_in(prepared, stored).await?,
                )))
            }
            Some(existing) => {
                // Stored under another group version: the write replaces that object, so it
                // needs the access under the stored version too (a DENY there holds).
                self.check_stored_access(authorizer, &existing, &id)?;
                let blind = input.version.is_empty();
                let existing_id = existing.id.clone().unwrap_or_default();
                let uid_differs = !id.uid.is_empty() && id.uid != existing_id.uid;
                let version_differs = !blind && input.version != existing.version;
                if local && (uid_differs || version_differs) {
                    return Ok(Attempt::Reread);
                }
                if uid_differs {
                    return Err(Error::UidMismatch(format!(
                        "{} is stored with uid {}, the write names uid {}",
                        DisplayId(&existing_id),
                        existing_id.uid,
                        id.uid
                    )));
                }
                if version_differs {
                    return Err(Error::VersionConflict(VersionConflict {
                        what: DisplayId(&existing_id).to_string(),
                        by: "write",
                        expected: input.version.clone(),
                        actual: existing.version.clone(),
                    }));
                }
                // Stored in another version of the same Type: judged as the version written.
                let stored_as_written = if convert::converts_from(
                    &prepared.registration,
                    convert::group_version_of(&existing),
                ) {
                    convert::as_requested_off_thread(
                        &self.pool,
                        &prepared.registration,
                        existing.clone(),
                    )
                    .await?
                } else {
                    None
                };
                let before = stored_as_written.as_ref().unwrap_or(&existing);
                let marked = resource::is_marked_for_deletion(&existing);
                let is_type =
                    prepared.registration.gvk() == crate::registry::builtin::REGISTRY_TYPE;
                if prepared.registration.gvk() == crate::registry::policies::ADMISSION_POLICY {
                    // Who may write the policy as it is stored too: a team may not turn
                    // another's policy to its own types (and so lift it).
                    (prepared.registration.acls.write)(authorizer, &existing)?;
                }
                if is_type {
                    // The owner of what the stored Type claims may change it (a Type never
                    // changes its claim, but the check does not rely on that).
                    (prepared.registration.acls.write)(authorizer, &existing)?;
                    // Compatible with the Type as stored (not only as this node installed it).
                    if let Some(family) = check_type_update(&existing, &input)? {
                        // New versions or conversions: every stored object must survive them.
                        self.check_stored_round_trips(family).await?;
                    }
                }
                if let Some(registered) = &prepared.registration.registered {
                    if !marked {
                        // A resource being deleted may still release its finalizers.
                        refuse_while_type_is_deleted(registered, &existing_id)?;
                    }
                    // Metadata, labels and finalizers always change (ratcheting): rules judge
                    // data, and data that does not change was judged when it was written.
                    let data_changed = !prepared
                        .registration
                        .same_data(input.data.as_ref(), before.data.as_ref());
                    let data =
                        |r: &Resource| r.data.as_ref().map(|d| d.value.clone()).unwrap_or_default();
                    let (new, old) = (data(&input), data(before));
                    let transition = !marked && registered.compiled.has_transition_rules();
                    let deferred = prepared.violations.clone();
                    if data_changed && (transition || !deferred.is_empty()) {
                        let compiled = registered.compiled.clone();
                        let left = cel::REQUEST_BUDGET.saturating_sub(prepared.rules_used);
                        let inline = compiled.checks_inline(new.len().max(old.len()), true);
                        let check = move |budget: u64| -> Result<Vec<Violation>, RuleFailure> {
                            let mut meter = Meter::new(budget);
                            let mut left_over =
                                compiled.ratchet(deferred.clone(), &new, &old, &mut meter)?;
                            if transition
                                && let Err(failure) =
                                    compiled.check_transition_rules(&new, &old, &mut meter)
                            {
                                match failure {
                                    RuleFailure::Violations(more) => left_over.extend(more),
                                    cost => return Err(cost),
                                }
                            }
                            Ok(left_over)
                        };
                        // Inline within INLINE_UNITS, else (or past them) on the pool.
                        let outcome = match inline.then(|| check(left.min(cel::INLINE_UNITS))) {
                            Some(Err(RuleFailure::Cost(_))) | None => self
                                .pool
                                .run(move || check(left))
                                .await
                                .map_err(|error| Error::Internal(error.to_string()))?,
                            Some(done) => done,
                        };
                        refuse_violations(outcome?)?;
                    }
                }
                if matches!(prepared.tenancy, TenancyState::MarkedForDeletion) && !marked {
                    return Err(Error::invalid(format!(
                        "cannot update {}: its partition or namespace is marked for deletion",
                        DisplayId(&existing_id)
                    )));
                }
                resolve_owner_on_update(&mut input, &existing)?;
                if input.status.is_empty() {
                    input.status = existing.status.clone();
                } else if input.status != existing.status {
                    return Err(Error::invalid(
                        "resource.status can only be changed with WriteStatus: leave it empty or send the stored statuses unchanged",
                    ));
                }
                if blind {
                    for key in [FINALIZERS_KEY, DELETION_TIMESTAMP_KEY] {
                        if let (false, Some(value)) =
                            (input.metadata.contains_key(key), existing.metadata.get(key))
                        {
                            input.metadata.insert(key.to_owned(), value.clone());
                        }
                    }
                    input.version = existing.version.clone();
                }
                if marked {
                    check_frozen_write(&input, before, &prepared.registration)?;
                } else if input.metadata.contains_key(DELETION_TIMESTAMP_KEY) {
                    return Err(Error::invalid(format!(
                        "resource.metadata.{DELETION_TIMESTAMP_KEY} is set by Delete, not by Write"
                    )));
                }
                if let Some(input_id) = input.id.as_mut() {
                    input_id.uid = existing_id.uid.clone();
                }
                input.generation = new_ulid();
                let (input, converted) = self
                    .in_storage_version(prepared, input, Some(&existing))
                    .await?;
                // An object marked for deletion only sheds finalizers and metadata: no policy
                // holds that up (ratcheting, DESIGN §15).
                if !marked {
                    self.admit(
                        &prepared.policies,
                        &input,
                        Some(&existing),
                        crate::registry::policies::Operation::Update,
                        &prepared.actor,
                        prepared
                            .resource
                            .id
                            .as_ref()
                            .and_then(|id| id.r#type.as_ref()),
                    )
                    .await?;
                }
                // A blind update may land over a later version too, as long as nothing merged
                // above from the stored resource changed (storage checks): concurrent blind
                // writers of one resource then do not retry each lost race.
                // A Type is replaced only over the version its compatibility was checked against:
                // two blind updates each compatible with it could merge into one that is not.
                // A converted write kept fields of the stored data: only over that version.
                let written = if blind && !is_type && !converted {
                    self.backend
                        .write_merged_as(input, &prepared.actor, &prepared.fence)
                        .await
                } else {
                    self.backend
                        .write_cas_as(input, &prepared.actor, &prepared.fence)
                        .await
                };
                let stored = match written {
                    // Deleted and recreated since the read: a lost race, not the client's uid.
                    Err(StorageError::WrongUid) if id.uid.is_empty() => {
                        return Err(Error::CasFailed(format!(
                            "{} was recreated concurrently",
                            DisplayId(&existing_id)
                        )));
                    }
                    result => result?,
                };
                if marked && !resource::has_finalizers(&stored) {
                    // The last finalizer is gone: finish the delete that was waiting for it.
                    Box::pin(self.finish_delete(&stored, &prepared.actor)).await?;
                }
                Ok(Attempt::Written(Box::new(
                    self.answer_in(prepared, stored).await?,
                )))
            }
        }
    }

    async fn create(
        &self,
        mut input: Resource,
        prepared: &PreparedWrite,
    ) -> Result<Resource, Error> {
        refuse_violations(prepared.violations.clone())?;
        let id = input.id.clone().unwrap_or_default();
        if !input.version.is_empty() {
            return Err(Error::CasFailed(format!(
                "{} does not exist, so it cannot be updated at version {}; leave the version empty to create it",
                DisplayId(&id),
                input.version
            )));
        }
        let mut violations = Violations::default();
        if input.metadata.contains_key(DELETION_TIMESTAMP_KEY) {
            violations.push(
                format!("resource.metadata.{DELETION_TIMESTAMP_KEY}"),
                format!(
                    "resource.metadata.{DELETION_TIMESTAMP_KEY} cannot be set on create: Delete sets it"
                ),
            );
        }
        if !input.status.is_empty() {
            violations.push(
                "resource.status",
                "resource.status cannot be set on create: statuses are written with WriteStatus",
            );
        }
        violations.finish()?;
        if let Some(registered) = &prepared.registration.registered {
            refuse_while_type_is_deleted(registered, &id)?;
        }
        if matches!(prepared.tenancy, TenancyState::MarkedForDeletion) {
            return Err(Error::invalid(format!(
                "cannot create {}: its partition or namespace is marked for deletion",
                DisplayId(&id)
            )));
        }
        if let Some(owner) = input.owner.as_mut()
            && owner.uid.is_empty()
        {
            match self.backend.read(Consistency::Strong, owner).await {
                Ok(stored_owner) => {
                    owner.uid = stored_owner.id.map(|id| id.uid).unwrap_or_default()
                }
                Err(StorageError::GroupVersionMismatch { stored }) => {
                    owner.uid = stored.id.map(|id| id.uid).unwrap_or_default()
                }
                Err(StorageError::NotFound) => {
                    return Err(Error::invalid(format!(
                        "resource.owner does not exist: {}",
                        DisplayId(owner)
                    )));
                }
                Err(error) => return Err(error.into()),
            }
        }
        if let Some(input_id) = input.id.as_mut() {
            input_id.uid = new_ulid();
        }
        input.generation = new_ulid();
        let (input, _) = self.in_storage_version(prepared, input, None).await?;
        self.admit(
            &prepared.policies,
            &input,
            None,
            crate::registry::policies::Operation::Create,
            &prepared.actor,
            prepared
                .resource
                .id
                .as_ref()
                .and_then(|id| id.r#type.as_ref()),
        )
        .await?;
        match self
            .backend
            .write_cas_as(input, &prepared.actor, &prepared.fence)
            .await
        {
            // Another writer created it since the read: a lost race.
            Err(StorageError::WrongUid) => Err(Error::CasFailed(format!(
                "{} was created concurrently",
                DisplayId(&id)
            ))),
            result => Ok(result?),
        }
    }

    /// A write in a served version that is not the storage version, converted to the storage
    /// version (DESIGN §15.1), and checked there as well: the storage version's defaults, its
    /// rules (ratcheted against the stored object) and its transition rules. Fields nothing in
    /// the written version sets keep what `existing` holds. `true` when it was converted.
    async fn in_storage_version(
        &self,
        prepared: &PreparedWrite,
        input: Resource,
        existing: Option<&Resource>,
    ) -> Result<(Resource, bool), Error> {
        let Some(family) = convert::family_of(&prepared.registration) else {
            return Ok((input, false));
        };
        let storage = family.storage.clone();
        if convert::group_version_of(&input) == storage {
            return Ok((input, false));
        }
        let family = prepared
            .registration
            .registered
            .as_ref()
            .map(|installed| installed.family.clone())
            .ok_or_else(|| Error::Internal("a conversion without a family".into()))?;
        // The stored object, converted to the storage version where the checks run (on the
        // rule pool when the conversions are not cheap): fields the written version cannot set
        // keep what it holds there.
        let stored_object: Option<Resource> = match existing {
            Some(existing)
                if family
                    .version(convert::group_version_of(existing))
                    .is_some() =>
            {
                Some(existing.clone())
            }
            _ => None,
        };
        let left = cel::REQUEST_BUDGET.saturating_sub(prepared.rules_used);
        let written_as = convert::group_version_of(&input).to_owned();
        let written_bytes = input.data.as_ref().map_or(0, |d| d.value.len());
        let check = move |input: Resource,
                          stored_object: Option<Resource>,
                          budget: u64|
              -> Result<Resource, Error> {
            let base: Option<Vec<u8>> = match stored_object {
                Some(stored) => Some(
                    convert::convert(&family, stored, &storage, None)?
                        .data
                        .map(|d| d.value)
                        .unwrap_or_default(),
                ),
                None => None,
            };
            // The client's own data that does not convert is a bad request, naming the field.
            let mut converted = convert::convert(&family, input, &storage, base.as_deref())
                .map_err(|error| match error {
                    Error::FailedPrecondition(why) => resource::Invalid::at(
                        "resource.data",
                        format!("does not convert to the storage version: {why}"),
                    )
                    .into(),
                    other => other,
                })?;
            let compiled = family.storage_version().compiled.clone();
            let Some(data) = converted.data.as_mut() else {
                return Ok(converted);
            };
            if let Some(with_defaults) = compiled
                .apply_defaults(&data.value)
                .map_err(|why| resource::Invalid::at("resource.data", why))?
            {
                data.value = with_defaults;
            }
            let mut meter = Meter::new(budget);
            let in_storage = |violations: Vec<Violation>| -> Result<(), Error> {
                refuse_violations(
                    violations
                        .into_iter()
                        .map(|v| Violation {
                            message: format!(
                                "{} (a rule of the storage version {storage}, on the object written as {written_as})",
                                v.message
                            ),
                            ..v
                        })
                        .collect(),
                )
            };
            let deferred = match compiled.check_rules(&data.value, None, &mut meter) {
                Ok(()) => Vec::new(),
                Err(RuleFailure::Violations(v)) if v.iter().all(|v| v.rule.is_some()) => v,
                Err(failure) => return Err(failure.into()),
            };
            match &base {
                None => in_storage(deferred)?,
                Some(old) => {
                    let mut left_over = compiled.ratchet(deferred, &data.value, old, &mut meter)?;
                    if compiled.has_transition_rules()
                        && let Err(failure) =
                            compiled.check_transition_rules(&data.value, old, &mut meter)
                    {
                        match failure {
                            RuleFailure::Violations(more) => left_over.extend(more),
                            cost => return Err(cost.into()),
                        }
                    }
                    in_storage(left_over)?;
                }
            }
            Ok(converted)
        };
        // Sized by the larger of what is written and what is stored (a create has no stored
        // object; its input alone may be large).
        let bytes = existing
            .and_then(|e| e.data.as_ref())
            .map_or(0, |d| d.value.len())
            .max(written_bytes);
        let inline = prepared
            .registration
            .registered
            .as_ref()
            .is_some_and(|installed| {
                installed.family.converts_inline(bytes)
                    && installed
                        .family
                        .storage_version()
                        .compiled
                        .checks_inline(bytes, true)
            });
        // Inline (small data: the copies are cheap) within INLINE_UNITS, else (or past them)
        // on the pool with what is left of the request's budget.
        let inline = if inline {
            match check(
                input.clone(),
                stored_object.clone(),
                left.min(cel::INLINE_UNITS),
            ) {
                Err(Error::RuleCost(_)) => None,
                done => Some(done?),
            }
        } else {
            None
        };
        let converted = match inline {
            Some(converted) => converted,
            None => self
                .pool
                .run(move || check(input, stored_object, left))
                .await
                .map_err(|error| Error::Internal(error.to_string()))??,
        };
        // Conversions may make an object larger: what is stored stays within the limit.
        let size = converted.encoded_len();
        if size > self.max_resource_bytes {
            return Err(Error::invalid(format!(
                "resource converted to the storage version {} is {size} bytes encoded, over the limit of {} bytes: the Type's conversions make it larger than it was written",
                convert::group_version_of(&converted),
                self.max_resource_bytes
            )));
        }
        Ok((converted, true))
    }

    /// What a write answers: the stored resource in the version it was written in.
    async fn answer_in(
        &self,
        prepared: &PreparedWrite,
        stored: Resource,
    ) -> Result<Resource, Error> {
        if convert::converts_from(&prepared.registration, convert::group_version_of(&stored)) {
            Ok(
                convert::as_requested_off_thread(
                    &self.pool,
                    &prepared.registration,
                    stored.clone(),
                )
                .await?
                .unwrap_or(stored),
            )
        } else {
            Ok(stored)
        }
    }

    /// Creates the management token `name` with `secret` unless it exists (ACL bootstrap):
    /// `FailedPrecondition` once any node has done it.
    /// When `existing` is stored under another group version than `requested` names, runs the
    /// write hook of the stored type on it: changing or deleting an object through another
    /// version needs the access under both (DESIGN §12.3).
    pub(super) fn check_stored_access(
        &self,
        authorizer: &dyn Authorizer,
        existing: &Resource,
        requested: &proto::resource::v1::Id,
    ) -> Result<(), Error> {
        let stored_type = existing.id.as_ref().and_then(|id| id.r#type.as_ref());
        let requested_type = requested.r#type.as_ref();
        if stored_type.map(|t| &t.group_version) == requested_type.map(|t| &t.group_version) {
            return Ok(());
        }
        let Some(registration) = stored_type.and_then(|t| self.registry.resolve_stored(t)) else {
            return Err(Error::Internal(format!(
                "{} is stored under a type this server does not know",
                DisplayId(existing.id.as_ref().unwrap_or(requested))
            )));
        };
        (registration.acls.write)(authorizer, existing)?;
        Ok(())
    }

    /// Bootstraps ACLs (DESIGN §12.3): records that they were bootstrapped — for good, before
    /// anything else — then writes the management token `accessor` with `secret`. Refused once
    /// recorded, whatever happened to the tokens since, unless `reset_index` (what the file
    /// `acl-bootstrap-reset` in the answering server's data directory holds) names the
    /// record's version. A cluster bootstrapped before the record existed (it holds tokens) is
    /// recorded now and refused.
    pub(crate) async fn bootstrap_acls(
        &self,
        accessor: &str,
        secret: &str,
        reset_index: Option<&str>,
    ) -> Result<(), Error> {
        use crate::registry::builtin::{ACL_BOOTSTRAP, ACL_BOOTSTRAP_NAME};
        let already = |index: &str| {
            Error::FailedPrecondition(format!(
                "ACLs are already bootstrapped (reset index {index}); to bootstrap again, write {index} into the file acl-bootstrap-reset in a server's data directory and call AclBootstrap on that server"
            ))
        };
        let mut record_id = proto::resource::v1::Id {
            uid: String::new(),
            name: ACL_BOOTSTRAP_NAME.to_owned(),
            r#type: Some(resource::parse_gvk(ACL_BOOTSTRAP).map_err(Error::Internal)?),
            tenancy: Some(Default::default()),
        };
        match self.backend.read(Consistency::Strong, &record_id).await {
            Ok(record) => {
                if reset_index != Some(record.version.as_str()) {
                    return Err(already(&record.version));
                }
                match self
                    .backend
                    .delete_cas_as(
                        &record_id,
                        &record.version,
                        crate::acl::SERVER_IDENTITY,
                        &Fence::default(),
                    )
                    .await
                {
                    Ok(()) => tracing::warn!(
                        reset_index = record.version,
                        "ACL bootstrap reset: the reset file named the bootstrap's index"
                    ),
                    Err(StorageError::CasFailure) => return Err(already("changed")),
                    Err(error) => return Err(error.into()),
                }
            }
            Err(StorageError::NotFound) => {
                let tokens = self
                    .backend
                    .list(
                        Consistency::Strong,
                        &crate::storage::UnversionedType {
                            group: "acl".into(),
                            kind: "Token".into(),
                        },
                        &proto::resource::v1::Tenancy {
                            partition: resource::WILDCARD.into(),
                            namespace: resource::WILDCARD.into(),
                        },
                        "",
                    )
                    .await?;
                if !tokens.is_empty() {
                    // Bootstrapped by an earlier build, which kept no record: record it now.
                    let record = self.acl_bootstrap_record(record_id.clone(), "").await?;
                    return Err(already(&record));
                }
            }
            Err(error) => return Err(error.into()),
        }
        record_id.uid = String::new();
        self.acl_bootstrap_record(record_id, accessor).await?;
        let token = proto::acl::v1::Token {
            description: "Created by AclBootstrap: manages everything".into(),
            policies: vec![crate::acl::MANAGEMENT_POLICY.into()],
            expires_at: String::new(),
            secret: secret.to_owned(),
            secret_hash: String::new(),
        };
        let resource = Resource {
            id: Some(proto::resource::v1::Id {
                uid: String::new(),
                name: accessor.to_owned(),
                r#type: Some(resource::new_type("acl", "v1", "Token")),
                tenancy: Some(Default::default()),
            }),
            data: Some(proto::to_any(&token)),
            ..Default::default()
        };
        // A blind write: after a reset, the token replaces the one of that name.
        self.write(
            &crate::acl::AllowAll,
            WriteRequest {
                resource: Some(resource),
            },
        )
        .await?;
        Ok(())
    }

    /// Records that member `node_id` was removed (blind: a later removal of the same id
    /// replaces the record).
    pub(crate) async fn record_removed_member(
        &self,
        member: proto::internal::v1::RemovedMember,
    ) -> Result<(), Error> {
        let mut id = removed_member_id(member.node_id)?;
        let version = match self.backend.read(Consistency::Strong, &id).await {
            Ok(stored) => {
                id.uid = stored.id.map(|id| id.uid).unwrap_or_default();
                stored.version
            }
            Err(StorageError::NotFound) => {
                id.uid = new_ulid();
                String::new()
            }
            Err(error) => return Err(error.into()),
        };
        let record = Resource {
            id: Some(id),
            version,
            generation: new_ulid(),
            data: Some(proto::to_any(&member)),
            ..Default::default()
        };
        self.backend
            .write_cas_as(record, crate::acl::SERVER_IDENTITY, &Fence::default())
            .await
            .map(drop)
            .map_err(Error::from)
    }

    /// The record of member `node_id`'s removal, if it was removed.
    pub(crate) async fn removed_member(
        &self,
        node_id: u64,
    ) -> Result<Option<proto::internal::v1::RemovedMember>, Error> {
        match self
            .backend
            .read(Consistency::Strong, &removed_member_id(node_id)?)
            .await
        {
            Ok(record) => Ok(record
                .data
                .as_ref()
                .and_then(|any| Message::decode(any.value.as_slice()).ok())),
            Err(StorageError::NotFound) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// Forgets member `node_id`'s removal (it joined again with an empty data directory).
    pub(crate) async fn forget_removed_member(&self, node_id: u64) -> Result<(), Error> {
        let id = removed_member_id(node_id)?;
        let record = match self.backend.read(Consistency::Strong, &id).await {
            Ok(record) => record,
            Err(StorageError::NotFound) => return Ok(()),
            Err(error) => return Err(error.into()),
        };
        match self
            .backend
            .delete_cas_as(
                &id,
                &record.version,
                crate::acl::SERVER_IDENTITY,
                &Fence::default(),
            )
            .await
        {
            Ok(()) | Err(StorageError::NotFound | StorageError::CasFailure) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    /// Writes the bootstrap record (it must not exist) and returns its version, the reset index.
    async fn acl_bootstrap_record(
        &self,
        mut id: proto::resource::v1::Id,
        accessor: &str,
    ) -> Result<String, Error> {
        id.uid = new_ulid();
        let record = Resource {
            id: Some(id),
            generation: new_ulid(),
            data: Some(proto::to_any(&proto::internal::v1::AclBootstrap {
                accessor: accessor.to_owned(),
            })),
            ..Default::default()
        };
        match self
            .backend
            .write_cas_as(record, crate::acl::SERVER_IDENTITY, &Fence::default())
            .await
        {
            Ok(stored) => Ok(stored.version),
            Err(StorageError::CasFailure | StorageError::WrongUid) => Err(
                Error::FailedPrecondition("ACLs are already bootstrapped".into()),
            ),
            Err(error) => Err(error.into()),
        }
    }

    pub(crate) async fn write_status(
        &self,
        authorizer: &dyn Authorizer,
        request: WriteStatusRequest,
    ) -> Result<WriteStatusResponse, Error> {
        self.refenced(|| self.write_status_checked(authorizer, request.clone()))
            .await
    }

    /// One status write, every check made once.
    async fn write_status_checked(
        &self,
        authorizer: &dyn Authorizer,
        request: WriteStatusRequest,
    ) -> Result<WriteStatusResponse, Error> {
        let WriteStatusRequest {
            id,
            version,
            key,
            status,
        } = request;
        let mut violations = Violations::default();
        validate::check_id(
            &mut violations,
            "id",
            id.as_ref(),
            Wildcards::Forbidden,
            &self.registry,
        );
        if key.is_empty() {
            violations.push(
                "key",
                "key is required: name the status after the controller that writes it",
            );
        }
        match &status {
            None => violations.push("status", "status is required"),
            Some(status) => {
                validate::check_ulid(
                    &mut violations,
                    "status.observed_generation",
                    &status.observed_generation,
                );
                if status.updated_at.is_some() {
                    violations.push(
                        "status.updated_at",
                        "status.updated_at is set by the server: leave it empty",
                    );
                }
                for (index, condition) in status.conditions.iter().enumerate() {
                    if condition.r#type.is_empty() {
                        violations.push(
                            format!("status.conditions[{index}].type"),
                            format!("status.conditions[{index}].type is required"),
                        );
                    }
                    if let Some(reference) = &condition.resource {
                        validate::check_reference(
                            &mut violations,
                            &format!("status.conditions[{index}].resource"),
                            reference,
                        );
                    }
                }
            }
        }
        violations.finish()?;
        let (mut id, status) = match (id, status) {
            (Some(id), Some(status)) => (id, status),
            _ => {
                return Err(Error::Internal(
                    "write_status: checked fields are missing".into(),
                ));
            }
        };
        let registration = self.scope_id(&mut id, "id", Wildcards::Forbidden)?;
        registration.check_write_access_before_existence(authorizer, &id)?;
        // A Type's migration status is what allows retiring a version (DESIGN §15.1): only
        // the server's type controller writes it, never the Type's owner.
        if registration.gvk() == crate::registry::builtin::REGISTRY_TYPE
            && key == super::migrate::MIGRATION_STATUS
            && !authorizer.is_server()
        {
            return Err(Error::PermissionDenied(format!(
                "status {key:?} of a Type is written by the server's type controller only: it says which stored objects were migrated"
            )));
        }
        let tenancy = id.tenancy.clone().unwrap_or_default();
        match self.tenancy_state(registration.scope, &tenancy).await {
            Err(Error::TenancyNotFound(message)) => {
                return Err(Error::WriteToMissingTenancy(message));
            }
            other => other?,
        };

        let blind = version.is_empty();
        let mut fence = Self::fence(authorizer, &registration, None);
        fence.guards.extend(self.lease_guard(authorizer).await?);
        let (id, registration, key, status) = (&id, &registration, &key, &status);
        let (version, fence) = (&version, &fence);
        retry_blind(blind, |_| async move {
            let Some(existing) = self.read_stored(id).await? else {
                return Err(Error::NotFound(format!(
                    "resource not found: {}",
                    DisplayId(id)
                )));
            };
            let existing_id = existing.id.clone().unwrap_or_default();
            if !id.uid.is_empty() && id.uid != existing_id.uid {
                return Err(Error::NotFound(format!(
                    "resource not found: {} with uid {} (the stored one has uid {})",
                    DisplayId(id),
                    id.uid,
                    existing_id.uid
                )));
            }
            (registration.acls.write)(authorizer, &existing)?;
            if !blind && *version != existing.version {
                return Err(Error::VersionConflict(VersionConflict {
                    what: DisplayId(&existing_id).to_string(),
                    by: "status write",
                    expected: version.clone(),
                    actual: existing.version.clone(),
                }));
            }
            let mut updated = existing.clone();
            let mut status = status.clone();
            status.updated_at = Some(now_timestamp());
            updated.status.insert(key.clone(), status);
            let stored = self
                .backend
                .write_cas_as(updated, authorizer.identity(), fence)
                .await?;
            // Answered in the version asked through (DESIGN §15.1).
            let stored = if convert::converts_from(registration, convert::group_version_of(&stored))
            {
                convert::as_requested_off_thread(&self.pool, registration, stored.clone())
                    .await?
                    .unwrap_or(stored)
            } else {
                stored
            };
            Ok(WriteStatusResponse {
                resource: Some(stored),
            })
        })
        .await
    }
}

/// Owner is set on create only. An update naming the owner without its uid keeps the stored uid.
fn resolve_owner_on_update(input: &mut Resource, existing: &Resource) -> Result<(), Error> {
    match (input.owner.as_mut(), existing.owner.as_ref()) {
        (None, None) => Ok(()),
        (Some(owner), Some(stored))
            if resource::same_name(owner, stored)
                && (owner.uid.is_empty() || owner.uid == stored.uid) =>
        {
            owner.uid = stored.uid.clone();
            Ok(())
        }
        (_, stored) => Err(Error::invalid(format!(
            "resource.owner cannot be changed: it is set on create only (stored owner: {})",
            stored
                .map(|owner| DisplayId(owner).to_string())
                .unwrap_or_else(|| "none".into())
        ))),
    }
}

/// A resource marked for deletion only accepts writes that remove at least one finalizer and
/// change nothing else.
fn check_frozen_write(
    input: &Resource,
    existing: &Resource,
    registration: &Registration,
) -> Result<(), Error> {
    let mut violations = Violations::default();
    let frozen =
        "the resource is marked for deletion and only accepts writes that remove finalizers";
    if !registration.same_data(input.data.as_ref(), existing.data.as_ref()) {
        violations.push(
            "resource.data",
            format!("resource.data cannot change: {frozen}"),
        );
    }
    let input_finalizers = resource::finalizers(input);
    let existing_finalizers = resource::finalizers(existing);
    let added: Vec<&str> = input_finalizers
        .difference(&existing_finalizers)
        .copied()
        .collect();
    if !added.is_empty() {
        violations.push(
            format!("resource.metadata.{FINALIZERS_KEY}"),
            format!("resource.metadata.{FINALIZERS_KEY} cannot gain {added:?}: {frozen}"),
        );
    }
    if input.metadata.get(DELETION_TIMESTAMP_KEY) != existing.metadata.get(DELETION_TIMESTAMP_KEY) {
        violations.push(
            format!("resource.metadata.{DELETION_TIMESTAMP_KEY}"),
            format!(
                "resource.metadata.{DELETION_TIMESTAMP_KEY} cannot be changed or removed: {frozen}"
            ),
        );
    }
    let other_metadata = |resource: &Resource| {
        resource
            .metadata
            .iter()
            .filter(|(key, _)| {
                key.as_str() != FINALIZERS_KEY && key.as_str() != DELETION_TIMESTAMP_KEY
            })
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    if other_metadata(input) != other_metadata(existing) {
        violations.push(
            "resource.metadata",
            format!("resource.metadata cannot change: {frozen}"),
        );
    }
    if added.is_empty() && input_finalizers == existing_finalizers {
        violations.push("resource", format!("no-op write rejected: {frozen}"));
    }
    Ok(violations.finish()?)
}

/// An owner reference the writer may not read: refused as the owner's read would be.
fn owner_refused(owner: &proto::resource::v1::Id, error: crate::acl::AclError) -> Error {
    match error {
        crate::acl::AclError::PermissionDenied(why) => Error::PermissionDenied(format!(
            "resource.owner {}: {why} (an owner must be readable by the writer)",
            DisplayId(owner)
        )),
        other => Error::from(other),
    }
}

/// The id of the record of member `node_id`'s removal.
fn removed_member_id(node_id: u64) -> Result<proto::resource::v1::Id, Error> {
    Ok(proto::resource::v1::Id {
        uid: String::new(),
        name: format!("node-{node_id}"),
        r#type: Some(
            resource::parse_gvk(crate::registry::builtin::REMOVED_MEMBER)
                .map_err(Error::Internal)?,
        ),
        tenancy: Some(Default::default()),
    })
}

/// Writes of a registered type whose Type is being deleted are refused (DESIGN §15): the type
/// controller is emptying it.
fn refuse_while_type_is_deleted(
    registered: &crate::registry::dynamic::Installed,
    id: &proto::resource::v1::Id,
) -> Result<(), Error> {
    if registered.deleting {
        return Err(Error::TypeBeingDeleted(format!(
            "cannot write {}: type {} is being deleted (Type {} is marked for deletion; its resources are being removed)",
            DisplayId(id),
            resource::gvk(&registered.compiled.resource_type),
            registered.name
        )));
    }
    Ok(())
}

/// An update of a `registry.v1.Type` keeps what its stored version registered compatible
/// (DESIGN §15).
/// The written Type's versions when they convert differently from the stored Type's (its
/// versions, storage version or conversions changed): the stored objects are checked against
/// them.
fn check_type_update(
    existing: &Resource,
    input: &Resource,
) -> Result<Option<Arc<crate::registry::versions::Family>>, Error> {
    use crate::registry::versions::{Family, check_update};
    let decode =
        |resource: &Resource| crate::registry::decode_data::<proto::registry::v1::Type>(resource);
    // A stored Type that does not load registered nothing: any valid replacement will do.
    let Ok(stored_type) = decode(existing) else {
        return Ok(None);
    };
    let Ok(stored) = Family::load_any(&stored_type) else {
        return Ok(None);
    };
    let written_type =
        decode(input).map_err(|why| Error::InvalidArgument(format!("resource.{why}")))?;
    let written = Family::load_any(&written_type)
        .map_err(|why| Error::InvalidArgument(format!("resource.{why}")))?;
    check_update(&stored, &written)
        .map_err(|why| Error::InvalidArgument(format!("resource.data: {why}")))?;
    // A version goes only once nothing is stored in it: the migration to the storage version
    // has finished for the Type as it is now (DESIGN §15.1).
    let removed: Vec<&str> = stored
        .versions
        .iter()
        .map(|v| v.name.as_str())
        .filter(|name| written.version(name).is_none())
        .collect();
    if !removed.is_empty() && stored.converts() && !migrated(existing) {
        return Err(Error::InvalidArgument(format!(
            "resource.data.versions: {} removed while objects may still be stored in {}: wait until the migration to {} has finished (the Type's status `migration`, condition Migrated=TRUE; `resctl wait registry.v1.Type {} --for condition=Migrated`), then remove it",
            removed.join(", "),
            if removed.len() == 1 { "it" } else { "them" },
            stored.storage,
            existing
                .id
                .as_ref()
                .map(|id| id.name.as_str())
                .unwrap_or_default()
        )));
    }
    // A version served again is checked as a new one: stored objects must survive it.
    let shape = |t: &proto::registry::v1::Type| {
        let versions: Vec<(String, String, bool)> = t
            .versions
            .iter()
            .map(|v| (v.name.clone(), v.proto.clone(), v.served))
            .collect();
        (
            versions,
            t.storage_version.clone(),
            t.conversions.clone(),
            t.proto.clone(),
        )
    };
    let converts_anew = written.converts() && shape(&stored_type) != shape(&written_type);
    Ok(converts_anew.then(|| Arc::new(written)))
}

/// Whether the Type `existing` reports its migration finished for its current generation.
fn migrated(existing: &Resource) -> bool {
    existing
        .status
        .get(super::migrate::MIGRATION_STATUS)
        .is_some_and(|status| {
            status.observed_generation == existing.generation
                && status.conditions.iter().any(|c| {
                    c.r#type == "Migrated" && c.state == proto::resource::v1::State::True as i32
                })
        })
}

/// Refuses a write whose data breaks rules, naming each (a `google.rpc.BadRequest`).
fn refuse_violations(violations: Vec<Violation>) -> Result<(), Error> {
    if violations.is_empty() {
        Ok(())
    } else {
        Err(RuleFailure::Violations(violations).into())
    }
}
