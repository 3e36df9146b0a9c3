//! The payments team's invoice controller, a program of its own (DESIGN §16, README "Run your
//! own controller"). For every `payments.v1.Invoice` it holds a finalizer, issues a
//! `payments.v1.Receipt` the invoice owns, and writes an `Accepted` condition; when an invoice
//! is deleted it releases the finalizer (the receipt goes with the invoice). Run two or more
//! replicas: one holds the `invoices` lease and reconciles, the others wait to take over.
//!
//! ```sh
//! resctl apply -f fixtures/teams             # the Invoice and Receipt types, two invoices
//! cargo run -p runtime --example invoice_controller -- replica-1
//! ```
//!
//! It finds the cluster as resctl does: `--server`, `--token`/`--token-file`, `--ca-cert`,
//! `--client-cert`, `--client-key`, `--context` (or their `RESD_*` variables) over the current
//! context of resctl's contexts file — next to `resd dev`, no flag at all. `--lease-seconds`
//! shortens the lease for demos, `--placement each-replica` runs every replica, `--work-ms`
//! makes issuing a receipt take that long (a payment provider's latency); `--help` says all.

use std::time::Duration;

use proto::client::Client;
use proto::meta::{add_finalizer, has_finalizer, is_marked_for_deletion, remove_finalizer};
use proto::resource::v1::{Condition, Id, Resource, State, Status, Type};
use runtime::controller::{
    Action, Context, Controller, Placement, ReconcileError, Reconciler, Request,
};
use runtime::replica::Replica;
use tokio_util::sync::CancellationToken;

const FINALIZER: &str = "payments.example.com/receipt";
const STATUS_KEY: &str = "payments.example.com/invoice-controller";

/// The invoice's fields this controller reads (what prost-build makes of invoice.proto).
#[derive(Clone, PartialEq, prost::Message)]
struct Invoice {
    #[prost(int64, tag = "1")]
    amount_cents: i64,
    #[prost(string, tag = "3")]
    customer: String,
}

/// receipt.proto's message.
#[derive(Clone, PartialEq, prost::Message)]
struct Receipt {
    #[prost(string, tag = "1")]
    invoice: String,
    #[prost(int64, tag = "2")]
    amount_cents: i64,
}

fn payments(kind: &str) -> Type {
    Type {
        group: "payments".into(),
        group_version: "v1".into(),
        kind: kind.into(),
    }
}

struct Invoices {
    /// This replica, named in the conditions it writes.
    identity: String,
    /// How long issuing a receipt takes outside the cluster (a payment provider's API;
    /// `WORK_MS` simulates it): the window in which a replica may be paused between deciding
    /// to write and writing, which the lease's fence closes.
    work: Duration,
}

#[async_trait::async_trait]
impl Reconciler<Client> for Invoices {
    async fn reconcile(
        &self,
        context: &Context<Client>,
        request: Request,
    ) -> Result<Action, ReconcileError> {
        let mut lookup = request.id.clone();
        lookup.uid.clear();
        let Some(invoice) = context.read(&lookup).await? else {
            return Ok(Action::AwaitChange);
        };
        let id = invoice.id.clone().unwrap_or_default();
        let held = has_finalizer(&invoice, FINALIZER);
        if is_marked_for_deletion(&invoice) {
            if held && context.leads() {
                // Nothing to clean up outside the cluster here; the receipt is owned by the
                // invoice and goes with it. Release, compare-and-swap on what was read.
                let mut released = invoice.clone();
                remove_finalizer(&mut released, FINALIZER);
                context.write(released).await?;
            }
            return Ok(Action::AwaitChange);
        }
        // Reads can be slow; a replica that lost the lease meanwhile (paused, partitioned)
        // writes nothing.
        if !context.leads() {
            return Ok(Action::AwaitChange);
        }
        if !held {
            let mut holding = invoice.clone();
            add_finalizer(&mut holding, FINALIZER);
            context.write(holding).await?;
            // The write comes back as an event: the rest happens on the next reconcile.
            return Ok(Action::AwaitChange);
        }
        let data = invoice
            .data
            .as_ref()
            .map(|any| <Invoice as prost::Message>::decode(any.value.as_slice()))
            .transpose()
            .map_err(|error| ReconcileError(format!("the invoice's data: {error}")))?
            .unwrap_or_default();
        let receipt_id = Id {
            uid: String::new(),
            name: format!("receipt-{}", id.name),
            r#type: Some(payments("Receipt")),
            tenancy: id.tenancy.clone(),
        };
        if context.read(&receipt_id).await?.is_none() && context.leads() {
            // The provider's call: a replica paused here past its lease and woken after another
            // took over has the write below refused (`FENCED`), nothing stored.
            tokio::time::sleep(self.work).await;
            let receipt = Resource {
                id: Some(receipt_id.clone()),
                owner: Some(id.clone()),
                data: Some(prost_types::Any {
                    type_url: "type.googleapis.com/resd.payments.v1.Receipt".into(),
                    value: prost::Message::encode_to_vec(&Receipt {
                        invoice: id.name.clone(),
                        amount_cents: data.amount_cents,
                    }),
                }),
                ..Default::default()
            };
            context.write(receipt).await?;
        }
        let status = Status {
            observed_generation: invoice.generation.clone(),
            conditions: vec![Condition {
                r#type: "Accepted".into(),
                state: State::True as i32,
                reason: "ReceiptIssued".into(),
                message: format!(
                    "receipt {} issued to {} for {} cents by {}",
                    receipt_id.name, data.customer, data.amount_cents, self.identity
                ),
                resource: None,
            }],
            updated_at: None,
        };
        if context.leads() {
            // Unless it says what the stored one says (no write, no event, no loop); its
            // observed generation tells readers which spec it speaks of.
            context
                .write_status_if_changed(&invoice, STATUS_KEY, status)
                .await?;
        }
        Ok(Action::AwaitChange)
    }
}

/// The payments team's invoice controller: run two or more replicas; one holds the
/// `invoices` lease and reconciles, the others wait to take over.
#[derive(Debug, clap::Parser)]
#[command(name = "invoice_controller")]
struct Args {
    /// This replica's identity, as the lease's holder names it [default: invoices-<host>-<pid>]
    identity: Option<String>,
    /// Where the cluster is: the same flags and RESD_* variables as resctl, over resctl's
    /// current context (a program next to `resd dev` needs none)
    #[command(flatten)]
    connect: runtime::program::ConnectArgs,
    /// The lease's duration in seconds (at least 3; shorter than the default 15 for demos)
    #[arg(long, env = "LEASE_SECONDS", value_name = "SECONDS")]
    lease_seconds: Option<u64>,
    /// Where replicas reconcile: `singleton` (the lease's holder), `sharded` (the invoices
    /// split over the live replicas, each under a lease of its own) or `each-replica`
    #[arg(long, env = "PLACEMENT", default_value = "singleton")]
    placement: String,
    /// How long issuing a receipt takes outside the cluster, in milliseconds (a payment
    /// provider's latency)
    #[arg(long, env = "WORK_MS", value_name = "MS", default_value_t = 0)]
    work_ms: u64,
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let args = <Args as clap::Parser>::parse();
    runtime::program::init_logging();
    let identity = args.identity.clone().unwrap_or_else(|| {
        // Unique per replica: its host (a container's pid is 1 everywhere) and its pid.
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".into());
        format!("invoices-{host}-{}", std::process::id())
    });
    let (client, connection) =
        runtime::program::connect(&args.connect).map_err(|error| error.to_string())?;
    tracing::info!(
        server = %connection.config.server,
        context = %connection.context.as_deref().unwrap_or("(none)"),
        tls = connection.config.tls.is_some(),
        token = connection.config.token.is_some(),
        "connecting"
    );
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let signals = tokio::spawn(async move {
        // ctrl-c or SIGTERM (a supervisor's stop): hand the lease back and remove the report.
        let terminate = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = terminate => {}
        }
        stop.cancel();
    });
    let work = Duration::from_millis(args.work_ms);
    let mut controller = Controller::new("invoices", payments("Invoice"))
        .with_reconciler(Invoices {
            identity: identity.clone(),
            work,
        })
        .with_finalizer(FINALIZER);
    match args.placement.as_str() {
        "singleton" => {}
        // Each replica reconciles the invoices the server's ShardMap gives it; a replica that
        // stops (or is paused past its lease) has its share handed to the others.
        "sharded" => controller = controller.with_placement(Placement::Sharded),
        "each-replica" => {
            // Every replica reconciles: the finalizer writes are compare-and-swap on the invoice
            // read (a replica that lost the race retries), and the receipt and the status are the
            // same whichever replica writes them.
            controller = controller.with_placement(Placement::EachReplica);
        }
        other => {
            return Err(format!(
                "--placement {other:?}: use singleton, sharded or each-replica"
            ));
        }
    }
    let mut replica = Replica::new(&identity);
    if let Some(seconds) = args.lease_seconds {
        // Shorter leases for demos and tests.
        replica = replica.with_lease_duration(Duration::from_secs(seconds.max(3)));
    }
    tracing::info!(%identity, "invoice controller running (ctrl-c or SIGTERM stops it and hands the lease back)");
    let ran = replica.run(controller, client, shutdown).await;
    signals.abort();
    ran.map_err(|error| error.to_string())
}
