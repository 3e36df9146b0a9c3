//! The HTTP server of real `resd` processes (DESIGN §13): `/metrics` parses as Prometheus text,
//! has every family DESIGN names, and moves (writes count, a leader kill counts); `/readyz`
//! says 503 for a node that is not a voter or was removed; the resource API over HTTP+JSON
//! (create, read, CAS conflict, NDJSON watch and resume, permission denied); JSON log lines.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

type Http = HttpClient<HttpConnector, Full<Bytes>>;

fn http() -> Http {
    HttpClient::builder(TokioExecutor::new()).build_http()
}

fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> http::Request<Full<Bytes>> {
    let mut builder = http::Request::builder().method(method).uri(url);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder
        .body(Full::new(Bytes::from(body.unwrap_or_default().to_owned())))
        .expect("request")
}

/// The CA each HTTPS authority (`host:port`) is trusted with, registered by the test that
/// started it ([`trust`]).
static TRUSTED: std::sync::Mutex<BTreeMap<String, std::path::PathBuf>> =
    std::sync::Mutex::new(BTreeMap::new());

/// Trusts the CA of `cluster` for its nodes' HTTPS servers.
fn trust(cluster: &tests::Cluster) {
    let tls = cluster.tls.as_ref().expect("a TLS cluster");
    let mut trusted = TRUSTED.lock().unwrap_or_else(|p| p.into_inner());
    for node in &cluster.nodes {
        if let Some(addr) = &node.http_addr {
            trusted.insert(addr.clone(), tls.ca());
        }
    }
}

/// Sends `request` over HTTPS to a trusted authority (one connection, HTTP/1.1).
async fn send_tls(
    request: http::Request<Full<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, String> {
    use rustls::pki_types::pem::PemObject;
    let authority = request.uri().authority().expect("an authority").to_string();
    let ca = TRUSTED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&authority)
        .cloned()
        .ok_or_else(|| format!("no CA is trusted for {authority}"))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(&ca).map_err(|e| e.to_string())? {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let host = request.uri().host().expect("a host").to_owned();
    let tcp = tokio::net::TcpStream::connect(&authority)
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from(host).map_err(|e| e.to_string())?;
    let stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())
}

/// One request, its status and whole body (bounded in time).
async fn call(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, String) {
    let answer = tokio::time::timeout(Duration::from_secs(20), async {
        let mut request = request(method, url, headers, body);
        let response = if url.starts_with("https://") {
            let authority = request.uri().authority().map(ToString::to_string);
            if let Some(authority) = authority {
                request.headers_mut().insert(
                    http::header::HOST,
                    authority.parse().expect("a host header"),
                );
            }
            send_tls(request).await
        } else {
            http()
                .request(request)
                .await
                .map_err(|error| error.to_string())
        }
        .unwrap_or_else(|error| panic!("{method} {url}: {error}"));
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    })
    .await;
    answer.unwrap_or_else(|_| panic!("{method} {url} did not answer within 20 s"))
}

async fn call_json(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, serde_json::Value) {
    let (status, text) = call(method, url, headers, body).await;
    let value = serde_json::from_str(&text)
        .unwrap_or_else(|error| panic!("{method} {url} answered non-JSON ({error}): {text}"));
    (status, value)
}

/// The NDJSON lines of a streaming response, as they arrive.
struct Lines {
    body: hyper::body::Incoming,
    buffer: String,
}

impl Lines {
    async fn open(url: &str) -> Lines {
        let response = http()
            .request(request("GET", url, &[], None))
            .await
            .expect("watch");
        assert_eq!(response.status().as_u16(), 200, "watch {url}");
        Lines {
            body: response.into_body(),
            buffer: String::new(),
        }
    }

    /// The next line as JSON, waiting at most 20 s.
    async fn next(&mut self) -> serde_json::Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(at) = self.buffer.find('\n') {
                let line: String = self.buffer.drain(..=at).collect();
                return serde_json::from_str(line.trim()).expect("an NDJSON line");
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame())
                .await
                .expect("a watch line within 20 s")
                .expect("the stream goes on")
                .expect("a frame");
            if let Ok(data) = frame.into_data() {
                self.buffer.push_str(&String::from_utf8_lossy(&data));
            }
        }
    }

    /// Lines until one matching `wanted`, at most `limit` of them.
    async fn until(
        &mut self,
        limit: usize,
        wanted: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        for _ in 0..limit {
            let line = self.next().await;
            if wanted(&line) {
                return line;
            }
        }
        panic!("no wanted line among {limit}");
    }
}

fn upserted_name(line: &serde_json::Value) -> Option<&str> {
    line.pointer("/upsert/resource/id/name")
        .and_then(|name| name.as_str())
}

/// Scrapes `/metrics` and parses it with a Prometheus text parser.
async fn scrape(base: &str, headers: &[(&str, &str)]) -> prometheus_parse::Scrape {
    let (status, text) = call("GET", &format!("{base}/metrics"), headers, None).await;
    assert_eq!(status, 200, "{text}");
    prometheus_parse::Scrape::parse(text.lines().map(|line| Ok(line.to_owned())))
        .expect("/metrics parses as Prometheus text")
}

/// The value of the sample `name` whose labels include `labels` (counters, gauges).
fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|sample| {
            sample.metric == name
                && labels
                    .iter()
                    .all(|(key, wanted)| sample.labels.get(key) == Some(*wanted))
        })
        .and_then(|sample| match &sample.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => Some(*v),
            _ => None,
        })
}

async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what} did not happen within 30 s");
}

fn artist(name: &str) -> String {
    format!("{{\"data\": {{\"name\": \"{name}\"}}}}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_readiness_and_the_resource_api_over_http() {
    let mut cluster = tests::Cluster::with_http(3, false).await;
    let bases: Vec<String> = cluster.nodes.iter().map(tests::Node::http_url).collect();
    for base in &bases {
        let (status, body) = call("GET", &format!("{base}/healthz"), &[], None).await;
        assert_eq!((status, body.as_str()), (200, "ok\n"));
        eventually("the node is ready", || async {
            call("GET", &format!("{base}/readyz"), &[], None).await.0 == 200
        })
        .await;
    }

    // Every family DESIGN §13 names, on the leader (node 1).
    let metrics = scrape(&bases[0], &[]).await;
    let names: std::collections::BTreeSet<&str> =
        metrics.samples.iter().map(|s| s.metric.as_str()).collect();
    for family in [
        "resd_raft_term",
        "resd_raft_is_leader",
        "resd_raft_commit_index",
        "resd_raft_applied_index",
        "resd_raft_leader_changes_total",
        "resd_grpc_requests_total",
        "resd_grpc_request_duration_seconds",
        "resd_raft_batch_entries",
        "resd_storage_sync_duration_seconds",
        "resd_watch_streams",
        "resd_watch_events_sent_total",
        "resd_controller_reconciles_total",
        "resd_controller_queue_depth",
        "resd_resources",
        "resd_lmdb_bytes",
    ] {
        assert!(names.contains(family), "{family} missing; have {names:?}");
    }
    assert_eq!(value(&metrics, "resd_raft_is_leader", &[]), Some(1.0));

    // Writes raise the request counter.
    let writes = |scrape: &prometheus_parse::Scrape| {
        value(
            scrape,
            "resd_grpc_requests_total",
            &[("method", "Write"), ("code", "OK")],
        )
        .unwrap_or(0.0)
    };
    let before = writes(&metrics);
    let client = cluster.client(0);
    let codec = proto::codec::Codec::new(client.list_types().await.expect("types")).expect("codec");
    for index in 0..5 {
        let resource = codec
            .read_yaml(&format!(
                "type: demo.v1.Concept\nname: c{index}\ntenancy: {{partition: default, namespace: default}}\ndata: {{name: c{index}}}\n"
            ))
            .remove(0)
            .expect("document");
        client.write(&resource).await.expect("write");
    }
    let after = writes(&scrape(&bases[0], &[]).await);
    assert!(
        after >= before + 5.0,
        "Write OK went from {before} to {after}"
    );

    // A follower times the appends it serves (they arrive as append-stream messages).
    let follower = scrape(&bases[1], &[]).await;
    let appends = follower
        .samples
        .iter()
        .find(|sample| sample.metric == "resd_raft_append_duration_seconds")
        .and_then(|sample| match &sample.value {
            prometheus_parse::Value::Histogram(buckets) => {
                buckets.iter().map(|bucket| bucket.count).reduce(f64::max)
            }
            _ => None,
        });
    assert!(
        appends.is_some_and(|count| count >= 1.0),
        "appends served by a follower: {appends:?}"
    );

    // The HTTP API on a follower: create, read, a CAS conflict, an NDJSON watch and its resume.
    let artists = format!("{}/v1/resources/demo/v2/Artist", bases[1]);
    // An empty list is a list, not `{}`.
    let (status, empty) = call_json(
        "GET",
        &format!("{artists}?namespace=default&name_prefix=nobody"),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 200, "{empty}");
    assert_eq!(empty, serde_json::json!({"resources": []}));
    let (status, created) = call_json(
        "PUT",
        &format!("{artists}/nina?namespace=default"),
        &[],
        Some(&artist("Nina Simone")),
    )
    .await;
    assert_eq!(status, 200, "{created}");
    let version = created["resource"]["version"]
        .as_str()
        .expect("version")
        .to_owned();
    let (status, read) =
        call_json("GET", &format!("{artists}/nina?consistent=true"), &[], None).await;
    assert_eq!(status, 200, "{read}");
    assert_eq!(read["resource"]["data"]["name"], "Nina Simone");
    assert_eq!(
        read["resource"]["data"]["@type"],
        "type.googleapis.com/resd.demo.v2.Artist"
    );
    let stale = format!("{{\"version\": \"{version}\", \"data\": {{\"name\": \"Eunice\"}}}}");
    // Someone else writes first: the stale CAS is a conflict.
    let (status, _) = call(
        "PUT",
        &format!("{artists}/nina"),
        &[],
        Some(&artist("Nina S.")),
    )
    .await;
    assert_eq!(status, 200);
    let (status, conflict) = call_json("PUT", &format!("{artists}/nina"), &[], Some(&stale)).await;
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(conflict["code"], "ABORTED");
    assert_eq!(
        conflict["reason"], "CAS_CONFLICT",
        "the reason, as data: {conflict}"
    );
    assert!(
        conflict["message"]
            .as_str()
            .is_some_and(|m| m.contains("version")),
        "{conflict}"
    );
    let (status, missing) = call_json("GET", &format!("{artists}/nobody"), &[], None).await;
    assert_eq!((status, missing["code"].as_str()), (404, Some("NOT_FOUND")));
    assert_eq!(missing["reason"], "NOT_FOUND", "{missing}");
    let (status, invalid) = call_json(
        "PUT",
        &format!("{artists}/x"),
        &[],
        Some("{\"data\": {\"genre\": \"POLKA\"}}"),
    )
    .await;
    assert_eq!(
        (status, invalid["code"].as_str()),
        (400, Some("INVALID_ARGUMENT"))
    );

    let mut watch = Lines::open(&format!("{artists}?watch=true")).await;
    let listed = watch
        .until(20, |line| line.get("endOfSnapshot").is_some())
        .await;
    assert!(listed["version"].is_string(), "{listed}");
    call(
        "PUT",
        &format!("{artists}/miriam"),
        &[],
        Some(&artist("Miriam Makeba")),
    )
    .await;
    let event = watch
        .until(20, |line| upserted_name(line) == Some("miriam"))
        .await;
    let resume_from = event["version"].as_str().expect("version").to_owned();
    drop(watch);
    call(
        "PUT",
        &format!("{artists}/odetta"),
        &[],
        Some(&artist("Odetta")),
    )
    .await;
    let mut resumed =
        Lines::open(&format!("{artists}?watch=true&since_version={resume_from}")).await;
    // Only what came after (the controller's status writes to miriam may come first), no
    // listing again, and odetta among it.
    let version_of = |line: &serde_json::Value| -> (u64, u64) {
        let text = line["version"].as_str().unwrap_or_default();
        let (index, within) = text.split_once('.').unwrap_or((text, "0"));
        (index.parse().unwrap_or(0), within.parse().unwrap_or(0))
    };
    let floor = version_of(&event);
    let mut saw_odetta = false;
    for _ in 0..20 {
        let line = resumed.next().await;
        if line.get("upsert").is_some() || line.get("delete").is_some() {
            assert!(
                version_of(&line) > floor,
                "a resumed watch sends only what came after {resume_from}: {line}"
            );
        }
        if upserted_name(&line) == Some("odetta") {
            saw_odetta = true;
            break;
        }
    }
    assert!(saw_odetta, "the resumed watch sees odetta");
    drop(resumed);
    eventually("the watch streams close", || async {
        value(&scrape(&bases[1], &[]).await, "resd_watch_streams", &[]) == Some(0.0)
    })
    .await;
    let sent = value(
        &scrape(&bases[1], &[]).await,
        "resd_watch_events_sent_total",
        &[],
    );
    assert!(sent.is_some_and(|sent| sent >= 3.0), "{sent:?}");

    // A leader kill counts as a leader change on the survivors.
    let changes = |scrape: &prometheus_parse::Scrape| {
        value(scrape, "resd_raft_leader_changes_total", &[]).unwrap_or(0.0)
    };
    let before = changes(&scrape(&bases[2], &[]).await);
    cluster.nodes[0].kill();
    let base = bases[2].clone();
    eventually("node 3 sees a new leader", || {
        let base = base.clone();
        async move { changes(&scrape(&base, &[]).await) > before }
    })
    .await;
    // Node 1 comes back; then a follower is removed from the cluster and is not ready any more.
    cluster.nodes[0].restart();
    for base in &bases {
        eventually("every node is ready again", || async {
            call("GET", &format!("{base}/readyz"), &[], None).await.0 == 200
        })
        .await;
    }
    // A follower is removed (server/tests/it/membership.rs covers a leader removing itself).
    let admin = cluster.client(1);
    let removed = std::sync::atomic::AtomicU64::new(0);
    eventually("a follower is removed", || async {
        let Ok(members) = admin.members().await else {
            return false;
        };
        let Some(follower) = members
            .members
            .iter()
            .map(|m| m.node_id)
            .find(|id| *id != members.leader_id && *id != 2)
        else {
            return false;
        };
        match admin.remove(follower, false).await {
            Ok(()) => {
                removed.store(follower, std::sync::atomic::Ordering::SeqCst);
                true
            }
            Err(error) => {
                eprintln!("remove node {follower}: {error}");
                false
            }
        }
    })
    .await;
    let removed = removed.load(std::sync::atomic::Ordering::SeqCst) as usize - 1;
    eventually("the removed node reports 503", || async {
        let (status, body) = call("GET", &format!("{}/readyz", bases[removed]), &[], None).await;
        status == 503 && body.contains("not ready")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_requests_carry_tokens_and_are_refused_like_grpc_ones() {
    let cluster = tests::Cluster::with_http(1, true).await;
    trust(&cluster);
    let token = cluster.token.clone().expect("management token");
    let base = cluster.nodes[0].http_url();
    let artists = format!("{base}/v1/resources/demo/v2/Artist");
    // No token: 401, for the API and for /metrics; /healthz and /readyz stay open.
    let (status, refused) = call_json("GET", &artists, &[], None).await;
    assert_eq!(
        (status, refused["code"].as_str()),
        (401, Some("UNAUTHENTICATED"))
    );
    assert_eq!(
        call("GET", &format!("{base}/metrics"), &[], None).await.0,
        401
    );
    assert_eq!(
        call("GET", &format!("{base}/healthz"), &[], None).await.0,
        200
    );
    assert_eq!(
        call("GET", &format!("{base}/readyz"), &[], None).await.0,
        200
    );
    // The management token, either header.
    let bearer = format!("Bearer {token}");
    let (status, _) = call("GET", &artists, &[("x-resd-token", &token)], None).await;
    assert_eq!(status, 200);
    scrape(&base, &[("authorization", &bearer)]).await;

    // A token whose policy reads artists only: writing is 403.
    let policy =
        "{\"data\": {\"rules\": [{\"types\": [\"demo.v2.Artist\"], \"access\": \"ACCESS_READ\"}]}}";
    let (status, body) = call(
        "PUT",
        &format!("{base}/v1/resources/acl/v1/Policy/artist-reader"),
        &[("x-resd-token", &token)],
        Some(policy),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let reader = "{\"data\": {\"policies\": [\"artist-reader\"], \"secret\": \"reader-secret-0123456789abcdef\"}}";
    let (status, body) = call(
        "PUT",
        &format!("{base}/v1/resources/acl/v1/Token/reader"),
        &[("x-resd-token", &token)],
        Some(reader),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let as_reader = [("x-resd-token", "reader-secret-0123456789abcdef")];
    let mut read_ok = false;
    for _ in 0..50 {
        if call("GET", &artists, &as_reader, None).await.0 == 200 {
            read_ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(read_ok, "the reader token works within 5 s");
    let (status, denied) = call_json(
        "PUT",
        &format!("{artists}/nina"),
        &as_reader,
        Some(&artist("Nina Simone")),
    )
    .await;
    assert_eq!(
        (status, denied["code"].as_str()),
        (403, Some("PERMISSION_DENIED")),
        "{denied}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line_and_a_lone_joiner_is_not_ready() {
    let dir = tempfile::tempdir().expect("tempdir");
    let http_port = tests::free_port();
    let mut child = std::process::Command::new(tests::binary("resd"))
        .args([
            "--log-format",
            "json",
            "agent",
            "--node-id",
            "2",
            "--data-dir",
        ])
        .arg(dir.path())
        .args([
            "--api-addr",
            &format!("127.0.0.1:{}", tests::free_port()),
            "--raft-addr",
            &format!("127.0.0.1:{}", tests::free_port()),
            "--http-addr",
            &format!("127.0.0.1:{http_port}"),
            // Nobody answers there: the node never becomes a voter.
            "--join",
            &format!("127.0.0.1:{}", tests::free_port()),
            "--insecure",
        ])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("resd runs");
    let base = format!("http://127.0.0.1:{http_port}");
    eventually("the HTTP server answers", || async {
        tokio::time::timeout(Duration::from_secs(1), async {
            http()
                .request(request("GET", &format!("{base}/healthz"), &[], None))
                .await
                .is_ok()
        })
        .await
        .unwrap_or(false)
    })
    .await;
    let (status, body) = call("GET", &format!("{base}/readyz"), &[], None).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("not a voter"), "{body}");
    let _ = child.kill();
    let output = child.wait_with_output().expect("resd output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|line| !line.trim().is_empty())
        .collect();
    assert!(lines.len() >= 2, "some log lines: {stderr}");
    for line in lines {
        let object: BTreeMap<String, serde_json::Value> = serde_json::from_str(line)
            .unwrap_or_else(|error| panic!("not a JSON object ({error}): {line}"));
        for key in ["timestamp", "level", "target", "message"] {
            assert!(object.contains_key(key), "{key} missing: {line}");
        }
    }
}

/// Selectors, pages and bookmarks over HTTP (DESIGN §3): `?selector=`, `?limit=` and
/// `?page_token=` on a list, `?selector=&bookmarks=true` on a watch; a bad selector is a 400
/// with its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selectors_pages_and_bookmarks_over_http() {
    let cluster = tests::Cluster::with_http(1, false).await;
    let base = cluster.nodes[0].http_url();
    let client = cluster.client(0);
    let codec = proto::codec::Codec::new(client.list_types().await.expect("types")).expect("codec");
    for index in 0..5 {
        let team = if index < 3 { "billing" } else { "search" };
        let resource = codec
            .read_yaml(&format!(
                "type: demo.v1.Concept\nname: c{index}\ntenancy: {{partition: default, namespace: default}}\nmetadata: {{team: {team}}}\ndata: {{name: c{index}}}\n"
            ))
            .remove(0)
            .expect("document");
        client.write(&resource).await.expect("write");
    }
    let list = format!(
        "{base}/v1/resources/demo/v1/Concept?partition=default&namespace=default&selector=team%3Dbilling"
    );
    let mut names = Vec::new();
    let mut token = String::new();
    for _ in 0..5 {
        let url = format!("{list}&limit=2&page_token={token}");
        let (status, page) = call_json("GET", &url, &[], None).await;
        assert_eq!(status, 200, "{page}");
        for resource in page["resources"].as_array().expect("resources") {
            names.push(resource["id"]["name"].as_str().expect("name").to_owned());
        }
        token = page["nextPageToken"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(names, ["c0", "c1", "c2"]);

    let (status, refused) = call_json(
        "GET",
        &format!("{base}/v1/resources/demo/v1/Concept?partition=default&namespace=default&selector=team%20in%20(a"),
        &[],
        None,
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["reason"], "INVALID", "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("selector invalid at column 11")),
        "{refused}"
    );

    // A filtered watch: the matching snapshot, then a bookmark while only others change.
    let mut watch = Lines::open(&format!(
        "{base}/v1/resources/demo/v1/Concept?partition=default&namespace=default&watch=true&selector=team%3Dsearch&bookmarks=true"
    ))
    .await;
    watch
        .until(5, |line| line.get("endOfSnapshot").is_some())
        .await;
    let mut other = codec
        .read_yaml("type: demo.v1.Concept\nname: c0\ntenancy: {partition: default, namespace: default}\nmetadata: {team: billing, tier: gold}\ndata: {name: c0}\n")
        .remove(0)
        .expect("document");
    other.version.clear();
    let written = client.write(&other).await.expect("write");
    let bookmark = watch.until(3, |line| line.get("bookmark").is_some()).await;
    assert_eq!(bookmark["version"], written.version.as_str(), "{bookmark}");
}

/// Fenced writes over HTTP (DESIGN §16, `X-Resd-Fence`), as an attacker would send them: a
/// malformed fence is 400; a fence naming a lease the caller may not read is 403 whether or not
/// it exists; a fence whose lease changed hands (or does not exist) is refused `FENCED` with
/// nothing stored, and deletes likewise; the current fence lets the write through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_over_http_are_checked_against_the_lease() {
    let cluster = tests::Cluster::with_http(1, true).await;
    trust(&cluster);
    let token = cluster.token.clone().expect("management token");
    let base = cluster.nodes[0].http_url();
    let manage = [("x-resd-token", token.as_str())];
    let lease_url = format!("{base}/v1/resources/coordination/v1/Lease/invoices");
    let (status, body) = call(
        "PUT",
        &lease_url,
        &manage,
        Some("{\"data\": {\"holder\": \"replica-b\", \"durationSeconds\": 15, \"transitions\": \"3\"}}"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let artists = format!("{base}/v1/resources/demo/v2/Artist");
    let put = |name: &str, fence: &str, who: &[(&'static str, String)]| {
        let mut headers: Vec<(&str, String)> = who.to_vec();
        headers.push(("x-resd-fence", fence.to_owned()));
        let url = format!("{artists}/{name}");
        let body = artist(name);
        async move {
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            call_json("PUT", &url, &headers, Some(&body)).await
        }
    };
    let management = vec![("x-resd-token", token.clone())];
    // Malformed: 400 naming the grammar.
    for fence in [
        "invoices@3",
        "default/default/invoices",
        "default/default/invoices@x",
    ] {
        let (status, refused) = put("nina", fence, &management).await;
        assert_eq!(
            (status, refused["code"].as_str()),
            (400, Some("INVALID_ARGUMENT")),
            "{fence}: {refused}"
        );
        assert!(
            refused["message"]
                .as_str()
                .is_some_and(|m| m.contains("<partition>/<namespace>/<lease name>@<transitions>")),
            "{refused}"
        );
    }
    // Stale (the lease changed hands since 2) or naming no lease: FENCED, nothing stored.
    for fence in ["default/default/invoices@2", "default/default/nobody@0"] {
        let (status, refused) = put("nina", fence, &management).await;
        assert_eq!(
            refused["reason"].as_str(),
            Some("FENCED"),
            "{fence}: {status} {refused}"
        );
        assert_eq!(refused["code"].as_str(), Some("FAILED_PRECONDITION"));
    }
    assert_eq!(
        call("GET", &format!("{artists}/nina"), &manage, None)
            .await
            .0,
        404,
        "nothing was stored under a stale fence"
    );
    // The current fence: stored; a delete under a stale one is refused, under the current
    // one it goes through.
    let (status, stored) = put("nina", "default/default/invoices@3", &management).await;
    assert_eq!(status, 200, "{stored}");
    let delete = |fence: &'static str| {
        let url = format!("{artists}/nina");
        let token = token.clone();
        async move {
            call_json(
                "DELETE",
                &url,
                &[("x-resd-token", &token), ("x-resd-fence", fence)],
                None,
            )
            .await
        }
    };
    let (_, refused) = delete("default/default/invoices@4").await;
    assert_eq!(refused["reason"].as_str(), Some("FENCED"), "{refused}");
    assert_eq!(
        call("GET", &format!("{artists}/nina"), &manage, None)
            .await
            .0,
        200
    );
    let (status, body) = delete("default/default/invoices@3").await;
    assert_eq!(status, 200, "{body}");

    // A token that may write artists but not read leases: naming one is 403, whether it
    // exists or not (no probing for leases).
    let policy = "{\"data\": {\"rules\": [{\"types\": [\"demo.v2.Artist\"], \"access\": \"ACCESS_WRITE\"}]}}";
    let (status, body) = call(
        "PUT",
        &format!("{base}/v1/resources/acl/v1/Policy/artist-writer"),
        &manage,
        Some(policy),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let writer = "{\"data\": {\"policies\": [\"artist-writer\"], \"secret\": \"writer-secret-0123456789abcdef\"}}";
    let (status, body) = call(
        "PUT",
        &format!("{base}/v1/resources/acl/v1/Token/writer"),
        &manage,
        Some(writer),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let as_writer = vec![("x-resd-token", "writer-secret-0123456789abcdef".to_owned())];
    eventually("the writer token works", || {
        let put = &put;
        let as_writer = as_writer.clone();
        async move {
            put("ella", "default/default/invoices@3", &as_writer)
                .await
                .0
                == 403
        }
    })
    .await;
    for fence in ["default/default/invoices@3", "default/default/nobody@0"] {
        let (status, refused) = put("ella", fence, &as_writer).await;
        assert_eq!(
            (status, refused["code"].as_str()),
            (403, Some("PERMISSION_DENIED")),
            "{fence}: {refused}"
        );
    }
    let (status, body) = call_json(
        "PUT",
        &format!("{artists}/ella"),
        &[("x-resd-token", "writer-secret-0123456789abcdef")],
        Some(&artist("ella")),
    )
    .await;
    assert_eq!(status, 200, "unfenced, the writer may write: {body}");
}
