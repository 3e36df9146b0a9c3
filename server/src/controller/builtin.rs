//! The built-in controllers: the reaper (cascading deletes through tombstones), the namespace
//! controller (deleting a namespace deletes what is in it), the type controller (deleting a
//! registered Type deletes its resources), and the demo controllers that make ownership,
//! statuses, finalizers and placement visible.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use proto::demo::v2 as demo_v2;
use proto::internal::v1::Tombstone;
use proto::resource::v1::{Condition, Id, Resource, State, Status, Tenancy};

use super::manager::{Manager, ManagerError};
use super::{
    Action, Controller, InProcess, Placement, ReconcileError, Reconciler, Request, Runtime,
    map_owner_filtered,
};
use crate::registry::{Registry, Scope, decode_data};
use crate::resource::{self, DisplayId};
use crate::service::MIGRATION_STATUS;

/// Finalizer the namespace controller holds on every namespace.
pub(crate) const NAMESPACE_FINALIZER: &str = "tenancy.resd.io/namespace-cleanup";
/// Finalizer the album controller holds on every album.
pub(crate) const ALBUM_FINALIZER: &str = "demo.resd.io/album-cleanup";
/// Status key of the artist controller.
/// The demo artist controller's name, also its mark on the albums it generates.
pub(crate) const ARTIST_CONTROLLER: &str = "demo-artist";
pub(crate) const ARTIST_STATUS: &str = "demo.resd.io/artist";
/// Status key of the album controller.
pub(crate) const ALBUM_STATUS: &str = "demo.resd.io/album";

/// The controller that deletes events an hour after they were last seen.
pub(crate) const EVENT_EXPIRY: &str = "event-expiry";
/// How long an event lives after it was last seen (DESIGN §18).
pub(crate) const EVENT_TTL: Duration = Duration::from_secs(3600);

/// Deletes each `events.v1.Event` once its `last_seen` is [`EVENT_TTL`] old (by compare-and-swap:
/// an event seen again meanwhile stays), and comes back to it when that time is due.
pub(crate) struct EventExpiry;

#[async_trait]
impl Reconciler<InProcess> for EventExpiry {
    async fn reconcile(
        &self,
        runtime: &Runtime,
        request: Request,
    ) -> Result<Action, ReconcileError> {
        let Some(stored) = runtime.read(&request.id).await? else {
            return Ok(Action::await_change());
        };
        let last_seen = decode_data::<proto::events::v1::Event>(&stored)
            .ok()
            .and_then(|event| event.last_seen)
            .map_or(0, |t| t.seconds);
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let age = Duration::from_secs(u64::try_from(now.saturating_sub(last_seen)).unwrap_or(0));
        if age < EVENT_TTL {
            return Ok(Action::requeue(EVENT_TTL - age + Duration::from_secs(1)));
        }
        let id = stored.id.clone().unwrap_or_default();
        match runtime::api::Api::delete(runtime.api(), &id, &stored.version).await {
            Ok(()) => Ok(Action::await_change()),
            // Seen again since: judged again from what is stored now.
            Err(runtime::api::ApiError::Conflict(_)) => {
                Ok(Action::requeue(Duration::from_millis(100)))
            }
            Err(error) => Err(error.into()),
        }
    }
}

/// Registers every built-in controller.
pub(crate) fn register(
    manager: &mut Manager,
    registry: Arc<Registry>,
    reaper_second_pass: Duration,
) -> Result<(), ManagerError> {
    manager.register(
        Controller::new("reaper", resource::new_type("internal", "v1", "Tombstone"))
            .with_reconciler(Reaper::new(reaper_second_pass)),
    )?;
    manager.register(
        Controller::new(
            "namespace",
            resource::new_type("tenancy", "v1", "Namespace"),
        )
        .with_reconciler(NamespaceController { registry })
        .with_finalizer(NAMESPACE_FINALIZER),
    )?;
    manager.register(
        Controller::new(
            "replica-reports",
            resource::new_type("coordination", "v1", "Replica"),
        )
        .with_reconciler(ReplicaReports::default()),
    )?;
    manager.register(
        Controller::new(
            super::shards::SHARDS,
            resource::new_type("coordination", "v1", "ShardMap"),
        )
        .with_reconciler(super::shards::Shards::default())
        .with_watch(
            resource::new_type("coordination", "v1", "Replica"),
            super::shards::map_of_report(),
        ),
    )?;
    manager.register(
        Controller::new(
            POLICY_CONTROLLER,
            resource::new_type("policy", "v1", "AdmissionPolicy"),
        )
        .with_reconciler(PolicyController),
    )?;
    manager.register(
        Controller::new(EVENT_EXPIRY, resource::new_type("events", "v1", "Event"))
            .with_reconciler(EventExpiry),
    )?;
    manager.register(
        Controller::new("type", crate::registry::builtin::registry_type())
            .with_reconciler(TypeController::default())
            .with_finalizer(crate::registry::builtin::TYPE_FINALIZER),
    )?;
    manager.register(
        Controller::new(
            ARTIST_CONTROLLER,
            resource::new_type("demo", "v2", "Artist"),
        )
        .with_reconciler(ArtistController)
        .with_watch(
            resource::new_type("demo", "v2", "Album"),
            map_owner_filtered(resource::new_type("demo", "v2", "Artist")),
        ),
    )?;
    manager.register(
        Controller::new("demo-album", resource::new_type("demo", "v2", "Album"))
            .with_reconciler(AlbumController)
            .with_finalizer(ALBUM_FINALIZER),
    )?;
    manager.register(
        Controller::new(
            "demo-concept-observer",
            resource::new_type("demo", "v1", "Concept"),
        )
        .with_reconciler(ConceptObserver::default())
        .with_placement(Placement::EachReplica),
    )?;
    Ok(())
}

fn condition(kind: &str, state: State, reason: &str, message: String) -> Condition {
    Condition {
        r#type: kind.into(),
        state: state as i32,
        reason: reason.into(),
        message,
        resource: None,
    }
}

/// Deletes the children of deleted resources. Each tombstone names a deleted resource by uid: its
/// children are deleted (children with finalizers are only marked, and the tombstone waits for
/// them), then after one more pass that finds none — catching children written while the owner
/// was being deleted — the tombstone itself is deleted. Deleting a child writes its own
/// tombstone, so deletes cascade down the tree.
pub(crate) struct Reaper {
    second_pass: Duration,
    /// Passes that found no children, per tombstone uid.
    empty_passes: Mutex<HashMap<String, u32>>,
    /// Passes that found the deleted resource still alive, per tombstone uid.
    alive_passes: Mutex<HashMap<String, u32>>,
}

/// A tombstone is written just before its resource is deleted, so the resource can still be
/// there for a moment; only after this many passes is it a tombstone whose delete never happened.
const STALE_AFTER_PASSES: u32 = 10;

impl Reaper {
    pub(crate) fn new(second_pass: Duration) -> Self {
        Reaper {
            second_pass,
            empty_passes: Mutex::new(HashMap::new()),
            alive_passes: Mutex::new(HashMap::new()),
        }
    }

    fn passes(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.empty_passes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl Reconciler<InProcess> for Reaper {
    async fn reconcile(
        &self,
        runtime: &Runtime,
        request: Request,
    ) -> Result<Action, ReconcileError> {
        let Some(tombstone) = runtime.read(&request.id).await? else {
            return Ok(Action::await_change());
        };
        let tombstone_id = tombstone.id.clone().unwrap_or_default();
        let deleted = decode_data::<Tombstone>(&tombstone)
            .map_err(ReconcileError)?
            .owner
            .unwrap_or_default();
        // The resource may not be deleted yet (the tombstone goes first); if it stays, its delete
        // never happened and the tombstone is dropped.
        let mut by_name = deleted.clone();
        by_name.uid.clear();
        if let Ok(Some(current)) = runtime.read(&by_name).await
            && current.id.as_ref().is_some_and(|id| id.uid == deleted.uid)
        {
            let alive = {
                let mut alive = self.alive_passes.lock().unwrap_or_else(|p| p.into_inner());
                let count = alive.entry(tombstone_id.uid.clone()).or_insert(0);
                *count += 1;
                *count
            };
            if alive < STALE_AFTER_PASSES {
                return Ok(Action::requeue(self.second_pass));
            }
            tracing::warn!(resource = %DisplayId(&deleted), "dropping a tombstone whose resource was never deleted");
            runtime.delete(&tombstone_id).await?;
            self.alive_passes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&tombstone_id.uid);
            return Ok(Action::await_change());
        }
        self.alive_passes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&tombstone_id.uid);
        // By the stored id: the owner's type may be unregistered by now.
        let children = runtime
            .api()
            .service
            .children_of(runtime.api().identity.as_ref(), &deleted)
            .await?;
        if !children.is_empty() {
            let mut deleting = 0usize;
            for child in &children {
                if !resource::is_marked_for_deletion(child)
                    && let Some(id) = &child.id
                {
                    runtime.delete(id).await?;
                    deleting += 1;
                }
            }
            if deleting > 0 {
                runtime.events().record(
                    &deleted,
                    runtime::events::EventType::Normal,
                    "Cascaded",
                    // Its dependents are not named: they may live where this event's readers
                    // may not look.
                    format!("deleted: deleting {deleting} of its dependents"),
                );
            }
            self.passes().remove(&tombstone_id.uid);
            return Ok(Action::requeue(self.second_pass));
        }
        let passes = {
            let mut passes = self.passes();
            let count = passes.entry(tombstone_id.uid.clone()).or_insert(0);
            *count += 1;
            *count
        };
        if passes < 2 {
            return Ok(Action::requeue(self.second_pass));
        }
        runtime.delete(&tombstone_id).await?;
        self.passes().remove(&tombstone_id.uid);
        tracing::debug!(deleted = %DisplayId(&deleted), "reaped");
        Ok(Action::await_change())
    }
}

/// Holds a finalizer on every namespace; when one is marked for deletion, deletes everything in
/// it, then releases the finalizer (and with it the namespace).
pub(crate) struct NamespaceController {
    registry: Arc<Registry>,
}

#[async_trait]
impl Reconciler<InProcess> for NamespaceController {
    async fn reconcile(
        &self,
        runtime: &Runtime,
        request: Request,
    ) -> Result<Action, ReconcileError> {
        let Some(namespace) = runtime.read(&request.id).await? else {
            return Ok(Action::await_change());
        };
        let id = namespace.id.clone().unwrap_or_default();
        let partition = id.tenancy.clone().unwrap_or_default().partition;
        if partition == resource::DEFAULT_PARTITION && id.name == resource::DEFAULT_NAMESPACE {
            return Ok(Action::await_change());
        }
        if !resource::is_marked_for_deletion(&namespace) {
            if !resource::has_finalizer(&namespace, NAMESPACE_FINALIZER) {
                let mut held = namespace.clone();
                resource::add_finalizer(&mut held, NAMESPACE_FINALIZER);
                runtime.write(held).await?;
            }
            return Ok(Action::await_change());
        }
        let tenancy = Tenancy {
            partition: partition.clone(),
            namespace: id.name.clone(),
        };
        let mut remaining = 0usize;
        for registration in self
            .registry
            .types()
            .filter(|r| r.scope == Scope::Namespace)
        {
            let listed = runtime.list(&registration.resource_type, &tenancy).await?;
            for inside in listed {
                remaining += 1;
                if !resource::is_marked_for_deletion(&inside)
                    && let Some(inside_id) = &inside.id
                {
                    runtime.delete(inside_id).await?;
                }
            }
        }
        if remaining > 0 {
            return Ok(Action::requeue(Duration::from_millis(200)));
        }
        if resource::has_finalizer(&namespace, NAMESPACE_FINALIZER) {
            let mut released = namespace.clone();
            resource::remove_finalizer(&mut released, NAMESPACE_FINALIZER);
            runtime.write(released).await?;
            runtime.events().normal(
                &namespace,
                "Emptied",
                format!(
                    "every object in namespace {}/{} is deleted; the namespace is released",
                    partition, id.name
                ),
            );
        }
        Ok(Action::await_change())
    }
}

/// Holds a finalizer on every registered Type (DESIGN §15); when one is marked for deletion
/// (writes of its type are refused from then on), deletes every resource of its type, then
/// releases the finalizer, and with it the Type and its registration.
#[derive(Default)]
pub(crate) struct TypeController {
    /// Passes that found no resource of a Type being deleted, per Type uid.
    empty_passes: Mutex<HashMap<String, u32>>,
    /// When each Type's last migration pass ran, per Type uid: passes keep their pace even when
    /// the pass's own status write brings the Type back at once.
    last_pass: Mutex<HashMap<String, tokio::time::Instant>>,
    /// Objects a Type's migration could not convert, per Type uid and generation: later passes
    /// go past them (a Type change tries them again).
    failing: Mutex<HashMap<String, (std::collections::HashSet<String>, String)>>,
}

impl TypeController {
    fn empty_passes(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.empty_passes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl Reconciler<InProcess> for TypeController {
    async fn reconcile(
        &self,
        runtime: &Runtime,
        request: Request,
    ) -> Result<Action, ReconcileError> {
        use crate::registry::builtin::TYPE_FINALIZER;
        let Some(stored) = runtime.read(&request.id).await? else {
            return Ok(Action::await_change());
        };
        if !resource::is_marked_for_deletion(&stored) {
            if !resource::has_finalizer(&stored, TYPE_FINALIZER) {
                let mut held = stored.clone();
                resource::add_finalizer(&mut held, TYPE_FINALIZER);
                runtime.write(held).await?;
                // The write brings this Type back here, held.
                return Ok(Action::await_change());
            }
            return self.migrate(runtime, &request, &stored).await;
        }
        let Ok(t) = decode_data::<proto::registry::v1::Type>(&stored) else {
            return Ok(Action::await_change());
        };
        let wildcard = resource::WILDCARD.to_owned();
        let tenancy = match crate::registry::dynamic::scope_of(t.scope) {
            Some(Scope::Namespace) => Tenancy {
                partition: wildcard.clone(),
                namespace: wildcard,
            },
            Some(Scope::Partition) => Tenancy {
                partition: wildcard,
                namespace: String::new(),
            },
            _ => Tenancy::default(),
        };
        // A Type that registered nothing here (it never loaded, or another Type owns its
        // group.version.Kind) has no resources of its own to delete. Its objects are listed
        // (and deleted) through one served version, whatever version each is stored in.
        let family = crate::registry::versions::Family::load_any(&t).ok();
        let loads = family.is_some();
        // The storage version when it is served: what is stored there is listed as it is, with
        // no conversion to spend a List's budget on.
        let served = family
            .as_ref()
            .and_then(|family| {
                family
                    .served()
                    .find(|v| v.name == family.storage)
                    .or_else(|| family.served().next())
                    .map(|v| v.name.clone())
            })
            .unwrap_or_else(|| t.group_version.clone());
        let resource_type = resource::new_type(&t.group, &served, &t.kind);
        runtime.api().service.know_type(Some(&resource_type)).await;
        let owner = runtime
            .api()
            .service
            .registry()
            .resolve(&resource_type)
            .and_then(|registration| registration.registered.as_ref().map(|i| i.name.clone()));
        if loads && owner.is_none() {
            // This node's registry has not loaded it yet (just started): wait for it rather
            // than release a Type whose resources may exist.
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        let owns = owner.is_some_and(|owner| owner == request.id.name);
        let listed = if !owns {
            Vec::new()
        } else {
            runtime.list(&resource_type, &tenancy).await?
        };
        let remaining = listed.len();
        for inside in listed {
            if !resource::is_marked_for_deletion(&inside)
                && let Some(inside_id) = &inside.id
            {
                runtime.delete(inside_id).await?;
            }
        }
        let uid = stored
            .id
            .as_ref()
            .map(|id| id.uid.clone())
            .unwrap_or_default();
        if remaining > 0 {
            self.empty_passes().remove(&uid);
            return Ok(Action::requeue(Duration::from_millis(200)));
        }
        // One more pass a second later: a node whose registry had not yet seen the deletion
        // may have accepted a last write of the type meanwhile.
        let passes = {
            let mut passes = self.empty_passes();
            let count = passes.entry(uid.clone()).or_insert(0);
            *count += 1;
            *count
        };
        if passes < 2 {
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        self.empty_passes().remove(&uid);
        // The reaper still cascading from one of its resources (a tombstone names it) needs the
        // type registered: what those resources owned is written, to release finalizers, with
        // its owner reference.
        let tombstones = runtime
            .list(&resource::new_type("internal", "v1", "Tombstone"), &tenancy)
            .await?;
        let cascading = tombstones.iter().any(|tombstone| {
            decode_data::<Tombstone>(tombstone)
                .ok()
                .and_then(|t| t.owner)
                .and_then(|owner| owner.r#type)
                .is_some_and(|t| t.group == resource_type.group && t.kind == resource_type.kind)
        });
        if cascading {
            return Ok(Action::requeue(Duration::from_millis(200)));
        }
        if resource::has_finalizer(&stored, TYPE_FINALIZER) {
            let mut released = stored.clone();
            resource::remove_finalizer(&mut released, TYPE_FINALIZER);
            runtime.write(released).await?;
            runtime.events().normal(
                &stored,
                "TypeDeleted",
                format!(
                    "every {} is deleted; the Type is released and its registration removed",
                    resource::gvk(&resource_type)
                ),
            );
        }
        Ok(Action::await_change())
    }
}

/// Objects one migration pass rewrites at most; passes follow each other
/// [`MIGRATION_PAUSE`] apart, which bounds the rate a migration adds to the cluster's writes.
const MIGRATION_PASS: usize = 512;
const MIGRATION_PAUSE: Duration = Duration::from_millis(100);

/// One pass of a multi-version Type's migration to its storage version, and its progress as
/// the Type's `migration` status: condition `Migrated`, TRUE once nothing is stored in another
/// version, with `migrated=N remaining=M`.
impl TypeController {
    async fn migrate(
        &self,
        runtime: &Runtime,
        request: &Request,
        stored: &Resource,
    ) -> Result<Action, ReconcileError> {
        let uid = stored
            .id
            .as_ref()
            .map(|id| id.uid.clone())
            .unwrap_or_default();
        let since = self
            .last_pass
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&uid)
            .map(|at| at.elapsed());
        if let Some(since) = since
            && since < MIGRATION_PAUSE
        {
            return Ok(Action::requeue(MIGRATION_PAUSE - since));
        }
        let service = &runtime.api().service;
        let failing_key = format!("{uid}/{}", stored.generation);
        let (skip, first_failure) = self
            .failing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&failing_key)
            .cloned()
            .unwrap_or_default();
        let Some(pass) = service
            .migrate_pass(&request.id.name, MIGRATION_PASS, &skip)
            .await
            .map_err(|error| ReconcileError(error.to_string()))?
        else {
            return Ok(Action::await_change());
        };
        let done = pass.remaining == 0;
        // Only objects that do not convert are left (this pass's and the earlier ones').
        let only_failing = !done && pass.remaining as usize <= skip.len() + pass.failing.len();
        let failure = pass
            .failed
            .clone()
            .or_else(|| (!first_failure.is_empty()).then(|| first_failure.clone()));
        {
            let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
            // Another generation of this Type: its failures are tried again.
            let this_type = format!("{uid}/");
            failing.retain(|key, _| !key.starts_with(&this_type) || *key == failing_key);
            if done {
                failing.remove(&failing_key);
            } else if !pass.failing.is_empty() {
                let entry = failing.entry(failing_key.clone()).or_default();
                entry.0.extend(pass.failing.iter().cloned());
                if entry.1.is_empty() {
                    entry.1 = pass.failed.clone().unwrap_or_default();
                }
            }
        }
        {
            let mut last = self.last_pass.lock().unwrap_or_else(|p| p.into_inner());
            if done {
                last.remove(&uid);
            } else {
                last.insert(uid.clone(), tokio::time::Instant::now());
            }
        }
        let condition = Condition {
            r#type: "Migrated".into(),
            state: if done { State::True } else { State::False } as i32,
            reason: match (&failure, done) {
                (_, true) => "Migrated".into(),
                (Some(_), false) => "ConversionFailed".into(),
                (None, false) => "Migrating".into(),
            },
            message: match &failure {
                Some(why) if !done => format!(
                    "migrated={} remaining={}; cannot convert {why}",
                    pass.migrated, pass.remaining
                ),
                _ => format!("migrated={} remaining={}", pass.migrated, pass.remaining),
            },
            resource: None,
        };
        let status = Status {
            observed_generation: stored.generation.clone(),
            conditions: vec![condition],
            updated_at: None,
        };
        let changed = runtime
            .write_status_if_changed(stored, MIGRATION_STATUS, status)
            .await?;
        if done && changed && pass.migrated > 0 {
            runtime.events().normal(
                stored,
                "Migrated",
                format!(
                    "{} objects rewritten in the storage version; every object is stored in it now",
                    pass.migrated
                ),
            );
        }
        if done {
            tracing::info!(r#type = %request.id.name, migrated = pass.migrated, "storage-version migration complete");
            Ok(Action::await_change())
        } else if only_failing {
            // Only objects that do not convert are left: try them again later (a Type change
            // tries them at once).
            self.failing
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&failing_key);
            Ok(Action::requeue(Duration::from_secs(30)))
        } else {
            // Objects that do not convert stay where they are; the others go on at the pace.
            Ok(Action::requeue(MIGRATION_PAUSE))
        }
    }
}

/// The admission-policy controller's name, and the status key it writes.
pub(crate) const POLICY_CONTROLLER: &str = "admission-policies";
pub(crate) const POLICY_STATUS: &str = "admission";
/// How often a policy's params are looked for again (they may be written later).
const PARAMS_RECHECK: Duration = Duration::from_secs(10);

/// Says in each admission policy's status (key `admission`, condition `Ready`) whether it can
/// run: its params exist (DESIGN §17). A DENY policy whose params are missing refuses what it
/// matches, a WARN or AUDIT one lets it through: the status says which.
pub(crate) struct PolicyController;

#[async_trait]
impl Reconciler<InProcess> for PolicyController {
    async fn reconcile(
        &self,
        runtime: &Runtime,
        request: Request,
    ) -> Result<Action, ReconcileError> {
        let Some(stored) = runtime.read(&request.id).await? else {
            return Ok(Action::await_change());
        };
        let policy: proto::policy::v1::AdmissionPolicy = match decode_data(&stored) {
            Ok(policy) => policy,
            Err(_) => return Ok(Action::await_change()),
        };
        let deny = policy.action == proto::policy::v1::Action::Deny as i32;
        let (ready, reason, message) = match &policy.params {
            None => (true, "Ready", "the policy takes no params".to_owned()),
            Some(params) => match runtime.read(params).await {
                Ok(Some(_)) => (
                    true,
                    "Ready",
                    format!("its params {} exist", DisplayId(params)),
                ),
                Ok(None) => (
                    false,
                    "ParamsMissing",
                    format!(
                        "its params {} do not exist: {}",
                        DisplayId(params),
                        if deny {
                            "it refuses everything it matches until they do"
                        } else {
                            "it lets everything through until they do"
                        }
                    ),
                ),
                Err(error) => (
                    false,
                    "ParamsUnreadable",
                    format!("its params cannot be read: {error}"),
                ),
            },
        };
        let status = Status {
            observed_generation: stored.generation.clone(),
            conditions: vec![Condition {
                r#type: "Ready".into(),
                state: if ready { State::True } else { State::False } as i32,
                reason: reason.into(),
                message,
                resource: None,
            }],
            updated_at: None,
        };
        runtime
            .write_status_if_changed(&stored, POLICY_STATUS, status)
            .await?;
        Ok(if policy.params.is_some() {
            Action::requeue(PARAMS_RECHECK)
        } else {
            Action::await_change()
        })
    }
}

/// Deletes the reports of replicas outside the server that stopped reporting (killed, not
/// stopped cleanly): a report whose version has not changed for ten of its periods, timed on
/// this node's clock from when it first saw that version (clocks are never compared).
#[derive(Default)]
pub(crate) struct ReplicaReports {
    /// Report uid -> (version, when this node first saw it).
    seen: Mutex<HashMap<String, (String, tokio::time::Instant)>>,
}

/// How many report periods without a change make a report gone.
const REPORT_PERIODS_TO_FORGET: u32 = 10;

#[async_trait]
impl Reconciler<InProcess> for ReplicaReports {
    async fn reconcile(
        &self,
        runtime: &Runtime,
        request: Request,
    ) -> Result<Action, ReconcileError> {
        let Some(report) = runtime.read(&request.id).await? else {
            return Ok(Action::await_change());
        };
        let id = report.id.clone().unwrap_or_default();
        let every = decode_data::<proto::coordination::v1::Replica>(&report)
            .map(|r| {
                Duration::from_secs(u64::from(
                    r.report_every_seconds
                        .clamp(1, crate::registry::builtin::MAX_REPORT_EVERY_SECONDS),
                ))
            })
            .unwrap_or(Duration::from_secs(5));
        let forget_after = every * REPORT_PERIODS_TO_FORGET;
        let now = tokio::time::Instant::now();
        let first_seen = {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            let entry = seen
                .entry(id.uid.clone())
                .or_insert_with(|| (report.version.clone(), now));
            if entry.0 != report.version {
                *entry = (report.version.clone(), now);
            }
            entry.1
        };
        let unchanged = now.duration_since(first_seen);
        if unchanged < forget_after {
            return Ok(Action::requeue(forget_after - unchanged));
        }
        tracing::info!(report = %DisplayId(&id), ?unchanged, "a replica outside the server stopped reporting: its report is deleted");
        runtime.delete(&id).await?;
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id.uid);
        Ok(Action::await_change())
    }
}

/// Metadata key marking what a controller generated (and may therefore prune).
pub(crate) const MANAGED_BY_KEY: &str = "managed-by";

fn is_generated(album: &Resource) -> bool {
    album.metadata.get(MANAGED_BY_KEY).map(String::as_str) == Some(ARTIST_CONTROLLER)
}

/// The album names an artist should own: one, plus one per group member (at most five).
fn desired_albums(artist_name: &str, artist: &demo_v2::Artist) -> BTreeMap<String, demo_v2::Album> {
    let count = 1 + artist.group_members.len().min(4);
    let stem: String = artist_name
        .chars()
        .take(55)
        .collect::<String>()
        .trim_end_matches('-')
        .to_owned();
    (1..=count)
        .map(|index| {
            (
                format!("{stem}-album-{index}"),
                demo_v2::Album {
                    name: format!("{} Vol. {index}", artist.name),
                    year_of_release: 1955 + index as i32,
                    critically_acclaimed: index == 1,
                    tracks: Vec::new(),
                },
            )
        })
        .collect()
}

/// Keeps the albums an artist should own (derived from its data) and reports `Accepted`.
pub(crate) struct ArtistController;

#[async_trait]
impl Reconciler<InProcess> for ArtistController {
    async fn reconcile(
        &self,
        runtime: &Runtime,
        request: Request,
    ) -> Result<Action, ReconcileError> {
        let Some(artist) = runtime.read(&request.id).await? else {
            return Ok(Action::await_change());
        };
        if resource::is_marked_for_deletion(&artist) {
            return Ok(Action::await_change());
        }
        let artist_id = artist.id.clone().unwrap_or_default();
        let data: demo_v2::Artist = decode_data(&artist).map_err(ReconcileError)?;
        let desired = desired_albums(&artist_id.name, &data);
        let owned: Vec<Resource> = runtime
            .list_by_owner(&artist_id)
            .await?
            .into_iter()
            .filter(|r| {
                r.id.as_ref()
                    .and_then(|id| id.r#type.as_ref())
                    .is_some_and(|t| t.kind == "Album")
            })
            .collect();
        // Albums that users wrote under the artist are theirs; only generated ones are pruned.
        for album in owned.iter().filter(|album| is_generated(album)) {
            let album_id = album.id.clone().unwrap_or_default();
            if !desired.contains_key(&album_id.name) && !resource::is_marked_for_deletion(album) {
                runtime.delete(&album_id).await?;
            }
        }
        for (name, album) in &desired {
            if owned
                .iter()
                .any(|r| r.id.as_ref().is_some_and(|id| &id.name == name))
            {
                continue;
            }
            let album_resource = Resource {
                id: Some(Id {
                    uid: String::new(),
                    name: name.clone(),
                    r#type: Some(resource::new_type("demo", "v2", "Album")),
                    tenancy: artist_id.tenancy.clone(),
                }),
                owner: Some(artist_id.clone()),
                data: Some(proto::to_any(album)),
                metadata: [(MANAGED_BY_KEY.to_owned(), ARTIST_CONTROLLER.to_owned())].into(),
                ..Default::default()
            };
            runtime.write(album_resource).await?;
        }
        let status = Status {
            observed_generation: artist.generation.clone(),
            conditions: vec![condition(
                "Accepted",
                State::True,
                "AlbumsReconciled",
                match desired.len() {
                    1 => "1 album".to_owned(),
                    n => format!("{n} albums"),
                },
            )],
            updated_at: None,
        };
        if runtime
            .write_status_if_changed(&artist, ARTIST_STATUS, status)
            .await?
        {
            runtime.events().normal(
                &artist,
                "AlbumsReconciled",
                format!(
                    "generation {} has {} generated album(s)",
                    artist.generation,
                    desired.len()
                ),
            );
        }
        Ok(Action::await_change())
    }
}

/// Holds a finalizer on every album and releases it after a cleanup step when the album is
/// deleted, so finalizer flows are visible.
pub(crate) struct AlbumController;

#[async_trait]
impl Reconciler<InProcess> for AlbumController {
    async fn reconcile(
        &self,
        runtime: &Runtime,
        request: Request,
    ) -> Result<Action, ReconcileError> {
        let Some(album) = runtime.read(&request.id).await? else {
            return Ok(Action::await_change());
        };
        if !resource::is_marked_for_deletion(&album) {
            if !resource::has_finalizer(&album, ALBUM_FINALIZER) {
                let mut held = album.clone();
                resource::add_finalizer(&mut held, ALBUM_FINALIZER);
                runtime.write(held).await?;
            }
            return Ok(Action::await_change());
        }
        if !resource::has_finalizer(&album, ALBUM_FINALIZER) {
            return Ok(Action::await_change());
        }
        // The cleanup step: record it, then let the album go.
        let status = Status {
            observed_generation: album.generation.clone(),
            conditions: vec![condition(
                "CleanedUp",
                State::True,
                "FinalizerReleased",
                "the album's cleanup ran".into(),
            )],
            updated_at: None,
        };
        runtime
            .write_status_if_changed(&album, ALBUM_STATUS, status)
            .await?;
        let Some(current) = runtime.read(&request.id).await? else {
            return Ok(Action::await_change());
        };
        let mut released = current.clone();
        resource::remove_finalizer(&mut released, ALBUM_FINALIZER);
        runtime.write(released).await?;
        Ok(Action::await_change())
    }
}

/// Runs on every server (placed on each replica) and only observes: it counts the concepts this
/// node has seen, so placement across nodes is visible in `ListControllers`.
#[derive(Default)]
pub(crate) struct ConceptObserver {
    seen: Mutex<std::collections::HashSet<String>>,
}

#[async_trait]
impl Reconciler<InProcess> for ConceptObserver {
    async fn reconcile(
        &self,
        runtime: &Runtime,
        request: Request,
    ) -> Result<Action, ReconcileError> {
        let exists = runtime.read(&request.id).await?.is_some();
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let key = DisplayId(&request.id).to_string();
        if exists {
            seen.insert(key);
        } else {
            seen.remove(&key);
        }
        tracing::debug!(concepts = seen.len(), "concepts observed on this node");
        Ok(Action::await_change())
    }
}
