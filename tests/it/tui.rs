//! The dashboard end to end: the real `resctl tui` in a real terminal (tmux, on a private
//! socket), against a real 3-node cluster, talking to a follower. The demo fixtures appear, a
//! write from outside shows up live, the detail pane shows a controller's status condition,
//! an edit through a scripted `$EDITOR` is saved, the node it talks to is killed (the data
//! stays, the header says it retries) and restarted (live again, events flow), and quitting (q, and ctrl-c) gives the
//! terminal back in cooked mode.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use proto::resource::v1::{Id, Tenancy, Type};

/// A tmux server of our own (`-L`), so the test never touches the user's sessions; it is
/// killed when dropped.
pub(crate) struct Tmux {
    socket: String,
}

impl Tmux {
    pub(crate) fn available() -> bool {
        Command::new("tmux")
            .arg("-V")
            .output()
            .is_ok_and(|output| output.status.success())
    }

    pub(crate) fn new(tag: &str) -> Tmux {
        Tmux {
            socket: format!("resd-it-{tag}-{}", std::process::id()),
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux runs")
    }

    /// Starts `command` in a 160×45 window running `sh`.
    pub(crate) fn start(&self, command: &str) {
        let output = self.run(&[
            "new-session",
            "-d",
            "-s",
            "dash",
            "-x",
            "160",
            "-y",
            "45",
            "sh",
            "-c",
            command,
        ]);
        assert!(
            output.status.success(),
            "tmux new-session failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Resizes the window (the dashboard redraws on the resize event).
    pub(crate) fn resize(&self, width: u16, height: u16) {
        let (width, height) = (width.to_string(), height.to_string());
        let output = self.run(&["resize-window", "-t", "dash", "-x", &width, "-y", &height]);
        assert!(output.status.success(), "resize-window failed");
    }

    pub(crate) fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "dash"];
        args.extend_from_slice(keys);
        let output = self.run(&args);
        assert!(output.status.success(), "send-keys {keys:?} failed");
        // Let the dashboard take each burst of keys before the next.
        std::thread::sleep(Duration::from_millis(150));
    }

    /// Types `text` literally.
    fn text(&self, text: &str) {
        let output = self.run(&["send-keys", "-t", "dash", "-l", text]);
        assert!(output.status.success(), "send-keys -l {text:?} failed");
        std::thread::sleep(Duration::from_millis(150));
    }

    pub(crate) fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "dash"]).stdout)
            .into_owned()
    }

    /// Waits (bounded) until the screen shows every one of `needles`.
    pub(crate) async fn wait_for(&self, what: &str, needles: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut screen = String::new();
        while Instant::now() < deadline {
            screen = self.screen();
            if needles.iter().all(|needle| screen.contains(needle)) {
                return screen;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{what}: the screen never showed {needles:?} within 30s; it shows:\n{screen}");
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// What resctl and the dashboard present to a secure cluster: the management token and the
/// client certificate (through the environment).
struct Creds {
    token: String,
    tls: Option<tests::TestTls>,
}

impl Creds {
    /// What a cluster started with ACLs hands its clients.
    fn of(cluster: &tests::Cluster) -> Creds {
        Creds {
            token: cluster.token.clone().expect("a management token"),
            tls: cluster.tls.clone(),
        }
    }

    fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![("RESD_TOKEN".to_owned(), self.token.clone())];
        if let Some(tls) = &self.tls {
            for (name, path) in [
                ("RESD_CA_CERT", tls.ca()),
                ("RESD_CLIENT_CERT", tls.client_cert()),
                ("RESD_CLIENT_KEY", tls.client_key()),
            ] {
                env.push((name.to_owned(), path.display().to_string()));
            }
        }
        env
    }
}

fn resctl(server: &str, token: &Creds, args: &[&str]) -> Output {
    let output = Command::new(tests::binary("resctl"))
        .arg("--server")
        .arg(server)
        .args(args)
        .env("RESCTL_CONFIG", "/nonexistent/resctl-contexts.yaml")
        .envs(token.env())
        .output()
        .expect("resctl runs");
    assert!(
        output.status.success(),
        "resctl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn write_script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write script");
    let mut permissions = std::fs::metadata(&path).expect("script").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&path, permissions).expect("chmod");
    path
}

/// The shell line tmux runs: the dashboard, then what the terminal looks like after it.
fn dashboard(server: &str, token: &Creds, scratch: &Path, editor: &Path, extra: &str) -> String {
    let credentials: Vec<String> = token
        .env()
        .into_iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    let credentials = credentials.join(" ");
    format!(
        "RESCTL_CONFIG=/nonexistent {credentials} EDITOR={editor} {resctl} --server {server} tui {extra}; \
         echo RESCTL-EXITED $?; stty -a > {stty}; echo STTY-SAVED; sleep 600",
        editor = editor.display(),
        resctl = tests::binary("resctl").display(),
        stty = scratch.join("stty.txt").display(),
    )
}

fn assert_cooked(scratch: &Path) {
    let stty = std::fs::read_to_string(scratch.join("stty.txt")).expect("stty output");
    let words: Vec<&str> = stty.split_whitespace().collect();
    for mode in ["icanon", "echo", "isig"] {
        assert!(
            words.contains(&mode),
            "the terminal was left without {mode} after the dashboard quit:\n{stty}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_a_live_cluster_and_edits_through_the_editor() {
    if !Tmux::available() {
        eprintln!(
            "SKIPPED the_dashboard_shows_a_live_cluster_and_edits_through_the_editor: tmux is \
             not installed (apt-get install tmux; .ci/run installs it)"
        );
        return;
    }
    // ACLs on: the dashboard and resctl act with the management token.
    let mut cluster = tests::Cluster::start_with_acls(3).await;
    let token = Creds {
        token: cluster.token.clone().expect("a management token"),
        tls: cluster.tls.clone(),
    };
    let leader = cluster.nodes[0].api_addr.clone();
    let follower = cluster.nodes[2].api_addr.clone();
    resctl(
        &leader,
        &token,
        &[
            "apply",
            "-f",
            &tests::fixtures().join("demo").display().to_string(),
        ],
    );
    let scratch = tempfile::tempdir().expect("temp dir");
    let editor = write_script(
        scratch.path(),
        "editor.sh",
        "sed -i 's/position: .*/position: Chairman Emeritus/' \"$1\"",
    );

    let tmux = Tmux::new("dash");
    tmux.start(&dashboard(
        &follower,
        &token,
        scratch.path(),
        &editor,
        "demo.v2.Album",
    ));

    // The fixtures appear, from a follower, with the cluster in the header.
    tmux.wait_for(
        "the demo albums",
        &[
            "kind-of-blue",
            "abbey-road",
            "a-love-supreme",
            "● live",
            "cluster resd",
            "as initial-management",
        ],
    )
    .await;

    // A write from outside shows up live.
    tmux.text(":");
    tmux.text("Executive");
    tmux.keys(&["Enter"]);
    tmux.wait_for("the executives", &["demo.v1.Executive", "clive-davis"])
        .await;
    let walter = scratch.path().join("walter.yaml");
    std::fs::write(
        &walter,
        "type: demo.v1.Executive\nname: walter-yetnikoff\ndata: {name: Walter Yetnikoff, position: President}\n",
    )
    .expect("write walter");
    resctl(
        &leader,
        &token,
        &["apply", "-f", &walter.display().to_string()],
    );
    tmux.wait_for("a write from outside", &["walter-yetnikoff"])
        .await;
    tmux.keys(&["5"]);
    tmux.wait_for(
        "the event tail",
        &["CREATE", "demo.v1.Executive walter-yetnikoff"],
    )
    .await;

    // The detail pane shows the artist controller's condition, coloured by state.
    tmux.text(":");
    tmux.text("demo.v2.Artist");
    tmux.keys(&["Enter"]);
    tmux.text("/miles");
    tmux.keys(&["Enter"]);
    tmux.wait_for("the filtered artists", &["miles-davis", "filter \"miles\""])
        .await;
    tmux.keys(&["Enter"]);
    tmux.wait_for(
        "the artist's detail",
        &[
            "Status",
            "demo.resd.io/artist",
            "Accepted=True",
            "(current)",
        ],
    )
    .await;

    // e edits clive-davis in the scripted editor; the save shows and reaches the server.
    tmux.text(":");
    tmux.text("Executive");
    tmux.keys(&["Enter"]);
    tmux.text("/clive");
    tmux.keys(&["Enter"]);
    tmux.wait_for("clive selected", &["filter \"clive\"", "clive-davis"])
        .await;
    tmux.keys(&["e"]);
    tmux.wait_for("the save", &["saved Executive/clive-davis"])
        .await;
    let id = Id {
        uid: String::new(),
        name: "clive-davis".into(),
        r#type: Some(Type {
            group: "demo".into(),
            group_version: "v1".into(),
            kind: "Executive".into(),
        }),
        tenancy: Some(Tenancy::default()),
    };
    let saved = cluster
        .client(0)
        .read(&id)
        .await
        .expect("read")
        .expect("clive-davis exists");
    let data = saved.data.expect("data");
    assert!(
        String::from_utf8_lossy(&data.value).contains("Chairman Emeritus"),
        "the edit reached the server"
    );

    // The node the dashboard talks to goes away: the last data stays on screen with
    // "disconnected — retrying", and the dashboard comes back live when the node does.
    tmux.keys(&["1"]);
    cluster.nodes[2].kill();
    tmux.wait_for(
        "the disconnected header",
        &[
            "◌ disconnected — retrying",
            "demo.v2.Album",
            "tenancy.v1.Namespace",
        ],
    )
    .await;
    cluster.nodes[2].restart();
    tmux.wait_for("the reconnection", &["● live"]).await;
    resctl(
        &leader,
        &token,
        &["delete", "Executive", "walter-yetnikoff"],
    );
    tmux.keys(&["5"]);
    tmux.wait_for(
        "an event after the reconnection",
        &["DELETE", "demo.v1.Executive walter-yetnikoff"],
    )
    .await;

    // q quits and the terminal is cooked again.
    tmux.keys(&["q"]);
    tmux.wait_for("the exit", &["RESCTL-EXITED 0", "STTY-SAVED"])
        .await;
    assert_cooked(scratch.path());

    // ctrl-c in a dialog closes it; a second ctrl-c quits cleanly.
    let tmux = Tmux::new("ctrlc");
    std::fs::remove_file(scratch.path().join("stty.txt")).expect("remove stty output");
    tmux.start(&dashboard(&follower, &token, scratch.path(), &editor, ""));
    tmux.wait_for("the types", &["demo.v2.Album", "● live"])
        .await;
    tmux.keys(&["?"]);
    tmux.wait_for("help", &["Keys · ↑↓ scroll"]).await;
    tmux.keys(&["C-c"]);
    tmux.wait_for("the help closed", &["demo.v2.Album", "● live"])
        .await;
    assert!(
        !tmux.screen().contains("Keys · ↑↓ scroll"),
        "the first ctrl-c closes the help"
    );
    // The command bar is a prompt: ctrl-c closes it, the dashboard stays.
    tmux.text(":");
    tmux.text("Alb");
    tmux.keys(&["C-c"]);
    tmux.wait_for("the prompt closed", &["● live", "demo.v2.Album"])
        .await;
    assert!(
        !tmux.screen().contains("RESCTL-EXITED"),
        "the first ctrl-c closes the prompt"
    );
    tmux.keys(&["C-c"]);
    tmux.wait_for("the exit", &["RESCTL-EXITED 0", "STTY-SAVED"])
        .await;
    assert_cooked(scratch.path());

    // Given two servers, the dashboard moves to the other when its node dies.
    let tmux = Tmux::new("failover");
    let both = format!("{follower},{leader}");
    tmux.start(&dashboard(
        &both,
        &token,
        scratch.path(),
        &editor,
        "demo.v2.Album",
    ));
    tmux.wait_for(
        "the albums from the first server",
        &["kind-of-blue", "● live", &format!("node 3 {follower}")],
    )
    .await;
    // At 80 columns NAME keeps its width; the less important columns give way.
    tmux.resize(80, 24);
    let narrow = tmux
        .wait_for(
            "the albums at 80 columns",
            &["kind-of-blue", "a-love-supreme", "CONDITION"],
        )
        .await;
    assert!(
        narrow.lines().all(|line| line.chars().count() <= 80),
        "{narrow}"
    );
    // The cluster screen keeps whole addresses at 80×24, and the placement screen whole
    // controller names.
    tmux.keys(&["3"]);
    let addresses: Vec<String> = cluster
        .nodes
        .iter()
        .map(|node| node.api_addr.clone())
        .collect();
    let needles: Vec<&str> = addresses.iter().map(String::as_str).collect();
    tmux.wait_for("whole addresses at 80×24", &needles).await;
    tmux.keys(&["4"]);
    tmux.wait_for(
        "whole controller names at 80×24",
        &["demo-artist", "demo-concept-observer", "reaper"],
    )
    .await;
    tmux.keys(&["2"]);
    tmux.resize(160, 45);
    cluster.nodes[2].kill();
    tmux.wait_for(
        "the albums from the second server",
        &["kind-of-blue", "● live", &format!("node 1 {leader}")],
    )
    .await;
    resctl(
        &leader,
        &token,
        &["apply", "-f", &walter.display().to_string()],
    );
    tmux.keys(&[":"]);
    tmux.text("Executive");
    tmux.keys(&["Enter"]);
    tmux.wait_for("a write after the failover", &["walter-yetnikoff"])
        .await;
    tmux.keys(&["q"]);
}

/// The payments team's types and invoices (`fixtures/teams`), applied as management.
fn apply_teams(server: &str, token: &Creds) {
    resctl(
        server,
        token,
        &[
            "apply",
            "-f",
            &tests::fixtures().join("teams").display().to_string(),
        ],
    );
}

/// DESIGN §15: the dashboard learns a type registered after it started — the Type's event makes
/// it list the types again, and the new type is watched and can be jumped to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_learns_a_type_registered_after_it_started() {
    if !Tmux::available() {
        eprintln!("SKIPPED the_dashboard_learns_a_type_registered_after_it_started: no tmux");
        return;
    }
    let cluster = tests::Cluster::start_with_acls(1).await;
    let token = Creds::of(&cluster);
    let server = cluster.nodes[0].api_addr.clone();
    let scratch = tempfile::tempdir().expect("temp dir");
    let editor = write_script(scratch.path(), "editor.sh", "true");
    let tmux = Tmux::new("types");
    tmux.start(&dashboard(&server, &token, scratch.path(), &editor, ""));
    tmux.wait_for("the dashboard", &["● live"]).await;
    apply_teams(&server, &token);
    tmux.wait_for("the new type on the types screen", &["payments.v1.Invoice"])
        .await;
    tmux.text(":");
    tmux.text("Invoice");
    tmux.keys(&["Enter"]);
    tmux.wait_for(
        "the invoices",
        &["acme-2026-001", "globex-2026-001", "payments.v1.Invoice"],
    )
    .await;
    tmux.keys(&["q"]);
}

/// DESIGN §16: the dashboard's placement map shows a controller running outside the server,
/// with both replicas and which one holds the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_placement_map_shows_both_replicas_of_a_controller_outside_the_server() {
    if !Tmux::available() {
        eprintln!("SKIPPED the_placement_map_shows_both_replicas…: no tmux");
        return;
    }
    let cluster = tests::Cluster::start_with_acls(1).await;
    let token = Creds::of(&cluster);
    let server = cluster.nodes[0].api_addr.clone();
    apply_teams(&server, &token);
    let replica = |identity: &str| {
        Command::new(tests::binary("examples/invoice_controller"))
            .arg(identity)
            .env("RESD_SERVER", &server)
            .envs(token.env())
            .env("LEASE_SECONDS", "3")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the example starts")
    };
    let mut replicas = [replica("replica-1"), replica("replica-2")];
    let scratch = tempfile::tempdir().expect("temp dir");
    let editor = write_script(scratch.path(), "editor.sh", "true");
    let tmux = Tmux::new("external");
    tmux.start(&dashboard(&server, &token, scratch.path(), &editor, ""));
    tmux.wait_for("the dashboard", &["● live"]).await;
    tmux.keys(&["4"]);
    tmux.wait_for(
        "the external controller's replicas",
        &["invoices", "external (2)", "leads"],
    )
    .await;
    tmux.keys(&["q"]);
    for replica in &mut replicas {
        let _ = replica.kill();
        let _ = replica.wait();
    }
}
