//! The agent: one running resd node. Builds the registry, the storage backend and the services,
//! binds the API listener, and serves until shutdown. `main.rs` turns flags into an
//! [`AgentConfig`] and signals into the shutdown token.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::acl::{AclsDisabled, TokenResolver};
use crate::registry::{Registry, RegistryError};
use crate::service::serve::{self, ServeError};
use crate::service::{self, ResourceService};
use crate::storage::inmem::InMemBackend;

#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Address of the public gRPC API; port 0 picks a free port.
    pub api_addr: SocketAddr,
    /// Largest encoded resource a client may write.
    pub max_resource_bytes: usize,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            api_addr: SocketAddr::from(([127, 0, 0, 1], 8502)),
            max_resource_bytes: service::DEFAULT_MAX_RESOURCE_BYTES,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("invalid type registry: {0}")]
    Registry(#[from] RegistryError),
    #[error(
        "cannot listen on {addr}: {source} (is another resd or program using the port? pick another with --api-addr)"
    )]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create the default partition and namespace: {0}")]
    Bootstrap(#[source] service::Error),
    #[error(transparent)]
    Serve(#[from] ServeError),
}

/// A node that has bound its listener and is ready to serve.
#[derive(Debug)]
pub struct Agent {
    listener: TcpListener,
    service: Arc<ResourceService>,
    tokens: Arc<dyn TokenResolver>,
    shutdown: CancellationToken,
}

impl Agent {
    /// Builds the node and binds its listener. Nothing is served until [`Agent::run`].
    pub async fn start(
        config: AgentConfig,
        shutdown: CancellationToken,
    ) -> Result<Agent, AgentError> {
        let registry = Arc::new(Registry::builtin()?);
        let backend = Arc::new(InMemBackend::new());
        let service = ResourceService::new(backend, registry)
            .with_max_resource_bytes(config.max_resource_bytes)
            .with_shutdown(shutdown.clone());
        service
            .ensure_default_tenancy()
            .await
            .map_err(AgentError::Bootstrap)?;
        let listener =
            TcpListener::bind(config.api_addr)
                .await
                .map_err(|source| AgentError::Bind {
                    addr: config.api_addr,
                    source,
                })?;
        Ok(Agent {
            listener,
            service: Arc::new(service),
            tokens: Arc::new(AclsDisabled),
            shutdown,
        })
    }

    /// The address the API listens on (the real port when the config asked for port 0).
    pub fn api_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until the shutdown token is cancelled and every request has finished.
    pub async fn run(self) -> Result<(), AgentError> {
        serve::serve(self.listener, self.service, self.tokens, self.shutdown).await?;
        Ok(())
    }
}
