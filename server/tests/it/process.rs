//! Starting and stopping `resd` processes for tests: single nodes and multi-process clusters on
//! loopback, each node with its own data directory, stopped by PID.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use proto::cluster::v1::cluster_service_client::ClusterServiceClient;
use proto::cluster::v1::{Role, StatusRequest, StatusResponse};
use proto::resource::v1::resource_service_client::ResourceServiceClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// How long a stopping resd may take to exit.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// A `resd agent` process. Killed by its PID when dropped.
pub(crate) struct Resd {
    child: Option<Child>,
    args: Vec<String>,
    pub api_addr: SocketAddr,
    _data: Option<tempfile::TempDir>,
    /// How the test connects when the node speaks TLS.
    pub client_tls: Option<ClientTlsConfig>,
    /// The certificates of a node started secure by [`Resd::start_with`].
    _ca: Option<std::sync::Arc<TestCa>>,
    /// The token the harness's own calls (status, members) carry, on a cluster with ACLs.
    pub harness_token: Option<String>,
}

/// A CA with certificates for nodes 1..=`nodes` of cluster `resd` and a client `test`, made by
/// the library `resd tls` uses.
pub(crate) struct TestCa {
    pub dir: tempfile::TempDir,
}

impl TestCa {
    pub(crate) fn new(nodes: u64) -> TestCa {
        let dir = tempfile::tempdir().expect("temp dir");
        server::tls::create_ca(dir.path()).expect("CA");
        for node_id in 1..=nodes {
            server::tls::create_node_cert(dir.path(), node_id, "resd", &[], &[])
                .expect("node cert");
        }
        server::tls::create_client_cert(dir.path(), "test").expect("client cert");
        TestCa { dir }
    }

    pub(crate) fn path(&self, file: &str) -> String {
        self.dir.path().join(file).display().to_string()
    }

    pub(crate) fn read(&self, file: &str) -> Vec<u8> {
        std::fs::read(self.dir.path().join(file)).expect("read a certificate file")
    }

    /// The agent flags of node `node_id`.
    pub(crate) fn node_flags(&self, node_id: u64) -> Vec<String> {
        vec![
            "--tls-ca".into(),
            self.path("resd-ca.pem"),
            "--tls-cert".into(),
            self.path(&format!("node-{node_id}.pem")),
            "--tls-key".into(),
            self.path(&format!("node-{node_id}-key.pem")),
        ]
    }

    /// A client configuration trusting this CA, presenting `cert`/`key` when given.
    pub(crate) fn client(&self, identity: Option<(&str, &str)>) -> ClientTlsConfig {
        let config =
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(self.read("resd-ca.pem")));
        match identity {
            Some((cert, key)) => {
                config.identity(Identity::from_pem(self.read(cert), self.read(key)))
            }
            None => config,
        }
    }
}

/// A free loopback port, never one this process was given before (`tests::free_port`).
pub(crate) fn free_port() -> u16 {
    tests::free_port()
}

impl Resd {
    /// A single-node Raft cluster in its own temporary data directory.
    pub(crate) fn start() -> Resd {
        Self::start_with(&[])
    }

    /// A single node with `extra_args`; with `--acl-enabled` it speaks TLS (ACLs are refused
    /// without it), and the test connects with the client certificate `test`.
    pub(crate) fn start_with(extra_args: &[&str]) -> Resd {
        let data = tempfile::tempdir().expect("temp dir");
        let ca = extra_args
            .contains(&"--acl-enabled")
            .then(|| std::sync::Arc::new(TestCa::new(1)));
        let mut args = vec![
            "--node-id".to_owned(),
            "1".to_owned(),
            "--data-dir".to_owned(),
            data.path().display().to_string(),
            "--api-addr".to_owned(),
            "127.0.0.1:0".to_owned(),
            "--raft-addr".to_owned(),
            "127.0.0.1:0".to_owned(),
            "--bootstrap".to_owned(),
        ];
        args.extend(extra_args.iter().map(|a| a.to_string()));
        if let Some(ca) = &ca {
            args.extend(ca.node_flags(1));
        }
        let mut resd = Self::spawn(args);
        resd._data = Some(data);
        resd.client_tls = ca
            .as_ref()
            .map(|ca| ca.client(Some(("client-test.pem", "client-test-key.pem"))));
        resd._ca = ca;
        resd
    }

    /// A node with in-memory storage.
    pub(crate) fn start_memory(extra_args: &[&str]) -> Resd {
        let mut args = vec![
            "--storage".to_owned(),
            "memory".to_owned(),
            "--api-addr".to_owned(),
            "127.0.0.1:0".to_owned(),
        ];
        args.extend(extra_args.iter().map(|a| a.to_string()));
        Self::spawn(args)
    }

    /// Starts `resd agent ARGS` and waits for it to report its API address. A node given no
    /// certificates is started `--insecure` (plaintext must be asked for).
    pub(crate) fn spawn(mut args: Vec<String>) -> Resd {
        if !args
            .iter()
            .any(|arg| arg == "--tls-cert" || arg == "--insecure")
        {
            args.push("--insecure".to_owned());
        }
        let (child, api_addr) = launch(&args);
        Resd {
            child: Some(child),
            args,
            api_addr,
            _data: None,
            client_tls: None,
            _ca: None,
            harness_token: None,
        }
    }

    /// A single insecure node whose process may open at most `descriptors` files (its soft and
    /// hard limit, so it cannot raise them), started through a shell that sets the limit and
    /// then becomes the node (same PID).
    pub(crate) fn start_with_descriptor_limit(descriptors: u32) -> Resd {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("temp dir");
        let wrapper = dir.path().join("resd-limited");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nulimit -n {descriptors} || exit 1\nexec '{}' \"$@\"\n",
                resd_binary().display()
            ),
        )
        .expect("write the wrapper");
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
            .expect("make it executable");
        let args: Vec<String> = [
            "--node-id",
            "1",
            "--data-dir",
            &dir.path().join("data").display().to_string(),
            "--api-addr",
            "127.0.0.1:0",
            "--raft-addr",
            "127.0.0.1:0",
            "--bootstrap",
            "--insecure",
        ]
        .iter()
        .map(|arg| arg.to_string())
        .collect();
        let (child, address) = tests::launch(&wrapper, &args);
        Resd {
            child: Some(child),
            args,
            api_addr: address.parse().expect("resd prints a socket address"),
            _data: Some(dir),
            client_tls: None,
            _ca: None,
            harness_token: None,
        }
    }

    /// The node's data directory, when it has one of its own.
    pub(crate) fn data_dir(&self) -> Option<&Path> {
        self._data.as_ref().map(|dir| dir.path())
    }

    /// The command line the node was started with (`resd agent ARGS`).
    pub(crate) fn args(&self) -> &[String] {
        &self.args
    }

    /// An endpoint of this node's API, with TLS when the node speaks it.
    pub(crate) fn endpoint(&self) -> tonic::transport::Endpoint {
        endpoint_of(&self.api_addr.to_string(), self.client_tls.clone())
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub(crate) async fn channel(&self) -> Channel {
        self.endpoint()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .connect()
            .await
            .expect("connect to resd")
    }

    pub(crate) async fn resources(&self) -> ResourceServiceClient<Channel> {
        ResourceServiceClient::new(self.channel().await).max_decoding_message_size(64 * 1024 * 1024)
    }

    pub(crate) async fn cluster(&self) -> ClusterServiceClient<Channel> {
        ClusterServiceClient::new(self.channel().await)
    }

    pub(crate) async fn status(&self) -> Option<StatusResponse> {
        let channel = self
            .endpoint()
            .connect_timeout(Duration::from_secs(1))
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .ok()?;
        ClusterServiceClient::new(channel)
            .status(self.harness_request(StatusRequest {}))
            .await
            .ok()
            .map(|reply| reply.into_inner())
    }

    /// A request carrying the harness's token, if the cluster has one.
    pub(crate) fn harness_request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = &self.harness_token {
            request.metadata_mut().insert(
                proto::TOKEN_HEADER,
                token.parse().expect("a token is valid metadata"),
            );
        }
        request
    }

    /// Sends SIGTERM (by PID) and waits for the exit.
    pub(crate) fn terminate(&mut self) -> ExitStatus {
        self.terminate_within(STOP_TIMEOUT)
            .expect("resd exits after SIGTERM")
    }

    /// Sends SIGTERM (by PID) and waits at most `timeout` for the exit (`None`: still running).
    pub(crate) fn terminate_within(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let pid = self.pid().expect("running");
        let status = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM {pid} failed");
        self.wait_exit(timeout)
    }

    /// `GET path` on the node's HTTP server (`--http-addr`): status and body, or `None` when
    /// it does not answer within 5 s.
    pub(crate) fn http_get(&self, path: &str) -> Option<(u16, String)> {
        self.http_get_with_headers(path)
            .map(|(status, _, body)| (status, body))
    }

    /// [`Resd::http_get`] with the answer's header lines too.
    pub(crate) fn http_get_with_headers(&self, path: &str) -> Option<(u16, String, String)> {
        self.http_send("GET", path, "")
    }

    /// An HTTP request with a JSON `body` (empty: none): the status, header lines and body.
    pub(crate) fn http_send(
        &self,
        method: &str,
        path: &str,
        body: &str,
    ) -> Option<(u16, String, String)> {
        use std::io::{Read as _, Write as _};
        let at = self.args.iter().position(|arg| arg == "--http-addr")?;
        let addr: SocketAddr = self.args.get(at + 1)?.parse().ok()?;
        let mut stream =
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let status = response.split(' ').nth(1)?.parse().ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        Some((status, head.to_owned(), body.to_owned()))
    }

    /// Sends a signal by PID (`STOP`, `CONT`, …).
    pub(crate) fn signal(&self, signal: &str) {
        let pid = self.pid().expect("running");
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {pid} failed");
    }

    /// SIGKILL: the process gets no chance to clean up.
    pub(crate) fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the same command line again (same data directory and addresses).
    pub(crate) fn restart(&mut self) {
        assert!(self.child.is_none(), "stop the node before restarting it");
        let (child, api_addr) = launch(&self.args);
        self.child = Some(child);
        self.api_addr = api_addr;
    }

    fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

/// An endpoint of `addr`: plain, or TLS with `tls`.
pub(crate) fn endpoint_of(addr: &str, tls: Option<ClientTlsConfig>) -> tonic::transport::Endpoint {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint = Channel::from_shared(format!("{scheme}://{addr}")).expect("valid uri");
    match tls {
        Some(tls) => endpoint.tls_config(tls).expect("TLS configuration"),
        None => endpoint,
    }
}

/// The `resd` these tests start: this build's, or `RESD_TEST_BINARY` (to run an attack test
/// against an older build and see it fail there).
pub(crate) fn resd_binary() -> std::path::PathBuf {
    std::env::var_os("RESD_TEST_BINARY")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_resd").into())
}

fn launch(args: &[String]) -> (Child, SocketAddr) {
    let (child, address) = tests::launch(&resd_binary(), args);
    (
        child,
        address.parse().expect("resd prints a socket address"),
    )
}

impl Drop for Resd {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A cluster of `resd` processes on fixed loopback ports, so nodes keep their addresses across
/// restarts.
pub(crate) struct Cluster {
    pub nodes: Vec<Resd>,
    base: tempfile::TempDir,
    first_api: SocketAddr,
    /// With TLS: the certificates, and the client identity tests use.
    tls: Option<(std::sync::Arc<TestCa>, ClientTlsConfig)>,
    /// With ACLs: the management secret the first node's bootstrap returned.
    pub harness_token: Option<String>,
}

impl Cluster {
    /// Node 1 bootstraps; the others join it.
    pub(crate) async fn start(size: usize, extra_args: &[&str]) -> Cluster {
        Self::start_inner(size, extra_args, None).await
    }

    /// A cluster whose nodes also serve HTTP, each on a fixed port (see [`Resd::http_get`]).
    pub(crate) async fn start_with_http(size: usize, extra_args: &[&str]) -> Cluster {
        let base = tempfile::tempdir().expect("temp dir");
        let mut cluster = Cluster {
            nodes: Vec::new(),
            first_api: SocketAddr::from(([127, 0, 0, 1], 0)),
            base,
            tls: None,
            harness_token: None,
        };
        for _ in 0..size {
            let port = format!("127.0.0.1:{}", free_port());
            let mut args: Vec<&str> = extra_args.to_vec();
            args.extend(["--http-addr", port.as_str()]);
            cluster.add_node(&args).await;
        }
        cluster.wait_for_members(size).await;
        cluster
    }

    /// A cluster speaking TLS with the certificates of `ca`; the test connects as `client`.
    pub(crate) async fn start_tls(
        size: usize,
        extra_args: &[&str],
        ca: std::sync::Arc<TestCa>,
        client: ClientTlsConfig,
    ) -> Cluster {
        Self::start_inner(size, extra_args, Some((ca, client))).await
    }

    async fn start_inner(
        size: usize,
        extra_args: &[&str],
        tls: Option<(std::sync::Arc<TestCa>, ClientTlsConfig)>,
    ) -> Cluster {
        let base = tempfile::tempdir().expect("temp dir");
        let mut cluster = Cluster {
            nodes: Vec::new(),
            first_api: SocketAddr::from(([127, 0, 0, 1], 0)),
            base,
            tls,
            harness_token: None,
        };
        for _ in 0..size {
            cluster.add_node(extra_args).await;
            if cluster.nodes.len() == 1 && extra_args.contains(&"--acl-enabled") {
                // The harness's calls need a token: bootstrap on the first node.
                let secret = bootstrap_acls(&cluster.nodes[0]).await;
                cluster.harness_token = Some(secret);
            }
            if let Some(token) = &cluster.harness_token
                && let Some(node) = cluster.nodes.last_mut()
            {
                node.harness_token = Some(token.clone());
            }
        }
        cluster.wait_for_members(size).await;
        cluster
    }

    fn node_args(
        dir: &Path,
        node_id: usize,
        join: Option<SocketAddr>,
        extra_args: &[&str],
    ) -> Vec<String> {
        let mut args = vec![
            "--node-id".to_owned(),
            node_id.to_string(),
            "--data-dir".to_owned(),
            dir.join(format!("node{node_id}")).display().to_string(),
            "--api-addr".to_owned(),
            format!("127.0.0.1:{}", free_port()),
            "--raft-addr".to_owned(),
            format!("127.0.0.1:{}", free_port()),
        ];
        match join {
            None => args.push("--bootstrap".to_owned()),
            Some(addr) => args.extend(["--join".to_owned(), addr.to_string()]),
        }
        args.extend(extra_args.iter().map(|a| a.to_string()));
        args
    }

    /// Starts one more node (node 1 bootstraps, later ones join through node 1).
    pub(crate) async fn add_node(&mut self, extra_args: &[&str]) -> usize {
        let node_id = self.nodes.len() + 1;
        let join = (node_id > 1).then_some(self.first_api);
        let mut args = Self::node_args(self.base.path(), node_id, join, extra_args);
        if let Some((ca, _)) = &self.tls {
            args.extend(ca.node_flags(node_id as u64));
        }
        let mut node = Resd::spawn(args);
        node.client_tls = self.tls.as_ref().map(|(_, client)| client.clone());
        if node_id == 1 {
            self.first_api = node.api_addr;
        }
        self.nodes.push(node);
        node_id - 1
    }

    /// The data directory of the node at `index` (as `node_args` names it).
    pub(crate) fn data_dir(&self, index: usize) -> std::path::PathBuf {
        self.base.path().join(format!("node{}", index + 1))
    }

    /// Waits until one running node is leader and reports `size` voters.
    pub(crate) async fn wait_for_members(&self, size: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(leader) = self.leader().await
                && let Ok(reply) = self.nodes[leader]
                    .cluster()
                    .await
                    .members(
                        self.nodes[leader].harness_request(proto::cluster::v1::MembersRequest {}),
                    )
                    .await
                && reply.get_ref().members.iter().filter(|m| m.voter).count() == size
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the cluster did not reach {size} voters within 60s");
    }

    /// Index of the node that is leader now, asking every running node.
    pub(crate) async fn leader(&self) -> Option<usize> {
        for (index, node) in self.nodes.iter().enumerate() {
            if node.child.is_none() {
                continue;
            }
            if let Some(status) = node.status().await
                && status.role == Role::Leader as i32
            {
                return Some(index);
            }
        }
        None
    }

    /// Waits for a leader among the running nodes.
    pub(crate) async fn wait_for_leader(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(leader) = self.leader().await {
                return leader;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no leader within 60s");
    }

    /// Waits until every running node has applied at least `index`.
    pub(crate) async fn wait_for_applied(&self, index: u64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        'waiting: while Instant::now() < deadline {
            for node in self.nodes.iter().filter(|n| n.child.is_some()) {
                match node.status().await {
                    Some(status) if status.applied_index >= index => {}
                    _ => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue 'waiting;
                    }
                }
            }
            return;
        }
        panic!("not every node applied index {index} within 60s");
    }
}

/// Bootstraps ACLs on `node` (waiting for it to lead): the management secret.
async fn bootstrap_acls(node: &Resd) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match node
            .cluster()
            .await
            .acl_bootstrap(proto::cluster::v1::AclBootstrapRequest {})
            .await
        {
            Ok(reply) => return reply.into_inner().secret,
            Err(status) => {
                assert!(Instant::now() < deadline, "cannot bootstrap: {status:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
