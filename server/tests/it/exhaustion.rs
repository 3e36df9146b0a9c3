//! The red team's exhaustion attacks (issue: "No stranger and no tenant can exhaust a node"),
//! each against a real process while its resident memory is sampled: stalled bodies without a
//! token, watches a tenant never reads, idle connections from one address, unfinished requests,
//! many lists at once, a flood of requests from one token. Each asserts that the node's RSS
//! stays within [`RSS_ALLOWANCE`] of its size before the attack and that a legitimate client's
//! write and read succeed within a second while the attack runs. Attackers connect from
//! 127.0.0.2 (another address than the legitimate client's 127.0.0.1).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proto::acl::v1 as acl;
use proto::resource::v1::resource_service_client::ResourceServiceClient;
use proto::resource::v1::{
    ListRequest, ReadRequest, Resource, Tenancy, WatchListRequest, watch_event,
};
use tonic::Code;

use crate::acl::{
    artist_in, artist_type_v2, bootstrap, demo_rule, policy, token, with_token, write_as,
};
use crate::process::{Resd, TestCa, free_port};

/// What an attack may add to a node's resident memory.
const RSS_ALLOWANCE: u64 = 256 << 20;
/// Where attackers connect from.
const STRANGER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// A node's resident memory, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024)
}

/// Samples a node's RSS every 50 ms until dropped; remembers the highest.
struct RssWatch {
    idle: u64,
    peak: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl RssWatch {
    fn start(node: &Resd) -> RssWatch {
        let pid = node.pid().expect("running");
        let idle = rss(pid);
        let peak = Arc::new(AtomicU64::new(idle));
        let task = tokio::spawn({
            let peak = peak.clone();
            async move {
                loop {
                    peak.fetch_max(rss(pid), Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        });
        RssWatch { idle, peak, task }
    }

    /// Asserts the node grew by less than [`RSS_ALLOWANCE`] at any time so far.
    fn assert_bounded(&self, attack: &str) {
        let peak = self.peak.load(Ordering::Relaxed);
        let grew = peak.saturating_sub(self.idle);
        assert!(
            grew < RSS_ALLOWANCE,
            "{attack}: RSS grew by {} MiB (idle {} MiB, peak {} MiB), over the {} MiB allowed",
            grew >> 20,
            self.idle >> 20,
            peak >> 20,
            RSS_ALLOWANCE >> 20
        );
        eprintln!(
            "{attack}: RSS idle {} MiB, peak {} MiB (+{} MiB)",
            self.idle >> 20,
            peak >> 20,
            grew >> 20
        );
    }
}

impl Drop for RssWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A secure node with ACLs (TLS, client certificates not required, as by default), its CA, and
/// the management secret.
async fn secure_node(extra_args: &[&str]) -> (Resd, Arc<TestCa>, String, tempfile::TempDir) {
    let data = tempfile::tempdir().expect("temp dir");
    let ca = Arc::new(TestCa::new(1));
    let mut args: Vec<String> = [
        "--node-id",
        "1",
        "--data-dir",
        &data.path().display().to_string(),
        "--api-addr",
        "127.0.0.1:0",
        "--raft-addr",
        "127.0.0.1:0",
        "--bootstrap",
        "--acl-enabled",
    ]
    .iter()
    .map(|arg| arg.to_string())
    .collect();
    args.extend(extra_args.iter().map(|arg| arg.to_string()));
    args.extend(ca.node_flags(1));
    let mut node = Resd::spawn(args);
    node.client_tls = Some(ca.client(Some(("client-test.pem", "client-test-key.pem"))));
    let management = bootstrap(&node).await;
    (node, ca, management, data)
}

/// A legitimate client's write and read, each within a second.
async fn legitimate_client_is_served(node: &Resd, management: &str, round: usize) {
    let started = Instant::now();
    let channel = tokio::time::timeout(Duration::from_secs(1), node.endpoint().connect())
        .await
        .expect("the legitimate client connects within 1 s")
        .expect("connect");
    let name = format!("legitimate-{round}");
    let written = tokio::time::timeout(
        Duration::from_secs(1),
        write_as(&channel, management, artist_in("default", &name)),
    )
    .await
    .expect("the legitimate write answers within 1 s")
    .expect("the legitimate write succeeds");
    tokio::time::timeout(
        Duration::from_secs(1),
        ResourceServiceClient::new(channel).read(with_token(
            ReadRequest {
                id: written.id.clone(),
                ..Default::default()
            },
            Some(management),
        )),
    )
    .await
    .expect("the legitimate read answers within 1 s")
    .expect("the legitimate read succeeds");
    eprintln!("legitimate write and read in {:?}", started.elapsed());
}

/// A TCP connection to `to` from `from`.
async fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(to).await
}

/// A TLS client trusting the test CA, without a certificate of its own, speaking HTTP/2.
fn stranger_tls(ca: &TestCa) -> tokio_rustls::TlsConnector {
    stranger_tls_with(ca, true)
}

/// [`stranger_tls`], asking for HTTP/2 or not.
fn stranger_tls_with(ca: &TestCa, h2: bool) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&ca.read("resd-ca.pem")) {
        roots.add(cert.expect("a CA certificate")).expect("trusted");
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut config = config;
    if h2 {
        config.alpn_protocols = vec![b"h2".to_vec()];
    }
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// A stranger's HTTP/2 connection to `node`'s API over TLS without a client certificate, from
/// [`STRANGER`]; with `zero_window`, it never lets the node send a byte of any answer. The task
/// drives the connection (abort it to close).
async fn stranger_h2<B>(
    node: &Resd,
    ca: &TestCa,
    zero_window: bool,
) -> (
    hyper::client::conn::http2::SendRequest<B>,
    tokio::task::JoinHandle<()>,
)
where
    B: http_body::Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tcp = connect_from(STRANGER, node.api_addr).await.expect("TCP");
    let tls = stranger_tls(ca)
        .connect(
            rustls::pki_types::ServerName::IpAddress(node.api_addr.ip().into()),
            tcp,
        )
        .await
        .expect("TLS without a client certificate");
    let mut builder =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
    if zero_window {
        builder.initial_stream_window_size(0);
    }
    let (sender, connection) = builder
        .handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .expect("HTTP/2");
    let driving = tokio::spawn(async move {
        let _ = connection.await;
    });
    (sender, driving)
}

type StalledBody = http_body_util::StreamBody<
    std::pin::Pin<
        Box<
            dyn futures::Stream<Item = Result<http_body::Frame<bytes::Bytes>, std::io::Error>>
                + Send,
        >,
    >,
>;

/// A gRPC request body that declares a message of `declared` bytes, sends all but the last
/// byte, and never ends.
fn stalled_grpc_body(declared: u32) -> StalledBody {
    use futures::StreamExt as _;
    let mut first = vec![0u8];
    first.extend_from_slice(&declared.to_be_bytes());
    first.resize(declared as usize + 5 - 1, b'x');
    let frames = futures::stream::iter([Ok(http_body::Frame::data(bytes::Bytes::from(first)))])
        .chain(futures::stream::pending());
    http_body_util::StreamBody::new(Box::pin(frames))
}

/// Attack 1: four connections × 200 `Write` streams without a token, each sending all but one
/// byte of a declared 4,000,000-byte message and then stalling. Before: +3 GB in 4.7 s (bodies
/// were buffered before the token was looked at). Now a request without a token may carry
/// 64 KiB; its stream is refused past that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_without_a_token_cannot_make_a_node_buffer_their_bodies() {
    let (node, ca, management, _data) = secure_node(&[]).await;
    let rss = RssWatch::start(&node);
    let mut streams = Vec::new();
    let mut connections = Vec::new();
    for _ in 0..4 {
        let (sender, connection) = stranger_h2::<StalledBody>(&node, &ca, false).await;
        connections.push(connection);
        for _ in 0..200 {
            let mut sender = sender.clone();
            let request = http::Request::post(format!(
                "https://{}/resd.resource.v1.ResourceService/Write",
                node.api_addr
            ))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(stalled_grpc_body(4_000_000))
            .expect("request");
            streams.push(tokio::spawn(async move {
                match sender.ready().await {
                    Ok(()) => sender.send_request(request).await.ok(),
                    Err(_) => None,
                }
            }));
        }
    }
    // The attack runs; the node answers others meanwhile.
    for round in 0..5 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        legitimate_client_is_served(&node, &management, round).await;
    }
    rss.assert_bounded("4 × 200 stalled bodies without a token");
    let mut refused = 0;
    for stream in streams {
        if let Ok(Ok(Some(response))) =
            tokio::time::timeout(Duration::from_millis(100), stream).await
            && response
                .headers()
                .get("grpc-status")
                .is_some_and(|code| code == "8")
        {
            refused += 1;
        }
    }
    assert!(
        refused > 0,
        "the stalled bodies are refused RESOURCE_EXHAUSTED"
    );
    for connection in connections {
        connection.abort();
    }
}

/// A tenant's token: write on namespace `default` only.
async fn tenant(node: &Resd, management: &str) -> String {
    let channel = node.channel().await;
    write_as(
        &channel,
        management,
        policy(
            "tenant",
            vec![demo_rule("default", acl::Access::Write)],
            acl::Access::Unspecified,
        ),
    )
    .await
    .expect("policy");
    let secret = "tenant-secret-0123456789abcdef".to_owned();
    write_as(
        &channel,
        management,
        token("tenant", &secret, &["tenant"], ""),
    )
    .await
    .expect("token");
    secret
}

/// An artist of about `bytes` bytes.
fn large_artist(name: &str, bytes: usize) -> Resource {
    let mut artist = artist_in("default", name);
    artist.data = Some(proto::to_any(&proto::demo::v2::Artist {
        name: name.into(),
        description: "x".repeat(bytes),
        ..Default::default()
    }));
    artist
}

fn watch_default(since_version: &str) -> WatchListRequest {
    WatchListRequest {
        r#type: Some(artist_type_v2()),
        tenancy: Some(Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        }),
        name_prefix: String::new(),
        since_version: since_version.into(),
        ..WatchListRequest::default()
    }
}

/// Attack 2: a tenant writes ten ~4 MiB artists and opens 200 watches on one connection, 100 on
/// as many connections and 50 over HTTP, reading none. Before: 0.56 → 8.9 GB in ~10 s (each watch kept
/// its own snapshot and its own encodings). Now watchers of the same versions share one
/// snapshot, each event goes to the wire uncopied, and past `--max-watches-per-token` a watch
/// is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_grow_a_node_with_watches_it_never_reads() {
    let http: SocketAddr = format!("127.0.0.1:{}", free_port())
        .parse()
        .expect("address");
    let (node, ca, management, _data) = secure_node(&[
        "--max-watches-per-token",
        "350",
        "--http-addr",
        &http.to_string(),
    ])
    .await;
    let secret = tenant(&node, &management).await;
    let channel = node.channel().await;
    for i in 0..10 {
        write_as(
            &channel,
            &secret,
            large_artist(&format!("album-{i}"), 3_900_000),
        )
        .await
        .expect("the tenant's large artist");
    }
    let rss = RssWatch::start(&node);
    let mut unread = Vec::new();
    let shared = node.channel().await;
    for _ in 0..200 {
        let watch = ResourceServiceClient::new(shared.clone())
            .watch_list(with_token(watch_default(""), Some(&secret)))
            .await
            .expect("a watch");
        unread.push(watch.into_inner());
    }
    for _ in 0..100 {
        let own = node.channel().await;
        let watch = ResourceServiceClient::new(own)
            .watch_list(with_token(watch_default(""), Some(&secret)))
            .await
            .expect("a watch");
        unread.push(watch.into_inner());
    }
    // And 50 NDJSON watches over HTTP, never read either.
    let connector = stranger_tls_with(&ca, false);
    let mut unread_http = Vec::new();
    for _ in 0..50 {
        use tokio::io::AsyncWriteExt as _;
        let tcp = tokio::net::TcpStream::connect(http).await.expect("TCP");
        let mut tls = connector
            .connect(
                rustls::pki_types::ServerName::IpAddress(http.ip().into()),
                tcp,
            )
            .await
            .expect("TLS");
        tls.write_all(
            format!(
                "GET /v1/resources/demo/v2/Artist?namespace=default&watch=true HTTP/1.1\r\nHost: x\r\nX-Resd-Token: {secret}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .expect("request");
        // The answer's head, so the watch is open before the next; its events stay unread.
        let mut head = [0u8; 12];
        tokio::io::AsyncReadExt::read_exact(&mut tls, &mut head)
            .await
            .expect("the answer's head");
        assert_eq!(&head, b"HTTP/1.1 200", "the HTTP watch opens");
        unread_http.push(tls);
    }
    let refused = ResourceServiceClient::new(shared.clone())
        .watch_list(with_token(watch_default(""), Some(&secret)))
        .await
        .expect_err("past --max-watches-per-token");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("--max-watches-per-token"),
        "{refused:?}"
    );
    for round in 0..5 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        legitimate_client_is_served(&node, &management, round).await;
    }
    rss.assert_bounded("350 unread watches (gRPC and HTTP) of 40 MB each");
    drop(unread);
    drop(unread_http);
}

/// A watcher that stops reading while changes wait for it is ended (after
/// `--watch-stall-seconds`) with the version to resume from, and resuming from it misses
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_watcher_is_ended_and_resumes_from_the_version_it_was_given() {
    let (node, _ca, management, _data) = secure_node(&["--watch-stall-seconds", "2"]).await;
    let channel = node.channel().await;
    let mut watch = ResourceServiceClient::new(channel.clone())
        .watch_list(with_token(watch_default(""), Some(&management)))
        .await
        .expect("a watch")
        .into_inner();
    let end = watch
        .message()
        .await
        .expect("ok")
        .expect("the snapshot's end");
    assert!(matches!(
        end.event,
        Some(watch_event::Event::EndOfSnapshot(_))
    ));
    // More than the client's and the connection's windows hold: the server's sends stall. (The
    // writes go on another connection: this one's window is the watch's.)
    let writer = node.channel().await;
    let mut written = std::collections::BTreeSet::new();
    for i in 0..120 {
        let stored = write_as(
            &writer,
            &management,
            large_artist(&format!("change-{i}"), 200_000),
        )
        .await
        .expect("a change");
        written.insert(stored.version);
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut seen = std::collections::BTreeSet::new();
    let resume_from = loop {
        match tokio::time::timeout(Duration::from_secs(10), watch.message()).await {
            Ok(Ok(Some(event))) => {
                seen.insert(event.version);
            }
            Ok(Err(status)) => {
                assert_eq!(status.code(), Code::Aborted, "{status:?}");
                let version = status
                    .message()
                    .split("since_version=")
                    .nth(1)
                    .and_then(|rest| rest.split_whitespace().next())
                    .expect("the version to resume from")
                    .to_owned();
                break version;
            }
            other => panic!("expected the stalled watch to end with ABORTED, got {other:?}"),
        }
    };
    assert!(
        !written.iter().all(|version| seen.contains(version)),
        "the watch was ended before it sent every change"
    );
    let mut resumed = ResourceServiceClient::new(writer.clone())
        .watch_list(with_token(watch_default(&resume_from), Some(&management)))
        .await
        .expect("resume")
        .into_inner();
    // (The demo controllers write statuses too: the watch sees more versions than were written.)
    for _ in 0..10_000 {
        let event = tokio::time::timeout(Duration::from_secs(10), resumed.message())
            .await
            .expect("the resumed watch goes on")
            .expect("ok")
            .expect("an event");
        let is_end = matches!(event.event, Some(watch_event::Event::EndOfSnapshot(_)));
        if !is_end {
            seen.insert(event.version);
        }
        if written.iter().all(|version| seen.contains(version)) {
            break;
        }
    }
    let missed: Vec<_> = written.difference(&seen).collect();

    assert!(missed.is_empty(), "missed after resuming: {missed:?}");
}

/// Attack 3: 385 idle TCP connections (no byte sent) from one address to the TLS API port.
/// Before: resctl failed 9 of 10 tries over 40 s (a global cap of 256 handshakes, 10 s each).
/// Now one address may hold 16 handshakes; past that its connections are closed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_from_one_address_do_not_lock_out_other_clients() {
    let (node, _ca, management, _data) = secure_node(&[]).await;
    let rss = RssWatch::start(&node);
    let mut idle = Vec::new();
    for _ in 0..385 {
        if let Ok(stream) = connect_from(STRANGER, node.api_addr).await {
            idle.push(stream);
        }
    }
    for round in 0..10 {
        legitimate_client_is_served(&node, &management, round).await;
    }
    rss.assert_bounded("385 idle connections");
    drop(idle);
}

/// Attack 3 from many addresses: 16 idle connections (the most one address may have in its
/// handshake) from each of 40 loopback addresses, 640 in all, more than the port's 256
/// handshakes. The oldest handshake makes room for each new connection: a client (or a member,
/// on the raft port) that finishes its handshake in milliseconds is served within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_from_many_addresses_do_not_lock_out_other_clients() {
    let (node, _ca, management, _data) = secure_node(&[]).await;
    let mut idle = Vec::new();
    for address in 10..50u8 {
        for _ in 0..16 {
            if let Ok(stream) =
                connect_from(IpAddr::V4(Ipv4Addr::new(127, 0, 1, address)), node.api_addr).await
            {
                idle.push(stream);
            }
        }
    }
    assert!(idle.len() > 256, "{} idle connections", idle.len());
    for round in 0..5 {
        legitimate_client_is_served(&node, &management, round).await;
    }
    drop(idle);
}

/// Attack 4: 300 HTTP requests whose headers never end and 300 whose bodies stop one byte
/// short, all from one address. Before: held for as long as the client liked. Now headers must
/// arrive within 10 s and bodies within 10 s of them; the node serves others meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_http_requests_are_ended_and_do_not_starve_others() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let http: SocketAddr = format!("127.0.0.1:{}", free_port())
        .parse()
        .expect("address");
    let (node, _ca, management, _data) = secure_node(&["--http-addr", &http.to_string()]).await;
    // The slow writer is a tenant: the legitimate client is another caller.
    let secret = tenant(&node, &management).await;
    let rss = RssWatch::start(&node);
    // Plain TCP to a TLS port gets nowhere; the slow requests need TLS first.
    let connector = stranger_tls_with(&_ca, false);
    let mut slow = Vec::new();
    for i in 0..600 {
        let Ok(tcp) = connect_from(STRANGER, http).await else {
            continue;
        };
        let Ok(mut tls) = connector
            .connect(
                rustls::pki_types::ServerName::IpAddress(http.ip().into()),
                tcp,
            )
            .await
        else {
            continue;
        };
        let request = if i % 2 == 0 {
            "GET /v1/types HTTP/1.1\r\nHost: x\r\nX-Slow: ".to_owned()
        } else {
            format!(
                "PUT /v1/resources/demo/v2/Artist/slow-{i}?namespace=default HTTP/1.1\r\nHost: x\r\nX-Resd-Token: {secret}\r\nContent-Type: application/json\r\nContent-Length: 4000000\r\n\r\n{{\"data\": \"{}",
                "x".repeat(64 * 1024)
            )
        };
        if tls.write_all(request.as_bytes()).await.is_ok() {
            slow.push(tls);
        }
    }
    assert!(!slow.is_empty(), "the attack got connections");
    for round in 0..4 {
        legitimate_client_is_served(&node, &management, round).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    rss.assert_bounded("600 unfinished HTTP requests");
    // Past the timeouts every unfinished request has been answered or closed.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let mut still_open = 0;
    for mut tls in slow {
        let mut buffer = vec![0u8; 4096];
        match tokio::time::timeout(Duration::from_millis(200), tls.read(&mut buffer)).await {
            // An answer (408) or the end of the connection.
            Ok(_) => {}
            Err(_) => still_open += 1,
        }
    }
    assert_eq!(
        still_open, 0,
        "unfinished requests still held past their timeouts"
    );
}

/// Attack 6: forty Lists at once of a type holding ~40 MB. Before: +1.3 GB at once. Now the
/// lists being answered hold at most `--max-inflight-bytes`; past it a List is refused
/// RESOURCE_EXHAUSTED saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_large_lists_at_once_are_bounded_by_bytes_in_flight() {
    let (node, _ca, management, _data) = secure_node(&["--max-inflight-bytes", "67108864"]).await;
    let channel = node.channel().await;
    for i in 0..10 {
        write_as(
            &channel,
            &management,
            large_artist(&format!("big-{i}"), 3_900_000),
        )
        .await
        .expect("a large artist");
    }
    // The lists are a tenant's: the legitimate client is another caller.
    let secret = tenant(&node, &management).await;
    let rss = RssWatch::start(&node);
    let mut lists = Vec::new();
    for _ in 0..40 {
        let channel = node.channel().await;
        let secret = secret.clone();
        lists.push(tokio::spawn(async move {
            ResourceServiceClient::new(channel)
                .max_decoding_message_size(usize::MAX)
                .list(with_token(
                    ListRequest {
                        r#type: Some(artist_type_v2()),
                        tenancy: Some(Tenancy {
                            partition: "default".into(),
                            namespace: "default".into(),
                        }),
                        name_prefix: String::new(),
                        ..ListRequest::default()
                    },
                    Some(&secret),
                ))
                .await
                .map(|reply| reply.into_inner().resources.len())
        }));
    }
    legitimate_client_is_served(&node, &management, 0).await;
    let (mut answered, mut refused) = (0, 0);
    for list in lists {
        match list.await.expect("joined") {
            Ok(count) => {
                assert!(count >= 10, "{count}");
                answered += 1;
            }
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert!(
                    status.message().contains("--max-inflight-bytes"),
                    "{status:?}"
                );
                refused += 1;
            }
        }
    }
    eprintln!("{answered} lists answered, {refused} refused");
    assert!(answered > 0, "some lists are answered");
    rss.assert_bounded("40 lists of 40 MB at once");
}

/// Attack 4b/issue item 4: one token floods the node; past its rate it is refused with when to
/// retry, and another token is served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_past_its_rate_is_refused_and_others_are_served() {
    let (node, _ca, management, _data) =
        secure_node(&["--max-requests-per-second-per-token", "50"]).await;
    let secret = tenant(&node, &management).await;
    let channel = node.channel().await;
    let mut refused = None;
    for i in 0..400 {
        let read = ResourceServiceClient::new(channel.clone())
            .read(with_token(
                ReadRequest {
                    id: artist_in("default", &format!("absent-{i}")).id,
                    ..Default::default()
                },
                Some(&secret),
            ))
            .await;
        if let Err(status) = read
            && status.code() == Code::ResourceExhausted
        {
            refused = Some(status);
            break;
        }
    }
    let refused = refused.expect("the flood is refused");
    assert!(
        refused.message().contains("per second") && refused.message().contains("retry in"),
        "{refused:?}"
    );
    legitimate_client_is_served(&node, &management, 0).await;
}

/// CPU seconds a process has used (user and system).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<f64>().ok()))
        .sum();
    ticks / 100.0
}

/// Attack 4, the descriptor half: with its descriptor limit lowered, a node whose descriptors
/// are all taken by a stranger's connections used to spin ~60 % of a core on accept errors,
/// logged only at debug. Now the accept loop backs off (said once, at warn), and serves again
/// as soon as descriptors are free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_out_of_descriptors_backs_off_and_serves_again() {
    use proto::resource::v1::WriteRequest;
    let node = Resd::start_with_descriptor_limit(128);
    let pid = node.pid().expect("running");
    let mut held = Vec::new();
    for _ in 0..200 {
        match tokio::time::timeout(
            Duration::from_millis(500),
            connect_from(STRANGER, node.api_addr),
        )
        .await
        {
            Ok(Ok(stream)) => held.push(stream),
            _ => break,
        }
    }
    // The kernel completes connections the node cannot accept: past its limit they wait in
    // the backlog while accept fails.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = cpu_seconds(pid);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let used = cpu_seconds(pid) - before;
    assert!(
        used < 0.6,
        "the node used {used:.2} CPU seconds in 3 s while out of descriptors (a spinning accept loop)"
    );
    drop(held);
    let mut client = ResourceServiceClient::new(
        tokio::time::timeout(Duration::from_secs(5), node.endpoint().connect())
            .await
            .expect("the node accepts again within 5 s of descriptors being freed")
            .expect("connect"),
    );
    client
        .write(WriteRequest {
            resource: Some(crate::support::artist("after-the-flood")),
        })
        .await
        .expect("served again");
}

/// The reviewer's attack on answers: a tenant asks for a 4 MiB resource 300 times over
/// connections whose HTTP/2 windows are zero, so no answer ever leaves. Each answer counts
/// against its caller until sent: past the caller's share the reads are refused, and the node
/// holds no more than that share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_nobody_reads_are_bounded_by_their_callers_share() {
    use prost::Message as _;
    let (node, ca, management, _data) = secure_node(&[]).await;
    let secret = tenant(&node, &management).await;
    let channel = node.channel().await;
    let big = write_as(&channel, &secret, large_artist("big", 3_900_000))
        .await
        .expect("a large artist");
    let rss = RssWatch::start(&node);
    let mut message = vec![0u8; 5];
    ReadRequest {
        id: big.id.clone(),
        ..Default::default()
    }
    .encode(&mut message)
    .expect("encode");
    let length = u32::try_from(message.len() - 5).expect("small");
    message[1..5].copy_from_slice(&length.to_be_bytes());
    let message = bytes::Bytes::from(message);
    let mut answers = Vec::new();
    let mut connections = Vec::new();
    for _ in 0..2 {
        let (sender, connection) =
            stranger_h2::<http_body_util::Full<bytes::Bytes>>(&node, &ca, true).await;
        connections.push(connection);
        for _ in 0..150 {
            let mut sender = sender.clone();
            let request = http::Request::post(format!(
                "https://{}/resd.resource.v1.ResourceService/Read",
                node.api_addr
            ))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("x-resd-token", &secret)
            .body(http_body_util::Full::new(message.clone()))
            .expect("request");
            answers.push(tokio::spawn(async move {
                sender.ready().await.ok()?;
                sender.send_request(request).await.ok()
            }));
        }
    }
    let (mut held, mut refused) = (0, 0);
    for answer in answers {
        match tokio::time::timeout(Duration::from_secs(10), answer).await {
            Ok(Ok(Some(response))) => match response.headers().get("grpc-status") {
                Some(code) if code == "8" => refused += 1,
                Some(code) => panic!("unexpected status {code:?}"),
                // An answer on its way, that will never arrive.
                None => {
                    held += 1;
                    std::mem::forget(response);
                }
            },
            other => panic!("no answer: {other:?}"),
        }
    }
    eprintln!("{held} answers held, {refused} refused");
    assert!(refused > 0, "past the caller's share answers are refused");
    legitimate_client_is_served(&node, &management, 0).await;
    rss.assert_bounded("300 reads of 4 MiB never read");
    for connection in connections {
        connection.abort();
    }
}

/// The reviewer's idle connections: a stranger finishes TLS and then sends nothing (no HTTP/2
/// preface), or connects and sends nothing at all. Such connections used to stay open as long
/// as the stranger liked (each taking a place of its address and of the port); now a
/// connection that sends nothing within 10 s is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_send_nothing_are_closed() {
    use tokio::io::AsyncReadExt as _;
    let (node, ca, _management, _data) = secure_node(&[]).await;
    let connector = stranger_tls(&ca);
    let mut silent = Vec::new();
    for _ in 0..10 {
        let tcp = connect_from(STRANGER, node.api_addr).await.expect("TCP");
        let tls = connector
            .connect(
                rustls::pki_types::ServerName::IpAddress(node.api_addr.ip().into()),
                tcp,
            )
            .await
            .expect("TLS");
        silent.push(tls);
    }
    tokio::time::sleep(Duration::from_secs(12)).await;
    for mut tls in silent {
        // Whatever the node sent (its HTTP/2 settings), then the end.
        let mut sink = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(2), tls.read_to_end(&mut sink)).await;
        assert!(
            matches!(read, Ok(Ok(_)) | Ok(Err(_))),
            "a silent connection is still open after {} bytes",
            sink.len()
        );
    }
}
