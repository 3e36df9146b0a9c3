//! The resource and cluster services as HTTP+JSON (DESIGN §13). Each handler turns the path,
//! query and body into the gRPC request message, calls the gRPC service implementation, and
//! returns its response message as JSON; errors keep their gRPC code.

use std::collections::BTreeMap;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use futures::StreamExt as _;
use proto::cluster::v1::cluster_service_server::ClusterService as _;
use proto::cluster::v1::{ListTypesRequest, MembersRequest, StatusRequest};
use proto::resource::v1::resource_service_server::ResourceService as _;
use proto::resource::v1::{
    DeleteRequest, Id, ListRequest, ReadRequest, Resource, Status as ResourceStatus, Tenancy, Type,
    WatchListRequest, WriteRequest, WriteStatusRequest,
};

use super::HttpState;
use super::json::{from_json, to_json, type_url};
use crate::metrics::grpc::code_name;
use crate::service::grpc::{CONSISTENCY_HEADER, TOKEN_HEADER};
use prost_reflect::DescriptorPool;
use proto::reason::Reason;

pub(crate) fn routes(state: HttpState) -> Router<HttpState> {
    resource_routes().route_layer(axum::middleware::from_fn_with_state(state, warn_deprecated))
}

/// Adds `Warning: 299 - "<message>"` to every answer about a deprecated version of a type
/// (DESIGN §15.1): the path names the group, version and kind.
async fn warn_deprecated(
    State(state): State<HttpState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let named = {
        let mut parts = request.uri().path().split('/').skip(1);
        match (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) {
            (Some("v1"), Some("resources"), Some(group), Some(version), Some(kind)) => {
                Some(resource_type(group.into(), version.into(), kind.into()))
            }
            _ => None,
        }
    };
    let mut response = next.run(request).await;
    if let Some(warning) = named.and_then(|t| state.resources.service().deprecation(Some(&t))) {
        append_warning(&mut response, &warning);
    }
    response
}

fn resource_routes() -> Router<HttpState> {
    Router::new()
        .route("/v1/types", get(types))
        .route("/v1/cluster/status", get(cluster_status))
        .route("/v1/cluster/members", get(members))
        .route("/v1/resources/{group}/{version}/{kind}", get(list_or_watch))
        .route(
            "/v1/resources/{group}/{version}/{kind}/{name}",
            get(read).put(write).delete(delete),
        )
        .route(
            "/v1/resources/{group}/{version}/{kind}/{name}/status/{key}",
            put(write_status),
        )
}

/// An error as the API answers it: `{"code": "ABORTED", "reason": "CAS_CONFLICT", "message":
/// "…"}` with its HTTP status — the gRPC code, the same reason a gRPC client gets in its status
/// details (what to decide on), and words for people.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    reason: Option<Reason>,
    message: String,
}

impl ApiError {
    pub(crate) fn new(
        status: StatusCode,
        code: &'static str,
        reason: Reason,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            code,
            reason: Some(reason),
            message: message.into(),
        }
    }

    fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
            Reason::Invalid,
            message,
        )
    }

    fn internal(message: impl Into<String>) -> Self {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL",
            Reason::Internal,
            message,
        )
    }
}

/// The HTTP status of a gRPC code (DESIGN §13).
fn http_status(code: tonic::Code) -> StatusCode {
    use tonic::Code::*;
    match code {
        Ok => StatusCode::OK,
        InvalidArgument | OutOfRange => StatusCode::BAD_REQUEST,
        Unauthenticated => StatusCode::UNAUTHORIZED,
        PermissionDenied => StatusCode::FORBIDDEN,
        NotFound => StatusCode::NOT_FOUND,
        Aborted | AlreadyExists => StatusCode::CONFLICT,
        FailedPrecondition => StatusCode::PRECONDITION_FAILED,
        ResourceExhausted => StatusCode::PAYLOAD_TOO_LARGE,
        Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A limit's refusal: 413 for a body too large for its caller, 429 for too much at once (a
/// rate, watches, bytes in flight), 408 for a body that stopped arriving.
impl From<crate::limits::LimitError> for ApiError {
    fn from(error: crate::limits::LimitError) -> Self {
        use crate::limits::LimitError;
        let status = match &error {
            LimitError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            LimitError::AnonymousBody { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            LimitError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            LimitError::Rate { .. }
            | LimitError::InFlight { .. }
            | LimitError::Watches { .. }
            | LimitError::CallerBytes { .. }
            | LimitError::NodeBytes { .. }
            | LimitError::ListBytes { .. }
            | LimitError::Answers { .. } => StatusCode::TOO_MANY_REQUESTS,
        };
        let (code, reason) = crate::service::Error::from(error.clone()).code_and_reason();
        ApiError::new(status, code_name(code), reason, error.to_string())
    }
}

impl From<tonic::Status> for ApiError {
    fn from(status: tonic::Status) -> Self {
        ApiError {
            status: http_status(status.code()),
            code: code_name(status.code()),
            reason: proto::reason::of(&status).map(|details| details.reason),
            message: status.message().to_owned(),
        }
    }
}

fn error_body(code: &str, reason: Option<Reason>, message: &str) -> serde_json::Value {
    match reason {
        Some(reason) => {
            serde_json::json!({ "code": code, "reason": reason.as_str(), "message": message })
        }
        None => serde_json::json!({ "code": code, "message": message }),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            axum::Json(error_body(self.code, self.reason, &self.message)),
        )
            .into_response()
    }
}

type ApiResult = Result<Response, ApiError>;

/// A gRPC implementation's answer as the HTTP answer: its message as JSON, or its error.
fn answer<M: prost::Message>(
    pool: &DescriptorPool,
    answer: Result<tonic::Response<M>, tonic::Status>,
    name: &str,
) -> ApiResult {
    let answer = answer?;
    // The answer's warnings (admission policies, deprecation) as HTTP warnings.
    let warnings: Vec<String> = answer
        .metadata()
        .get_all(proto::WARNING_HEADER)
        .iter()
        .filter_map(|value| value.to_str().ok().map(str::to_owned))
        .collect();
    let mut response = json_response(pool, &answer.into_inner(), name)?;
    for warning in warnings {
        append_warning(&mut response, &warning);
    }
    Ok(response)
}

/// Adds `Warning: 299 - "<text>"` (once: the same text is not added twice).
fn append_warning(response: &mut Response, warning: &str) {
    let text = warning.replace('\\', "\\\\").replace('"', "\\\"");
    let text: String = text
        .chars()
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .collect();
    if let Ok(value) = http::HeaderValue::try_from(format!("299 - \"{text}\""))
        && !response
            .headers()
            .get_all(header::WARNING)
            .iter()
            .any(|v| v == value)
    {
        response.headers_mut().append(header::WARNING, value);
    }
}

fn json_response<M: prost::Message>(pool: &DescriptorPool, message: &M, name: &str) -> ApiResult {
    let value = to_json(pool, message, name).map_err(ApiError::internal)?;
    Ok(axum::Json(value).into_response())
}

/// Query parameters, each taken once; what is left over is an error naming what is accepted.
struct Params(BTreeMap<String, String>);

impl Params {
    fn take(&mut self, name: &str) -> String {
        self.0.remove(name).unwrap_or_default()
    }

    fn flag(&mut self, name: &str) -> Result<bool, ApiError> {
        match self.take(name).as_str() {
            "" | "false" => Ok(false),
            "true" => Ok(true),
            other => Err(ApiError::invalid(format!(
                "{name} must be true or false, got {other:?}"
            ))),
        }
    }

    /// A whole number (absent: 0).
    fn number(&mut self, name: &str) -> Result<u32, ApiError> {
        match self.take(name).as_str() {
            "" => Ok(0),
            text => text.parse().map_err(|_| {
                ApiError::invalid(format!(
                    "{name} must be a whole number from 0 to {}, got {text:?}",
                    u32::MAX
                ))
            }),
        }
    }

    /// The tenancy of `?partition=&namespace=` (parts left out are the type's defaults).
    fn tenancy(&mut self) -> Tenancy {
        Tenancy {
            partition: self.take("partition"),
            namespace: self.take("namespace"),
        }
    }

    fn finish(self, accepted: &[&str]) -> Result<(), ApiError> {
        match self.0.keys().next() {
            None => Ok(()),
            Some(unknown) => Err(ApiError::invalid(format!(
                "unknown query parameter {unknown:?}; this route takes {}",
                if accepted.is_empty() {
                    "none".to_owned()
                } else {
                    accepted.join(", ")
                }
            ))),
        }
    }
}

/// Refuses a caller whose token (from the headers) cannot read operator data.
pub(crate) fn require_operator_read(
    tokens: &dyn crate::acl::TokenResolver,
    headers: &HeaderMap,
) -> Result<(), ApiError> {
    let request = grpc_request(headers, false, ())?;
    let authorizer = crate::service::grpc::resolve(tokens, &request)
        .map_err(|error| ApiError::from(tonic::Status::from(error)))?;
    crate::acl::require_operator(authorizer.as_ref(), crate::acl::Access::Read)
        .map_err(|error| ApiError::from(tonic::Status::from(crate::service::Error::from(error))))
}

/// A gRPC request carrying the caller's token (and consistency) from the HTTP headers.
fn grpc_request<T>(
    headers: &HeaderMap,
    consistent: bool,
    message: T,
) -> Result<tonic::Request<T>, ApiError> {
    let mut request = tonic::Request::new(message);
    if let Ok(note) = crate::audit::HTTP_NOTE.try_with(Clone::clone) {
        request.extensions_mut().insert(note);
    }
    if headers.get_all(proto::FENCE_HEADER).iter().count() > 1 {
        return Err(ApiError::invalid(
            "the X-Resd-Fence header is sent more than once: a write is fenced by one lease",
        ));
    }
    for name in [TOKEN_HEADER, "authorization", proto::FENCE_HEADER] {
        if let Some(value) = headers.get(name) {
            let value = tonic::metadata::MetadataValue::try_from(value.as_bytes())
                .map_err(|_| ApiError::invalid(format!("the {name} header is not valid")))?;
            request.metadata_mut().insert(name, value);
        }
    }
    if consistent {
        request.metadata_mut().insert(
            CONSISTENCY_HEADER,
            tonic::metadata::MetadataValue::from_static("consistent"),
        );
    }
    Ok(request)
}

fn resource_type(group: String, version: String, kind: String) -> Type {
    Type {
        group,
        group_version: version,
        kind,
    }
}

/// The JSON body of a request, parsed; too large is 413, not JSON is 400.
fn body_json(body: Result<Bytes, BytesRejection>) -> Result<serde_json::Value, ApiError> {
    let bytes = body.map_err(|rejection| {
        if let Some(limit) = crate::limits::guard::limit_in(&rejection) {
            return ApiError::from(limit.clone());
        }
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "RESOURCE_EXHAUSTED",
                Reason::Quota,
                format!(
                    "the request body is larger than this server accepts ({}); resources are limited by --max-resource-bytes",
                    rejection.body_text()
                ),
            )
        } else {
            ApiError::invalid(format!("cannot read the request body: {}", rejection.body_text()))
        }
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|error| ApiError::invalid(format!("the request body is not JSON: {error}")))
}

async fn types(
    State(state): State<HttpState>,
    Query(query): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult {
    let mut params = Params(query);
    let descriptors = params.flag("descriptors")?;
    params.finish(&["descriptors"])?;
    let mut response = state
        .cluster
        .list_types(grpc_request(&headers, false, ListTypesRequest::default())?)
        .await?
        .into_inner();
    if !descriptors {
        // The descriptors are for programs that decode `data`; people reading JSON rarely want
        // a few hundred KiB of base64 (?descriptors=true includes them).
        response.file_descriptor_set.clear();
    }
    json_response(
        &state.registry.descriptor_pool(),
        &response,
        "resd.cluster.v1.ListTypesResponse",
    )
}

async fn cluster_status(
    State(state): State<HttpState>,
    Query(query): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult {
    Params(query).finish(&[])?;
    answer(
        &state.registry.descriptor_pool(),
        state
            .cluster
            .status(grpc_request(&headers, false, StatusRequest {})?)
            .await,
        "resd.cluster.v1.StatusResponse",
    )
}

async fn members(
    State(state): State<HttpState>,
    Query(query): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult {
    Params(query).finish(&[])?;
    answer(
        &state.registry.descriptor_pool(),
        state
            .cluster
            .members(grpc_request(&headers, false, MembersRequest {})?)
            .await,
        "resd.cluster.v1.MembersResponse",
    )
}

/// `GET …/{kind}`: List, or with `?watch=true` WatchList as NDJSON.
async fn list_or_watch(
    State(state): State<HttpState>,
    Path((group, version, kind)): Path<(String, String, String)>,
    Query(query): Query<BTreeMap<String, String>>,
    admitted: Option<axum::Extension<crate::limits::Admitted>>,
    headers: HeaderMap,
) -> ApiResult {
    let mut params = Params(query);
    let tenancy = params.tenancy();
    let name_prefix = params.take("name_prefix");
    let selector = params.take("selector");
    if params.flag("watch")? {
        let since_version = params.take("since_version");
        let bookmarks = params.flag("bookmarks")?;
        params.finish(&[
            "partition",
            "namespace",
            "name_prefix",
            "selector",
            "watch",
            "since_version",
            "bookmarks",
        ])?;
        let request = WatchListRequest {
            r#type: Some(resource_type(group, version, kind)),
            tenancy: Some(tenancy),
            name_prefix,
            since_version,
            selector,
            bookmarks,
            shard: None,
        };
        let mut request = grpc_request(&headers, false, request)?;
        if let Some(axum::Extension(admitted)) = admitted {
            request.extensions_mut().insert(admitted);
        }
        let events = state.resources.watch_shared(request).await?.into_inner();
        return Ok(ndjson(events, state.registry.descriptor_pool()));
    }
    let consistent = params.flag("consistent")?;
    let limit = params.number("limit")?;
    let page_token = params.take("page_token");
    params.finish(&[
        "partition",
        "namespace",
        "name_prefix",
        "selector",
        "limit",
        "page_token",
        "consistent",
        "watch",
    ])?;
    let request = ListRequest {
        r#type: Some(resource_type(group, version, kind)),
        tenancy: Some(tenancy),
        name_prefix,
        selector,
        limit,
        page_token,
    };
    let mut request = grpc_request(&headers, consistent, request)?;
    if let Some(axum::Extension(admitted)) = admitted {
        request.extensions_mut().insert(admitted);
    }
    // The list stays charged to the node's and the caller's budgets until its JSON is made.
    let list = state.resources.list_encoded(request).await?.into_inner();
    let decoded = list
        .decode()
        .map_err(|error| ApiError::from(error.into_status()))?;
    let mut value = to_json(
        &state.registry.descriptor_pool(),
        &decoded,
        "resd.resource.v1.ListResponse",
    )
    .map_err(ApiError::internal)?;
    // An empty list is `{"resources": []}`, not `{}` (the JSON mapping leaves empty fields out).
    if let Some(object) = value.as_object_mut() {
        object
            .entry("resources")
            .or_insert_with(|| serde_json::Value::Array(Vec::new()));
    }
    drop(list);
    Ok(axum::Json(value).into_response())
}

/// A watch as NDJSON: one `WatchEvent` per line; an error ends the stream with a last line
/// `{"error": {"code": …, "message": …}}` (resume with `since_version` of the last event).
fn ndjson(
    events: crate::service::grpc::SharedEventStream,
    pool: std::sync::Arc<DescriptorPool>,
) -> Response {
    let lines = events
        .map(move |item| {
            let line = match item {
                // Each event's line is made once and shared by every HTTP watcher of it.
                Ok(event) => event.holding(event.json_line(|event| json_line(&pool, event))),
                Err(status) => {
                    let mut line = serde_json::json!({
                        "error": error_body(
                            code_name(status.code()),
                            proto::reason::of(&status).map(|details| details.reason),
                            status.message(),
                        )
                    })
                    .to_string();
                    line.push('\n');
                    Bytes::from(line)
                }
            };
            Ok::<_, std::convert::Infallible>(line)
        })
        .boxed();
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response()
}

/// An event as one line of JSON.
fn json_line(pool: &DescriptorPool, event: &crate::storage::WatchEvent) -> Bytes {
    let value = to_json(
        pool,
        &crate::service::pb_event(event),
        "resd.resource.v1.WatchEvent",
    )
    .unwrap_or_else(|error| {
        serde_json::json!({"error": error_body("INTERNAL", Some(Reason::Internal), &error)})
    });
    let mut line = value.to_string();
    line.push('\n');
    Bytes::from(line)
}

fn id_of(
    group: String,
    version: String,
    kind: String,
    name: String,
    tenancy: Tenancy,
    uid: String,
) -> Id {
    Id {
        uid,
        name,
        r#type: Some(resource_type(group, version, kind)),
        tenancy: Some(tenancy),
    }
}

async fn read(
    State(state): State<HttpState>,
    Path((group, version, kind, name)): Path<(String, String, String, String)>,
    Query(query): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult {
    let mut params = Params(query);
    let tenancy = params.tenancy();
    let consistent = params.flag("consistent")?;
    params.finish(&["partition", "namespace", "consistent"])?;
    let request = ReadRequest {
        id: Some(id_of(group, version, kind, name, tenancy, String::new())),
        ..Default::default()
    };
    answer(
        &state.registry.descriptor_pool(),
        state
            .resources
            .read(grpc_request(&headers, consistent, request)?)
            .await,
        "resd.resource.v1.ReadResponse",
    )
}

/// `PUT …/{kind}/{name}` with a `Resource` body: the path names the type and the name (the
/// body may leave them out, not contradict them); `?partition=&namespace=` fill a tenancy the
/// body leaves out; `data` without `@type` is the type's own message. A `version` makes it a
/// compare-and-swap.
async fn write(
    State(state): State<HttpState>,
    Path((group, version, kind, name)): Path<(String, String, String, String)>,
    Query(query): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let mut params = Params(query);
    let tenancy = params.tenancy();
    params.finish(&["partition", "namespace"])?;
    let path_type = resource_type(group, version, kind);
    let mut value = body_json(body)?;
    // A type registered a moment ago on another node: its schema reads the body. Only for a
    // caller the node would serve (a stranger makes it read nothing).
    let known_caller = !state.tokens.enabled()
        || crate::limits::token_in(&headers)
            .ok()
            .flatten()
            .is_some_and(|token| state.tokens.resolve(Some(token)).is_ok());
    if known_caller {
        state.resources.service().know_type(Some(&path_type)).await;
    }
    if let Some(data) = value.get_mut("data").and_then(|d| d.as_object_mut())
        && !data.contains_key("@type")
        && let Some(registration) = state.registry.resolve(&path_type)
    {
        data.insert(
            "@type".into(),
            serde_json::Value::String(type_url(&registration.message_name)),
        );
    }
    let decoded = from_json(
        &state.registry.descriptor_pool(),
        value.clone(),
        "resd.resource.v1.Resource",
    );
    let decoded = match decoded {
        // A field a Type acknowledged elsewhere a moment ago added: read with this node's
        // schemas once it has caught up with the leader.
        Err(_) if known_caller && state.resources.service().sync().await.is_ok() => from_json(
            &state.registry.descriptor_pool(),
            value,
            "resd.resource.v1.Resource",
        ),
        decoded => decoded,
    };
    let mut resource: Resource = decoded
        .map_err(|error| ApiError::invalid(format!("the body is not a Resource: {error}")))?;
    let id = resource.id.get_or_insert_with(Id::default);
    match &id.r#type {
        None => id.r#type = Some(path_type.clone()),
        Some(body_type) if *body_type != path_type => {
            return Err(ApiError::invalid(format!(
                "the body's id.type ({}.{}.{}) is not the path's ({}.{}.{})",
                body_type.group,
                body_type.group_version,
                body_type.kind,
                path_type.group,
                path_type.group_version,
                path_type.kind
            )));
        }
        Some(_) => {}
    }
    if id.name.is_empty() {
        id.name = name;
    } else if id.name != name {
        return Err(ApiError::invalid(format!(
            "the body's id.name ({}) is not the path's ({name})",
            id.name
        )));
    }
    if id.tenancy.is_none() {
        id.tenancy = Some(tenancy);
    }
    answer(
        &state.registry.descriptor_pool(),
        state
            .resources
            .write(grpc_request(
                &headers,
                false,
                WriteRequest {
                    resource: Some(resource),
                },
            )?)
            .await,
        "resd.resource.v1.WriteResponse",
    )
}

/// `PUT …/{kind}/{name}/status/{key}?version=V` with a `Status` body.
async fn write_status(
    State(state): State<HttpState>,
    Path((group, version, kind, name, key)): Path<(String, String, String, String, String)>,
    Query(query): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let mut params = Params(query);
    let tenancy = params.tenancy();
    let resource_version = params.take("version");
    let uid = params.take("uid");
    params.finish(&["partition", "namespace", "version", "uid"])?;
    let status: ResourceStatus = from_json(
        &state.registry.descriptor_pool(),
        body_json(body)?,
        "resd.resource.v1.Status",
    )
    .map_err(|error| ApiError::invalid(format!("the body is not a Status: {error}")))?;
    let request = WriteStatusRequest {
        id: Some(id_of(group, version, kind, name, tenancy, uid)),
        version: resource_version,
        key,
        status: Some(status),
    };
    answer(
        &state.registry.descriptor_pool(),
        state
            .resources
            .write_status(grpc_request(&headers, false, request)?)
            .await,
        "resd.resource.v1.WriteStatusResponse",
    )
}

/// `DELETE …/{kind}/{name}?version=&uid=`: both optional preconditions.
async fn delete(
    State(state): State<HttpState>,
    Path((group, version, kind, name)): Path<(String, String, String, String)>,
    Query(query): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult {
    let mut params = Params(query);
    let tenancy = params.tenancy();
    let resource_version = params.take("version");
    let uid = params.take("uid");
    params.finish(&["partition", "namespace", "version", "uid"])?;
    let request = DeleteRequest {
        id: Some(id_of(group, version, kind, name, tenancy, uid)),
        version: resource_version,
    };
    answer(
        &state.registry.descriptor_pool(),
        state
            .resources
            .delete(grpc_request(&headers, false, request)?)
            .await,
        "resd.resource.v1.DeleteResponse",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_the_statuses_design_names() {
        for (code, status) in [
            (tonic::Code::InvalidArgument, 400),
            (tonic::Code::Unauthenticated, 401),
            (tonic::Code::PermissionDenied, 403),
            (tonic::Code::NotFound, 404),
            (tonic::Code::Aborted, 409),
            (tonic::Code::FailedPrecondition, 412),
            (tonic::Code::ResourceExhausted, 413),
            (tonic::Code::Unavailable, 503),
            (tonic::Code::Internal, 500),
            (tonic::Code::DataLoss, 500),
        ] {
            assert_eq!(http_status(code).as_u16(), status, "{code:?}");
        }
    }

    #[test]
    fn unknown_query_parameters_name_what_the_route_takes() {
        let mut params = Params(BTreeMap::from([
            ("namespace".to_owned(), "jazz".to_owned()),
            ("nmaespace".to_owned(), "x".to_owned()),
        ]));
        assert_eq!(params.tenancy().namespace, "jazz");
        let error = params
            .finish(&["partition", "namespace"])
            .expect_err("unknown");
        assert_eq!(error.status, StatusCode::BAD_REQUEST);
        assert!(error.message.contains("\"nmaespace\""), "{}", error.message);
        assert!(error.message.contains("partition, namespace"));
    }
}
