//! Answers written from encodings, without decoding and re-encoding per caller.
//!
//! - `ResourceService/Read` and `ResourceService/List`: the stored encodings go to the wire as
//!   they are. A `ReadResponse` is `Resource resource = 1` and a `ListResponse` is `repeated
//!   Resource resources = 1`, so their encodings are each resource's bytes behind a field tag
//!   and a length; the answer is the same bytes the generated handler would send. A List
//!   answer bypasses tonic's encoder ([`list_unary`]): its chunks go to HTTP/2 uncopied.
//! - `ResourceService/WatchList`: each event is encoded once, by the first watcher to send it,
//!   and the bytes are shared with every other watcher of the change ([`SharedEvent::wire`]);
//!   the answer bypasses tonic's encoder too ([`watch_streaming`]), so an event goes to HTTP/2
//!   uncopied and a client that stops reading holds a reference, not a copy.
//!
//! [`ResourceApi`] routes these three here and every other method to the generated server.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use proto::reason::Reason;
use proto::resource::v1::resource_service_server::ResourceServiceServer;
use proto::resource::v1::{ListRequest, ReadRequest, WatchListRequest};
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::{Request, Response, Status};

use super::grpc::{ResourceGrpc, SharedEventStream};
use super::read::EncodedList;
use crate::storage::SharedEvent;

/// A resource as stored.
#[derive(Debug, Default)]
pub(crate) struct EncodedRead(pub Vec<u8>);

/// An answer that writes its own encoding: the same bytes prost would write for the message
/// it stands for.
trait WireAnswer: Send + 'static {
    fn write<B: bytes::BufMut>(self, dst: &mut B);
}

impl WireAnswer for EncodedRead {
    /// As a `ReadResponse`.
    fn write<B: bytes::BufMut>(self, dst: &mut B) {
        crate::wire::proto::put_bytes_field(crate::wire::proto::RESOURCE_FIELD, &self.0, dst);
    }
}

impl WireAnswer for SharedEvent {
    /// As a `WatchEvent`: the shared encoding, made by the first watcher that sends it.
    fn write<B: bytes::BufMut>(self, dst: &mut B) {
        dst.put_slice(&super::read::wire_event(&self));
    }
}

/// Requests `Q` in (prost), [`WireAnswer`]s `A` out.
struct WireCodec<A, Q>(std::marker::PhantomData<fn(Q) -> A>);

impl<A, Q> WireCodec<A, Q> {
    fn new() -> Self {
        WireCodec(std::marker::PhantomData)
    }
}

struct WireEncoder<A>(std::marker::PhantomData<fn(A)>);

impl<A: WireAnswer> Encoder for WireEncoder<A> {
    type Item = A;
    type Error = Status;

    fn encode(&mut self, item: A, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.write(dst);
        Ok(())
    }
}

impl<A: WireAnswer, Q: prost::Message + Default + Send + 'static> Codec for WireCodec<A, Q> {
    type Encode = A;
    type Decode = Q;
    type Encoder = WireEncoder<A>;
    type Decoder = tonic_prost::ProstDecoder<Q>;

    fn encoder(&mut self) -> Self::Encoder {
        WireEncoder(std::marker::PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::new(Default::default())
    }
}

/// The Read handler over [`ResourceGrpc::read_encoded`].
struct ReadEncoded(ResourceGrpc);

impl tonic::server::UnaryService<ReadRequest> for ReadEncoded {
    type Response = EncodedRead;
    type Future = Pin<Box<dyn Future<Output = Result<Response<EncodedRead>, Status>> + Send>>;

    fn call(&mut self, request: Request<ReadRequest>) -> Self::Future {
        let grpc = self.0.clone();
        Box::pin(async move { grpc.read_encoded(request).await })
    }
}

/// `resd.resource.v1.ResourceService`: Read, List and WatchList through [`WireCodec`], the
/// rest through the generated server.
#[derive(Debug, Clone)]
pub(crate) struct ResourceApi {
    grpc: ResourceGrpc,
    generated: ResourceServiceServer<ResourceGrpc>,
    max_decoding: usize,
}

impl ResourceApi {
    pub(crate) fn new(grpc: ResourceGrpc, max_decoding: usize) -> Self {
        ResourceApi {
            generated: ResourceServiceServer::new(grpc.clone())
                .max_decoding_message_size(max_decoding),
            grpc,
            max_decoding,
        }
    }
}

impl tonic::server::NamedService for ResourceApi {
    const NAME: &'static str = "resd.resource.v1.ResourceService";
}

type BoxResponse =
    Pin<Box<dyn Future<Output = Result<http::Response<tonic::body::Body>, Infallible>> + Send>>;

impl tower::Service<http::Request<tonic::body::Body>> for ResourceApi {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxResponse;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let max = self.max_decoding;
        match request.uri().path() {
            "/resd.resource.v1.ResourceService/Read" => {
                let handler = ReadEncoded(self.grpc.clone());
                Box::pin(async move { Ok(wire_grpc(max).unary(handler, request).await) })
            }
            "/resd.resource.v1.ResourceService/List" => {
                let grpc = self.grpc.clone();
                Box::pin(async move { Ok(list_unary(grpc, max, request).await) })
            }
            "/resd.resource.v1.ResourceService/WatchList" => {
                let grpc = self.grpc.clone();
                Box::pin(async move { Ok(watch_streaming(grpc, max, request).await) })
            }
            _ => {
                let mut generated = self.generated.clone();
                Box::pin(async move { tower::Service::call(&mut generated, request).await })
            }
        }
    }
}

/// The bytes before every gRPC message: a compression flag and the message's length.
const GRPC_HEADER: usize = 5;

/// List, answered without tonic's encoder: the framed chunks of an [`EncodedList`] go to
/// HTTP/2 as they are, behind the gRPC message header, so a long list is neither copied again
/// nor gathered into one buffer as large as itself. Errors answer as tonic would (a
/// trailers-only response).
async fn list_unary(
    grpc: ResourceGrpc,
    max_decoding: usize,
    request: http::Request<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    match list_answer(grpc, max_decoding, request).await {
        Ok(response) => response,
        Err(status) => status.into_http(),
    }
}

async fn list_answer(
    grpc: ResourceGrpc,
    max_decoding: usize,
    request: http::Request<tonic::body::Body>,
) -> Result<http::Response<tonic::body::Body>, Status> {
    let (parts, body) = request.into_parts();
    let message: ListRequest = unary_message(body, max_decoding).await?;
    let request = Request::from_parts(
        tonic::metadata::MetadataMap::from_headers(parts.headers),
        parts.extensions,
        message,
    );
    let (metadata, list, _) = grpc.list_encoded(request).await?.into_parts();
    let mut response = http::Response::new(tonic::body::Body::new(ListBody::new(list)?));
    *response.headers_mut() = metadata.into_headers();
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    Ok(response)
}

/// WatchList, answered without tonic's encoder: each event's shared encoding (made once, for
/// every watcher of the change) goes to HTTP/2 as it is, behind its own message header. A
/// client that stops reading holds a reference to one event in its connection's queue, never a
/// copy of it. Errors before the stream answer as tonic would; an error during it ends the
/// stream with its status in the trailers.
async fn watch_streaming(
    grpc: ResourceGrpc,
    max_decoding: usize,
    request: http::Request<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    let answer = async {
        let (parts, body) = request.into_parts();
        let message: WatchListRequest = unary_message(body, max_decoding).await?;
        let request = Request::from_parts(
            tonic::metadata::MetadataMap::from_headers(parts.headers),
            parts.extensions,
            message,
        );
        let (metadata, events, _) = grpc.watch_shared(request).await?.into_parts();
        let mut response = http::Response::new(tonic::body::Body::new(WatchBody::new(events)));
        *response.headers_mut() = metadata.into_headers();
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        Ok::<_, Status>(response)
    };
    match answer.await {
        Ok(response) => response,
        Err(status) => status.into_http(),
    }
}

/// Events at most this large are copied, with their headers, into one frame with the events
/// ready after them (up to [`BATCH_BYTES`]: one HTTP/2 write for a burst, as tonic's encoder
/// does); larger ones go as their header and then the shared encoding itself.
const SMALL_EVENT: usize = 16 * 1024;
/// Bytes of small events gathered into one frame at most.
const BATCH_BYTES: usize = 32 * 1024;

/// A WatchList answer's body: per event, the gRPC message header and the shared encoding; at the
/// end, the status as trailers.
struct WatchBody {
    events: SharedEventStream,
    /// Frames ready to go before anything else is taken from `events`.
    queued: std::collections::VecDeque<http_body::Frame<bytes::Bytes>>,
    ended: bool,
}

impl WatchBody {
    fn new(events: SharedEventStream) -> Self {
        WatchBody {
            events,
            queued: std::collections::VecDeque::new(),
            ended: false,
        }
    }

    /// Queues what the next poll sends: the ready events (small ones gathered into one frame),
    /// or the trailers once the stream ends. `Pending` when nothing is ready.
    fn fill(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let mut batch = bytes::BytesMut::new();
        let end = loop {
            match self.events.as_mut().poll_next(cx) {
                Poll::Pending if batch.is_empty() => return Poll::Pending,
                Poll::Pending => break None,
                Poll::Ready(Some(Ok(event))) => {
                    let wire = super::read::wire_event(&event);
                    let Ok(length) = u32::try_from(wire.len()) else {
                        // Past what a gRPC message can hold: nothing stored is this large.
                        break Some(Status::from(super::Error::Internal(
                            "an event is larger than a gRPC message can hold".into(),
                        )));
                    };
                    let mut header = [0u8; GRPC_HEADER];
                    header[1..].copy_from_slice(&length.to_be_bytes());
                    if wire.len() <= SMALL_EVENT {
                        batch.extend_from_slice(&header);
                        batch.extend_from_slice(&wire);
                        if batch.len() >= BATCH_BYTES {
                            break None;
                        }
                        continue;
                    }
                    if !batch.is_empty() {
                        let gathered = std::mem::take(&mut batch).freeze();
                        self.queued.push_back(http_body::Frame::data(gathered));
                    }
                    self.queued
                        .push_back(http_body::Frame::data(bytes::Bytes::copy_from_slice(
                            &header,
                        )));
                    // The payload keeps its event alive while the connection holds it: another
                    // watcher of the same version then shares it instead of encoding its own.
                    self.queued
                        .push_back(http_body::Frame::data(event.holding(wire)));
                    return Poll::Ready(());
                }
                Poll::Ready(Some(Err(status))) => break Some(status),
                Poll::Ready(None) => break Some(Status::ok("")),
            }
        };
        if !batch.is_empty() {
            self.queued
                .push_back(http_body::Frame::data(batch.freeze()));
        }
        if let Some(status) = end {
            self.ended = true;
            self.queued.push_back(trailers(&status));
        }
        Poll::Ready(())
    }
}

impl http_body::Body for WatchBody {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Status>>> {
        if self.queued.is_empty() && !self.ended && self.fill(cx).is_pending() {
            return Poll::Pending;
        }
        Poll::Ready(self.queued.pop_front().map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.queued.is_empty()
    }
}

/// A status as gRPC trailers.
fn trailers(status: &Status) -> http_body::Frame<bytes::Bytes> {
    let mut headers = http::HeaderMap::new();
    if status.add_header(&mut headers).is_err() {
        headers.insert("grpc-status", http::HeaderValue::from_static("13"));
    }
    http_body::Frame::trailers(headers)
}

/// The one message of a unary gRPC request, at most `max` bytes, uncompressed.
async fn unary_message<M: prost::Message + Default>(
    body: tonic::body::Body,
    max: usize,
) -> Result<M, Status> {
    use http_body_util::BodyExt as _;
    // The codes are tonic's for the same failures (a client sees no difference between this
    // path and the generated one); each carries its reason.
    let too_large = || {
        super::error::framing(
            tonic::Code::OutOfRange,
            Reason::Quota,
            format!("the request is larger than the server's limit of {max} bytes"),
        )
    };
    let bytes = http_body_util::Limited::new(body, max.saturating_add(GRPC_HEADER))
        .collect()
        .await
        .map_err(|error| {
            if error.is::<http_body_util::LengthLimitError>() {
                return too_large();
            }
            match error.downcast::<Status>() {
                Ok(status) => *status,
                Err(error) => super::error::framing(
                    tonic::Code::Internal,
                    Reason::Invalid,
                    format!("reading the request: {error}"),
                ),
            }
        })?
        .to_bytes();
    let Some((header, rest)) = bytes.split_first_chunk::<GRPC_HEADER>() else {
        return Err(super::error::framing(
            tonic::Code::Internal,
            Reason::Invalid,
            "the request carries no message".into(),
        ));
    };
    if header[0] != 0 {
        return Err(super::error::framing(
            tonic::Code::Unimplemented,
            Reason::Invalid,
            "compressed requests are not supported by this server: send the message uncompressed"
                .into(),
        ));
    }
    let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if length > max {
        return Err(too_large());
    }
    if rest.len() != length {
        return Err(super::error::framing(
            tonic::Code::Internal,
            Reason::Invalid,
            format!(
                "a unary request carries one whole message: the header says {length} bytes, {} follow",
                rest.len()
            ),
        ));
    }
    M::decode(rest).map_err(|error| {
        super::error::framing(
            tonic::Code::Internal,
            Reason::Invalid,
            format!("the request does not decode: {error}"),
        )
    })
}

/// A List answer's body: the gRPC message header, the list's chunks, then `grpc-status: 0`.
struct ListBody {
    pending: std::collections::VecDeque<bytes::Bytes>,
    trailers: Option<http::HeaderMap>,
    /// The list's bytes, counted against the node's budget and the caller's share until the
    /// answer is dropped.
    _charge: super::read::ListCharges,
}

impl ListBody {
    fn new(list: EncodedList) -> Result<ListBody, Status> {
        let length = u32::try_from(list.encoded_len()).map_err(|_| {
            Status::from(super::Error::ResourceExhausted(format!(
                "the list is {} bytes, over the 4 GiB a gRPC message can hold: list a narrower name prefix",
                list.encoded_len()
            )))
        })?;
        let mut header = Vec::with_capacity(GRPC_HEADER);
        header.push(0);
        header.extend_from_slice(&length.to_be_bytes());
        let mut pending = std::collections::VecDeque::new();
        pending.push_back(bytes::Bytes::from(header));
        let (chunks, charge) = list.into_chunks();
        pending.extend(chunks.into_iter().map(bytes::Bytes::from));
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        Ok(ListBody {
            pending,
            trailers: Some(trailers),
            _charge: charge,
        })
    }
}

impl http_body::Body for ListBody {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Status>>> {
        if let Some(chunk) = self.pending.pop_front() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(chunk))));
        }
        Poll::Ready(
            self.trailers
                .take()
                .map(|t| Ok(http_body::Frame::trailers(t))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.pending.is_empty() && self.trailers.is_none()
    }
}

/// A tonic handler of requests `Q` answering [`WireAnswer`]s `A`, with the server's limit on
/// incoming messages (answers are as large as what is stored).
fn wire_grpc<A: WireAnswer, Q: prost::Message + Default + Send + 'static>(
    max_decoding: usize,
) -> tonic::server::Grpc<WireCodec<A, Q>> {
    tonic::server::Grpc::new(WireCodec::new())
        .apply_max_message_size_config(Some(max_decoding), Some(usize::MAX))
}

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use proto::resource::v1 as pb;

    use crate::storage::conformance::Fixture;
    use crate::storage::{Operation, SharedEvent, WatchEvent};

    #[tokio::test]
    async fn a_stored_resource_goes_on_the_wire_as_the_generated_read_and_list_answers_would() {
        use http_body_util::BodyExt as _;

        use super::{EncodedList, EncodedRead, ListBody, WireAnswer};
        let resource = Fixture::new().artist("wire");
        let stored = resource.encode_to_vec();
        let mut read = Vec::new();
        EncodedRead(stored.clone()).write(&mut read);
        let expected = pb::ReadResponse {
            resource: Some(resource.clone()),
        };
        assert_eq!(read, expected.encode_to_vec());

        // A list body: the gRPC message header, the ListResponse, then `grpc-status: 0`.
        let mut encoded = EncodedList::default();
        encoded.push(&stored);
        encoded.push(&stored);
        assert_eq!(encoded.len(), 2);
        let collected = ListBody::new(encoded)
            .expect("a small list")
            .collect()
            .await
            .expect("the body");
        let trailers = collected.trailers().cloned().expect("trailers");
        assert_eq!(
            trailers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"0"[..])
        );
        let bytes = collected.to_bytes();
        let expected = pb::ListResponse {
            resources: vec![resource.clone(), resource],
            ..pb::ListResponse::default()
        }
        .encode_to_vec();
        assert_eq!(bytes[0], 0, "uncompressed");
        assert_eq!(
            u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize,
            expected.len()
        );
        assert_eq!(&bytes[5..], expected.as_slice());
    }

    #[tokio::test]
    async fn a_unary_request_is_one_whole_uncompressed_message_within_the_limit() {
        use super::unary_message;
        let body = |bytes: Vec<u8>| {
            tonic::body::Body::new(http_body_util::Full::new(bytes::Bytes::from(bytes)))
        };
        let framed = |flag: u8, message: &[u8], extra: &[u8]| {
            let mut bytes = vec![flag];
            bytes.extend_from_slice(&(message.len() as u32).to_be_bytes());
            bytes.extend_from_slice(message);
            bytes.extend_from_slice(extra);
            bytes
        };
        let request = pb::ListRequest {
            name_prefix: "miles".into(),
            ..Default::default()
        };
        let message = request.encode_to_vec();
        let decoded: pb::ListRequest = unary_message(body(framed(0, &message, b"")), 1024)
            .await
            .expect("one message");
        assert_eq!(decoded, request);
        let refused = [
            (
                framed(1, &message, b""),
                1024,
                tonic::Code::Unimplemented,
                "compressed",
            ),
            (
                framed(0, &message, b"\0"),
                1024,
                tonic::Code::Internal,
                "bytes after it",
            ),
            (
                message[..3].to_vec(),
                1024,
                tonic::Code::Internal,
                "no whole header",
            ),
            (
                framed(0, &message, b""),
                4,
                tonic::Code::OutOfRange,
                "over the limit",
            ),
        ];
        for (bytes, limit, code, case) in refused {
            let status = unary_message::<pb::ListRequest>(body(bytes), limit)
                .await
                .expect_err(case);
            assert_eq!(status.code(), code, "{case}: {status}");
            // Each with a reason a client decides on, as every other answer.
            let reason = proto::reason::of(&status).map(|details| details.reason);
            let expected = if code == tonic::Code::OutOfRange {
                proto::reason::Reason::Quota
            } else {
                proto::reason::Reason::Invalid
            };
            assert_eq!(reason, Some(expected), "{case}: {status}");
        }
    }

    #[test]
    fn a_shared_event_goes_on_the_wire_as_the_generated_message_would() {
        let resource = Fixture::new().artist("wire");
        for operation in [
            Operation::Upsert(resource.clone()),
            Operation::Delete(resource),
            Operation::EndOfSnapshot,
        ] {
            let event = SharedEvent::new(WatchEvent {
                version: "42".into(),
                operation,
                actor: "someone".into(),
            });
            let expected = super::super::read::pb_event(&event);
            let wire = super::super::read::wire_event(&event);
            assert_eq!(wire, expected.encode_to_vec());
            assert_eq!(pb::WatchEvent::decode(wire).expect("decodes"), expected);
        }
    }

    #[tokio::test]
    async fn a_watch_answer_is_the_framed_events_then_their_status() {
        use futures::StreamExt as _;
        use http_body_util::BodyExt as _;

        let small = |name: &str, version: &str| {
            SharedEvent::new(WatchEvent {
                version: version.into(),
                operation: Operation::Upsert(Fixture::new().artist(name)),
                actor: String::new(),
            })
        };
        let mut large_artist = Fixture::new().artist("large");
        large_artist
            .metadata
            .insert("blob".into(), "x".repeat(2 * super::SMALL_EVENT));
        let large = SharedEvent::new(WatchEvent {
            version: "4".into(),
            operation: Operation::Upsert(large_artist),
            actor: String::new(),
        });
        let events = vec![small("a", "1"), small("b", "2"), small("c", "3"), large];
        let expected: Vec<pb::WatchEvent> = events
            .iter()
            .map(|event| super::super::read::pb_event(event))
            .collect();
        let stream: super::SharedEventStream =
            futures::stream::iter(events.into_iter().map(Ok)).boxed();
        let mut body = super::WatchBody::new(stream);
        let mut data = Vec::new();
        let mut frames = 0;
        let mut status = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.expect("a frame");
            frames += 1;
            match frame.into_data() {
                Ok(bytes) => data.extend_from_slice(&bytes),
                Err(frame) => {
                    status = frame
                        .into_trailers()
                        .ok()
                        .and_then(|t| t.get("grpc-status").cloned())
                }
            }
        }
        assert_eq!(status.as_ref().map(|s| s.as_bytes()), Some(&b"0"[..]));
        // The three small events in one frame, the large one's header and payload, the trailers.
        assert_eq!(frames, 4);
        let mut decoded = Vec::new();
        let mut rest = data.as_slice();
        while let Some((header, tail)) = rest.split_first_chunk::<5>() {
            let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
            decoded.push(pb::WatchEvent::decode(&tail[..length]).expect("an event"));
            rest = &tail[length..];
        }
        assert_eq!(decoded, expected);
    }
}
