//! A plan before a change (DESIGN §15.1): `PlanType` checks a proposed Type against every
//! stored object of its kind — converted to the proposed storage version and to each served
//! version and back, its defaults, each rule of each version — and lists the objects that
//! would fail and why, changing nothing. Objects are read a page at a time (bounded memory
//! whatever their number) and checked on the rule pool.

use std::ops::ControlFlow;
use std::sync::Arc;

use proto::cluster::v1::{PlanFailure, PlanTypeResponse};
use proto::resource::v1::{MutateAndValidateRequest, Resource};

use super::{Error, ResourceService, convert};
use crate::acl::Authorizer;
use crate::registry::cel::{self, Meter};
use crate::registry::decode_data;
use crate::registry::dynamic::RuleFailure;
use crate::registry::versions::Family;
use crate::resource;
use crate::storage::{Consistency, StorageKey, UnversionedType};

/// Objects read (and checked) at a time.
pub(super) const PAGE: usize = 512;
/// Failures an answer lists; the rest are counted.
pub(crate) const MAX_PLAN_FAILURES: usize = 1000;

/// Collects one page of encodings.
pub(super) struct Page {
    pub(super) items: Vec<Vec<u8>>,
}

impl crate::storage::EncodedSink for Page {
    fn take(&mut self, encoded: &[u8]) -> ControlFlow<()> {
        self.items.push(encoded.to_vec());
        if self.items.len() >= PAGE {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }
}

impl ResourceService {
    /// Plans the Type `proposed` (a `registry.v1.Type` resource as it would be written):
    /// refused as its write would be (compile, claims, compatibility, access), else every
    /// stored object of its kind checked against it.
    pub(crate) async fn plan_type(
        &self,
        authorizer: &dyn Authorizer,
        proposed: Option<Resource>,
    ) -> Result<PlanTypeResponse, Error> {
        let proposed = proposed.ok_or_else(|| Error::invalid("type is required"))?;
        let is_type = proposed
            .id
            .as_ref()
            .and_then(|id| id.r#type.as_ref())
            .is_some_and(|t| resource::gvk(t) == crate::registry::builtin::REGISTRY_TYPE);
        if !is_type {
            return Err(Error::invalid(format!(
                "type must be a {} resource",
                crate::registry::builtin::REGISTRY_TYPE
            )));
        }
        // Every check of writing it, the write excepted: the compiled Type comes back.
        let checked = self
            .mutate_and_validate(
                authorizer,
                MutateAndValidateRequest {
                    resource: Some(proposed),
                },
            )
            .await?
            .resource
            .unwrap_or_default();
        let t: proto::registry::v1::Type = decode_data(&checked).map_err(Error::InvalidArgument)?;
        let family = self
            .pool
            .run(move || Family::load_any(&t))
            .await
            .map_err(|error| Error::Internal(error.to_string()))?
            .map_err(|why| Error::InvalidArgument(format!("resource.{why}")))?;
        let mut plan = self.scan(Arc::new(family), Checks::All, usize::MAX).await?;
        // Writing a Type does not let its owner read every object of the kind: one it may not
        // read is counted, not named (nor its namespace, nor what it holds).
        for failure in &mut plan.failures {
            let readable = failure.id.as_ref().is_some_and(|id| {
                crate::acl::require_resource(authorizer, id, crate::acl::Access::Read).is_ok()
            });
            if !readable {
                failure.id = None;
                failure.message = "an object this token may not read would fail: ask someone who may read the kind everywhere to run the plan for its name and why".into();
            }
        }
        Ok(plan)
    }

    /// Whether every stored object of the kind survives `family`'s conversions — to its
    /// storage version, and to each served version and back (DESIGN §15.1: a Type whose
    /// versions do not round-trip on the stored objects is refused, naming the object and the
    /// field). Rules are not checked: stored objects keep the rules they were written under.
    pub(super) async fn check_stored_round_trips(&self, family: Arc<Family>) -> Result<(), Error> {
        let scanned = self.scan(family, Checks::Conversions, 1).await?;
        match scanned.failures.first() {
            None => Ok(()),
            Some(failure) => Err(Error::invalid(format!(
                "resource.data: the stored object {} would not survive this Type: {}; change the conversions (`resctl type plan -f FILE` lists every object)",
                resource::DisplayId(failure.id.as_ref().unwrap_or(&Default::default())),
                failure.message
            ))),
        }
    }

    /// Checks every stored object of `family`'s kind, a page at a time on the rule pool; stops
    /// once `stop_after` failures are found.
    async fn scan(
        &self,
        family: Arc<Family>,
        checks: Checks,
        stop_after: usize,
    ) -> Result<PlanTypeResponse, Error> {
        let storage = family.storage_version();
        let storage_type = storage.compiled.resource_type.clone();
        let everywhere = super::migrate::every_tenancy(storage.compiled.scope);
        let mut answer = PlanTypeResponse {
            storage_version: family.storage.clone(),
            ..Default::default()
        };
        let mut after: Option<StorageKey> = None;
        loop {
            let mut page = Page { items: Vec::new() };
            self.backend
                .list_encoded(
                    Consistency::Strong,
                    &UnversionedType::of(&storage_type),
                    &everywhere,
                    "",
                    after.as_ref(),
                    &mut page,
                )
                .await?;
            let full = page.items.len() >= PAGE;
            let family = family.clone();
            let checked_page = self
                .pool
                .run(move || check_page(&family, page.items, checks))
                .await
                .map_err(|error| Error::Internal(error.to_string()))??;
            answer.checked += checked_page.checked;
            answer.to_migrate += checked_page.to_migrate;
            for failure in checked_page.failures {
                if answer.failures.len() < MAX_PLAN_FAILURES {
                    answer.failures.push(failure);
                } else {
                    answer.omitted += 1;
                }
            }
            if answer.failures.len() >= stop_after {
                break;
            }
            match (full, checked_page.last) {
                (true, Some(last)) => after = Some(last),
                _ => break,
            }
        }
        Ok(answer)
    }
}

/// What a scan checks of each object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Checks {
    /// Conversions, defaults and rules (a plan).
    All,
    /// Conversions and round trips only (a Type being written).
    Conversions,
}

/// What one page came to.
struct CheckedPage {
    checked: u64,
    to_migrate: u64,
    failures: Vec<PlanFailure>,
    last: Option<StorageKey>,
}

fn check_page(family: &Family, items: Vec<Vec<u8>>, checks: Checks) -> Result<CheckedPage, Error> {
    let mut page = CheckedPage {
        checked: 0,
        to_migrate: 0,
        failures: Vec::new(),
        last: None,
    };
    for bytes in items {
        let stored = <Resource as prost::Message>::decode(bytes.as_slice())
            .map_err(crate::storage::undecodable)
            .map_err(Error::from)?;
        let id = stored.id.clone().unwrap_or_default();
        page.last = Some(StorageKey::of(&id));
        page.checked += 1;
        if convert::group_version_of(&stored) != family.storage {
            page.to_migrate += 1;
        }
        if let Some(message) = check_object(family, stored, checks) {
            page.failures.push(PlanFailure {
                id: Some(id),
                message,
            });
        }
    }
    Ok(page)
}

/// Why `stored` would fail under `family`, if it would: it must convert to the storage
/// version, take its defaults and pass its rules there; and in every served version it must
/// convert, pass that version's rules and come back unchanged.
fn check_object(family: &Family, stored: Resource, checks: Checks) -> Option<String> {
    let rules = checks == Checks::All;
    let from = convert::group_version_of(&stored).to_owned();
    if family.version(&from).is_none() {
        return Some(format!(
            "stored in version {from}, which the proposed Type does not have: it could be neither read nor migrated"
        ));
    }
    let original = stored
        .data
        .as_ref()
        .map(|d| d.value.clone())
        .unwrap_or_default();
    let in_storage = match convert::convert(family, stored, &family.storage, None) {
        Ok(converted) => converted,
        Err(error) => return Some(error.to_string()),
    };
    let decode_as = |version: &str, bytes: &[u8]| {
        family.version(version).and_then(|v| {
            prost_reflect::DynamicMessage::decode(v.compiled.message.clone(), bytes).ok()
        })
    };
    // Stored in another version: it survives the migration and reads back as it is.
    if from != family.storage {
        let mut meter = Meter::new(cel::REQUEST_BUDGET);
        let stored_data = in_storage
            .data
            .as_ref()
            .map(|d| d.value.clone())
            .unwrap_or_default();
        match family.convert(&stored_data, &family.storage, &from, None, &mut meter) {
            Err(error) => return Some(format!("back to {from}: {error}")),
            Ok(back) => {
                if let (Some(a), Some(b)) = (decode_as(&from, &original), decode_as(&from, &back))
                    && let Some(field) = crate::registry::versions::first_difference(&a, &b)
                {
                    return Some(format!(
                        "field {field} (stored in {from}) does not survive {from} → {} → {from}",
                        family.storage
                    ));
                }
            }
        }
    }
    let storage = family.storage_version();
    let mut data = in_storage
        .data
        .as_ref()
        .map(|d| d.value.clone())
        .unwrap_or_default();
    if rules {
        match storage.compiled.apply_defaults(&data) {
            Ok(Some(with_defaults)) => data = with_defaults,
            Ok(None) => {}
            Err(why) => return Some(format!("the defaults of {}: {why}", storage.name)),
        }
        let mut meter = Meter::new(cel::REQUEST_BUDGET);
        if let Some(why) = rules_fail(&storage.compiled, &data, &mut meter) {
            return Some(format!("a rule of {}: {why}", storage.name));
        }
    }
    for version in family.served() {
        if version.name == family.storage {
            continue;
        }
        let mut meter = Meter::new(cel::REQUEST_BUDGET);
        let there = match family.convert(&data, &family.storage, &version.name, None, &mut meter) {
            Ok(there) => there,
            Err(error) => return Some(format!("as {}: {error}", version.name)),
        };
        if rules && let Some(why) = rules_fail(&version.compiled, &there, &mut meter) {
            return Some(format!("a rule of {}: {why}", version.name));
        }
        // An update through this version keeps every field of the stored object it does not
        // change: storage → served → storage (the write keeping what the version cannot set).
        let again = match family.convert(
            &there,
            &version.name,
            &family.storage,
            Some(&data),
            &mut meter,
        ) {
            Ok(again) => again,
            Err(error) => return Some(format!("back from {}: {error}", version.name)),
        };
        if let (Some(a), Some(b)) = (
            decode_as(&family.storage, &data),
            decode_as(&family.storage, &again),
        ) && let Some(field) = crate::registry::versions::first_difference(&a, &b)
        {
            return Some(format!(
                "field {field} does not survive {} → {} → {} (an update through {})",
                family.storage, version.name, family.storage, version.name
            ));
        }
    }
    None
}

/// The rules (without `old`) that `data` breaks, said in one line.
fn rules_fail(
    compiled: &crate::registry::dynamic::CompiledType,
    data: &[u8],
    meter: &mut Meter,
) -> Option<String> {
    match compiled.check_rules(data, None, meter) {
        Ok(()) => None,
        Err(RuleFailure::Violations(violations)) => Some(
            violations
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        ),
        Err(RuleFailure::Cost(why)) => Some(why),
    }
}
