//! What keeps one client, or a stranger, from exhausting a node (DESIGN §12.1).
//!
//! Every API request (gRPC and HTTP) is admitted here before its body is read
//! ([`Limits::admit`]): the token in its headers is resolved first, so an unknown token is
//! refused at once and a request without one may carry only a small body. Each caller is an
//! [`Identity`] (its token with ACLs on, its address otherwise) with a [`Share`]: the rate of
//! its requests, the bytes of its request bodies being received, its open watches. The node as
//! a whole bounds the bytes of bodies being received ([`ByteBudget`]; the resource service
//! holds another for the lists it answers). Refusals are [`LimitError`]s, mapped to gRPC codes in one place.
//!
//! [`guard`] wraps a request's body so what it receives is charged as it arrives and must
//! arrive in time.

pub(crate) mod guard;

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::acl::{TokenResolver, Unauthenticated};

/// Watches one caller may hold open at once.
pub(crate) const DEFAULT_MAX_WATCHES_PER_TOKEN: usize = 1024;
/// Requests per second one token may send (twice as many in a burst).
pub(crate) const DEFAULT_MAX_REQUESTS_PER_SECOND_PER_TOKEN: u32 = 2000;
/// Bytes of request bodies being received, and of list answers being sent, each, on one node.
pub(crate) const DEFAULT_MAX_INFLIGHT_BYTES: usize = 256 << 20;
/// How long a request's body may take to arrive once its headers have.
pub(crate) const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest body a request without a token may carry with ACLs on (bootstrap, join,
/// reflection and health requests are far smaller).
pub(crate) const ANONYMOUS_BODY_BYTES: usize = 64 * 1024;
/// Bytes of bodies all anonymous callers of one address may have in flight at once.
const ANONYMOUS_INFLIGHT_BYTES: usize = 1 << 20;
/// Bytes of bodies all anonymous callers together may have in flight on a node: apart from
/// the budget callers with tokens share, which strangers cannot touch.
const ANONYMOUS_NODE_BYTES: usize = 8 << 20;
/// How long a reflection stream (its requests are a stream) may stay open.
pub(crate) const REFLECTION_TIMEOUT: Duration = Duration::from_secs(60);
/// Requests one token may have in flight at once (until its answer has been sent), watches
/// apart; callers without a token, per address, a few; with ACLs off, per address, many.
const REQUESTS_IN_FLIGHT_PER_TOKEN: usize = 128;
const REQUESTS_IN_FLIGHT_ANONYMOUS: usize = 32;
const REQUESTS_IN_FLIGHT_PER_ADDRESS: usize = 1024;

/// Streams one client connection may have open at once (HTTP/2 `MAX_CONCURRENT_STREAMS`).
pub(crate) const MAX_STREAMS_PER_CONNECTION: u32 = 256;
/// Largest header block a client may send (HTTP/2 `MAX_HEADER_LIST_SIZE`).
pub(crate) const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;
/// Identities remembered before idle ones are forgotten.
const IDENTITIES_REMEMBERED: usize = 4096;

/// A node's limits (flags of `resd agent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LimitSettings {
    pub max_watches_per_token: usize,
    /// 0: no limit.
    pub max_requests_per_second_per_token: u32,
    pub max_inflight_bytes: usize,
    /// The largest request body a caller with a token may send (a resource at the size limit
    /// and its envelope).
    pub max_body_bytes: usize,
}

impl Default for LimitSettings {
    fn default() -> Self {
        LimitSettings {
            max_watches_per_token: DEFAULT_MAX_WATCHES_PER_TOKEN,
            max_requests_per_second_per_token: DEFAULT_MAX_REQUESTS_PER_SECOND_PER_TOKEN,
            max_inflight_bytes: DEFAULT_MAX_INFLIGHT_BYTES,
            max_body_bytes: crate::service::DEFAULT_MAX_RESOURCE_BYTES + 64 * 1024,
        }
    }
}

impl LimitSettings {
    /// Bytes of bodies one identity may have in flight: a quarter of the node's, and never
    /// less than four requests at the size limit.
    fn per_identity_bytes(&self) -> usize {
        (self.max_inflight_bytes / 4).max(4 * self.max_body_bytes)
    }
}

/// Why a request was refused or ended by a limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error("{0}")]
    Unauthenticated(String),
    #[error(
        "too many requests: {who} may send {per_second} per second (--max-requests-per-second-per-token); slow down and retry in {retry_ms} ms"
    )]
    Rate {
        who: String,
        per_second: u32,
        retry_ms: u64,
    },
    #[error(
        "too many watches: {who} has {open} open, the most this node allows (--max-watches-per-token); close watches it no longer reads"
    )]
    Watches { who: String, open: usize },
    #[error(
        "too many requests at once: {who} has {in_flight} whose answers are not sent yet, the most this node allows; wait for answers (and read them) before sending more"
    )]
    InFlight { who: String, in_flight: usize },
    #[error(
        "{who} has {used} bytes of requests and answers in flight at once, over its share of {limit} bytes on this node (a quarter of --max-inflight-bytes); wait for its requests to finish and read their answers"
    )]
    CallerBytes {
        who: String,
        used: usize,
        limit: usize,
    },
    #[error(
        "this node is receiving {used} bytes of requests at once, over its limit of {limit} (--max-inflight-bytes); retry shortly or send to another member"
    )]
    NodeBytes { used: usize, limit: usize },
    #[error(
        "a request without a token may carry at most {limit} bytes; send a token (x-resd-token) with this request"
    )]
    AnonymousBody { limit: usize },
    #[error(
        "the request's body did not arrive within {} s of its headers (a stalled or very slow client); send it again",
        .0.as_secs()
    )]
    BodyTimeout(Duration),
    #[error(
        "answers waiting to be sent on this node hold {used} bytes, over its limit of {limit} (--max-inflight-bytes); retry shortly"
    )]
    Answers { used: usize, limit: usize },
    #[error(
        "lists being answered on this node hold {used} bytes, over its limit of {limit} (--max-inflight-bytes); retry shortly, or list a narrower name prefix"
    )]
    ListBytes { used: usize, limit: usize },
}

/// Bytes something holds at most, shared by everything charged to it.
#[derive(Debug)]
pub(crate) struct ByteBudget {
    used: AtomicUsize,
    limit: usize,
}

impl ByteBudget {
    pub(crate) fn new(limit: usize) -> Arc<ByteBudget> {
        Arc::new(ByteBudget {
            used: AtomicUsize::new(0),
            limit,
        })
    }

    /// Bytes charged now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Charges `bytes` on top of `own` (what the same holder charged already) unless that
    /// would pass the limit; `Err` carries what the total would have been. A holder with nothing
    /// else charged may pass the limit, so one request or answer larger than the whole budget is
    /// never refused by an idle node.
    fn try_charge(&self, bytes: usize, own: usize) -> Result<(), usize> {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let total = used.saturating_add(bytes);
            if total > self.limit && used > own {
                return Err(total);
            }
            match self
                .used
                .compare_exchange_weak(used, total, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(now) => used = now,
            }
        }
    }

    fn release(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Bytes charged to a budget, released when dropped.
#[derive(Debug)]
pub(crate) struct Charge {
    budget: Arc<ByteBudget>,
    bytes: usize,
}

impl Charge {
    pub(crate) fn new(budget: Arc<ByteBudget>) -> Charge {
        Charge { budget, bytes: 0 }
    }

    /// Adds `bytes`; `Err` with the total it would have made when the budget has no room.
    pub(crate) fn add(&mut self, bytes: usize) -> Result<(), usize> {
        self.budget.try_charge(bytes, self.bytes)?;
        self.bytes += bytes;
        Ok(())
    }

    pub(crate) fn budget(&self) -> &ByteBudget {
        &self.budget
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

/// Who a request counts against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Identity {
    /// A token ACLs accepted (a keyed hash of its secret: the secret is not kept).
    Token(u64),
    /// ACLs on, no token: all such callers of one address share.
    Anonymous(Option<IpAddr>),
    /// ACLs off: every caller is the same anonymous one; callers are told apart by address.
    Address(Option<IpAddr>),
}

/// Token bucket of one identity's requests.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// What one identity holds.
#[derive(Debug)]
pub(crate) struct Share {
    /// How messages name it: "token <accessor>", "anonymous callers from <ip>".
    who: String,
    watches: AtomicUsize,
    /// Requests admitted whose answers are not sent yet, and how many may be.
    in_flight: AtomicUsize,
    max_in_flight: usize,
    bytes: Arc<ByteBudget>,
    bucket: Mutex<Bucket>,
    rated: bool,
}

impl Share {
    pub(crate) fn who(&self) -> &str {
        &self.who
    }

    /// What this caller has in flight: its request bodies and the lists answered to it.
    pub(crate) fn bytes(&self) -> Arc<ByteBudget> {
        self.bytes.clone()
    }

    /// Takes one request from the bucket, or says when to retry.
    fn take_request(&self, per_second: u32) -> Result<(), LimitError> {
        if !self.rated || per_second == 0 {
            return Ok(());
        }
        let rate = f64::from(per_second);
        let burst = 2.0 * rate;
        let mut bucket = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let refill = now.duration_since(bucket.at).as_secs_f64() * rate;
        bucket.tokens = (bucket.tokens + refill).min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        Err(LimitError::Rate {
            who: self.who.clone(),
            per_second,
            retry_ms: ((1.0 - bucket.tokens) / rate * 1000.0).ceil() as u64,
        })
    }
}

/// A request whose answer is not sent yet, counted against its identity until dropped.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<Share>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An open watch, counted against its identity until dropped.
#[derive(Debug)]
pub(crate) struct WatchTicket(Arc<Share>);

impl Drop for WatchTicket {
    fn drop(&mut self) {
        self.0.watches.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request that passed admission: who it counts against and how its body is bounded.
#[derive(Debug, Clone)]
pub(crate) struct Admitted {
    pub share: Arc<Share>,
    /// Largest body it may carry.
    pub max_body: usize,
    /// The node-wide budget its body counts against (callers without a token have their own).
    pub node_bytes: Arc<ByteBudget>,
    /// ACLs are on and the request carries no token that resolves.
    pub anonymous: bool,
    pub limits: Arc<Limits>,
}

/// An answer's bytes, charged to its caller's share and the node's answers until it is sent.
#[derive(Debug)]
pub(crate) struct AnswerCharge {
    _caller: Charge,
    _node: Charge,
}

/// An [`AnswerCharge`] a handler leaves in its response's extensions for the port's guard, which
/// keeps it with the answer's body (extensions must be `Clone`).
#[derive(Debug, Clone, Default)]
pub(crate) struct HeldCharge(Arc<Mutex<Option<AnswerCharge>>>);

impl HeldCharge {
    pub(crate) fn new(charge: AnswerCharge) -> Self {
        HeldCharge(Arc::new(Mutex::new(Some(charge))))
    }

    pub(crate) fn take(&self) -> Option<AnswerCharge> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl Admitted {
    /// Charges an answer of `bytes` to this caller and the node until it is sent; refused when
    /// either has too much waiting to be sent already.
    pub(crate) fn charge_answer(&self, bytes: usize) -> Result<AnswerCharge, LimitError> {
        let mut caller = Charge::new(self.share.bytes.clone());
        caller.add(bytes).map_err(|used| LimitError::CallerBytes {
            who: self.share.who.clone(),
            used,
            limit: self.share.bytes.limit(),
        })?;
        let mut node = Charge::new(self.limits.answers.clone());
        node.add(bytes).map_err(|used| LimitError::Answers {
            used,
            limit: self.limits.answers.limit(),
        })?;
        Ok(AnswerCharge {
            _caller: caller,
            _node: node,
        })
    }

    /// Counts this request until its answer is sent (the returned value is dropped); refused
    /// when its caller has too many answers pending.
    pub(crate) fn in_flight(&self) -> Result<InFlight, LimitError> {
        let before = self.share.in_flight.fetch_add(1, Ordering::Relaxed);
        let ticket = InFlight(self.share.clone());
        if before >= self.share.max_in_flight {
            return Err(LimitError::InFlight {
                who: self.share.who.clone(),
                in_flight: before,
            });
        }
        Ok(ticket)
    }

    /// Counts a watch this caller opens; refused past `--max-watches-per-token`.
    pub(crate) fn open_watch(&self) -> Result<WatchTicket, LimitError> {
        let max = self.limits.settings.max_watches_per_token;
        let open = self.share.watches.fetch_add(1, Ordering::Relaxed);
        let ticket = WatchTicket(self.share.clone());
        if open >= max {
            return Err(LimitError::Watches {
                who: self.share.who.clone(),
                open,
            });
        }
        Ok(ticket)
    }
}

/// The limits of one node and what each identity holds against them.
#[derive(Debug)]
pub(crate) struct Limits {
    settings: LimitSettings,
    tokens: Arc<dyn TokenResolver>,
    identities: Mutex<HashMap<Identity, Arc<Share>>>,
    /// Bodies being received, node-wide.
    bodies: Arc<ByteBudget>,
    /// Bodies of callers without a token being received, node-wide.
    anonymous_bodies: Arc<ByteBudget>,
    /// Answers (reads; lists have the resource service's budget) waiting to be sent, node-wide.
    answers: Arc<ByteBudget>,
    hasher: std::collections::hash_map::RandomState,
}

impl Limits {
    pub(crate) fn new(settings: LimitSettings, tokens: Arc<dyn TokenResolver>) -> Arc<Limits> {
        Arc::new(Limits {
            settings,
            tokens,
            identities: Mutex::default(),
            bodies: ByteBudget::new(settings.max_inflight_bytes),
            anonymous_bodies: ByteBudget::new(ANONYMOUS_NODE_BYTES),
            answers: ByteBudget::new(settings.max_inflight_bytes),
            hasher: std::collections::hash_map::RandomState::new(),
        })
    }

    /// The node's budget for bodies being received.
    #[cfg(test)]
    pub(crate) fn bodies(&self) -> Arc<ByteBudget> {
        self.bodies.clone()
    }

    /// Admits a request from its headers, before its body is read: resolves its token (one
    /// this node does not know counts as none: the handler refuses it once it has caught up),
    /// takes one request from its identity's rate, and says how large its body may be.
    ///
    /// A method that does not look at tokens (`ignores_token`: bootstrap, health, reflection)
    /// counts a request whose token does not resolve as one without a token.
    pub(crate) fn admit(
        self: &Arc<Self>,
        headers: &http::HeaderMap,
        remote: Option<IpAddr>,
        ignores_token: bool,
    ) -> Result<Admitted, LimitError> {
        let remote = remote.map(network_of);
        let token = match token_in(headers) {
            Ok(token) => token,
            Err(_) if ignores_token => None,
            Err(refused) => return Err(refused),
        };
        let (identity, max_body) = if !self.tokens.enabled() {
            (Identity::Address(remote), self.settings.max_body_bytes)
        } else {
            match token {
                None => (Identity::Anonymous(remote), ANONYMOUS_BODY_BYTES),
                Some(secret) => match self.tokens.resolve_from(Some(secret), remote) {
                    Ok(_) => (
                        Identity::Token(self.hasher.hash_one(secret)),
                        self.settings.max_body_bytes,
                    ),
                    // A token this node does not know may be one acknowledged elsewhere a moment
                    // ago, or this node may be catching up: the handler decides once caught up
                    // with the leader (`service::grpc`). Until then the caller is a stranger.
                    Err(Unauthenticated::Refused(_)) => {
                        (Identity::Anonymous(remote), ANONYMOUS_BODY_BYTES)
                    }
                    // ACLs not loaded yet (the handler answers CATCHING_UP), or too busy
                    // (UNAVAILABLE): until then the caller counts as anonymous.
                    Err(Unauthenticated::NotReady(_) | Unauthenticated::Loading(_)) => {
                        (Identity::Anonymous(remote), ANONYMOUS_BODY_BYTES)
                    }
                },
            }
        };
        let anonymous = matches!(identity, Identity::Anonymous(_));
        let node_bytes = if anonymous {
            self.anonymous_bodies.clone()
        } else {
            self.bodies.clone()
        };
        let share = self.share(identity, token);
        share.take_request(self.settings.max_requests_per_second_per_token)?;
        Ok(Admitted {
            share,
            max_body,
            node_bytes,
            anonymous,
            limits: self.clone(),
        })
    }

    /// The share of `identity`, made on first sight; idle shares are forgotten once many are
    /// remembered.
    fn share(&self, identity: Identity, token: Option<&str>) -> Arc<Share> {
        let mut identities = self.identities.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(share) = identities.get(&identity) {
            return share.clone();
        }
        if identities.len() >= IDENTITIES_REMEMBERED {
            let per_second = f64::from(self.settings.max_requests_per_second_per_token);
            identities.retain(|_, share| Arc::strong_count(share) > 1 || share.busy(per_second));
        }
        let max_in_flight = match &identity {
            Identity::Token(_) => REQUESTS_IN_FLIGHT_PER_TOKEN,
            Identity::Anonymous(_) => REQUESTS_IN_FLIGHT_ANONYMOUS,
            Identity::Address(_) => REQUESTS_IN_FLIGHT_PER_ADDRESS,
        };
        let (who, bytes, rated) = match &identity {
            Identity::Token(_) => {
                let accessor = self
                    .tokens
                    .describe(token)
                    .and_then(Result::ok)
                    .map(|info| info.accessor)
                    .unwrap_or_else(|| "?".into());
                (
                    format!("token {accessor}"),
                    self.settings.per_identity_bytes(),
                    true,
                )
            }
            Identity::Anonymous(ip) => (
                format!("callers without a token from {}", show_ip(*ip)),
                ANONYMOUS_INFLIGHT_BYTES,
                true,
            ),
            // ACLs off: no tokens to be fair between (every client is the same caller).
            Identity::Address(ip) => (
                format!("clients at {}", show_ip(*ip)),
                self.settings.per_identity_bytes(),
                false,
            ),
        };
        let share = Arc::new(Share {
            who,
            watches: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight,
            bytes: ByteBudget::new(bytes),
            bucket: Mutex::new(Bucket {
                tokens: 2.0 * f64::from(self.settings.max_requests_per_second_per_token),
                at: Instant::now(),
            }),
            rated,
        });
        identities.insert(identity, share.clone());
        share
    }
}

impl Share {
    /// Whether forgetting this share would forgive something: its bucket is not full yet.
    fn busy(&self, per_second: f64) -> bool {
        if !self.rated || per_second == 0.0 {
            return false;
        }
        let bucket = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        bucket.tokens + bucket.at.elapsed().as_secs_f64() * per_second < 2.0 * per_second
    }
}

pub(crate) use crate::acl::network_of;

fn show_ip(ip: Option<IpAddr>) -> String {
    ip.map_or_else(|| "an unknown address".into(), |ip| ip.to_string())
}

/// The token a request's headers carry (`x-resd-token`, or `authorization: Bearer …`): the
/// one reading of it, for admission and for the services.
pub(crate) fn token_in(headers: &http::HeaderMap) -> Result<Option<&str>, LimitError> {
    let Some(value) = headers
        .get(proto::TOKEN_HEADER)
        .or_else(|| headers.get(http::header::AUTHORIZATION))
    else {
        return Ok(None);
    };
    let text = value.to_str().map_err(|_| {
        LimitError::Unauthenticated(format!("{} is not valid ASCII", proto::TOKEN_HEADER))
    })?;
    Ok(Some(text.strip_prefix("Bearer ").unwrap_or(text).trim()))
}

#[cfg(test)]
mod tests;
