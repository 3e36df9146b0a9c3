//! `resd.raft.v1.RaftService`, the server side: peers' raft RPCs into the local `Raft`, received
//! snapshots (bounded, checked before raft sees them), and forwarded requests (checked by the
//! node's [`Admission`] as the resource service checks its own writes) into the local backend.
//!
//! Whatever a peer sends is decoded and checked here; a malformed or unacceptable message is
//! refused with `InvalidArgument` (or `ResourceExhausted` past a limit) and never reaches raft.

use std::sync::Arc;

use openraft::raft::{AppendEntriesRequest, VoteRequest};
use proto::raft::v1::raft_service_server::{RaftService, RaftServiceServer};
use proto::raft::v1::{self as pb};
use tokio::io::AsyncWriteExt;
use tonic::{Request, Response, Status, Streaming};

use super::super::codec;
use super::super::node::RaftNode;
use super::super::op::{Change, Request as Forwarded, Tagged};
use super::super::schema;
use super::super::state_machine;
use super::super::types::{NodeId, Raft, Snapshot, SnapshotMeta, TypeConfig, Vote};
use super::MAX_MESSAGE_BYTES;
use crate::storage::{Admission, StorageError, check};
use crate::tls::{ConnInfo, Refusals};
use crate::wire::raft::{PeerFailure, Wire, decode, encode};

/// The raft service of one node.
#[derive(Clone)]
pub(crate) struct RaftGrpc {
    raft: Raft,
    backend: Arc<RaftNode>,
    admission: Arc<dyn Admission>,
    /// With TLS: callers must be admitted peers, known by their node certificates.
    peers: Option<Arc<dyn PeerAdmission>>,
    refusals: Arc<Refusals>,
    /// Where the time to serve each AppendEntries goes, once the node has its metrics.
    append_duration: Option<prometheus_client::metrics::histogram::Histogram>,
    /// Cancelled when the node stops: open append streams end, so the server's graceful
    /// shutdown does not wait for a leader that keeps its stream open.
    stopping: tokio_util::sync::CancellationToken,
}

/// Which nodes may speak to this node's raft service, decided by the cluster
/// (`crate::cluster::Peers`).
pub(crate) trait PeerAdmission: Send + Sync {
    /// Whether node `id` may call now.
    fn admits(&self, id: NodeId) -> bool;
    /// Node `id` called and was refused: this node's log may be behind a membership change
    /// that added it. Finds out in the background, so its next try may get through.
    fn refused(self: Arc<Self>, id: NodeId);
}

impl RaftGrpc {
    pub(crate) fn new(backend: Arc<RaftNode>, admission: Arc<dyn Admission>) -> Self {
        RaftGrpc {
            raft: backend.raft().clone(),
            backend,
            admission,
            peers: None,
            refusals: Arc::default(),
            append_duration: None,
            stopping: tokio_util::sync::CancellationToken::new(),
        }
    }

    /// Ends open append streams when `stopping` is cancelled.
    pub(crate) fn with_shutdown(mut self, stopping: tokio_util::sync::CancellationToken) -> Self {
        self.stopping = stopping;
        self
    }

    /// Records how long each AppendEntries takes to serve into `histogram`.
    pub(crate) fn with_append_metrics(
        mut self,
        histogram: prometheus_client::metrics::histogram::Histogram,
    ) -> Self {
        self.append_duration = Some(histogram);
        self
    }

    /// Accepts RPCs only from the peers `peers` admits, identified by their node certificates
    /// (the port must be served with TLS that requires client certificates). Refusals are
    /// logged through `refusals`, once per peer.
    pub(crate) fn with_verified_peers(
        mut self,
        peers: Arc<dyn PeerAdmission>,
        refusals: Arc<Refusals>,
    ) -> Self {
        self.peers = Some(peers);
        self.refusals = refusals;
        self
    }

    /// The member behind a request (DESIGN §12.2): its certificate must name a node of this
    /// cluster that this node counts as a member. `None` without peer verification.
    fn caller(&self, info: &ConnInfo) -> Result<Option<NodeId>, Status> {
        let Some(peers) = &self.peers else {
            return Ok(None);
        };
        let node = match &info.peer {
            None => Err("no certificate presented".to_owned()),
            Some(peer) => match peer.node_id {
                None => Err(format!("{} is not a node of this cluster", peer.describe())),
                Some(node) if !peers.admits(node) => {
                    peers.clone().refused(node);
                    Err(format!("node {node} is not a member of this cluster"))
                }
                Some(node) => Ok(node),
            },
        };
        node.map(Some).map_err(|reason| self.refuse(info, reason))
    }

    /// Refuses a vote, append or snapshot whose leader or candidate is not the caller.
    fn check_claim(
        &self,
        info: &ConnInfo,
        caller: Option<NodeId>,
        claimed: Option<NodeId>,
        rpc: &str,
    ) -> Result<(), Status> {
        match (caller, claimed) {
            (Some(caller), Some(claimed)) if caller != claimed => Err(self.refuse(
                info,
                format!("node {caller} sent {rpc} in the name of node {claimed}"),
            )),
            _ => Ok(()),
        }
    }

    fn refuse(&self, info: &ConnInfo, reason: String) -> Status {
        self.refusals
            .warn("raft service", info.remote_ip(), &reason);
        Status::permission_denied(format!("raft service: {reason}"))
    }

    pub(crate) fn into_server(self) -> RaftServiceServer<RaftGrpc> {
        RaftServiceServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// Checks a forwarded request as this node would check it had it come from its own API.
    async fn admit(&self, request: &Forwarded) -> Result<(), StorageError> {
        match request {
            Forwarded::Change(Tagged {
                change: Change::Write(resource, _),
                ..
            }) => self.admission.admit(resource).await,
            Forwarded::Change(Tagged {
                change: Change::Delete { id, .. },
                ..
            })
            | Forwarded::Read(id) => check::check_key(id),
            Forwarded::List(_) | Forwarded::ReadIndex => Ok(()),
        }
    }
}

/// Requests one append stream serves at a time (openraft sends one append per follower at a
/// time, plus leadership heartbeats).
const STREAM_IN_FLIGHT: usize = 64;

impl RaftGrpc {
    /// One AppendEntries, as a call or a message on the append stream: the payload's request
    /// checked against the caller, given to raft, the answer encoded.
    /// `build`: whether the sender's build checks fences ([`same_build`]), refused once the
    /// sender is known to speak for itself.
    async fn append(
        &self,
        info: &ConnInfo,
        payload: &[u8],
        build: &Result<(), Status>,
    ) -> Result<Vec<u8>, Status> {
        let started = std::time::Instant::now();
        let caller = self.caller(info)?;
        let rpc: AppendEntriesRequest<TypeConfig> = decode(payload).map_err(bad_payload)?;
        self.check_claim(info, caller, rpc.vote.leader_id().voted_for(), "entries")?;
        build.clone()?;
        let answer = self.raft.append_entries(rpc).await;
        // Taken (or to be repaired from): the sender leads this node's term or a later one.
        if matches!(
            answer,
            Ok(openraft::raft::AppendEntriesResponse::Success
                | openraft::raft::AppendEntriesResponse::PartialSuccess(_)
                | openraft::raft::AppendEntriesResponse::Conflict)
        ) {
            self.backend.heard_from_leader();
        }
        if let Some(histogram) = &self.append_duration {
            histogram.observe(started.elapsed().as_secs_f64());
        }
        Ok(encode(
            &answer.map_err(|error| PeerFailure(error.to_string())),
        ))
    }
}

fn bad_payload(error: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("undecodable raft payload: {error}"))
}

/// Refuses a replication call from a build that does not check fences ([`super::FENCE_HEADER`]).
fn same_build<T>(request: &Request<T>, info: &ConnInfo) -> Result<(), Status> {
    if super::checks_fences(request.metadata()) {
        return Ok(());
    }
    let peer = info
        .remote_ip()
        .map_or_else(|| "(unknown address)".to_owned(), |ip| ip.to_string());
    Err(Status::failed_precondition(super::earlier_build(&peer)))
}

/// A raft answer: the value, or raft's failure as words.
fn reply<T: Wire, E: std::fmt::Display>(
    answer: Result<T, E>,
) -> Result<Response<pb::RaftMessage>, Status> {
    let answer = answer.map_err(|error| PeerFailure(error.to_string()));
    Ok(Response::new(pb::RaftMessage {
        payload: encode(&answer),
    }))
}

/// A received snapshot's directory, removed unless it is handed to raft.
struct Incoming {
    dir: Option<std::path::PathBuf>,
}

impl Drop for Incoming {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[tonic::async_trait]
impl RaftService for RaftGrpc {
    async fn append_entries(
        &self,
        request: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let info = ConnInfo::of(&request);
        let build = same_build(&request, &info);
        let payload = self
            .append(&info, &request.into_inner().payload, &build)
            .await?;
        let mut response = Response::new(pb::RaftMessage { payload });
        super::mark_fences(response.metadata_mut());
        Ok(response)
    }

    type AppendStreamStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::StreamedResponse, Status>> + Send>>;

    async fn append_stream(
        &self,
        request: Request<Streaming<pb::StreamedRequest>>,
    ) -> Result<Response<Self::AppendStreamStream>, Status> {
        let info = ConnInfo::of(&request);
        // Checked at the start too, so a stranger's stream is refused at once; every request
        // on it is checked again (membership may change while the stream stays open).
        self.caller(&info)?;
        let build = same_build(&request, &info);
        let mut requests = request.into_inner();
        let (answers, answered) = tokio::sync::mpsc::channel(STREAM_IN_FLIGHT);
        let service = self.clone();
        tokio::spawn(async move {
            // Requests are served concurrently (a heartbeat must not wait behind an append's
            // fsync), at most STREAM_IN_FLIGHT at a time per stream.
            let permits = Arc::new(tokio::sync::Semaphore::new(STREAM_IN_FLIGHT));
            loop {
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    break;
                };
                let request = tokio::select! {
                    () = service.stopping.cancelled() => break,
                    request = requests.message() => match request {
                        Ok(Some(request)) => request,
                        Ok(None) | Err(_) => break,
                    },
                };
                let service = service.clone();
                let info = info.clone();
                let answers = answers.clone();
                let build = build.clone();
                tokio::spawn(async move {
                    let answer = match service.append(&info, &request.payload, &build).await {
                        Ok(payload) => pb::StreamedResponse {
                            id: request.id,
                            payload,
                            error: String::new(),
                        },
                        Err(status) => pb::StreamedResponse {
                            id: request.id,
                            payload: Vec::new(),
                            error: status.message().to_owned(),
                        },
                    };
                    let _ = answers.send(Ok(answer)).await;
                    drop(permit);
                });
            }
        });
        let mut response: Response<Self::AppendStreamStream> = Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(answered),
        ));
        super::mark_fences(response.metadata_mut());
        Ok(response)
    }

    async fn pre_vote(
        &self,
        request: Request<pb::PreVoteRequest>,
    ) -> Result<Response<pb::PreVoteResponse>, Status> {
        let info = ConnInfo::of(&request);
        let caller = self.caller(&info)?;
        let ask = request.into_inner();
        self.check_claim(&info, caller, Some(ask.candidate), "a pre-vote request")?;
        Ok(Response::new(
            match self.backend.pre_vote(ask.candidate, ask.last_log_index) {
                Ok(()) => pb::PreVoteResponse {
                    granted: true,
                    reason: String::new(),
                },
                Err(reason) => pb::PreVoteResponse {
                    granted: false,
                    reason,
                },
            },
        ))
    }

    async fn vouch(
        &self,
        request: Request<pb::VouchRequest>,
    ) -> Result<Response<pb::VouchResponse>, Status> {
        let info = ConnInfo::of(&request);
        self.caller(&info)?;
        let asked = request.into_inner().node_id;
        let mut response = Response::new(pb::VouchResponse {
            member: super::super::node::names_node(&self.raft, asked),
        });
        // A leader asks before it sends anything (`client::NetworkClient::ensure_same_build`).
        super::mark_fences(response.metadata_mut());
        Ok(response)
    }

    async fn vote(
        &self,
        request: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let info = ConnInfo::of(&request);
        let caller = self.caller(&info)?;
        let earlier = same_build(&request, &info);
        let rpc: VoteRequest<NodeId> =
            decode(&request.into_inner().payload).map_err(bad_payload)?;
        self.check_claim(
            &info,
            caller,
            rpc.vote.leader_id().voted_for(),
            "a vote request",
        )?;
        earlier?;
        let mut response = match self.backend.refuse_vote(&rpc) {
            Some(refused) => reply(Ok::<_, openraft::error::RaftError<NodeId>>(refused))?,
            None => reply(self.raft.vote(rpc).await)?,
        };
        super::mark_fences(response.metadata_mut());
        Ok(response)
    }

    async fn install_snapshot(
        &self,
        request: Request<Streaming<pb::SnapshotChunk>>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let info = ConnInfo::of(&request);
        let caller = self.caller(&info)?;
        let earlier = same_build(&request, &info);
        let mut chunks = request.into_inner();
        let first = chunks
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty snapshot stream"))?;
        let (vote, meta): (Vote, SnapshotMeta) = decode(&first.header).map_err(bad_payload)?;
        self.check_claim(&info, caller, vote.leader_id().voted_for(), "a snapshot")?;
        schema::check_snapshot_id(&meta.snapshot_id).map_err(Status::invalid_argument)?;
        let receiving = self
            .raft
            .begin_receiving_snapshot()
            .await
            .map_err(|error| Status::unavailable(format!("cannot receive a snapshot: {error}")))?;
        let mut incoming = Incoming {
            dir: receiving.path.parent().map(std::path::Path::to_path_buf),
        };
        let mut file = tokio::fs::File::create(&receiving.path)
            .await
            .map_err(|error| {
                Status::internal(format!(
                    "cannot create {}: {error}",
                    receiving.path.display()
                ))
            })?;
        let write_error =
            |error: std::io::Error| Status::internal(format!("cannot write the snapshot: {error}"));
        let limit = self.backend.max_snapshot_bytes();
        let mut received = 0u64;
        let mut hasher = crc32fast::Hasher::new();
        let mut chunk = first;
        loop {
            if chunk.last {
                // The sender's recorded sum: what the bytes must come to, checked before the
                // file is opened (a damaged LMDB file must never be mapped).
                let got = schema::FileSum {
                    len: received,
                    crc: hasher.finalize(),
                };
                let recorded = schema::FileSum {
                    len: chunk.length,
                    crc: chunk.crc,
                };
                if got != recorded {
                    return Err(Status::data_loss(format!(
                        "snapshot {} refused, nothing changed: its bytes ({} bytes, crc {:08x}) do not match the sum the sender recorded when it was written ({} bytes, crc {:08x}); the sender's copy is damaged, and it builds a new one",
                        meta.snapshot_id, got.len, got.crc, recorded.len, recorded.crc
                    )));
                }
                break;
            }
            received += chunk.data.len() as u64;
            if received > limit {
                return Err(Status::resource_exhausted(format!(
                    "the snapshot is larger than this node's --max-snapshot-bytes limit of {limit} bytes"
                )));
            }
            hasher.update(&chunk.data);
            file.write_all(&chunk.data).await.map_err(write_error)?;
            match chunks.message().await? {
                Some(next) => chunk = next,
                None => break,
            }
        }
        file.sync_all().await.map_err(write_error)?;
        drop(file);
        if let Some(dir) = incoming.dir.clone() {
            let map_size = self.backend.state_machine().map_size();
            let records =
                tokio::task::spawn_blocking(move || state_machine::check_received(&dir, map_size))
                    .await
                    .map_err(|error| Status::internal(format!("checking the snapshot: {error}")))?
                    .map_err(|why| {
                        Status::invalid_argument(format!(
                            "snapshot {} refused, nothing changed: {why}",
                            meta.snapshot_id
                        ))
                    })?;
            tracing::debug!(
                records,
                snapshot_id = meta.snapshot_id,
                "received a snapshot"
            );
        }
        // Raft owns the file from here.
        incoming.dir = None;
        let snapshot = Snapshot {
            meta,
            snapshot: receiving,
        };
        earlier?;
        let mut response = reply(self.raft.install_full_snapshot(vote, snapshot).await)?;
        super::mark_fences(response.metadata_mut());
        Ok(response)
    }

    async fn removed(
        &self,
        request: Request<pb::RemovedNotice>,
    ) -> Result<Response<pb::RemovedAck>, Status> {
        let info = ConnInfo::of(&request);
        let caller = self.caller(&info)?;
        let notice = request.into_inner();
        if notice.node_id != self.backend.id() {
            return Err(Status::invalid_argument(format!(
                "this is node {}, not node {}",
                self.backend.id(),
                notice.node_id
            )));
        }
        if let Some(caller) = caller
            && caller != notice.by_node_id
        {
            return Err(self.refuse(
                &info,
                format!(
                    "node {caller} sent a removal in the name of node {}",
                    notice.by_node_id
                ),
            ));
        }
        // A notice about an earlier incarnation: this node's configuration is newer than the
        // one that removed it and names it (it was added back, with an empty data directory,
        // while the notice was being retried).
        let metrics = self.backend.metrics();
        let configuration = &metrics.membership_config;
        let current = configuration.log_id().map_or(0, |log_id| log_id.index);
        if notice.membership_index > 0
            && current > notice.membership_index
            && configuration
                .membership()
                .get_node(&notice.node_id)
                .is_some()
        {
            tracing::warn!(
                by = notice.by_node_id,
                removed_at = notice.membership_index,
                configuration = current,
                "ignoring a removal notice older than this node's configuration, which names it"
            );
            return Ok(Response::new(pb::RemovedAck {}));
        }
        self.backend.mark_removed(crate::storage::Removal {
            why: format!(
                "node {} was removed from cluster {} (by node {})",
                notice.node_id, notice.cluster_name, notice.by_node_id
            ),
            by: Some(notice.by_node_id),
        });
        Ok(Response::new(pb::RemovedAck {}))
    }

    async fn forward(
        &self,
        request: Request<pb::ForwardRequest>,
    ) -> Result<Response<pb::ForwardResponse>, Status> {
        self.caller(&ConnInfo::of(&request))?;
        let mut request = codec::request_of(request.into_inner())
            .map_err(|error| Status::invalid_argument(error.to_string()))?;
        // A change's history time is this node's clock, where it is proposed: a member with a
        // clock far ahead cannot age every object's history away by forwarding writes.
        if let Forwarded::Change(Tagged {
            keep: Some(keep), ..
        }) = &mut request
        {
            keep.time_ms = crate::storage::history::now_ms();
        }
        let reply = match self.admit(&request).await {
            Ok(()) => self.backend.serve_forwarded(request).await,
            Err(refused) => Err(refused),
        };
        Ok(Response::new(codec::forward_response_of(&reply)))
    }
}
