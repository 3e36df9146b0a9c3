//! `resctl cluster status|members|join|remove`.

use proto::client::describe;
use proto::cluster::v1::JoinRequest;
use serde::Serialize;

use crate::cli::ClusterCommand;
use crate::output::{self, OutputFormat, Table};
use crate::session::Session;

#[derive(Debug, Clone, Serialize)]
pub struct StatusView {
    pub cluster_name: String,
    pub node_id: u64,
    pub api_addr: String,
    pub raft_addr: String,
    pub role: String,
    pub term: u64,
    pub leader_id: u64,
    pub leader_api_addr: String,
    pub commit_index: u64,
    pub applied_index: u64,
    pub last_log_index: u64,
    pub snapshot_index: u64,
    pub storage: String,
    /// Whether the node serves reads now, and why not.
    pub ready: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub not_ready_reason: String,
    /// Resource writes applied per second over the last 10 s.
    pub write_rate: f64,
    /// 99th percentile time to apply committed entries over the last 10 s (ms).
    pub apply_p99_ms: f64,
    /// Writes applied in each of the last 60 s, oldest first.
    pub writes_per_second: Vec<u64>,
    /// Bytes free on the disk holding the node's data directory.
    pub disk_free_bytes: u64,
    /// What the node refuses now and why (e.g. new writes, with the disk under its reserve).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub alarms: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MemberView {
    pub node_id: u64,
    pub api_addr: String,
    pub raft_addr: String,
    pub role: String,
    pub match_index: u64,
    /// Entries behind the leader; `None` when the leader has not heard from it recently.
    pub lag: Option<u64>,
    pub reachable: bool,
}

pub async fn status(session: &Session) -> anyhow::Result<StatusView> {
    let status = session.client.status().await?;
    Ok(StatusView {
        cluster_name: status.cluster_name,
        node_id: status.node_id,
        api_addr: status.api_addr,
        raft_addr: status.raft_addr,
        role: describe::role_label(status.role).to_owned(),
        term: status.term,
        leader_id: status.leader_id,
        leader_api_addr: status.leader_api_addr,
        commit_index: status.commit_index,
        applied_index: status.applied_index,
        last_log_index: status.last_log_index,
        snapshot_index: status.snapshot_index,
        storage: status.storage,
        ready: status.ready,
        not_ready_reason: status.not_ready_reason,
        write_rate: status.write_rate,
        apply_p99_ms: status.apply_p99_ms,
        writes_per_second: status.writes_per_second,
        disk_free_bytes: status.disk_free_bytes,
        alarms: status.alarms,
    })
}

pub async fn members(session: &Session) -> anyhow::Result<Vec<MemberView>> {
    let members = session.client.members().await?;
    if members.no_leader {
        crate::say!(
            "no leader answers: this is node {}'s own view of the members (no matches, lags or reachability); the cluster may have lost its quorum — `resctl cluster status` on each node says what it sees",
            members.answered_by
        );
    }
    Ok(members
        .members
        .into_iter()
        .map(|member| MemberView {
            // The membership role, as the dashboard names it: scripts read `"role": "voter"`
            // (the bench harness does).
            role: describe::member_role(member.leader, member.voter, None),
            node_id: member.node_id,
            api_addr: member.api_addr,
            raft_addr: member.raft_addr,
            match_index: member.match_index,
            lag: member.lag,
            reachable: member.reachable,
        })
        .collect())
}

pub async fn run(session: &Session, command: ClusterCommand) -> anyhow::Result<u8> {
    let text = match command {
        ClusterCommand::Status => {
            let view = status(session).await?;
            match session.output {
                OutputFormat::Json | OutputFormat::JsonPath => output::json(&view)?,
                OutputFormat::Yaml => output::yaml(&view)?,
                OutputFormat::Name => format!("node-{}\n", view.node_id),
                _ => {
                    let mut table = Table::new(["FIELD", "VALUE"]);
                    let leader = if view.leader_id == 0 {
                        "none (election in progress?)".to_owned()
                    } else {
                        format!("node {} at {}", view.leader_id, view.leader_api_addr)
                    };
                    for (field, value) in [
                        ("cluster", view.cluster_name.clone()),
                        ("node", format!("{} ({})", view.node_id, view.role)),
                        (
                            "serving",
                            if view.ready {
                                "yes".to_owned()
                            } else {
                                format!("no: {}", view.not_ready_reason)
                            },
                        ),
                        ("api address", view.api_addr.clone()),
                        ("raft address", view.raft_addr.clone()),
                        ("leader", leader),
                        ("term", view.term.to_string()),
                        ("commit index", view.commit_index.to_string()),
                        ("applied index", view.applied_index.to_string()),
                        ("last log index", view.last_log_index.to_string()),
                        ("snapshot index", view.snapshot_index.to_string()),
                        ("storage", view.storage.clone()),
                        (
                            "writes",
                            describe::activity_label(view.write_rate, view.apply_p99_ms),
                        ),
                        (
                            "writes (60 s)",
                            describe::sparkline(&view.writes_per_second),
                        ),
                        ("disk free", describe::bytes_label(view.disk_free_bytes)),
                    ] {
                        table.row([field.to_owned(), value]);
                    }
                    for alarm in &view.alarms {
                        table.row(["alarm".to_owned(), alarm.clone()]);
                    }
                    table.render()
                }
            }
        }
        ClusterCommand::Members => {
            let members = members(session).await?;
            match session.output {
                OutputFormat::Json | OutputFormat::JsonPath => output::json(&members)?,
                OutputFormat::Yaml => output::yaml(&members)?,
                OutputFormat::Name => members
                    .iter()
                    .map(|m| format!("node-{}\n", m.node_id))
                    .collect(),
                _ => {
                    let mut table =
                        Table::new(["NODE", "ROLE", "API", "RAFT", "MATCH", "LAG", "REACHABLE"]);
                    for member in &members {
                        table.row([
                            member.node_id.to_string(),
                            member.role.clone(),
                            member.api_addr.clone(),
                            member.raft_addr.clone(),
                            member.match_index.to_string(),
                            member
                                .lag
                                .map_or_else(|| "unknown".to_owned(), |lag| lag.to_string()),
                            if member.reachable { "yes" } else { "NO" }.to_owned(),
                        ]);
                    }
                    table.render()
                }
            }
        }
        ClusterCommand::Join(args) => {
            let response = session
                .client
                .join(JoinRequest {
                    node_id: args.node_id,
                    api_addr: args.api_addr.clone(),
                    raft_addr: args.raft_addr.clone(),
                    // On the node's behalf: a removed id is refused (the node must join itself).
                    from_node: false,
                })
                .await?;
            format!(
                "node {} joined (leader: node {})\n",
                args.node_id, response.leader_id
            )
        }
        ClusterCommand::TransferLeader(args) => {
            let leader = session.client.transfer_leader(args.to.unwrap_or(0)).await?;
            format!("node {leader} leads now\n")
        }
        ClusterCommand::Remove(args) => {
            session.client.remove(args.node_id, args.force).await?;
            format!("node {} removed\n", args.node_id)
        }
    };
    output::print(&text)?;
    Ok(0)
}
