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
        ClientError::Conflict("version mismatch".into())
    );
    assert_eq!(
        decode(Code::NotFound, "no such resource"),
        ClientError::NotFound("no such resource".into())
    );
    assert_eq!(
        decode(Code::Unavailable, "no leader"),
        ClientError::Unavailable("no leader".into())
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
