//! Checks on finished resources that reach storage without passing through Write: changes a
//! peer forwarded ([`ForwardAdmission`]) and the records of a restored snapshot
//! ([`check_record`]). The rules are Write's, applied to the result of a write rather than to a
//! request: nothing is defaulted or mutated here, what is wrong is refused.

use std::sync::Arc;

use async_trait::async_trait;
use proto::resource::v1::Resource;

use super::ResourceService;
use super::validate::{self, Wildcards};
use crate::registry::{Registration, Registry};
use crate::resource::Invalid;
use crate::storage::{Admission, StorageError, check};

/// Whether `resource`, as it would be stored, satisfies what Write enforces on its way in:
/// storable (names, uid, keys, at most `max_resource_bytes`), a registered type, a tenancy
/// complete for the type's scope, data of the registered message, and the type's validation.
/// Types the server writes itself (tombstones) are accepted: peers and snapshots carry them.
/// A check below the service: what it refuses is typed violations ([`StorageError::Invalid`]),
/// which the service that sent the change answers its caller with, field by field.
pub(super) fn check_record(
    registry: &Registry,
    max_resource_bytes: usize,
    resource: &Resource,
) -> Result<Arc<Registration>, StorageError> {
    check::check_storable(resource, max_resource_bytes)?;
    validate::check_resource_ids(resource, registry)?;
    let id = resource.id.clone().unwrap_or_default();
    let resource_type = id.r#type.clone().unwrap_or_default();
    let registration = registry.resolve_stored(&resource_type).ok_or_else(|| {
        Invalid::at(
            "resource.id.type",
            format!(
                "resource.id.type {} is not registered on this server",
                crate::resource::gvk(&resource_type)
            ),
        )
    })?;
    let stored = id.tenancy.clone().unwrap_or_default();
    let mut complete = stored.clone();
    validate::apply_scope(
        "resource.id.tenancy",
        &registration.gvk(),
        registration.scope,
        &mut complete,
        Wildcards::Forbidden,
    )?;
    if complete != stored {
        return Err(Invalid::at(
            "resource.id.tenancy",
            format!(
                "resource.id.tenancy {{partition: {:?}, namespace: {:?}}} is incomplete for {} scope {}",
                stored.partition,
                stored.namespace,
                registration.scope.name(),
                registration.gvk()
            ),
        )
        .into());
    }
    if let Some(data) = &resource.data {
        registration
            .check_data(data)
            .map_err(|why| Invalid::at("resource.data", why))?;
    }
    // A registered type's rules are checked when a resource is written (DESIGN §15): rules
    // added later do not make stored resources, or a snapshot of them, unacceptable.
    if let Some(validate) = &registration.validate
        && registration.registered.is_none()
    {
        validate(resource)?;
    }
    Ok(registration)
}

/// The resource service's checks for changes forwarded by peers: [`check_record`], then the
/// tenancy must exist (read here, strongly before concluding it is missing).
#[derive(Debug)]
pub(crate) struct ForwardAdmission {
    service: Arc<ResourceService>,
}

impl ForwardAdmission {
    pub(crate) fn new(service: Arc<ResourceService>) -> Self {
        ForwardAdmission { service }
    }
}

#[async_trait]
impl Admission for ForwardAdmission {
    async fn admit(&self, resource: &Resource) -> Result<(), StorageError> {
        // A Type this node has committed but not applied yet: caught up first.
        self.service
            .know_type(resource.id.as_ref().and_then(|id| id.r#type.as_ref()))
            .await;
        let registration = check_record(
            self.service.registry(),
            self.service.max_resource_bytes(),
            resource,
        )?;
        let tenancy = resource
            .id
            .as_ref()
            .and_then(|id| id.tenancy.clone())
            .unwrap_or_default();
        self.service
            .tenancy_in_storage(registration.scope, &tenancy)
            .await?;
        Ok(())
    }
}
