//! The deadline of the request being served, so storage waits (for a leader, for a forwarded
//! reply) end when the caller stops waiting. The gRPC handlers set it from `grpc-timeout`; code
//! running outside a request has none.

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::task::futures::TaskLocalFuture;

tokio::task_local! {
    static DEADLINE: Option<Instant>;
}

/// Runs `future` with `deadline` as the request deadline (or none). A plain function, not an
/// `async fn`: the wrapper holds `future` once, in place, instead of a second copy of a
/// request's (large) future that is moved on every poll setup.
pub(crate) fn scope<F: Future>(
    deadline: Option<Instant>,
    future: F,
) -> TaskLocalFuture<Option<Instant>, F> {
    DEADLINE.scope(deadline, future)
}

/// The current request's deadline, if it has one.
pub(crate) fn current() -> Option<Instant> {
    DEADLINE.try_with(|deadline| *deadline).ok().flatten()
}

/// The earlier of the request deadline and `now + limit`.
pub(crate) fn bounded(limit: Duration) -> Instant {
    let own = Instant::now() + limit;
    current().map_or(own, |deadline| deadline.min(own))
}

/// Parses a `grpc-timeout` header value: digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`).
pub(crate) fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    // The gRPC spec: a positive integer of at most 8 ASCII digits.
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.saturating_mul(3600)),
        "M" => Duration::from_secs(amount.saturating_mul(60)),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_every_unit() {
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(
            parse_grpc_timeout("1500m"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(parse_grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("10u"), Some(Duration::from_micros(10)));
        assert_eq!(parse_grpc_timeout("10n"), Some(Duration::from_nanos(10)));
        assert_eq!(parse_grpc_timeout(""), None);
        // What an attacker sends: more than 8 digits, signs, nothing before the unit.
        assert_eq!(parse_grpc_timeout("18446744073709551615S"), None);
        assert_eq!(parse_grpc_timeout("123456789H"), None);
        assert_eq!(parse_grpc_timeout("+5S"), None);
        assert_eq!(
            parse_grpc_timeout("99999999H"),
            Some(Duration::from_secs(99_999_999 * 3600))
        );
        assert_eq!(parse_grpc_timeout("S"), None);
        assert_eq!(parse_grpc_timeout("5x"), None);
    }

    #[tokio::test]
    async fn the_deadline_is_visible_inside_its_scope_only() {
        assert!(current().is_none());
        let deadline = Instant::now() + Duration::from_secs(1);
        scope(Some(deadline), async {
            assert_eq!(current(), Some(deadline));
            assert!(bounded(Duration::from_secs(60)) <= deadline);
        })
        .await;
        assert!(current().is_none());
        scope(None, async {
            assert_eq!(current(), None);
            let limit = Duration::from_secs(60);
            assert!(bounded(limit) > Instant::now() + limit / 2);
        })
        .await;
    }
}
