//! A member's watch of a sharded controller's objects (DESIGN §16, `WatchList { shard }`):
//! the objects of the watch that the controller's `coordination.v1.ShardMap` gives the member
//! ([`proto::shard::owns`]), evaluated here, where the data is. The map is followed by a watch
//! of its own; when it changes how objects are placed, the objects are listed again by a fresh
//! watch's snapshot and the member is sent the difference — a Delete for each object it had
//! and no longer owns (or that is gone), an Upsert for each it now owns and lacks — then that
//! watch's changes. What the member holds is remembered (name, uid, version), so the difference
//! is exact whatever order the map's and the objects' changes arrive in.

use std::collections::{HashMap, HashSet};

use futures::StreamExt;
use proto::coordination::v1::ShardMap;
use proto::resource::v1::{Id, Resource, ShardSelector, Tenancy, WatchListRequest};
use proto::shard::{ShardKey, owns, same_placement};

use super::read::{LiveGrants, SharedWatchStream};
use super::{Error, ResourceService};
use crate::resource;
use crate::storage::{Operation, SharedEvent, WatchEvent};

/// Events a member's watch holds ready before its reader takes them.
const BUFFER: usize = 256;

/// An object as the member holds it: (partition, namespace, name) -> (uid, version).
type Held = HashMap<(String, String, String), (String, String)>;

fn key_of(id: &Id) -> (String, String, String) {
    let tenancy = id.tenancy.clone().unwrap_or_default();
    (tenancy.partition, tenancy.namespace, id.name.clone())
}

/// Where the map lives and whose objects are watched, checked.
struct Shard {
    controller: String,
    member: String,
    map_tenancy: Tenancy,
}

fn check(selector: &ShardSelector, request: &WatchListRequest) -> Result<Shard, Error> {
    for (field, value) in [
        ("shard.controller", &selector.controller),
        ("shard.member", &selector.member),
    ] {
        if value.is_empty() || value.len() > 253 || value.chars().any(char::is_control) {
            return Err(Error::invalid(format!(
                "{field} must be 1 to 253 printable characters"
            )));
        }
    }
    if !request.since_version.is_empty() {
        return Err(Error::OutOfRange(
            "cannot resume the watch: a shard watch cannot be resumed (its objects move with the ring); watch again".into(),
        ));
    }
    // Where the map lives: the selector's place, else the watched tenancy (an empty name is
    // `default`, as everywhere); a wildcard names no place.
    let (partition, namespace) = if selector.partition.is_empty() && selector.namespace.is_empty() {
        let watched = request.tenancy.clone().unwrap_or(Tenancy {
            partition: resource::WILDCARD.into(),
            namespace: resource::WILDCARD.into(),
        });
        (watched.partition, watched.namespace)
    } else {
        (selector.partition.clone(), selector.namespace.clone())
    };
    let or_default = |name: String| {
        if name.is_empty() {
            "default".to_owned()
        } else {
            name
        }
    };
    let map_tenancy = Tenancy {
        partition: or_default(partition),
        namespace: or_default(namespace),
    };
    if map_tenancy.partition == resource::WILDCARD || map_tenancy.namespace == resource::WILDCARD {
        return Err(Error::invalid(
            "shard.partition and shard.namespace name where the ShardMap lives when the watched tenancy is not one namespace",
        ));
    }
    Ok(Shard {
        controller: selector.controller.clone(),
        member: selector.member.clone(),
        map_tenancy,
    })
}

/// The map in a map watch's event: `Some(map)` for the controller's (an unreadable one places
/// nothing), `None` for another resource.
fn map_in(event: &WatchEvent, controller: &str) -> Option<ShardMap> {
    let (resource, deleted) = match &event.operation {
        Operation::Upsert(resource) => (resource, false),
        Operation::Delete(resource) => (resource, true),
        Operation::EndOfSnapshot | Operation::Bookmark => return None,
    };
    if resource.id.as_ref().is_none_or(|id| id.name != controller) {
        return None;
    }
    Some(if deleted {
        ShardMap::default()
    } else {
        crate::registry::decode_data(resource).unwrap_or_default()
    })
}

impl ResourceService {
    /// WatchList with a shard selector (see the module).
    pub(super) async fn watch_shard(
        self: &std::sync::Arc<Self>,
        grants: LiveGrants,
        mut request: WatchListRequest,
    ) -> Result<SharedWatchStream, Error> {
        let selector = request.shard.take().unwrap_or_default();
        let shard = check(&selector, &request)?;
        // The map first, as the caller may read it: its snapshot places the first objects.
        let mut maps = self
            .watch_list_plain(
                grants.clone(),
                WatchListRequest {
                    r#type: Some(resource::new_type("coordination", "v1", "ShardMap")),
                    tenancy: Some(shard.map_tenancy.clone()),
                    name_prefix: shard.controller.clone(),
                    ..WatchListRequest::default()
                },
            )
            .await?;
        let mut map = ShardMap::default();
        loop {
            match maps.next().await {
                Some(Ok(event)) => {
                    if matches!(event.event().operation, Operation::EndOfSnapshot) {
                        break;
                    }
                    if let Some(found) = map_in(event.event(), &shard.controller) {
                        map = found;
                    }
                }
                Some(Err(error)) => return Err(error),
                None => return Err(Error::Unavailable("the watch of the ShardMap ended".into())),
            }
        }
        let objects = self
            .watch_list_plain(grants.clone(), request.clone())
            .await?;
        let (sender, receiver) = tokio::sync::mpsc::channel(BUFFER);
        let service = self.clone();
        tokio::spawn(async move {
            let follower = Follower {
                service,
                grants,
                request,
                shard,
                map,
                held: Held::new(),
                sender,
                primed: false,
            };
            follower.run(maps, objects).await;
        });
        Ok(tokio_stream::wrappers::ReceiverStream::new(receiver).boxed())
    }
}

/// The task behind one member's watch.
struct Follower {
    service: std::sync::Arc<ResourceService>,
    grants: LiveGrants,
    request: WatchListRequest,
    shard: Shard,
    map: ShardMap,
    held: Held,
    sender: tokio::sync::mpsc::Sender<Result<SharedEvent, Error>>,
    /// Whether the first snapshot (placed by the map it began with) has been sent whole: the
    /// map is followed only after it.
    primed: bool,
}

/// Whether the follower goes on.
enum Next {
    Go,
    Stop,
}

impl Follower {
    fn owned(&self, resource: &Resource) -> bool {
        resource
            .id
            .as_ref()
            .is_some_and(|id| owns(&self.map, &self.shard.member, &ShardKey::of(id)))
    }

    async fn send(&self, item: Result<SharedEvent, Error>) -> Next {
        match self.sender.send(item).await {
            Ok(()) => Next::Go,
            Err(_) => Next::Stop,
        }
    }

    async fn run(mut self, mut maps: SharedWatchStream, mut objects: SharedWatchStream) {
        loop {
            let next = tokio::select! {
                biased;
                () = self.sender.closed() => Next::Stop,
                event = maps.next(), if self.primed => match event {
                    Some(Ok(event)) => match map_in(event.event(), &self.shard.controller) {
                        Some(map) if !same_placement(&map, &self.map) => {
                            self.map = map;
                            match self.relist().await {
                                Ok(Some(fresh)) => {
                                    objects = fresh;
                                    Next::Go
                                }
                                Ok(None) => Next::Stop,
                                Err(error) => {
                                    let _ = self.send(Err(error)).await;
                                    Next::Stop
                                }
                            }
                        }
                        Some(map) => {
                            self.map = map;
                            Next::Go
                        }
                        None => Next::Go,
                    },
                    Some(Err(error)) => {
                        let _ = self.send(Err(error)).await;
                        Next::Stop
                    }
                    None => Next::Stop,
                },
                event = objects.next() => match event {
                    Some(Ok(event)) => self.object(event).await,
                    Some(Err(error)) => {
                        let _ = self.send(Err(error)).await;
                        Next::Stop
                    }
                    None => Next::Stop,
                },
            };
            if matches!(next, Next::Stop) {
                return;
            }
        }
    }

    /// One change of the watched objects, as the member sees it.
    async fn object(&mut self, event: SharedEvent) -> Next {
        match &event.event().operation {
            Operation::Upsert(resource) => {
                if !self.owned(resource) {
                    return Next::Go;
                }
                let id = resource.id.clone().unwrap_or_default();
                self.held
                    .insert(key_of(&id), (id.uid.clone(), resource.version.clone()));
            }
            Operation::Delete(resource) => {
                let id = resource.id.clone().unwrap_or_default();
                if self.held.remove(&key_of(&id)).is_none() && !self.owned(resource) {
                    return Next::Go;
                }
            }
            Operation::EndOfSnapshot => self.primed = true,
            Operation::Bookmark => {}
        }
        self.send(Ok(event)).await
    }

    /// The objects placed anew: a fresh watch's snapshot, compared with what the member holds.
    /// Returns the fresh watch to go on with (`None`: the reader is gone).
    async fn relist(&mut self) -> Result<Option<SharedWatchStream>, Error> {
        let mut fresh = self
            .service
            .watch_list_plain(self.grants.clone(), self.request.clone())
            .await?;
        // What the member held before: those the snapshot no longer has are gone.
        let before: HashSet<(String, String, String)> = self.held.keys().cloned().collect();
        let mut seen: HashSet<(String, String, String)> = HashSet::new();
        loop {
            let event = match fresh.next().await {
                Some(Ok(event)) => event,
                Some(Err(error)) => return Err(error),
                None => return Err(Error::Unavailable("the watch ended while relisting".into())),
            };
            let resource = match &event.event().operation {
                Operation::EndOfSnapshot => break,
                Operation::Upsert(resource) => resource.clone(),
                Operation::Delete(_) | Operation::Bookmark => continue,
            };
            let id = resource.id.clone().unwrap_or_default();
            let key = key_of(&id);
            let owned = self.owned(&resource);
            let held = self.held.get(&key).cloned();
            if before.contains(&key) {
                seen.insert(key.clone());
            }
            let send = if owned {
                let now = (id.uid.clone(), resource.version.clone());
                (held.as_ref() != Some(&now)).then(|| {
                    self.held.insert(key, now);
                    event
                })
            } else if held.is_some() {
                self.held.remove(&key);
                Some(SharedEvent::new(WatchEvent {
                    version: resource.version.clone(),
                    operation: Operation::Delete(resource),
                    actor: String::new(),
                }))
            } else {
                None
            };
            if let Some(event) = send
                && matches!(self.send(Ok(event)).await, Next::Stop)
            {
                return Ok(None);
            }
        }
        // What the member holds and the snapshot no longer has: gone meanwhile.
        let gone: Vec<_> = before.difference(&seen).cloned().collect();
        for key in gone {
            let Some((uid, version)) = self.held.remove(&key) else {
                continue;
            };
            let (partition, namespace, name) = key;
            let deleted = Resource {
                id: Some(Id {
                    uid,
                    name,
                    r#type: self.request.r#type.clone(),
                    tenancy: Some(Tenancy {
                        partition,
                        namespace,
                    }),
                }),
                version: version.clone(),
                ..Resource::default()
            };
            let event = SharedEvent::new(WatchEvent {
                version,
                operation: Operation::Delete(deleted),
                actor: String::new(),
            });
            if matches!(self.send(Ok(event)).await, Next::Stop) {
                return Ok(None);
            }
        }
        Ok(Some(fresh))
    }
}
