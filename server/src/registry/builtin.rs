//! The built-in types: tombstones, tenancy (partitions and namespaces) and the demo types that
//! mirror Consul's demo package.

use proto::demo::{v1 as demo_v1, v2 as demo_v2};
use proto::internal::v1 as internal_v1;
use proto::resource::v1::{Id, Resource};
use proto::tenancy::v1 as tenancy_v1;

use std::sync::Arc;

use super::{Acls, Registration, Registry, RegistryError, Scope, decode_data};
use crate::acl::{self, Access, AclError, Authorizer};
use crate::resource;

pub const TOMBSTONE: &str = "internal.v1.Tombstone";
pub const PARTITION: &str = "tenancy.v1.Partition";
pub const NAMESPACE: &str = "tenancy.v1.Namespace";

/// Longest tombstone name: `tombstone-` + a resource name + `-` + a 26-character uid.
pub const MAX_TOMBSTONE_NAME_LEN: usize = 10 + resource::MAX_NAME_LEN + 1 + 26;

pub fn register(registry: &mut Registry) -> Result<(), RegistryError> {
    let mut tombstone = Registration::new::<internal_v1::Tombstone>(TOMBSTONE, Scope::Any);
    tombstone.max_name_len = MAX_TOMBSTONE_NAME_LEN;
    tombstone.server_written = true;
    registry.register(tombstone)?;

    registry.register(Registration::new::<tenancy_v1::Partition>(
        PARTITION,
        Scope::Cluster,
    ))?;
    registry.register(Registration::new::<tenancy_v1::Namespace>(
        NAMESPACE,
        Scope::Partition,
    ))?;

    registry.register(
        Registration::new::<demo_v2::Artist>("demo.v2.Artist", Scope::Namespace)
            .with_acls(demo_acls(false))
            .with_validate(validate_artist_v2)
            .with_mutate(mutate_artist_v2),
    )?;
    registry.register(
        Registration::new::<demo_v2::Album>("demo.v2.Album", Scope::Namespace)
            .with_acls(demo_acls(false)),
    )?;
    registry.register(
        Registration::new::<demo_v1::Artist>("demo.v1.Artist", Scope::Namespace)
            .with_acls(demo_acls(false)),
    )?;
    registry.register(
        Registration::new::<demo_v1::Album>("demo.v1.Album", Scope::Namespace)
            .with_acls(demo_acls(false)),
    )?;
    registry.register(
        Registration::new::<demo_v1::Concept>("demo.v1.Concept", Scope::Namespace)
            .with_acls(demo_acls(false)),
    )?;
    registry.register(
        Registration::new::<demo_v1::RecordLabel>("demo.v1.RecordLabel", Scope::Partition)
            .with_acls(demo_acls(true)),
    )?;
    registry.register(
        Registration::new::<demo_v1::Executive>("demo.v1.Executive", Scope::Cluster)
            .with_acls(demo_acls(false)),
    )?;
    Ok(())
}

/// The id of the tombstone that records the deletion of `deleted`.
pub fn tombstone_id(deleted: &Id) -> Id {
    Id {
        uid: String::new(),
        name: format!("tombstone-{}-{}", deleted.name, deleted.uid.to_lowercase()),
        r#type: Some(resource::new_type("internal", "v1", "Tombstone")),
        tenancy: deleted.tenancy.clone(),
    }
}

pub fn partition_id(name: &str) -> Id {
    Id {
        uid: String::new(),
        name: name.to_owned(),
        r#type: Some(resource::new_type("tenancy", "v1", "Partition")),
        tenancy: Some(Default::default()),
    }
}

pub fn namespace_id(partition: &str, name: &str) -> Id {
    Id {
        uid: String::new(),
        name: name.to_owned(),
        r#type: Some(resource::new_type("tenancy", "v1", "Namespace")),
        tenancy: Some(proto::resource::v1::Tenancy {
            partition: partition.to_owned(),
            namespace: String::new(),
        }),
    }
}

/// The ACL key of a demo resource: `resource/<gvk>/<name>`, as in Consul's demo package.
fn demo_key(id: &Id) -> String {
    let gvk = id.r#type.as_ref().map(resource::gvk).unwrap_or_default();
    format!("resource/{gvk}/{}", id.name)
}

/// Demo ACLs use key rules. With `read_needs_data` (RecordLabel) the Read hook asks for the
/// stored resource before it decides, to exercise that path of the service.
fn demo_acls(read_needs_data: bool) -> Acls {
    Acls {
        read: Arc::new(
            move |authorizer: &dyn Authorizer, id: &Id, stored: Option<&Resource>| {
                if read_needs_data && stored.is_none() {
                    return Err(AclError::NeedResource);
                }
                acl::require_key(authorizer, &demo_key(id), Access::Read)
            },
        ),
        write: Arc::new(|authorizer: &dyn Authorizer, resource: &Resource| {
            let id = resource.id.clone().unwrap_or_default();
            acl::require_key(authorizer, &demo_key(&id), Access::Write)
        }),
        list: Arc::new(|authorizer: &dyn Authorizer, _tenancy| {
            acl::require_key(authorizer, "resource/", Access::List)
        }),
    }
}

fn validate_artist_v2(resource: &Resource) -> Result<(), String> {
    let artist: demo_v2::Artist = decode_data(resource)?;
    let mut violations = Vec::new();
    if artist.name.is_empty() {
        violations.push("resource.data.name is required".to_owned());
    }
    for (member, role) in &artist.group_members {
        if member.is_empty() {
            violations.push(format!(
                "resource.data.group_members has an empty member name (role {role:?})"
            ));
        }
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(violations.join("; "))
    }
}

fn mutate_artist_v2(resource: &mut Resource) -> Result<(), String> {
    let Some(data) = &resource.data else {
        return Ok(());
    };
    let mut artist: demo_v2::Artist = decode_data(resource)?;
    if artist.genre == demo_v2::Genre::Unspecified as i32 {
        artist.genre = demo_v2::Genre::Disco as i32;
        resource.data = Some(prost_types::Any {
            type_url: data.type_url.clone(),
            value: prost::Message::encode_to_vec(&artist),
        });
    }
    Ok(())
}
