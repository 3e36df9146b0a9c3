//! The audit log (DESIGN §18): `--audit-log PATH`, one JSON line per request this node
//! received that carried credentials or reached authorization (unauthenticated ones
//! included): `time`, `token` (its name, never its secret), `peer`, `method`, `resource`,
//! `code`, `reason`, `latency_ms`, and at `--audit-level request` the body with every secret
//! field redacted. Rotated by size (`PATH.1`, `PATH.2`, …).
//!
//! A request never waits for the log: lines go through a bounded queue to one writer thread.
//! A line that cannot be queued (the writer is behind) or written (a full disk) is counted
//! lost (`resd_audit_lines_lost_total`) and said once in the server's log until writing works
//! again; requests are served either way.
//!
//! Handlers tell what only they know (the caller's token name, the resource, the reason of a
//! refusal, the body) through the request's [`Note`], which the gRPC layer ([`AuditLayer`])
//! puts in every request's extensions and writes out when the answer's status is known.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use crate::tls::ConnInfo;

/// What the log holds.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum AuditLevel {
    /// Nothing.
    None,
    /// Who, what, when, how it ended.
    #[default]
    Metadata,
    /// And the request's body, secrets redacted.
    Request,
}

/// Default size a log file grows to before it is rotated.
pub const DEFAULT_MAX_BYTES: u64 = 100 << 20;
/// Rotated files kept besides the current one.
pub const DEFAULT_FILES: u32 = 5;
/// Lines queued for the writer at most.
const QUEUE: usize = 8192;
/// Bytes of a body logged at most (a larger one is cut, said so).
const MAX_BODY_BYTES: usize = 64 << 10;

/// Where and how much to log.
#[derive(Debug, Clone)]
pub struct AuditConfig {
    pub path: PathBuf,
    pub level: AuditLevel,
    pub max_bytes: u64,
    pub files: u32,
}

/// The node's audit log: cheap to clone, shared by both servers.
#[derive(Debug, Clone)]
pub struct AuditLog {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    level: AuditLevel,
    lines: std::sync::mpsc::SyncSender<String>,
    /// Whether a loss was said and not yet followed by a line written again.
    said: Arc<AtomicBool>,
    lost_counter: prometheus_client::metrics::counter::Counter,
}

impl AuditLog {
    /// Opens (creating) the log and starts its writer; an error says why the file cannot be
    /// written.
    pub fn open(
        config: AuditConfig,
        lost_counter: prometheus_client::metrics::counter::Counter,
    ) -> std::io::Result<AuditLog> {
        if let Some(parent) = config.path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        let file = open_append(&config.path)?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let (lines, queue) = std::sync::mpsc::sync_channel::<String>(QUEUE);
        let said = Arc::new(AtomicBool::new(false));
        let inner = Arc::new(Inner {
            level: config.level,
            lines,
            said: said.clone(),
            lost_counter: lost_counter.clone(),
        });
        let mut writer = Writer {
            config,
            file: Some(file),
            size,
            said,
            lost_counter,
        };
        std::thread::Builder::new()
            .name("resd-audit".into())
            .spawn(move || {
                while let Ok(line) = queue.recv() {
                    writer.write(&line);
                }
                if let Some(file) = writer.file.as_mut() {
                    let _ = file.flush();
                    let _ = file.sync_data();
                }
            })?;
        Ok(AuditLog { inner })
    }

    pub fn level(&self) -> AuditLevel {
        self.inner.level
    }

    /// Lines lost so far (queue full, or a write that failed).
    pub fn lost(&self) -> u64 {
        self.inner.lost_counter.get()
    }

    fn send(&self, line: String) {
        if self.inner.lines.try_send(line).is_err() {
            self.inner.lost_counter.inc();
            if !self.inner.said.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "the audit log's writer is behind: lines are being lost (counted in resd_audit_lines_lost_total)"
                );
            }
        }
    }
}

fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    options.open(path)
}

struct Writer {
    config: AuditConfig,
    file: Option<std::fs::File>,
    size: u64,
    said: Arc<AtomicBool>,
    lost_counter: prometheus_client::metrics::counter::Counter,
}

impl Writer {
    fn write(&mut self, line: &str) {
        match self.try_write(line) {
            Ok(()) => {
                if self.said.swap(false, Ordering::Relaxed) {
                    tracing::info!(path = %self.config.path.display(), "the audit log is written again");
                }
            }
            Err(error) => {
                self.lost_counter.inc();
                // A file that failed is opened again for the next line.
                self.file = None;
                if !self.said.swap(true, Ordering::Relaxed) {
                    tracing::error!(path = %self.config.path.display(), %error, "cannot write the audit log: lines are being lost (counted in resd_audit_lines_lost_total); requests are still served");
                }
            }
        }
    }

    fn try_write(&mut self, line: &str) -> std::io::Result<()> {
        if self.size > 0 && self.size + line.len() as u64 + 1 > self.config.max_bytes {
            self.rotate()?;
        }
        if self.file.is_none() {
            let file = open_append(&self.config.path)?;
            self.size = file.metadata().map(|m| m.len()).unwrap_or(0);
            self.file = Some(file);
        }
        let Some(file) = self.file.as_mut() else {
            return Err(std::io::Error::other("the audit log is not open"));
        };
        let mut buffer = Vec::with_capacity(line.len() + 1);
        buffer.extend_from_slice(line.as_bytes());
        buffer.push(b'\n');
        file.write_all(&buffer)?;
        self.size += buffer.len() as u64;
        Ok(())
    }

    /// `PATH.{n-1}` → `PATH.n`, …, `PATH` → `PATH.1`; the oldest beyond `files` goes.
    fn rotate(&mut self) -> std::io::Result<()> {
        self.file = None;
        let rotated = |n: u32| PathBuf::from(format!("{}.{n}", self.config.path.display()));
        if self.config.files == 0 {
            std::fs::remove_file(&self.config.path)?;
        } else {
            let _ = std::fs::remove_file(rotated(self.config.files));
            for n in (1..self.config.files).rev() {
                let from = rotated(n);
                if from.exists() {
                    std::fs::rename(&from, rotated(n + 1))?;
                }
            }
            std::fs::rename(&self.config.path, rotated(1))?;
        }
        self.size = 0;
        Ok(())
    }
}

/// What a request's handler tells the audit log (shared with the layer that writes it).
#[derive(Debug, Clone, Default)]
pub struct Note(Arc<Mutex<Noted>>);

#[derive(Debug, Default)]
struct Noted {
    /// The log keeps bodies (`--audit-level request`).
    wants_body: bool,
    /// The caller's token, by name (`anonymous` with ACLs off).
    token: Option<String>,
    /// Authorization was reached (the request is logged even without credentials).
    authorized: bool,
    resource: Option<String>,
    reason: Option<String>,
    body: Option<serde_json::Value>,
}

impl Note {
    fn with<R>(&self, f: impl FnOnce(&mut Noted) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Whether the log keeps the request's body.
    pub fn wants_body(&self) -> bool {
        self.with(|n| n.wants_body)
    }

    /// The caller as authorization resolved it (a token's name, never its secret).
    pub fn caller(&self, token_name: &str) {
        self.with(|n| {
            n.authorized = true;
            n.token = Some(token_name.to_owned());
        });
    }

    /// Authorization was reached without a caller (refused: no token, an unknown one).
    pub fn unauthenticated(&self) {
        self.with(|n| n.authorized = true);
    }

    /// `type/partition/namespace/name`.
    pub fn resource(&self, resource: String) {
        self.with(|n| n.resource = Some(resource));
    }

    pub fn reason(&self, reason: &str) {
        self.with(|n| n.reason = Some(reason.to_owned()));
    }

    /// The request's body, for `--audit-level request` (redacted here).
    pub fn body(&self, mut body: serde_json::Value) {
        redact(&mut body);
        self.with(|n| n.body = Some(body));
    }
}

/// Whether a field holds a secret: its value never reaches the log. Names are compared in
/// one form (lowercase, without `_`), so `api_key`, `apiKey` and `APIKey` are one name.
fn is_secret(key: &str) -> bool {
    let name: String = key
        .chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect();
    const HOLDS: [&str; 9] = [
        "secret",
        "password",
        "passwd",
        "credential",
        "privatekey",
        "apikey",
        "accesskey",
        "signingkey",
        "bearer",
    ];
    HOLDS.iter().any(|word| name.contains(word))
        || (name.ends_with("token") && !name.ends_with("pagetoken"))
}

/// Replaces every secret field's value, at any depth.
pub fn redact(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(fields) => {
            for (key, field) in fields.iter_mut() {
                if is_secret(key) {
                    *field = serde_json::Value::String("[redacted]".into());
                } else {
                    redact(field);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}

/// The layer that logs every gRPC request of a server once its status is known.
#[derive(Debug, Clone)]
pub(crate) struct AuditLayer {
    log: Option<AuditLog>,
}

impl AuditLayer {
    pub(crate) fn new(log: Option<AuditLog>) -> Self {
        AuditLayer { log }
    }
}

impl<S> tower::Layer<S> for AuditLayer {
    type Service = AuditService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuditService {
            inner,
            log: self.log.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct AuditService<S> {
    inner: S,
    log: Option<AuditLog>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for AuditService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let Some(log) = self
            .log
            .clone()
            .filter(|log| log.level() != AuditLevel::None)
        else {
            return Box::pin(self.inner.call(request));
        };
        let entry = Entry::new(log, request.uri().path().to_owned(), &request);
        request.extensions_mut().insert(entry.note.clone());
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            let mut entry = entry;
            if let Some(code) = crate::metrics::grpc::status_code(response.headers()) {
                entry.reason_from(response.headers());
                entry.finish(code);
                return Ok(response);
            }
            Ok(response.map(|body| {
                tonic::body::Body::new(crate::metrics::grpc::StatusBody::new(
                    body,
                    move |code, trailers: Option<&http::HeaderMap>| {
                        let mut entry = entry;
                        if let Some(trailers) = trailers {
                            entry.reason_from(trailers);
                        }
                        entry.finish(code);
                    },
                ))
            }))
        })
    }
}

/// One request on its way to the log: written once, when its status is known.
pub(crate) struct Entry {
    log: AuditLog,
    note: Note,
    started: Instant,
    time: time::OffsetDateTime,
    method: String,
    peer: String,
    credentials: bool,
    done: bool,
}

impl Entry {
    /// An entry for `request` (its peer and whether it carries credentials), whose note the
    /// handler fills in.
    pub(crate) fn new<B>(log: AuditLog, method: String, request: &http::Request<B>) -> Entry {
        let note = Note::default();
        note.with(|n| n.wants_body = log.level() == AuditLevel::Request);
        Entry {
            log,
            note,
            started: Instant::now(),
            time: time::OffsetDateTime::now_utc(),
            method,
            peer: request
                .extensions()
                .get::<ConnInfo>()
                .and_then(|info| info.remote)
                .map(|addr| addr.to_string())
                .unwrap_or_default(),
            credentials: request.headers().contains_key(proto::TOKEN_HEADER)
                || request.headers().contains_key(http::header::AUTHORIZATION),
            done: false,
        }
    }

    pub(crate) fn note(&self) -> &Note {
        &self.note
    }

    /// The reason of a refusal, from its status details (`google.rpc.ErrorInfo`).
    fn reason_from(&mut self, headers: &http::HeaderMap) {
        if !headers.contains_key("grpc-status-details-bin") {
            return;
        }
        if let Some(status) = tonic::Status::from_header_map(headers)
            && let Some(details) = proto::reason::of(&status)
        {
            self.note.reason(details.reason.as_str());
        }
    }

    pub(crate) fn finish(&mut self, code: tonic::Code) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let (token, authorized, resource, reason, body) = self.note.with(|n| {
            (
                n.token.take(),
                n.authorized,
                n.resource.take(),
                n.reason.take(),
                n.body.take(),
            )
        });
        if !self.credentials && !authorized {
            return;
        }
        let mut line = serde_json::json!({
            "time": self
                .time
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
            "token": token.unwrap_or_default(),
            "peer": self.peer,
            "method": self.method,
            "resource": resource.unwrap_or_default(),
            "code": crate::metrics::grpc::code_name(code),
            "reason": reason.unwrap_or_default(),
            "latency_ms": (self.started.elapsed().as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0,
        });
        if self.log.level() == AuditLevel::Request
            && let (Some(body), serde_json::Value::Object(fields)) = (body, &mut line)
        {
            let text = body.to_string();
            fields.insert(
                "body".into(),
                if text.len() > MAX_BODY_BYTES {
                    serde_json::json!({ "truncated": true, "bytes": text.len() })
                } else {
                    body
                },
            );
        }
        self.log.send(line.to_string());
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        // The body was dropped before its trailers: the client went away.
        self.finish(tonic::Code::Cancelled);
    }
}

/// A message as JSON, for the log (its types resolved in `pool`, which holds the registered
/// types too); what cannot be rendered says why instead.
pub(crate) fn body_of<T: prost::Message + prost::Name>(
    pool: &prost_reflect::DescriptorPool,
    message: &T,
) -> serde_json::Value {
    // A large body is said by its size, never rendered (a request of megabytes would cost
    // several times its size here).
    let bytes = message.encoded_len();
    if bytes > MAX_BODY_BYTES {
        return serde_json::json!({ "truncated": true, "bytes": bytes });
    }
    let Some(descriptor) = pool.get_message_by_name(&T::full_name()) else {
        return serde_json::json!({ "unrendered": format!("{} is not published", T::full_name()) });
    };
    let encoded = message.encode_to_vec();
    match prost_reflect::DynamicMessage::decode(descriptor, encoded.as_slice()) {
        Ok(dynamic) => serde_json::to_value(&dynamic)
            .unwrap_or_else(|error| serde_json::json!({ "unrendered": error.to_string() })),
        Err(error) => serde_json::json!({ "unrendered": error.to_string() }),
    }
}

/// The note of a tonic request (none when the log is off).
pub(crate) fn note_of<T>(request: &tonic::Request<T>) -> Option<&Note> {
    request.extensions().get::<Note>()
}

tokio::task_local! {
    /// The note of the HTTP request being handled: the HTTP API's calls of the gRPC
    /// implementations carry it (see `http::api`).
    pub(crate) static HTTP_NOTE: Note;
}

/// The gRPC code an HTTP API status stands for (the API maps codes to statuses one way).
pub(crate) fn code_of_http(status: http::StatusCode) -> tonic::Code {
    use tonic::Code;
    match status.as_u16() {
        200..=299 => Code::Ok,
        400 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        409 => Code::Aborted,
        412 => Code::FailedPrecondition,
        413 | 429 => Code::ResourceExhausted,
        499 => Code::Cancelled,
        501 => Code::Unimplemented,
        503 => Code::Unavailable,
        504 => Code::DeadlineExceeded,
        _ => Code::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_are_known_in_every_spelling() {
        for secret in [
            "secret",
            "secretHash",
            "joinToken",
            "join_token",
            "token",
            "accessToken",
            "api_key",
            "apiKey",
            "privateKeyPem",
            "private_key_pem",
            "dbPassword",
            "credentials",
            "bearer",
        ] {
            assert!(is_secret(secret), "{secret}");
        }
        for plain in [
            "pageToken",
            "next_page_token",
            "name",
            "policies",
            "keyspace",
            "tokens_used_by",
        ] {
            assert!(!is_secret(plain), "{plain}");
        }
    }

    #[test]
    fn secrets_are_redacted_at_any_depth() {
        let mut body = serde_json::json!({
            "resource": {"data": {"secret": "s3cr3t", "secretHash": "sha256:x", "policies": ["a"]}},
            "joinToken": "j",
            "list": [{"password": "p"}],
        });
        redact(&mut body);
        let text = body.to_string();
        for secret in ["s3cr3t", "sha256:x", "\"j\"", "\"p\""] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert!(text.contains("policies"));
    }

    #[test]
    fn the_log_rotates_by_size_and_keeps_its_files() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("audit.log");
        let lost = prometheus_client::metrics::counter::Counter::default();
        let mut writer = Writer {
            config: AuditConfig {
                path: path.clone(),
                level: AuditLevel::Metadata,
                max_bytes: 100,
                files: 2,
            },
            file: None,
            size: 0,
            said: Arc::new(AtomicBool::new(false)),
            lost_counter: lost.clone(),
        };
        for n in 0..20 {
            writer.write(&format!(
                "{{\"line\":{n:02},\"pad\":\"{}\"}}",
                "x".repeat(20)
            ));
        }
        let current = std::fs::read_to_string(&path).expect("current");
        assert!(current.len() <= 100, "{} bytes", current.len());
        assert!(current.contains("\"line\":19"));
        assert!(path.with_extension("log.1").exists());
        assert!(path.with_extension("log.2").exists());
        assert!(
            !path.with_extension("log.3").exists(),
            "only 2 rotated files are kept"
        );
        assert_eq!(lost.get(), 0);
    }

    #[test]
    fn a_log_that_cannot_be_written_counts_its_lost_lines() {
        let dir = tempfile::tempdir().expect("dir");
        // A directory where the file should be: every write fails.
        let path = dir.path().join("audit.log");
        std::fs::create_dir(&path).expect("dir");
        let lost = prometheus_client::metrics::counter::Counter::default();
        let mut writer = Writer {
            config: AuditConfig {
                path,
                level: AuditLevel::Metadata,
                max_bytes: 1 << 20,
                files: 1,
            },
            file: None,
            size: 0,
            said: Arc::new(AtomicBool::new(false)),
            lost_counter: lost.clone(),
        };
        for _ in 0..3 {
            writer.write("{}");
        }
        assert_eq!(lost.get(), 3);
    }
}
