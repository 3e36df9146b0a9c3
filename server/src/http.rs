//! The node's HTTP server (`--http-addr`, DESIGN §13): `/metrics`, `/healthz`, `/readyz`, and
//! the resource service as HTTP+JSON. Served with the node's TLS settings; every resource and
//! cluster call goes through the same gRPC service implementations (and so the same ACLs,
//! validation and errors) as a gRPC client's, with the token from `X-Resd-Token` or
//! `Authorization: Bearer`. Messages are converted with the protobuf JSON mapping through the
//! published descriptors; errors are `{"code": "ABORTED", "message": "…"}`.

pub(crate) mod api;
mod json;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::StreamExt as _;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::service::cluster::ClusterGrpc;
use crate::service::grpc::ResourceGrpc;
use crate::storage::raft::node::RaftNode;
use crate::tls::accept::Listening;

/// What the handlers need: the two gRPC services they call, the node's raft (for readiness)
/// and its metrics.
#[derive(Clone)]
pub(crate) struct HttpState {
    pub resources: ResourceGrpc,
    pub cluster: ClusterGrpc,
    pub raft: Option<Arc<RaftNode>>,
    pub registry: Arc<crate::registry::Registry>,
    /// Tokens, for `/metrics` (operator read with ACLs on).
    pub tokens: Arc<dyn crate::acl::TokenResolver>,
    pub metrics: Arc<Metrics>,
    /// Largest request body accepted (a resource at the size limit, and room for its envelope).
    pub max_body_bytes: usize,
    /// What each caller may hold; every request is admitted against it before its body is read.
    pub limits: Arc<crate::limits::Limits>,
    /// Where every request is logged (`--audit-log`), if anywhere.
    pub audit: Option<crate::audit::AuditLog>,
}

impl std::fmt::Debug for HttpState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpState").finish_non_exhaustive()
    }
}

/// The routes.
pub(crate) fn router(state: HttpState) -> Router {
    let max_body = state.max_body_bytes;
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .merge(api::routes(state.clone()))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), record))
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::from_fn_with_state(
            state.limits.clone(),
            guard,
        ))
        // Outermost: the guard's refusals are logged too.
        .layer(axum::middleware::from_fn_with_state(state.clone(), audited))
        .with_state(state)
}

/// Logs the request to the audit log (DESIGN §18), if there is one: the HTTP API's calls of the
/// gRPC implementations fill in its note as a gRPC call's would.
async fn audited(
    State(state): State<HttpState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(log) = state
        .audit
        .clone()
        .filter(|log| log.level() != crate::audit::AuditLevel::None)
    else {
        return next.run(request).await;
    };
    let method = format!("{} {}", request.method(), request.uri().path());
    let mut entry = crate::audit::Entry::new(log, method, &request);
    let note = entry.note().clone();
    let response = crate::audit::HTTP_NOTE.scope(note, next.run(request)).await;
    entry.finish(crate::audit::code_of_http(response.status()));
    response
}

/// With ACLs on, the figures need a token with operator read (Prometheus sends it with
/// `authorization: {credentials: …}`); `/healthz` and `/readyz` are open to load balancers.
async fn metrics(State(state): State<HttpState>, headers: http::HeaderMap) -> Response {
    if state.tokens.enabled()
        && let Err(refused) = api::require_operator_read(state.tokens.as_ref(), &headers)
    {
        return refused.into_response();
    }
    (
        [(
            http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

/// 200 only while this node can serve (DESIGN §13/§14); 503 saying why not.
async fn readyz(State(state): State<HttpState>) -> Response {
    match state.raft.as_ref().map(|raft| raft.serving()) {
        None => (StatusCode::OK, "ready\n").into_response(),
        // Reads are served; what is refused (new writes under the disk's reserve or past the
        // quota) is an alarm, said here too, not a reason to send readers elsewhere. This page
        // needs no token: it counts the alarms, and `Status` (operator read) says what they are
        // (they name paths and sizes).
        Some(Ok(())) => {
            let alarms = state.raft.as_ref().map_or(0, |raft| raft.alarms().len());
            let body = match alarms {
                0 => "ready\n".to_owned(),
                n => format!(
                    "ready; {n} alarm(s): some writes are refused (`resctl cluster status` says why)\n"
                ),
            };
            (StatusCode::OK, body).into_response()
        }
        Some(Err(why)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

async fn not_found(State(state): State<HttpState>, uri: http::Uri) -> Response {
    state
        .metrics
        .http_requests
        .get_or_create(&vec![
            ("route", "other".to_owned()),
            ("code", "404".to_owned()),
        ])
        .inc();
    api::ApiError::new(
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
        proto::reason::Reason::NotFound,
        format!(
            "no route {}: the API is under /v1/resources/{{group}}/{{version}}/{{kind}}, /v1/types and /v1/cluster/{{status,members}}; also /metrics, /healthz, /readyz",
            uri.path()
        ),
    )
    .into_response()
}

/// Admission for the HTTP port, as `limits::guard` does for gRPC: the caller is admitted from
/// the headers (the connection's `ConnInfo` is in the request's extensions), counted in flight
/// until its answer is sent (a watch apart), and its body guarded.
async fn guard(
    State(limits): State<Arc<crate::limits::Limits>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let remote = request
        .extensions()
        .get::<crate::tls::ConnInfo>()
        .and_then(crate::tls::ConnInfo::remote_ip);
    let ignores_token = matches!(request.uri().path(), "/healthz" | "/readyz");
    let admitted = match limits.admit(request.headers(), remote, ignores_token) {
        Ok(admitted) => admitted,
        Err(refused) => {
            return api::ApiError::from(refused).into_response();
        }
    };
    let watch = request
        .uri()
        .query()
        .is_some_and(|query| query.split('&').any(|pair| pair == "watch=true"));
    let in_flight = if watch {
        None
    } else {
        match admitted.in_flight() {
            Ok(in_flight) => Some(in_flight),
            Err(refused) => return api::ApiError::from(refused).into_response(),
        }
    };
    let (mut parts, body) = request.into_parts();
    parts.extensions.insert(admitted.clone());
    let body = axum::body::Body::new(crate::limits::guard::GuardedBody::new(
        body,
        admitted.clone(),
        crate::limits::guard::HTTP_BODY,
    ));
    let response = next
        .run(axum::extract::Request::from_parts(parts, body))
        .await;
    if in_flight.is_none() {
        return response;
    }
    // An answer's bytes count against its caller until they are sent.
    let size = http_body::Body::size_hint(response.body()).lower();
    let charge = match admitted.charge_answer(usize::try_from(size).unwrap_or(usize::MAX)) {
        Ok(charge) => charge,
        Err(refused) => return api::ApiError::from(refused).into_response(),
    };
    response.map(|body| {
        axum::body::Body::new(crate::limits::guard::Metered::new(
            body,
            in_flight,
            Some(charge),
        ))
    })
}

/// Counts each request by route template and status, and logs it at debug.
async fn record(
    State(state): State<HttpState>,
    matched: Option<MatchedPath>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let route = matched
        .map(|m| m.as_str().to_owned())
        .unwrap_or_else(|| "other".into());
    let method = request.method().clone();
    let started = Instant::now();
    let response = next.run(request).await;
    let code = response.status().as_u16().to_string();
    tracing::debug!(
        %method,
        route,
        code,
        duration_ms = started.elapsed().as_secs_f64() * 1000.0,
        "http request"
    );
    state
        .metrics
        .http_requests
        .get_or_create(&vec![("route", route), ("code", code)])
        .inc();
    response
}

/// Serves `router` on `listener` until `shutdown` is cancelled; open connections finish what
/// they are answering (watches end with the server's shutdown).
pub(crate) async fn serve(
    listener: TcpListener,
    listening: Listening,
    router: Router,
    shutdown: CancellationToken,
) {
    let mut incoming = listening.incoming(listener, "HTTP API");
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let conn = tokio::select! {
            () = shutdown.cancelled() => break,
            conn = incoming.next() => conn,
        };
        let Some(conn) = conn else { break };
        let conn = match conn {
            Ok(conn) => conn,
            Err(error) => {
                tracing::debug!(%error, "HTTP connection not accepted");
                continue;
            }
        };
        // Handlers learn who connected (admission counts callers by address without ACLs).
        let info = tonic::transport::server::Connected::connect_info(&conn);
        let router = router.clone();
        let service = TowerToHyperService::new(tower::util::MapRequest::new(
            router,
            move |mut request: http::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(info.clone());
                request
            },
        ));
        let stopping = shutdown.clone();
        connections.spawn(async move {
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(crate::limits::BODY_TIMEOUT);
            builder
                .http2()
                .timer(hyper_util::rt::TokioTimer::new())
                .max_concurrent_streams(crate::limits::MAX_STREAMS_PER_CONNECTION)
                .max_header_list_size(crate::limits::MAX_HEADER_LIST_BYTES)
                .keep_alive_interval(std::time::Duration::from_secs(30))
                .max_pending_accept_reset_streams(64);
            let connection = builder.serve_connection(TokioIo::new(conn), service);
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(%error, "HTTP connection ended with an error");
                    }
                }
                () = stopping.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
        // Reap finished connections so the set does not grow.
        while connections.try_join_next().is_some() {}
    }
    while connections.join_next().await.is_some() {}
}
