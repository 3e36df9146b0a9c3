//! Objects in every served version (DESIGN §15.1): what is stored in one version of a
//! multi-version Type is answered in the version asked for, and what is written in a served
//! version is stored in the storage version. One place converts; Read, List, WatchList, Write
//! and WriteStatus call it.

use proto::resource::v1::Resource;

use std::sync::Arc;

use super::Error;
use crate::registry::Registration;
use crate::registry::cel::{self, Meter};
use crate::registry::versions::Family;
use crate::resource::DisplayId;

/// The group version a resource is stored or asked for in.
pub(crate) fn group_version_of(resource: &Resource) -> &str {
    resource
        .id
        .as_ref()
        .and_then(|id| id.r#type.as_ref())
        .map(|t| t.group_version.as_str())
        .unwrap_or_default()
}

/// The family `registration` belongs to, when it converts between versions.
pub(crate) fn family_of(registration: &Registration) -> Option<&Family> {
    registration
        .registered
        .as_ref()
        .map(|installed| installed.family.as_ref())
        .filter(|family| family.converts())
}

/// Whether objects stored in `group_version` are answered, converted, as `registration`'s
/// version (they are versions of one Type).
pub(crate) fn converts_from(registration: &Registration, group_version: &str) -> bool {
    group_version != registration.resource_type.group_version
        && family_of(registration).is_some_and(|family| family.version(group_version).is_some())
}

/// `resource` in version `to` of `family`: its data converted (fields that nothing in
/// `to` sets keep their value in `base`, an object of version `to`), its type and type URL
/// named in `to`. Uid, version, generation, metadata, owner and statuses stay.
pub(crate) fn convert(
    family: &Family,
    resource: Resource,
    to: &str,
    base: Option<&[u8]>,
) -> Result<Resource, Error> {
    convert_metered(
        family,
        resource,
        to,
        base,
        &mut Meter::new(cel::REQUEST_BUDGET),
    )
}

/// [`convert`] charging `meter` (a List charges all its conversions to one).
pub(crate) fn convert_metered(
    family: &Family,
    mut resource: Resource,
    to: &str,
    base: Option<&[u8]>,
    meter: &mut Meter,
) -> Result<Resource, Error> {
    let from = group_version_of(&resource).to_owned();
    if from == to {
        return Ok(resource);
    }
    let target = family
        .version(to)
        .ok_or_else(|| Error::Internal(format!("version {to:?} is not a version of this type")))?;
    if family.version(&from).is_none() {
        return Err(Error::FailedPrecondition(format!(
            "{} is stored in version {from:?}, which its Type no longer has: it cannot be read as {to}",
            DisplayId(resource.id.as_ref().unwrap_or(&Default::default()))
        )));
    }
    if let Some(data) = resource.data.as_mut() {
        let converted = family
            .convert(&data.value, &from, to, base, meter)
            .map_err(|error| {
                Error::FailedPrecondition(format!(
                    "{} (stored in {from}) cannot be converted to {to}: {error}",
                    DisplayId(resource.id.as_ref().unwrap_or(&Default::default()))
                ))
            })?;
        data.value = converted;
        data.type_url = format!(
            "{}{}",
            proto::TYPE_URL_PREFIX,
            target.compiled.message.full_name()
        );
    }
    if let Some(t) = resource.id.as_mut().and_then(|id| id.r#type.as_mut()) {
        t.group_version = to.to_owned();
    }
    Ok(resource)
}

/// A stored `resource` as `registration`'s version asks for it: unchanged when it is stored
/// in that version, converted when it is stored in another version of the same Type, `None`
/// when it is another type's (an object of the same group and kind no version of this Type
/// has).
pub(crate) fn as_requested(
    registration: &Registration,
    resource: Resource,
) -> Result<Option<Resource>, Error> {
    let stored = group_version_of(&resource);
    if stored == registration.resource_type.group_version {
        return Ok(Some(resource));
    }
    match family_of(registration) {
        Some(family) if family.version(stored).is_some() => Ok(Some(convert(
            family,
            resource,
            &registration.resource_type.group_version,
            None,
        )?)),
        _ => Ok(None),
    }
}

/// [`as_requested`] on the rule pool when the Type's conversions are not cheap for this object
/// (a Type's CEL never holds an async worker for long).
pub(crate) async fn as_requested_off_thread(
    pool: &crate::registry::pool::Pool,
    registration: &Arc<Registration>,
    resource: Resource,
) -> Result<Option<Resource>, Error> {
    let bytes = resource.data.as_ref().map_or(0, |d| d.value.len());
    if family_of(registration).is_none_or(|family| family.converts_inline(bytes)) {
        return as_requested(registration, resource);
    }
    let registration = registration.clone();
    pool.run(move || as_requested(&registration, resource))
        .await
        .map_err(|error| Error::Internal(error.to_string()))?
}
