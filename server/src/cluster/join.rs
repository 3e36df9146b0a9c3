//! A new node asking a cluster to add it. It first learns the cluster's members from the node
//! it joins through, so that their raft RPCs are admitted before its own log names them (with
//! TLS the raft port admits members only), then asks the leader itself: with TLS the leader
//! checks the joiner's own certificate, which another member cannot pass on.

use proto::cluster::v1::cluster_service_client::ClusterServiceClient;
use proto::cluster::v1::{JoinRequest, MembersRequest};

use super::Peers;
use crate::storage::raft::node::RaftNode;
use crate::tls::Dialer;

/// One try at joining through `target`: `Ok` once this node is a voter (or was removed, and so
/// must not ask again), `Err` with why to try again.
pub(crate) async fn ask(
    node: &RaftNode,
    peers: &Peers,
    dialer: &Dialer,
    token: Option<&str>,
    target: &str,
) -> Result<(), String> {
    // A removed node stays out: its data still carries the removal, and asking to be added
    // again would make it a voter that serves nothing.
    if let Some(why) = node.removed() {
        tracing::warn!(
            "not joining the cluster: {why}; to serve again, join with an empty data directory"
        );
        return Ok(());
    }
    if node.is_voter(node.id()) {
        tracing::info!("this node is a voter of the cluster");
        return Ok(());
    }
    let request = JoinRequest {
        node_id: node.id(),
        api_addr: node.node().api_addr.clone(),
        raft_addr: node.node().raft_addr.clone(),
        // Checked above: this node's data carries no removal.
        from_node: true,
    };
    let channel = dialer
        .endpoint(target, None)?
        .connect()
        .await
        .map_err(|error| {
            format!(
                "cannot reach {target}: {}",
                crate::tls::describe_connect_error(&error)
            )
        })?;
    let mut client = ClusterServiceClient::new(channel);
    let members = client
        .members(with_token(token, MembersRequest {}))
        .await
        .map_err(|status| format!("{target} cannot list its members: {}", status.message()))?
        .into_inner();
    peers.expect(members.members.iter().map(|member| member.node_id));
    let leader_api = members
        .members
        .iter()
        .find(|member| member.leader)
        .map(|member| (member.node_id, member.api_addr.clone()));
    if let Some((leader_id, api_addr)) = leader_api
        && api_addr != target
    {
        let channel = dialer
            .endpoint(&api_addr, Some(leader_id))?
            .connect()
            .await
            .map_err(|error| {
                format!(
                    "cannot reach the leader, node {leader_id} at {api_addr}: {}",
                    crate::tls::describe_connect_error(&error)
                )
            })?;
        client = ClusterServiceClient::new(channel);
    }
    let leader = client
        .join(with_token(token, request))
        .await
        .map_err(|status| format!("{target} refused the join: {}", status.message()))?
        .into_inner()
        .leader_id;
    tracing::info!(leader, "joined the cluster");
    Ok(())
}

fn with_token<T>(token: Option<&str>, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token
        && let Ok(value) = tonic::metadata::MetadataValue::try_from(token)
    {
        request.metadata_mut().insert(proto::TOKEN_HEADER, value);
    }
    request
}
