//! Storage faults with real processes and real files: a second process on a data directory,
//! and a log damaged after a kill -9 (DESIGN §14, the storage fault paragraph). A node alone
//! cannot be repaired from anyone: it must refuse to start, naming the file and what to do,
//! and never serve a shorter history than the one it acknowledged.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use proto::resource::v1::WriteRequest;

use crate::process::Resd;
use crate::support::{artist, list_artists};

/// Runs `resd agent ARGS` to its exit (at most 30 s: a node that starts instead is killed and
/// the test fails).
fn run_to_exit(args: &[String]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_resd"))
        .arg("agent")
        .args(args)
        .env("RUST_LOG", "warn,openraft=error")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn resd");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match child.try_wait().expect("wait") {
            Some(_) => return child.wait_with_output().expect("output"),
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let output = child.wait_with_output().expect("output");
                panic!(
                    "resd {args:?} was expected to refuse to start but ran for 30 s: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// `args` with the data directory replaced by `dir` and fresh ports.
fn args_for(args: &[String], dir: &Path) -> Vec<String> {
    let mut args = args.to_vec();
    for (flag, value) in [
        ("--data-dir", dir.display().to_string()),
        ("--api-addr", "127.0.0.1:0".to_owned()),
        ("--raft-addr", "127.0.0.1:0".to_owned()),
    ] {
        let at = args.iter().position(|a| a == flag).expect("flag given");
        args[at + 1] = value;
    }
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_on_a_data_directory_exits_2_naming_the_first() {
    let mut first = Resd::start();
    let dir = first.data_dir().expect("data dir").to_path_buf();
    let output = run_to_exit(&args_for(first.args(), &dir));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    let pid = first.pid().expect("running");
    assert!(
        stderr.contains(&format!(
            "{} is in use by another resd process (PID {pid})",
            dir.display()
        )),
        "{stderr}"
    );
    // The first node still serves, and once it is gone the directory is free again.
    list_artists(&first).await;
    assert!(first.terminate().success());
    first.restart();
    list_artists(&first).await;
}

/// Copies a data directory (files and folders, not the lock's holder).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for item in std::fs::read_dir(from).expect("read dir") {
        let item = item.expect("entry");
        let target = to.join(item.file_name());
        if item.file_type().expect("type").is_dir() {
            copy_dir(&item.path(), &target);
        } else {
            std::fs::copy(item.path(), &target).expect("copy");
        }
    }
}

/// The newest raft log segment of a data directory.
fn newest_segment(data: &Path) -> PathBuf {
    let mut segments: Vec<PathBuf> = std::fs::read_dir(data.join("raft/wal"))
        .expect("the log")
        .map(|item| item.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "wal"))
        .collect();
    segments.sort();
    segments.pop().expect("a segment")
}

fn flip(path: &Path, at: u64) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open");
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at).expect("read");
    file.write_all_at(&[byte[0] ^ 0x5a], at).expect("write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_node_whose_log_was_damaged_after_a_kill_refuses_to_start_and_says_what_to_do() {
    let mut node = Resd::start();
    let mut client = node.resources().await;
    for i in 0..30 {
        client
            .write(WriteRequest {
                resource: Some(artist(&format!("acknowledged-{i}"))),
            })
            .await
            .expect("acknowledged write");
    }
    node.kill9();
    let data = node.data_dir().expect("data dir").to_path_buf();
    let scratch = tempfile::tempdir().expect("temp dir");
    let segment_name = newest_segment(&data).file_name().expect("name").to_owned();
    let last_written = {
        let bytes = std::fs::read(newest_segment(&data)).expect("read");
        bytes.iter().rposition(|&b| b != 0).expect("records") as u64
    };
    type Damage = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Damage, &str)> = vec![
        (
            "a flipped byte in the newest segment's header",
            Box::new(|segment: &Path| flip(segment, 10)),
            "is damaged at byte 0",
        ),
        (
            "a flipped byte in the last record",
            Box::new(move |segment: &Path| flip(segment, last_written - 3)),
            "was written whole",
        ),
        (
            "the newest segment cut in half",
            Box::new(|segment: &Path| {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(segment)
                    .expect("open");
                let len = file.metadata().expect("metadata").len();
                file.set_len(len / 2).expect("cut");
            }),
            "it was cut short",
        ),
        (
            "the newest segment deleted",
            Box::new(|segment: &Path| std::fs::remove_file(segment).expect("delete")),
            "holds no log segment",
        ),
    ];
    for (index, (what, damage, expected)) in cases.into_iter().enumerate() {
        let copy = scratch.path().join(index.to_string());
        copy_dir(&data, &copy);
        damage(&newest_segment(&copy));
        let output = run_to_exit(&args_for(node.args(), &copy));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{what}: {stderr}");
        assert!(
            stderr.contains(expected)
                && stderr.contains("knows no other voter to repair it from")
                && stderr.contains("restore the latest operator snapshot"),
            "{what}: expected {expected:?} and the recovery in {stderr}"
        );
        if what != "the newest segment deleted" {
            assert!(
                stderr.contains(&*segment_name.to_string_lossy()),
                "{what}: the file is named in {stderr}"
            );
        }
    }
    // The undamaged directory still holds every acknowledged write.
    node.restart();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let names = list_artists(&node).await.len();
        if names == 30 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{names} of 30 artists after the restart"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How many artists `node` holds now (a local read), or why it cannot say.
async fn artists_on(node: &Resd) -> Result<usize, tonic::Status> {
    use proto::resource::v1::{ListRequest, Tenancy};
    Ok(node
        .resources()
        .await
        .list(ListRequest {
            r#type: Some(crate::support::artist_type()),
            tenancy: Some(Tenancy {
                partition: "*".into(),
                namespace: "*".into(),
            }),
            name_prefix: String::new(),
            ..ListRequest::default()
        })
        .await?
        .into_inner()
        .resources
        .len())
}

/// The double fault: follower B stopped, writes acknowledged by the leader and follower A, A
/// killed and its log damaged, the leader lost. A must not vote for B (which lacks the writes):
/// the cluster waits, and once the leader is back A is repaired from it, with nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_follower_votes_for_nobody_until_repaired_and_no_acknowledged_write_is_lost() {
    let mut cluster = crate::process::Cluster::start(3, &[]).await;
    let leader = cluster.wait_for_leader().await;
    let followers: Vec<usize> = (0..3).filter(|index| *index != leader).collect();
    let (a, b) = (followers[0], followers[1]);
    cluster.nodes[b].kill9();
    let mut client = cluster.nodes[leader].resources().await;
    for i in 0..30 {
        client
            .write(WriteRequest {
                resource: Some(artist(&format!("acknowledged-{i}"))),
            })
            .await
            .expect("acknowledged by the leader and A");
    }
    cluster.nodes[a].kill9();
    flip(&newest_segment(&cluster.data_dir(a)), 10);
    cluster.nodes[leader].kill9();

    cluster.nodes[a].restart();
    cluster.nodes[b].restart();
    let status = cluster.nodes[a].status().await.expect("A answers");
    assert!(
        !status.ready
            && status
                .not_ready_reason
                .contains("repairing from the leader"),
        "{status:?}"
    );
    // B alone lacks the writes; A votes for nobody, so nobody leads.
    for _ in 0..25 {
        assert_eq!(
            cluster.leader().await,
            None,
            "a leader was elected without the acknowledged writes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    cluster.nodes[leader].restart();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut counts = Vec::new();
        for node in &cluster.nodes {
            counts.push(
                artists_on(node)
                    .await
                    .map_err(|status| status.message().to_owned()),
            );
        }
        let repaired = cluster.nodes[a]
            .status()
            .await
            .is_some_and(|status| status.ready);
        if repaired
            && counts
                .iter()
                .all(|count| count.as_ref().is_ok_and(|n| *n == 30))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not repaired within 60 s: artists per node {counts:?}, A repaired: {repaired}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let data = cluster.data_dir(a);
    assert!(!data.join("raft/REPAIRING").exists());
    let set_aside = std::fs::read_dir(data.join("raft"))
        .expect("raft dir")
        .filter_map(Result::ok)
        .any(|item| item.file_name().to_string_lossy().starts_with("damaged-"));
    assert!(set_aside, "the damaged log is kept for people");
    // And the cluster takes writes again, A among the nodes that acknowledge them.
    let leader = cluster.wait_for_leader().await;
    cluster.nodes[leader]
        .resources()
        .await
        .write(WriteRequest {
            resource: Some(artist("after-the-repair")),
        })
        .await
        .expect("a write after the repair");
}

/// Writes `count` artists through `node`, each acknowledged.
async fn write_artists(node: &Resd, count: usize) {
    let mut client = node.resources().await;
    for i in 0..count {
        client
            .write(WriteRequest {
                resource: Some(artist(&format!("acknowledged-{i}"))),
            })
            .await
            .expect("acknowledged write");
    }
}

/// A raft entry carries a batch of writes (about 20 with 64 clients), so a snapshot cadence
/// counted in entries built none under load: the log, and an unclean restart's replay, kept
/// every write. Counted in writes, 1,200 writes at 64 in flight build one by the 1,000th.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_build_snapshots_by_writes_not_by_entries() {
    use futures::StreamExt;
    let node = Resd::start_with(&["--snapshot-every", "1000"]);
    let client = node.resources().await;
    futures::stream::iter(0..1_200)
        .map(|i| {
            let mut client = client.clone();
            async move {
                client
                    .write(WriteRequest {
                        resource: Some(artist(&format!("batched-{i}"))),
                    })
                    .await
                    .expect("acknowledged write");
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<()>>()
        .await;
    let status = node.status().await.expect("status");
    wait_for_snapshot(&node, 1).await;
    let snapshot = node.status().await.expect("status").snapshot_index;
    assert!(
        snapshot <= status.applied_index,
        "the snapshot is of applied state: {snapshot} > {}",
        status.applied_index
    );
}

/// A snapshot that cannot be built (here: the directory it is built in cannot be made, as on a
/// disk that answers with I/O errors) used to stop raft on the node: every write after it
/// failed. Now raft goes on with the snapshot it has and the log behind it, and a later try,
/// once the disk lets it, builds the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_that_cannot_be_built_does_not_stop_the_node() {
    let node = Resd::start_with(&["--snapshot-every", "20"]);
    write_artists(&node, 30).await;
    wait_for_snapshot(&node, 20).await;
    let before = node.status().await.expect("status").snapshot_index;
    let snapshots = node
        .data_dir()
        .expect("data dir")
        .join("raft")
        .join("snapshots");
    let pid = node.pid().expect("pid");
    let blockers: Vec<PathBuf> = (0..64)
        .map(|sequence| snapshots.join(format!("building-{pid}-{sequence}")))
        .filter(|path| !path.exists())
        .collect();
    for blocker in &blockers {
        std::fs::write(blocker, b"not a directory").expect("block a build");
    }
    let mut client = node.resources().await;
    for i in 0..60 {
        client
            .write(WriteRequest {
                resource: Some(artist(&format!("while-blocked-{i}"))),
            })
            .await
            .expect("acknowledged while no snapshot can be built");
    }
    let status = node.status().await.expect("status");
    assert_eq!(status.snapshot_index, before, "no snapshot was built");
    for blocker in &blockers {
        std::fs::remove_file(blocker).expect("unblock");
    }
    for i in 0..30 {
        client
            .write(WriteRequest {
                resource: Some(artist(&format!("after-{i}"))),
            })
            .await
            .expect("acknowledged");
    }
    wait_for_snapshot(&node, status.applied_index).await;
}

/// The generation `raft/sm/CURRENT` names.
fn current_generation(data: &Path) -> u64 {
    std::fs::read_to_string(data.join("raft/sm/CURRENT"))
        .map_or(0, |text| text.trim().parse::<u64>().expect("a generation"))
}

/// Every snapshot rebases the live state onto a dense copy of itself (a new generation). A
/// rebase that cannot make its generation (here: a file where its directory goes, as on a disk
/// answering with errors) is abandoned: the node serves and acknowledges writes from the state
/// it has. Once it can, the next rebase swaps a generation in; a clean stop and a SIGKILL after
/// it lose nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebase_that_cannot_be_made_changes_nothing_and_restarts_after_one_lose_nothing() {
    let mut node = Resd::start_with(&["--snapshot-every", "20"]);
    let data = node.data_dir().expect("data dir").to_path_buf();
    let generation = current_generation(&data);
    let blocked = data.join(format!("raft/sm/{:020}", generation + 1));
    std::fs::write(&blocked, b"not a directory").expect("block the next generation");
    write_artists(&node, 30).await;
    wait_for_snapshot(&node, 20).await;
    assert_eq!(
        current_generation(&data),
        generation,
        "no rebase could be made"
    );
    wait_for_artists(&node, 30, "the live state after an abandoned rebase").await;

    std::fs::remove_file(&blocked).expect("unblock");
    let mut client = node.resources().await;
    for i in 0..40 {
        client
            .write(WriteRequest {
                resource: Some(artist(&format!("after-{i}"))),
            })
            .await
            .expect("acknowledged");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while current_generation(&data) == generation {
        assert!(
            Instant::now() < deadline,
            "no rebase within 30 s of unblocking"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for_artists(&node, 70, "the rebased state").await;

    node.terminate();
    node.restart();
    wait_for_artists(&node, 70, "after a clean stop following a rebase").await;
    node.kill9();
    node.restart();
    wait_for_artists(&node, 70, "after a SIGKILL following a rebase").await;
}

/// Waits until `node` has a raft snapshot at `index` or later (so its log is purged behind it).
async fn wait_for_snapshot(node: &Resd, index: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let snapshot = node
            .status()
            .await
            .map_or(0, |status| status.snapshot_index);
        if snapshot >= index {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no snapshot at {index} within 30 s: {snapshot}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `node` serves reads and holds `count` artists.
async fn wait_for_artists(node: &Resd, count: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = artists_on(node)
            .await
            .map_err(|status| status.message().to_owned());
        if found.as_ref().is_ok_and(|n| *n == count) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {count} artists expected, found {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The state machine's data file and the raft snapshot's, of a data directory.
fn state_file(data: &Path) -> PathBuf {
    let generation = current_generation(data);
    data.join(format!("raft/sm/{generation:020}/data.mdb"))
}

fn snapshot_dir(data: &Path) -> PathBuf {
    std::fs::read_dir(data.join("raft/snapshots"))
        .expect("snapshots")
        .map(|item| item.expect("entry").path())
        .find(|path| path.join("meta").exists())
        .expect("a snapshot")
}

fn cut_in_half(path: &Path) {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open");
    let len = file.metadata().expect("metadata").len();
    file.set_len(len / 2).expect("cut");
}

fn scribble(path: &Path) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open");
    let len = file.metadata().expect("metadata").len();
    for page in (2..len / 4096).step_by(2) {
        file.write_all_at(&[0xa5; 512], page * 4096 + 100)
            .expect("scribble");
    }
}

/// State-machine files cut or scribbled: rebuilt from the snapshot and the log when the node
/// stopped cleanly (the clean marker records what the file was), refused when the snapshot
/// itself is damaged and the log was purged behind it — never a crash, never a shorter state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_state_machine_files_are_rebuilt_or_refused_never_mapped() {
    let mut node = Resd::start_with(&["--snapshot-every", "20"]);
    write_artists(&node, 100).await;
    wait_for_snapshot(&node, 60).await;
    assert!(node.terminate().success(), "a clean stop");
    let clean = node.data_dir().expect("data dir").to_path_buf();
    let scratch = tempfile::tempdir().expect("temp dir");

    // After a clean stop: the state file damaged is rebuilt, every write still there.
    type Damage = fn(&Path);
    let rebuilt: [(&str, Damage); 2] = [
        ("the state file cut in half", |data| {
            cut_in_half(&state_file(data))
        }),
        ("the state file scribbled", |data| {
            scribble(&state_file(data))
        }),
    ];
    for (index, (what, damage)) in rebuilt.into_iter().enumerate() {
        let copy = scratch.path().join(format!("clean-{index}"));
        copy_dir(&clean, &copy);
        damage(&copy);
        let mut restarted = Resd::spawn(args_for(node.args(), &copy));
        wait_for_artists(&restarted, 100, what).await;
        assert!(restarted.terminate().success(), "{what}: a clean stop");
    }

    // After an unclean stop the state is rebuilt from the snapshot: a damaged or missing one
    // cannot be used, and a node alone refuses to start.
    node.restart();
    wait_for_artists(&node, 100, "the undamaged restart").await;
    node.kill9();
    let unclean = node.data_dir().expect("data dir").to_path_buf();
    let refused: [(&str, Damage); 3] = [
        ("the snapshot cut in half", |data| {
            cut_in_half(&snapshot_dir(data).join("data.mdb"))
        }),
        ("the snapshot scribbled", |data| {
            scribble(&snapshot_dir(data).join("data.mdb"))
        }),
        ("the snapshot deleted", |data| {
            std::fs::remove_dir_all(snapshot_dir(data)).expect("delete")
        }),
    ];
    for (index, (what, damage)) in refused.into_iter().enumerate() {
        let copy = scratch.path().join(format!("unclean-{index}"));
        copy_dir(&unclean, &copy);
        damage(&copy);
        let output = run_to_exit(&args_for(node.args(), &copy));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{what}: {stderr}");
        assert!(
            stderr.contains("cannot be rebuilt from this node's own data")
                && stderr.contains("restore the latest operator snapshot"),
            "{what}: {stderr}"
        );
    }
    node.restart();
    wait_for_artists(&node, 100, "the undamaged directory").await;
}

/// A follower whose snapshot is gone after a kill -9 cannot rebuild its state: it is repaired
/// from the leader, and holds every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_cannot_rebuild_its_state_is_repaired_from_the_leader() {
    let mut cluster = crate::process::Cluster::start(3, &["--snapshot-every", "20"]).await;
    let leader = cluster.wait_for_leader().await;
    let follower = (leader + 1) % 3;
    write_artists(&cluster.nodes[leader], 100).await;
    wait_for_snapshot(&cluster.nodes[follower], 60).await;
    cluster.nodes[follower].kill9();
    std::fs::remove_dir_all(snapshot_dir(&cluster.data_dir(follower))).expect("delete");
    cluster.nodes[follower].restart();
    wait_for_artists(&cluster.nodes[follower], 100, "the repaired follower").await;
    let status = cluster.nodes[follower].status().await.expect("status");
    assert!(status.ready, "{status:?}");
    assert!(!cluster.data_dir(follower).join("raft/REPAIRING").exists());
}

/// A tmpfs of `megabytes` mounted on a new directory, unmounted when dropped; `None` (the test
/// says it is skipped) where this process cannot mount, unless `RESD_DISK_FAULTS` asks for
/// these tests, which then fail.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(megabytes: u64) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().expect("temp dir");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={megabytes}m"), "tmpfs"])
            .arg(dir.path())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if !mounted {
            assert!(
                std::env::var_os("RESD_DISK_FAULTS").is_none(),
                "RESD_DISK_FAULTS is set, but a tmpfs cannot be mounted here (mounting needs root)"
            );
            eprintln!(
                "skipped: cannot mount a tmpfs here (run as root, or set RESD_DISK_FAULTS to insist)"
            );
            return None;
        }
        Some(SmallDisk { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills the disk with a file, then frees `leave` bytes of it.
    fn fill(&self, leave: u64) -> PathBuf {
        use std::io::Write;
        let path = self.path().join("filler");
        let mut file = std::fs::File::create(&path).expect("filler");
        let chunk = vec![0x5au8; 1 << 20];
        let mut written = 0u64;
        loop {
            match file.write(&chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => written += n as u64,
            }
        }
        let _ = file.sync_all();
        file.set_len(written.saturating_sub(leave))
            .expect("free some");
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

fn node_on(dir: &Path, extra: &[&str]) -> Resd {
    let mut args: Vec<String> = [
        "--node-id",
        "1",
        "--data-dir",
        &dir.join("node").display().to_string(),
        "--api-addr",
        "127.0.0.1:0",
        "--raft-addr",
        "127.0.0.1:0",
        "--bootstrap",
    ]
    .iter()
    .map(|arg| arg.to_string())
    .collect();
    args.extend(extra.iter().map(|arg| arg.to_string()));
    Resd::spawn(args)
}

async fn try_write(node: &Resd, name: &str) -> Result<(), tonic::Status> {
    node.resources()
        .await
        .write(WriteRequest {
            resource: Some(artist(name)),
        })
        .await
        .map(drop)
}

/// Writes `name` through `node` until the write is refused for room (within 10 s: the node
/// measures its disk every second, and writes land until it does); returns the refusal and how
/// many of the writes landed before it (0 or 1: they all write `name`).
async fn until_refused_for_room(node: &Resd, name: &str) -> (tonic::Status, usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut landed = 0;
    loop {
        match try_write(node, name).await {
            Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                return (status, landed);
            }
            Ok(()) => landed = 1,
            Err(other) => panic!("a write was refused, but not for room: {other:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "no write was refused for room within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Writes `name` through `node` until it lands (within `seconds` of space returning).
async fn until_written(node: &Resd, name: &str, seconds: u64) {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while let Err(status) = try_write(node, name).await {
        assert!(
            Instant::now() < deadline,
            "writes did not resume within {seconds} s of space returning: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Under the reserve, new writes are refused (RESOURCE_EXHAUSTED naming the path and what is
/// free) before they reach the log, the node says so, and takes writes again by itself once
/// space is freed; nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_under_its_reserve_refuses_new_writes_and_resumes_by_itself() {
    let Some(disk) = SmallDisk::mount(128) else {
        return;
    };
    let http = format!("127.0.0.1:{}", crate::process::free_port());
    let node = node_on(
        disk.path(),
        &["--disk-reserve-bytes", "16777216", "--http-addr", &http],
    );
    write_artists(&node, 20).await;
    let filler = disk.fill(4 << 20);
    let (refused, landed) = until_refused_for_room(&node, "while-full").await;
    // Load balancers keep sending reads; the open page counts the alarm without naming paths.
    let (code, body) = node.http_get("/readyz").expect("/readyz answers");
    assert!(
        code == 200
            && body.contains("1 alarm(s)")
            && !body.contains(&disk.path().display().to_string()),
        "{code} {body}"
    );
    assert!(
        refused
            .message()
            .contains(&disk.path().display().to_string())
            && refused.message().contains("free, below the reserve"),
        "{refused:?}"
    );
    let status = node.status().await.expect("status");
    assert!(
        status
            .alarms
            .iter()
            .any(|alarm| alarm.contains("below the reserve")),
        "{status:?}"
    );
    assert!(status.disk_free_bytes < 16 << 20, "{status:?}");
    // Reads still work, and nothing acknowledged is gone.
    assert_eq!(artists_on(&node).await.expect("reads"), 20 + landed);
    // Deletes make room, so they still work (their tombstones are the server's).
    node.resources()
        .await
        .delete(proto::resource::v1::DeleteRequest {
            id: Some(crate::support::artist_id("acknowledged-0")),
            version: String::new(),
        })
        .await
        .expect("a delete under the reserve");
    // 20 written, one deleted, and the one written after space returned.
    let expected = 20 + landed;

    std::fs::remove_file(&filler).expect("free the disk");
    until_written(&node, "after-space-returned", 10).await;
    assert_eq!(artists_on(&node).await.expect("reads"), expected);
    assert!(node.status().await.expect("status").alarms.is_empty());
}

/// With no reserve, a disk that fills up under raft: applying waits for room (raft never
/// stops), and once space returns the node goes on by itself with every acknowledged write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_under_raft_stalls_and_resumes_without_losing_a_write() {
    let Some(disk) = SmallDisk::mount(96) else {
        return;
    };
    let mut node = node_on(disk.path(), &["--disk-reserve-bytes", "0"]);
    write_artists(&node, 20).await;
    let filler = disk.fill(0);
    // Writes of 512 KiB now land in room that was allocated ahead, then stall; none is lost.
    let mut acknowledged = 20;
    let mut client = node.resources().await;
    for i in 0..60 {
        let mut big = artist(&format!("while-full-{i}"));
        big.data = Some(proto::to_any(&proto::demo::v1::Artist {
            name: format!("while-full-{i}"),
            description: "x".repeat(512 << 10),
            ..Default::default()
        }));
        let write = tokio::time::timeout(
            Duration::from_secs(3),
            client.write(WriteRequest {
                resource: Some(big),
            }),
        )
        .await;
        match write {
            Ok(Ok(_)) => acknowledged += 1,
            _ => break,
        }
    }
    assert!(
        acknowledged < 80,
        "the full disk stalled no write: the test did not test it"
    );
    std::fs::remove_file(&filler).expect("free the disk");
    until_written(&node, "after-space-returned", 20).await;
    let count = artists_on(&node).await.expect("reads");
    assert!(
        count > acknowledged,
        "{count} artists, but {acknowledged} writes were acknowledged before the one after"
    );
    // And a clean stop and start keep them.
    assert!(node.terminate().success(), "a clean stop");
    node.restart();
    wait_for_artists(&node, count, "after a restart").await;
}

/// `--quota-bytes` bounds the state: a write that would pass it is refused before it reaches
/// the log (RESOURCE_EXHAUSTED naming the quota and the usage), and deleting makes room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_past_the_quota_is_refused_before_the_log_and_deletes_make_room() {
    use proto::resource::v1::DeleteRequest;
    let node = Resd::start_with(&["--quota-bytes", "2097152"]);
    let mut client = node.resources().await;
    let big = |i: usize| {
        let mut resource = artist(&format!("big-{i}"));
        resource.data = Some(proto::to_any(&proto::demo::v1::Artist {
            name: format!("big-{i}"),
            description: "q".repeat(100 << 10),
            ..Default::default()
        }));
        resource
    };
    let mut stored = 0;
    let refused = loop {
        match client
            .write(WriteRequest {
                resource: Some(big(stored)),
            })
            .await
        {
            Ok(_) => stored += 1,
            Err(status) => break status,
        }
        assert!(
            stored < 100,
            "100 writes of 100 KiB passed a quota of 2 MiB"
        );
    };
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("quota") && refused.message().contains("2.0 MiB"),
        "{refused:?}"
    );
    assert!(
        stored >= 10,
        "only {stored} writes of 100 KiB fit a quota of 2 MiB"
    );
    let status = node.status().await.expect("status");
    assert!(
        status
            .alarms
            .iter()
            .any(|alarm| alarm.contains("of its quota of 2.0 MiB")),
        "{status:?}"
    );
    // Refused before the log: another refusal appends nothing.
    let before = node.status().await.expect("status").last_log_index;
    let again = client
        .write(WriteRequest {
            resource: Some(big(stored)),
        })
        .await
        .expect_err("still over the quota");
    assert_eq!(again.code(), tonic::Code::ResourceExhausted);
    assert_eq!(node.status().await.expect("status").last_log_index, before);
    // Deleting makes room.
    for i in 0..3 {
        client
            .delete(DeleteRequest {
                id: Some(crate::support::artist_id(&format!("big-{i}"))),
                version: String::new(),
            })
            .await
            .expect("delete");
    }
    client
        .write(WriteRequest {
            resource: Some(big(stored)),
        })
        .await
        .expect("room again after deletes");
}

/// A 512 KiB artist.
fn big_artist(name: &str) -> proto::resource::v1::Resource {
    let mut resource = artist(name);
    resource.data = Some(proto::to_any(&proto::demo::v1::Artist {
        name: name.into(),
        description: "b".repeat(512 << 10),
        ..Default::default()
    }));
    resource
}

/// Three nodes, each on a disk of its own. A full follower falls behind without stopping and
/// catches up once space returns, while the others take every write; a leader under its
/// reserve refuses new writes (through any member) until space returns. Nothing acknowledged
/// is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_disks_on_a_follower_and_on_the_leader_lose_nothing_and_resume() {
    let disks: Vec<SmallDisk> = match (0..3).map(|_| SmallDisk::mount(160)).collect() {
        Some(disks) => disks,
        None => return,
    };
    let mut nodes: Vec<Resd> = Vec::new();
    for (index, disk) in disks.iter().enumerate() {
        let mut args: Vec<String> = vec![
            "--node-id".into(),
            (index + 1).to_string(),
            "--data-dir".into(),
            disk.path().join("node").display().to_string(),
            "--api-addr".into(),
            format!("127.0.0.1:{}", crate::process::free_port()),
            "--raft-addr".into(),
            format!("127.0.0.1:{}", crate::process::free_port()),
            "--disk-reserve-bytes".into(),
            "16777216".into(),
        ];
        match nodes.first() {
            None => args.push("--bootstrap".into()),
            Some(first) => args.extend(["--join".into(), first.api_addr.to_string()]),
        }
        nodes.push(Resd::spawn(args));
    }
    // Node 1 bootstrapped and leads; wait for three voters.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let voters = nodes[0]
            .cluster()
            .await
            .members(proto::cluster::v1::MembersRequest {})
            .await
            .map(|reply| {
                reply
                    .into_inner()
                    .members
                    .iter()
                    .filter(|m| m.voter)
                    .count()
            })
            .unwrap_or(0);
        if voters == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "no 3 voters within 60 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let leader = 0;
    let follower = 2;
    let mut client = nodes[leader].resources().await;

    // The follower's disk fills up: the leader and the other follower go on.
    let filler = disks[follower].fill(0);
    for i in 0..60 {
        client
            .write(WriteRequest {
                resource: Some(big_artist(&format!("follower-full-{i}"))),
            })
            .await
            .expect("acknowledged by the leader and the other follower");
    }
    std::fs::remove_file(&filler).expect("free the follower's disk");
    wait_for_artists(
        &nodes[follower],
        60,
        "the follower after its disk had room again",
    )
    .await;

    // The leader's disk goes under its reserve: new writes are refused, also through a
    // follower, naming the leader's path.
    let filler = disks[leader].fill(4 << 20);
    let (refused, landed) = until_refused_for_room(&nodes[1], "leader-full").await;
    assert!(
        refused
            .message()
            .contains(&disks[leader].path().display().to_string()),
        "{refused:?}"
    );
    std::fs::remove_file(&filler).expect("free the leader's disk");
    until_written(&nodes[1], "after-the-leader-had-room", 10).await;
    for node in &nodes {
        wait_for_artists(node, 61 + landed, "every node at the end").await;
    }
}

/// Flips one byte of every copy of `needle` in `path` (old copies of an LMDB page may linger in
/// its free pages); how many it flipped.
fn flip_needle(path: &Path, needle: &[u8]) -> usize {
    use std::os::unix::fs::FileExt;
    let bytes = std::fs::read(path).expect("read");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open");
    let mut flipped = 0;
    for at in 0..bytes.len().saturating_sub(needle.len()) {
        if &bytes[at..at + needle.len()] == needle {
            file.write_all_at(&[bytes[at + 3] ^ 0x20], (at + 3) as u64)
                .expect("flip");
            flipped += 1;
        }
    }
    flipped
}

/// A record of a running node's state damaged under it (a byte flipped in its file): the read
/// that meets it is UNAVAILABLE, never INTERNAL and never the damaged bytes; the node restarts
/// itself in place (the same process), rebuilds its state from the raft log, and serves every
/// acknowledged write again, the damaged one as it was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_damaged_under_a_running_node_is_refused_and_the_node_rebuilds_itself() {
    use proto::resource::v1::ReadRequest;
    use proto::resource::v1::resource_service_client::ResourceServiceClient;

    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("node");
    let port = || format!("127.0.0.1:{}", crate::process::free_port());
    let args: Vec<String> = [
        "--node-id",
        "1",
        "--data-dir",
        &data.display().to_string(),
        "--api-addr",
        &port(),
        "--raft-addr",
        &port(),
        "--bootstrap",
    ]
    .iter()
    .map(|arg| arg.to_string())
    .collect();
    let mut node = Resd::spawn(args);
    let pid = node.pid();
    write_artists(&node, 20).await;
    let mut needle = artist("needle");
    needle
        .metadata
        .insert("mark".into(), "NEEDLE-0123456789".into());
    node.resources()
        .await
        .write(WriteRequest {
            resource: Some(needle),
        })
        .await
        .expect("acknowledged");
    assert!(flip_needle(&state_file(&data), b"NEEDLE-0123456789") >= 1);

    let refused = node
        .resources()
        .await
        .read(ReadRequest {
            id: Some(crate::support::artist_id("needle")),
            ..Default::default()
        })
        .await
        .expect_err("the damaged record is not served");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("damaged"), "{refused:?}");

    // The same process comes back with the state rebuilt: every write, the needle intact.
    let deadline = Instant::now() + Duration::from_secs(60);
    let read = loop {
        // Refused while the node restarts: the connection, not only the read, may fail.
        let read = match node.endpoint().connect().await {
            Ok(channel) => ResourceServiceClient::new(channel)
                .read(ReadRequest {
                    id: Some(crate::support::artist_id("needle")),
                    ..Default::default()
                })
                .await
                .map_err(|status| status.to_string()),
            Err(error) => Err(error.to_string()),
        };
        if let Ok(read) = read {
            break read.into_inner();
        }
        assert!(
            Instant::now() < deadline,
            "the node did not come back within 60 s: {read:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        read.resource.expect("resource").metadata["mark"],
        "NEEDLE-0123456789"
    );
    wait_for_artists(&node, 21, "after the rebuild").await;
    assert_eq!(node.pid(), pid, "restarted in place");
    assert!(
        !data.join("raft/sm/DAMAGED").exists(),
        "consumed by the rebuild"
    );
    assert!(node.terminate().success(), "a clean stop after the rebuild");
}

/// A leader whose snapshot was damaged on disk must send a follower that needs it a good one:
/// the damaged bytes never reach the follower's state (it checks them against the sum the
/// leader recorded before it maps the file), the leader builds a new snapshot, and the follower
/// ends with every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_snapshot_is_never_installed_and_the_leader_sends_a_new_one() {
    let mut cluster = crate::process::Cluster::start(3, &["--snapshot-every", "20"]).await;
    let leader = cluster.wait_for_leader().await;
    let follower = (leader + 1) % 3;
    cluster.nodes[follower].kill9();
    write_artists(&cluster.nodes[leader], 100).await;
    wait_for_snapshot(&cluster.nodes[leader], 60).await;
    let leader_snapshot = snapshot_dir(&cluster.data_dir(leader)).join("data.mdb");
    scribble(&leader_snapshot);
    // The follower's own state is gone: only a snapshot from the leader can bring it back.
    let follower_data = cluster.data_dir(follower);
    std::fs::remove_dir_all(follower_data.join("raft/sm")).expect("delete the state");
    let _ = std::fs::remove_dir_all(follower_data.join("raft/snapshots"));
    cluster.nodes[follower].restart();
    wait_for_artists(&cluster.nodes[follower], 100, "the follower").await;
    let aside = std::fs::read_dir(cluster.data_dir(leader).join("raft"))
        .expect("raft dir")
        .filter_map(Result::ok)
        .any(|item| item.file_name().to_string_lossy().starts_with("damaged-"));
    assert!(aside, "the leader set its damaged snapshot aside");
}

/// Attack: `raft/sm/CURRENT` deleted (or overwritten) while the node was down made it take
/// itself for a new node, delete its live generation and refuse to start, though its snapshot
/// and log sufficed. Now a missing or unreadable CURRENT rebuilds from the checked snapshot and
/// the log, and the generations it cannot prove superseded are set aside, never deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_current_generation_file_is_lost_rebuilds_and_serves_everything() {
    let mut node = Resd::start_with(&["--snapshot-every", "20"]);
    let data = node.data_dir().expect("data dir").to_path_buf();
    write_artists(&node, 30).await;
    wait_for_snapshot(&node, 20).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while current_generation(&data) == 0 {
        assert!(Instant::now() < deadline, "no rebase within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (round, damage) in [None, Some("not a number\n"), Some("999\n")]
        .into_iter()
        .enumerate()
    {
        let mut client = node.resources().await;
        client
            .write(WriteRequest {
                resource: Some(artist(&format!("round-{round}"))),
            })
            .await
            .expect("acknowledged");
        node.terminate();
        let current = data.join("raft/sm/CURRENT");
        match damage {
            None => std::fs::remove_file(&current).expect("remove CURRENT"),
            Some(text) => std::fs::write(&current, text).expect("overwrite CURRENT"),
        }
        node.restart();
        wait_for_artists(&node, 31 + round, &format!("after CURRENT was {damage:?}")).await;
    }
    let aside = std::fs::read_dir(data.join("raft"))
        .expect("raft dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("damaged-"))
        .count();
    assert!(
        aside > 0,
        "the generations not proven superseded were set aside"
    );
}

/// Attack: with the `LOCK` file deleted, a second agent started on the same data directory and
/// both wrote its log. The lock is held on the directory itself: a second agent is refused
/// whatever happened to the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_is_refused_even_after_the_lock_file_is_deleted() {
    let first = Resd::start();
    let dir = first.data_dir().expect("data dir").to_path_buf();
    std::fs::remove_file(dir.join("LOCK")).expect("delete LOCK");
    let output = run_to_exit(&args_for(first.args(), &dir));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("is in use by another resd process"),
        "{stderr}"
    );
    list_artists(&first).await;
}
