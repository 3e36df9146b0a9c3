//! A session: the client, the codec fetched once from the server, and the defaults that the
//! global flags, the environment and the selected context resolve to.

use std::io::IsTerminal;

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use proto::client::Client;
use proto::cluster::v1::{Scope, TypeInfo};
use proto::codec::Codec;
use proto::resource::v1::{Id, Tenancy};
use tokio::sync::OnceCell;

use crate::cli::GlobalArgs;
use crate::output::OutputFormat;

pub const DEFAULT_PARTITION: &str = "default";
pub const DEFAULT_NAMESPACE: &str = "default";

/// What every command works with.
#[derive(Debug)]
pub struct Session {
    pub client: Client,
    pub output: OutputFormat,
    pub partition: String,
    pub namespace: String,
    /// Whether to draw progress bars (stderr is a terminal).
    pub interactive: bool,
    codec: OnceCell<Codec>,
}

impl Session {
    /// Prints on stderr the deprecation warnings servers sent (DESIGN §15.1), each once.
    pub fn print_warnings(&self) {
        for warning in self.client.take_warnings() {
            eprintln!("warning: {warning}");
        }
    }

    /// Resolves flags/environment over the selected context over the defaults.
    pub fn from_args(global: &GlobalArgs) -> anyhow::Result<Session> {
        use proto::client::connect::ConnectError;
        let connection = global.connect.resolve().map_err(|error| match error {
            ConnectError::Usage(why) => anyhow::Error::new(crate::UsageError(why)),
            error => anyhow::Error::new(error),
        })?;
        let config = connection.config.with_consistent(global.consistent);
        Ok(Session {
            client: Client::new(config)?,
            output: global.output.format,
            partition: global
                .partition
                .clone()
                .or(connection.partition)
                .unwrap_or_else(|| DEFAULT_PARTITION.to_owned()),
            namespace: global
                .namespace
                .clone()
                .or(connection.namespace)
                .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned()),
            interactive: std::io::stderr().is_terminal(),
            codec: OnceCell::new(),
        })
    }

    /// A session over an existing client with default tenancy (the library driver of tests).
    pub fn new(client: Client, output: OutputFormat) -> Session {
        Session {
            client,
            output,
            partition: DEFAULT_PARTITION.to_owned(),
            namespace: DEFAULT_NAMESPACE.to_owned(),
            interactive: false,
            codec: OnceCell::new(),
        }
    }

    /// The codec for the server's types (fetched with ListTypes on first use).
    pub async fn codec(&self) -> anyhow::Result<&Codec> {
        self.codec
            .get_or_try_init(|| async {
                let types = self
                    .client
                    .list_types()
                    .await
                    .context("cannot fetch the server's types")?;
                Ok(Codec::new(types)?)
            })
            .await
    }

    /// A type by GVK or unique kind.
    pub async fn resolve_type(&self, name: &str) -> anyhow::Result<TypeInfo> {
        Ok(self.codec().await?.resolve_type(name)?.clone())
    }

    /// The tenancy a command addresses for a type of `scope`; `all` lists across tenancies.
    pub fn tenancy(&self, scope: Scope, all: bool) -> Tenancy {
        if all {
            return proto::client::describe::every_tenancy(scope);
        }
        let (partition, namespace) = match scope {
            Scope::Cluster => ("", ""),
            Scope::Partition => (self.partition.as_str(), ""),
            _ => (self.partition.as_str(), self.namespace.as_str()),
        };
        Tenancy {
            partition: partition.to_owned(),
            namespace: namespace.to_owned(),
        }
    }

    /// The id of resource `name` of type `type_name` in this session's tenancy.
    pub async fn id(&self, type_name: &str, name: &str) -> anyhow::Result<Id> {
        let info = self.resolve_type(type_name).await?;
        Ok(Id {
            uid: String::new(),
            name: name.to_owned(),
            r#type: info.r#type.clone(),
            tenancy: Some(self.tenancy(info.scope(), false)),
        })
    }

    /// A progress bar on stderr when it is a terminal and the work is long enough to watch.
    pub fn progress(&self, length: u64, message: &str) -> ProgressBar {
        if !self.interactive {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::new(length);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg} [{bar:30.cyan/blue}] {pos}/{len} ({per_sec}, eta {eta})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_message(message.to_owned());
        bar
    }

    /// A byte-counting progress bar (snapshots).
    pub fn byte_progress(&self, length: Option<u64>, message: &str) -> ProgressBar {
        if !self.interactive {
            return ProgressBar::hidden();
        }
        let bar = match length {
            Some(length) => ProgressBar::new(length).with_style(
                ProgressStyle::with_template(
                    "{msg} [{bar:30.cyan/blue}] {bytes}/{total_bytes} ({bytes_per_sec})",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            ),
            None => ProgressBar::new_spinner().with_style(
                ProgressStyle::with_template("{spinner} {msg} {bytes} ({bytes_per_sec})")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            ),
        };
        bar.set_message(message.to_owned());
        bar
    }
}

/// Asks a yes/no question on stderr and reads the answer from stdin; `default` on an empty
/// answer, `false` when stdin is not a terminal or closed.
pub fn confirm(question: &str, default: bool) -> bool {
    if !std::io::stdin().is_terminal() {
        return false;
    }
    let hint = if default { "[Y/n]" } else { "[y/N]" };
    crate::say_raw!("{question} {hint} ");
    let mut answer = String::new();
    match std::io::stdin().read_line(&mut answer) {
        Ok(0) | Err(_) => false,
        Ok(_) => match answer.trim().to_ascii_lowercase().as_str() {
            "" => default,
            "y" | "yes" => true,
            _ => false,
        },
    }
}
