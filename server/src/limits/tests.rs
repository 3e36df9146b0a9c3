//! Admission, budgets, rates and guarded bodies: what a caller may hold and what happens past it.

use std::net::IpAddr;
use std::sync::Arc;

use http_body_util::BodyExt as _;

use super::guard::{BodyRules, GuardError, GuardedBody};
use super::*;
use crate::acl::{AclsDisabled, KeyRules, StaticTokens};

const ATTACKER: Option<IpAddr> = Some(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 9)));

fn with_token(token: &str) -> http::HeaderMap {
    let mut headers = http::HeaderMap::new();
    headers.insert(proto::TOKEN_HEADER, token.parse().expect("ASCII"));
    headers
}

fn acl_limits(settings: LimitSettings) -> Arc<Limits> {
    Limits::new(
        settings,
        Arc::new(StaticTokens::new().with_token("tenant", KeyRules::default())),
    )
}

#[test]
fn a_budget_refuses_past_its_limit_and_takes_charges_back_when_dropped() {
    let budget = ByteBudget::new(100);
    let mut first = Charge::new(budget.clone());
    first.add(60).expect("room");
    let mut second = Charge::new(budget.clone());
    assert_eq!(second.add(50), Err(110));
    second.add(40).expect("room up to the limit");
    drop(first);
    assert_eq!(budget.used(), 40);
    drop(second);
    assert_eq!(budget.used(), 0);
    // One holder alone may pass the limit (a list growing past it), never with others.
    let mut large = Charge::new(budget.clone());
    large.add(500).expect("alone");
    large.add(500).expect("still alone");
    assert!(Charge::new(budget.clone()).add(1).is_err());
}

#[test]
fn an_unknown_token_counts_as_a_stranger_and_a_missing_one_is_anonymous() {
    let limits = acl_limits(LimitSettings::default());
    // The handler refuses it once this node has caught up (it may be a token acknowledged
    // elsewhere a moment ago); until then it gets a stranger's share.
    let stranger = limits
        .admit(&with_token("stolen"), ATTACKER, false)
        .expect("admitted as a stranger");
    assert_eq!(stranger.max_body, ANONYMOUS_BODY_BYTES);
    let ignored = limits
        .admit(&with_token("stolen"), ATTACKER, true)
        .expect("anonymous");
    assert_eq!(
        ignored.max_body, ANONYMOUS_BODY_BYTES,
        "bootstrap ignores the token"
    );
    let anonymous = limits
        .admit(&http::HeaderMap::new(), ATTACKER, false)
        .expect("admitted");
    assert_eq!(anonymous.max_body, ANONYMOUS_BODY_BYTES);
    let tenant = limits
        .admit(&with_token("tenant"), ATTACKER, false)
        .expect("ok");
    assert_eq!(tenant.max_body, LimitSettings::default().max_body_bytes);
    assert!(
        tenant.share.who().starts_with("token"),
        "{}",
        tenant.share.who()
    );
}

#[test]
fn a_token_past_its_rate_is_refused_with_when_to_retry_and_others_are_not() {
    let limits = acl_limits(LimitSettings {
        max_requests_per_second_per_token: 10,
        ..LimitSettings::default()
    });
    let admitted = (0..100)
        .filter(|_| limits.admit(&with_token("tenant"), ATTACKER, false).is_ok())
        .count();
    // The burst (twice the rate), and perhaps one more refilled meanwhile.
    assert!((20..=22).contains(&admitted), "{admitted} admitted");
    match limits.admit(&with_token("tenant"), ATTACKER, false) {
        Err(LimitError::Rate { retry_ms, .. }) => assert!(retry_ms <= 100, "{retry_ms}"),
        other => panic!("expected a rate refusal, got {other:?}"),
    }
    // Callers without a token are another identity.
    limits
        .admit(&http::HeaderMap::new(), ATTACKER, false)
        .expect("another identity's rate");
}

#[test]
fn watches_are_counted_per_identity_and_given_back_when_they_end() {
    let limits = acl_limits(LimitSettings {
        max_watches_per_token: 2,
        ..LimitSettings::default()
    });
    let admitted = limits
        .admit(&with_token("tenant"), ATTACKER, false)
        .expect("ok");
    let one = admitted.open_watch().expect("first");
    let _two = admitted.open_watch().expect("second");
    let third = admitted.open_watch().map(|_| ());
    assert!(
        matches!(third, Err(LimitError::Watches { open: 2, .. })),
        "{third:?}"
    );
    drop(one);
    admitted.open_watch().expect("room again once one ended");
}

#[test]
fn identities_stay_bounded_when_strangers_come_from_everywhere() {
    let limits = Limits::new(LimitSettings::default(), Arc::new(AclsDisabled));
    for i in 0..(IDENTITIES_REMEMBERED as u32 * 3) {
        let ip = IpAddr::from(i.to_be_bytes());
        drop(
            limits
                .admit(&http::HeaderMap::new(), Some(ip), false)
                .expect("ok"),
        );
    }
    let remembered = limits.identities.lock().map_or(usize::MAX, |m| m.len());
    assert!(remembered <= IDENTITIES_REMEMBERED, "{remembered}");
}

fn stalled_body(
    first: &'static [u8],
) -> impl http_body::Body<Data = bytes::Bytes, Error = std::convert::Infallible> + Unpin {
    let frames =
        futures::stream::iter([Ok(http_body::Frame::data(bytes::Bytes::from_static(first)))])
            .chain(futures::stream::pending());
    http_body_util::StreamBody::new(Box::pin(frames))
}

use futures::StreamExt as _;

#[tokio::test(start_paused = true)]
async fn a_body_that_stops_arriving_ends_at_its_deadline_and_gives_its_bytes_back() {
    let limits = acl_limits(LimitSettings::default());
    let admitted = limits
        .admit(&with_token("tenant"), ATTACKER, false)
        .expect("ok");
    let mut body = GuardedBody::new(
        stalled_body(b"12345"),
        admitted.clone(),
        BodyRules {
            deadline: Some(BODY_TIMEOUT),
            charged: true,
        },
    );
    let first = body.frame().await.expect("a frame").expect("data");
    assert_eq!(first.into_data().ok().as_deref(), Some(&b"12345"[..]));
    assert_eq!(limits.bodies().used(), 5);
    match body.frame().await {
        Some(Err(GuardError::Limit(LimitError::BodyTimeout(after)))) => {
            assert_eq!(after, BODY_TIMEOUT)
        }
        other => panic!(
            "expected the body deadline, got {:?}",
            other.map(|r| r.map(|_| ()))
        ),
    }
    assert_eq!(
        limits.bodies().used(),
        0,
        "the stalled body's bytes are released"
    );
}

#[tokio::test]
async fn a_body_over_what_a_caller_may_have_in_flight_is_ended() {
    let limits = acl_limits(LimitSettings::default());
    let anonymous = limits
        .admit(&http::HeaderMap::new(), ATTACKER, false)
        .expect("ok");
    static LARGE: [u8; ANONYMOUS_BODY_BYTES + 1] = [0; ANONYMOUS_BODY_BYTES + 1];
    let mut body = GuardedBody::new(
        stalled_body(&LARGE),
        anonymous,
        BodyRules {
            deadline: None,
            charged: true,
        },
    );
    match body.frame().await {
        Some(Err(GuardError::Limit(LimitError::AnonymousBody { .. }))) => {}
        other => panic!(
            "expected the anonymous cap, got {:?}",
            other.map(|r| r.map(|_| ()))
        ),
    }

    // A caller's share is a quarter of the node's budget (at least four requests at the size
    // limit): bodies past it are refused while the earlier ones are still arriving.
    let settings = LimitSettings {
        max_inflight_bytes: 64,
        max_body_bytes: 10,
        ..LimitSettings::default()
    };
    let limits = acl_limits(settings);
    let rules = BodyRules {
        deadline: None,
        charged: true,
    };
    let mut held = Vec::new();
    let mut refused = None;
    for _ in 0..8 {
        let admitted = limits
            .admit(&with_token("tenant"), ATTACKER, false)
            .expect("ok");
        let mut body = GuardedBody::new(stalled_body(b"0123456789"), admitted, rules);
        match body.frame().await {
            Some(Ok(_)) => held.push(body),
            Some(Err(GuardError::Limit(limit))) => {
                refused = Some(limit);
                break;
            }
            _ => panic!("unexpected end"),
        }
    }
    assert_eq!(held.len(), 4, "four bodies of ten bytes fit a share of 40");
    assert!(
        matches!(refused, Some(LimitError::CallerBytes { limit: 40, .. })),
        "{refused:?}"
    );
}

#[test]
fn requests_in_flight_are_capped_per_caller_until_their_answers_are_dropped() {
    let limits = acl_limits(LimitSettings::default());
    let admitted = limits
        .admit(&with_token("tenant"), ATTACKER, false)
        .expect("ok");
    let held: Vec<_> = (0..REQUESTS_IN_FLIGHT_PER_TOKEN)
        .map(|_| admitted.in_flight().expect("room"))
        .collect();
    let refused = admitted.in_flight().map(|_| ());
    assert!(
        matches!(refused, Err(LimitError::InFlight { .. })),
        "{refused:?}"
    );
    drop(held);
    admitted
        .in_flight()
        .expect("room once the answers are sent");
}

#[test]
fn answers_count_against_their_caller_and_the_node_until_sent() {
    let settings = LimitSettings {
        max_inflight_bytes: 64,
        max_body_bytes: 10,
        ..LimitSettings::default()
    };
    let limits = acl_limits(settings);
    let tenant = limits
        .admit(&with_token("tenant"), ATTACKER, false)
        .expect("ok");
    let first = tenant.charge_answer(30).expect("within the share of 40");
    let refused = tenant.charge_answer(30).map(|_| ());
    assert!(
        matches!(refused, Err(LimitError::CallerBytes { .. })),
        "{refused:?}"
    );
    drop(first);
    tenant
        .charge_answer(30)
        .expect("room once the first answer was sent");
}

#[tokio::test]
async fn an_answer_goes_out_in_slices_and_keeps_its_charge_until_dropped() {
    use super::guard::Metered;
    let limits = acl_limits(LimitSettings::default());
    let tenant = limits
        .admit(&with_token("tenant"), ATTACKER, false)
        .expect("ok");
    let charge = tenant.charge_answer(200 * 1024).expect("room");
    let in_flight = tenant.in_flight().expect("room");
    let answer = http_body_util::Full::new(bytes::Bytes::from(vec![7u8; 200 * 1024]));
    let mut body = Metered::new(answer, Some(in_flight), Some(charge));
    let mut sizes = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("a frame").into_data() {
            sizes.push(data.len());
        }
    }
    assert_eq!(sizes, vec![65536, 65536, 65536, 8192]);
    assert!(
        tenant.share.bytes().used() > 0,
        "charged while the body lives"
    );
    drop(body);
    assert_eq!(tenant.share.bytes().used(), 0);
}

#[test]
fn an_ipv6_host_is_counted_by_its_64_and_a_mapped_ipv4_as_itself() {
    let one: IpAddr = "2001:db8:1:2::1".parse().expect("v6");
    let other: IpAddr = "2001:db8:1:2:ffff::9".parse().expect("v6");
    let elsewhere: IpAddr = "2001:db8:1:3::1".parse().expect("v6");
    assert_eq!(network_of(one), network_of(other));
    assert_ne!(network_of(one), network_of(elsewhere));
    let mapped: IpAddr = "::ffff:10.0.0.9".parse().expect("mapped");
    assert_eq!(network_of(mapped), IpAddr::from([10, 0, 0, 9]));
    assert_eq!(
        network_of(IpAddr::from([10, 0, 0, 9])),
        IpAddr::from([10, 0, 0, 9])
    );
}
