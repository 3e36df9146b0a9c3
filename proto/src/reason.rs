//! Reasons as data (DESIGN §3, "Errors"): every error a client may act on carries, beside its
//! gRPC code and its message for people, a `google.rpc.ErrorInfo { reason, domain: "resd",
//! metadata }` in the status details (the `grpc-status-details-bin` trailer, encoded as a
//! `google.rpc.Status`), and invalid requests a `google.rpc.BadRequest` with the field.
//! Clients decide on [`Reason`] alone; rewording a message changes nothing but the text.
//!
//! [`attach`] is what the server's one mapping of its errors to statuses calls; [`of`] is the
//! client's one decode.

use std::collections::BTreeMap;

use crate::google::rpc::{BadRequest, ErrorInfo, Status as RpcStatus, bad_request};

/// The `domain` of resd's reasons.
pub const DOMAIN: &str = "resd";

macro_rules! reasons {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)*) => {
        /// Why a call failed, as a client decides on it. Sent as `ErrorInfo.reason`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Reason {
            $($(#[$doc])* $variant,)*
        }

        impl Reason {
            /// Every reason, in the order of the catalog.
            pub const ALL: &'static [Reason] = &[$(Reason::$variant,)*];

            /// The wire name (`UPPER_SNAKE_CASE`).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Reason::$variant => $name,)*
                }
            }

            /// The reason of a wire name; `None` for one this client does not know (a newer
            /// server's): decide on the code then.
            pub fn parse(name: &str) -> Option<Reason> {
                match name {
                    $($name => Some(Reason::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

reasons! {
    /// The request is malformed; `BadRequest` names the field.
    Invalid = "INVALID",
    /// An admission policy (DESIGN §17) refused the write: metadata `policy`; the message
    /// says the policy's message.
    AdmissionDenied = "ADMISSION_DENIED",
    /// A rule of the resource's type ran out of its cost budget on this resource (DESIGN §15):
    /// the data is too large for the rule; retrying the same write fails the same way.
    RuleCost = "RULE_COST",
    NotFound = "NOT_FOUND",
    /// The request's partition or namespace does not exist (yet).
    TenancyNotFound = "TENANCY_NOT_FOUND",
    /// A compare-and-swap lost: the resource changed since the given version was read.
    CasConflict = "CAS_CONFLICT",
    /// The id's uid is not the stored resource's (it was deleted and created again, or
    /// someone else created it first).
    UidMismatch = "UID_MISMATCH",
    AlreadyExists = "ALREADY_EXISTS",
    /// The system is not in the state the call needs (ACLs off, already bootstrapped…).
    FailedPrecondition = "FAILED_PRECONDITION",
    /// The resource's registered Type is being deleted: nothing new of it is accepted.
    TypeBeingDeleted = "TYPE_BEING_DELETED",
    /// The Type the change was checked against changed before the change could be stored
    /// (DESIGN §15's fence); nothing changed. The server checks such a change again and retries
    /// it itself: a client sees this only when that kept failing until its deadline. Retry.
    SchemaChanged = "SCHEMA_CHANGED",
    /// The ACL tokens or policies the change was authorized under changed before it could be
    /// stored; nothing changed (retried by the server as `SCHEMA_CHANGED`).
    AclChanged = "ACL_CHANGED",
    /// A write sent under a lease (`x-resd-fence`, DESIGN §16) whose lease no longer exists or
    /// changed hands since: its writer no longer holds it. Nothing changed; final — the writer
    /// stops and campaigns again, it does not retry.
    Fenced = "FENCED",
    /// Only the leader can answer this call, and this node does not lead (metadata `leader_id`
    /// and `leader_addr`, its API address, when known): ask the leader.
    NotLeader = "NOT_LEADER",
    PermissionDenied = "PERMISSION_DENIED",
    Unauthenticated = "UNAUTHENTICATED",
    /// The cluster has no leader, or the leader cannot commit (no quorum): wait, or bring a
    /// majority back.
    NoQuorum = "NO_QUORUM",
    /// This node serves nothing yet: it is catching up after an unclean stop (metadata
    /// `applied`, and `target` when known). Another member can answer.
    CatchingUp = "CATCHING_UP",
    /// This node is shutting down. Another member can answer.
    ShuttingDown = "SHUTTING_DOWN",
    /// This node was removed from the cluster. Another member can answer.
    Removed = "REMOVED",
    /// This node found its stored state damaged and serves nothing from it. Another member can
    /// answer.
    Damaged = "DAMAGED",
    /// A change of membership gave up and undid itself: nothing changed; trying again as it is
    /// fails the same way.
    MembershipUnchanged = "MEMBERSHIP_UNCHANGED",
    /// A change of membership is proposed but not committed (too few voters of the new
    /// configuration answer); it completes once they are back. Retrying does not help.
    MembershipPending = "MEMBERSHIP_PENDING",
    /// The server cannot serve this now, for a reason no other answers (a peer out of reach).
    Unavailable = "UNAVAILABLE",
    /// A watch cannot resume from the requested version: list again.
    ResumeUnavailable = "RESUME_UNAVAILABLE",
    /// A watch was ended by the server (it fell behind, a restore): watch again.
    WatchClosed = "WATCH_CLOSED",
    /// Over a limit (a size, a quota, the disk's reserve, a rate); the message names it.
    Quota = "QUOTA",
    /// A write would take a namespace or partition past a `tenancy.v1.Quota` (DESIGN §17);
    /// metadata `quota`, `key`, `limit`, `used`. Deletes are never refused.
    QuotaExceeded = "QUOTA_EXCEEDED",
    DeadlineExceeded = "DEADLINE_EXCEEDED",
    Internal = "INTERNAL",
}

impl Reason {
    /// Whether a status of `code` may carry this reason (the server's table sends each reason
    /// under one code, `TENANCY_NOT_FOUND` under two). Clients trust a reason only where it
    /// fits.
    pub fn fits(self, code: tonic::Code) -> bool {
        use tonic::Code;
        let expected: &[Code] = match self {
            Reason::Invalid | Reason::RuleCost | Reason::AdmissionDenied => {
                &[Code::InvalidArgument]
            }
            Reason::NotFound => &[Code::NotFound],
            Reason::TenancyNotFound => &[Code::NotFound, Code::InvalidArgument],
            Reason::CasConflict
            | Reason::WatchClosed
            | Reason::SchemaChanged
            | Reason::AclChanged => &[Code::Aborted],
            Reason::UidMismatch
            | Reason::FailedPrecondition
            | Reason::TypeBeingDeleted
            | Reason::Fenced
            | Reason::NotLeader
            | Reason::Removed => &[Code::FailedPrecondition],
            Reason::AlreadyExists => &[Code::AlreadyExists],
            Reason::PermissionDenied => &[Code::PermissionDenied],
            Reason::Unauthenticated => &[Code::Unauthenticated],
            Reason::NoQuorum
            | Reason::CatchingUp
            | Reason::ShuttingDown
            | Reason::Damaged
            | Reason::MembershipUnchanged
            | Reason::MembershipPending
            | Reason::Unavailable => &[Code::Unavailable],
            Reason::ResumeUnavailable => &[Code::OutOfRange],
            Reason::Quota | Reason::QuotaExceeded => &[Code::ResourceExhausted],
            Reason::DeadlineExceeded => &[Code::DeadlineExceeded],
            Reason::Internal => &[Code::Internal],
        };
        expected.contains(&code)
    }

    /// Whether another member of the cluster may serve what this one could not.
    pub fn another_member_may_answer(self) -> bool {
        matches!(
            self,
            Reason::CatchingUp
                | Reason::ShuttingDown
                | Reason::Removed
                | Reason::Damaged
                | Reason::NotLeader
        )
    }

    /// Whether waiting and trying the same call again may succeed.
    pub fn may_succeed_later(self) -> bool {
        matches!(
            self,
            Reason::NoQuorum
                | Reason::CatchingUp
                | Reason::ShuttingDown
                | Reason::Damaged
                | Reason::Unavailable
                | Reason::DeadlineExceeded
        )
    }
}

/// What a status says beside its code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Details {
    pub reason: Reason,
    pub metadata: BTreeMap<String, String>,
    /// (field, description) of an invalid request.
    pub field_violations: Vec<(String, String)>,
}

impl Details {
    pub fn new(reason: Reason) -> Details {
        Details {
            reason,
            metadata: BTreeMap::new(),
            field_violations: Vec::new(),
        }
    }

    pub fn with(mut self, key: &str, value: impl ToString) -> Details {
        self.metadata.insert(key.to_owned(), value.to_string());
        self
    }

    pub fn with_violation(mut self, field: &str, description: &str) -> Details {
        self.field_violations
            .push((field.to_owned(), description.to_owned()));
        self
    }
}

/// At most this many field violations, each described in at most this many bytes, travel in
/// the details: they ride in a trailer beside the message, and a client refuses header blocks
/// over 16 KiB (a message echoes the request's input, which may be long).
const MAX_VIOLATIONS: usize = 16;
const MAX_DETAIL_BYTES: usize = 512;

/// `text` cut to at most [`MAX_DETAIL_BYTES`] bytes, on a character boundary.
fn capped(text: &str) -> String {
    if text.len() <= MAX_DETAIL_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_DETAIL_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// A status with `details` attached (the code and message are kept; the details' copy of the
/// message and their descriptions are cut short, see [`MAX_DETAIL_BYTES`]).
pub fn attach(code: tonic::Code, message: impl Into<String>, details: &Details) -> tonic::Status {
    let message = message.into();
    let mut any = vec![crate::to_any(&ErrorInfo {
        reason: details.reason.as_str().to_owned(),
        domain: DOMAIN.to_owned(),
        metadata: details
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    })];
    if !details.field_violations.is_empty() {
        any.push(crate::to_any(&BadRequest {
            field_violations: details
                .field_violations
                .iter()
                .take(MAX_VIOLATIONS)
                .map(|(field, description)| bad_request::FieldViolation {
                    field: capped(field),
                    description: capped(description),
                })
                .collect(),
        }));
    }
    let body = RpcStatus {
        code: code as i32,
        message: capped(&message),
        details: any,
    };
    tonic::Status::with_details(code, message, prost::Message::encode_to_vec(&body).into())
}

/// The details a status carries, if a resd server attached them (`None` for a status built by
/// the transport, by another domain, or unreadable).
pub fn of(status: &tonic::Status) -> Option<Details> {
    if status.details().is_empty() {
        return None;
    }
    let body = <RpcStatus as prost::Message>::decode(status.details()).ok()?;
    let mut details: Option<Details> = None;
    let mut violations = Vec::new();
    for any in &body.details {
        if let Ok(Some(info)) = unpack::<ErrorInfo>(any) {
            if info.domain != DOMAIN {
                continue;
            }
            let Some(reason) = Reason::parse(&info.reason) else {
                continue;
            };
            details = Some(Details {
                reason,
                metadata: info.metadata.into_iter().collect(),
                field_violations: Vec::new(),
            });
        } else if let Ok(Some(bad)) = unpack::<BadRequest>(any) {
            violations.extend(
                bad.field_violations
                    .into_iter()
                    .map(|v| (v.field, v.description)),
            );
        }
    }
    details.map(|mut details| {
        details.field_violations = violations;
        details
    })
}

/// The message in `any` if it is an `M` (`None` if it is another message).
fn unpack<M: prost::Name + Default>(
    any: &prost_types::Any,
) -> Result<Option<M>, prost::DecodeError> {
    if any.type_url.rsplit('/').next() != Some(M::full_name().as_str()) {
        return Ok(None);
    }
    M::decode(any.value.as_slice()).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_round_trips_through_a_status() {
        for reason in Reason::ALL {
            let details = Details::new(*reason)
                .with("applied", 3)
                .with_violation("resource.id.name", "empty");
            let status = attach(tonic::Code::Unavailable, "for people", &details);
            assert_eq!(status.code(), tonic::Code::Unavailable);
            assert_eq!(status.message(), "for people");
            assert_eq!(of(&status), Some(details));
            assert_eq!(Reason::parse(reason.as_str()), Some(*reason));
        }
    }

    /// Details stay small whatever the message echoes: a long input does not make the status
    /// too large for a client to read.
    #[test]
    fn details_are_bounded_however_long_the_message() {
        let long = "é".repeat(10_000);
        let mut details = Details::new(Reason::Invalid);
        for n in 0..100 {
            details = details.with_violation(&format!("field{n}"), &long);
        }
        let status = attach(tonic::Code::InvalidArgument, long.clone(), &details);
        assert!(
            status.details().len() < 16 * 1024,
            "{}",
            status.details().len()
        );
        let read = of(&status).expect("details");
        assert_eq!(read.field_violations.len(), MAX_VIOLATIONS);
        assert_eq!(
            status.message(),
            long,
            "the message itself is the server's business"
        );
    }

    #[test]
    fn a_status_without_details_or_from_another_domain_has_no_reason() {
        assert_eq!(of(&tonic::Status::unavailable("transport error")), None);
        let body = RpcStatus {
            code: tonic::Code::Unavailable as i32,
            message: String::new(),
            details: vec![crate::to_any(&ErrorInfo {
                reason: "CATCHING_UP".into(),
                domain: "example.com".into(),
                metadata: Default::default(),
            })],
        };
        let foreign = tonic::Status::with_details(
            tonic::Code::Unavailable,
            "x",
            prost::Message::encode_to_vec(&body).into(),
        );
        assert_eq!(of(&foreign), None);
        let garbage =
            tonic::Status::with_details(tonic::Code::Unavailable, "x", vec![0xff, 0x01].into());
        assert_eq!(of(&garbage), None);
    }
}
