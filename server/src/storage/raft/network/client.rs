//! The client side openraft uses to reach peers: AppendEntries cut to a byte budget and
//! reported as partial success, votes, and snapshots streamed in chunks.

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
use proto::raft::v1::{self as pb};
use tokio::io::AsyncReadExt;
use tonic::transport::Channel;
use tonic::{Request, Status};

use super::super::schema;
use super::super::types::{NodeAddr, NodeId, Snapshot, TypeConfig, Vote};
use crate::tls::Dialer;
use crate::wire::raft::{PeerFailure, Wire, decode, encode};

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::pipe::{Link, PipeError};
use super::{Contacts, MAX_APPEND_BYTES, SNAPSHOT_CHUNK_BYTES, raft_client};

/// Creates [`NetworkClient`]s for openraft.
#[derive(Debug, Clone, Default)]
pub(crate) struct NetworkFactory {
    dialer: Dialer,
    contacts: Arc<Contacts>,
    /// One long-lived channel per peer (HTTP/2 multiplexes replication, heartbeats and votes;
    /// tonic reconnects it when the connection drops). openraft asks for a client per
    /// leadership check and per replication stream: without this, every linearizable read
    /// opened a connection to each peer.
    channels: HashMap<NodeId, Peer>,
}

/// A peer's channel and, over it, its append stream.
#[derive(Debug, Clone)]
struct Peer {
    addr: String,
    client: RaftServiceClient<Channel>,
    link: Arc<Link>,
    build: Arc<BuildCheck>,
}

/// When a peer last showed it checks fences ([`super::FENCE_HEADER`]): nothing is sent to it
/// (no entry it might apply unchecked) until it has, and again after a while.
#[derive(Debug, Default)]
struct BuildCheck {
    confirmed: std::sync::Mutex<Option<std::time::Instant>>,
}

/// How long a peer's build, once confirmed, is taken as known.
const BUILD_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

impl BuildCheck {
    fn fresh(&self) -> bool {
        self.confirmed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|at| at.elapsed() < BUILD_CHECK_EVERY)
    }

    fn confirm(&self) {
        *self.confirmed.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
    }
}

impl NetworkFactory {
    pub(crate) fn new(dialer: Dialer, contacts: Arc<Contacts>) -> Self {
        NetworkFactory {
            dialer,
            contacts,
            channels: HashMap::new(),
        }
    }

    /// The peer's channel, made on first use and again when its address changes.
    fn peer(&mut self, target: NodeId, addr: &str) -> Result<Peer, String> {
        if let Some(peer) = self.channels.get(&target)
            && peer.addr == addr
        {
            return Ok(peer.clone());
        }
        let client = raft_client(&self.dialer, addr, target)?;
        let peer = Peer {
            addr: addr.to_owned(),
            link: Arc::new(Link::new(
                client.clone(),
                format!("raft peer {target} at {addr}"),
            )),
            client,
            build: Arc::default(),
        };
        self.channels.insert(target, peer.clone());
        Ok(peer)
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = NetworkClient;

    async fn new_client(&mut self, target: NodeId, node: &NodeAddr) -> NetworkClient {
        let peer = self.peer(target, &node.raft_addr);
        NetworkClient {
            target,
            addr: node.raft_addr.clone(),
            link: peer.as_ref().ok().map(|peer| peer.link.clone()),
            build: peer.as_ref().ok().map(|peer| peer.build.clone()),
            client: peer.map(|peer| peer.client),
            contacts: self.contacts.clone(),
        }
    }
}

pub(crate) struct NetworkClient {
    target: NodeId,
    addr: String,
    client: Result<RaftServiceClient<Channel>, String>,
    /// AppendEntries on the peer's stream (`None` if the peer's address is unusable).
    link: Option<Arc<Link>>,
    /// Whether the peer is known to check fences.
    build: Option<Arc<BuildCheck>>,
    contacts: Arc<Contacts>,
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

    /// Refuses the answer of a peer of a build that does not check fences
    /// ([`super::FENCE_HEADER`]): this leader does not replicate to it.
    fn same_build(&self, metadata: &tonic::metadata::MetadataMap) -> Result<(), Unreachable> {
        if super::checks_fences(metadata) {
            return Ok(());
        }
        Err(Unreachable::new(&std::io::Error::other(
            super::earlier_build(&format!("{} at {}", self.target, self.addr)),
        )))
    }

    /// Makes sure the peer checks fences before anything is sent to it (a peer of an earlier
    /// build would apply what it is sent without checking): asked with a `Vouch` call, whose
    /// answer says it, at most every [`BUILD_CHECK_EVERY`].
    async fn ensure_same_build(&self) -> Result<(), Unreachable> {
        let Some(build) = &self.build else {
            return Ok(());
        };
        if build.fresh() {
            return Ok(());
        }
        let mut request = Request::new(pb::VouchRequest {
            node_id: self.target,
        });
        request.set_timeout(std::time::Duration::from_secs(2));
        super::mark_fences(request.metadata_mut());
        let reply = self
            .client()?
            .vouch(request)
            .await
            .map_err(|status| self.unreachable(&status))?;
        self.same_build(reply.metadata())?;
        build.confirm();
        Ok(())
    }

    fn decode_reply<T: Wire>(&self, payload: &[u8]) -> RpcResult<T> {
        self.contacts.heard(self.target);
        let reply: Result<T, PeerFailure> =
            decode(payload).map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
        reply.map_err(|failure| {
            RPCError::RemoteError(RemoteError::new(
                self.target,
                RaftError::Fatal(failure.into_fatal()),
            ))
        })
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
        self.ensure_same_build()
            .await
            .map_err(RPCError::Unreachable)?;
        let last_sent = rpc.entries.last().map(|entry| entry.log_id);

        let payload = encode(&rpc);
        let response: AppendEntriesResponse<NodeId> = match self
            .link
            .as_ref()
            .and_then(|link| link.pipe())
        {
            Some(pipe) => match pipe.call(payload, option.hard_ttl()).await {
                Ok(answer) => self.decode_reply(&answer)?,
                Err(PipeError::Unsupported) => {
                    if let Some(link) = &self.link {
                        link.unsupported();
                    }
                    return Err(RPCError::Unreachable(Unreachable::new(
                        &std::io::Error::other(format!(
                            "raft peer {} at {} does not serve AppendStream (an older build): retrying with calls",
                            self.target, self.addr
                        )),
                    )));
                }
                Err(PipeError::Failed(why)) => {
                    return Err(RPCError::Unreachable(Unreachable::new(
                        &std::io::Error::other(why),
                    )));
                }
            },
            None => {
                let mut request = Request::new(pb::RaftMessage { payload });
                request.set_timeout(option.hard_ttl());
                super::mark_fences(request.metadata_mut());
                let reply = self
                    .client()?
                    .append_entries(request)
                    .await
                    .map_err(|status| RPCError::Unreachable(self.unreachable(&status)))?;
                self.same_build(reply.metadata())?;
                self.decode_reply(&reply.into_inner().payload)?
            }
        };
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
        let payload = encode(&rpc);
        let mut request = Request::new(pb::RaftMessage { payload });
        request.set_timeout(option.hard_ttl());
        super::mark_fences(request.metadata_mut());
        let reply = self
            .client()?
            .vote(request)
            .await
            .map_err(|status| RPCError::Unreachable(self.unreachable(&status)))?;
        self.same_build(reply.metadata())?;
        self.decode_reply(&reply.into_inner().payload)
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<TypeConfig, Fatal<NodeId>>> {
        self.ensure_same_build()
            .await
            .map_err(StreamingError::Unreachable)?;
        let header = encode(&(vote, snapshot.meta.clone()));
        let file = tokio::fs::File::open(&snapshot.snapshot.path)
            .await
            .map_err(|error| StreamingError::Network(NetworkError::new(&error)))?;
        let chunks = snapshot_chunks(header, file, snapshot.snapshot.path.clone());
        let mut client = self.client().map_err(StreamingError::Unreachable)?;
        let mut request = Request::new(chunks);
        super::mark_fences(request.metadata_mut());
        let send = client.install_snapshot(request);
        let reply = tokio::select! {
            closed = cancel => return Err(StreamingError::Closed(closed)),
            reply = send => reply.map_err(|status| StreamingError::Unreachable(self.unreachable(&status)))?,
        };
        self.same_build(reply.metadata())
            .map_err(StreamingError::Unreachable)?;
        self.contacts.heard(self.target);
        let result: Result<SnapshotResponse<NodeId>, PeerFailure> =
            decode(&reply.into_inner().payload)
                .map_err(|error| StreamingError::Network(NetworkError::new(&error)))?;
        result.map_err(|failure| {
            StreamingError::RemoteError(RemoteError::new(self.target, failure.into_fatal()))
        })
    }
}

/// An entry's encoded size, near enough for the byte budget, without encoding it.
fn approximate_size(entry: &super::super::types::Entry) -> usize {
    const OVERHEAD: usize = 64;
    match &entry.payload {
        openraft::EntryPayload::Normal(command) => command.encoded().len() + OVERHEAD,
        openraft::EntryPayload::Membership(_) => 4096,
        openraft::EntryPayload::Blank => OVERHEAD,
    }
}

/// Reading a snapshot file to send it: the sum its bytes come to, and the sum recorded when it
/// was written.
struct Sending {
    file: tokio::fs::File,
    path: std::path::PathBuf,
    read: u64,
    hasher: crc32fast::Hasher,
    recorded: Option<schema::FileSum>,
}

/// The snapshot file as a stream of chunks, the header in the first, then the recorded sum in
/// a last chunk of its own. A file whose bytes no longer match its recorded sum is set aside
/// (the node builds a new snapshot the next time one is needed) and sent with the sum it should
/// have had, so the receiver refuses it.
fn snapshot_chunks(
    header: Vec<u8>,
    file: tokio::fs::File,
    path: std::path::PathBuf,
) -> impl Stream<Item = pb::SnapshotChunk> + Send + 'static {
    let recorded = path
        .parent()
        .and_then(|dir| std::fs::read_to_string(dir.join(schema::SNAPSHOT_SUM)).ok())
        .and_then(|text| schema::FileSum::parse(&text));
    let sending = Sending {
        file,
        path,
        read: 0,
        hasher: crc32fast::Hasher::new(),
        recorded,
    };
    futures::stream::unfold(Some((Some(header), sending)), |state| async move {
        let (header, mut sending) = state?;
        let file = &mut sending.file;
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
            return sending.last_chunk().map(|chunk| (chunk, None));
        }
        sending.read += filled as u64;
        sending.hasher.update(&data);
        let chunk = pb::SnapshotChunk {
            header: header.unwrap_or_default(),
            data,
            ..Default::default()
        };
        Some((chunk, Some((None, sending))))
    })
}

impl Sending {
    /// The chunk that ends the stream: the recorded sum (none for a snapshot of a build that
    /// kept none).
    fn last_chunk(self) -> Option<pb::SnapshotChunk> {
        let recorded = self.recorded?;
        let sent = schema::FileSum {
            len: self.read,
            crc: self.hasher.finalize(),
        };
        if sent != recorded
            && let Some(dir) = self.path.parent()
            && let Some(data_dir) = dir.parent().and_then(Path::parent).and_then(Path::parent)
        {
            let aside = schema::set_aside(data_dir, &[dir]);
            tracing::error!(
                snapshot = %dir.display(),
                set_aside = ?aside,
                "a raft snapshot being sent is damaged (its bytes no longer match the sum recorded when it was written); the follower refuses it, and a new one is built for the next try"
            );
        }
        Some(pb::SnapshotChunk {
            last: true,
            length: recorded.len,
            crc: recorded.crc,
            ..Default::default()
        })
    }
}
