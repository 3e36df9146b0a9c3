//! One replica of a controller in a program of its own (DESIGN §16): the controller of
//! [`crate::controller`] run over an [`Api`] (a cluster client), with — for a singleton — the
//! election of [`crate::election`] gating its reconciles, and the report of [`crate::report`]
//! that shows it in `ListControllers`, `resctl controllers`, the dashboard and the blame of the
//! finalizers it declares.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::api::Api;
use crate::controller::{Controller, DefinitionError, Gate, Placement, Stats};
use crate::election::{ApiStore, Config, ConfigError, Elector};
use crate::report::Identity;

/// Who this replica is, where its Lease and report live, and its timings.
#[derive(Debug, Clone)]
pub struct Replica {
    /// This replica, as a Lease's holder names it.
    pub identity: String,
    pub host: String,
    /// Where its Lease and report live.
    pub partition: String,
    pub namespace: String,
    pub report_every: Duration,
    /// The lease timings (client-go's defaults unless set).
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// A replica that cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplicaError {
    #[error(transparent)]
    Definition(#[from] DefinitionError),
    #[error(transparent)]
    Election(#[from] ConfigError),
}

impl Replica {
    /// Replica `identity`, its Lease and report in `default/default`, client-go's timings.
    pub fn new(identity: impl Into<String>) -> Replica {
        Replica {
            identity: identity.into(),
            host: std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".into()),
            partition: "default".into(),
            namespace: "default".into(),
            report_every: Duration::from_secs(5),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Shorter (or longer) leases: renewed within two thirds of `duration`, tried every sixth,
    /// reported as often as tried.
    pub fn with_lease_duration(mut self, duration: Duration) -> Replica {
        self.lease_duration = duration;
        self.renew_deadline = duration * 2 / 3;
        self.retry_period = duration / 6;
        self.report_every = self.retry_period;
        self
    }

    /// Runs `controller` on `api` until `shutdown`: the election (a singleton), the report,
    /// the watches and the reconciles. Bad definitions and timings are refused before anything
    /// starts. A singleton hands its lease back, and every replica removes its report, on the
    /// way out.
    pub async fn run<A: Api>(
        self,
        controller: Controller<A>,
        api: A,
        shutdown: CancellationToken,
    ) -> Result<(), ReplicaError> {
        controller.validate()?;
        // The lease is handed back, and the report removed, only once no reconcile runs any
        // more: a reconcile still writing must not overlap the next holder.
        let stopped = CancellationToken::new();
        // A singleton's replica holds the controller's lease; a shard member a lease of its
        // own, which only it takes: it fences the member's writes, and the server takes it
        // away when the member drops out of the ring.
        let (lease, shard) = match controller.placement {
            Placement::EachReplica => (None, None),
            Placement::Singleton => (Some(controller.name.clone()), None),
            Placement::Sharded => (
                Some(crate::report::member_name(&controller.name, &self.identity)),
                Some(crate::shard::Shard::new(
                    &controller.name,
                    &self.identity,
                    &self.partition,
                    &self.namespace,
                )),
            ),
        };
        let (gate, election) = match &lease {
            None => (None, None),
            Some(lease) => {
                let mut config = Config::new(&self.namespace, lease, &self.identity);
                config.partition = self.partition.clone();
                config.duration = self.lease_duration;
                config.renew_deadline = self.renew_deadline;
                config.retry_period = self.retry_period;
                let elector = Elector::new(config, ApiStore(api.clone()))?;
                let leadership = elector.leadership();
                if let Some(shard) = &shard {
                    let told = shard.clone();
                    leadership.on_taken_back(move || told.took_lease_back());
                }
                let gate = Gate {
                    leadership,
                    recheck: self.retry_period,
                    shard: shard.clone(),
                };
                (Some(gate), Some(tokio::spawn(elector.run(stopped.clone()))))
            }
        };
        let following = shard
            .as_ref()
            .map(|shard| tokio::spawn(shard.clone().follow(api.clone(), stopped.clone())));
        let stats = Arc::new(Stats::default());
        let reporting = tokio::spawn(crate::report::run(
            ApiStore(api.clone()),
            Identity {
                controller: controller.name.clone(),
                identity: self.identity.clone(),
                host: self.host.clone(),
                partition: self.partition.clone(),
                namespace: self.namespace.clone(),
                lease,
                shard,
                managed_type: controller.managed_type.clone(),
                watched_types: controller.watches.iter().map(|(t, _)| t.clone()).collect(),
                finalizers: controller.finalizers.clone(),
                every: self.report_every,
            },
            stats.clone(),
            gate.as_ref().map(|gate| gate.leadership.clone()),
            stopped.clone(),
        ));
        // A replica's writes carry its lease: one paused past it and woken after it changed
        // hands has every write refused (`FENCED`), and stops.
        let api = match &gate {
            Some(gate) => api.fenced(gate.leadership.fence()),
            None => api,
        };
        crate::controller::run(Arc::new(controller), api, stats, gate, shutdown).await;
        stopped.cancel();
        if let Some(election) = election {
            let _ = election.await;
        }
        if let Some(following) = following {
            let _ = following.await;
        }
        let _ = reporting.await;
        Ok(())
    }
}
