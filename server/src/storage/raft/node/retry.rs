//! [`Retry`]: why a request must be tried again on the leader of now — the one typed outcome
//! the proposer, the forwarder and the read path share; its words reach people only when the
//! request's deadline passes.

use std::fmt;

use super::super::types::NodeId;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Retry {
    /// openraft says another node leads (`None`: none is known yet).
    LeaderMoved { to: Option<NodeId> },
    /// The round that confirms this node's leadership found it does not lead.
    NotLeader(String),
    /// The round that confirms leadership ended without an answer.
    RoundDropped,
    /// The leader has no known address.
    LeaderUnaddressed(NodeId),
    /// The leader stopped answering, and another leads now.
    LeaderSilent { was: NodeId, now: NodeId },
    /// The leader could not serve it now (no quorum there, or it is on its way out).
    LeaderRefused { leader: NodeId, why: String },
    /// The leader could not be reached.
    Unreachable {
        leader: NodeId,
        addr: String,
        why: String,
    },
}

impl fmt::Display for Retry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Retry::LeaderMoved { to: Some(to) } => write!(f, "leadership moved to node {to}"),
            Retry::LeaderMoved { to: None } => write!(f, "leadership moved; no leader known"),
            Retry::NotLeader(why) => write!(f, "not the leader: {why}"),
            Retry::RoundDropped => write!(f, "the leadership round was dropped"),
            Retry::LeaderUnaddressed(leader) => write!(f, "leader {leader} has no known address"),
            Retry::LeaderSilent { was, now } => {
                write!(f, "leader {was} stopped answering; node {now} leads now")
            }
            Retry::LeaderRefused { leader, why } => write!(f, "node {leader}: {why}"),
            Retry::Unreachable { leader, addr, why } => {
                write!(f, "forwarding to leader {leader} at {addr}: {why}")
            }
        }
    }
}
