//! The Raft network over the internal gRPC service `resd.raft.v1.RaftService`: the client side
//! openraft uses to reach peers ([`NetworkFactory`]), the server side that receives their RPCs
//! ([`RaftGrpc`]), and the one mapping of storage errors to and from the wire.

use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use openraft::error::{
    Fatal, NetworkError, RPCError, RaftError, RemoteError, ReplicationClosed, StreamingError,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use proto::raft::v1::raft_service_client::RaftServiceClient;
use proto::raft::v1::raft_service_server::RaftService;
use proto::raft::v1::{self as pb, storage_failure::Code};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use super::backend::RaftBackend;
use super::types::{
    NodeAddr, NodeId, Raft, Snapshot, SnapshotMeta, TypeConfig, Vote, decode, encode,
};
use crate::storage::StorageError;

/// Largest AppendEntries message sent; larger batches are cut and reported as partial success.
pub const MAX_APPEND_BYTES: usize = 32 << 20;
/// Largest message the raft server accepts (a single entry may hold a 4 MiB resource).
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;
/// Size of the chunks a snapshot is streamed in.
const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;

/// A lazily connecting client of one peer's raft service.
pub fn raft_client(addr: &str) -> Result<RaftServiceClient<Channel>, String> {
    let endpoint = Channel::from_shared(format!("http://{addr}"))
        .map_err(|error| format!("invalid raft address {addr:?}: {error}"))?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true);
    Ok(RaftServiceClient::new(endpoint.connect_lazy())
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

// Storage errors on the wire.

pub fn failure_of(error: &StorageError) -> pb::StorageFailure {
    let (code, stored) = match error {
        StorageError::NotFound => (Code::NotFound, None),
        StorageError::CasFailure => (Code::CasFailure, None),
        StorageError::WrongUid => (Code::WrongUid, None),
        StorageError::GroupVersionMismatch { stored } => {
            (Code::GroupVersionMismatch, Some((**stored).clone()))
        }
        StorageError::Inconsistent(_) => (Code::Inconsistent, None),
        StorageError::WatchClosed(_) => (Code::WatchClosed, None),
        StorageError::Internal(_) => (Code::Internal, None),
        StorageError::ResumeUnavailable(_) => (Code::ResumeUnavailable, None),
    };
    let message = match error {
        StorageError::Inconsistent(why)
        | StorageError::WatchClosed(why)
        | StorageError::Internal(why) => why.clone(),
        other => other.to_string(),
    };
    pb::StorageFailure {
        code: code as i32,
        message,
        stored,
    }
}

pub fn error_of(failure: pb::StorageFailure) -> StorageError {
    match Code::try_from(failure.code).unwrap_or(Code::Internal) {
        Code::NotFound => StorageError::NotFound,
        Code::CasFailure => StorageError::CasFailure,
        Code::WrongUid => StorageError::WrongUid,
        Code::GroupVersionMismatch => StorageError::GroupVersionMismatch {
            stored: Box::new(failure.stored.unwrap_or_default()),
        },
        Code::Inconsistent => StorageError::Inconsistent(failure.message),
        Code::WatchClosed => StorageError::WatchClosed(failure.message),
        Code::ResumeUnavailable => StorageError::ResumeUnavailable(failure.message),
        Code::Internal | Code::Unspecified => StorageError::Internal(failure.message),
    }
}

// Client side.

/// Creates [`NetworkClient`]s for openraft.
#[derive(Debug, Clone, Default)]
pub struct NetworkFactory;

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = NetworkClient;

    async fn new_client(&mut self, target: NodeId, node: &NodeAddr) -> NetworkClient {
        NetworkClient {
            target,
            addr: node.raft_addr.clone(),
            client: raft_client(&node.raft_addr),
        }
    }
}

pub struct NetworkClient {
    target: NodeId,
    addr: String,
    client: Result<RaftServiceClient<Channel>, String>,
}

type RpcResult<T> = Result<T, RPCError<NodeId, NodeAddr, RaftError<NodeId>>>;

impl NetworkClient {
    fn client(&self) -> Result<RaftServiceClient<Channel>, Unreachable> {
        self.client
            .clone()
            .map_err(|why| Unreachable::new(&std::io::Error::other(why)))
    }

    fn unreachable(&self, status: &Status) -> Unreachable {
        Unreachable::new(&std::io::Error::other(format!(
            "raft peer {} at {}: {status}",
            self.target, self.addr
        )))
    }

    fn decode_reply<T: serde::de::DeserializeOwned>(&self, payload: &[u8]) -> RpcResult<T> {
        let reply: Result<T, RaftError<NodeId>> =
            decode(payload).map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
        reply.map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
    }
}

impl RaftNetwork<TypeConfig> for NetworkClient {
    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>> {
        // Cut the batch to the byte budget; what is cut is sent next time.
        let mut budget = MAX_APPEND_BYTES;
        let mut keep = 0;
        for entry in &rpc.entries {
            let size = approximate_size(entry);
            if keep > 0 && size > budget {
                break;
            }
            budget = budget.saturating_sub(size);
            keep += 1;
        }
        let cut = keep < rpc.entries.len();
        rpc.entries.truncate(keep);
        let last_sent = rpc.entries.last().map(|entry| entry.log_id);

        let payload = encode(&rpc).map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
        let mut request = Request::new(pb::RaftMessage { payload });
        request.set_timeout(option.hard_ttl());
        let reply = self
            .client()?
            .append_entries(request)
            .await
            .map_err(|status| RPCError::Unreachable(self.unreachable(&status)))?;
        let response: AppendEntriesResponse<NodeId> =
            self.decode_reply(&reply.into_inner().payload)?;
        Ok(match response {
            AppendEntriesResponse::Success if cut => {
                AppendEntriesResponse::PartialSuccess(last_sent)
            }
            other => other,
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>> {
        let payload = encode(&rpc).map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
        let mut request = Request::new(pb::RaftMessage { payload });
        request.set_timeout(option.hard_ttl());
        let reply = self
            .client()?
            .vote(request)
            .await
            .map_err(|status| RPCError::Unreachable(self.unreachable(&status)))?;
        self.decode_reply(&reply.into_inner().payload)
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<TypeConfig, Fatal<NodeId>>> {
        let header = encode(&(vote, snapshot.meta.clone()))
            .map_err(|error| StreamingError::Network(NetworkError::new(&error)))?;
        let file = tokio::fs::File::open(&snapshot.snapshot.path)
            .await
            .map_err(|error| StreamingError::Network(NetworkError::new(&error)))?;
        let chunks = snapshot_chunks(header, file);
        let mut client = self.client().map_err(StreamingError::Unreachable)?;
        let send = client.install_snapshot(Request::new(chunks));
        let reply = tokio::select! {
            closed = cancel => return Err(StreamingError::Closed(closed)),
            reply = send => reply.map_err(|status| StreamingError::Unreachable(self.unreachable(&status)))?,
        };
        let result: Result<SnapshotResponse<NodeId>, Fatal<NodeId>> =
            decode(&reply.into_inner().payload)
                .map_err(|error| StreamingError::Network(NetworkError::new(&error)))?;
        result.map_err(|fatal| StreamingError::RemoteError(RemoteError::new(self.target, fatal)))
    }
}

/// An entry's encoded size, near enough for the byte budget, without encoding it.
fn approximate_size(entry: &super::types::Entry) -> usize {
    const OVERHEAD: usize = 64;
    match &entry.payload {
        openraft::EntryPayload::Normal(command) => command.encoded().len() + OVERHEAD,
        openraft::EntryPayload::Membership(_) => 4096,
        openraft::EntryPayload::Blank => OVERHEAD,
    }
}

/// The snapshot file as a stream of chunks, the header in the first.
fn snapshot_chunks(
    header: Vec<u8>,
    file: tokio::fs::File,
) -> impl Stream<Item = pb::SnapshotChunk> + Send + 'static {
    futures::stream::unfold(Some((Some(header), file)), |state| async move {
        let (header, mut file) = state?;
        let mut data = vec![0u8; SNAPSHOT_CHUNK_BYTES];
        let mut filled = 0;
        while filled < data.len() {
            match file.read(&mut data[filled..]).await {
                Ok(0) => break,
                Ok(read) => filled += read,
                Err(error) => {
                    tracing::warn!(%error, "reading a snapshot to send failed");
                    return None;
                }
            }
        }
        data.truncate(filled);
        if filled == 0 && header.is_none() {
            return None;
        }
        let chunk = pb::SnapshotChunk {
            header: header.unwrap_or_default(),
            data,
        };
        Some((chunk, Some((None, file))))
    })
}

// Server side.

/// `resd.raft.v1.RaftService`: peers' raft RPCs into the local `Raft`, and forwarded storage
/// operations into the local backend.
#[derive(Clone)]
pub struct RaftGrpc {
    raft: Raft,
    backend: Arc<RaftBackend>,
}

impl RaftGrpc {
    pub fn new(raft: Raft, backend: Arc<RaftBackend>) -> Self {
        RaftGrpc { raft, backend }
    }

    pub fn into_server(self) -> proto::raft::v1::raft_service_server::RaftServiceServer<RaftGrpc> {
        proto::raft::v1::raft_service_server::RaftServiceServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }
}

fn bad_payload(error: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("undecodable raft payload: {error}"))
}

fn reply<T: serde::Serialize>(value: &T) -> Result<Response<pb::RaftMessage>, Status> {
    let payload = encode(value)
        .map_err(|error| Status::internal(format!("cannot encode a raft reply: {error}")))?;
    Ok(Response::new(pb::RaftMessage { payload }))
}

#[tonic::async_trait]
impl RaftService for RaftGrpc {
    async fn append_entries(
        &self,
        request: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let rpc: AppendEntriesRequest<TypeConfig> =
            decode(&request.into_inner().payload).map_err(bad_payload)?;
        reply(&self.raft.append_entries(rpc).await)
    }

    async fn vote(
        &self,
        request: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let rpc: VoteRequest<NodeId> =
            decode(&request.into_inner().payload).map_err(bad_payload)?;
        reply(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<Streaming<pb::SnapshotChunk>>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let mut chunks = request.into_inner();
        let first = chunks
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty snapshot stream"))?;
        let (vote, meta): (Vote, SnapshotMeta) = decode(&first.header).map_err(bad_payload)?;
        let receiving = self
            .raft
            .begin_receiving_snapshot()
            .await
            .map_err(|error| Status::unavailable(format!("cannot receive a snapshot: {error}")))?;
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
        file.write_all(&first.data).await.map_err(write_error)?;
        while let Some(chunk) = chunks.message().await? {
            file.write_all(&chunk.data).await.map_err(write_error)?;
        }
        file.sync_all().await.map_err(write_error)?;
        drop(file);
        let snapshot = Snapshot {
            meta,
            snapshot: receiving,
        };
        reply(&self.raft.install_full_snapshot(vote, snapshot).await)
    }

    async fn forward(
        &self,
        request: Request<pb::ForwardRequest>,
    ) -> Result<Response<pb::ForwardResponse>, Status> {
        Ok(Response::new(
            self.backend.serve_forwarded(request.into_inner()).await,
        ))
    }
}

/// Serves the raft service on `listener` until `shutdown` is cancelled.
pub async fn serve(
    listener: tokio::net::TcpListener,
    raft: Raft,
    backend: Arc<RaftBackend>,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(RaftGrpc::new(raft, backend).into_server())
        .serve_with_incoming_shutdown(
            crate::service::serve::nodelay_incoming(listener),
            shutdown.cancelled_owned(),
        )
        .await
}
