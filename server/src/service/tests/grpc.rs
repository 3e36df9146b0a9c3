//! The gRPC handlers: metadata (token, consistency) and the error mapping.

use std::sync::Arc;

use proto::resource::v1::resource_service_server::ResourceService as _;
use tonic::{Code, Request};

use super::*;
use crate::acl::{AclsDisabled, KeyRules, StaticTokens, TokenResolver};
use crate::service::grpc::{CONSISTENCY_HEADER, ResourceGrpc, TOKEN_HEADER};

async fn grpc(tokens: Arc<dyn TokenResolver>) -> ResourceGrpc {
    let h = harness().await;
    ResourceGrpc::new(h.service, tokens)
}

fn read_request(metadata: &[(&'static str, &str)]) -> Request<ReadRequest> {
    let mut request = Request::new(ReadRequest {
        id: Some(id("tenancy.v1.Partition", default_ns(), "default")),
        ..Default::default()
    });
    for (key, value) in metadata {
        request
            .metadata_mut()
            .insert(*key, value.parse().expect("ascii metadata"));
    }
    request
}

#[tokio::test]
async fn a_request_without_a_token_is_unauthenticated_when_acls_are_on() {
    let tokens = StaticTokens::new().with_token(
        "operator",
        KeyRules::default()
            .operator(crate::acl::Access::Write)
            .key_prefix("resource/", crate::acl::Access::Write),
    );
    let grpc = grpc(Arc::new(tokens)).await;
    let status = grpc.read(read_request(&[])).await.expect_err("no token");
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(
        status.message().contains(TOKEN_HEADER),
        "{}",
        status.message()
    );
    let status = grpc
        .read(read_request(&[(TOKEN_HEADER, "wrong")]))
        .await
        .expect_err("unknown token");
    assert_eq!(status.code(), Code::Unauthenticated);
    grpc.read(read_request(&[(TOKEN_HEADER, "operator")]))
        .await
        .expect("known token");
}

#[tokio::test]
async fn a_request_without_a_token_is_allowed_when_acls_are_off() {
    let grpc = grpc(Arc::new(AclsDisabled)).await;
    grpc.read(read_request(&[])).await.expect("ACLs off");
}

#[tokio::test]
async fn the_consistency_header_accepts_consistent_and_rejects_unknown_modes() {
    let grpc = grpc(Arc::new(AclsDisabled)).await;
    grpc.read(read_request(&[(CONSISTENCY_HEADER, "consistent")]))
        .await
        .expect("consistent read");
    let status = grpc
        .read(read_request(&[(CONSISTENCY_HEADER, "linearizable-please")]))
        .await
        .expect_err("unknown mode");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains(CONSISTENCY_HEADER),
        "{}",
        status.message()
    );
}

#[test]
fn every_error_maps_to_its_grpc_code() {
    let cases = [
        (Error::InvalidArgument("x".into()), Code::InvalidArgument),
        (Error::NotFound("x".into()), Code::NotFound),
        (Error::CasFailed("x".into()), Code::Aborted),
        (Error::UidMismatch("x".into()), Code::FailedPrecondition),
        (Error::PermissionDenied("x".into()), Code::PermissionDenied),
        (Error::Unauthenticated("x".into()), Code::Unauthenticated),
        (Error::Unavailable("x".into()), Code::Unavailable),
        (Error::Aborted("x".into()), Code::Aborted),
        (Error::OutOfRange("x".into()), Code::OutOfRange),
        (Error::Internal("x".into()), Code::Internal),
    ];
    for (error, code) in cases {
        assert_eq!(tonic::Status::from(error.clone()).code(), code, "{error:?}");
    }
}

#[test]
fn storage_errors_map_to_the_codes_of_the_contract() {
    let cases = [
        (StorageError::NotFound, Code::NotFound),
        (StorageError::CasFailure, Code::Aborted),
        (StorageError::WrongUid, Code::FailedPrecondition),
        (
            StorageError::Inconsistent("no leader".into()),
            Code::Unavailable,
        ),
        (StorageError::WatchClosed("behind".into()), Code::Aborted),
        (
            StorageError::ResumeUnavailable("old".into()),
            Code::OutOfRange,
        ),
        (StorageError::Internal("disk".into()), Code::Internal),
    ];
    for (error, code) in cases {
        assert_eq!(
            tonic::Status::from(Error::from(error.clone())).code(),
            code,
            "{error:?}"
        );
    }
    let cas = tonic::Status::from(Error::from(StorageError::CasFailure));
    assert!(
        cas.message().starts_with("CAS operation failed"),
        "{}",
        cas.message()
    );
    let uid = tonic::Status::from(Error::from(StorageError::WrongUid));
    assert!(
        uid.message().starts_with("uid doesn't match"),
        "{}",
        uid.message()
    );
}

/// A connection that counts the writes it is asked to make.
struct CountingIo {
    io: tokio::net::TcpStream,
    writes: Arc<std::sync::atomic::AtomicUsize>,
}

impl tonic::transport::server::Connected for CountingIo {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl tokio::io::AsyncRead for CountingIo {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for CountingIo {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        true
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Serves `service` as the resource API (ACLs off, requests up to `max_decoding` bytes) on a
/// free loopback port, each accepted connection wrapped by `wrap` and then gathered
/// ([`crate::tls::Coalesced`]), as the agent serves it.
async fn serve_api<IO>(
    service: Arc<ResourceService>,
    max_decoding: usize,
    wrap: impl Fn(tokio::net::TcpStream) -> IO + Send + 'static,
) -> (
    std::net::SocketAddr,
    tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
)
where
    IO: tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + tonic::transport::server::Connected
        + Unpin
        + Send
        + 'static,
{
    use futures::StreamExt;
    let api = crate::service::encoded::ResourceApi::new(
        ResourceGrpc::new(service, Arc::new(AclsDisabled)),
        max_decoding,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(move |accepted| {
        accepted.map(|io| {
            io.set_nodelay(true).expect("nodelay");
            crate::tls::Coalesced::new(wrap(io))
        })
    });
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(api)
            .serve_with_incoming(incoming),
    );
    (addr, server)
}

/// Through a real tonic server and client: a Read answer (headers, data over 256 bytes, trailers)
/// leaves a gathered connection in one write, and carries the stored resource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_answer_is_one_write_on_a_gathered_connection() {
    use proto::resource::v1::resource_service_client::ResourceServiceClient;
    let h = harness().await;
    let mut artist = artist("miles");
    artist.metadata.insert("note".into(), "x".repeat(600));
    let stored = h.write(artist).await.expect("artist");
    let writes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (addr, server) = {
        let writes = writes.clone();
        serve_api(h.service, 4 << 20, move |io| CountingIo {
            io,
            writes: writes.clone(),
        })
        .await
    };
    let mut client = ResourceServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let read = || ReadRequest {
        id: Some(id_of(&stored)),
        ..Default::default()
    };
    // The connection's opening (settings, acknowledgements) is not what is measured.
    let first = client.read(read()).await.expect("read").into_inner();
    assert_eq!(first.resource.as_ref(), Some(&stored));
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let before = writes.load(Ordering::SeqCst);
    const READS: usize = 20;
    for _ in 0..READS {
        let answer = client.read(read()).await.expect("read").into_inner();
        assert_eq!(answer.resource.as_ref(), Some(&stored));
    }
    let made = writes.load(Ordering::SeqCst) - before;
    assert_eq!(made, READS, "one write per answer");
    server.abort();
}

/// Through a real tonic server and client: a List answer of several chunks (a few MiB) is the
/// list the service holds, in order; a bad request and an oversized one answer with tonic's
/// statuses; metadata in (the consistency header) is honoured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_list_goes_out_in_chunks_and_arrives_whole() {
    use proto::resource::v1::resource_service_client::ResourceServiceClient;
    let h = harness().await;
    for i in 0..2_500 {
        let mut artist = artist(&format!("artist-{i:05}"));
        artist.metadata.insert("note".into(), "x".repeat(1_000));
        h.write(artist).await.expect("artist");
    }
    let expected = h
        .list("demo.v2.Artist", tenancy("default", "default"), "")
        .await
        .expect("list");
    assert_eq!(expected.len(), 2_500);
    let (addr, server) = serve_api(h.service, 1 << 10, |io| io).await;
    let mut client = ResourceServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect")
        .max_decoding_message_size(64 << 20);
    let list = |name_prefix: &str| ListRequest {
        r#type: Some(resource::parse_gvk("demo.v2.Artist").expect("gvk")),
        tenancy: Some(tenancy("default", "default")),
        name_prefix: name_prefix.into(),
        ..ListRequest::default()
    };
    let mut request = Request::new(list(""));
    request
        .metadata_mut()
        .insert(CONSISTENCY_HEADER, "consistent".parse().expect("ascii"));
    let answer = client.list(request).await.expect("list").into_inner();
    assert!(answer.resources == expected, "the whole list, in order");
    let some = client
        .list(list("artist-001"))
        .await
        .expect("list")
        .into_inner();
    assert_eq!(some.resources.len(), 100);
    // No type: the service's InvalidArgument, as a status.
    let status = client
        .list(ListRequest::default())
        .await
        .expect_err("no type");
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    // Over the server's 1 KiB limit on requests.
    let status = client
        .list(list(&"a".repeat(2_000)))
        .await
        .expect_err("too large");
    assert_eq!(status.code(), Code::OutOfRange, "{status}");
    assert!(status.message().contains("limit"), "{status}");
    server.abort();
}
