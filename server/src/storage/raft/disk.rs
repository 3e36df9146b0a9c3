//! Disk space under a data directory: what is free, the reserve below which new writes are
//! refused before they reach the log (like etcd's NOSPACE alarm, but lifted by itself), and
//! waiting out a full disk instead of failing.
//!
//! Nothing a full disk does stops raft: the log preallocates its segments and the state machine
//! its file ahead of need, so the writes that commit and apply entries never need new blocks;
//! what does need them — a new segment, more room for the state machine, a snapshot — waits,
//! saying so once, and goes on when space returns. Meanwhile the node refuses new writes
//! (`StorageError::NoSpace`, RESOURCE_EXHAUSTED) while the free space is under the reserve, and
//! says so in `Status`, `resd_disk_free_bytes` and the dashboard (`/readyz` counts the alarms).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::storage::StorageError;

/// How long a wait for space pauses between tries.
const RETRY: Duration = Duration::from_millis(500);

/// Whether an error is a full disk (or a full quota of the filesystem's).
pub(crate) fn is_no_space(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(code) if code == rustix::io::Errno::NOSPC.raw_os_error()
            || code == rustix::io::Errno::DQUOT.raw_os_error()
    )
}

/// Whether an LMDB error is a full disk.
pub(crate) fn is_lmdb_no_space(error: &heed::Error) -> bool {
    match error {
        heed::Error::Io(error) => is_no_space(error),
        heed::Error::Mdb(error) => is_no_space(&io::Error::from_raw_os_error(error.to_err_code())),
        _ => false,
    }
}

/// Free space under a data directory, as last measured.
#[derive(Debug)]
pub struct DiskSpace {
    path: PathBuf,
    reserve: u64,
    /// Bytes free to this process, `u64::MAX` until measured.
    free: AtomicU64,
    /// Set when the node stops: waits for space give up.
    stopping: AtomicBool,
}

impl DiskSpace {
    pub fn new(path: &Path, reserve: u64) -> DiskSpace {
        let space = DiskSpace {
            path: path.to_path_buf(),
            reserve,
            free: AtomicU64::new(u64::MAX),
            stopping: AtomicBool::new(false),
        };
        let _ = space.refresh();
        space
    }

    /// Measures the free space again (`statvfs`).
    pub fn refresh(&self) -> io::Result<u64> {
        let stat = rustix::fs::statvfs(&self.path)?;
        let free = stat.f_bavail.saturating_mul(stat.f_frsize);
        self.free.store(free, Ordering::Relaxed);
        Ok(free)
    }

    /// The free space under which new writes are refused.
    pub fn reserve(&self) -> u64 {
        self.reserve
    }

    pub fn free(&self) -> u64 {
        self.free.load(Ordering::Relaxed)
    }

    /// Why new writes are refused now, if they are.
    pub fn alarm(&self) -> Option<String> {
        let free = self.free();
        (free < self.reserve).then(|| {
            format!(
                "the disk holding {} has {} free, below the reserve of {}: new writes are refused until space is freed (deletes still work; --disk-reserve-bytes sets the reserve)",
                self.path.display(),
                proto::bytes_label(free),
                proto::bytes_label(self.reserve)
            )
        })
    }

    /// `Ok` while the free space is above the reserve.
    pub fn check_room(&self) -> Result<(), StorageError> {
        match self.alarm() {
            None => Ok(()),
            Some(why) => Err(StorageError::NoSpace(why)),
        }
    }

    /// Makes every wait for space give up (the node is stopping).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// Runs `attempt` until it does anything but fail for a full disk (which `full` tells);
    /// while the disk is full, waits and tries again (saying so once, naming `what`), until the
    /// node stops.
    pub fn wait_out<T, E: std::fmt::Display>(
        &self,
        what: &str,
        full: impl Fn(&E) -> bool,
        mut attempt: impl FnMut() -> Result<T, E>,
    ) -> Result<T, E> {
        let mut said = false;
        loop {
            match attempt() {
                Err(error) if full(&error) && !self.stopping.load(Ordering::SeqCst) => {
                    let free = self.refresh().unwrap_or(0);
                    if !said {
                        tracing::error!(
                            path = %self.path.display(),
                            free = %proto::bytes_label(free),
                            "the disk is full: {what} waits for space ({error}); nothing acknowledged is lost, and it goes on by itself once space is freed"
                        );
                        said = true;
                    }
                    std::thread::sleep(RETRY);
                }
                Ok(done) => {
                    if said {
                        tracing::info!(path = %self.path.display(), "space is back: {what} goes on");
                    }
                    return Ok(done);
                }
                Err(error) => return Err(error),
            }
        }
    }
}

/// [`DiskSpace::wait_out`] on the disk a node watches, or `attempt` once where none is watched
/// (a store opened on its own, in tests).
pub(crate) fn wait_out<T, E: std::fmt::Display>(
    disk: Option<&DiskSpace>,
    what: &str,
    full: impl Fn(&E) -> bool,
    mut attempt: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    match disk {
        Some(disk) => disk.wait_out(what, full, attempt),
        None => attempt(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_waited_out_and_other_errors_are_not() {
        let dir = tempfile::tempdir().expect("temp dir");
        let space = DiskSpace::new(dir.path(), 0);
        assert!(space.free() > 0 && space.alarm().is_none());
        let mut tries = 0;
        let done = space.wait_out("a test", is_no_space, || {
            tries += 1;
            if tries < 3 {
                Err(io::Error::from_raw_os_error(
                    rustix::io::Errno::NOSPC.raw_os_error(),
                ))
            } else {
                Ok(tries)
            }
        });
        assert_eq!(done.expect("waited out"), 3);
        let other = space.wait_out("a test", is_no_space, || -> io::Result<()> {
            Err(io::Error::other("broken"))
        });
        assert_eq!(other.expect_err("not waited out").to_string(), "broken");
        space.stop();
        let stopped = space.wait_out("a test", is_no_space, || -> io::Result<()> {
            Err(io::Error::from_raw_os_error(
                rustix::io::Errno::NOSPC.raw_os_error(),
            ))
        });
        assert!(stopped.is_err(), "a stopping node does not wait");
    }

    #[test]
    fn under_the_reserve_new_writes_are_refused_naming_the_path_and_the_free_space() {
        let dir = tempfile::tempdir().expect("temp dir");
        let space = DiskSpace::new(dir.path(), u64::MAX / 2);
        let Err(StorageError::NoSpace(why)) = space.check_room() else {
            panic!("room under the reserve");
        };
        assert!(
            why.contains(&dir.path().display().to_string())
                && why.contains("free, below the reserve"),
            "{why}"
        );
        assert_eq!(proto::bytes_label(1536), "1.5 KiB");
        assert_eq!(proto::bytes_label(12), "12 B");
    }
}
