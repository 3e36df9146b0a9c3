//! Delete: idempotent, CAS-aware, finalizer-aware, and leaving a tombstone for the reaper.

use proto::internal::v1::Tombstone;
use proto::resource::v1::{DeleteRequest, DeleteResponse, Resource};

use super::{Error, ResourceService, VersionConflict, new_ulid, retry_blind};
use crate::acl::Authorizer;
use crate::registry::builtin;
use crate::resource::{self, DELETION_TIMESTAMP_KEY, DisplayId};
use crate::storage::{Fence, StorageError};

impl ResourceService {
    pub(crate) async fn delete(
        &self,
        authorizer: &dyn Authorizer,
        request: DeleteRequest,
    ) -> Result<DeleteResponse, Error> {
        self.refenced(|| self.delete_checked(authorizer, request.clone()))
            .await
    }

    /// One delete, every check made once.
    async fn delete_checked(
        &self,
        authorizer: &dyn Authorizer,
        request: DeleteRequest,
    ) -> Result<DeleteResponse, Error> {
        let DeleteRequest { id, version } = request;
        let (id, registration) = self.check_request_id(id, "id")?;
        let mut fence = Self::fence(authorizer, &registration, None);
        let policies = self.policies_now();
        if let Some(t) = id.r#type.as_ref() {
            super::policy::fence_on(&mut fence, &policies, &t.group, &t.kind);
        }
        registration.check_write_access_before_existence(authorizer, &id)?;
        fence.guards.extend(self.lease_guard(authorizer).await?);
        let (fence, policies) = (&fence, &policies);
        let gvk = registration.gvk();
        if (gvk == builtin::NAMESPACE
            && id.name == resource::DEFAULT_NAMESPACE
            && id
                .tenancy
                .as_ref()
                .is_some_and(|t| t.partition == resource::DEFAULT_PARTITION))
            || (gvk == builtin::PARTITION && id.name == resource::DEFAULT_PARTITION)
        {
            return Err(Error::invalid(format!(
                "{} cannot be deleted",
                DisplayId(&id)
            )));
        }

        let blind = version.is_empty();
        let (id, registration, version) = (&id, &registration, &version);
        retry_blind(blind, |_| async move {
            let Some(existing) = self.read_stored(id).await? else {
                return Ok(DeleteResponse {});
            };
            let existing_id = existing.id.clone().unwrap_or_default();
            if !id.uid.is_empty() && id.uid != existing_id.uid {
                // The named incarnation is already gone; the stored one is someone else's.
                return Ok(DeleteResponse {});
            }
            // Both the version asked through and the one stored (a DENY under either holds).
            (registration.acls.write)(authorizer, &existing)?;
            if existing_id.r#type.as_ref().map(|t| &t.group_version)
                != id.r#type.as_ref().map(|t| &t.group_version)
            {
                let mut requested = existing.clone();
                requested.id = Some(proto::resource::v1::Id {
                    uid: existing_id.uid.clone(),
                    ..id.clone()
                });
                (registration.acls.write)(authorizer, &requested)?;
            }
            if !blind && *version != existing.version {
                return Err(Error::VersionConflict(VersionConflict {
                    what: DisplayId(&existing_id).to_string(),
                    by: "delete",
                    expected: version.clone(),
                    actual: existing.version.clone(),
                }));
            }
            // A deletion under way is never held up by a policy, nor one the server makes
            // itself (a namespace emptied, a cascade): those always complete.
            let mut fence = fence.clone();
            if !resource::is_marked_for_deletion(&existing) && !authorizer.is_server() {
                // Fenced on the policies' params as read too.
                fence.guards.extend(
                    self.admit(
                        policies,
                        &existing,
                        Some(&existing),
                        crate::registry::policies::Operation::Delete,
                        authorizer.identity(),
                        id.r#type.as_ref(),
                    )
                    .await?,
                );
            }
            let fence = &fence;
            if resource::has_finalizers(&existing) {
                if resource::is_marked_for_deletion(&existing) {
                    return Ok(DeleteResponse {});
                }
                let mut marked = existing.clone();
                marked.metadata.insert(
                    DELETION_TIMESTAMP_KEY.to_owned(),
                    resource::rfc3339(std::time::SystemTime::now()),
                );
                self.backend
                    .write_cas_as(marked, authorizer.identity(), fence)
                    .await?;
            } else {
                self.delete_with_tombstone(&existing, authorizer.identity(), fence)
                    .await?;
            }
            Ok(DeleteResponse {})
        })
        .await
    }

    /// Deletes a marked resource whose last finalizer was just removed by `stored`'s write
    /// (made by `actor`, who is recorded as the deleter).
    pub(super) async fn finish_delete(&self, stored: &Resource, actor: &str) -> Result<(), Error> {
        let id = &stored.id.clone().unwrap_or_default();
        // The first try deletes what the write stored; a status write may slip in between, so
        // later tries delete the newest version if it is still due.
        let result = retry_blind(true, |attempt| async move {
            let current = if attempt == 0 {
                stored.clone()
            } else {
                match self.read_stored(id).await? {
                    Some(latest)
                        if latest.id.as_ref().map(|i| &i.uid) == Some(&id.uid)
                            && resource::is_marked_for_deletion(&latest)
                            && !resource::has_finalizers(&latest) =>
                    {
                        latest
                    }
                    _ => return Ok(()),
                }
            };
            // The end of a change already checked and stored: nothing to fence.
            Ok(self
                .delete_with_tombstone(&current, actor, &Fence::default())
                .await?)
        })
        .await;
        match result {
            Err(Error::CasFailed(_)) => Err(Error::CasFailed(format!(
                "{} lost its last finalizer but kept changing while it was deleted; delete it again",
                DisplayId(id)
            ))),
            other => other,
        }
    }

    /// Writes the tombstone (unless `existing` is one), then deletes `existing` at its version.
    ///
    /// The tombstone goes first: a crash in between leaves a tombstone for a live resource, which
    /// the reaper recognises by the uid, rather than a deleted resource whose children are never
    /// reaped.
    async fn delete_with_tombstone(
        &self,
        existing: &Resource,
        actor: &str,
        fence: &Fence,
    ) -> Result<(), StorageError> {
        let existing_id = existing.id.clone().unwrap_or_default();
        let is_tombstone = existing_id
            .r#type
            .as_ref()
            .is_some_and(|t| resource::gvk(t) == builtin::TOMBSTONE);
        if !is_tombstone {
            let mut tombstone_id = builtin::tombstone_id(&existing_id);
            let already_written = match self
                .backend
                .read(crate::storage::Consistency::Strong, &tombstone_id)
                .await
            {
                Ok(_) | Err(StorageError::GroupVersionMismatch { .. }) => true,
                Err(StorageError::NotFound) => false,
                Err(error) => return Err(error),
            };
            if !already_written {
                tombstone_id.uid = new_ulid();
                let tombstone = Resource {
                    id: Some(tombstone_id),
                    generation: new_ulid(),
                    data: Some(proto::to_any(&Tombstone {
                        owner: Some(existing_id.clone()),
                    })),
                    ..Default::default()
                };
                match self.backend.write_cas_as(tombstone, actor, fence).await {
                    // Another delete of the same incarnation wrote it first.
                    Ok(_) | Err(StorageError::CasFailure) | Err(StorageError::WrongUid) => {}
                    Err(error) => return Err(error),
                }
            }
        }
        self.backend
            .delete_cas_as(&existing_id, &existing.version, actor, fence)
            .await
    }
}
