//! TLS as a user meets it: `resd dev --tls` prints flags that connect resctl and the dashboard;
//! resctl without them, without a client certificate, or trusting another CA is refused with
//! an error that says what to do; a context keeps the TLS files.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::tui::Tmux;

/// `resd dev --tls` on free ports, stopped by PID when dropped.
struct DevTls {
    child: Child,
    server: String,
    /// `--ca-cert X --client-cert Y --client-key Z`, as printed.
    flags: Vec<String>,
}

impl DevTls {
    fn start() -> DevTls {
        let mut child = Command::new(tests::binary("resd"))
            .args(["dev", "--tls", "--api-port", "0", "--raft-port", "0"])
            .env("RUST_LOG", "warn,openraft=error")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn resd dev --tls");
        let stdout = child.stdout.take().expect("stdout");
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = sender.send(line);
            }
        });
        // "  resctl --server ADDR --ca-cert … --client-cert … --client-key … apply -f …"
        let line = loop {
            let line = receiver
                .recv_timeout(Duration::from_secs(60))
                .expect("resd dev --tls prints how to connect");
            if line.trim_start().starts_with("resctl --server") {
                break line;
            }
        };
        let words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        let server = words[2].clone();
        let end = words
            .iter()
            .position(|word| word == "apply")
            .expect("the printed command applies the fixtures");
        DevTls {
            child,
            server,
            flags: words[3..end].to_vec(),
        }
    }

    fn flag(&self, name: &str) -> String {
        let at = self
            .flags
            .iter()
            .position(|flag| flag == name)
            .unwrap_or_else(|| panic!("{name} in {:?}", self.flags));
        self.flags[at + 1].clone()
    }
}

impl Drop for DevTls {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn resctl(args: &[&str], config: &str) -> Output {
    Command::new(tests::binary("resctl"))
        .args(args)
        .env("RESCTL_CONFIG", config)
        .env_remove("RESD_CA_CERT")
        .env_remove("RESD_CLIENT_CERT")
        .env_remove("RESD_CLIENT_KEY")
        .output()
        .expect("resctl runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resd_dev_tls_connects_resctl_and_the_dashboard_and_refuses_the_rest() {
    let dev = DevTls::start();
    let scratch = tempfile::tempdir().expect("temp dir");
    let contexts = scratch.path().join("contexts.yaml").display().to_string();
    let fixtures = tests::fixtures().join("demo").display().to_string();
    let with_flags = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["--server".to_owned(), dev.server.clone()];
        all.extend(dev.flags.iter().cloned());
        all.extend(args.iter().map(|arg| arg.to_string()));
        all
    };
    let run = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        resctl(&args, &contexts)
    };

    // The printed flags work (the cluster may still be electing: apply retries).
    let applied = run(with_flags(&["apply", "-f", &fixtures]));
    assert!(applied.status.success(), "{}", stderr(&applied));
    let albums = run(with_flags(&["get", "demo.v2.Album", "-A", "-o", "name"]));
    assert!(albums.status.success(), "{}", stderr(&albums));
    assert!(
        String::from_utf8_lossy(&albums.stdout).contains("kind-of-blue"),
        "{albums:?}"
    );

    // Plaintext.
    let plain = run(vec![
        "--server".into(),
        dev.server.clone(),
        "cluster".into(),
        "status".into(),
    ]);
    assert!(!plain.status.success());
    assert!(
        stderr(&plain).contains("pass --ca-cert"),
        "{}",
        stderr(&plain)
    );

    // The CA but no client certificate, where the servers verify clients.
    let anonymous = run(vec![
        "--server".into(),
        dev.server.clone(),
        "--ca-cert".into(),
        dev.flag("--ca-cert"),
        "cluster".into(),
        "status".into(),
    ]);
    assert!(!anonymous.status.success());
    assert!(
        stderr(&anonymous).contains("requires a client certificate"),
        "{}",
        stderr(&anonymous)
    );

    // Trusting another CA.
    let other = tempfile::tempdir().expect("temp dir");
    let made = Command::new(tests::binary("resd"))
        .args(["tls", "ca", "create", "--dir"])
        .arg(other.path())
        .output()
        .expect("resd tls ca create");
    assert!(made.status.success(), "{made:?}");
    let stranger = run(vec![
        "--server".into(),
        dev.server.clone(),
        "--ca-cert".into(),
        other.path().join("resd-ca.pem").display().to_string(),
        "--client-cert".into(),
        dev.flag("--client-cert"),
        "--client-key".into(),
        dev.flag("--client-key"),
        "cluster".into(),
        "status".into(),
    ]);
    assert!(!stranger.status.success());
    assert!(
        stderr(&stranger).contains("not signed by the CA given with --ca-cert"),
        "{}",
        stderr(&stranger)
    );

    // A missing file is named.
    let missing = run(vec![
        "--server".into(),
        dev.server.clone(),
        "--ca-cert".into(),
        "/nonexistent/ca.pem".into(),
        "cluster".into(),
        "status".into(),
    ]);
    assert!(!missing.status.success());
    assert!(
        stderr(&missing).contains("/nonexistent/ca.pem"),
        "{}",
        stderr(&missing)
    );

    // A context keeps the TLS files.
    let set = run(vec![
        "context".into(),
        "set".into(),
        "dev".into(),
        "--to-server".into(),
        dev.server.clone(),
        "--to-ca-cert".into(),
        dev.flag("--ca-cert"),
        "--to-client-cert".into(),
        dev.flag("--client-cert"),
        "--to-client-key".into(),
        dev.flag("--client-key"),
    ]);
    assert!(set.status.success(), "{}", stderr(&set));
    let listed = run(vec!["context".into(), "list".into()]);
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains("mutual"),
        "{listed:?}"
    );
    let through_context = run(vec!["cluster".into(), "members".into()]);
    assert!(
        through_context.status.success(),
        "{}",
        stderr(&through_context)
    );

    // The dashboard, with the same context.
    if !Tmux::available() {
        eprintln!("SKIPPED the dashboard over TLS: tmux is not installed");
        return;
    }
    let tmux = Tmux::new("tls");
    tmux.start(&format!(
        "RESCTL_CONFIG={contexts} {resctl} tui demo.v2.Album; sleep 600",
        resctl = tests::binary("resctl").display(),
    ));
    tmux.wait_for(
        "the demo albums over TLS",
        &["kind-of-blue", "● live", "cluster dev"],
    )
    .await;
    tmux.keys(&["3"]);
    tmux.wait_for("the cluster screen over TLS", &["follower", "healthy"])
        .await;
    tmux.keys(&["q"]);
}
