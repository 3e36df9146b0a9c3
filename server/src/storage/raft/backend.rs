//! [`RaftBackend`]: the storage contract ([`Backend`]) over a [`RaftNode`]. Writes are
//! submitted to the node (proposed on the leader, or forwarded to it); reads and watches are
//! served from this node's state machine once the node is ready (and, for a strong read, has
//! applied the leader's read index). Everything else about the node — its lifecycle, the
//! proposer, read-index rounds, readiness — is the node's; membership is `crate::cluster`'s.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use proto::resource::v1::{Id, Resource, Tenancy};

use super::node::RaftNode;
use super::op::{self, Change, Request, Tagged};
use crate::storage::history::{self, HistoryPolicy};
use crate::storage::{
    Backend, Consistency, Fence, StorageError, UnversionedType, Version, Watch, WriteCondition,
    check,
};

/// How long a write waits for this node to apply it before answering (read your writes).
const READ_YOUR_WRITES_WAIT: Duration = Duration::from_secs(2);

/// The storage contract over a raft node.
#[derive(Debug, Clone)]
pub(crate) struct RaftBackend {
    node: Arc<RaftNode>,
}

impl RaftBackend {
    pub(crate) fn new(node: Arc<RaftNode>) -> Self {
        RaftBackend { node }
    }

    /// What a change of `id`'s type made now is kept in history with.
    fn keep(&self, id: Option<&Id>) -> Option<history::Keep> {
        let resource_type = id.and_then(|id| id.r#type.as_ref())?;
        let policy = self.node.history_policy();
        Some(history::keep_for(
            &*policy,
            &resource_type.group,
            &resource_type.kind,
        ))
    }

    #[cfg(test)]
    pub(crate) fn node(&self) -> &Arc<RaftNode> {
        &self.node
    }

    /// A write under `condition` (see [`Backend::write_cas_as`], [`Backend::write_merged_as`]).
    async fn write(
        &self,
        resource: Resource,
        condition: WriteCondition,
        actor: &str,
        fence: &Fence,
    ) -> Result<Resource, StorageError> {
        // Apply refuses it too; refusing here keeps it out of the log.
        check::check_storable(&resource, usize::MAX)?;
        // One request id for every forward and proposal of this change: applied at most once.
        let keep = self.keep(resource.id.as_ref());
        let change = Tagged::new(Change::Write(Arc::new(resource), condition), actor)
            .fenced(fence)
            .kept(keep);
        let stored = op::expect_resource(self.node.submit(Request::Change(change)).await)?;
        // Read your writes on this node: a write forwarded to the leader answers once this
        // node has applied it too (at once on the leader). Best effort, briefly: the write is
        // committed either way, and a lagging node must not turn it into an error.
        if let Ok(version) = stored.version.parse::<Version>() {
            let _ =
                tokio::time::timeout(READ_YOUR_WRITES_WAIT, self.node.wait_applied(version.index))
                    .await;
        }
        Ok(stored)
    }
}

#[async_trait]
impl Backend for RaftBackend {
    async fn read(&self, consistency: Consistency, id: &Id) -> Result<Resource, StorageError> {
        self.node.ready_to_read(consistency).await?;
        self.node.state_machine().read(id)
    }

    async fn read_encoded(
        &self,
        consistency: Consistency,
        id: &Id,
    ) -> Result<Vec<u8>, StorageError> {
        self.node.ready_to_read(consistency).await?;
        self.node.state_machine().read_encoded(id)
    }

    async fn write_cas_as(
        &self,
        resource: Resource,
        actor: &str,
        fence: &Fence,
    ) -> Result<Resource, StorageError> {
        self.write(resource, WriteCondition::Version, actor, fence)
            .await
    }

    async fn write_merged_as(
        &self,
        resource: Resource,
        actor: &str,
        fence: &Fence,
    ) -> Result<Resource, StorageError> {
        self.write(resource, WriteCondition::Merged, actor, fence)
            .await
    }

    async fn delete_cas_as(
        &self,
        id: &Id,
        version: &str,
        actor: &str,
        fence: &Fence,
    ) -> Result<(), StorageError> {
        check::check_key(id)?;
        let change = Tagged::new(
            Change::Delete {
                id: id.clone(),
                version: version.into(),
            },
            actor,
        )
        .fenced(fence)
        .kept(self.keep(Some(id)));
        op::expect_done(self.node.submit(Request::Change(change)).await)
    }

    fn keep_history(&self, policy: Arc<dyn HistoryPolicy>) {
        self.node.set_history_policy(policy);
    }

    async fn history(
        &self,
        consistency: Consistency,
        uid: &str,
        before: Option<Version>,
        limit: usize,
    ) -> Result<history::Page, StorageError> {
        self.node.ready_to_read(consistency).await?;
        self.node.state_machine().history(uid, before, limit)
    }

    async fn sync(&self) -> Result<(), StorageError> {
        self.node.ready_to_read(Consistency::Strong).await
    }

    fn project(&self, projection: Arc<dyn crate::storage::Projection>) -> Result<(), StorageError> {
        self.node.state_machine().project(projection)
    }

    async fn list(
        &self,
        consistency: Consistency,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
    ) -> Result<Vec<Resource>, StorageError> {
        self.node.ready_to_read(consistency).await?;
        self.node
            .state_machine()
            .list(resource_type, tenancy, name_prefix)
    }

    async fn list_encoded(
        &self,
        consistency: Consistency,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
        after: Option<&crate::storage::StorageKey>,
        sink: &mut dyn crate::storage::EncodedSink,
    ) -> Result<(), StorageError> {
        self.node.ready_to_read(consistency).await?;
        self.node
            .state_machine()
            .list_encoded(resource_type, tenancy, name_prefix, after, sink)
    }

    async fn list_by_owner(&self, owner: &Id) -> Result<Vec<Resource>, StorageError> {
        self.node.check_ready()?;
        self.node.state_machine().list_by_owner(owner)
    }

    async fn watch_list(
        &self,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
        since: Option<Version>,
        options: crate::storage::WatchOptions,
    ) -> Result<Watch, StorageError> {
        self.node.check_ready()?;
        self.node
            .state_machine()
            .watch_list(resource_type, tenancy, name_prefix, since, options)
    }

    fn group_stamp(&self, group: &str) -> Option<u64> {
        Some(self.node.state_machine().group_stamp(group))
    }

    fn stale_reads(&self) -> Option<String> {
        // On every default read: the metrics are borrowed, not cloned.
        if self
            .node
            .known_leader(&self.node.raft().metrics().borrow())
            .is_some()
        {
            return None;
        }
        Some(format!(
            "node {} knows no leader (no quorum, or an election): what it answers may be stale",
            self.node.id()
        ))
    }
}
