//! The `resd` binary: parses flags and the config file, installs logging and signal handling,
//! runs one agent (`resd agent`) or a local three-node cluster (`resd dev`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use server::agent::dev::DevError;
use server::agent::{Agent, AgentConfig, AgentError, DefaultPolicy, StorageKind};
use tokio_util::sync::CancellationToken;

/// jemalloc: its per-thread caches serve the many short-lived allocations of 1–2 KiB a request
/// makes without the heap consolidation glibc's allocator does for them.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// resd: a cluster server for typed, versioned resources.
#[derive(Debug, Parser)]
#[command(name = "resd", version, about, long_about = None)]
struct Cli {
    /// How log lines look on stderr: text for people, json for log pipelines (one object per
    /// line: time, level, target, message, fields). Levels come from RUST_LOG [default: text].
    #[arg(long, global = true, value_enum, env = "RESD_LOG_FORMAT")]
    log_format: Option<LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    /// Human-readable lines (coloured on a terminal).
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one server node.
    Agent(Box<AgentArgs>),
    /// Run a three-node cluster on loopback with temporary data directories.
    Dev(DevArgs),
    /// Make certificates for a cluster: a CA, node certificates, client certificates.
    #[command(subcommand)]
    Tls(TlsCommand),
}

#[derive(Debug, Subcommand)]
enum TlsCommand {
    /// The certificate authority every node and client certificate is signed by.
    #[command(subcommand)]
    Ca(CaCommand),
    /// Node and client certificates, signed by the CA in --dir.
    #[command(subcommand)]
    Cert(CertCommand),
}

#[derive(Debug, Subcommand)]
enum CaCommand {
    /// Write resd-ca.pem and resd-ca-key.pem (never overwrites).
    Create {
        /// Directory for the files [default: the current directory].
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum CertCommand {
    /// Write node-N.pem and node-N-key.pem (SANs node-N.CLUSTER.resd, localhost, 127.0.0.1 and
    /// the given ones), or with --client NAME, client-NAME.pem and client-NAME-key.pem.
    Create(CertCreateArgs),
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("whom").required(true).args(["node_id", "client"])))]
struct CertCreateArgs {
    /// The node the certificate is for.
    #[arg(long)]
    node_id: Option<u64>,
    /// A client certificate for resctl or the dashboard, with this name.
    #[arg(long, conflicts_with_all = ["cluster_name", "ip", "dns"])]
    client: Option<String>,
    /// The cluster the node belongs to (its certificate names node-N.CLUSTER.resd).
    #[arg(long, default_value = "resd")]
    cluster_name: String,
    /// Another IP address the node is reached at (repeatable).
    #[arg(long)]
    ip: Vec<std::net::IpAddr>,
    /// Another DNS name the node is reached at (repeatable).
    #[arg(long)]
    dns: Vec<String>,
    /// Directory holding the CA and receiving the files [default: the current directory].
    #[arg(long, default_value = ".")]
    dir: PathBuf,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum DefaultPolicyArg {
    /// Nothing a rule does not grant.
    Deny,
    /// Everything a rule does not deny.
    Allow,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum StorageArg {
    /// Raft-replicated, durable in LMDB (needs --data-dir).
    Raft,
    /// In memory, one node, nothing survives a restart.
    Memory,
}

#[derive(Debug, clap::Args)]
struct AgentArgs {
    /// Name of the cluster, shown to operators by `resctl cluster status` and the dashboard
    /// [default: resd].
    #[arg(long, env = "RESD_CLUSTER_NAME")]
    cluster_name: Option<String>,

    /// YAML config file with the same settings as the flags (snake_case keys); flags win.
    #[arg(long, env = "RESD_CONFIG")]
    config: Option<PathBuf>,

    /// This node's id in the cluster (1 or more, unique).
    #[arg(long, env = "RESD_NODE_ID")]
    node_id: Option<u64>,

    /// Directory for the raft log, the state machine and snapshots.
    #[arg(long, env = "RESD_DATA_DIR")]
    data_dir: Option<PathBuf>,

    /// Address of the gRPC API (resource and cluster services, health, reflection) [default: 127.0.0.1:8502].
    #[arg(long, env = "RESD_API_ADDR")]
    api_addr: Option<SocketAddr>,

    /// Address of the internal raft service other nodes connect to [default: 127.0.0.1:8302].
    #[arg(long, env = "RESD_RAFT_ADDR")]
    raft_addr: Option<SocketAddr>,

    /// Address of the HTTP server: /metrics (Prometheus), /healthz, /readyz and the HTTP+JSON
    /// API under /v1, with the node's TLS and ACL settings [default: off].
    #[arg(long, env = "RESD_HTTP_ADDR")]
    http_addr: Option<SocketAddr>,

    /// Start a new cluster with this node as its first member (no-op once initialized).
    #[arg(long)]
    bootstrap: bool,

    /// Join the cluster through the API address of one of its members.
    #[arg(long, value_name = "API_ADDR", conflicts_with = "bootstrap")]
    join: Option<String>,

    /// Where resources are kept [default: raft].
    #[arg(long, value_enum, env = "RESD_STORAGE")]
    storage: Option<StorageArg>,

    /// Build a raft snapshot (and drop the log behind it) once this many writes were applied since the last one; a large state waits for a quarter as many writes as it holds resources, since a snapshot copies all of it [default: 10000].
    #[arg(long)]
    snapshot_every: Option<u64>,

    /// Largest encoded resource a client may write, in bytes [default: 4194304].
    #[arg(long, env = "RESD_MAX_RESOURCE_BYTES")]
    max_resource_bytes: Option<usize>,

    /// Largest raft snapshot accepted from a leader and largest operator snapshot a restore
    /// accepts, in bytes [default: 8589934592].
    #[arg(long, env = "RESD_MAX_SNAPSHOT_BYTES")]
    max_snapshot_bytes: Option<u64>,

    /// Free space on the data directory's disk below which new writes are refused
    /// (RESOURCE_EXHAUSTED; deletes still work, and writes are taken again once space is
    /// freed), in bytes [default: 134217728].
    #[arg(long, env = "RESD_DISK_RESERVE_BYTES")]
    disk_reserve_bytes: Option<u64>,

    /// Entries a follower may lag behind the leader's commit index and still be ready (past
    /// it: NOT_SERVING, /readyz and Status say why, reads go elsewhere) [default: 256].
    #[arg(long, env = "RESD_MAX_LAG_ENTRIES")]
    max_lag_entries: Option<u64>,

    /// Bytes the stored state may hold (its databases' pages, like etcd's quota): a write that
    /// would pass it is refused (RESOURCE_EXHAUSTED naming the quota and the usage), deletes
    /// make room again. The state machine's memory map is sized from it (four times as large,
    /// virtual); at most 1099511627776 [default: 8589934592].
    #[arg(long, env = "RESD_QUOTA_BYTES")]
    quota_bytes: Option<u64>,

    /// Bytes of recent changes kept for resuming watches (and for watchers that fall behind),
    /// at most; the history also keeps at most 16384 changes [default: 67108864].
    #[arg(long, env = "RESD_WATCH_HISTORY_BYTES")]
    watch_history_bytes: Option<usize>,

    /// Watches one token may hold open at once (with ACLs off: one client address); more are
    /// refused with RESOURCE_EXHAUSTED [default: 1024].
    #[arg(long, env = "RESD_MAX_WATCHES_PER_TOKEN")]
    max_watches_per_token: Option<usize>,

    /// Resource types teams may register at runtime (`registry.v1.Type`), at most; a Type past
    /// it is refused [default: 1000].
    #[arg(long, env = "RESD_MAX_TYPES")]
    max_types: Option<usize>,

    /// Bytes of compiled schemas (descriptors) all registered types may hold together; a Type
    /// past it is refused. Give every server the same value [default: 67108864].
    #[arg(long, env = "RESD_MAX_SCHEMA_BYTES")]
    max_schema_bytes: Option<usize>,

    /// Versions of each object of a built-in type its history keeps (DESIGN §18; a registered
    /// type's Type sets its own); 0 keeps none. Give every server the same value [default: 100].
    #[arg(long, env = "RESD_HISTORY_VERSIONS")]
    history_versions: Option<u32>,

    /// Age in seconds of the oldest version a built-in type's history keeps; 0: no limit by
    /// age [default: 604800].
    #[arg(long, env = "RESD_HISTORY_SECONDS")]
    history_seconds: Option<u64>,

    /// Bytes of history each object of a built-in type keeps (its newest version always
    /// stays); 0: no limit by bytes [default: 1048576].
    #[arg(long, env = "RESD_HISTORY_BYTES")]
    history_bytes: Option<u64>,

    /// Bytes of history this node keeps in all, every object together (the versions that
    /// expire soonest go first); at most half of --quota-bytes. Give every server the same
    /// value [default: a quarter of --quota-bytes, at most 1073741824].
    #[arg(long, env = "RESD_HISTORY_NODE_BYTES")]
    history_node_bytes: Option<u64>,

    /// Log every request this node receives that carried credentials or reached authorization
    /// to this file, one JSON line each (DESIGN §18); secrets are never written. Rotated by
    /// size (PATH.1, PATH.2, …).
    #[arg(long, env = "RESD_AUDIT_LOG", value_name = "PATH")]
    audit_log: Option<PathBuf>,

    /// What the audit log holds: none, metadata (who, what, when, how it ended) or request
    /// (and the request's body, secrets redacted) [default: metadata].
    #[arg(long, env = "RESD_AUDIT_LEVEL", value_enum)]
    audit_level: Option<server::audit::AuditLevel>,

    /// Bytes an audit log file grows to before it is rotated [default: 104857600].
    #[arg(long, env = "RESD_AUDIT_LOG_MAX_BYTES")]
    audit_log_max_bytes: Option<u64>,

    /// Rotated audit log files kept besides the current one [default: 5].
    #[arg(long, env = "RESD_AUDIT_LOG_FILES")]
    audit_log_files: Option<u32>,

    /// Requests per second one token may send (twice that in a burst); past it requests are
    /// refused with RESOURCE_EXHAUSTED saying when to retry. 0: no limit. With ACLs off no
    /// rate applies (there are no tokens to tell apart) [default: 2000].
    #[arg(long, env = "RESD_MAX_REQUESTS_PER_SECOND_PER_TOKEN")]
    max_requests_per_second_per_token: Option<u32>,

    /// Bytes of request bodies being received at once on this node, and bytes of lists being
    /// answered, each; one caller may hold a quarter of it [default: 268435456].
    #[arg(long, env = "RESD_MAX_INFLIGHT_BYTES")]
    max_inflight_bytes: Option<usize>,

    /// Seconds a watch may wait for its client to read what it was sent; past it the watch is
    /// ended (ABORTED, naming the version to resume from) and what it held is freed
    /// [default: 30].
    #[arg(long, env = "RESD_WATCH_STALL_SECONDS")]
    watch_stall_seconds: Option<u64>,

    /// CA certificate (PEM) that peer and client certificates must chain to. With --tls-cert
    /// and --tls-key, both ports speak TLS only and the raft port admits members only.
    #[arg(long, env = "RESD_TLS_CA", value_name = "FILE")]
    tls_ca: Option<PathBuf>,

    /// This node's certificate (PEM), naming node-<id>.<cluster>.resd (`resd tls cert create`).
    #[arg(long, env = "RESD_TLS_CERT", value_name = "FILE")]
    tls_cert: Option<PathBuf>,

    /// This node's private key (PEM).
    #[arg(long, env = "RESD_TLS_KEY", value_name = "FILE")]
    tls_key: Option<PathBuf>,

    /// Require API clients to present a certificate signed by the CA.
    #[arg(long)]
    tls_verify_clients: bool,

    /// Enforce ACLs: every request needs a token (bootstrap the first with `resctl acl
    /// bootstrap`).
    #[arg(long, env = "RESD_ACL_ENABLED")]
    acl_enabled: bool,

    /// What ACL rules grant where none speaks [default: deny].
    #[arg(long, value_enum, env = "RESD_ACL_DEFAULT_POLICY")]
    acl_default_policy: Option<DefaultPolicyArg>,

    /// Token this node presents when it joins without TLS (needs the join right). Visible to
    /// every local user in the process list: prefer --join-token-file.
    #[arg(long, env = "RESD_JOIN_TOKEN", hide_env_values = true)]
    join_token: Option<String>,

    /// File holding the join token.
    #[arg(long, env = "RESD_JOIN_TOKEN_FILE", value_name = "FILE")]
    join_token_file: Option<PathBuf>,

    /// File holding the secret of the first management token: with --acl-enabled the cluster
    /// bootstraps its ACLs with it by itself, once (instead of `resctl acl bootstrap`).
    #[arg(long, env = "RESD_ACL_INITIAL_MANAGEMENT_FILE", value_name = "FILE")]
    acl_initial_management_file: Option<PathBuf>,

    /// Serve in plaintext, without TLS certificates: anyone who reaches a port can read and
    /// change everything. Refused with --acl-enabled.
    #[arg(long, env = "RESD_INSECURE")]
    insecure: bool,

    /// Threads serving requests [default: one per CPU]. Lower it when several nodes share a
    /// machine.
    #[arg(long, env = "RESD_WORKER_THREADS")]
    worker_threads: Option<usize>,
}

#[derive(Debug, clap::Args)]
struct DevArgs {
    /// API port of node 1; nodes 2 and 3 use the next ports (0 picks free ports).
    #[arg(long, default_value_t = 8502)]
    api_port: u16,

    /// Raft port of node 1; nodes 2 and 3 use the next ports (0 picks free ports).
    #[arg(long, default_value_t = 8302)]
    raft_port: u16,

    /// HTTP port of node 1 (/metrics, /readyz, the HTTP+JSON API); nodes 2 and 3 use the next
    /// ports (0 picks free ports).
    #[arg(long, default_value_t = 8512)]
    http_port: u16,

    /// Keep the data directories instead of deleting them on exit.
    #[arg(long)]
    keep: bool,

    /// Serve in plaintext without ACLs. By default the cluster is secure: a throwaway CA,
    /// node and client certificates in the temporary directory, client certificates required,
    /// ACLs on and bootstrapped, and a resctl context `resd-dev` (made current while the
    /// cluster runs) holding the certificates and the management token.
    #[arg(long)]
    insecure: bool,
}

/// Raises this process's soft limit on open files to its hard limit (as Go's runtime does): a
/// node holds a descriptor per client connection, and the soft limit is often 1024.
fn raise_descriptor_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            },
        );
    }
}

fn main() -> ExitCode {
    let started = std::time::Instant::now();
    let cli = Cli::parse();
    let is_agent = matches!(cli.command, Command::Agent(_));
    // Everything a node writes (its log, snapshots, markers, secrets) is its owner's only.
    if !matches!(cli.command, Command::Tls(_)) {
        rustix::process::umask(rustix::fs::Mode::from_bits_truncate(0o077));
    }
    if is_agent || matches!(cli.command, Command::Dev(_)) {
        raise_descriptor_limit();
        // Memory freed on a thread that then idles (the blocking pool's, where a Type's schema
        // compiles in apply) is returned to the system on jemalloc's decay schedule by its
        // background threads, not only when that thread's arena is used again.
        if let Err(error) = tikv_jemalloc_ctl::background_thread::write(true) {
            eprintln!(
                "resd: jemalloc's background threads are off ({error}); freed memory is returned more slowly"
            );
        }
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=error"));
    match cli.log_format.unwrap_or(LogFormat::Text) {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init(),
    }
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Command::Agent(args) = &cli.command
        && let Some(threads) = args.worker_threads
    {
        runtime.worker_threads(threads.max(1));
    }
    let runtime = match runtime.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("resd: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Agent(args) => run_agent(*args).await,
            Command::Dev(args) => run_dev(args).await,
            Command::Tls(command) => run_tls(command),
        }
    });
    // Whatever is still blocked on a stalled disk (a sync past the shutdown grace) does not
    // keep the process from exiting.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            if is_agent
                && error
                    .downcast_ref::<AgentError>()
                    .is_some_and(|error| matches!(error, AgentError::Damaged(_)))
            {
                eprintln!("resd: {error:#}");
                return restart_to_rebuild(started.elapsed());
            }
            eprintln!("resd: {error:#}");
            // Like a bad flag: the node could not start as configured (exit 2).
            if error
                .downcast_ref::<AgentError>()
                .is_some_and(AgentError::is_configuration)
            {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Restarts in a row (each within [`REBUILD_WINDOW`] of the one before) after which a node whose
/// state keeps being found damaged gives up and exits 3: the disk under it is failing.
const REBUILD_RESTARTS: u32 = 3;
const REBUILD_WINDOW: std::time::Duration = std::time::Duration::from_secs(600);
/// Counts the restarts in a row across `exec`.
const REBUILD_RESTARTS_ENV: &str = "RESD_REBUILD_RESTARTS";

/// Starts this program again in its place (the same process id, arguments and environment),
/// which rebuilds the damaged state machine at start: no supervisor is needed to get the node
/// back. Returns (exit 3) only when it cannot, or gave up.
fn restart_to_rebuild(ran: std::time::Duration) -> ExitCode {
    use std::os::unix::process::CommandExt;
    let before = if ran < REBUILD_WINDOW {
        std::env::var(REBUILD_RESTARTS_ENV)
            .ok()
            .and_then(|count| count.parse::<u32>().ok())
            .unwrap_or(0)
    } else {
        0
    };
    if before >= REBUILD_RESTARTS {
        eprintln!(
            "resd: the state was found damaged {before} times in a row after rebuilding it: the disk under the data directory is failing; not restarting again (exit 3). Check the disk (dmesg, smartctl), then start resd again."
        );
        return ExitCode::from(3);
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(error) => {
            eprintln!(
                "resd: cannot restart in place ({error}); start resd again: it rebuilds the state at start"
            );
            return ExitCode::from(3);
        }
    };
    eprintln!(
        "resd: restarting in place to rebuild the state machine from the latest snapshot and the raft log"
    );
    let error = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(REBUILD_RESTARTS_ENV, (before + 1).to_string())
        .exec();
    eprintln!(
        "resd: cannot restart in place ({error}); start resd again: it rebuilds the state at start"
    );
    ExitCode::from(3)
}

#[allow(clippy::print_stdout)]
fn run_tls(command: TlsCommand) -> anyhow::Result<()> {
    use server::tls;
    let written = match command {
        TlsCommand::Ca(CaCommand::Create { dir }) => tls::create_ca(&dir)?,
        TlsCommand::Cert(CertCommand::Create(args)) => match (args.node_id, args.client) {
            (_, Some(name)) => tls::create_client_cert(&args.dir, &name)?,
            (Some(node_id), None) => {
                let written = tls::create_node_cert(
                    &args.dir,
                    node_id,
                    &args.cluster_name,
                    &args.ip,
                    &args.dns,
                )?;
                let extra: String = args
                    .dns
                    .iter()
                    .cloned()
                    .chain(args.ip.iter().map(ToString::to_string))
                    .map(|name| format!(", {name}"))
                    .collect();
                println!(
                    "node {node_id}'s certificate names {}, localhost, 127.0.0.1{extra}",
                    tls::node_name(node_id, &args.cluster_name),
                );
                written
            }
            (None, None) => anyhow::bail!("give --node-id N or --client NAME"),
        },
    };
    println!("wrote {}", written.cert.display());
    println!(
        "wrote {} (private key: readable by you only)",
        written.key.display()
    );
    Ok(())
}

fn agent_config(args: AgentArgs) -> Result<AgentConfig, AgentError> {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|error| {
                AgentError::Config(format!("cannot read {}: {error}", path.display()))
            })?;
            serde_yaml_ng::from_str::<AgentConfig>(&text).map_err(|error| {
                AgentError::Config(format!("invalid config file {}: {error}", path.display()))
            })?
        }
        None => AgentConfig::default(),
    };
    if let Some(name) = args.cluster_name {
        config.cluster_name = name;
    }
    if let Some(node_id) = args.node_id {
        config.node_id = node_id;
    }
    if args.data_dir.is_some() {
        config.data_dir = args.data_dir;
    }
    if let Some(addr) = args.api_addr {
        config.api_addr = addr;
    }
    if let Some(addr) = args.raft_addr {
        config.raft_addr = addr;
    }
    if args.http_addr.is_some() {
        config.http_addr = args.http_addr;
    }
    if args.bootstrap {
        config.bootstrap = true;
        config.join = None;
    }
    if args.join.is_some() {
        config.join = args.join;
        config.bootstrap = false;
    }
    if let Some(storage) = args.storage {
        config.storage = match storage {
            StorageArg::Raft => StorageKind::Raft,
            StorageArg::Memory => StorageKind::Memory,
        };
    }
    if let Some(every) = args.snapshot_every {
        config.snapshot_every = every;
    }
    if let Some(bytes) = args.max_resource_bytes {
        config.max_resource_bytes = bytes;
    }
    if let Some(bytes) = args.max_snapshot_bytes {
        config.max_snapshot_bytes = bytes;
    }
    if let Some(bytes) = args.disk_reserve_bytes {
        config.disk_reserve_bytes = bytes;
    }
    if let Some(bytes) = args.quota_bytes {
        config.quota_bytes = bytes;
    }
    if let Some(entries) = args.max_lag_entries {
        config.max_lag_entries = entries;
    }
    if let Some(bytes) = args.watch_history_bytes {
        config.watch_history_bytes = bytes;
    }
    if let Some(watches) = args.max_watches_per_token {
        config.max_watches_per_token = watches;
    }
    if let Some(types) = args.max_types {
        config.max_types = types;
    }
    if let Some(bytes) = args.max_schema_bytes {
        config.max_schema_bytes = bytes;
    }
    if let Some(path) = args.audit_log {
        config.audit_log = Some(path);
    }
    if let Some(level) = args.audit_level {
        config.audit_level = level;
    }
    if let Some(bytes) = args.audit_log_max_bytes {
        config.audit_log_max_bytes = bytes;
    }
    if let Some(files) = args.audit_log_files {
        config.audit_log_files = files;
    }
    if let Some(versions) = args.history_versions {
        config.history_versions = versions;
    }
    if let Some(seconds) = args.history_seconds {
        config.history_seconds = seconds;
    }
    if let Some(bytes) = args.history_bytes {
        config.history_bytes = bytes;
    }
    if let Some(bytes) = args.history_node_bytes {
        config.history_node_bytes = bytes;
    }
    if let Some(rate) = args.max_requests_per_second_per_token {
        config.max_requests_per_second_per_token = rate;
    }
    if let Some(bytes) = args.max_inflight_bytes {
        config.max_inflight_bytes = bytes;
    }
    if let Some(seconds) = args.watch_stall_seconds {
        config.watch_stall_seconds = seconds;
    }
    if args.tls_ca.is_some() {
        config.tls_ca = args.tls_ca;
    }
    if args.tls_cert.is_some() {
        config.tls_cert = args.tls_cert;
    }
    if args.tls_key.is_some() {
        config.tls_key = args.tls_key;
    }
    if args.tls_verify_clients {
        config.tls_verify_clients = true;
    }
    if args.acl_enabled {
        config.acl_enabled = true;
    }
    if let Some(policy) = args.acl_default_policy {
        config.acl_default_policy = match policy {
            DefaultPolicyArg::Deny => DefaultPolicy::Deny,
            DefaultPolicyArg::Allow => DefaultPolicy::Allow,
        };
    }
    if args.join_token.is_some() {
        if std::env::args().any(|arg| arg == "--join-token" || arg.starts_with("--join-token=")) {
            tracing::warn!(
                "--join-token on the command line is visible to every local user (ps, /proc/<pid>/cmdline); use --join-token-file"
            );
        }
        config.join_token = args.join_token;
    }
    if args.join_token_file.is_some() {
        config.join_token_file = args.join_token_file;
    }
    if args.acl_initial_management_file.is_some() {
        config.acl_initial_management_file = args.acl_initial_management_file;
    }
    if args.insecure {
        config.insecure = true;
    }
    Ok(config)
}

#[allow(clippy::print_stdout)]
async fn run_agent(args: AgentArgs) -> anyhow::Result<()> {
    let config = agent_config(args)?;
    let storage = config.storage;
    let shutdown = CancellationToken::new();
    let agent = Agent::start(config, shutdown.clone()).await?;
    let api_addr = agent
        .api_addr()
        .context("cannot read the bound API address")?;
    tracing::info!(%api_addr, raft_addr = ?agent.raft_addr(), ?storage, "resd agent serving gRPC");
    // Lines on stdout for scripts and tests that start resd on port 0.
    println!("resd: serving gRPC on {api_addr}");
    if let Some(raft_addr) = agent.raft_addr() {
        println!("resd: raft on {raft_addr}");
    }
    if let Some(http_addr) = agent.http_addr() {
        tracing::info!(%http_addr, "serving HTTP: /metrics, /healthz, /readyz, /v1");
        println!("resd: serving HTTP on {http_addr}");
    }

    let signals = tokio::spawn(wait_for_signal(shutdown.clone()));
    let served = agent.run().await;
    signals.abort();
    // The signal task only ever ends by abort or by cancelling; either way it is done.
    let _ = signals.await;
    served?;
    tracing::info!("resd agent stopped cleanly");
    Ok(())
}

#[allow(clippy::print_stdout)]
async fn run_dev(args: DevArgs) -> anyhow::Result<()> {
    let settings = server::agent::dev::DevSettings {
        api_port: args.api_port,
        raft_port: args.raft_port,
        http_port: args.http_port,
        keep: args.keep,
        insecure: args.insecure,
    };
    let shutdown = CancellationToken::new();
    let signals = tokio::spawn(wait_for_signal(shutdown.clone()));
    let ran = server::agent::dev::run(&settings, shutdown, &mut std::io::stdout()).await;
    signals.abort();
    let _ = signals.await;
    // A node's own error stays an `AgentError` (a configuration problem exits 2).
    match ran {
        Err(DevError::Start { node, source }) => {
            Err(anyhow::Error::from(source).context(format!("cannot start node {node}")))
        }
        Err(DevError::Node(error)) => Err(error.into()),
        ran => Ok(ran?),
    }
}

/// Cancels `shutdown` on the first SIGINT or SIGTERM.
async fn wait_for_signal(shutdown: CancellationToken) {
    let interrupt = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::warn!(%error, "cannot listen for SIGINT; stop resd with SIGTERM");
            std::future::pending::<()>().await;
        }
        "SIGINT"
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; stop resd with SIGINT");
                std::future::pending::<()>().await;
            }
        }
        "SIGTERM"
    };
    let signal = tokio::select! {
        signal = interrupt => signal,
        signal = terminate => signal,
    };
    tracing::info!(
        signal,
        "shutting down: finishing in-flight requests and ending watches"
    );
    shutdown.cancel();
    // Every step of the shutdown has its own grace period; this bounds the whole, so nothing
    // (a task that ignores the token, a thread waiting on another) keeps a stopped node up.
    let watchdog = std::thread::Builder::new()
        .name("resd-shutdown-watchdog".into())
        .spawn(|| {
            std::thread::sleep(SHUTDOWN_DEADLINE);
            tracing::error!(
                deadline = ?SHUTDOWN_DEADLINE,
                "the shutdown did not finish in time; exiting without a clean stop (the next start rebuilds the state from the snapshot and the log; nothing acknowledged is lost)"
            );
            std::process::exit(EXIT_UNCLEAN_SHUTDOWN);
        });
    if let Err(error) = watchdog {
        tracing::warn!(%error, "cannot start the shutdown watchdog");
    }
}

/// How long a shutdown may take in all: longer than the grace periods of its steps together.
const SHUTDOWN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(45);
/// The exit code of a shutdown the watchdog had to end.
const EXIT_UNCLEAN_SHUTDOWN: i32 = 4;
