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
    let mut client = client_of(dialer, target, None, target).await?;
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
        client = leader_client(dialer, leader_id, &api_addr).await?;
    }
    let leader = match client.join(with_token(token, request.clone())).await {
        Ok(response) => response.into_inner().leader_id,
        // Leadership moved since the members were listed: the answer names the new leader.
        Err(status) => match moved_to(&status) {
            Some((leader_id, api_addr)) => {
                tracing::info!(leader_id, %api_addr, "the leader moved; joining through it");
                leader_client(dialer, leader_id, &api_addr)
                    .await?
                    .join(with_token(token, request))
                    .await
                    .map_err(|status| refused(&api_addr, &status))?
                    .into_inner()
                    .leader_id
            }
            None => return Err(refused(target, &status)),
        },
    };
    tracing::info!(leader, "joined the cluster");
    Ok(())
}

/// The leader a refusal names (`NOT_LEADER`'s `leader_id` and `leader_addr`), if it names one.
fn moved_to(status: &tonic::Status) -> Option<(u64, String)> {
    let details = proto::reason::of(status)?;
    if details.reason != proto::reason::Reason::NotLeader || !details.reason.fits(status.code()) {
        return None;
    }
    let id = details.metadata.get("leader_id")?.parse().ok()?;
    let addr = details.metadata.get("leader_addr")?;
    (!addr.is_empty()).then(|| (id, addr.clone()))
}

fn refused(target: &str, status: &tonic::Status) -> String {
    format!("{target} refused the join: {}", status.message())
}

async fn leader_client(
    dialer: &Dialer,
    leader_id: u64,
    api_addr: &str,
) -> Result<ClusterServiceClient<tonic::transport::Channel>, String> {
    let what = format!("the leader, node {leader_id} at {api_addr}");
    client_of(dialer, api_addr, Some(leader_id), &what).await
}

/// A client of the member at `addr` (`node`, when known, is the certificate's name to expect);
/// `what` names it in the error.
async fn client_of(
    dialer: &Dialer,
    addr: &str,
    node: Option<u64>,
    what: &str,
) -> Result<ClusterServiceClient<tonic::transport::Channel>, String> {
    let channel = dialer
        .endpoint(addr, node)?
        .connect()
        .await
        .map_err(|error| {
            format!(
                "cannot reach {what}: {}",
                crate::tls::describe_connect_error(&error)
            )
        })?;
    Ok(ClusterServiceClient::new(channel))
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

#[cfg(test)]
mod tests {
    use proto::reason::{Details, Reason, attach};

    use super::*;

    /// A joiner follows the leader a refusal names as data (what `service::Error::NotLeader`
    /// sends), whatever the message says; any other refusal, or the reason under a code it does
    /// not fit, names no leader.
    #[test]
    fn a_join_follows_the_leader_named_by_the_reason_alone() {
        let not_leader = Details::new(Reason::NotLeader)
            .with("leader_id", 3)
            .with("leader_addr", "127.0.0.1:7003");
        let noise = attach(tonic::Code::FailedPrecondition, "zq#x noise", &not_leader);
        assert_eq!(moved_to(&noise), Some((3, "127.0.0.1:7003".to_owned())));
        let words = attach(
            tonic::Code::FailedPrecondition,
            "node 2 is not the leader: node 3 at 127.0.0.1:7003",
            &Details::new(Reason::FailedPrecondition),
        );
        assert_eq!(moved_to(&words), None);
        let misplaced = attach(tonic::Code::Unavailable, "x", &not_leader);
        assert_eq!(moved_to(&misplaced), None);
    }
}
