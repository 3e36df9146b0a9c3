//! The runtime: one loop that draws, waits for the next key, tick or background message,
//! applies it through [`update`], and carries out the effects. The network is only touched by
//! background tasks (one watch per type, the cluster poller, snapshot and delete work), so the
//! loop never waits on it; the editor is the one thing run in the foreground, with the
//! terminal handed over.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crossterm::event::{Event, EventStream};
use futures::StreamExt as _;
use proto::client::edit::{EditSession, run_editor};
use proto::client::{Client, ClientConfig, describe, snapshot_file};
use proto::cluster::v1::TypeInfo;
use proto::codec::{Codec, gvk};
use proto::resource::v1::WatchListRequest;
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tokio::task::JoinHandle;

use crate::msg::{ClusterReport, Effect, Msg, SnapshotMsg};
use crate::state::{SnapshotInfo, State, VerifyRow};
use crate::terminal::{self, Term};
use crate::update::update;
use crate::view;

/// How the dashboard runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// How often cluster status, members and controllers are refreshed.
    pub refresh: Duration,
    /// `:` commands run once the type registry has been read (a type to open, `ns …`).
    pub start: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            refresh: Duration::from_secs(2),
            start: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TuiError {
    #[error(
        "the dashboard needs a terminal: stdin and stdout must both be one (use resctl get/watch in scripts)"
    )]
    NotATerminal,
    #[error("terminal error: {0}")]
    Terminal(#[from] std::io::Error),
}

/// Most messages applied before the next frame is drawn (a burst of watch events is applied
/// in batches, one sort and one frame per batch).
const BATCH: usize = 4_096;
/// Versions of a resource's history the detail screen reads (newest first).
const HISTORY_SHOWN: usize = 200;

/// Runs the dashboard until the user quits.
pub async fn run(client: Client, options: Options) -> Result<(), TuiError> {
    use std::io::IsTerminal as _;
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        return Err(TuiError::NotATerminal);
    }
    let mut terminal = terminal::enter()?;
    let _guard = terminal::Guard;
    let (tx, rx) = unbounded_channel();
    let mut tasks = Tasks::new(client.clone(), tx, options);
    tasks.start();
    let result = event_loop(&mut terminal, &mut tasks, rx).await;
    tasks.stop();
    result
}

async fn event_loop(
    terminal: &mut Term,
    tasks: &mut Tasks,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Msg>,
) -> Result<(), TuiError> {
    let mut state = State::new(tasks.client.server(), SystemTime::now());
    state.start = tasks.options.start.clone();
    let mut keys = EventStream::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    #[cfg(unix)]
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    #[cfg(unix)]
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    loop {
        state.page = view::page_rows(terminal.size()?.height);
        state.prepare();
        terminal.draw(|frame| view::render(&state, frame))?;
        #[cfg(unix)]
        let signalled = async {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = hangup.recv() => {}
            }
        };
        #[cfg(not(unix))]
        let signalled = std::future::pending::<()>();
        let msg = tokio::select! {
            event = keys.next() => match event {
                Some(Ok(Event::Key(key))) => Msg::Key(key),
                Some(Ok(Event::Resize(..))) => Msg::Resize,
                Some(Ok(_)) => continue,
                Some(Err(error)) => return Err(error.into()),
                None => return Ok(()),
            },
            Some(msg) = rx.recv() => msg,
            _ = tick.tick() => Msg::Tick(SystemTime::now()),
            () = signalled => return Ok(()),
        };
        let mut effects = update(&mut state, msg);
        let mut applied = 1;
        while applied < BATCH
            && let Ok(msg) = rx.try_recv()
        {
            effects.extend(update(&mut state, msg));
            applied += 1;
        }
        for effect in effects {
            match effect {
                Effect::Edit(session) => {
                    // The editor owns the terminal (and stdin) until it exits.
                    drop(keys);
                    terminal::suspend();
                    let edited = tokio::task::spawn_blocking(move || {
                        let text = session.edit_with(&mut run_editor);
                        (session, text)
                    })
                    .await;
                    terminal::resume(terminal)?;
                    keys = EventStream::new();
                    match edited {
                        Ok((session, Ok(text))) => {
                            tasks.submit_edit(session, text, state.codec.clone())
                        }
                        Ok((session, Err(error))) => {
                            let _ = tasks.tx.send(Msg::EditRound {
                                session,
                                result: Err(error.to_string()),
                            });
                        }
                        Err(error) => state.flash_error(format!("the editor task failed: {error}")),
                    }
                }
                effect => tasks.run(effect, &state),
            }
        }
        if state.quit {
            return Ok(());
        }
    }
}

/// The background work and its handles.
struct Tasks {
    client: Client,
    tx: UnboundedSender<Msg>,
    options: Options,
    background: Vec<JoinHandle<()>>,
    /// The snapshot save, restore or verification under way (cancellable).
    snapshot: Option<JoinHandle<()>>,
}

impl Tasks {
    fn new(client: Client, tx: UnboundedSender<Msg>, options: Options) -> Tasks {
        Tasks {
            client,
            tx,
            options,
            background: Vec::new(),
            snapshot: None,
        }
    }

    fn start(&mut self) {
        let client = self.client.clone();
        let tx = self.tx.clone();
        self.background.push(tokio::spawn(async move {
            let mut delay = Duration::from_millis(500);
            loop {
                match client.list_types().await {
                    Ok(types) => {
                        let _ = tx.send(Msg::Types(Ok(types)));
                        return;
                    }
                    Err(error) => {
                        if tx.send(Msg::Types(Err(error.to_string()))).is_err() {
                            return;
                        }
                    }
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }));
        let client = self.client.clone();
        let tx = self.tx.clone();
        let refresh = self.options.refresh;
        self.background
            .push(tokio::spawn(poll_cluster(client, tx, refresh)));
    }

    fn stop(&mut self) {
        for task in self.background.drain(..) {
            task.abort();
        }
        if let Some(task) = self.snapshot.take() {
            task.abort();
        }
    }

    fn run(&mut self, effect: Effect, state: &State) {
        match effect {
            Effect::Watch(types) => {
                for info in types {
                    self.background.push(self.watch(info));
                }
            }
            Effect::RefreshTypes => {
                let client = self.client.clone();
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    if let Ok(types) = client.list_types().await {
                        let _ = tx.send(Msg::Types(Ok(types)));
                    }
                });
            }
            // The event loop runs the editor itself: it needs the terminal and the key reader.
            Effect::Edit(_) => {}
            Effect::Delete {
                id,
                version,
                label,
                finalizers,
            } => {
                let client = self.client.clone();
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    let result = client
                        .delete(&id, &version)
                        .await
                        .map_err(|error| error.to_string());
                    let _ = tx.send(Msg::Deleted {
                        label,
                        finalizers,
                        result,
                    });
                });
            }
            Effect::History { at, id } => {
                let client = self.client.clone();
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    let result = client
                        .history(&id, HISTORY_SHOWN)
                        .await
                        .map_err(|error| error.to_string());
                    let _ = tx.send(Msg::History { at, result });
                });
            }
            Effect::TransferLeader(node) => {
                let client = self.client.clone();
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    let result = client
                        .transfer_leader(node)
                        .await
                        .map_err(|error| error.to_string());
                    let _ = tx.send(Msg::Transferred(result));
                });
            }
            Effect::SnapshotSave(path) => {
                let client = self.client.clone();
                let tx = self.tx.clone();
                self.replace_snapshot_task(tokio::spawn(async move {
                    let progress_tx = tx.clone();
                    let mut progress = move |written, total| {
                        let _ = progress_tx
                            .send(Msg::Snapshot(SnapshotMsg::SaveProgress { written, total }));
                    };
                    let result = snapshot_file::save(&client, &path, &mut progress)
                        .await
                        .map(info_of)
                        .map_err(|error| error.to_string());
                    let _ = tx.send(Msg::Snapshot(SnapshotMsg::Saved(result)));
                }));
            }
            Effect::SnapshotOpen(path) => {
                let tx = self.tx.clone();
                self.replace_snapshot_task(tokio::spawn(async move {
                    let result = tokio::task::spawn_blocking(move || open_snapshot(path))
                        .await
                        .unwrap_or_else(|error| Err(error.to_string()));
                    let _ = tx.send(Msg::Snapshot(SnapshotMsg::Opened(result)));
                }));
            }
            Effect::SnapshotRestore(path) => {
                let client = self.client.clone();
                let tx = self.tx.clone();
                self.replace_snapshot_task(tokio::spawn(async move {
                    let progress_tx = tx.clone();
                    let result = snapshot_file::restore(&client, &path, move |sent, total| {
                        let _ = progress_tx
                            .send(Msg::Snapshot(SnapshotMsg::RestoreProgress { sent, total }));
                    })
                    .await
                    .map(|(_, response)| response.restored_index)
                    .map_err(|error| {
                        format!("{error} — the cluster keeps the state it had before the restore")
                    });
                    let _ = tx.send(Msg::Snapshot(SnapshotMsg::Restored(result)));
                }));
            }
            Effect::SnapshotVerify(expected) => {
                let client = self.client.clone();
                let tx = self.tx.clone();
                let types: Vec<TypeInfo> = state
                    .codec
                    .as_ref()
                    .map(|codec| codec.types().to_vec())
                    .unwrap_or_default();
                self.replace_snapshot_task(tokio::spawn(async move {
                    let result = snapshot_file::cluster_counts(&client, &types)
                        .await
                        .map(|actual| verify_rows(&expected, &actual))
                        .map_err(|error| error.to_string());
                    let _ = tx.send(Msg::Snapshot(SnapshotMsg::Verified(result)));
                }));
            }
            Effect::SnapshotCancel => {
                if let Some(task) = self.snapshot.take() {
                    task.abort();
                }
            }
        }
    }

    fn replace_snapshot_task(&mut self, task: JoinHandle<()>) {
        if let Some(previous) = self.snapshot.replace(task) {
            previous.abort();
        }
    }

    fn watch(&self, info: TypeInfo) -> JoinHandle<()> {
        let resource_type = info.r#type.clone().unwrap_or_default();
        let key = gvk(&resource_type);
        let mut watcher = self.client.watcher(WatchListRequest {
            r#type: Some(resource_type),
            tenancy: Some(describe::every_tenancy(info.scope())),
            ..WatchListRequest::default()
        });
        let tx = self.tx.clone();
        tokio::spawn(async move {
            while let Some(update) = watcher.next().await {
                let msg = Msg::Watch {
                    gvk: key.clone(),
                    update,
                };
                if tx.send(msg).is_err() {
                    return;
                }
            }
        })
    }

    fn submit_edit(&self, mut session: Box<EditSession>, text: String, codec: Option<Arc<Codec>>) {
        let client = self.client.clone();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let result = match codec {
                Some(codec) => session
                    .submit(&client, &codec, &text)
                    .await
                    .map_err(|error| error.to_string()),
                None => Err("the type registry has not been read yet".into()),
            };
            let _ = tx.send(Msg::EditRound { session, result });
        });
    }
}

fn info_of(file: snapshot_file::SnapshotFile) -> SnapshotInfo {
    SnapshotInfo {
        path: file.path,
        bytes: file.bytes,
        header: file.header,
    }
}

fn open_snapshot(path: PathBuf) -> Result<SnapshotInfo, String> {
    snapshot_file::open(&path)
        .map(|(file, _)| info_of(file))
        .map_err(|error| error.to_string())
}

/// Every type either side has, with both counts.
pub fn verify_rows(
    expected: &BTreeMap<String, u64>,
    actual: &BTreeMap<String, u64>,
) -> Vec<VerifyRow> {
    let types: std::collections::BTreeSet<&String> = expected.keys().chain(actual.keys()).collect();
    types
        .into_iter()
        .map(|gvk| VerifyRow {
            gvk: gvk.clone(),
            expected: expected.get(gvk).copied().unwrap_or(0),
            actual: actual.get(gvk).copied().unwrap_or(0),
        })
        .collect()
}

/// Refreshes the cluster view every `refresh`: this node's status, the members, each member's
/// own status (asked directly, with a short deadline), and the controllers on every node.
async fn poll_cluster(client: Client, tx: UnboundedSender<Msg>, refresh: Duration) {
    let mut node_clients: BTreeMap<String, Result<Client, String>> = BTreeMap::new();
    loop {
        let status = client.status().await;
        let denied = match &status {
            Err(proto::client::ClientError::PermissionDenied {
                message: missing, ..
            }) => Some(format!(
                "your token cannot see the cluster's status, members or controllers ({missing}; it needs operator read)"
            )),
            _ => None,
        };
        let status = status.map_err(|error| error.to_string());
        let identity = match client.acl_who_am_i().await {
            Ok(me) if me.acls_enabled => Some(Ok(Some(me.accessor))),
            Ok(_) => Some(Ok(None)),
            Err(error) => Some(Err(error.to_string())),
        };
        let (members, controllers) = if status.is_ok() {
            let (members, controllers) =
                tokio::join!(client.members(), client.list_controllers(true));
            (
                Some(members.map_err(|error| error.to_string())),
                Some(controllers.map_err(|error| error.to_string())),
            )
        } else {
            (None, None)
        };
        let mut nodes = BTreeMap::new();
        if let Some(Ok(members)) = &members {
            let asks = members.members.iter().map(|member| {
                let node_client = node_clients
                    .entry(member.api_addr.clone())
                    .or_insert_with(|| node_client(&client, &member.api_addr))
                    .clone();
                let node_id = member.node_id;
                async move {
                    let status = match node_client {
                        Ok(node_client) => {
                            tokio::time::timeout(Duration::from_secs(2), node_client.status())
                                .await
                                .map_err(|_| "no answer within 2s".to_owned())
                                .and_then(|result| result.map_err(|error| error.to_string()))
                        }
                        Err(error) => Err(error),
                    };
                    (node_id, status)
                }
            });
            nodes = futures::future::join_all(asks).await.into_iter().collect();
        }
        let report = ClusterReport {
            status,
            members,
            nodes,
            controllers,
            denied,
            identity,
        };
        if tx.send(Msg::Cluster(Box::new(report))).is_err() {
            return;
        }
        tokio::time::sleep(refresh).await;
    }
}

/// A client for one member (its own status), without the retries a user-facing call has.
fn node_client(base: &Client, api_addr: &str) -> Result<Client, String> {
    let mut config: ClientConfig = base.config().clone();
    config.server = api_addr.to_owned();
    config.connect_timeout = Duration::from_secs(1);
    config.request_timeout = Duration::from_secs(2);
    config.unreachable_retry = Duration::ZERO;
    config.election_retry = Duration::ZERO;
    Client::new(config).map_err(|error| format!("cannot address {api_addr}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verification_lists_every_type_either_side_has() {
        let expected: BTreeMap<String, u64> = [("a".to_owned(), 2), ("b".to_owned(), 1)]
            .into_iter()
            .collect();
        let actual: BTreeMap<String, u64> = [("b".to_owned(), 1), ("c".to_owned(), 4)]
            .into_iter()
            .collect();
        let rows: Vec<(String, u64, u64)> = verify_rows(&expected, &actual)
            .into_iter()
            .map(|row| (row.gvk, row.expected, row.actual))
            .collect();
        assert_eq!(
            rows,
            [
                ("a".to_owned(), 2, 0),
                ("b".to_owned(), 1, 1),
                ("c".to_owned(), 0, 4)
            ]
        );
    }

    #[tokio::test]
    async fn a_member_address_that_cannot_be_used_is_reported_not_replaced() {
        let base = Client::new(ClientConfig::new("127.0.0.1:8502")).expect("client");
        assert!(node_client(&base, "127.0.0.1:8503").is_ok());
        let error = node_client(&base, "not an address at all").expect_err("invalid");
        assert!(error.contains("not an address at all"), "{error}");
    }
}
