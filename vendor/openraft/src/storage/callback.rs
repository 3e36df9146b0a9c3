//! Callbacks used by Storage API

use std::io;

use tokio::sync::oneshot;

use crate::async_runtime::AsyncOneshotSendExt;
use crate::core::notify::Notify;
use crate::raft_state::io_state::log_io_id::LogIOId;
use crate::type_config::alias::OneshotSenderOf;
use crate::LogId;
use crate::RaftTypeConfig;
use crate::StorageIOError;

/// A oneshot callback for completion of log io operation.
pub struct LogFlushed<C>
where C: RaftTypeConfig
{
    log_io_id: LogIOId<C::NodeId>,
    to: FlushedTo<C>,
}

/// Where a flush is reported: to a caller waiting for it, or (a leader's own entries, which it
/// replicates while they are written) to `RaftCore` as a notification.
enum FlushedTo<C>
where C: RaftTypeConfig
{
    Caller(OneshotSenderOf<C, Result<LogIOId<C::NodeId>, io::Error>>),
    Core(tokio::sync::mpsc::UnboundedSender<Notify<C>>),
}

impl<C> LogFlushed<C>
where C: RaftTypeConfig
{
    pub(crate) fn new(
        log_io_id: LogIOId<C::NodeId>,
        tx: OneshotSenderOf<C, Result<LogIOId<C::NodeId>, io::Error>>,
    ) -> Self {
        Self {
            log_io_id,
            to: FlushedTo::Caller(tx),
        }
    }

    /// A callback that reports to `RaftCore` through its notification channel.
    pub(crate) fn to_core(log_io_id: LogIOId<C::NodeId>, tx_notify: tokio::sync::mpsc::UnboundedSender<Notify<C>>) -> Self {
        Self {
            log_io_id,
            to: FlushedTo::Core(tx_notify),
        }
    }

    /// Report log io completion event.
    ///
    /// It will be called when the log is successfully appended to the storage or an error occurs.
    pub fn log_io_completed(self, result: Result<(), io::Error>) {
        if let Err(e) = &result {
            tracing::error!("LogFlush error: {}, while flushing upto {}", e, self.log_io_id);
        }
        match self.to {
            FlushedTo::Caller(tx) => {
                let res = match result {
                    Err(e) => tx.send(Err(e)),
                    Ok(()) => tx.send(Ok(self.log_io_id)),
                };
                if let Err(e) = res {
                    tracing::error!("failed to send log io completion event: {:?}", e);
                }
            }
            FlushedTo::Core(tx_notify) => {
                let notify = Notify::LocalLogFlushed {
                    log_io_id: self.log_io_id,
                    result: result.map_err(|e| e.to_string()),
                };
                if tx_notify.send(notify).is_err() {
                    tracing::debug!("RaftCore is gone; log io completion not delivered");
                }
            }
        }
    }
}

/// A oneshot callback for completion of applying logs to state machine.
pub struct LogApplied<C>
where C: RaftTypeConfig
{
    last_log_id: LogId<C::NodeId>,
    tx: oneshot::Sender<Result<(LogId<C::NodeId>, Vec<C::R>), StorageIOError<C::NodeId>>>,
}

impl<C> LogApplied<C>
where C: RaftTypeConfig
{
    #[allow(dead_code)]
    pub(crate) fn new(
        last_log_id: LogId<C::NodeId>,
        tx: oneshot::Sender<Result<(LogId<C::NodeId>, Vec<C::R>), StorageIOError<C::NodeId>>>,
    ) -> Self {
        Self { last_log_id, tx }
    }

    /// Report apply io completion event.
    ///
    /// It will be called when the log is successfully applied to the state machine or an error
    /// occurs.
    pub fn completed(self, result: Result<Vec<C::R>, StorageIOError<C::NodeId>>) {
        let res = match result {
            Ok(x) => {
                tracing::debug!("LogApplied upto {}", self.last_log_id);
                let resp = (self.last_log_id.clone(), x);
                self.tx.send(Ok(resp))
            }
            Err(e) => {
                tracing::error!("LogApplied error: {}, while applying upto {}", e, self.last_log_id);
                self.tx.send(Err(e))
            }
        };

        if let Err(_e) = res {
            tracing::error!("failed to send apply complete event, last_log_id: {}", self.last_log_id);
        }
    }
}
