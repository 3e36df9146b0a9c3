//! The harness of the cross-crate integration tests: the `resd` and `resctl` binaries of this
//! build, and a multi-process `resd` cluster on loopback (each node its own process, data
//! directory and ports; stopped by PID).
//!
//! `cargo test --workspace` builds both binaries first (the `server` and `ctl` crates have
//! integration tests of their own, which makes cargo build their binaries).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use proto::client::{Client, ClientConfig};

/// How long a starting node may take to print its address.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// `resd dev` on free ports (every port 0): how tests start it, whatever else runs here
/// (a `resd dev` of the README's on the default ports included).
pub const DEV_ON_FREE_PORTS: [&str; 7] = [
    "dev",
    "--api-port",
    "0",
    "--raft-port",
    "0",
    "--http-port",
    "0",
];

/// A binary of this workspace's build (`resd`, `resctl`), next to the test executable.
pub fn binary(name: &str) -> PathBuf {
    let executable = std::env::current_exe().expect("the test executable's path");
    let directory = executable
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let path = directory.join(name);
    assert!(
        path.exists(),
        "{} is missing: build it first (`cargo build --bins`, or run `cargo test --workspace`)",
        path.display()
    );
    path
}

/// A free loopback port (bound and released), never one this process was given before: the
/// kernel may hand a just-released port out again, and two addresses of one node on the same
/// port keep it from starting.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    for _ in 0..1000 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|address| address.port())
            .expect("a free port");
        if given.insert(port) {
            return port;
        }
    }
    panic!("1000 free ports in a row had all been handed out before");
}

/// One `resd agent` process, killed by PID when dropped.
pub struct Node {
    child: Option<Child>,
    args: Vec<String>,
    pub api_addr: String,
    /// `HOST:PORT` of the HTTP server, when the node was started with `--http-addr`.
    pub http_addr: Option<String>,
}

impl Node {
    fn spawn(args: &[String]) -> Node {
        let (child, api_addr) = launch(&binary("resd"), args);
        let http_addr = args
            .iter()
            .position(|arg| arg == "--http-addr")
            .and_then(|at| args.get(at + 1))
            .cloned();
        Node {
            child: Some(child),
            args: args.to_vec(),
            api_addr,
            http_addr,
        }
    }

    /// `http://HOST:PORT` (`https` with TLS) of the node's HTTP server (started with
    /// [`Cluster::with_http`]).
    pub fn http_url(&self) -> String {
        let scheme = if self.args.iter().any(|arg| arg == "--tls-cert") {
            "https"
        } else {
            "http"
        };
        format!(
            "{scheme}://{}",
            self.http_addr
                .as_deref()
                .expect("the node was started without --http-addr")
        )
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL by PID, then wait for the exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the same command line again (same data directory and addresses).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "kill the node before restarting it");
        let (child, api_addr) = launch(&binary("resd"), &self.args);
        self.child = Some(child);
        self.api_addr = api_addr;
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `BINARY agent ARGS` and waits for the line `resd: serving gRPC on ADDR`; returns the
/// process and that address. The one launcher of every test harness (the `server` crate's
/// integration tests and benches pass their own `CARGO_BIN_EXE_resd`).
pub fn launch(resd: &Path, args: &[String]) -> (Child, String) {
    // Plaintext must be asked for: a node given no certificates is started --insecure.
    let insecure = !args
        .iter()
        .any(|arg| arg == "--tls-cert" || arg == "--insecure");
    let mut child = Command::new(resd)
        .arg("agent")
        .args(args)
        .args(insecure.then_some("--insecure"))
        .env(
            "RUST_LOG",
            std::env::var("RESD_TEST_LOG").unwrap_or_else(|_| "warn,openraft=error".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn resd");
    let stdout = child.stdout.take().expect("piped stdout");
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if let Some(address) = line.strip_prefix("resd: serving gRPC on ") {
                let _ = sender.send(address.trim().to_owned());
            }
        }
    });
    match receiver.recv_timeout(START_TIMEOUT) {
        Ok(api_addr) => (child, api_addr),
        Err(_) => {
            let _ = child.kill();
            panic!("resd {args:?} did not report its address within {START_TIMEOUT:?}");
        }
    }
}

/// A cluster of `resd agent` processes: node 1 bootstraps, the others join it.
pub struct Cluster {
    pub nodes: Vec<Node>,
    /// With ACLs on: the management token (from AclBootstrap) every client sends.
    pub token: Option<String>,
    /// With ACLs on (which need TLS): the certificates, made by `resd tls`.
    pub tls: Option<TestTls>,
    _data: tempfile::TempDir,
}

/// A CA and the certificates of a test cluster: `node-N` for each node, the client `test`.
#[derive(Debug, Clone)]
pub struct TestTls {
    pub dir: PathBuf,
}

impl TestTls {
    /// Makes them with `resd tls` in `dir`.
    pub fn make(dir: &Path, nodes: usize) -> TestTls {
        let resd = |args: &[&str]| {
            let output = Command::new(binary("resd"))
                .arg("tls")
                .args(args)
                .arg("--dir")
                .arg(dir)
                .output()
                .expect("run resd tls");
            assert!(output.status.success(), "resd tls {args:?}: {output:?}");
        };
        resd(&["ca", "create"]);
        for node_id in 1..=nodes {
            resd(&["cert", "create", "--node-id", &node_id.to_string()]);
        }
        resd(&["cert", "create", "--client", "test"]);
        TestTls {
            dir: dir.to_path_buf(),
        }
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("resd-ca.pem")
    }

    pub fn client_cert(&self) -> PathBuf {
        self.dir.join("client-test.pem")
    }

    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client-test-key.pem")
    }

    /// The agent flags of node `node_id`.
    pub fn node_flags(&self, node_id: usize) -> Vec<String> {
        let path = |file: String| self.dir.join(file).display().to_string();
        vec![
            "--tls-ca".into(),
            path("resd-ca.pem".into()),
            "--tls-cert".into(),
            path(format!("node-{node_id}.pem")),
            "--tls-key".into(),
            path(format!("node-{node_id}-key.pem")),
        ]
    }

    /// The resctl flags of the client `test`.
    pub fn client_flags(&self) -> Vec<String> {
        vec![
            "--ca-cert".into(),
            self.ca().display().to_string(),
            "--client-cert".into(),
            self.client_cert().display().to_string(),
            "--client-key".into(),
            self.client_key().display().to_string(),
        ]
    }

    /// The client library's TLS settings of the client `test`.
    pub fn client(&self) -> proto::client::ClientTls {
        proto::client::ClientTls::from_paths(
            Some(self.ca()),
            Some(self.client_cert()),
            Some(self.client_key()),
        )
        .expect("TLS settings")
        .expect("a CA")
    }
}

impl Cluster {
    pub async fn start(size: usize) -> Cluster {
        Self::start_with(size, &[]).await
    }

    /// A cluster whose nodes all get `extra_args` as well.
    pub async fn start_with(size: usize, extra_args: &[&str]) -> Cluster {
        Self::start_inner(size, extra_args, false, false).await
    }

    /// A cluster with ACLs on (and so TLS): node 1 bootstraps the cluster and its ACLs, the
    /// others join with their node certificates; every client of the cluster sends the
    /// management token.
    pub async fn start_with_acls(size: usize) -> Cluster {
        Self::start_inner(size, &["--acl-enabled"], true, false).await
    }

    /// A cluster whose nodes also serve HTTP (`--http-addr` on a free port each), with ACLs
    /// on or off.
    pub async fn with_http(size: usize, acls: bool) -> Cluster {
        let extra: &[&str] = if acls { &["--acl-enabled"] } else { &[] };
        Self::start_inner(size, extra, acls, true).await
    }

    async fn start_inner(size: usize, extra_args: &[&str], acls: bool, http: bool) -> Cluster {
        let data = tempfile::tempdir().expect("temp dir");
        let mut nodes: Vec<Node> = Vec::new();
        let mut token: Option<String> = None;
        let tls = acls.then(|| TestTls::make(&data.path().join("tls"), size));
        for node_id in 1..=size {
            let mut args = vec![
                "--node-id".to_owned(),
                node_id.to_string(),
                "--data-dir".to_owned(),
                data.path()
                    .join(format!("node{node_id}"))
                    .display()
                    .to_string(),
                "--api-addr".to_owned(),
                format!("127.0.0.1:{}", free_port()),
                "--raft-addr".to_owned(),
                format!("127.0.0.1:{}", free_port()),
            ];
            match nodes.first() {
                None => args.push("--bootstrap".to_owned()),
                Some(first) => args.extend(["--join".to_owned(), first.api_addr.clone()]),
            }
            if let Some(tls) = &tls {
                args.extend(tls.node_flags(node_id));
            }
            if http {
                args.extend([
                    "--http-addr".to_owned(),
                    format!("127.0.0.1:{}", free_port()),
                ]);
            }
            args.extend(extra_args.iter().map(|arg| arg.to_string()));
            nodes.push(Node::spawn(&args));
            if acls && token.is_none() {
                token = Some(bootstrap_acls(&nodes[0].api_addr, tls.as_ref()).await);
            }
        }
        let cluster = Cluster {
            nodes,
            token,
            tls,
            _data: data,
        };
        cluster.wait_for_voters(size).await;
        cluster
    }

    /// A client of node `index` (0-based).
    pub fn client(&self, index: usize) -> Client {
        self.client_as(index, self.token.clone())
    }

    /// A client of node `index` presenting `token` (none: anonymous).
    pub fn client_as(&self, index: usize, token: Option<String>) -> Client {
        Client::new(
            ClientConfig::new(self.nodes[index].api_addr.clone())
                .with_token(token)
                .with_tls(self.tls.as_ref().map(TestTls::client)),
        )
        .expect("client")
    }

    async fn wait_for_voters(&self, size: usize) {
        let client = self.client(0);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(members) = client.members().await
                && members.leader_id != 0
                && members.members.iter().filter(|m| m.voter).count() == size
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the cluster did not reach {size} voters within 60s");
    }
}

/// Bootstraps ACLs through `api_addr` (once a leader is elected) and returns the secret.
async fn bootstrap_acls(api_addr: &str, tls: Option<&TestTls>) -> String {
    let client =
        Client::new(ClientConfig::new(api_addr.to_owned()).with_tls(tls.map(TestTls::client)))
            .expect("client");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match client.acl_bootstrap().await {
            Ok(reply) => return reply.secret,
            Err(error) if Instant::now() > deadline => panic!("cannot bootstrap ACLs: {error}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The repository's `fixtures/` directory.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("fixtures")
}
