//! Answers written from encodings, without decoding and re-encoding per caller.
//!
//! - `ResourceService/Read` and `ResourceService/List`: the stored encodings go to the wire as
//!   they are. A `ReadResponse` is `Resource resource = 1` and a `ListResponse` is `repeated
//!   Resource resources = 1`, so their encodings are each resource's bytes behind a field tag
//!   and a length; the answer is the same bytes the generated handler would send.
//! - `ResourceService/WatchList`: each event is encoded once, by the first watcher to send it,
//!   and the bytes are shared with every other watcher of the change ([`SharedEvent::wire`]).
//!
//! [`ResourceApi`] routes these three here and every other method to the generated server.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use proto::resource::v1::resource_service_server::ResourceServiceServer;
use proto::resource::v1::{ListRequest, ReadRequest, WatchListRequest};
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::{Request, Response, Status};

use super::grpc::{ResourceGrpc, SharedEventStream};
use super::read::{EncodedList, RESOURCE_TAG};
use crate::storage::SharedEvent;

/// A resource as stored.
#[derive(Debug, Default)]
pub struct EncodedRead(pub Vec<u8>);

/// An answer that writes its own encoding: the same bytes prost would write for the message
/// it stands for.
trait WireAnswer: Send + 'static {
    /// How many bytes [`WireAnswer::write`] will write, if known (room is made for them at
    /// once), else 0.
    fn encoded_len(&self) -> usize {
        0
    }

    fn write<B: bytes::BufMut>(self, dst: &mut B);
}

impl WireAnswer for EncodedRead {
    /// As a `ReadResponse`.
    fn write<B: bytes::BufMut>(self, dst: &mut B) {
        dst.put_u8(RESOURCE_TAG);
        prost::encoding::encode_varint(self.0.len() as u64, dst);
        dst.put_slice(&self.0);
    }
}

impl WireAnswer for EncodedList {
    fn encoded_len(&self) -> usize {
        EncodedList::encoded_len(self)
    }

    /// Framed already (each resource is one `resources` element): one copy.
    fn write<B: bytes::BufMut>(self, dst: &mut B) {
        for chunk in self.chunks() {
            dst.put_slice(chunk);
        }
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
        dst.reserve(item.encoded_len());
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

/// The List handler over [`ResourceGrpc::list_encoded`].
struct ListEncoded(ResourceGrpc);

impl tonic::server::UnaryService<ListRequest> for ListEncoded {
    type Response = EncodedList;
    type Future = Pin<Box<dyn Future<Output = Result<Response<EncodedList>, Status>> + Send>>;

    fn call(&mut self, request: Request<ListRequest>) -> Self::Future {
        let grpc = self.0.clone();
        Box::pin(async move { grpc.list_encoded(request).await })
    }
}

/// The WatchList handler over [`ResourceGrpc::watch_shared`].
struct WatchShared(ResourceGrpc);

impl tonic::server::ServerStreamingService<WatchListRequest> for WatchShared {
    type Response = SharedEvent;
    type ResponseStream = SharedEventStream;
    type Future = Pin<Box<dyn Future<Output = Result<Response<SharedEventStream>, Status>> + Send>>;

    fn call(&mut self, request: Request<WatchListRequest>) -> Self::Future {
        let grpc = self.0.clone();
        Box::pin(async move { grpc.watch_shared(request).await })
    }
}

/// `resd.resource.v1.ResourceService`: Read, List and WatchList through [`WireCodec`], the
/// rest through the generated server.
#[derive(Debug, Clone)]
pub struct ResourceApi {
    grpc: ResourceGrpc,
    generated: ResourceServiceServer<ResourceGrpc>,
    max_decoding: usize,
}

impl ResourceApi {
    pub fn new(grpc: ResourceGrpc, max_decoding: usize) -> Self {
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
                let handler = ListEncoded(self.grpc.clone());
                Box::pin(async move { Ok(wire_grpc(max).unary(handler, request).await) })
            }
            "/resd.resource.v1.ResourceService/WatchList" => {
                let handler = WatchShared(self.grpc.clone());
                Box::pin(async move { Ok(wire_grpc(max).server_streaming(handler, request).await) })
            }
            _ => {
                let mut generated = self.generated.clone();
                Box::pin(async move { tower::Service::call(&mut generated, request).await })
            }
        }
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

    #[test]
    fn a_stored_resource_goes_on_the_wire_as_the_generated_read_and_list_answers_would() {
        use super::{EncodedList, EncodedRead, WireAnswer};
        let resource = Fixture::new().artist("wire");
        let stored = resource.encode_to_vec();
        let mut read = Vec::new();
        EncodedRead(stored.clone()).write(&mut read);
        let expected = pb::ReadResponse {
            resource: Some(resource.clone()),
        };
        assert_eq!(read, expected.encode_to_vec());
        let mut list = Vec::new();
        let mut encoded = EncodedList::default();
        encoded.push(&stored);
        encoded.push(&stored);
        assert_eq!(encoded.len(), 2);
        encoded.write(&mut list);
        let expected = pb::ListResponse {
            resources: vec![resource.clone(), resource],
        };
        assert_eq!(list, expected.encode_to_vec());
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
}
