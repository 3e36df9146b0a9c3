//! Checks on finished resources that reach storage without passing through Write: changes a
//! peer forwarded ([`ForwardAdmission`]) and the records of a restored snapshot
//! ([`check_record`]). The rules are Write's, applied to the result of a write rather than to a
//! request: nothing is defaulted or mutated here, what is wrong is refused.

use std::sync::Arc;

use async_trait::async_trait;
use proto::resource::v1::Resource;

use super::validate::{self, Wildcards};
use super::{Error, ResourceService};
use crate::registry::{Registration, Registry};
use crate::storage::{Admission, StorageError, check};

/// Whether `resource`, as it would be stored, satisfies what Write enforces on its way in:
/// storable (names, uid, keys, at most `max_resource_bytes`), a registered type, a tenancy
/// complete for the type's scope, data of the registered message, and the type's validation.
/// Types the server writes itself (tombstones) are accepted: peers and snapshots carry them.
pub(super) fn check_record(
    registry: &Registry,
    max_resource_bytes: usize,
    resource: &Resource,
) -> Result<Arc<Registration>, Error> {
    check::check_storable(resource, max_resource_bytes)?;
    validate::check_resource_ids(resource, registry)?;
    let id = resource.id.clone().unwrap_or_default();
    let resource_type = id.r#type.clone().unwrap_or_default();
    let registration = registry.resolve(&resource_type).ok_or_else(|| {
        Error::invalid(format!(
            "resource.id.type {} is not registered on this server",
            crate::resource::gvk(&resource_type)
        ))
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
        return Err(Error::invalid(format!(
            "resource.id.tenancy {{partition: {:?}, namespace: {:?}}} is incomplete for {} scope {}",
            stored.partition,
            stored.namespace,
            registration.scope.name(),
            registration.gvk()
        )));
    }
    if let Some(data) = &resource.data {
        registration
            .check_data(data)
            .map_err(Error::InvalidArgument)?;
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

/// What a refusal looks like to storage.
fn storage_error(error: Error) -> StorageError {
    match error {
        // Typed: the peer's service answers its client with the same fields.
        Error::BadRequest(violations) => {
            StorageError::Invalid(crate::resource::Invalid(violations.0))
        }
        Error::InvalidArgument(why) | Error::NotFound(why) | Error::UnknownType(why) => {
            StorageError::Rejected(why)
        }
        Error::TenancyNotFound(why) | Error::WriteToMissingTenancy(why) => {
            StorageError::MissingTenancy(why)
        }
        Error::Unavailable(why) | Error::NoQuorum(why) => StorageError::Inconsistent(why),
        Error::CatchingUp(progress) => StorageError::CatchingUp(progress),
        Error::ShuttingDown(why) => StorageError::ShuttingDown(why),
        Error::Damaged(why) => StorageError::Damaged(why),
        Error::Removed(why) => StorageError::Removed(why),
        other => StorageError::Internal(other.to_string()),
    }
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
        )
        .map_err(storage_error)?;
        let tenancy = resource
            .id
            .as_ref()
            .and_then(|id| id.tenancy.clone())
            .unwrap_or_default();
        self.service
            .tenancy_state(registration.scope, &tenancy)
            .await
            .map_err(storage_error)?;
        Ok(())
    }
}
