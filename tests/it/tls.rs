//! TLS as a user meets it: `resd dev` (secure by default) writes a context whose certificates
//! and token connect resctl and the dashboard; resctl without them, without a client
//! certificate, or trusting another CA is refused with an error that says what to do; a context
//! keeps the TLS files.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::tui::Tmux;

/// `resd dev` on free ports, stopped by PID when dropped.
struct DevTls {
    child: Child,
    server: String,
    /// `--ca-cert X --client-cert Y --client-key Z --token T`, from the context it wrote.
    flags: Vec<String>,
    _contexts: tempfile::TempDir,
}

impl DevTls {
    fn start() -> DevTls {
        let contexts = tempfile::tempdir().expect("temp dir");
        let written = contexts.path().join("contexts.yaml");
        let mut child = Command::new(tests::binary("resd"))
            .args(tests::DEV_ON_FREE_PORTS)
            .env("RUST_LOG", "warn,openraft=error")
            .env("RESCTL_CONFIG", &written)
            // Its data directory goes with the test's (it is killed, not stopped).
            .env("TMPDIR", contexts.path())
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
        // "resd: resctl context resd-dev (current while this runs) in FILE"
        loop {
            let line = receiver
                .recv_timeout(Duration::from_secs(60))
                .expect("resd dev says where its context is");
            if line.contains("resctl context resd-dev") {
                break;
            }
        }
        let text = std::fs::read_to_string(&written).expect("the context file");
        let document: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("yaml");
        let entry = &document["contexts"]["resd-dev"];
        let field = |name: &str| entry[name].as_str().expect(name).to_owned();
        DevTls {
            child,
            server: field("server"),
            flags: vec![
                "--ca-cert".into(),
                field("ca_cert"),
                "--client-cert".into(),
                field("client_cert"),
                "--client-key".into(),
                field("client_key"),
                "--token".into(),
                field("token"),
            ],
            _contexts: contexts,
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
async fn resd_dev_connects_resctl_and_the_dashboard_and_refuses_the_rest() {
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

    // `auth can-i`: the management token may do anything, and says which policy decided; a
    // token of the observer policy (fixtures/acl) reads but may not write, asked for itself or
    // by management with --as. Exit 0 yes, 1 no, 2 an error.
    let policies = tests::fixtures().join("acl").display().to_string();
    let applied = run(with_flags(&["apply", "-f", &policies]));
    assert!(applied.status.success(), "{}", stderr(&applied));
    let yes = run(with_flags(&[
        "auth",
        "can-i",
        "delete",
        "demo.v2.Album",
        "kind-of-blue",
        "-n",
        "jazz",
    ]));
    assert_eq!(yes.status.code(), Some(0), "{}", stderr(&yes));
    let said = String::from_utf8_lossy(&yes.stdout).into_owned();
    assert!(
        said.starts_with("yes\n") && said.contains("global-management"),
        "{said}"
    );
    let created = run(with_flags(&[
        "acl", "token", "create", "watcher", "--policy", "observer", "-o", "json",
    ]));
    assert!(created.status.success(), "{}", stderr(&created));
    let secret =
        serde_json::from_slice::<serde_json::Value>(&created.stdout).expect("json")["secret"]
            .as_str()
            .expect("a secret")
            .to_owned();
    let mut as_observer = with_flags(&[
        "auth",
        "can-i",
        "write",
        "demo.v2.Album",
        "kind-of-blue",
        "-n",
        "jazz",
    ]);
    let at = as_observer
        .iter()
        .position(|flag| flag == "--token")
        .expect("--token")
        + 1;
    as_observer[at] = secret.clone();
    let no = run(as_observer.clone());
    assert_eq!(no.status.code(), Some(1), "{}", stderr(&no));
    let said = String::from_utf8_lossy(&no.stdout).into_owned();
    assert!(
        said.starts_with("no\n") && said.contains("policy observer"),
        "{said}"
    );
    let read = as_observer
        .iter()
        .map(|arg| {
            if arg == "write" {
                "get".to_owned()
            } else {
                arg.clone()
            }
        })
        .collect();
    assert_eq!(run(read).status.code(), Some(0), "the observer reads");
    let for_it = run(with_flags(&[
        "auth",
        "can-i",
        "write",
        "demo.v2.Album",
        "kind-of-blue",
        "-n",
        "jazz",
        "--as",
        "watcher",
        "-o",
        "json",
    ]));
    assert_eq!(for_it.status.code(), Some(1), "{}", stderr(&for_it));
    let answer: serde_json::Value = serde_json::from_slice(&for_it.stdout).expect("json");
    assert_eq!(answer["allowed"], false, "{answer}");
    let bad = run(with_flags(&[
        "auth",
        "can-i",
        "fly",
        "demo.v2.Album",
        "kind-of-blue",
        "-n",
        "jazz",
    ]));
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("fly"), "{}", stderr(&bad));

    // An admission policy (DESIGN §17): as a DENY an old album in jazz is refused naming it;
    // as a WARN it is stored and resctl prints the warning.
    let policy = tests::fixtures().join("policy").display().to_string();
    let applied = run(with_flags(&["apply", "-f", &policy]));
    assert!(applied.status.success(), "{}", stderr(&applied));
    assert!(
        stderr(&applied).contains("Policy modern-albums:"),
        "apply prints the policy's plan first: {}",
        stderr(&applied)
    );
    let old_album = scratch.path().join("old-album.yaml");
    std::fs::write(
        &old_album,
        "type: demo.v2.Album\nname: very-old\ntenancy: {partition: default, namespace: jazz}\ndata:\n  name: Very Old\n  yearOfRelease: 1930\n",
    )
    .expect("write the album");
    let old_album = old_album.display().to_string();
    let refused = run(with_flags(&["apply", "-f", &old_album]));
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("admission policy modern-albums denies this"),
        "{}",
        stderr(&refused)
    );
    let warn_policy = scratch.path().join("warn.yaml");
    std::fs::write(
        &warn_policy,
        std::fs::read_to_string(tests::fixtures().join("policy").join("modern-albums.yaml"))
            .expect("the fixture")
            .replace("ACTION_DENY", "ACTION_WARN"),
    )
    .expect("write the warn policy");
    let applied = run(with_flags(&[
        "apply",
        "-f",
        &warn_policy.display().to_string(),
    ]));
    assert!(applied.status.success(), "{}", stderr(&applied));
    let warned = run(with_flags(&["apply", "-f", &old_album]));
    assert!(warned.status.success(), "{}", stderr(&warned));
    assert!(
        stderr(&warned).contains("warning: admission policy modern-albums"),
        "{}",
        stderr(&warned)
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
        "--to-token".into(),
        dev.flag("--token"),
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
    tmux.wait_for("the cluster screen over TLS", &["voter", "healthy"])
        .await;
    tmux.keys(&["q"]);
}

/// A team's program next to `resd dev`, as the README starts it: no flag and no variable — the
/// example controller finds the secure cluster, its certificates and token in the context
/// `resd dev` made current, reconciles, and logs plain lines (no colour codes) to a file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_controller_next_to_resd_dev_needs_no_flag_and_logs_plain_lines() {
    let dev = DevTls::start();
    let written = dev._contexts.path().join("contexts.yaml");
    let config = written.display().to_string();
    let teams = tests::fixtures().join("teams").display().to_string();
    let applied = resctl(&["apply", "-f", &teams], &config);
    assert!(applied.status.success(), "{}", stderr(&applied));
    let log = dev._contexts.path().join("controller.log");
    let mut controller = Command::new(tests::binary("examples/invoice_controller"))
        .arg("replica-1")
        .env("RESCTL_CONFIG", &written)
        .env_remove("RESD_SERVER")
        .env_remove("RESD_TOKEN")
        .env_remove("RESD_CA_CERT")
        .env_remove("RESD_CLIENT_CERT")
        .env_remove("RESD_CLIENT_KEY")
        .env_remove("NO_COLOR")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("the example starts");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let got = resctl(
            &["get", "payments.v1.Invoice", "acme-2026-001", "-o", "json"],
            &config,
        );
        if String::from_utf8_lossy(&got.stdout).contains("ReceiptIssued") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not accepted: {}\n{}",
            stderr(&got),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = controller.kill();
    let _ = controller.wait();
    let said = std::fs::read_to_string(&log).expect("log");
    assert!(
        said.contains("context=resd-dev") && said.contains("tls=true"),
        "it says where it connected:\n{said}"
    );
    assert!(
        !said.contains('\u{1b}'),
        "no colour codes in a file:\n{said}"
    );
}
