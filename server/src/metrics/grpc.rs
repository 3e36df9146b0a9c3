//! Counting and timing every gRPC request: a tower layer on both servers. The status code of a
//! unary call arrives in the trailers, so the response body is wrapped to see them; a call the
//! client abandons counts as `CANCELLED`. Requests are logged at debug with method, code and
//! duration.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::Instant;

use http_body::{Body, Frame};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

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
fn method_of(path: &str) -> Method {
    METHODS.get(path).cloned().unwrap_or_else(|| Method {
        service: "other".into(),
        name: "other".into(),
        streaming: false,
    })
}

/// The request counters and durations.
#[derive(Debug, Clone)]
pub struct GrpcMetrics {
    pub requests: Family<Labels, Counter>,
    pub duration: HistogramFamily,
}

impl GrpcMetrics {
    pub(super) fn new(duration: HistogramFamily) -> Self {
        GrpcMetrics {
            requests: Family::default(),
            duration,
        }
    }

    /// Records one answered request.
    pub fn record(&self, path: &str, code: &str, seconds: f64) {
        let method = method_of(path);
        self.count(&method, code);
        self.time(&method, seconds);
    }

    fn count(&self, method: &Method, code: &str) {
        self.requests
            .get_or_create(&vec![
                ("service", method.service.clone()),
                ("method", method.name.clone()),
                ("code", code.to_owned()),
            ])
            .inc();
    }

    fn time(&self, method: &Method, seconds: f64) {
        self.duration
            .get_or_create(&vec![("method", method.name.clone())])
            .observe(seconds);
    }
}

/// The name of a gRPC status code as Prometheus labels and logs show it (`NOT_FOUND`).
pub fn code_name(code: tonic::Code) -> &'static str {
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
pub struct GrpcMetricsLayer {
    metrics: Arc<super::Metrics>,
}

impl GrpcMetricsLayer {
    pub fn new(metrics: Arc<super::Metrics>) -> Self {
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
pub struct GrpcMetricsService<S> {
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
        let method = method_of(request.uri().path());
        let started = Instant::now();
        let metrics = self.metrics.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            let mut call = Call {
                method,
                started,
                metrics,
                done: false,
            };
            if call.method.streaming {
                call.metrics
                    .grpc
                    .time(&call.method, started.elapsed().as_secs_f64());
            }
            // An answer that is nothing but a status (tonic's refusals) ends here.
            if let Some(status) = tonic::Status::from_header_map(response.headers()) {
                call.finish(status.code());
                return Ok(response);
            }
            Ok(response.map(|body| tonic::body::Body::new(Recorded { body, call })))
        })
    }
}

/// One request on its way: counted once, when its status is known.
struct Call {
    method: Method,
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
        let code = code_name(code);
        self.metrics.grpc.count(&self.method, code);
        if !self.method.streaming {
            self.metrics.grpc.time(&self.method, seconds);
        }
        tracing::debug!(
            service = %self.method.service,
            method = %self.method.name,
            code,
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

/// A response body that reports the status in its trailers.
struct Recorded {
    body: tonic::body::Body,
    call: Call,
}

impl Body for Recorded {
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
                    let code = tonic::Status::from_header_map(trailers)
                        .map_or(tonic::Code::Ok, |status| status.code());
                    this.call.finish(code);
                }
            }
            Poll::Ready(Some(Err(_))) => this.call.finish(tonic::Code::Internal),
            Poll::Ready(None) => this.call.finish(tonic::Code::Ok),
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
}
