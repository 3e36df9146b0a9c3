//! `resd.cluster.v1.ClusterService`: the published type registry, node status, membership.
//!
//! Members, Join and Remove need the leader; a follower forwards them to the leader's API
//! address.

use std::sync::Arc;
use std::time::Duration;

use proto::cluster::v1::cluster_service_client::ClusterServiceClient;
use proto::cluster::v1::{
    self as pb, JoinRequest, JoinResponse, ListTypesRequest, ListTypesResponse, MembersRequest,
    MembersResponse, RemoveRequest, RemoveResponse, SnapshotData, SnapshotRestoreResponse,
    SnapshotSaveRequest, StatusRequest, StatusResponse, TypeInfo, cluster_service_server,
};
use tonic::{Request, Response, Status, Streaming};

use super::{Error, NotLeader};

use crate::acl::{self, Access, AclsDisabled, TokenResolver};
use crate::cluster::{Cluster, Joiner};
use crate::registry::{Registry, Scope};
use crate::storage::raft::node::Role;
use crate::storage::raft::types::NodeAddr;
use crate::tls::{ConnInfo, Dialer, Refusals};

/// The token `AclBootstrap` creates.
pub(crate) const BOOTSTRAP_TOKEN: &str = "initial-management";
/// The file in a server's data directory that allows one more bootstrap: it names the reset
/// index the refusal quoted (Consul's `acl-bootstrap-reset`).
pub(crate) const ACL_BOOTSTRAP_RESET_FILE: &str = "acl-bootstrap-reset";

/// How long `Members` waits for the leader before answering with this node's own view.
const LEADER_ANSWER: Duration = Duration::from_secs(1);

/// How long a forwarded membership call may take (adding a voter waits for it to catch up).
const MEMBERSHIP_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) mod external;
mod restore;

/// Another member, to forward a call to.
struct Peer {
    id: u64,
    api_addr: String,
}

#[derive(Debug, Clone)]
pub(crate) struct ClusterGrpc {
    registry: Arc<Registry>,
    /// Limits restored records and snapshots are checked against.
    max_resource_bytes: usize,
    max_snapshot_bytes: u64,
    /// The cluster this node belongs to (none with in-memory storage).
    raft: Option<Arc<dyn Cluster>>,
    /// This node's API address, for the standalone (in-memory) status.
    api_addr: String,
    cluster_name: String,
    controllers: Option<ControllerReport>,
    /// How this node reaches the others' APIs.
    dialer: Dialer,
    /// Refused joins, logged once per peer.
    refusals: Arc<Refusals>,
    /// Resolves the callers' tokens (ACLs off: everyone may do everything).
    tokens: Arc<dyn TokenResolver>,
    /// The resource service, for bootstrapping ACLs.
    service: Option<Arc<super::ResourceService>>,
    /// When this server saw each external replica's report change.
    reports: Arc<external::ReportClock>,
}

/// What this node's controllers report for `ListControllers`, asked at each call (the
/// controller runtime provides it; the service only serves it).
#[derive(Clone)]
pub(crate) struct ControllerReport(pub Arc<dyn Fn() -> Vec<pb::ControllerInfo> + Send + Sync>);

impl std::fmt::Debug for ControllerReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ControllerReport")
    }
}

impl ClusterGrpc {
    pub(crate) fn new(
        registry: Arc<Registry>,
        raft: Option<Arc<dyn Cluster>>,
        api_addr: String,
    ) -> Self {
        ClusterGrpc {
            registry,
            max_resource_bytes: super::DEFAULT_MAX_RESOURCE_BYTES,
            max_snapshot_bytes: crate::storage::raft::node::DEFAULT_MAX_SNAPSHOT_BYTES,
            raft,
            api_addr,
            cluster_name: String::new(),
            controllers: None,
            dialer: Dialer::default(),
            refusals: Arc::default(),
            tokens: Arc::new(AclsDisabled),
            service: None,
            reports: Arc::default(),
        }
    }

    /// The clock of external replicas' reports, for the agent to keep current.
    pub(crate) fn report_clock(&self) -> Arc<external::ReportClock> {
        self.reports.clone()
    }

    /// Reaches other members (forwarding to the leader, asking for their controllers) through
    /// `dialer`; with TLS, also requires a joining node to present its node certificate.
    pub(crate) fn with_dialer(mut self, dialer: Dialer) -> Self {
        self.dialer = dialer;
        self
    }

    /// Checks restores against these limits (the node's `--max-resource-bytes` and
    /// `--max-snapshot-bytes`).
    pub(crate) fn with_limits(
        mut self,
        max_resource_bytes: usize,
        max_snapshot_bytes: u64,
    ) -> Self {
        self.max_resource_bytes = max_resource_bytes;
        self.max_snapshot_bytes = max_snapshot_bytes;
        self
    }

    /// Authorizes every call with `tokens` (DESIGN §12.3) and bootstraps ACLs through
    /// `service`.
    pub(crate) fn with_acls(
        mut self,
        tokens: Arc<dyn TokenResolver>,
        service: Arc<super::ResourceService>,
    ) -> Self {
        self.tokens = tokens;
        self.service = Some(service);
        self
    }

    /// Reports this name in `Status`.
    pub(crate) fn with_cluster_name(mut self, name: String) -> Self {
        self.cluster_name = name;
        self
    }

    /// Reports these controllers in `ListControllers`.
    pub(crate) fn with_controllers(mut self, controllers: ControllerReport) -> Self {
        self.controllers = Some(controllers);
        self
    }

    fn local_controllers(&self) -> pb::NodeControllers {
        let status = self.raft.as_ref().map(|raft| raft.status());
        let controllers = self
            .controllers
            .as_ref()
            .map(|report| (report.0)())
            .unwrap_or_default();
        pb::NodeControllers {
            node_id: status.as_ref().map(|s| s.node_id).unwrap_or(0),
            api_addr: status
                .map(|s| s.node.api_addr)
                .unwrap_or_else(|| self.api_addr.clone()),
            controllers,
            error: String::new(),
        }
    }

    /// The raft backend, for calls a removed node cannot serve.
    fn raft(&self) -> Result<&Arc<dyn Cluster>, Status> {
        let raft = self.any_raft()?;
        match raft.removed() {
            Some(why) => Err(Status::from(Error::Removed(why))),
            None => Ok(raft),
        }
    }

    /// The raft backend, also of a removed node (its status).
    fn any_raft(&self) -> Result<&Arc<dyn Cluster>, Status> {
        self.raft.as_ref().ok_or_else(|| {
            Status::from(Error::FailedPrecondition(
                "this server runs with in-memory storage and has no cluster: start it with raft storage (the default) to form one".into(),
            ))
        })
    }

    /// The members as this node knows them. The leader's view (`leading`) adds who leads,
    /// matches, lags and reachability; another node's own view (no leader answers) has none of
    /// them and says so (`no_leader`).
    fn members_view(raft: &dyn Cluster, leading: bool) -> MembersResponse {
        let status = raft.status();
        let members = raft
            .members()
            .into_iter()
            .map(|member| {
                let known = pb::Member {
                    node_id: member.node_id,
                    api_addr: member.node.api_addr,
                    raft_addr: member.node.raft_addr,
                    voter: member.voter,
                    ..Default::default()
                };
                if !leading {
                    return known;
                }
                pb::Member {
                    leader: member.leader,
                    match_index: member.match_index.unwrap_or(0),
                    lag: member.lag,
                    reachable: member.reachable,
                    ..known
                }
            })
            .collect();
        MembersResponse {
            members,
            leader_id: if leading { status.node_id } else { 0 },
            term: status.term,
            no_leader: !leading,
            answered_by: status.node_id,
        }
    }

    /// The leader's API address when another node leads; `None` when this node leads.
    fn leader_elsewhere(&self, raft: &dyn Cluster) -> Result<Option<Peer>, Status> {
        let status = raft.status();
        match status.leader {
            Some((id, _)) if id == status.node_id => Ok(None),
            Some((id, node)) if !node.api_addr.is_empty() => Ok(Some(Peer {
                id,
                api_addr: node.api_addr,
            }))
            .inspect(|_| {
                tracing::debug!(leader = id, "forwarding a membership call to the leader");
            }),
            Some((id, _)) => Err(Status::from(Error::Unavailable(format!(
                "leader {id} has no known API address"
            )))),
            None => Err(Status::from(Error::NoQuorum(
                "no raft leader is elected right now; retry shortly".into(),
            ))),
        }
    }

    /// A client of another member's API (with TLS, presenting this node's certificate and
    /// expecting that member's).
    async fn member_client(
        &self,
        peer: &Peer,
    ) -> Result<ClusterServiceClient<tonic::transport::Channel>, Status> {
        let Peer { id, api_addr } = peer;
        let endpoint = self
            .dialer
            .endpoint(api_addr, Some(*id))
            .map_err(|why| {
                Status::from(Error::Internal(format!("API address of node {id}: {why}")))
            })?
            .connect_timeout(Duration::from_secs(5));
        let channel = endpoint.connect().await.map_err(|error| {
            Status::from(Error::Unavailable(format!(
                "cannot reach node {id} at {api_addr}: {}",
                crate::tls::describe_connect_error(&error)
            )))
        })?;
        Ok(ClusterServiceClient::new(channel))
    }
}

/// When a long cluster call (join, remove, transfer) must answer: a moment before the caller's
/// deadline, or in 30 s when it set none.
fn answer_by<T>(request: &Request<T>) -> std::time::Instant {
    super::grpc::deadline(request)
        .ok()
        .flatten()
        .and_then(|at| at.checked_sub(Duration::from_millis(500)))
        .unwrap_or_else(|| std::time::Instant::now() + Duration::from_secs(30))
}

/// What a cluster call needs of its caller (DESIGN §12.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    /// Any valid token.
    Token,
    /// Operator access at least this.
    Operator(Access),
    /// The `join` right (what `--join-token` carries), not operator access.
    Join,
    /// Everything a snapshot holds: operator write, `acl` read (token records) and read on
    /// every resource.
    SnapshotSave,
    /// Everything (a restore replaces every resource and every token): management.
    Management,
}

/// An authorized caller: its token (forwarded with calls to other members) and connection.
struct Caller {
    token: Option<String>,
    conn: ConnInfo,
}

impl ClusterGrpc {
    /// Authorizes a call: with ACLs on, the token must be valid and grant `need`. A node
    /// certificate of this cluster (TLS) stands for the node itself, which may ask for the
    /// members and join (`node_may`).
    /// [`Self::authorize_now`], decided again once this node has caught up with the leader
    /// when it refused (a token or policy acknowledged elsewhere a moment ago; DESIGN §15). A
    /// node that cannot catch up says why rather than refuse.
    /// The resource service and the caller's grants as they are once this node has applied
    /// what was acknowledged before the call (any valid token; what it may do is the service's
    /// to decide). `doing` names the call for a server without a resource service.
    async fn caller_on_service<T>(
        &self,
        request: &Request<T>,
        doing: &str,
    ) -> Result<(&super::ResourceService, Arc<dyn acl::Authorizer>), Status> {
        let caller = self.authorize(request, Need::Token, false).await?;
        let Some(service) = &self.service else {
            return Err(Status::unimplemented(format!(
                "this server has no resource service to {doing} against"
            )));
        };
        service.sync().await.map_err(Status::from)?;
        let resolved = self
            .tokens
            .resolve(caller.token.as_deref())
            .map_err(Error::from);
        super::grpc::note_caller(request, &resolved);
        Ok((service, resolved.map_err(Status::from)?))
    }

    async fn authorize<T>(
        &self,
        request: &Request<T>,
        need: Need,
        node_may: bool,
    ) -> Result<Caller, Status> {
        match self.authorize_now(request, need, node_may) {
            Err(refused)
                if matches!(
                    refused.code(),
                    tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
                ) && super::grpc::token_of(request).ok().flatten().is_some() =>
            {
                let Some(service) = &self.service else {
                    return Err(refused);
                };
                service.sync().await.map_err(Status::from)?;
                self.authorize_now(request, need, node_may)
            }
            other => other,
        }
    }

    fn authorize_now<T>(
        &self,
        request: &Request<T>,
        need: Need,
        node_may: bool,
    ) -> Result<Caller, Status> {
        let conn = ConnInfo::of(request);
        let token = super::grpc::token_of(request).map_err(Status::from)?;
        let caller = Caller { token, conn };
        if node_may
            && self.dialer.tls().is_some()
            && caller
                .conn
                .peer
                .as_ref()
                .is_some_and(|peer| peer.node_id.is_some())
        {
            return Ok(caller);
        }
        let resolved = self
            .tokens
            .resolve(caller.token.as_deref())
            .map_err(Error::from);
        super::grpc::note_caller(request, &resolved);
        let authorizer = resolved.map_err(Status::from)?;
        let refused =
            |why: &str| Status::from(Error::from(acl::AclError::PermissionDenied(why.into())));
        match need {
            Need::Token => {}
            Need::Operator(access) => acl::require_operator(authorizer.as_ref(), access)
                .map_err(|error| Status::from(Error::from(error)))?,
            Need::Join => {
                if !authorizer.may_join() {
                    return Err(refused(
                        "token lacks the join right (a policy's `join: true` grants it; operator access does not)",
                    ));
                }
            }
            Need::SnapshotSave => {
                acl::require_operator(authorizer.as_ref(), Access::Write)
                    .and_then(|()| acl::require_acl(authorizer.as_ref(), Access::Read))
                    .map_err(|error| Status::from(Error::from(error)))?;
                if !authorizer.reads_everything() {
                    return Err(refused(
                        "token lacks read on some resources, and a snapshot holds every resource",
                    ));
                }
            }
            Need::Management => {
                if !authorizer.is_management() {
                    return Err(refused(&format!(
                        "only a {} token may restore a snapshot (it replaces every resource and every token)",
                        acl::MANAGEMENT_POLICY
                    )));
                }
            }
        }
        Ok(caller)
    }

    /// A request to another member on behalf of `caller` (its token travels along).
    fn on_behalf<T>(caller: &Caller, message: T, timeout: Duration) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(timeout);
        if let Some(token) = &caller.token
            && let Ok(value) = tonic::metadata::MetadataValue::try_from(token.as_str())
        {
            request
                .metadata_mut()
                .insert(super::grpc::TOKEN_HEADER, value);
        }
        request
    }

    /// With TLS, a node joins by proving who it is (DESIGN §12.2): the connection must present
    /// the certificate of the node it joins as (it asks the leader itself).
    fn check_joiner(&self, caller: &ConnInfo, joining: u64) -> Result<(), Status> {
        if self.dialer.tls().is_none() {
            return Ok(());
        }
        let refused = match caller.peer.as_deref() {
            // Its own id only: a member's certificate does not vouch for another node (with
            // TLS a joiner asks the leader itself; followers do not forward joins).
            Some(peer) => match peer.node_id {
                Some(id) if id == joining => return Ok(()),
                Some(id) => {
                    format!("node {id}'s certificate cannot join the cluster as node {joining}")
                }
                None => format!(
                    "{} cannot join the cluster: a node joins with its own node certificate",
                    peer.describe()
                ),
            },
            None => format!(
                "joining as node {joining} needs node {joining}'s certificate ({}); start the agent with --tls-cert and --tls-key",
                crate::tls::node_name(joining, &self.cluster_name)
            ),
        };
        self.refusals.warn("join", caller.remote_ip(), &refused);
        Err(Status::from(Error::PermissionDenied(refused)))
    }
}

fn role(role: Role) -> pb::Role {
    match role {
        Role::Leader => pb::Role::Leader,
        Role::Follower => pb::Role::Follower,
        Role::Candidate => pb::Role::Candidate,
        Role::Learner => pb::Role::Learner,
        Role::Shutdown => pb::Role::Shutdown,
    }
}

/// What ListTypes says of a registered type's version (DESIGN §15.1): its columns, whether
/// it is deprecated, and its Type's storage version.
fn version_info(registration: &crate::registry::Registration) -> TypeInfo {
    let Some(installed) = &registration.registered else {
        return TypeInfo::default();
    };
    let family = &installed.family;
    let version = family.version(&registration.resource_type.group_version);
    TypeInfo {
        columns: version.map(|v| v.columns.clone()).unwrap_or_default(),
        deprecated: version.is_some_and(|v| v.deprecated),
        deprecation_message: version
            .filter(|v| v.deprecated)
            .map(|v| v.warning.clone())
            .unwrap_or_default(),
        storage_version: family.storage.clone(),
        ..TypeInfo::default()
    }
}

/// Most types one page of ListTypes holds.
const MAX_TYPES_PAGE: u32 = 500;
/// Most bytes of descriptors one page of ListTypes holds (a page of one type may hold more).
const MAX_TYPES_PAGE_BYTES: usize = 2 << 20;
/// Most bytes of descriptors an unpaged ListTypes answers (clients before paging); past it the
/// caller is told to ask in pages.
const MAX_UNPAGED_TYPES_BYTES: usize = 32 << 20;

#[tonic::async_trait]
impl cluster_service_server::ClusterService for ClusterGrpc {
    async fn list_types(
        &self,
        request: Request<ListTypesRequest>,
    ) -> Result<Response<ListTypesResponse>, Status> {
        self.authorize(&request, Need::Token, false).await?;
        // Types registered at runtime as committed now, not as this node has applied them yet:
        // a client that registered one and asks next learns it wherever it asks.
        // Without a leader the node answers what it has (as every default read does).
        if let Some(service) = &self.service
            && let Err(error) = service.sync().await
        {
            tracing::debug!(%error, "ListTypes answers from this node's registry: cannot catch up");
        }
        let request = request.into_inner();
        let all: Vec<_> = self.registry.types().collect();
        let (page, next_page_token, file_descriptor_set) = if request.page_size > 0 {
            // Ordered by group, version and kind; a page starts after the token's type and
            // holds at most MAX_TYPES_PAGE types, and descriptors of at most
            // MAX_TYPES_PAGE_BYTES (one type at least, whatever its size).
            let start = all
                .iter()
                .position(|registration| {
                    request.page_token.is_empty() || registration.gvk() > request.page_token
                })
                .unwrap_or(all.len());
            let end = start
                .saturating_add(request.page_size.min(MAX_TYPES_PAGE) as usize)
                .min(all.len());
            let (taken, set) = self
                .registry
                .descriptor_set_within(&all[start..end], MAX_TYPES_PAGE_BYTES);
            let end = start + taken;
            let next = if end < all.len() && end > start {
                all[end - 1].gvk()
            } else {
                String::new()
            };
            (all[start..end].to_vec(), next, set)
        } else {
            let set = self.registry.descriptor_set();
            if set.len() > MAX_UNPAGED_TYPES_BYTES {
                return Err(Status::resource_exhausted(format!(
                    "the registry's descriptors are {} bytes, too many for one answer: ask ListTypes in pages (page_size, page_token), as resctl and the dashboard do",
                    set.len()
                )));
            }
            (all, String::new(), set)
        };
        let types = page
            .iter()
            .map(|registration| TypeInfo {
                r#type: Some(registration.resource_type.clone()),
                scope: match registration.scope {
                    Scope::Cluster => pb::Scope::Cluster,
                    Scope::Partition => pb::Scope::Partition,
                    Scope::Namespace => pb::Scope::Namespace,
                    Scope::Any => pb::Scope::Any,
                } as i32,
                message_name: registration.message_name.clone(),
                builtin: registration.registered.is_none(),
                registered_by: registration
                    .registered
                    .as_ref()
                    .map(|installed| installed.name.clone())
                    .unwrap_or_default(),
                deleting: registration
                    .registered
                    .as_ref()
                    .is_some_and(|installed| installed.deleting),
                ..version_info(registration)
            })
            .collect();
        Ok(Response::new(ListTypesResponse {
            types,
            file_descriptor_set,
            next_page_token,
        }))
    }

    async fn acl_check(
        &self,
        request: Request<proto::cluster::v1::AclCheckRequest>,
    ) -> Result<Response<proto::cluster::v1::AclCheckResponse>, Status> {
        let (service, authorizer) = self.caller_on_service(&request, "check access").await?;
        let request = request.into_inner();
        let subject = if request.token_name.is_empty() {
            authorizer
        } else {
            acl::require_acl(authorizer.as_ref(), Access::Read).map_err(|error| {
                Status::from(Error::from(acl::AclError::PermissionDenied(format!(
                    "asking for another token ({}) needs acl read: {error}",
                    request.token_name
                ))))
            })?;
            self.tokens
                .named(&request.token_name)
                .map_err(|why| Status::from(Error::NotFound(why)))?
        };
        let answer = service
            .acl_check(subject.as_ref(), request.id, &request.verb)
            .map_err(Status::from)?;
        Ok(Response::new(answer))
    }

    async fn plan_policy(
        &self,
        request: Request<proto::cluster::v1::PlanPolicyRequest>,
    ) -> Result<Response<proto::cluster::v1::PlanPolicyResponse>, Status> {
        let (service, authorizer) = self.caller_on_service(&request, "plan a policy").await?;
        let plan = service
            .plan_policy(authorizer.as_ref(), request.into_inner().policy)
            .await
            .map_err(Status::from)?;
        Ok(Response::new(plan))
    }

    async fn plan_type(
        &self,
        request: Request<proto::cluster::v1::PlanTypeRequest>,
    ) -> Result<Response<proto::cluster::v1::PlanTypeResponse>, Status> {
        // What writing the Type needs (DESIGN §15.1).
        let (service, authorizer) = self.caller_on_service(&request, "plan a Type").await?;
        let plan = service
            .plan_type(authorizer.as_ref(), request.into_inner().r#type)
            .await
            .map_err(Status::from)?;
        Ok(Response::new(plan))
    }

    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        self.authorize(&request, Need::Operator(Access::Read), false)
            .await?;
        let Some(raft) = &self.raft else {
            return Ok(Response::new(StatusResponse {
                node_id: 0,
                api_addr: self.api_addr.clone(),
                role: pb::Role::Standalone as i32,
                storage: "memory".into(),
                cluster_name: self.cluster_name.clone(),
                ready: true,
                ..Default::default()
            }));
        };
        let status = raft.status();
        // The same test as /readyz: ready means serving (caught up, a voter, a leader known).
        let not_ready = raft.serving().err();
        if raft.removed().is_some() {
            return Ok(Response::new(StatusResponse {
                node_id: status.node_id,
                api_addr: status.node.api_addr,
                raft_addr: status.node.raft_addr,
                role: pb::Role::Removed as i32,
                term: status.term,
                storage: "raft".into(),
                cluster_name: self.cluster_name.clone(),
                ready: false,
                not_ready_reason: not_ready.unwrap_or_default(),
                ..Default::default()
            }));
        }
        let (leader_id, leader_api_addr) = status
            .leader
            .map(|(id, node)| (id, node.api_addr))
            .unwrap_or_default();
        Ok(Response::new(StatusResponse {
            node_id: status.node_id,
            api_addr: status.node.api_addr,
            raft_addr: status.node.raft_addr,
            role: role(status.role) as i32,
            term: status.term,
            leader_id,
            leader_api_addr,
            commit_index: status.commit_index,
            applied_index: status.applied_index,
            last_log_index: status.last_log_index,
            storage: "raft".into(),
            snapshot_index: status.snapshot_index,
            log_commits: status.log_commits,
            log_entries: status.log_entries,
            log_operations: status.log_operations,
            cluster_name: self.cluster_name.clone(),
            ready: not_ready.is_none(),
            not_ready_reason: not_ready.unwrap_or_default(),
            write_rate: status.recent.write_rate,
            apply_p99_ms: status.recent.p99_ms,
            writes_per_second: status.recent.writes_per_second,
            disk_free_bytes: status.disk_free_bytes,
            alarms: status.alarms,
        }))
    }

    async fn members(
        &self,
        request: Request<MembersRequest>,
    ) -> Result<Response<MembersResponse>, Status> {
        let caller = self
            .authorize(&request, Need::Operator(Access::Read), true)
            .await?;
        let raft = self.raft()?;
        // Without a leader to ask (none known, or it does not answer within a second), this
        // node's own view, marked as such: an operator whose cluster lost its quorum sees at
        // once who the members are.
        let leader = match self.leader_elsewhere(raft.as_ref()) {
            Ok(leader) => leader,
            Err(_) => return Ok(Response::new(Self::members_view(raft.as_ref(), false))),
        };
        if let Some(leader) = leader {
            let asked = tokio::time::timeout(LEADER_ANSWER, async {
                self.member_client(&leader)
                    .await?
                    .members(Self::on_behalf(
                        &caller,
                        request.into_inner(),
                        MEMBERSHIP_TIMEOUT,
                    ))
                    .await
            })
            .await;
            return match asked {
                Ok(Err(status)) if status.code() != tonic::Code::Unavailable => Err(status),
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(_)) | Err(_) => Ok(Response::new(Self::members_view(raft.as_ref(), false))),
            };
        }
        Ok(Response::new(Self::members_view(raft.as_ref(), true)))
    }

    async fn join(&self, request: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status> {
        let authorized = self.authorize(&request, Need::Join, true).await?;
        let raft = self.raft()?;
        let caller = authorized.conn.clone();
        let join_deadline = answer_by(&request);
        let join = request.into_inner();
        if join.node_id == 0 {
            return Err(Status::from(Error::InvalidArgument(
                "node_id is required and must not be 0".into(),
            )));
        }
        self.check_joiner(&caller, join.node_id)?;
        if join.raft_addr.is_empty() || join.api_addr.is_empty() {
            return Err(Status::from(Error::InvalidArgument(
                "api_addr and raft_addr are required".into(),
            )));
        }
        if let Some(leader) = self.leader_elsewhere(raft.as_ref())? {
            if self.dialer.tls().is_some() {
                // The leader checks the joiner's own certificate: this node cannot pass it on.
                return Err(Status::from(Error::NotLeader(NotLeader {
                    node: raft.id(),
                    leader_id: leader.id,
                    leader_addr: leader.api_addr,
                    why: "with TLS, only the leader can check the joiner's own certificate",
                })));
            }
            return self
                .member_client(&leader)
                .await?
                .join(Self::on_behalf(&authorized, join, MEMBERSHIP_TIMEOUT))
                .await;
        }
        // A removed node keeps its removal in its data directory and serves nothing: whether
        // it may join again is the cluster's rule, from the record of its removal.
        let removed = match &self.service {
            Some(service) => service
                .removed_member(join.node_id)
                .await
                .map_err(Status::from)?,
            None => None,
        };
        let joiner = Joiner {
            node_id: join.node_id,
            node: NodeAddr {
                api_addr: join.api_addr.clone(),
                raft_addr: join.raft_addr.clone(),
            },
            from_node: join.from_node,
        };
        raft.join(
            joiner,
            removed.as_ref().map(|record| record.raft_addr.clone()),
            join_deadline,
        )
        .await
        .map_err(|why| Status::from(Error::from(why)))?;
        // It joined again with a data directory that carries no removal.
        if removed.is_some()
            && let Some(service) = &self.service
            && let Err(error) = service.forget_removed_member(join.node_id).await
        {
            tracing::warn!(node_id = join.node_id, %error, "the record of the node's earlier removal stays");
        }
        Ok(Response::new(JoinResponse {
            leader_id: raft.id(),
        }))
    }

    async fn list_controllers(
        &self,
        request: Request<pb::ListControllersRequest>,
    ) -> Result<Response<pb::ListControllersResponse>, Status> {
        let caller = self
            .authorize(&request, Need::Operator(Access::Read), false)
            .await?;
        let local = self.local_controllers();
        // Replicas outside the server are the cluster's, not a node's: listed once, here.
        let external = match &self.service {
            Some(service) => external::external_replicas(service, &self.reports)
                .await
                .map_err(Status::from)?,
            None => Vec::new(),
        };
        let Some(raft) = self.raft.as_ref().filter(|_| request.get_ref().all_nodes) else {
            return Ok(Response::new(pb::ListControllersResponse {
                nodes: vec![local],
                external,
            }));
        };
        let mut nodes = Vec::new();
        for member in raft.members() {
            if member.node_id == raft.id() {
                nodes.push(local.clone());
                continue;
            }
            let asked = async {
                let mut client = self
                    .member_client(&Peer {
                        id: member.node_id,
                        api_addr: member.node.api_addr.clone(),
                    })
                    .await?;
                let call = Self::on_behalf(
                    &caller,
                    pb::ListControllersRequest { all_nodes: false },
                    Duration::from_secs(5),
                );
                client.list_controllers(call).await
            };
            match asked.await {
                Ok(reply) => nodes.extend(reply.into_inner().nodes),
                Err(status) => nodes.push(pb::NodeControllers {
                    node_id: member.node_id,
                    api_addr: member.node.api_addr.clone(),
                    controllers: Vec::new(),
                    error: status.message().to_owned(),
                }),
            }
        }
        Ok(Response::new(pb::ListControllersResponse {
            nodes,
            external,
        }))
    }

    type SnapshotSaveStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<SnapshotData, Status>> + Send>>;

    async fn snapshot_save(
        &self,
        request: Request<SnapshotSaveRequest>,
    ) -> Result<Response<Self::SnapshotSaveStream>, Status> {
        self.authorize(&request, Need::SnapshotSave, false).await?;
        let raft = self.raft()?;
        let built_in: std::collections::HashSet<(String, String)> = self
            .registry
            .types()
            .filter(|registration| registration.registered.is_none())
            .map(|registration| {
                (
                    registration.resource_type.group.clone(),
                    registration.resource_type.kind.clone(),
                )
            })
            .collect();
        let chunks = raft
            .export(Arc::new(move |group: &str, kind: &str| {
                built_in.contains(&(group.to_owned(), kind.to_owned()))
            }))
            .await
            .map_err(|error| Status::from(Error::from(error)))?;
        tracing::info!("streaming an operator snapshot");
        let stream = futures::stream::unfold(chunks, |mut chunks| async move {
            let chunk = chunks.recv().await?;
            let item = chunk
                .map(|data| SnapshotData { data })
                .map_err(|error| Status::from(Error::from(error)));
            Some((item, chunks))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn snapshot_restore(
        &self,
        request: Request<Streaming<SnapshotData>>,
    ) -> Result<Response<SnapshotRestoreResponse>, Status> {
        let caller = self.authorize(&request, Need::Management, false).await?;
        let raft = self.raft()?;
        let mut chunks = request.into_inner();
        let spooled =
            restore::receive(&mut chunks, &raft.spool_dir(), self.max_snapshot_bytes).await?;
        let spooled = {
            let max_resource_bytes = self.max_resource_bytes;
            tokio::task::spawn_blocking(move || spooled.check(max_resource_bytes).map(|()| spooled))
                .await
                .map_err(|error| {
                    Status::from(Error::Internal(format!("checking the snapshot: {error}")))
                })??
        };
        let header = spooled.header.clone();
        // The upload took a while: the caller is judged again as the cluster knows the ACLs
        // now (a management token deleted meanwhile restores nothing).
        if let Some(service) = &self.service {
            service.sync().await.map_err(Status::from)?;
        }
        if self.tokens.enabled() {
            let authorizer = self
                .tokens
                .resolve(caller.token.as_deref())
                .map_err(|error| Status::from(Error::from(error)))?;
            if !authorizer.is_management() {
                return Err(Status::from(Error::from(acl::AclError::PermissionDenied(
                    format!(
                        "only a {} token may restore a snapshot, and this one no longer is one",
                        acl::MANAGEMENT_POLICY
                    ),
                ))));
            }
        }
        if let Some(leader) = self.leader_elsewhere(raft.as_ref())? {
            let request = Self::on_behalf(&caller, spooled.upload()?, MEMBERSHIP_TIMEOUT);
            return self
                .member_client(&leader)
                .await?
                .snapshot_restore(request)
                .await;
        }
        tracing::warn!(
            resources = header.resource_count,
            from_index = header.raft_index,
            "restoring the cluster state from an operator snapshot"
        );
        let restored_index = raft
            .restore(spooled.chunks()?)
            .await
            .map_err(|error| Status::from(Error::from(error)))?;
        tracing::info!(
            resources = header.resource_count,
            restored_index,
            "restored the cluster state from an operator snapshot"
        );
        Ok(Response::new(SnapshotRestoreResponse {
            header: Some(header),
            restored_index,
        }))
    }

    async fn remove(
        &self,
        request: Request<RemoveRequest>,
    ) -> Result<Response<RemoveResponse>, Status> {
        let caller = self
            .authorize(&request, Need::Operator(Access::Write), false)
            .await?;
        let raft = self.raft()?;
        let deadline = answer_by(&request);
        let remove = request.into_inner();
        if let Some(leader) = self.leader_elsewhere(raft.as_ref())? {
            return self
                .member_client(&leader)
                .await?
                .remove(Self::on_behalf(&caller, remove, MEMBERSHIP_TIMEOUT))
                .await;
        }
        let removed_member = raft
            .remove(remove.node_id, remove.force, deadline)
            .await
            .map_err(|why| Status::from(Error::from(why)))?;
        // Recorded within the caller's deadline: a leader that removed itself records it
        // through the next leader, which an election may take a while to name; the removal
        // itself is done, and the caller hears so in time.
        if let Some(service) = &self.service {
            let record = service.record_removed_member(proto::internal::v1::RemovedMember {
                node_id: remove.node_id,
                raft_addr: removed_member.raft_addr.clone(),
                api_addr: removed_member.api_addr.clone(),
            });
            let recorded = tokio::time::timeout_at(deadline.into(), record)
                .await
                .unwrap_or_else(|_| {
                    Err(Error::Unavailable(
                        "the caller's deadline passed first".into(),
                    ))
                });
            if let Err(error) = recorded {
                tracing::warn!(node_id = remove.node_id, %error, "the removal is not recorded: a join of this id with its old data directory is not refused");
            }
        }
        if remove.node_id != raft.id() {
            raft.notify_removed(remove.node_id, removed_member.raft_addr);
        }
        Ok(Response::new(RemoveResponse {}))
    }

    async fn transfer_leader(
        &self,
        request: Request<pb::TransferLeaderRequest>,
    ) -> Result<Response<pb::TransferLeaderResponse>, Status> {
        let caller = self
            .authorize(&request, Need::Operator(Access::Write), false)
            .await?;
        let raft = self.raft()?;
        let deadline = answer_by(&request);
        let transfer = request.into_inner();
        let answer = |leader_id| Ok(Response::new(pb::TransferLeaderResponse { leader_id }));
        if transfer.campaign {
            if transfer.to_node_id != raft.id() {
                return Err(Status::from(Error::InvalidArgument(format!(
                    "node {} cannot campaign for node {}",
                    raft.id(),
                    transfer.to_node_id
                ))));
            }
            raft.campaign(deadline)
                .await
                .map_err(|why| Status::from(Error::from(why)))?;
            tracing::info!(node_id = raft.id(), "took over leadership on request");
            return answer(raft.id());
        }
        if let Some(leader) = self.leader_elsewhere(raft.as_ref())? {
            return self
                .member_client(&leader)
                .await?
                .transfer_leader(Self::on_behalf(&caller, transfer, MEMBERSHIP_TIMEOUT))
                .await;
        }
        let to = (transfer.to_node_id != 0).then_some(transfer.to_node_id);
        let handover = raft
            .prepare_handover(to, deadline)
            .await
            .map_err(|why| Status::from(Error::from(why)))?;
        let target = handover.target;
        if handover.pause.is_none() {
            return answer(target);
        }
        tracing::info!(from = raft.id(), to = target, "handing leadership over");
        let remaining = deadline.saturating_duration_since(std::time::Instant::now());
        let result = async {
            self.member_client(&Peer {
                id: target,
                api_addr: handover.api_addr.clone(),
            })
            .await?
            .transfer_leader(Self::on_behalf(
                &caller,
                pb::TransferLeaderRequest {
                    to_node_id: target,
                    campaign: true,
                },
                remaining.max(Duration::from_secs(1)),
            ))
            .await
        }
        .await;
        drop(handover);
        result
    }

    async fn acl_bootstrap(
        &self,
        _request: Request<pb::AclBootstrapRequest>,
    ) -> Result<Response<pb::AclBootstrapResponse>, Status> {
        let (Some(service), true) = (&self.service, self.tokens.enabled()) else {
            return Err(Status::from(Error::FailedPrecondition(
                "ACLs are disabled on this server: start every agent with --acl-enabled".into(),
            )));
        };
        // A reset names the bootstrap's index in a file on this server's disk.
        let reset_file = self
            .raft
            .as_ref()
            .map(|raft| raft.data_dir().join(ACL_BOOTSTRAP_RESET_FILE));
        let reset_index = reset_file
            .as_ref()
            .and_then(|path| std::fs::read_to_string(path).ok())
            .map(|text| text.trim().to_owned());
        let secret = proto::tls::new_secret()
            .map_err(|why| Status::from(Error::Internal(format!("cannot make a secret: {why}"))))?;
        service
            .bootstrap_acls(BOOTSTRAP_TOKEN, &secret, reset_index.as_deref())
            .await
            .map_err(Status::from)?;
        if reset_index.is_some()
            && let Some(path) = &reset_file
        {
            let _ = std::fs::remove_file(path);
        }
        tracing::warn!(
            accessor = BOOTSTRAP_TOKEN,
            reset = reset_index.is_some(),
            "ACLs bootstrapped: the management token was handed to the caller"
        );
        Ok(Response::new(pb::AclBootstrapResponse {
            accessor: BOOTSTRAP_TOKEN.into(),
            secret,
        }))
    }

    async fn acl_who_am_i(
        &self,
        request: Request<pb::AclWhoAmIRequest>,
    ) -> Result<Response<pb::AclWhoAmIResponse>, Status> {
        let token = super::grpc::token_of(&request).map_err(Status::from)?;
        match self.tokens.describe(token.as_deref()) {
            None => Ok(Response::new(pb::AclWhoAmIResponse {
                acls_enabled: false,
                ..Default::default()
            })),
            Some(Err(error)) => Err(Status::from(Error::from(error))),
            Some(Ok(info)) => Ok(Response::new(pb::AclWhoAmIResponse {
                acls_enabled: true,
                accessor: info.accessor,
                policies: info.policies,
                expires_at: info.expires_at,
            })),
        }
    }
}
