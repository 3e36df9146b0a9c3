//! gRPC handlers: turn request metadata into a caller (authorizer, consistency), call
//! [`ResourceService`], and map errors through the one `Error → Status` conversion.

use std::future::Future;
use std::sync::Arc;

use proto::resource::v1::{
    DeleteRequest, DeleteResponse, ListByOwnerRequest, ListByOwnerResponse, ListHistoryRequest,
    ListHistoryResponse, ListRequest, ListResponse, MutateAndValidateRequest,
    MutateAndValidateResponse, ReadRequest, ReadResponse, WatchListRequest, WriteRequest,
    WriteResponse, WriteStatusRequest, WriteStatusResponse, resource_service_server,
};
use tonic::{Request, Response, Status};

use super::read::SharedWatchStream;
use super::{Error, ResourceService};
use crate::acl::{Authorizer, TokenResolver};
use crate::metrics::WatchMetrics;
use crate::storage::{Consistency, SharedEvent};

pub(crate) use proto::{CONSISTENCY_HEADER, TOKEN_HEADER};

/// `resd.resource.v1.ResourceService` over a [`ResourceService`].
#[derive(Debug, Clone)]
pub(crate) struct ResourceGrpc {
    service: Arc<ResourceService>,
    tokens: Arc<dyn TokenResolver>,
    watch_metrics: WatchMetrics,
    /// Open watches, ended when their client stops reading.
    stalls: Arc<super::stalls::Stalls>,
}

impl ResourceGrpc {
    pub(crate) fn new(service: Arc<ResourceService>, tokens: Arc<dyn TokenResolver>) -> Self {
        ResourceGrpc {
            service,
            tokens,
            watch_metrics: WatchMetrics::default(),
            stalls: Arc::default(),
        }
    }

    /// The resource service it serves.
    pub(crate) fn service(&self) -> &Arc<ResourceService> {
        &self.service
    }

    /// Ends watches whose client read nothing for `after` while events waited for it.
    pub(crate) fn with_watch_stall_timeout(mut self, after: std::time::Duration) -> Self {
        self.stalls = Arc::new(super::stalls::Stalls::new(after));
        self
    }

    /// Counts open watch streams and the events they send into `metrics`.
    pub(crate) fn with_watch_metrics(mut self, metrics: WatchMetrics) -> Self {
        self.watch_metrics = metrics;
        self
    }

    /// List, answered with each resource as stored (see `service::encoded`).
    pub(crate) async fn list_encoded(
        &self,
        request: Request<ListRequest>,
    ) -> Result<Response<super::read::EncodedList>, Status> {
        let consistency = consistency(&request)?;
        let caller = request
            .extensions()
            .get::<crate::limits::Admitted>()
            .cloned();
        let resource_type = request.get_ref().r#type.clone();
        let list = self
            .unary(&request, Some(consistency), |authorizer, body, at| {
                let caller = caller.clone();
                async move {
                    self.service
                        .list_encoded_for(authorizer.as_ref(), at, body, caller.as_ref())
                        .await
                }
            })
            .await?;
        let mut response = Response::new(list);
        self.mark_stale(consistency, response.metadata_mut());
        self.warn(resource_type.as_ref(), response.metadata_mut());
        Ok(response)
    }

    /// Warns in the answer's metadata when it is in a deprecated version of a type (DESIGN
    /// §15.1): `x-resd-warning`, the Type's deprecation message.
    fn warn(
        &self,
        resource_type: Option<&proto::resource::v1::Type>,
        metadata: &mut tonic::metadata::MetadataMap,
    ) {
        if let Some(warning) = self.service.deprecation(resource_type)
            && let Ok(value) = tonic::metadata::MetadataValue::try_from(ascii(&warning))
        {
            metadata.append(proto::WARNING_HEADER, value);
        }
    }

    /// Says in the answer's metadata when a default read comes from a node that knows no
    /// leader (DESIGN §8: quorum loss is named, not served silently).
    fn mark_stale(&self, consistency: Consistency, metadata: &mut tonic::metadata::MetadataMap) {
        if consistency != Consistency::Eventual {
            return;
        }
        if let Some(why) = self.service.stale_reads()
            && let Ok(value) = tonic::metadata::MetadataValue::try_from(why)
        {
            metadata.insert(proto::STALE_HEADER, value);
        }
    }

    /// Read answered with the stored encoding (see `service::encoded`).
    pub(crate) async fn read_encoded(
        &self,
        request: Request<ReadRequest>,
    ) -> Result<Response<super::encoded::EncodedRead>, Status> {
        let consistency = consistency(&request)?;
        let caller = request
            .extensions()
            .get::<crate::limits::Admitted>()
            .cloned();
        let resource = self
            .unary(
                &request,
                Some(consistency),
                |authorizer, body, at| async move {
                    self.service
                        .read_encoded(authorizer.as_ref(), at, body)
                        .await
                },
            )
            .await?;
        let mut response = Response::new(super::encoded::EncodedRead(resource));
        self.mark_stale(consistency, response.metadata_mut());
        self.warn(
            request
                .get_ref()
                .id
                .as_ref()
                .and_then(|id| id.r#type.as_ref()),
            response.metadata_mut(),
        );
        // The answer counts against its caller until sent (the port's guard keeps the charge
        // with the answer's body).
        if let Some(caller) = caller {
            let charge = caller
                .charge_answer(response.get_ref().0.len())
                .map_err(|refused| Error::from(refused).into_status())?;
            response
                .extensions_mut()
                .insert(crate::limits::HeldCharge::new(charge));
        }
        Ok(response)
    }

    /// WatchList with the events as the storage shares them (see `service::encoded`: the gRPC
    /// answer writes each event's shared encoding).
    pub(crate) async fn watch_shared(
        &self,
        request: Request<WatchListRequest>,
    ) -> Result<Response<SharedEventStream>, Status> {
        use futures::StreamExt;
        self.note_request(&request);
        let authorizer = self.authorizer_caught_up(&request).await?;
        let resource_type = request.get_ref().r#type.clone();
        let token = token_of(&request)?;
        let deadline = deadline(&request)?;
        // Counted against the caller's watches while the stream lives (requests that came
        // through a port's admission carry it).
        let ticket = request
            .extensions()
            .get::<crate::limits::Admitted>()
            .map(crate::limits::Admitted::open_watch)
            .transpose()
            .map_err(|refused| Error::from(refused).into_status())?;
        let (grants, live) = tokio::sync::watch::channel(authorizer);
        // A type this node does not know yet may be registered by a Type it has not applied:
        // looked for again once caught up.
        let events: SharedWatchStream = crate::storage::deadline::scope(deadline, async {
            match self
                .service
                .watch_list_shared(live.clone(), request.get_ref().clone())
                .await
            {
                Err(Error::UnknownType(_)) => {
                    self.service.sync().await?;
                    self.service
                        .watch_list_shared(live, request.into_inner())
                        .await
                }
                other => other,
            }
        })
        .await?;
        let events = match self.tokens.changes() {
            Some(changes) => {
                while_token_valid(events, self.tokens.clone(), token, changes, grants).boxed()
            }
            None => events,
        };
        let events = self.stalls.watch(events);
        let open = self.watch_metrics.open_stream();
        let sent = self.watch_metrics.events_sent.clone();
        let mut response = Response::new(
            events
                .map(move |item| {
                    // The stream holds the guards: the gauge drops and the caller's watch is
                    // given back when the client goes away.
                    let _open = (&open, &ticket);
                    if item.is_ok() {
                        sent.inc();
                    }
                    item.map_err(Status::from)
                })
                .boxed(),
        );
        self.warn(resource_type.as_ref(), response.metadata_mut());
        Ok(response)
    }

    /// Catches this node up with the leader after it refused a request from what it had
    /// applied. A node that cannot catch up (it is restarting or catching up, or it has no
    /// leader to ask) cannot tell whether its refusal still holds: it says why it cannot
    /// answer, which the client retries or takes to another member, rather than a refusal
    /// that may be stale.
    async fn catch_up_after(&self, refusal: Error) -> Result<(), Error> {
        match self.service.sync().await {
            Ok(()) => Ok(()),
            Err(cannot) => {
                tracing::debug!(%refusal, %cannot, "a refusal could not be checked against the leader");
                Err(cannot)
            }
        }
    }

    /// The authorizer of a request's token as this node decides it once caught up: a token it
    /// does not know may be one acknowledged elsewhere a moment ago (or it may be catching up).
    async fn authorizer_caught_up<T>(
        &self,
        request: &Request<T>,
    ) -> Result<Arc<dyn Authorizer>, Error> {
        let token = token_of(request)?;
        let resolved = match self.tokens.resolve(token.as_deref()).map_err(Error::from) {
            Err(refusal) if may_be_stale(&refusal, token.is_some()) => {
                self.catch_up_after(refusal).await?;
                self.tokens.resolve(token.as_deref()).map_err(Error::from)
            }
            other => other,
        };
        note_caller(request, &resolved);
        resolved
    }

    /// Tells the request's audit note what it names, and at `--audit-level request` its body.
    fn note_request<T: prost::Message + prost::Name + Audited>(&self, request: &Request<T>) {
        let Some(note) = crate::audit::note_of(request) else {
            return;
        };
        if let Some(subject) = request.get_ref().subject() {
            note.resource(subject);
        }
        if note.wants_body() {
            let pool = self.service.registry.descriptor_pool();
            note.body(crate::audit::body_of(&pool, request.get_ref()));
        }
    }

    /// A unary call as its caller ([`Self::as_caller`]), within the request's deadline, on a
    /// copy of the request's message each try; for a read at `consistency`, the consistency
    /// the service answers at once the caller is authorized ([`Self::read_after_sync`]).
    async fn unary<T, R, F, Fut>(
        &self,
        request: &Request<T>,
        consistency: Option<Consistency>,
        mut call: F,
    ) -> Result<R, Status>
    where
        T: Clone + prost::Message + prost::Name + Audited,
        F: FnMut(Arc<dyn Authorizer>, T, Consistency) -> Fut,
        Fut: Future<Output = Result<R, Error>>,
    {
        self.note_request(request);
        let deadline = deadline(request)?;
        let answered = crate::storage::deadline::scope(deadline, async {
            let answer_at = match consistency {
                Some(consistency) => self.read_after_sync(consistency).await?,
                None => Consistency::Eventual,
            };
            self.as_caller(request, |authorizer| {
                call(authorizer, request.get_ref().clone(), answer_at)
            })
            .await
        })
        .await?;
        Ok(answered)
    }

    /// How a read at `consistency` is answered once its caller is authorized: a strong read
    /// is authorized at or after its read index (DESIGN §15) — this node catches up with the
    /// leader first, then resolves the token and answers from what it has applied, which
    /// already reflects every write acknowledged before the request (so one read index serves
    /// both, as before).
    async fn read_after_sync(&self, consistency: Consistency) -> Result<Consistency, Error> {
        match consistency {
            Consistency::Strong => {
                self.service.sync().await?;
                Ok(Consistency::Eventual)
            }
            Consistency::Eventual => Ok(Consistency::Eventual),
        }
    }

    /// Runs `call` as the request's caller, so that what this node decides follows the log
    /// (DESIGN §15): a change fenced off because a token or policy changed after its caller
    /// was authorized (`ACL_CHANGED`) is authorized again; and a refusal made from what this
    /// node had applied — a type it does not know, a rule, a token it does not know, a grant
    /// it lacks — is made again once it has caught up with the leader, so what was
    /// acknowledged anywhere (a Type, a relaxed rule, a token, a policy) holds here too. The
    /// token is resolved again each time: a deleted or narrowed token is judged as it is now.
    async fn as_caller<T, R, F, Fut>(&self, request: &Request<T>, mut call: F) -> Result<R, Error>
    where
        F: FnMut(Arc<dyn Authorizer>) -> Fut,
        Fut: Future<Output = Result<R, Error>>,
    {
        let token = token_of(request)?;
        let mut synced = false;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let resolved = self.tokens.resolve(token.as_deref()).map_err(Error::from);
            note_caller(request, &resolved);
            let outcome = match resolved {
                Ok(authorizer) => call(authorizer).await,
                Err(refused) => Err(refused),
            };
            match outcome {
                Err(Error::Fenced(fenced))
                    if fenced.kind == crate::storage::FenceKind::Acl
                        && attempts < super::FENCED_ATTEMPTS =>
                {
                    tracing::debug!(why = %fenced, "a change was authorized under ACLs that changed; authorizing it again");
                }
                Err(refusal) if !synced && may_be_stale(&refusal, token.is_some()) => {
                    self.catch_up_after(refusal).await?;
                    synced = true;
                    continue;
                }
                other => return other,
            }
            self.service.sync().await?;
            synced = true;
        }
    }
}

/// Whether `refusal` was decided from this node's projections (its registry, its ACLs), which
/// may lag what the cluster acknowledged: worth deciding again once caught up. A request
/// without a token is refused whatever the node has applied.
fn may_be_stale(refusal: &Error, has_token: bool) -> bool {
    match refusal {
        Error::Unauthenticated(_) => has_token,
        Error::UnknownType(_)
        | Error::InvalidArgument(_)
        | Error::BadRequest(_)
        | Error::RuleCost(_)
        | Error::TypeBeingDeleted(_)
        // The admission policies are a projection too: one deleted (or relaxed) and
        // acknowledged may not have reached this node yet.
        | Error::AdmissionDenied(_)
        | Error::PermissionDenied(_) => true,
        _ => false,
    }
}

/// A watch's events as the gRPC layer sends them.
pub(crate) type SharedEventStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<SharedEvent, Status>> + Send>>;

/// How often an open watch re-checks its token when nothing changed (it may expire).
const TOKEN_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// Keeps a watch on its token's current grants: re-resolved on every change of the ACL
/// resources and every second, the new authorizer handed to the watch (which ends with
/// PermissionDenied when it may no longer watch); ends with `Unauthenticated` once the token is
/// deleted or expires.
fn while_token_valid(
    events: SharedWatchStream,
    tokens: Arc<dyn TokenResolver>,
    token: Option<String>,
    changes: tokio::sync::watch::Receiver<u64>,
    grants: tokio::sync::watch::Sender<Arc<dyn Authorizer>>,
) -> SharedWatchStream {
    use futures::StreamExt;
    struct State {
        events: SharedWatchStream,
        tokens: Arc<dyn TokenResolver>,
        token: Option<String>,
        changes: tokio::sync::watch::Receiver<u64>,
        recheck: tokio::time::Interval,
        grants: tokio::sync::watch::Sender<Arc<dyn Authorizer>>,
    }
    let mut recheck = tokio::time::interval(TOKEN_RECHECK);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    futures::stream::unfold(
        Some(State {
            events,
            tokens,
            token,
            changes,
            recheck,
            grants,
        }),
        |state| async move {
            let mut state = state?;
            loop {
                tokio::select! {
                    item = state.events.next() => {
                        let item = item?;
                        return Some((item, Some(state)));
                    }
                    changed = state.changes.changed() => {
                        if changed.is_err() {
                            // The store is gone (shutting down): keep streaming until the end.
                            let item = state.events.next().await?;
                            return Some((item, Some(state)));
                        }
                    }
                    _ = state.recheck.tick() => {}
                }
                match state.tokens.resolve(state.token.as_deref()) {
                    Err(error) => {
                        return Some((
                            Err(Error::Unauthenticated(format!("watch ended: {error}"))),
                            None,
                        ));
                    }
                    Ok(current) => {
                        state.grants.send_if_modified(|held| {
                            let changed = !Arc::ptr_eq(held, &current);
                            if changed {
                                *held = current;
                            }
                            changed
                        });
                    }
                }
            }
        },
    )
    .boxed()
}

/// The token a request carries (`x-resd-token`, or `authorization: Bearer …`).
pub(crate) fn token_of<T>(request: &Request<T>) -> Result<Option<String>, Error> {
    crate::limits::token_in(request.metadata().as_ref())
        .map(|token| token.map(str::to_owned))
        .map_err(Error::from)
}

/// The authorizer of a request's token.
pub(crate) fn resolve<T>(
    tokens: &dyn TokenResolver,
    request: &Request<T>,
) -> Result<Arc<dyn Authorizer>, Error> {
    let token = token_of(request)?;
    let resolved = tokens.resolve(token.as_deref()).map_err(Error::from);
    note_caller(request, &resolved);
    resolved
}

/// Tells the request's audit note who the caller is (a token's name), or that authorization
/// refused it.
pub(crate) fn note_caller<T>(request: &Request<T>, resolved: &Result<Arc<dyn Authorizer>, Error>) {
    if let Some(note) = crate::audit::note_of(request) {
        match resolved {
            Ok(authorizer) => note.caller(authorizer.identity()),
            Err(_) => note.unauthenticated(),
        }
    }
}

/// When the caller stops waiting, from the `grpc-timeout` header; none when it set none (or
/// one past what a clock can hold). A header that is not a gRPC timeout is InvalidArgument.
pub(crate) fn deadline<T>(request: &Request<T>) -> Result<Option<std::time::Instant>, Status> {
    let Some(value) = request.metadata().get("grpc-timeout") else {
        return Ok(None);
    };
    let timeout = value
        .to_str()
        .ok()
        .and_then(crate::storage::deadline::parse_grpc_timeout)
        .ok_or_else(|| {
            Status::from(Error::invalid(
                "grpc-timeout is not a gRPC timeout: at most 8 digits and a unit of H, M, S, m, u or n",
            ))
        })?;
    Ok(std::time::Instant::now().checked_add(timeout))
}

fn consistency<T>(request: &Request<T>) -> Result<Consistency, Status> {
    match request
        .metadata()
        .get(CONSISTENCY_HEADER)
        .map(|value| value.to_str())
    {
        None => Ok(Consistency::Eventual),
        Some(Ok("consistent")) => Ok(Consistency::Strong),
        Some(Ok("" | "default" | "eventual")) => Ok(Consistency::Eventual),
        Some(other) => Err(Status::from(Error::invalid(format!(
            "{CONSISTENCY_HEADER} must be \"consistent\" or absent, got {:?}",
            other.unwrap_or("<not ASCII>")
        )))),
    }
}

#[tonic::async_trait]
impl resource_service_server::ResourceService for ResourceGrpc {
    async fn read(&self, request: Request<ReadRequest>) -> Result<Response<ReadResponse>, Status> {
        let consistency = consistency(&request)?;
        let response = self
            .unary(
                &request,
                Some(consistency),
                |authorizer, body, at| async move {
                    self.service.read(authorizer.as_ref(), at, body).await
                },
            )
            .await?;
        let mut response = Response::new(response);
        self.warn(
            request
                .get_ref()
                .id
                .as_ref()
                .and_then(|id| id.r#type.as_ref()),
            response.metadata_mut(),
        );
        Ok(response)
    }

    async fn write(
        &self,
        request: Request<WriteRequest>,
    ) -> Result<Response<WriteResponse>, Status> {
        let fence = super::fenced::of_metadata(request.metadata())?;
        let (response, warnings) = super::policy::collecting(super::fenced::scope(
            fence,
            self.unary(&request, None, |authorizer, body, _| async move {
                self.service.write(authorizer.as_ref(), body).await
            }),
        ))
        .await;
        let mut response = Response::new(response?);
        admission_warnings(&warnings, response.metadata_mut());
        self.warn(
            request
                .get_ref()
                .resource
                .as_ref()
                .and_then(|r| r.id.as_ref())
                .and_then(|id| id.r#type.as_ref()),
            response.metadata_mut(),
        );
        Ok(response)
    }

    async fn write_status(
        &self,
        request: Request<WriteStatusRequest>,
    ) -> Result<Response<WriteStatusResponse>, Status> {
        let fence = super::fenced::of_metadata(request.metadata())?;
        let response = super::fenced::scope(
            fence,
            self.unary(&request, None, |authorizer, body, _| async move {
                self.service.write_status(authorizer.as_ref(), body).await
            }),
        )
        .await?;
        let mut response = Response::new(response);
        self.warn(
            request
                .get_ref()
                .id
                .as_ref()
                .and_then(|id| id.r#type.as_ref()),
            response.metadata_mut(),
        );
        Ok(response)
    }

    async fn list(&self, request: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        let consistency = consistency(&request)?;
        let response = self
            .unary(
                &request,
                Some(consistency),
                |authorizer, body, at| async move {
                    self.service.list(authorizer.as_ref(), at, body).await
                },
            )
            .await?;
        let mut response = Response::new(response);
        self.warn(request.get_ref().r#type.as_ref(), response.metadata_mut());
        Ok(response)
    }

    async fn list_history(
        &self,
        request: Request<ListHistoryRequest>,
    ) -> Result<Response<ListHistoryResponse>, Status> {
        let consistency = consistency(&request)?;
        let response = self
            .unary(
                &request,
                Some(consistency),
                |authorizer, body, at| async move {
                    self.service
                        .list_history(authorizer.as_ref(), at, body)
                        .await
                },
            )
            .await?;
        Ok(Response::new(response))
    }

    async fn list_by_owner(
        &self,
        request: Request<ListByOwnerRequest>,
    ) -> Result<Response<ListByOwnerResponse>, Status> {
        let response = self
            .unary(&request, None, |authorizer, body, _| async move {
                self.service.list_by_owner(authorizer.as_ref(), body).await
            })
            .await?;
        Ok(Response::new(response))
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let fence = super::fenced::of_metadata(request.metadata())?;
        let (response, warnings) = super::policy::collecting(super::fenced::scope(
            fence,
            self.unary(&request, None, |authorizer, body, _| async move {
                self.service.delete(authorizer.as_ref(), body).await
            }),
        ))
        .await;
        let mut response = Response::new(response?);
        admission_warnings(&warnings, response.metadata_mut());
        self.warn(
            request
                .get_ref()
                .id
                .as_ref()
                .and_then(|id| id.r#type.as_ref()),
            response.metadata_mut(),
        );
        Ok(response)
    }

    type WatchListStream = std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<proto::resource::v1::WatchEvent, Status>> + Send>,
    >;

    async fn watch_list(
        &self,
        request: Request<WatchListRequest>,
    ) -> Result<Response<Self::WatchListStream>, Status> {
        use futures::StreamExt;
        let (metadata, events, extensions) = self.watch_shared(request).await?.into_parts();
        Ok(Response::from_parts(
            metadata,
            events
                .map(|item| item.map(|event| super::read::pb_event(event.event())))
                .boxed(),
            extensions,
        ))
    }

    async fn mutate_and_validate(
        &self,
        request: Request<MutateAndValidateRequest>,
    ) -> Result<Response<MutateAndValidateResponse>, Status> {
        // A dry run says what the write would be told, warnings included.
        let (response, warnings) = super::policy::collecting(self.unary(
            &request,
            None,
            |authorizer, body, _| async move {
                self.service
                    .mutate_and_validate(authorizer.as_ref(), body)
                    .await
            },
        ))
        .await;
        let mut response = Response::new(response?);
        admission_warnings(&warnings, response.metadata_mut());
        self.warn(
            request
                .get_ref()
                .resource
                .as_ref()
                .and_then(|r| r.id.as_ref())
                .and_then(|id| id.r#type.as_ref()),
            response.metadata_mut(),
        );
        Ok(response)
    }
}

/// `text` with every character outside printable ASCII written `\u{…}` (what metadata holds).
/// The warnings admission policies gave an answer (DESIGN §17), as `x-resd-warning`.
fn admission_warnings(warnings: &[String], metadata: &mut tonic::metadata::MetadataMap) {
    for warning in warnings {
        if let Ok(value) = tonic::metadata::MetadataValue::try_from(ascii(warning)) {
            metadata.append(proto::WARNING_HEADER, value);
        }
    }
}

fn ascii(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c == ' ' || c.is_ascii_graphic() {
            out.push(c);
        } else {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        }
    }
    out
}

/// What a request names, for the audit log: `type/partition/namespace/name`.
pub(crate) trait Audited {
    fn subject(&self) -> Option<String>;
}

fn subject_of(id: Option<&proto::resource::v1::Id>) -> Option<String> {
    let id = id?;
    let tenancy = id.tenancy.clone().unwrap_or_default();
    Some(format!(
        "{}/{}/{}/{}",
        id.r#type
            .as_ref()
            .map(crate::resource::gvk)
            .unwrap_or_default(),
        tenancy.partition,
        tenancy.namespace,
        id.name
    ))
}

fn subject_of_query(
    resource_type: Option<&proto::resource::v1::Type>,
    tenancy: Option<&proto::resource::v1::Tenancy>,
    name_prefix: &str,
) -> Option<String> {
    let tenancy = tenancy.cloned().unwrap_or_default();
    Some(format!(
        "{}/{}/{}/{name_prefix}",
        resource_type.map(crate::resource::gvk).unwrap_or_default(),
        tenancy.partition,
        tenancy.namespace,
    ))
}

macro_rules! audited_by_id {
    ($($message:ty => |$m:ident| $id:expr),* $(,)?) => {
        $(impl Audited for $message {
            fn subject(&self) -> Option<String> {
                let $m = self;
                subject_of($id)
            }
        })*
    };
}

audited_by_id!(
    ReadRequest => |m| m.id.as_ref(),
    WriteRequest => |m| m.resource.as_ref().and_then(|r| r.id.as_ref()),
    WriteStatusRequest => |m| m.id.as_ref(),
    DeleteRequest => |m| m.id.as_ref(),
    ListByOwnerRequest => |m| m.owner.as_ref(),
    MutateAndValidateRequest => |m| m.resource.as_ref().and_then(|r| r.id.as_ref()),
    ListHistoryRequest => |m| m.id.as_ref(),
);

impl Audited for ListRequest {
    fn subject(&self) -> Option<String> {
        subject_of_query(
            self.r#type.as_ref(),
            self.tenancy.as_ref(),
            &self.name_prefix,
        )
    }
}

impl Audited for WatchListRequest {
    fn subject(&self) -> Option<String> {
        subject_of_query(
            self.r#type.as_ref(),
            self.tenancy.as_ref(),
            &self.name_prefix,
        )
    }
}
