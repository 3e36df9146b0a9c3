//! The command line: global flags (each with an environment variable) and one subcommand per
//! operator task. Parsing only; the commands live in `command::*`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::output::OutputSpec;

const EXIT_STATUS: &str = "\
Exit status:
  0  success
  1  the operation failed (an error from the server, an unreachable server, a failed document)
  2  usage error (unknown flag, missing argument)";

const EXAMPLES: &str = "\
Examples:
  resctl apply -f fixtures/demo                    apply every YAML file under a directory
  resctl diff -f fixtures/demo                     what that apply would change (exit 1 if anything)
  resctl get demo.v2.Artist -n jazz                list the artists of a namespace
  resctl get Executive clive-davis -o yaml         a unique kind needs no group or version
  resctl get Album -A -o jsonpath='{.items[*].name}'
                                                   pick fields (kubectl's JSONPath subset)
  resctl watch demo.v2.Album -A                    stream changes, resuming across restarts
  resctl tree demo.v2.Artist miles-davis -n jazz   owner tree with each node's worst condition
  resctl delete demo.v2.Artist miles-davis -n jazz --wait
                                                   delete and wait for the cascade";

/// resctl — the operator's CLI for resd clusters.
#[derive(Debug, Parser)]
#[command(
    name = "resctl",
    version,
    about = "The operator's CLI for resd: typed, versioned resources and the controllers that reconcile them",
    after_help = format!("{EXAMPLES}\n\n{EXIT_STATUS}"),
    propagate_version = true
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every command takes.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Global options")]
pub struct GlobalArgs {
    /// Where the cluster is and how to reach it (shared with every controller program).
    #[command(flatten)]
    pub connect: proto::client::connect::ConnectArgs,
    /// Output format: table, wide, yaml, json, name, jsonpath=TEMPLATE (kubectl's subset:
    /// `{.data.name}`, `{.items[*].name}`, `{.items[0]}`, `{range .items[*]}…{end}`, `{"\n"}`;
    /// a list is `{.items}`), or custom-columns=NAME:PATH,… (`NAME:.name,TEAM:.metadata.team`)
    #[arg(
        short,
        long,
        global = true,
        env = "RESD_OUTPUT",
        hide_env_values = true,
        value_name = "FORMAT",
        default_value = "table"
    )]
    pub output: OutputSpec,
    /// Linearizable reads (through the leader) instead of the connected server's local state
    #[arg(long, global = true, env = "RESD_CONSISTENT", hide_env_values = true)]
    pub consistent: bool,
    /// Partition for commands that name resources [default: the context's, else `default`]
    #[arg(long, global = true, env = "RESD_PARTITION", hide_env_values = true)]
    pub partition: Option<String>,
    /// Namespace for commands that name resources [default: the context's, else `default`]
    #[arg(
        short,
        long,
        global = true,
        env = "RESD_NAMESPACE",
        hide_env_values = true
    )]
    pub namespace: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or update resources from YAML files, directories or stdin
    Apply(ApplyArgs),
    /// Show what apply would change, as a unified diff (exit 0 no changes, 1 changes, 2 error)
    #[command(
        after_help = "Compares the server's current state with what `apply -f` would store (after the type's\nmutate hook; metadata merged as apply merges it): data, metadata and owner. Nothing is written.\n\nExamples:\n  resctl diff -f fixtures/demo\n  resctl get Album kind-of-blue -n jazz -o yaml | sed 's/1959/1960/' | resctl diff -f -\n  resctl diff -f album.yaml -o json          one object per document: change, diff, error\n\nExit status:\n  0  no differences\n  1  differences found\n  2  an error (a document the server rejects, an unreachable server, a usage error)"
    )]
    Diff(DiffArgs),
    /// List resources of a type, or show one
    Get(GetArgs),
    /// Delete resources by name or from files, optionally waiting until they are gone
    Delete(DeleteArgs),
    /// Show a resource's status conditions and whether they are up to date
    Status(NamedArgs),
    /// Show one object for people: owner, finalizers, labels, conditions and its events
    #[command(
        after_help = "Events are what controllers recorded about the object in the last hour (merged by\nreason, with a count).\n\nExample:\n  resctl describe Artist miles-davis -n jazz"
    )]
    Describe(NamedArgs),
    /// Wait until a resource has a condition, or is gone (exit 0 when met, 1 on timeout)
    #[command(
        after_help = "Examples:\n  resctl wait Artist miles-davis -n jazz --for condition=Accepted\n  resctl wait Artist miles-davis -n jazz --for condition=Accepted=False --timeout 30s\n  resctl wait Album kind-of-blue -n jazz --for delete --timeout 2m"
    )]
    Wait(WaitArgs),
    /// Every version of an object its history keeps: who made it, when, and what it changed
    #[command(
        after_help = "Examples:\n  resctl history Album kind-of-blue -n jazz\n  resctl diff Album kind-of-blue -n jazz --from 41 --to 57\n  resctl get Album kind-of-blue -n jazz --at 41 -o yaml\n  resctl blame Album kind-of-blue -n jazz\n  resctl history Album kind-of-blue -n jazz --uid 01J… (a deleted object's)"
    )]
    History(HistoryArgs),
    /// Each field of an object with the version and actor that last changed it
    #[command(
        after_help = "Fields unchanged since the oldest version the history keeps are attributed to it.\n\nExample:\n  resctl blame Album kind-of-blue -n jazz"
    )]
    Blame(HistoryArgs),
    /// Show a resource's owner tree: ancestors up to the root and every descendant
    Tree(NamedArgs),
    /// Edit a resource in $EDITOR and save it with compare-and-swap
    Edit(NamedArgs),
    /// List the types the server knows (built in, or registered by a registry.v1.Type)
    Types,
    /// Plan a change to a registered Type against the objects stored under it
    #[command(subcommand)]
    Type(TypeCommand),
    /// Describe a type's schema, or one field of it: each field's type and its .proto comment
    #[command(
        after_help = "Examples:\n  resctl explain payments.v1.Invoice\n  resctl explain Invoice.amount_cents\n  resctl explain payments.v1.Invoice.lines.cents\n  resctl explain Invoice -o json"
    )]
    Explain(ExplainArgs),
    /// Stream changes to resources of a type, one line per event
    Watch(WatchArgs),
    /// Set or remove metadata keys of a resource (k=v sets, k- removes), with compare-and-swap
    #[command(
        after_help = "Examples:\n  resctl label Artist miles-davis -n jazz team=billing tier=gold\n  resctl label Artist miles-davis -n jazz tier-\n  resctl label Artist miles-davis -n jazz team=search --overwrite\n\nA key that is set already keeps its value unless --overwrite. The reserved keys\n(finalizers, deletionTimestamp) are not labels. A write that loses a race is read again\nand retried, a few times."
    )]
    Label(LabelArgs),
    /// Cluster membership and raft state
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Which controllers run on which node, with queue depth and errors
    Controllers,
    /// Save, inspect and restore snapshots of the whole cluster state
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Generate load against a cluster and report throughput and latency
    Bench(BenchArgs),
    /// Open the live dashboard: resources, statuses, owner trees, nodes, controllers, snapshots
    #[command(after_help = TUI_HELP)]
    Tui(TuiArgs),
    /// ACLs: bootstrap, tokens, and who you are
    #[command(subcommand)]
    Acl(AclCommand),
    /// Ask the server what a token may do
    #[command(subcommand)]
    Auth(AuthCommand),
    /// Plan an admission policy against the objects stored under the types it matches
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Manage named servers and tokens in the contexts file
    #[command(subcommand)]
    Context(ContextCommand),
    /// Print a shell completion script
    Completion(CompletionArgs),
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// YAML file, directory (searched recursively for .yaml/.yml) or `-` for stdin
    #[arg(
        short,
        long = "filename",
        value_name = "PATH",
        required_unless_present = "resource_type",
        conflicts_with = "resource_type"
    )]
    pub files: Vec<PathBuf>,
    /// With NAME and --from: compare two versions of one object from its history
    #[arg(value_name = "TYPE", requires_all = ["name", "from"])]
    pub resource_type: Option<String>,
    /// The object whose versions are compared
    pub name: Option<String>,
    /// The older version (the object as it was then: the last version at or before it)
    #[arg(long, value_name = "VERSION", requires = "resource_type")]
    pub from: Option<String>,
    /// The newer version [default: the object as it is now]
    #[arg(long, value_name = "VERSION", requires = "from")]
    pub to: Option<String>,
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// Type as group.version.Kind or a unique kind
    #[arg(value_name = "TYPE")]
    pub resource_type: String,
    /// Name of the object
    pub name: String,
    /// A deleted object's history: its uid (`resctl history` shows it while the object exists)
    #[arg(long)]
    pub uid: Option<String>,
    /// Only the newest N versions
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
}

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// YAML file, directory (searched recursively for .yaml/.yml) or `-` for stdin
    #[arg(short, long = "filename", value_name = "PATH", required = true)]
    pub files: Vec<PathBuf>,
    /// Validate and mutate on the server and report what would change; store nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Write a changed Type even when its plan finds stored objects that would fail under it
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct GetArgs {
    /// Type as group.version.Kind or a unique kind (`Executive`)
    #[arg(value_name = "TYPE")]
    pub resource_type: String,
    /// Name of one resource; without it, list
    pub name: Option<String>,
    /// List across every partition and namespace
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Only names starting with this prefix (lists only)
    #[arg(long)]
    pub prefix: Option<String>,
    /// Only resources whose metadata matches (k=v, k!=v, k in (a,b), k notin (a,b), k, !k;
    /// comma = and)
    #[arg(short = 'l', long, value_name = "SELECTOR", value_parser = parse_selector)]
    pub selector: Option<String>,
    /// Sort a list by the value at this JSONPath of each resource's JSON (e.g. `.version`,
    /// `.data.name`, `{.metadata.team}`); numbers sort as numbers
    #[arg(long, value_name = "JSONPATH", value_parser = parse_sort_by)]
    pub sort_by: Option<crate::jsonpath::JsonPath>,
    /// After listing, watch for changes (as `resctl watch`)
    #[arg(short = 'w', long, conflicts_with_all = ["name", "sort_by"])]
    pub watch: bool,
    /// The object as it was at this version, from its history (the last version at or
    /// before it)
    #[arg(
        long,
        value_name = "VERSION",
        requires = "name",
        conflicts_with = "watch"
    )]
    pub at: Option<String>,
}

#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// Type as group.version.Kind or a unique kind
    #[arg(value_name = "TYPE", required_unless_present = "files")]
    pub resource_type: Option<String>,
    /// Names of resources to delete
    #[arg(requires = "resource_type")]
    pub names: Vec<String>,
    /// Delete every resource of the type whose metadata matches (asks first; --yes when not
    /// interactive)
    #[arg(
        short = 'l',
        long,
        value_name = "SELECTOR",
        value_parser = parse_selector,
        requires = "resource_type",
        conflicts_with_all = ["names", "files", "all"]
    )]
    pub selector: Option<String>,
    /// Delete every resource of the type in the namespace (-A: everywhere); asks first
    #[arg(long, requires = "resource_type", conflicts_with_all = ["names", "files"])]
    pub all: bool,
    /// With -l or --all: every partition and namespace
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// With -l or --all: delete without asking
    #[arg(long)]
    pub yes: bool,
    /// Delete what these YAML files or directories describe
    #[arg(
        short,
        long = "filename",
        value_name = "PATH",
        conflicts_with = "resource_type"
    )]
    pub files: Vec<PathBuf>,
    /// Wait until the resources and everything they own are gone
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits before reporting what blocks the deletion
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Args)]
pub struct LabelArgs {
    /// Type as group.version.Kind or a unique kind
    #[arg(value_name = "TYPE")]
    pub resource_type: String,
    /// Name of the resource
    pub name: String,
    /// `key=value` to set, `key-` to remove
    #[arg(value_name = "CHANGE", required = true, value_parser = parse_label_change)]
    pub changes: Vec<LabelChange>,
    /// Change the value of a key that is set already
    #[arg(long)]
    pub overwrite: bool,
}

/// One change of `resctl label`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelChange {
    Set(String, String),
    Remove(String),
}

/// `key=value` or `key-`; the key as a selector would name it (no reserved keys).
pub fn parse_label_change(text: &str) -> Result<LabelChange, String> {
    let (key, change) = match (text.split_once('='), text.strip_suffix('-')) {
        (Some((key, value)), _) => (key, LabelChange::Set(key.to_owned(), value.to_owned())),
        (None, Some(key)) => (key, LabelChange::Remove(key.to_owned())),
        (None, None) => {
            return Err(format!(
                "{text:?} is neither key=value (to set) nor key- (to remove)"
            ));
        }
    };
    // The key and value must be what a selector can name.
    let probe = match &change {
        LabelChange::Set(key, value) => format!("{key}={value}"),
        LabelChange::Remove(key) => key.clone(),
    };
    proto::selector::Selector::parse(&probe)
        .map_err(|error| format!("{text:?}: {} (key {key:?})", error.message))?;
    Ok(change)
}

/// A `--sort-by` path.
pub fn parse_sort_by(text: &str) -> Result<crate::jsonpath::JsonPath, String> {
    text.parse()
        .map_err(|error: crate::jsonpath::JsonPathError| error.to_string())
}

#[derive(Debug, Args)]
pub struct NamedArgs {
    /// Type as group.version.Kind or a unique kind
    #[arg(value_name = "TYPE")]
    pub resource_type: String,
    pub name: String,
}

#[derive(Debug, Args)]
pub struct WaitArgs {
    /// Type as group.version.Kind or a kind
    #[arg(value_name = "TYPE")]
    pub resource_type: String,
    pub name: String,
    /// What to wait for: `condition=TYPE` (True), `condition=TYPE=True|False|Unknown`, or `delete`
    #[arg(long = "for", value_name = "CONDITION")]
    pub wait_for: String,
    /// How long to wait (e.g. 30s, 5m)
    #[arg(long, default_value = "30s", value_name = "DURATION")]
    pub timeout: String,
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Check a proposed admission policy (a policy.v1.AdmissionPolicy document) against every
    /// stored object it matches: which it would refuse and why; nothing changes (exit 0 when
    /// none, 1 otherwise)
    #[command(
        after_help = "Examples:\n  resctl policy plan -f fixtures/policy/modern-albums.yaml\n  resctl policy plan -f policy.yaml -o json"
    )]
    Plan(PolicyPlanArgs),
}

#[derive(Debug, Args)]
pub struct PolicyPlanArgs {
    /// The YAML file holding the proposed policy
    #[arg(short, long = "filename", value_name = "PATH")]
    pub file: PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum AuthCommand {
    /// Whether the token may do VERB on TYPE [NAME] (prints yes or no and the rule that decided;
    /// exit 0 yes, 1 no)
    #[command(
        name = "can-i",
        after_help = "Examples:\n  resctl auth can-i write demo.v2.Artist miles-davis -n jazz\n  resctl auth can-i list Album -n jazz\n  resctl auth can-i delete registry.v1.Type payments-invoice --as team-a\n\nVerbs: read, list, write, delete, watch (get, create, update and patch are aliases).\n--as asks for another token by its accessor: the caller's token needs acl read.\n\nExit status:\n  0  yes\n  1  no\n  2  an error (an unknown type or token, an unreachable server)"
    )]
    CanI(CanIArgs),
}

#[derive(Debug, Args)]
pub struct CanIArgs {
    /// read, list, write, delete or watch
    pub verb: String,
    /// Type as group.version.Kind or a unique kind
    #[arg(value_name = "TYPE")]
    pub resource_type: String,
    /// The object (read, write, delete); none for list and watch
    pub name: Option<String>,
    /// Answer for the token with this accessor instead of the caller's (needs acl read)
    #[arg(long = "as", value_name = "TOKEN_NAME")]
    pub as_token: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum AclCommand {
    /// Create the management token (once per cluster) and print its secret
    Bootstrap,
    /// The accessor, policies and expiry of the token in use
    Whoami,
    /// Create, list and delete tokens (policies are YAML applied with `resctl apply`)
    #[command(subcommand)]
    Token(AclTokenCommand),
    /// List the policies
    Policies,
}

#[derive(Debug, Subcommand)]
pub enum AclTokenCommand {
    /// Create a token bound to policies and print its secret (shown only now)
    Create(TokenCreateArgs),
    /// Every token: accessor, policies, expiry (never secrets)
    List,
    /// Delete a token: requests and watches using it are refused from then on
    Delete {
        /// The token's accessor (its name)
        name: String,
    },
}

#[derive(Debug, Args)]
pub struct TokenCreateArgs {
    /// The token's accessor: its resource name, shown in `acl whoami` and in audit records
    pub name: String,
    /// A policy the token gets (repeatable; `global-management` allows everything)
    #[arg(long = "policy", required = true, value_name = "POLICY")]
    pub policies: Vec<String>,
    /// Expire the token after this long (e.g. 30m, 12h, 7d)
    #[arg(long, value_name = "DURATION")]
    pub expires_in: Option<String>,
    /// What the token is for
    #[arg(long, default_value = "")]
    pub description: String,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Type as group.version.Kind or a unique kind
    #[arg(value_name = "TYPE")]
    pub resource_type: String,
    /// Only names starting with this prefix
    pub name_prefix: Option<String>,
    /// Resume after this version (the `version` of an earlier event) instead of listing first
    #[arg(long, value_name = "VERSION")]
    pub from_version: Option<String>,
    /// Only resources whose metadata matches (k=v, k!=v, k in (a,b), k notin (a,b), k, !k;
    /// comma = and); one that stops matching is shown as deleted
    #[arg(short = 'l', long, value_name = "SELECTOR", value_parser = parse_selector)]
    pub selector: Option<String>,
    /// Watch every partition and namespace
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Stop after this many events (the initial listing counts)
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Show who made each change: a token's accessor, or controller/<name>
    #[arg(long)]
    pub show_actor: bool,
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Raft state of the connected server
    Status,
    /// Every member with role, match index and lag
    Members,
    /// Add a server (it must be running, started without --bootstrap)
    Join(JoinArgs),
    /// Remove a server from the cluster
    Remove(RemoveArgs),
    /// Hand leadership to another voter (once it holds the whole log); singleton controllers follow
    TransferLeader(TransferLeaderArgs),
}

#[derive(Debug, Args)]
pub struct TransferLeaderArgs {
    /// The voter to lead [default: the reachable voter holding the most of the log]
    #[arg(long, value_name = "NODE_ID")]
    pub to: Option<u64>,
}

#[derive(Debug, Args)]
pub struct JoinArgs {
    #[arg(long)]
    pub node_id: u64,
    /// The new server's client address (HOST:PORT)
    #[arg(long)]
    pub api_addr: String,
    /// The new server's raft address (HOST:PORT)
    #[arg(long)]
    pub raft_addr: String,
}

#[derive(Debug, Args)]
pub struct RemoveArgs {
    pub node_id: u64,
    /// Remove even if fewer reachable voters than a quorum would remain (the cluster may stop
    /// taking writes until the members come back)
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Subcommand)]
pub enum TypeCommand {
    /// Check a proposed Type (a registry.v1.Type document) against every stored object of its
    /// kind: each version's rules, defaults and conversions; nothing changes (exit 0 when nothing
    /// would fail, 1 otherwise)
    #[command(
        after_help = "Examples:\n  resctl type plan -f database-type.yaml\n  resctl type plan -f database-type.yaml -o json"
    )]
    Plan(TypePlanArgs),
}

#[derive(Debug, Args)]
pub struct TypePlanArgs {
    /// The YAML file holding the proposed Type
    #[arg(short, long = "filename", value_name = "PATH")]
    pub file: PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Save a consistent snapshot of the cluster to FILE (verified before it is renamed)
    Save(SnapshotFileArgs),
    /// Show a snapshot file's header and what it holds per type and tenancy
    Inspect(SnapshotFileArgs),
    /// Replace the cluster's state with a snapshot file
    Restore(RestoreArgs),
}

#[derive(Debug, Args)]
pub struct SnapshotFileArgs {
    pub file: PathBuf,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    pub file: PathBuf,
    /// Do not ask for confirmation
    #[arg(short, long)]
    pub yes: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// Blind writes of new and existing resources
    Write,
    /// Read-modify-write with compare-and-swap, retrying conflicts
    Cas,
    /// Reads of existing resources
    Read,
    /// Writes while a watch measures write-to-event latency
    Watch,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[arg(long, value_enum, default_value_t = Workload::Write)]
    pub workload: Workload,
    /// Requests in flight at once
    #[arg(short, long, default_value_t = 16)]
    pub concurrency: usize,
    /// Operations in total
    #[arg(short = 'N', long, default_value_t = 10_000)]
    pub count: u64,
    /// Bytes of payload in each resource
    #[arg(long, default_value_t = 256)]
    pub value_size: usize,
    /// Distinct resources the workload touches
    #[arg(long, default_value_t = 1_000)]
    pub keys: u64,
    /// Namespace-scoped type to write (its data needs a `name` and a `description` string)
    #[arg(long = "type", default_value = "demo.v1.Artist", value_name = "TYPE")]
    pub resource_type: String,
    /// Watches the watch workload opens on the written type (each sees every write, or with
    /// --watch-groups its group's)
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub watchers: usize,
    /// Of the watches, how many never read an event after their opening listing (a stalled
    /// consumer of every write; they use connections of their own)
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub stalled: usize,
    /// Groups the watch workload spreads its writes (label `bench-group=KEY % G`) and its
    /// watches (selector `bench-group=INDEX % G`) over: each write reaches 1/G of the watches
    #[arg(long, default_value_t = 1, value_name = "G")]
    pub watch_groups: u64,
    /// Keep the resources the benchmark wrote (by default they are deleted when it ends)
    #[arg(long)]
    pub keep: bool,
    /// Delete what the benchmark wrote: the default now, accepted for older scripts
    #[arg(long, hide = true, conflicts_with = "keep")]
    pub cleanup: bool,
}

#[derive(Debug, Subcommand)]
pub enum ContextCommand {
    /// List contexts; the current one is starred
    List,
    /// Make NAME the current context
    Use { name: String },
    /// Create or update a context
    Set(SetContextArgs),
    /// Delete a context
    Remove { name: String },
}

#[derive(Debug, Args)]
pub struct SetContextArgs {
    pub name: String,
    /// Server of the context
    #[arg(id = "to_server", long = "to-server", value_name = "HOST:PORT")]
    pub server: Option<String>,
    /// ACL token of the context (stored in the file, readable by you only)
    #[arg(id = "to_token", long = "to-token", value_name = "TOKEN")]
    pub token: Option<String>,
    /// Default partition of the context
    #[arg(id = "to_partition", long = "to-partition", value_name = "PARTITION")]
    pub partition: Option<String>,
    /// Default namespace of the context
    #[arg(id = "to_namespace", long = "to-namespace", value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// CA certificate the context's servers are checked against (turns TLS on)
    #[arg(id = "to_ca_cert", long = "to-ca-cert", value_name = "FILE")]
    pub ca_cert: Option<String>,
    /// Client certificate to present to the context's servers
    #[arg(id = "to_client_cert", long = "to-client-cert", value_name = "FILE")]
    pub client_cert: Option<String>,
    /// Private key of that client certificate
    #[arg(id = "to_client_key", long = "to-client-key", value_name = "FILE")]
    pub client_key: Option<String>,
    /// How long each call may take with this context (`10s`, `2m`)
    #[arg(
        id = "to_request_timeout",
        long = "to-request-timeout",
        value_name = "DURATION"
    )]
    pub request_timeout: Option<String>,
}

#[derive(Debug, Args)]
pub struct TuiArgs {
    /// Type to open on (a kind such as Executive, or group.version.Kind)
    #[arg(value_name = "TYPE")]
    pub resource_type: Option<String>,
    /// Seconds between refreshes of the cluster and controller views (resources are live)
    #[arg(long, default_value_t = 2.0, value_name = "SECONDS")]
    pub refresh: f64,
}

const TUI_HELP: &str = "\
Keys: ? lists every key. 1-6 switch screens (types, resources, cluster, controllers, events,
snapshot); enter opens; e edits in $EDITOR; d deletes (asks first); o shows the owner tree;
w explains what holds a resource being deleted; : jumps to a type; / filters; q quits.

Examples:
  resctl tui
  resctl tui Executive
  resctl --server 127.0.0.1:8503 -n jazz tui demo.v2.Album";

#[derive(Debug, Clone, Args)]
pub struct CompletionArgs {
    pub shell: clap_complete::Shell,
}

/// Checks a selector here, before any call, and keeps it in its canonical form.
pub fn parse_selector(text: &str) -> Result<String, String> {
    proto::selector::Selector::parse(text)
        .map(|selector| selector.to_string())
        .map_err(|error| format!("{error} (in {text:?})"))
}

/// Parses `500ms`, `30s`, `5m`, `1h`, or plain seconds.
pub use proto::client::connect::parse_duration;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}

/// The (type, name) pairs of `delete`'s arguments: `TYPE NAME…`, or `TYPE/NAME…` (what
/// `get -o name` prints), not both.
pub fn typed_names<'a>(
    first: &'a str,
    rest: &'a [String],
) -> Result<Vec<(&'a str, &'a str)>, crate::UsageError> {
    let slashed = |arg: &'a str| -> Result<(&'a str, &'a str), crate::UsageError> {
        match arg.split_once('/') {
            Some((type_name, name)) if !type_name.is_empty() && !name.is_empty() => {
                Ok((type_name, name))
            }
            _ => Err(crate::UsageError(format!(
                "{arg:?} is not TYPE/NAME: give TYPE NAME… or TYPE/NAME… (as `get -o name` prints)"
            ))),
        }
    };
    if first.contains('/') {
        return std::iter::once(first)
            .chain(rest.iter().map(String::as_str))
            .map(slashed)
            .collect();
    }
    if rest.is_empty() {
        return Err(crate::UsageError(format!(
            "delete needs the name of the {first} to delete"
        )));
    }
    rest.iter()
        .map(|name| {
            if name.contains('/') {
                Err(crate::UsageError(format!(
                    "{name:?} is not a name: give TYPE NAME… or TYPE/NAME…, not both"
                )))
            } else {
                Ok((first, name.as_str()))
            }
        })
        .collect()
}

#[cfg(test)]
mod typed_names_tests {
    #[test]
    fn delete_takes_type_and_names_or_what_get_o_name_prints() {
        let names = vec!["a".to_owned(), "b".to_owned()];
        assert_eq!(
            super::typed_names("Artist", &names).expect("TYPE NAME…"),
            vec![("Artist", "a"), ("Artist", "b")]
        );
        let slashed = vec!["demo.v1.Album/y".to_owned()];
        assert_eq!(
            super::typed_names("demo.v1.Artist/x", &slashed).expect("TYPE/NAME…"),
            vec![("demo.v1.Artist", "x"), ("demo.v1.Album", "y")]
        );
        assert!(super::typed_names("Artist", &slashed).is_err(), "not both");
        assert!(
            super::typed_names("Artist", &[]).is_err(),
            "a name is needed"
        );
        assert!(super::typed_names("demo.v1.Artist/", &[]).is_err());
    }
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// A type (Kind, or group.version.Kind), then field names: `Invoice.lines.cents`
    pub path: String,
}
