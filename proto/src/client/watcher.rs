//! A `WatchList` stream that survives server restarts and leader changes: it resumes from the
//! last version it delivered, and when the server can no longer resume (its event history moved
//! on, or a snapshot restore replaced the state) it says so and starts over with a fresh
//! snapshot, so consumers never miss an event silently.

use std::time::Duration;

use crate::resource::v1::{WatchEvent, WatchListRequest};

use super::{Client, ClientError};

/// What a [`Watcher`] saw next. (Events are the common case, so they are not boxed.)
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum WatchUpdate {
    /// An event of the stream (an upsert, a delete or the end of the initial snapshot).
    Event(WatchEvent),
    /// The stream broke; the watcher waits `retry_in` and resumes.
    Disconnected { error: String, retry_in: Duration },
    /// The stream is back, resumed after `since_version` with nothing missed, from `server`
    /// (another member than before when the client knows several).
    Resumed {
        since_version: String,
        server: String,
    },
    /// The server could not resume (`reason`); a fresh snapshot follows (upserts for every
    /// current match, then `EndOfSnapshot`). Consumers must drop what they hold and rebuild.
    Relisting { reason: String },
    /// The watch cannot continue (a bad request, permission denied); nothing follows.
    Failed(ClientError),
}

#[allow(clippy::large_enum_variant)]
enum State {
    Connecting { after_disconnect: bool },
    Streaming(tonic::Streaming<WatchEvent>),
    Backoff(Duration),
    Done,
}

/// A resumable watch; call [`Watcher::next`] in a loop. `None` only after `Failed`.
pub struct Watcher {
    client: Client,
    request: WatchListRequest,
    /// The resume point: the version of the last change delivered after the initial
    /// snapshot (snapshot upserts carry each resource's own version, which is no resume point;
    /// the snapshot's `EndOfSnapshot` carries the version it is consistent at).
    last_version: String,
    /// Whether the stream is still in its initial snapshot.
    in_snapshot: bool,
    state: State,
    backoff: Duration,
    /// The server the current stream comes from (its index in the client's list).
    server: usize,
    /// Moves to another member since the last event: immediate for one round of the
    /// members, then with backoff (every member refusing must not spin).
    moves: usize,
}

const MIN_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

impl Watcher {
    pub(super) fn new(client: Client, request: WatchListRequest) -> Watcher {
        Watcher {
            client,
            last_version: request.since_version.clone(),
            in_snapshot: request.since_version.is_empty(),
            request,
            state: State::Connecting {
                after_disconnect: false,
            },
            backoff: MIN_BACKOFF,
            server: 0,
            moves: 0,
        }
    }

    /// The version of the last event delivered (empty before the first).
    pub fn last_version(&self) -> &str {
        &self.last_version
    }

    pub async fn next(&mut self) -> Option<WatchUpdate> {
        loop {
            let state = std::mem::replace(&mut self.state, State::Done);
            match state {
                State::Done => return None,
                State::Backoff(delay) => {
                    tokio::time::sleep(delay).await;
                    self.state = State::Connecting {
                        after_disconnect: true,
                    };
                }
                State::Connecting { after_disconnect } => {
                    let mut request = self.request.clone();
                    request.since_version = self.last_version.clone();
                    match self.client.watch_list(request).await {
                        Ok(stream) => {
                            self.server = self.client.server_index();
                            self.state = State::Streaming(stream);
                            if !after_disconnect {
                                continue;
                            }
                            if self.last_version.is_empty() {
                                // Broken inside the first snapshot: it starts over.
                                self.in_snapshot = true;
                                return Some(WatchUpdate::Relisting {
                                    reason: "the connection broke during the initial snapshot"
                                        .into(),
                                });
                            }
                            return Some(WatchUpdate::Resumed {
                                since_version: self.last_version.clone(),
                                server: self.client.server().to_owned(),
                            });
                        }
                        Err(error) => return Some(self.on_error(error)),
                    }
                }
                State::Streaming(mut stream) => match stream.message().await {
                    Ok(Some(event)) => {
                        self.backoff = MIN_BACKOFF;
                        self.moves = 0;
                        let end_of_snapshot = matches!(
                            event.event,
                            Some(crate::resource::v1::watch_event::Event::EndOfSnapshot(_))
                        );
                        if end_of_snapshot {
                            self.in_snapshot = false;
                        }
                        if (end_of_snapshot || !self.in_snapshot) && !event.version.is_empty() {
                            self.last_version = event.version.clone();
                        }
                        self.state = State::Streaming(stream);
                        return Some(WatchUpdate::Event(event));
                    }
                    Ok(None) => {
                        return Some(self.disconnected("the server ended the stream".into()));
                    }
                    Err(status) => {
                        let error = self.client.decode(&status);
                        return Some(self.on_error(error));
                    }
                },
            }
        }
    }

    fn on_error(&mut self, error: ClientError) -> WatchUpdate {
        match error {
            // The history no longer reaches our version, or a restore replaced the state.
            ClientError::OutOfRange {
                message: reason, ..
            }
            | ClientError::Conflict {
                message: reason, ..
            } => {
                self.last_version.clear();
                self.in_snapshot = true;
                self.state = State::Connecting {
                    after_disconnect: false,
                };
                WatchUpdate::Relisting { reason }
            }
            error if error.is_retryable() => self.disconnected(error.to_string()),
            ClientError::Other { code, message }
                if matches!(
                    code,
                    tonic::Code::Unknown | tonic::Code::Cancelled | tonic::Code::Internal
                ) =>
            {
                self.disconnected(format!("{code:?}: {message}"))
            }
            ClientError::DeadlineExceeded { message, .. } => self.disconnected(message),
            error => {
                self.state = State::Done;
                WatchUpdate::Failed(error)
            }
        }
    }

    fn disconnected(&mut self, error: String) -> WatchUpdate {
        // With other members to go to, resume there at once (the version is the same
        // everywhere, so nothing is missed or repeated) — once round the members; after that,
        // every one of them refused since the last event, and the next try waits.
        let moved = self.client.fail_over_from(self.server);
        if moved {
            self.moves += 1;
            if self.moves < self.client.server_count() {
                self.state = State::Backoff(Duration::ZERO);
                return WatchUpdate::Disconnected {
                    error,
                    retry_in: Duration::ZERO,
                };
            }
            self.moves = 0;
        }
        let retry_in = self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        self.state = State::Backoff(retry_in);
        WatchUpdate::Disconnected { error, retry_in }
    }
}
