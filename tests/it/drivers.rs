//! The two drivers of the CLI scenarios: `Library` calls the `ctl` library functions directly;
//! `Binary` runs `resctl … -o json` and parses what it prints. Both answer in the same JSON
//! shapes, so one scenario body checks both (etcd's `tests/common` pattern).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use ctl::command;
use ctl::output::OutputFormat;
use ctl::session::Session;
use proto::client::{Client, WatchUpdate};
use proto::resource::v1::WatchListRequest;
use proto::resource::v1::watch_event::Event;
use serde_json::Value;

/// What a command answered: its exit code, its JSON output and its error text.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub code: i32,
    pub value: Value,
    pub stderr: String,
}

impl Reply {
    fn ok(value: Value) -> Reply {
        Reply {
            code: 0,
            value,
            stderr: String::new(),
        }
    }

    fn failed(error: anyhow::Error) -> Reply {
        Reply {
            code: 1,
            value: Value::Null,
            stderr: format!("error: {error:#}"),
        }
    }

    /// The value, after checking the command succeeded.
    pub(crate) fn success(self, what: &str) -> Value {
        assert_eq!(self.code, 0, "{what} failed: {}", self.stderr);
        self.value
    }
}

#[allow(async_fn_in_trait)]
pub(crate) trait Driver {
    fn name(&self) -> &'static str;
    /// Who the server records as the author of this driver's changes.
    fn actor(&self) -> &'static str;
    async fn apply(&self, path: &Path) -> Reply;
    /// `apply --dry-run`: validated on the server, nothing stored.
    async fn apply_dry_run(&self, path: &Path) -> Reply;
    /// `get TYPE [NAME]` in a namespace, as JSON.
    async fn get(&self, namespace: &str, resource_type: &str, name: Option<&str>) -> Reply;
    /// `get TYPE` rendered in a format (`table`, `wide`, `yaml`, `json`, `name`).
    async fn get_formatted(
        &self,
        namespace: &str,
        resource_type: &str,
        format: OutputFormat,
    ) -> String;
    /// `edit TYPE NAME` with an editor that replaces `from` by `to`.
    async fn edit(
        &self,
        namespace: &str,
        resource_type: &str,
        name: &str,
        from: &str,
        to: &str,
    ) -> Reply;
    /// `watch TYPE --from-version V --count N`: the events as JSON lines.
    async fn watch(
        &self,
        namespace: &str,
        resource_type: &str,
        from_version: &str,
        count: usize,
    ) -> Vec<Value>;
    async fn tree(&self, namespace: &str, resource_type: &str, name: &str) -> Reply;
    async fn delete_wait(
        &self,
        namespace: &str,
        resource_type: &str,
        name: &str,
        timeout: Duration,
    ) -> Reply;
    async fn snapshot_save(&self, file: &Path) -> Reply;
    async fn snapshot_inspect(&self, file: &Path) -> Reply;
    async fn snapshot_restore(&self, file: &Path) -> Reply;
}

/// Drives the `ctl` library over `proto::client`.
pub(crate) struct Library {
    pub client: Client,
}

impl Library {
    async fn apply_with(&self, path: &Path, dry_run: bool) -> Reply {
        let session = self.session("default");
        let result = async {
            let sources = command::apply::read_sources(&[path.to_owned()])?;
            command::apply::decode_and_apply(
                &session,
                &sources,
                command::apply::Mode {
                    dry_run,
                    force: false,
                },
                |_| {},
            )
            .await
        }
        .await;
        match result {
            Ok(report) => Reply {
                code: if report.failed() > 0 { 1 } else { 0 },
                stderr: command::apply::failures(&report),
                value: to_json(&report),
            },
            Err(error) => Reply::failed(error),
        }
    }

    fn session(&self, namespace: &str) -> Session {
        let mut session = Session::new(self.client.clone(), OutputFormat::Json);
        session.namespace = namespace.to_owned();
        session
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).expect("reports serialize")
}

impl Driver for Library {
    fn name(&self) -> &'static str {
        "library"
    }

    fn actor(&self) -> &'static str {
        "anonymous"
    }

    async fn apply(&self, path: &Path) -> Reply {
        self.apply_with(path, false).await
    }

    async fn apply_dry_run(&self, path: &Path) -> Reply {
        self.apply_with(path, true).await
    }

    async fn get(&self, namespace: &str, resource_type: &str, name: Option<&str>) -> Reply {
        let session = self.session(namespace);
        let result = async {
            let codec = session.codec().await?;
            Ok::<_, anyhow::Error>(match name {
                Some(name) => {
                    codec.to_value(&command::get::read(&session, resource_type, name).await?)?
                }
                None => Value::Array(
                    command::get::list(&session, resource_type, false, "")
                        .await?
                        .iter()
                        .map(|r| codec.to_value(r))
                        .collect::<Result<_, _>>()?,
                ),
            })
        }
        .await;
        result.map(Reply::ok).unwrap_or_else(Reply::failed)
    }

    async fn get_formatted(
        &self,
        namespace: &str,
        resource_type: &str,
        format: OutputFormat,
    ) -> String {
        let session = self.session(namespace);
        let codec = session.codec().await.expect("codec");
        let resources = command::get::list(&session, resource_type, false, "")
            .await
            .expect("list");
        ctl::output::render_resources(codec, &resources, format, false).expect("render")
    }

    async fn edit(
        &self,
        namespace: &str,
        resource_type: &str,
        name: &str,
        from: &str,
        to: &str,
    ) -> Reply {
        let session = self.session(namespace);
        let mut editor = |path: &Path| -> Result<(), proto::client::edit::EditError> {
            let text = std::fs::read_to_string(path).expect("the edit file is readable");
            std::fs::write(path, text.replace(from, to)).expect("the edit file is writable");
            Ok(())
        };
        let mut never = |_: &command::edit::Problem| false;
        match command::edit::edit(&session, resource_type, name, &mut editor, &mut never).await {
            Ok(command::edit::EditOutcome::Saved(saved)) => {
                Reply::ok(serde_json::json!({"saved": true, "version": saved.version}))
            }
            Ok(other) => {
                Reply::ok(serde_json::json!({"saved": false, "outcome": format!("{other:?}")}))
            }
            Err(error) => Reply::failed(error),
        }
    }

    async fn watch(
        &self,
        namespace: &str,
        resource_type: &str,
        from_version: &str,
        count: usize,
    ) -> Vec<Value> {
        let session = self.session(namespace);
        let codec = session.codec().await.expect("codec");
        let info = session.resolve_type(resource_type).await.expect("type");
        let mut watcher = self.client.watcher(WatchListRequest {
            r#type: info.r#type.clone(),
            tenancy: Some(session.tenancy(info.scope(), false)),
            name_prefix: String::new(),
            since_version: from_version.to_owned(),
            ..WatchListRequest::default()
        });
        let mut lines = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while lines.len() < count {
            let update = tokio::time::timeout_at(deadline, watcher.next())
                .await
                .expect("watch events within 30s")
                .expect("the watch continues");
            if let WatchUpdate::Event(event) = update {
                if matches!(event.event, Some(Event::EndOfSnapshot(_))) {
                    continue;
                }
                let line = command::watch::render_event(
                    codec,
                    &event,
                    OutputFormat::Json,
                    SystemTime::now(),
                    false,
                )
                .expect("render")
                .expect("a line");
                lines.push(serde_json::from_str(&line).expect("a JSON line"));
            }
        }
        lines
    }

    async fn tree(&self, namespace: &str, resource_type: &str, name: &str) -> Reply {
        let session = self.session(namespace);
        command::tree::tree(&session, resource_type, name)
            .await
            .map(|tree| Reply::ok(to_json(&tree)))
            .unwrap_or_else(Reply::failed)
    }

    async fn delete_wait(
        &self,
        namespace: &str,
        resource_type: &str,
        name: &str,
        timeout: Duration,
    ) -> Reply {
        let session = self.session(namespace);
        let result = async {
            let id = session.id(resource_type, name).await?;
            command::delete::delete(&session, &[id], Some(timeout)).await
        }
        .await;
        match result {
            Ok(report) => Reply {
                code: if report.blocked.is_empty() { 0 } else { 1 },
                stderr: if report.blocked.is_empty() {
                    String::new()
                } else {
                    command::delete::explain_blockers(&report)
                },
                value: to_json(&report),
            },
            Err(error) => Reply::failed(error),
        }
    }

    async fn snapshot_save(&self, file: &Path) -> Reply {
        let session = self.session("default");
        command::snapshot::save(&session, file, &indicatif_hidden())
            .await
            .map(|saved| Reply::ok(to_json(&saved)))
            .unwrap_or_else(Reply::failed)
    }

    async fn snapshot_inspect(&self, file: &Path) -> Reply {
        command::snapshot::inspect(file)
            .map(|inspected| Reply::ok(to_json(&inspected)))
            .unwrap_or_else(Reply::failed)
    }

    async fn snapshot_restore(&self, file: &Path) -> Reply {
        let session = self.session("default");
        command::snapshot::restore(&session, file, &indicatif_hidden())
            .await
            .map(|restored| Reply::ok(to_json(&restored)))
            .unwrap_or_else(Reply::failed)
    }
}

fn indicatif_hidden() -> indicatif::ProgressBar {
    indicatif::ProgressBar::hidden()
}

/// Drives the real `resctl` binary with `-o json`.
pub(crate) struct Binary {
    pub server: String,
    /// An empty config directory, so no user context leaks in.
    pub config: PathBuf,
    /// With ACLs on: the token every command sends (through RESD_TOKEN).
    pub token: Option<String>,
    /// With TLS: the certificates every command uses (through RESD_CA_CERT and friends).
    pub tls: Option<tests::TestTls>,
}

impl Binary {
    async fn run(&self, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
        let mut command = tokio::process::Command::new(tests::binary("resctl"));
        command
            .arg("--server")
            .arg(&self.server)
            .args(args)
            .env("RESCTL_CONFIG", &self.config)
            .env_remove("RESD_SERVER")
            .env_remove("RESD_TOKEN")
            .env_remove("RESD_CONTEXT")
            .env_remove("RESD_OUTPUT")
            .env_remove("RESD_NAMESPACE")
            .env_remove("RESD_PARTITION")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        if let Some(token) = &self.token {
            command.env("RESD_TOKEN", token);
        }
        if let Some(tls) = &self.tls {
            command
                .env("RESD_CA_CERT", tls.ca())
                .env("RESD_CLIENT_CERT", tls.client_cert())
                .env("RESD_CLIENT_KEY", tls.client_key());
        }
        for (key, value) in env {
            command.env(key, value);
        }
        let output = tokio::time::timeout(Duration::from_secs(120), command.output())
            .await
            .unwrap_or_else(|_| panic!("resctl {args:?} did not finish within 120s"))
            .expect("run resctl");
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    async fn json(&self, args: &[&str]) -> Reply {
        self.json_with_env(args, &[]).await
    }

    async fn json_with_env(&self, args: &[&str], env: &[(&str, &str)]) -> Reply {
        let mut full = vec!["-o", "json"];
        full.extend_from_slice(args);
        let (code, stdout, stderr) = self.run(&full, env).await;
        let value = if stdout.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&stdout).unwrap_or_else(|error| {
                panic!("resctl {args:?} printed invalid JSON ({error}):\n{stdout}")
            })
        };
        Reply {
            code,
            value,
            stderr,
        }
    }
}

impl Driver for Binary {
    fn name(&self) -> &'static str {
        "binary"
    }

    fn actor(&self) -> &'static str {
        if self.token.is_some() {
            "initial-management"
        } else {
            "anonymous"
        }
    }

    async fn apply(&self, path: &Path) -> Reply {
        self.json(&["apply", "-f", &path.display().to_string()])
            .await
    }

    async fn apply_dry_run(&self, path: &Path) -> Reply {
        self.json(&["apply", "--dry-run", "-f", &path.display().to_string()])
            .await
    }

    async fn get(&self, namespace: &str, resource_type: &str, name: Option<&str>) -> Reply {
        let mut args = vec!["get", "-n", namespace, resource_type];
        args.extend(name);
        self.json(&args).await
    }

    async fn get_formatted(
        &self,
        namespace: &str,
        resource_type: &str,
        format: OutputFormat,
    ) -> String {
        let format = match format {
            OutputFormat::Table => "table",
            OutputFormat::Wide => "wide",
            OutputFormat::Yaml => "yaml",
            OutputFormat::Json => "json",
            OutputFormat::Name => "name",
            OutputFormat::JsonPath | OutputFormat::CustomColumns => {
                panic!("get_formatted takes a plain format, not a template or columns")
            }
        };
        let (code, stdout, stderr) = self
            .run(&["get", "-n", namespace, resource_type, "-o", format], &[])
            .await;
        assert_eq!(code, 0, "get -o {format} failed: {stderr}");
        stdout
    }

    async fn edit(
        &self,
        namespace: &str,
        resource_type: &str,
        name: &str,
        from: &str,
        to: &str,
    ) -> Reply {
        let script = format!("sed -i 's/{from}/{to}/'");
        let (code, stdout, stderr) = self
            .run(
                &["edit", "-n", namespace, resource_type, name],
                &[("EDITOR", &script), ("VISUAL", "")],
            )
            .await;
        let saved = stdout.contains(" saved (version ");
        let version = stdout
            .split("(version ")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .unwrap_or_default()
            .to_owned();
        Reply {
            code,
            value: serde_json::json!({"saved": saved, "version": version}),
            stderr,
        }
    }

    async fn watch(
        &self,
        namespace: &str,
        resource_type: &str,
        from_version: &str,
        count: usize,
    ) -> Vec<Value> {
        let count = count.to_string();
        let (code, stdout, stderr) = self
            .run(
                &[
                    "watch",
                    "-n",
                    namespace,
                    resource_type,
                    "--from-version",
                    from_version,
                    "--count",
                    &count,
                    "-o",
                    "json",
                ],
                &[],
            )
            .await;
        assert_eq!(code, 0, "watch failed: {stderr}");
        stdout
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).expect("NDJSON"))
            .filter(|line| line["event"] != "end_of_snapshot")
            .collect()
    }

    async fn tree(&self, namespace: &str, resource_type: &str, name: &str) -> Reply {
        self.json(&["tree", "-n", namespace, resource_type, name])
            .await
    }

    async fn delete_wait(
        &self,
        namespace: &str,
        resource_type: &str,
        name: &str,
        timeout: Duration,
    ) -> Reply {
        let timeout = format!("{}s", timeout.as_secs());
        self.json(&[
            "delete",
            "-n",
            namespace,
            resource_type,
            name,
            "--wait",
            "--timeout",
            &timeout,
        ])
        .await
    }

    async fn snapshot_save(&self, file: &Path) -> Reply {
        self.json(&["snapshot", "save", &file.display().to_string()])
            .await
    }

    async fn snapshot_inspect(&self, file: &Path) -> Reply {
        self.json(&["snapshot", "inspect", &file.display().to_string()])
            .await
    }

    async fn snapshot_restore(&self, file: &Path) -> Reply {
        self.json(&["snapshot", "restore", "--yes", &file.display().to_string()])
            .await
    }
}
