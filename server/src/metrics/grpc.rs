//! Counting and timing every gRPC request: a tower layer on both servers. The status code of a
//! unary call arrives in the trailers, so the response body is wrapped to see them; a call the
//! client abandons counts as `CANCELLED`. Requests are logged at debug with method, code and
//! duration.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, LazyLock, OnceLock};
use std::task::{Context, Poll};
use std::time::Instant;

use http_body::{Body, Frame};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use super::{HistogramFamily, Labels};

/// A method we serve: its service, its name, and whether it answers with a stream (timed to
/// its first response rather than to its end).
#[derive(Debug, Clone)]
struct Method {
    service: String,
    name: String,
    streaming: bool,
}

/// Every method the node serves, by path (`/resd.resource.v1.ResourceService/Write`): from the
/// published descriptors, plus gRPC health and reflection.
static METHODS: LazyLock<HashMap<String, Method>> = LazyLock::new(|| {
    let mut methods = HashMap::new();
    if let Ok(pool) = prost_reflect::DescriptorPool::decode(proto::FILE_DESCRIPTOR_SET) {
        for service in pool.services() {
            for method in service.methods() {
                methods.insert(
                    format!("/{}/{}", service.full_name(), method.name()),
                    Method {
                        service: service.full_name().to_owned(),
                        name: method.name().to_owned(),
                        streaming: method.is_server_streaming(),
                    },
                );
            }
        }
    }
    for (service, name, streaming) in [
        ("grpc.health.v1.Health", "Check", false),
        ("grpc.health.v1.Health", "Watch", true),
        (
            "grpc.reflection.v1.ServerReflection",
            "ServerReflectionInfo",
            true,
        ),
        (
            "grpc.reflection.v1alpha.ServerReflection",
            "ServerReflectionInfo",
            true,
        ),
    ] {
        methods.insert(
            format!("/{service}/{name}"),
            Method {
                service: service.to_owned(),
                name: name.to_owned(),
                streaming,
            },
        );
    }
    methods
});

/// What is unknown is `other`: a client cannot grow the label sets.
fn other_method() -> Method {
    Method {
        service: "other".into(),
        name: "other".into(),
        streaming: false,
    }
}

/// gRPC status codes, 0 (`OK`) to 16 (`UNAUTHENTICATED`).
const CODES: usize = 17;

/// One method's series, made on first use and then shared: a request costs no label vectors,
/// hashing or family locks.
#[derive(Debug)]
struct Series {
    method: Method,
    counts: [OnceLock<Counter>; CODES],
    duration: OnceLock<Histogram>,
}

impl Series {
    fn new(method: Method) -> Arc<Series> {
        Arc::new(Series {
            method,
            counts: std::array::from_fn(|_| OnceLock::new()),
            duration: OnceLock::new(),
        })
    }
}

/// The request counters and durations.
#[derive(Debug, Clone)]
pub(crate) struct GrpcMetrics {
    pub requests: Family<Labels, Counter>,
    pub duration: HistogramFamily,
    /// Every method's series by path; anything else is `other`.
    series: Arc<HashMap<String, Arc<Series>>>,
    other: Arc<Series>,
}

impl GrpcMetrics {
    pub(super) fn new(duration: HistogramFamily) -> Self {
        GrpcMetrics {
            requests: Family::default(),
            duration,
            series: Arc::new(
                METHODS
                    .iter()
                    .map(|(path, method)| (path.clone(), Series::new(method.clone())))
                    .collect(),
            ),
            other: Series::new(other_method()),
        }
    }

    fn series(&self, path: &str) -> Arc<Series> {
        self.series.get(path).unwrap_or(&self.other).clone()
    }

    /// Records one answered request (the tests' way in; the layer counts and times apart).
    #[cfg(test)]
    pub(crate) fn record(&self, path: &str, code: tonic::Code, seconds: f64) {
        let series = self.series(path);
        self.count(&series, code);
        self.time(&series, seconds);
    }

    fn count(&self, series: &Series, code: tonic::Code) {
        let slot = usize::try_from(i32::from(code)).unwrap_or(2).min(CODES - 1);
        series.counts[slot]
            .get_or_init(|| {
                self.requests
                    .get_or_create(&vec![
                        ("service", series.method.service.clone()),
                        ("method", series.method.name.clone()),
                        ("code", code_name(code).to_owned()),
                    ])
                    .clone()
            })
            .inc();
    }

    fn time(&self, series: &Series, seconds: f64) {
        series
            .duration
            .get_or_init(|| {
                self.duration
                    .get_or_create(&vec![("method", series.method.name.clone())])
                    .clone()
            })
            .observe(seconds);
    }
}

/// The name of a gRPC status code as Prometheus labels and logs show it (`NOT_FOUND`).
pub(crate) fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Layer counting and timing the requests of a tonic server.
#[derive(Debug, Clone)]
pub(crate) struct GrpcMetricsLayer {
    metrics: Arc<super::Metrics>,
}

impl GrpcMetricsLayer {
    pub(crate) fn new(metrics: Arc<super::Metrics>) -> Self {
        GrpcMetricsLayer { metrics }
    }
}

impl<S> tower::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetricsService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct GrpcMetricsService<S> {
    inner: S,
    metrics: Arc<super::Metrics>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for GrpcMetricsService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let series = self.metrics.grpc.series(request.uri().path());
        let started = Instant::now();
        let metrics = self.metrics.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            let mut call = Call {
                series,
                started,
                metrics,
                done: false,
            };
            if call.series.method.streaming {
                call.metrics
                    .grpc
                    .time(&call.series, started.elapsed().as_secs_f64());
            }
            // An answer that is nothing but a status (tonic's refusals) ends here.
            if let Some(code) = status_code(response.headers()) {
                call.finish(code);
                return Ok(response);
            }
            Ok(response.map(|body| {
                tonic::body::Body::new(StatusBody::new(body, move |code, _| {
                    let mut call = call;
                    call.finish(code);
                }))
            }))
        })
    }
}

/// The code of the `grpc-status` header, if there is one: read without building a
/// `tonic::Status` (which copies the whole header map), on every answer.
pub(crate) fn status_code(headers: &http::HeaderMap) -> Option<tonic::Code> {
    let value = headers.get("grpc-status")?;
    Some(tonic::Code::from_bytes(value.as_bytes()))
}

/// One request on its way: counted once, when its status is known.
struct Call {
    series: Arc<Series>,
    started: Instant,
    metrics: Arc<super::Metrics>,
    done: bool,
}

impl Call {
    fn finish(&mut self, code: tonic::Code) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let seconds = self.started.elapsed().as_secs_f64();
        self.metrics.grpc.count(&self.series, code);
        if !self.series.method.streaming {
            self.metrics.grpc.time(&self.series, seconds);
        }
        tracing::debug!(
            service = %self.series.method.service,
            method = %self.series.method.name,
            code = code_name(code),
            duration_ms = seconds * 1000.0,
            "request"
        );
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        // The body was dropped before its trailers: the client went away.
        self.finish(tonic::Code::Cancelled);
    }
}

/// A response body that tells `on_status` the call's status once it is known: from the
/// trailers, at the end of a body without them (`OK`), or on an error (`INTERNAL`). Dropped
/// before that, it drops `on_status` untold (whatever it holds says the client went away).
/// Shared by the metrics and the audit log.
pub(crate) struct StatusBody<F> {
    body: tonic::body::Body,
    on_status: Option<F>,
}

impl<F> StatusBody<F>
where
    F: FnOnce(tonic::Code, Option<&http::HeaderMap>) + Send + Unpin + 'static,
{
    pub(crate) fn new(body: tonic::body::Body, on_status: F) -> Self {
        StatusBody {
            body,
            on_status: Some(on_status),
        }
    }

    fn report(&mut self, code: tonic::Code, trailers: Option<&http::HeaderMap>) {
        if let Some(on_status) = self.on_status.take() {
            on_status(code, trailers);
        }
    }
}

impl<F> Body for StatusBody<F>
where
    F: FnOnce(tonic::Code, Option<&http::HeaderMap>) + Send + Unpin + 'static,
{
    type Data = <tonic::body::Body as Body>::Data;
    type Error = <tonic::body::Body as Body>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let code = status_code(trailers).unwrap_or(tonic::Code::Ok);
                    this.report(code, Some(trailers));
                }
            }
            Poll::Ready(Some(Err(_))) => this.report(tonic::Code::Internal, None),
            Poll::Ready(None) => this.report(tonic::Code::Ok, None),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_come_from_the_descriptors_and_everything_else_is_other() {
        let metrics = GrpcMetrics::new(HistogramFamily::new_with_constructor(histogram));
        let method_of = |path: &str| metrics.series(path).method.clone();
        let write = method_of("/resd.resource.v1.ResourceService/Write");
        assert_eq!(
            (write.service.as_str(), write.name.as_str(), write.streaming),
            ("resd.resource.v1.ResourceService", "Write", false)
        );
        assert!(method_of("/resd.resource.v1.ResourceService/WatchList").streaming);
        assert!(method_of("/resd.raft.v1.RaftService/AppendEntries").name == "AppendEntries");
        assert_eq!(
            method_of("/resd.resource.v1.ResourceService/Nope").name,
            "other"
        );
        assert_eq!(method_of("/x").service, "other");
    }

    #[test]
    fn the_status_code_is_read_from_the_header_as_tonic_reads_it() {
        for code in [
            tonic::Code::Ok,
            tonic::Code::NotFound,
            tonic::Code::Unauthenticated,
        ] {
            let headers = tonic::Status::new(code, "a message")
                .into_http::<()>()
                .headers()
                .clone();
            assert_eq!(status_code(&headers), Some(code));
            assert_eq!(
                tonic::Status::from_header_map(&headers).map(|status| status.code()),
                Some(code)
            );
        }
        let mut odd = http::HeaderMap::new();
        odd.insert("grpc-status", http::HeaderValue::from_static("99"));
        assert_eq!(
            status_code(&odd),
            tonic::Status::from_header_map(&odd).map(|status| status.code())
        );
        assert_eq!(status_code(&http::HeaderMap::new()), None);
    }

    fn histogram() -> Histogram {
        Histogram::new([0.1])
    }

    #[test]
    fn a_methods_series_is_made_once_and_counts_every_later_request() {
        let metrics = GrpcMetrics::new(HistogramFamily::new_with_constructor(histogram));
        let read = "/resd.resource.v1.ResourceService/Read";
        for _ in 0..3 {
            metrics.record(read, tonic::Code::Ok, 0.001);
        }
        metrics.record(read, tonic::Code::NotFound, 0.001);
        metrics.record("/x", tonic::Code::Unimplemented, 0.001);
        let labels = |service: &str, method: &str, code: &str| {
            vec![
                ("service", service.to_owned()),
                ("method", method.to_owned()),
                ("code", code.to_owned()),
            ]
        };
        let service = "resd.resource.v1.ResourceService";
        let count = |m: &GrpcMetrics, labels| m.requests.get_or_create(&labels).get();
        assert_eq!(count(&metrics, labels(service, "Read", "OK")), 3);
        assert_eq!(count(&metrics, labels(service, "Read", "NOT_FOUND")), 1);
        assert_eq!(
            count(&metrics, labels("other", "other", "UNIMPLEMENTED")),
            1
        );
        // Another node's metrics (resd dev runs three in one process) have their own series.
        let other_node = GrpcMetrics::new(HistogramFamily::new_with_constructor(histogram));
        assert_eq!(count(&other_node, labels(service, "Read", "OK")), 0);
    }
}
