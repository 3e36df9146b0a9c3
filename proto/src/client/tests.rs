//! Unit tests of the client's status decoding and configuration.

use tonic::Code;

use super::{Client, ClientConfig, ClientError};

fn decode(code: Code, message: &str) -> ClientError {
    ClientError::from_status("127.0.0.1:1", &tonic::Status::new(code, message))
}

#[test]
fn server_statuses_decode_to_their_kind() {
    assert_eq!(
        decode(Code::Aborted, "version mismatch"),
        ClientError::Conflict {
            reason: None,
            message: "version mismatch".into()
        }
    );
    assert_eq!(
        decode(Code::NotFound, "no such resource"),
        ClientError::NotFound {
            reason: None,
            message: "no such resource".into()
        }
    );
    assert_eq!(
        decode(Code::Unavailable, "no leader"),
        ClientError::Unavailable {
            reason: None,
            message: "no leader".into()
        }
    );
    assert!(decode(Code::Unavailable, "no leader").is_retryable());
    assert!(!decode(Code::InvalidArgument, "bad").is_retryable());
    assert_eq!(
        decode(Code::DataLoss, "oops"),
        ClientError::Other {
            code: Code::DataLoss,
            message: "oops".into()
        }
    );
}

#[test]
fn a_transport_failure_is_unreachable_and_names_the_server() {
    let error = decode(Code::Unavailable, "transport error");
    assert!(
        matches!(error, ClientError::Unreachable { .. }),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("127.0.0.1:1 unreachable"),
        "{error}"
    );
}

#[test]
fn an_invalid_server_address_is_rejected_with_the_expected_form() {
    let error = Client::new(ClientConfig::new("not a host:port")).unwrap_err();
    assert!(
        matches!(error, ClientError::InvalidServer { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("HOST:PORT"), "{error}");
}

#[tokio::test]
async fn a_server_that_is_not_listening_is_reported_unreachable_after_the_retry_budget() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    let mut config = ClientConfig::new(address.to_string());
    config.unreachable_retry = std::time::Duration::from_millis(300);
    let client = Client::new(config).unwrap();
    let error = client.status().await.unwrap_err();
    assert!(
        matches!(error, ClientError::Unreachable { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains(&address.to_string()), "{error}");
}

#[test]
fn empty_tokens_are_not_sent() {
    let config = ClientConfig::new("127.0.0.1:8502").with_token(Some(String::new()));
    assert_eq!(config.token, None);
}

/// Every decision the client makes on a server's answer — fail over to another member, stop
/// retrying, retry, hint at quorum — follows the reason alone: here the message is noise, and
/// the words that once drove failover, without a reason, drive nothing.
#[test]
fn client_decisions_follow_the_reason_and_never_the_message() {
    use crate::reason::{Details, Reason, attach};

    let answer = |code: Code, reason: Reason| {
        ClientError::from_status(
            "127.0.0.1:1",
            &attach(code, "zq#x noise", &Details::new(reason)),
        )
    };
    for reason in [Reason::CatchingUp, Reason::ShuttingDown, Reason::Damaged] {
        let error = answer(Code::Unavailable, reason);
        assert_eq!(error.reason(), Some(reason));
        assert!(
            super::moves_on(&error),
            "{reason:?} moves to another member"
        );
        assert!(!super::is_final(&error), "{reason:?} is not final");
    }
    for reason in [Reason::Removed, Reason::NotLeader] {
        let error = answer(Code::FailedPrecondition, reason);
        assert!(super::moves_on(&error), "{reason:?} sends the client on");
    }
    for reason in [Reason::MembershipUnchanged, Reason::MembershipPending] {
        let error = answer(Code::Unavailable, reason);
        assert!(super::is_final(&error), "{reason:?} is final");
        assert!(!super::moves_on(&error));
    }
    let no_quorum = answer(Code::Unavailable, Reason::NoQuorum);
    assert!(!super::moves_on(&no_quorum) && !super::is_final(&no_quorum));
    assert!(no_quorum.is_retryable());
    assert!(
        no_quorum.to_string().contains("majority of servers"),
        "{no_quorum}"
    );
    assert!(
        !answer(Code::Unavailable, Reason::Unavailable)
            .to_string()
            .contains("majority"),
        "the quorum hint only with NO_QUORUM"
    );

    // The old magic words, without a reason: no decision is taken on them.
    for words in [
        "this node is shutting down",
        "this node is catching up after an unclean stop",
        "membership is unchanged",
        "(changes of membership: not committed)",
        "no leader or quorum",
    ] {
        let error = decode(Code::Unavailable, words);
        assert!(!super::moves_on(&error), "{words:?}");
        assert!(!super::is_final(&error), "{words:?}");
        assert!(!error.to_string().contains("majority"), "{words:?}");
    }
    let removed_in_words = decode(
        Code::FailedPrecondition,
        "node 3 was removed from cluster c",
    );
    assert!(!super::moves_on(&removed_in_words));
}

/// A server (or anything in the middle) cannot send a client elsewhere with a reason its code
/// does not carry: REMOVED under INVALID_ARGUMENT is no reason at all.
#[test]
fn a_reason_under_a_code_it_does_not_fit_is_ignored() {
    use crate::reason::{Details, Reason, attach};

    let hostile = ClientError::from_status(
        "127.0.0.1:1",
        &attach(
            Code::InvalidArgument,
            "go away",
            &Details::new(Reason::Removed),
        ),
    );
    assert_eq!(hostile.reason(), None);
    assert!(!super::moves_on(&hostile));
    let hostile = ClientError::from_status(
        "127.0.0.1:1",
        &attach(
            Code::Unavailable,
            "stop",
            &Details::new(Reason::TypeBeingDeleted),
        ),
    );
    assert_eq!(hostile.reason(), None);
    assert!(!super::is_final(&hostile));
}

/// A status a server sent (it carries a reason) is never taken for a transport failure,
/// whatever its words: no failover because a message says "transport error".
#[test]
fn a_status_with_a_reason_is_never_a_transport_failure() {
    use crate::reason::{Details, Reason, attach};

    let error = ClientError::from_status(
        "127.0.0.1:1",
        &attach(
            Code::Unavailable,
            "cannot reach node 2: transport error",
            &Details::new(Reason::Unavailable),
        ),
    );
    assert!(
        matches!(error, ClientError::Unavailable { .. }),
        "{error:?}"
    );
}

/// Every answer of a server keeps its reason, whatever its code (a missing namespace is not a
/// missing resource; a lost compare-and-swap is not a closed watch).
#[test]
fn every_server_answer_keeps_its_reason() {
    use crate::reason::{Details, Reason, attach};

    for (code, reason) in [
        (Code::NotFound, Reason::TenancyNotFound),
        (Code::NotFound, Reason::NotFound),
        (Code::Aborted, Reason::CasConflict),
        (Code::Aborted, Reason::WatchClosed),
        (Code::PermissionDenied, Reason::PermissionDenied),
        (Code::Unauthenticated, Reason::Unauthenticated),
        (Code::OutOfRange, Reason::ResumeUnavailable),
        (Code::DeadlineExceeded, Reason::DeadlineExceeded),
        (Code::FailedPrecondition, Reason::UidMismatch),
        (Code::InvalidArgument, Reason::Invalid),
        (Code::Unavailable, Reason::NoQuorum),
    ] {
        let error =
            ClientError::from_status("127.0.0.1:1", &attach(code, "x", &Details::new(reason)));
        assert_eq!(
            error.reason(),
            Some(reason),
            "{code:?} {reason:?}: {error:?}"
        );
    }
}
