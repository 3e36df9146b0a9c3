//! The resd API crate: the protobuf messages and gRPC stubs generated from `proto/`, and the
//! encoded descriptor set for reflection and dynamic (YAML/JSON) clients.
//!
//! Layout, one module per protobuf package:
//! - [`resource::v1`]: the resource model and `ResourceService`;
//! - [`cluster::v1`]: `ClusterService` (type registry publication);
//! - [`raft::v1`]: internal replication and forwarding between servers;
//! - [`acl::v1`]: ACL policies and tokens (data of the `acl.v1` types);
//! - [`tenancy::v1`], [`internal::v1`], [`demo::v1`], [`demo::v2`]: data messages of the built-in
//!   types;
//! - [`meta`]: metadata conventions (finalizers, the deletion mark);
//! - [`snapshot`]: the operator snapshot file format;
//! - [`tls`]: what a failed TLS connection means and what to do about it;
//! - `client` (feature `client`): the typed client (token and consistency metadata, retries
//!   during elections, resumable watches);
//! - `codec` (feature `client`): YAML/JSON ↔ `Resource` for any type the server publishes.

#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "client")]
pub mod codec;
pub mod fence;
pub mod meta;
pub mod reason;
pub mod selector;
pub mod shard;
pub mod snapshot;
pub mod tls;

/// Encoded `google.protobuf.FileDescriptorSet` of every resd `.proto` file and its imports.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/resd_descriptor.bin"));

/// Metadata key of the ACL token.
pub const TOKEN_HEADER: &str = "x-resd-token";
/// Metadata key selecting read consistency; `consistent` asks for a linearizable read.
pub const CONSISTENCY_HEADER: &str = "x-resd-consistency-mode";
/// Response metadata of a default (eventual) read or list answered by a node that knows no
/// leader: why what it answered may be stale.
pub const STALE_HEADER: &str = "x-resd-stale";
/// Initial metadata on an answer in a deprecated version of a type (DESIGN §15.1): the Type's
/// deprecation message, verbatim (non-ASCII escaped as `\u{…}`). Repeatable.
pub const WARNING_HEADER: &str = "x-resd-warning";

/// Metadata key of a fenced write (DESIGN §16): the lease its writer holds
/// ([`fence::LeaseFence`]); HTTP header `X-Resd-Fence`.
pub const FENCE_HEADER: &str = "x-resd-fence";

/// Prefix of `google.protobuf.Any::type_url` for the messages of this crate.
pub const TYPE_URL_PREFIX: &str = "type.googleapis.com/";

/// The standard error model's messages (googleapis `google/rpc`): what `reason` sends beside
/// a status.
#[allow(clippy::all, unused_qualifications)]
pub mod google {
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}

#[allow(clippy::all, unused_qualifications)]
pub mod resource {
    pub mod v1 {
        tonic::include_proto!("resd.resource.v1");
    }
}

#[allow(clippy::all, unused_qualifications)]
pub mod cluster {
    pub mod v1 {
        tonic::include_proto!("resd.cluster.v1");
    }
}

#[allow(clippy::all, unused_qualifications)]
pub mod tenancy {
    pub mod v1 {
        tonic::include_proto!("resd.tenancy.v1");
    }
}

#[allow(clippy::all, unused_qualifications)]
pub mod policy {
    pub mod v1 {
        tonic::include_proto!("resd.policy.v1");
    }
}

#[allow(clippy::all, unused_qualifications)]
pub mod acl {
    pub mod v1 {
        tonic::include_proto!("resd.acl.v1");
    }
}

pub mod registry {
    pub mod v1 {
        tonic::include_proto!("resd.registry.v1");
    }
}

pub mod coordination {
    pub mod v1 {
        tonic::include_proto!("resd.coordination.v1");
    }
}

pub mod events {
    pub mod v1 {
        tonic::include_proto!("resd.events.v1");
    }
}

#[allow(clippy::all, unused_qualifications)]
pub mod internal {
    pub mod v1 {
        tonic::include_proto!("resd.internal.v1");
    }
}

/// Internal: Raft replication and forwarding between servers.
#[allow(clippy::all, unused_qualifications)]
pub mod raft {
    pub mod v1 {
        tonic::include_proto!("resd.raft.v1");
    }
}

#[allow(clippy::all, unused_qualifications)]
pub mod demo {
    pub mod v1 {
        tonic::include_proto!("resd.demo.v1");
    }
    pub mod v2 {
        tonic::include_proto!("resd.demo.v2");
    }
}

/// Packs a message into an `Any` with the standard type URL.
pub fn to_any<M: prost::Name>(message: &M) -> prost_types::Any {
    prost_types::Any {
        type_url: format!("{TYPE_URL_PREFIX}{}", M::full_name()),
        value: prost::Message::encode_to_vec(message),
    }
}

/// A byte count for people: `12.5 MiB`.
pub fn bytes_label(count: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = count as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{count} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Where resctl's contexts file lives (it need not exist): `$RESCTL_CONFIG` if set, else
/// `$XDG_CONFIG_HOME/resctl/contexts.yaml`, else `~/.config/resctl/contexts.yaml`. Shared by
/// resctl and `resd dev`, which writes a context for the cluster it runs.
pub fn contexts_path() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    if let Some(path) = std::env::var_os("RESCTL_CONFIG") {
        return Some(PathBuf::from(path));
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|path| path.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config")))?;
    Some(base.join("resctl").join("contexts.yaml"))
}

#[cfg(test)]
mod tests {
    use prost::Message;

    #[test]
    fn descriptor_set_holds_every_data_message_and_the_services() {
        let set = prost_types::FileDescriptorSet::decode(super::FILE_DESCRIPTOR_SET)
            .expect("the build script writes a valid descriptor set");
        let mut names = Vec::new();
        for file in &set.file {
            let package = file.package();
            for message in &file.message_type {
                names.push(format!("{package}.{}", message.name()));
            }
            for service in &file.service {
                names.push(format!("{package}.{}", service.name()));
            }
        }
        for expected in [
            "resd.resource.v1.ResourceService",
            "resd.cluster.v1.ClusterService",
            "resd.demo.v2.Artist",
            "resd.demo.v1.RecordLabel",
            "resd.tenancy.v1.Namespace",
            "resd.internal.v1.Tombstone",
            "google.protobuf.Any",
            "google.protobuf.Timestamp",
        ] {
            assert!(
                names.iter().any(|name| name == expected),
                "{expected} missing from {names:?}"
            );
        }
    }

    #[test]
    fn to_any_uses_the_full_message_name() {
        let any = super::to_any(&super::demo::v2::Artist::default());
        assert_eq!(any.type_url, "type.googleapis.com/resd.demo.v2.Artist");
    }
}
