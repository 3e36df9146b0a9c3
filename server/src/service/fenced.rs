//! Fenced writes (DESIGN §16): a Write, WriteStatus or Delete sent with `x-resd-fence:
//! <partition>/<namespace>/<lease>@<transitions>` is stored only while that lease exists and has
//! changed hands exactly `transitions` times — checked by apply ([`Guard::Lease`]), so a
//! replica paused past its lease never writes after another took over. The gRPC layer parses
//! the header and runs the call inside [`scope`]; the change's fence ([`ResourceService::fence`])
//! takes the guard from there once the caller is seen to be allowed to read the lease.

use std::future::Future;

use proto::fence::LeaseFence;
use proto::resource::v1::{Id, Tenancy, Type};

use super::{Error, ResourceService};
use crate::acl::Authorizer;
use crate::storage::{Consistency, Guard, StorageKey};

tokio::task_local! {
    /// The fence of the request being answered, when it carries one.
    static FENCE: Option<LeaseFence>;
}

/// The fence a request's metadata carries: `None` without one, InvalidArgument when it does not
/// parse (or is sent twice, or is not text).
pub(crate) fn of_metadata(
    metadata: &tonic::metadata::MetadataMap,
) -> Result<Option<LeaseFence>, Error> {
    let mut values = metadata.get_all(proto::FENCE_HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Error::invalid(format!(
            "{} is sent more than once: a write is fenced by one lease",
            proto::FENCE_HEADER
        )));
    }
    let text = value
        .to_str()
        .map_err(|_| Error::invalid(format!("{} is not printable ASCII", proto::FENCE_HEADER)))?;
    LeaseFence::parse(text)
        .map(Some)
        .map_err(|error| Error::invalid(format!("{}: {error}", proto::FENCE_HEADER)))
}

/// Runs `work` (one request's handling) under `fence`.
pub(crate) async fn scope<F: Future>(fence: Option<LeaseFence>, work: F) -> F::Output {
    FENCE.scope(fence, work).await
}

/// The fence of the request being answered.
fn current() -> Option<LeaseFence> {
    FENCE.try_with(Clone::clone).ok().flatten()
}

/// The id of the lease a fence names.
fn lease_id(fence: &LeaseFence) -> Id {
    Id {
        uid: String::new(),
        name: fence.name.clone(),
        r#type: Some(Type {
            group: "coordination".into(),
            group_version: "v1".into(),
            kind: "Lease".into(),
        }),
        tenancy: Some(Tenancy {
            partition: fence.partition.clone(),
            namespace: fence.namespace.clone(),
        }),
    }
}

impl ResourceService {
    /// The guard of the request's fence, if it carries one: naming a lease needs read on it
    /// (else PermissionDenied, whether or not it exists); a lease in any namespace may fence.
    pub(super) async fn lease_guard(
        &self,
        authorizer: &dyn Authorizer,
    ) -> Result<Option<Guard>, Error> {
        let Some(fence) = current() else {
            return Ok(None);
        };
        let (id, registration) =
            self.check_request_id(Some(lease_id(&fence)), proto::FENCE_HEADER)?;
        if super::read::read_grant(&registration, authorizer, &id)? {
            // The type's read hook decides from the lease itself.
            let stored = self.backend.read(Consistency::Eventual, &id).await.ok();
            (registration.acls.read)(authorizer, &id, stored.as_ref())?;
        }
        Ok(Some(Guard::Lease {
            key: StorageKey::of(&id),
            transitions: fence.transitions,
        }))
    }
}
