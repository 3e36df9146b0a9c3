//! A plan before a change (DESIGN §15.1): `PlanType` checks a proposed Type against every
//! stored object of its kind — converted to the proposed storage version and to each served
//! version and back, its defaults, each rule of each version — and lists the objects that
//! would fail and why, changing nothing. Objects are read a page at a time (bounded memory
//! whatever their number) and checked on the rule pool.

use std::ops::ControlFlow;
use std::sync::Arc;

use proto::cluster::v1::{PlanFailure, PlanTypeResponse};
use proto::resource::v1::{MutateAndValidateRequest, Resource, Tenancy};

use super::{Error, ResourceService, convert};
use crate::acl::Authorizer;
use crate::registry::cel::{self, Meter};
use crate::registry::dynamic::RuleFailure;
use crate::registry::versions::Family;
use crate::registry::{Scope, decode_data};
use crate::resource;
use crate::storage::{Consistency, StorageKey, UnversionedType};

/// Objects read (and checked) at a time.
const PAGE: usize = 512;
/// Failures an answer lists; the rest are counted.
pub(crate) const MAX_PLAN_FAILURES: usize = 1000;

/// Collects one page of encodings.
struct Page {
    items: Vec<Vec<u8>>,
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
        let family = Arc::new(family);
        let storage = family.storage_version();
        let storage_type = storage.compiled.resource_type.clone();
        let everywhere = match storage.compiled.scope {
            Scope::Cluster => Tenancy::default(),
            Scope::Partition => Tenancy {
                partition: resource::WILDCARD.into(),
                namespace: String::new(),
            },
            Scope::Namespace | Scope::Any => Tenancy {
                partition: resource::WILDCARD.into(),
                namespace: resource::WILDCARD.into(),
            },
        };
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
                .run(move || check_page(&family, page.items))
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
            match (full, checked_page.last) {
                (true, Some(last)) => after = Some(last),
                _ => break,
            }
        }
        Ok(answer)
    }
}

/// What one page came to.
struct CheckedPage {
    checked: u64,
    to_migrate: u64,
    failures: Vec<PlanFailure>,
    last: Option<StorageKey>,
}

fn check_page(family: &Family, items: Vec<Vec<u8>>) -> Result<CheckedPage, Error> {
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
        if let Some(message) = check_object(family, stored) {
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
fn check_object(family: &Family, stored: Resource) -> Option<String> {
    let from = convert::group_version_of(&stored).to_owned();
    if family.version(&from).is_none() {
        return Some(format!(
            "stored in version {from}, which the proposed Type does not have: it could be neither read nor migrated"
        ));
    }
    let in_storage = match convert::convert(family, stored, &family.storage, None) {
        Ok(converted) => converted,
        Err(error) => return Some(error.to_string()),
    };
    let storage = family.storage_version();
    let mut data = in_storage
        .data
        .as_ref()
        .map(|d| d.value.clone())
        .unwrap_or_default();
    match storage.compiled.apply_defaults(&data) {
        Ok(Some(with_defaults)) => data = with_defaults,
        Ok(None) => {}
        Err(why) => return Some(format!("the defaults of {}: {why}", storage.name)),
    }
    let mut meter = Meter::new(cel::REQUEST_BUDGET);
    if let Some(why) = rules_fail(&storage.compiled, &data, &mut meter) {
        return Some(format!("a rule of {}: {why}", storage.name));
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
        if let Some(why) = rules_fail(&version.compiled, &there, &mut meter) {
            return Some(format!("a rule of {}: {why}", version.name));
        }
        // Served → storage → served keeps every field (what an update through this version
        // does to the object, but for what only newer versions hold, which the write keeps).
        let again = family
            .convert(&there, &version.name, &family.storage, None, &mut meter)
            .and_then(|back| {
                family.convert(&back, &family.storage, &version.name, None, &mut meter)
            });
        let again = match again {
            Ok(again) => again,
            Err(error) => return Some(format!("back from {}: {error}", version.name)),
        };
        let decode = |bytes: &[u8]| {
            prost_reflect::DynamicMessage::decode(version.compiled.message.clone(), bytes).ok()
        };
        if let (Some(a), Some(b)) = (decode(&there), decode(&again))
            && let Some(field) = crate::registry::versions::first_difference(&a, &b)
        {
            return Some(format!(
                "field {field} does not survive {} → {} → {}",
                version.name, family.storage, version.name
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
