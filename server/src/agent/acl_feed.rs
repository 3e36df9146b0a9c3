//! Keeps a node's [`TokenStore`] current: a watch of `acl.v1.Policy` and one of `acl.v1.Token`
//! on the local state, each replacing its half of the store from the watch's snapshot and then
//! applying every change. A watch that ends (a restore, a node catching up, shutdown) is opened
//! again after a pause. [`follow`] is the loop; the registry's feed of `registry.v1.Type` uses it
//! too.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use proto::resource::v1::{Resource, Tenancy, WatchListRequest, watch_event};
use tokio_util::sync::CancellationToken;

use crate::acl::{AllowAll, TokenStore};
use crate::registry::decode_data;
use crate::resource;
use crate::service::ResourceService;

#[derive(Clone, Copy)]
enum Kind {
    Policy,
    Token,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Policy => "Policy",
            Kind::Token => "Token",
        }
    }

    fn replace(self, store: &TokenStore, items: Vec<Resource>) {
        match self {
            Kind::Policy => store.replace_policies(
                items
                    .iter()
                    .filter_map(|r| Some((name(r), decode_data(r).ok()?)))
                    .collect(),
            ),
            Kind::Token => store.replace_tokens(
                items
                    .iter()
                    .filter_map(|r| Some((name(r), decode_data(r).ok()?)))
                    .collect(),
            ),
        }
    }

    fn upsert(self, store: &TokenStore, item: &Resource) {
        match self {
            Kind::Policy => {
                if let Ok(policy) = decode_data(item) {
                    store.put_policy(&name(item), policy);
                }
            }
            Kind::Token => {
                if let Ok(token) = decode_data(item) {
                    store.put_token(&name(item), token);
                }
            }
        }
    }

    fn delete(self, store: &TokenStore, item: &Resource) {
        match self {
            Kind::Policy => store.remove_policy(&name(item)),
            Kind::Token => store.remove_token(&name(item)),
        }
    }
}

fn name(resource: &Resource) -> String {
    resource
        .id
        .as_ref()
        .map(|id| id.name.clone())
        .unwrap_or_default()
}

/// Feeds `store` until `shutdown`.
pub(super) async fn run(
    service: Arc<ResourceService>,
    store: Arc<TokenStore>,
    shutdown: CancellationToken,
) {
    let policies = follow(
        service.clone(),
        AclFeed {
            store: store.clone(),
            kind: Kind::Policy,
        },
        shutdown.clone(),
    );
    let tokens = follow(
        service,
        AclFeed {
            store,
            kind: Kind::Token,
        },
        shutdown,
    );
    tokio::join!(policies, tokens);
}

struct AclFeed {
    store: Arc<TokenStore>,
    kind: Kind,
}

impl Feed for AclFeed {
    fn resource_type(&self) -> proto::resource::v1::Type {
        resource::new_type("acl", "v1", self.kind.name())
    }
    fn replace(&self, items: Vec<Resource>) {
        tracing::debug!(
            kind = self.kind.name(),
            count = items.len(),
            "ACL cache loaded"
        );
        self.kind.replace(&self.store, items);
    }
    fn upsert(&self, item: &Resource) {
        self.kind.upsert(&self.store, item);
    }
    fn delete(&self, item: &Resource) {
        self.kind.delete(&self.store, item);
    }
}

/// What follows one cluster-scoped type of the local state: the whole set from a watch's
/// snapshot, then every change.
pub(super) trait Feed: Send + Sync {
    fn resource_type(&self) -> proto::resource::v1::Type;
    /// Where to follow it (the default tenancy of its scope unless said).
    fn tenancy(&self) -> Tenancy {
        Tenancy::default()
    }
    fn replace(&self, items: Vec<Resource>);
    fn upsert(&self, item: &Resource);
    fn delete(&self, item: &Resource);
}

/// Follows `feed`'s type until `shutdown`; a watch that ends (a restore, a node catching up) is
/// opened again after a pause.
pub(super) async fn follow(
    service: Arc<ResourceService>,
    feed: impl Feed,
    shutdown: CancellationToken,
) {
    let mut pause = Duration::from_millis(100);
    let resource_type = feed.resource_type();
    let gvk = resource::gvk(&resource_type);
    loop {
        let request = WatchListRequest {
            r#type: Some(resource_type.clone()),
            tenancy: Some(feed.tenancy()),
            ..WatchListRequest::default()
        };
        let why = match service.watch_list(Arc::new(AllowAll), request).await {
            Err(error) => error.to_string(),
            Ok(mut events) => {
                let mut snapshot = Some(Vec::new());
                loop {
                    let event = tokio::select! {
                        () = shutdown.cancelled() => return,
                        event = events.next() => event,
                    };
                    let event = match event {
                        None => break "the watch ended".to_owned(),
                        Some(Err(error)) => break error.to_string(),
                        Some(Ok(event)) => event,
                    };
                    pause = Duration::from_millis(100);
                    match (event.event, snapshot.as_mut()) {
                        (Some(watch_event::Event::Upsert(upsert)), Some(items)) => {
                            items.extend(upsert.resource);
                        }
                        (Some(watch_event::Event::EndOfSnapshot(_)), Some(_)) => {
                            if let Some(items) = snapshot.take() {
                                feed.replace(items);
                            }
                        }
                        (Some(watch_event::Event::Upsert(upsert)), None) => {
                            if let Some(item) = &upsert.resource {
                                feed.upsert(item);
                            }
                        }
                        (Some(watch_event::Event::Delete(delete)), _) => {
                            if let Some(item) = &delete.resource {
                                feed.delete(item);
                            }
                        }
                        _ => {}
                    }
                }
            }
        };
        tracing::debug!(r#type = %gvk, %why, retry_in = ?pause, "following the stored resources again");
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}
