//! Admission at the edge of both API servers: [`GrpcGuardLayer`] for the gRPC port (the HTTP
//! port's is `crate::http::guard`, over the same [`GuardedBody`]). Each admits a request from its headers
//! ([`super::Limits::admit`]) before anything reads its body, and wraps the body in a
//! [`GuardedBody`]: every frame is charged to the caller's and the node's budgets as it
//! arrives (released when the body is done with), a body larger than the caller may send ends
//! at once, and a unary request's body must arrive within [`super::BODY_TIMEOUT`].

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::{Admitted, Charge, LimitError, Limits};
use crate::tls::ConnInfo;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How a request's body is bounded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyRules {
    /// The whole body must have arrived by then (unary requests).
    pub deadline: Option<Duration>,
    /// Its bytes count against the caller's and the node's budgets until it is done with.
    /// Off for streams a handler reads message by message after checking the caller
    /// (a snapshot restore), which would otherwise count their whole length.
    pub charged: bool,
}

/// Why a guarded body ended: a limit, or its own error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GuardError {
    #[error(transparent)]
    Limit(#[from] LimitError),
    #[error(transparent)]
    Body(BoxError),
}

/// A request body bounded by its caller's limits.
pub(crate) struct GuardedBody<B> {
    inner: B,
    admitted: Admitted,
    caller: Charge,
    node: Charge,
    received: usize,
    rules: BodyRules,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    done: bool,
}

impl<B> GuardedBody<B> {
    pub(crate) fn new(inner: B, admitted: Admitted, rules: BodyRules) -> Self {
        GuardedBody {
            inner,
            caller: Charge::new(admitted.share.bytes.clone()),
            node: Charge::new(admitted.node_bytes.clone()),
            admitted,
            received: 0,
            deadline: rules
                .deadline
                .map(|after| Box::pin(tokio::time::sleep(after))),
            rules,
            done: false,
        }
    }

    /// Counts a frame of `len` bytes, or says which limit it passes.
    fn take(&mut self, len: usize) -> Result<(), LimitError> {
        self.received = self.received.saturating_add(len);
        if self.received > self.admitted.max_body {
            if self.admitted.anonymous {
                return Err(LimitError::AnonymousBody {
                    limit: super::ANONYMOUS_BODY_BYTES,
                });
            }
            // Over the size limit: let the service answer with its own message (it names the
            // limit and the flag); nothing more is charged or kept for it here.
            return Ok(());
        }
        if !self.rules.charged {
            return Ok(());
        }
        self.caller
            .add(len)
            .map_err(|used| LimitError::CallerBytes {
                who: self.admitted.share.who.clone(),
                used,
                limit: self.caller.budget().limit(),
            })?;
        self.node.add(len).map_err(|used| LimitError::NodeBytes {
            used,
            limit: self.node.budget().limit(),
        })
    }

    /// The body is done with: what it charged is released (its bytes are the handler's now).
    fn finish(&mut self) {
        self.done = true;
        self.deadline = None;
        self.caller = Charge::new(self.admitted.share.bytes.clone());
        self.node = Charge::new(self.admitted.node_bytes.clone());
    }
}

impl<B> Body for GuardedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = GuardError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, GuardError>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref()
                    && let Err(error) = this.take(data.len())
                {
                    this.finish();
                    return Poll::Ready(Some(Err(GuardError::Limit(error))));
                }
                if this.inner.is_end_stream() {
                    this.finish();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => {
                this.finish();
                Poll::Ready(Some(Err(GuardError::Body(error.into()))))
            }
            Poll::Ready(None) => {
                this.finish();
                Poll::Ready(None)
            }
            Poll::Pending => {
                if let Some(deadline) = this.deadline.as_mut()
                    && deadline.as_mut().poll(cx).is_ready()
                {
                    let after = this.rules.deadline.unwrap_or_default();
                    this.finish();
                    return Poll::Ready(Some(Err(GuardError::Limit(LimitError::BodyTimeout(
                        after,
                    )))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The rules of an HTTP request's body: one request, one deadline.
pub(crate) const HTTP_BODY: BodyRules = BodyRules {
    deadline: Some(super::BODY_TIMEOUT),
    charged: true,
};

/// gRPC methods whose requests are streams: a reflection session may last a minute; a
/// restore's chunks are neither timed nor charged (the handler checks the caller before reading
/// them, one at a time).
fn grpc_rules(path: &str) -> BodyRules {
    let unary = BodyRules {
        deadline: Some(super::BODY_TIMEOUT),
        charged: true,
    };
    match path {
        "/resd.cluster.v1.ClusterService/SnapshotRestore" => BodyRules {
            deadline: None,
            charged: false,
        },
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
        | "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo" => BodyRules {
            deadline: Some(super::REFLECTION_TIMEOUT),
            charged: true,
        },
        _ => unary,
    }
}

/// Admission for a tonic server (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct GrpcGuardLayer {
    limits: Arc<Limits>,
}

impl GrpcGuardLayer {
    pub(crate) fn new(limits: Arc<Limits>) -> Self {
        GrpcGuardLayer { limits }
    }
}

impl<S> tower::Layer<S> for GrpcGuardLayer {
    type Service = GrpcGuard<S>;

    fn layer(&self, inner: S) -> GrpcGuard<S> {
        GrpcGuard {
            inner,
            limits: self.limits.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct GrpcGuard<S> {
    inner: S,
    limits: Arc<Limits>,
}

type GrpcRequest = http::Request<tonic::body::Body>;
type GrpcResponse = http::Response<tonic::body::Body>;

impl<S> tower::Service<GrpcRequest> for GrpcGuard<S>
where
    S: tower::Service<GrpcRequest, Response = GrpcResponse>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = GrpcResponse;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<GrpcResponse, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: GrpcRequest) -> Self::Future {
        let remote = request
            .extensions()
            .get::<ConnInfo>()
            .and_then(ConnInfo::remote_ip);
        let path = request.uri().path().to_owned();
        let path = path.as_str();
        let ignores_token = path == "/resd.cluster.v1.ClusterService/AclBootstrap"
            || path.starts_with("/grpc.health.")
            || path.starts_with("/grpc.reflection.");
        let admitted = match self.limits.admit(request.headers(), remote, ignores_token) {
            Ok(admitted) => admitted,
            Err(refused) => {
                let response = crate::service::Error::from(refused)
                    .into_status()
                    .into_http();
                return Box::pin(async move { Ok(response) });
            }
        };
        let rules = grpc_rules(request.uri().path());
        // A watch is counted by its own limit, not as a request in flight.
        let in_flight = if path == "/resd.resource.v1.ResourceService/WatchList" {
            None
        } else {
            match admitted.in_flight() {
                Ok(in_flight) => Some(in_flight),
                Err(refused) => {
                    let response = crate::service::Error::from(refused)
                        .into_status()
                        .into_http();
                    return Box::pin(async move { Ok(response) });
                }
            }
        };
        request.extensions_mut().insert(admitted.clone());
        let request = request.map(|body| {
            tonic::body::Body::new(http_body_util::BodyExt::map_err(
                GuardedBody::new(body, admitted, rules),
                |error| match error {
                    GuardError::Limit(limit) => crate::service::Error::from(limit).into_status(),
                    GuardError::Body(error) => tonic::Status::from_error(error),
                },
            ))
        });
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            if in_flight.is_none() {
                return Ok(response);
            }
            let charge = response
                .extensions()
                .get::<super::HeldCharge>()
                .and_then(super::HeldCharge::take);
            Ok(response.map(|body| tonic::body::Body::new(Metered::new(body, in_flight, charge))))
        })
    }
}

/// Data frames of an answer handed to the transport at most this large: HTTP/2 (and HTTP/1)
/// queue a frame whole once its window opens at all, so larger ones would be held there
/// uncounted while the rest of the answer is charged.
const ANSWER_SLICE: usize = 64 * 1024;

/// An answer's body, holding its request's place among its caller's requests in flight (and
/// the charge for its bytes, when its handler made one) until it is dropped — sent, or its
/// client gone — and handing its data out in slices of [`ANSWER_SLICE`].
pub(crate) struct Metered<B> {
    inner: B,
    /// What is left of the last data frame taken from `inner`.
    pending: Bytes,
    _in_flight: Option<super::InFlight>,
    _charge: Option<super::AnswerCharge>,
}

impl<B> Metered<B> {
    pub(crate) fn new(
        inner: B,
        in_flight: Option<super::InFlight>,
        charge: Option<super::AnswerCharge>,
    ) -> Self {
        Metered {
            inner,
            pending: Bytes::new(),
            _in_flight: in_flight,
            _charge: charge,
        }
    }

    fn slice(&mut self) -> Frame<Bytes> {
        let take = self.pending.len().min(ANSWER_SLICE);
        Frame::data(self.pending.split_to(take))
    }
}

impl<B> Body for Metered<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        if !self.pending.is_empty() {
            return Poll::Ready(Some(Ok(self.slice())));
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) if data.len() > ANSWER_SLICE => {
                    self.pending = data;
                    Poll::Ready(Some(Ok(self.slice())))
                }
                Ok(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.pending.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.inner.size_hint();
        let pending = self.pending.len() as u64;
        hint.set_lower(hint.lower() + pending);
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper + pending);
        }
        hint
    }
}

/// The limit that ended a body, if one did (found in an error's sources).
pub(crate) fn limit_in<'e>(error: &'e (dyn std::error::Error + 'static)) -> Option<&'e LimitError> {
    let mut source = Some(error);
    while let Some(error) = source {
        if let Some(GuardError::Limit(limit)) = error.downcast_ref::<GuardError>() {
            return Some(limit);
        }
        if let Some(limit) = error.downcast_ref::<LimitError>() {
            return Some(limit);
        }
        source = error.source();
    }
    None
}
