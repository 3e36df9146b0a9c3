//! Accepting connections for tonic: TCP with `TCP_NODELAY`, and with TLS, handshakes run
//! concurrently (each bounded in time) so a slow or silent client cannot stall the listener.
//! Connections and handshakes are capped per address and per port ([`Admission`]); a failed
//! accept (out of descriptors) backs the loop off instead of spinning. A refused handshake (plaintext, another CA, an expired
//! certificate, no certificate where one is required) is logged once per peer address and
//! reason, never per attempt. Each accepted connection carries a [`ConnInfo`]: the peer's
//! address and, with TLS, the identity its certificate names.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

use super::{Coalesced, PeerCert};

/// Handshakes in progress at once on one port; past it the oldest is closed to make room.
pub const MAX_HANDSHAKES: usize = 256;
/// How long a client has to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// A refusal for the same peer address and reason is logged again after this long.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(600);
/// Distinct (address, reason) pairs remembered; past it the oldest half is forgotten.
const REFUSALS_REMEMBERED: usize = 4096;

/// What tonic learns about an accepted connection (`Request::extensions`).
#[derive(Debug, Clone, Default)]
pub struct ConnInfo {
    pub remote: Option<SocketAddr>,
    /// With TLS, who the peer's certificate names (`None`: no certificate presented).
    pub peer: Option<Arc<PeerCert>>,
}

impl ConnInfo {
    /// The connection info of a request, if it came through [`incoming`].
    pub fn of<T>(request: &tonic::Request<T>) -> ConnInfo {
        request
            .extensions()
            .get::<ConnInfo>()
            .cloned()
            .unwrap_or_default()
    }

    /// The peer's address for logs.
    pub fn remote_ip(&self) -> Option<IpAddr> {
        self.remote.map(|addr| addr.ip())
    }
}

/// An accepted connection, plain or TLS, holding its place in its port's [`Admission`] until
/// it closes.
pub struct Conn {
    stream: Stream,
    info: ConnInfo,
    _slot: Slot,
    idle: Idle,
}

/// How long a connection may send nothing: before its first byte (a client that connects and
/// stays silent), and later (a live HTTP/2 peer answers the server's pings every 30 s).
const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(10);
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// When a connection last sent something, and the timer that ends it once it is silent too long.
struct Idle {
    last_read: Option<Instant>,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl Idle {
    fn new() -> Self {
        Idle {
            last_read: None,
            timer: Box::pin(tokio::time::sleep(FIRST_BYTE_TIMEOUT)),
        }
    }

    /// While a read waits: an error once the peer has been silent past its timeout.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            match self.last_read {
                None => {
                    return Poll::Ready(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client sent nothing within 10 s of connecting",
                    ));
                }
                Some(at) if at.elapsed() >= IDLE_TIMEOUT => {
                    return Poll::Ready(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client sent nothing for 5 minutes",
                    ));
                }
                Some(at) => {
                    let deadline = tokio::time::Instant::from_std(at + IDLE_TIMEOUT);
                    self.timer.as_mut().reset(deadline);
                }
            }
        }
    }
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = match &mut this.stream {
            Stream::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        };
        match read {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                this.idle.last_read = Some(Instant::now());
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match this.idle.poll_expired(cx) {
                Poll::Ready(error) => Poll::Ready(Err(error)),
                Poll::Pending => Poll::Pending,
            },
            other => other,
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().stream {
            Stream::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().stream {
            Stream::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Stream::Plain(stream) => stream.is_write_vectored(),
            Stream::Tls(stream) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Connections one address may hold open on a port at once.
pub const MAX_CONNECTIONS_PER_ADDRESS: usize = 512;
/// Connections a port holds open at once, whoever they are from.
pub const MAX_CONNECTIONS: usize = 16 * 1024;
/// TLS handshakes one address may have in progress on a port at once.
pub const MAX_HANDSHAKES_PER_ADDRESS: usize = 16;

/// What one port holds per address: connections open and handshakes in progress. A connection
/// past an address's cap is closed as soon as it is accepted (and the refusal logged once per
/// address); when the port's handshakes are all taken, the oldest in progress is closed to make
/// room. A stranger opening sockets it never uses, from one address or many, cannot take the
/// places of other clients or members: they finish their handshakes in milliseconds.
#[derive(Debug, Default)]
pub struct Admission {
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    connections: usize,
    handshakes: usize,
    by_address: HashMap<IpAddr, (usize, usize)>,
    /// Handshakes in progress, oldest first: when the port's are all taken, the oldest of the
    /// address holding the most is closed to make room (a peer that finishes in milliseconds is
    /// never the oldest for long, and never the address holding the most).
    in_progress: std::collections::VecDeque<(u64, IpAddr, tokio_util::sync::CancellationToken)>,
    next_handshake: u64,
}

/// What a connection holds in its port's [`Admission`]; given back when dropped.
struct Slot {
    admission: Arc<Admission>,
    ip: IpAddr,
    /// While its TLS handshake is in progress: its place in the queue, and what closes it to
    /// make room.
    handshake: Option<(u64, tokio_util::sync::CancellationToken)>,
}

impl Held {
    /// Closes the oldest handshake of the address with the most in progress.
    fn make_room(&mut self) {
        let Some(busiest) = self
            .by_address
            .iter()
            .max_by_key(|(_, (_, handshakes))| *handshakes)
            .map(|(ip, _)| *ip)
        else {
            return;
        };
        if let Some(at) = self
            .in_progress
            .iter()
            .position(|(_, ip, _)| *ip == busiest)
            && let Some((_, _, oldest)) = self.in_progress.remove(at)
        {
            oldest.cancel();
        }
    }
}

impl Admission {
    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a new connection from `ip` (in its handshake when `tls`), or why not.
    fn admit(self: &Arc<Self>, ip: IpAddr, tls: bool) -> Result<Slot, &'static str> {
        let mut held = self.held();
        // Looked up, not inserted: a refused address leaves nothing behind.
        let (connections, handshakes) = held.by_address.get(&ip).copied().unwrap_or_default();
        if connections >= MAX_CONNECTIONS_PER_ADDRESS {
            return Err("too many connections from this address");
        }
        if held.connections >= MAX_CONNECTIONS {
            return Err("too many connections to this port");
        }
        if tls && handshakes >= MAX_HANDSHAKES_PER_ADDRESS {
            return Err("too many TLS handshakes in progress from this address");
        }
        if tls && held.handshakes >= MAX_HANDSHAKES {
            held.make_room();
        }
        let (connections, handshakes) = held.by_address.entry(ip).or_default();
        *connections += 1;
        if tls {
            *handshakes += 1;
        }
        held.connections += 1;
        let mut handshake = None;
        if tls {
            held.handshakes += 1;
            let id = held.next_handshake;
            held.next_handshake += 1;
            let token = tokio_util::sync::CancellationToken::new();
            held.in_progress.push_back((id, ip, token.clone()));
            handshake = Some((id, token));
        }
        Ok(Slot {
            admission: self.clone(),
            ip,
            handshake,
        })
    }

    /// Connections open now (all addresses).
    pub fn connections(&self) -> usize {
        self.held().connections
    }
}

impl Slot {
    fn handshake_done(&mut self) {
        if let Some((id, _)) = self.handshake.take() {
            let mut held = self.admission.held();
            held.handshakes -= 1;
            if let Some((_, handshakes)) = held.by_address.get_mut(&self.ip) {
                *handshakes -= 1;
            }
            if let Some(at) = held
                .in_progress
                .iter()
                .position(|(queued, _, _)| *queued == id)
            {
                held.in_progress.remove(at);
            }
        }
    }

    /// Resolves when the handshake is closed to make room for a newer one.
    fn made_room(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        match &self.handshake {
            Some((_, token)) => token.clone().cancelled_owned(),
            None => tokio_util::sync::CancellationToken::new().cancelled_owned(),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.handshake_done();
        let mut held = self.admission.held();
        held.connections -= 1;
        if let Some((connections, _)) = held.by_address.get_mut(&self.ip) {
            *connections -= 1;
            if *connections == 0 {
                held.by_address.remove(&self.ip);
            }
        }
    }
}

/// Remembers which refusals were logged, so each peer and reason is logged once (again after
/// [`REFUSAL_LOG_INTERVAL`]), with the number of refusals in between. Bounded in memory.
#[derive(Debug, Default)]
pub struct Refusals {
    logged: Mutex<HashMap<RefusalKey, LoggedAt>>,
}

/// A peer address and a reason.
type RefusalKey = (Option<IpAddr>, String);
/// When a refusal was last logged, and how many happened since.
type LoggedAt = (Instant, u64);

impl Refusals {
    /// Whether a refusal of `peer` for `reason` should be logged now, and how many were not
    /// logged since the last time.
    pub fn should_log(&self, peer: Option<IpAddr>, reason: &str) -> Option<u64> {
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if logged.len() >= REFUSALS_REMEMBERED {
            let mut ages: Vec<Instant> = logged.values().map(|(at, _)| *at).collect();
            ages.sort_unstable();
            let cutoff = ages[ages.len() / 2];
            logged.retain(|_, (at, _)| *at > cutoff);
        }
        match logged.get_mut(&(peer, reason.to_owned())) {
            Some((at, suppressed)) if now.duration_since(*at) < REFUSAL_LOG_INTERVAL => {
                *suppressed += 1;
                None
            }
            Some((at, suppressed)) => {
                let since = std::mem::take(suppressed);
                *at = now;
                Some(since)
            }
            None => {
                logged.insert((peer, reason.to_owned()), (now, 0));
                Some(0)
            }
        }
    }

    /// Logs a refusal of `peer` (once per peer and reason, see [`Refusals::should_log`]).
    pub fn warn(&self, what: &str, peer: Option<IpAddr>, reason: &str) {
        if let Some(suppressed) = self.should_log(peer, &format!("{what}: {reason}")) {
            let peer = peer.map(|ip| ip.to_string()).unwrap_or_else(|| "?".into());
            if suppressed > 0 {
                tracing::warn!(%peer, repeated = suppressed, "{what}: refused {peer}: {reason}");
            } else {
                tracing::warn!(%peer, "{what}: refused {peer}: {reason} (logged once per peer)");
            }
        }
    }
}

/// What a failed handshake means, in words an operator can act on.
fn explain_handshake_error(error: &io::Error) -> String {
    use rustls::{AlertDescription, CertificateError, Error};
    let Some(tls) = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<Error>())
    else {
        return match error.kind() {
            io::ErrorKind::UnexpectedEof => {
                "the client closed the connection during the TLS handshake".into()
            }
            _ => format!("TLS handshake failed: {error}"),
        };
    };
    match tls {
        Error::InvalidMessage(_) | Error::InappropriateMessage { .. } => {
            "not a TLS client (plaintext to a TLS port?)".into()
        }
        Error::NoCertificatesPresented => {
            "no client certificate (this port requires one signed by the cluster CA)".into()
        }
        Error::InvalidCertificate(CertificateError::UnknownIssuer)
        | Error::InvalidCertificate(CertificateError::BadSignature) => {
            "certificate not signed by the cluster CA".into()
        }
        Error::InvalidCertificate(CertificateError::Expired)
        | Error::InvalidCertificate(CertificateError::ExpiredContext { .. }) => {
            "certificate expired".into()
        }
        Error::InvalidCertificate(CertificateError::NotValidYet)
        | Error::InvalidCertificate(CertificateError::NotValidYetContext { .. }) => {
            "certificate not valid yet".into()
        }
        Error::AlertReceived(
            AlertDescription::UnknownCA
            | AlertDescription::BadCertificate
            | AlertDescription::DecryptError,
        ) => "the client does not trust this node's certificate (is its CA the cluster's?)".into(),
        Error::AlertReceived(alert) => format!("the client ended the handshake: {alert:?}"),
        other => format!("TLS handshake failed: {other}"),
    }
}

/// The connections of `listener` for tonic: plain, or TLS with `config`, each identified for
/// `cluster_name`. `what` names the port in logs. Ends when the listener fails for good or
/// the stream is dropped.
/// How a port accepts connections: plain, or TLS with this configuration.
#[derive(Clone)]
pub struct Listening {
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub cluster_name: String,
    /// Refused handshakes and peers, logged once per peer.
    pub refusals: Arc<Refusals>,
}

impl Listening {
    /// Accepted connections, with `TCP_NODELAY` set (without it, small gRPC frames wait on
    /// Nagle's algorithm and the peer's delayed ACK) and, with TLS, handshaken.
    pub(crate) fn incoming(
        self,
        listener: TcpListener,
        what: &'static str,
    ) -> BoxStream<'static, io::Result<Conn>> {
        incoming(listener, self.tls, self.cluster_name, what, self.refusals)
    }

    /// [`Listening::incoming`] for a gRPC server: each connection's writes are gathered until
    /// h2 flushes ([`Coalesced`]: one write per unary answer instead of two).
    pub(crate) fn incoming_grpc(
        self,
        listener: TcpListener,
        what: &'static str,
    ) -> BoxStream<'static, io::Result<Coalesced<Conn>>> {
        self.incoming(listener, what)
            .map(|conn| conn.map(Coalesced::new))
            .boxed()
    }
}

pub fn incoming(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    cluster_name: String,
    what: &'static str,
    refusals: Arc<Refusals>,
) -> BoxStream<'static, io::Result<Conn>> {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let (sender, receiver) = tokio::sync::mpsc::channel::<io::Result<Conn>>(64);
    let admission = Arc::new(Admission::default());
    let cluster_name: Arc<str> = cluster_name.into();
    tokio::spawn(async move {
        let mut backoff = AcceptBackoff::default();
        loop {
            let accepted = tokio::select! {
                () = sender.closed() => return,
                accepted = listener.accept() => accepted,
            };
            let (stream, remote) = match accepted {
                Ok(accepted) => {
                    backoff.succeeded();
                    accepted
                }
                Err(error) => {
                    // Out of file descriptors and the like: wait, longer each time, instead of
                    // spinning; said once per cause until accepting works again.
                    let pause = backoff.failed(what, &error);
                    tokio::select! {
                        () = sender.closed() => return,
                        () = tokio::time::sleep(pause) => continue,
                    }
                }
            };
            // Counted per network: one IPv6 host may hold a whole /64.
            let network = crate::limits::network_of(remote.ip());
            let mut slot = match admission.admit(network, acceptor.is_some()) {
                Ok(slot) => slot,
                Err(why) => {
                    refusals.warn(what, Some(remote.ip()), why);
                    drop(stream);
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let Some(acceptor) = acceptor.clone() else {
                let info = ConnInfo {
                    remote: Some(remote),
                    peer: None,
                };
                let conn = Conn {
                    stream: Stream::Plain(stream),
                    info,
                    _slot: slot,
                    idle: Idle::new(),
                };
                if sender.send(Ok(conn)).await.is_err() {
                    return;
                }
                continue;
            };
            let sender = sender.clone();
            let refusals = refusals.clone();
            let cluster_name = cluster_name.clone();
            tokio::spawn(async move {
                let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream));
                let made_room = slot.made_room();
                let handshake = tokio::select! {
                    handshake = handshake => handshake,
                    () = made_room => {
                        refusals.warn(
                            what,
                            Some(remote.ip()),
                            "TLS handshake closed unfinished to make room for newer connections (the port's handshakes were all taken)",
                        );
                        return;
                    }
                };
                let stream = match handshake {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(error)) => {
                        refusals.warn(what, Some(remote.ip()), &explain_handshake_error(&error));
                        return;
                    }
                    Err(_) => {
                        refusals.warn(
                            what,
                            Some(remote.ip()),
                            "TLS handshake not finished in time",
                        );
                        return;
                    }
                };
                slot.handshake_done();
                let peer = stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .and_then(|leaf| PeerCert::of(leaf, &cluster_name))
                    .map(Arc::new);
                let info = ConnInfo {
                    remote: Some(remote),
                    peer,
                };
                let conn = Conn {
                    stream: Stream::Tls(Box::new(stream)),
                    info,
                    _slot: slot,
                    idle: Idle::new(),
                };
                let _ = sender.send(Ok(conn)).await;
            });
        }
    });
    ReceiverStream::new(receiver).boxed()
}

/// How long the accept loop waits after a failed accept: doubling from 5 ms to 1 s, and back to
/// nothing once one succeeds. Each cause is logged at warn when it starts.
#[derive(Debug, Default)]
struct AcceptBackoff {
    pause: Option<Duration>,
    logged: Option<io::ErrorKind>,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(5);
    const MOST: Duration = Duration::from_secs(1);

    fn failed(&mut self, what: &str, error: &io::Error) -> Duration {
        if self.logged != Some(error.kind()) {
            self.logged = Some(error.kind());
            tracing::warn!(%error, "{what}: cannot accept connections (out of file descriptors? raise `ulimit -n`); pausing the listener and retrying");
        }
        let pause = self
            .pause
            .map_or(Self::FIRST, |pause| (pause * 2).min(Self::MOST));
        self.pause = Some(pause);
        pause
    }

    fn succeeded(&mut self) {
        if self.logged.take().is_some() {
            tracing::info!("accepting connections again");
        }
        self.pause = None;
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt as _;

    use super::*;

    #[test]
    fn a_refusal_is_logged_once_per_peer_and_reason() {
        let refusals = Refusals::default();
        let a = Some(IpAddr::from([10, 0, 0, 1]));
        let b = Some(IpAddr::from([10, 0, 0, 2]));
        assert_eq!(refusals.should_log(a, "plaintext"), Some(0));
        assert_eq!(refusals.should_log(a, "plaintext"), None);
        assert_eq!(refusals.should_log(a, "plaintext"), None);
        assert_eq!(refusals.should_log(a, "expired"), Some(0));
        assert_eq!(refusals.should_log(b, "plaintext"), Some(0));
    }

    #[test]
    fn remembered_refusals_stay_bounded() {
        let refusals = Refusals::default();
        for i in 0..(REFUSALS_REMEMBERED as u32 * 3) {
            refusals.should_log(Some(IpAddr::from(i.to_be_bytes())), "plaintext");
        }
        let remembered = refusals
            .logged
            .lock()
            .map(|m| m.len())
            .unwrap_or(usize::MAX);
        assert!(remembered <= REFUSALS_REMEMBERED, "{remembered} remembered");
    }

    #[tokio::test]
    async fn a_full_port_closes_the_oldest_handshake_of_the_busiest_address() {
        let admission = Arc::new(Admission::default());
        let busy = IpAddr::from([10, 0, 0, 1]);
        let mut slots = Vec::new();
        // Fill the port: the busy address to its own cap, the rest from one address each.
        for _ in 0..MAX_HANDSHAKES_PER_ADDRESS {
            slots.push(admission.admit(busy, true).expect("room"));
        }
        for i in 0..(MAX_HANDSHAKES - MAX_HANDSHAKES_PER_ADDRESS) as u32 {
            let ip = IpAddr::from((0x0b00_0000 + i).to_be_bytes());
            slots.push(admission.admit(ip, true).expect("room"));
        }
        let newcomer = admission
            .admit(IpAddr::from([127, 0, 0, 1]), true)
            .expect("a full port makes room");
        let oldest_of_busy = slots.first().expect("a slot");
        assert!(
            oldest_of_busy.made_room().now_or_never().is_some(),
            "the busiest address's oldest handshake was closed"
        );
        assert!(
            slots[MAX_HANDSHAKES_PER_ADDRESS]
                .made_room()
                .now_or_never()
                .is_none(),
            "others' handshakes go on"
        );
        drop(newcomer);
    }

    #[test]
    fn a_refused_address_leaves_nothing_behind() {
        let admission = Arc::new(Admission::default());
        let held: Vec<_> = (0..MAX_CONNECTIONS as u32)
            .map(|i| {
                admission
                    .admit(IpAddr::from((0x0a00_0000 + i).to_be_bytes()), false)
                    .expect("room")
            })
            .collect();
        for i in 0..1000u32 {
            let refused = admission.admit(IpAddr::from((0x0c00_0000 + i).to_be_bytes()), false);
            assert!(refused.is_err(), "the port is full");
        }
        assert_eq!(admission.held().by_address.len(), MAX_CONNECTIONS);
        drop(held);
        assert_eq!(admission.held().by_address.len(), 0);
    }
}
