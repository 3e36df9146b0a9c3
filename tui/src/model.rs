//! The dashboard's copy of the cluster's resources, fed by one watch per type: what the views
//! read. Plain data: no I/O, no terminal.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use proto::client::describe;
use proto::cluster::v1::{Scope, TypeInfo};
use proto::codec::gvk;
use proto::resource::v1::watch_event::Event;
use proto::resource::v1::{Id, Resource, Tenancy, WatchEvent};

/// The types whose resources are the tenancies themselves.
const PARTITION: &str = "tenancy.v1.Partition";
const NAMESPACE: &str = "tenancy.v1.Namespace";

/// A resource's identity within its type: tenancy and name (its uid changes when it is
/// recreated; the row it occupies does not).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ResKey {
    pub partition: String,
    pub namespace: String,
    pub name: String,
}

impl ResKey {
    pub fn of(id: &Id) -> ResKey {
        let tenancy = id.tenancy.clone().unwrap_or_default();
        ResKey {
            partition: tenancy.partition,
            namespace: tenancy.namespace,
            name: id.name.clone(),
        }
    }

    pub fn tenancy(&self) -> Tenancy {
        Tenancy {
            partition: self.partition.clone(),
            namespace: self.namespace.clone(),
        }
    }

    /// `partition/namespace`, `partition` or `-`.
    pub fn tenancy_label(&self) -> String {
        describe::tenancy_label(Some(&self.tenancy()))
    }
}

/// A resource anywhere: its type and its key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResRef {
    pub gvk: String,
    pub key: ResKey,
}

/// What one watch event did to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Created,
    Updated,
    Deleted,
    /// The initial snapshot (or a relist) is complete.
    Synced,
    Nothing,
}

/// What one revision of a type did (see [`TypeData::touched`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Touch {
    /// A resource the type's first listing brought.
    Listed(Arc<ResKey>),
    /// The first listing is complete.
    ListingEnd,
    /// A resource created, changed or deleted after that.
    Changed(Arc<ResKey>),
}

/// At most this many changed keys are kept per type for the table to catch up with (a type
/// changing faster than that between two frames is rebuilt).
pub const TOUCHED_MAX: usize = 16_384;

/// Every resource of one type.
#[derive(Debug, Clone)]
pub struct TypeData {
    pub info: TypeInfo,
    pub gvk: String,
    pub scope: Scope,
    /// Keyed by shared keys: the table's rows hold the same `Arc`s, so a million rows are built
    /// without copying a million names.
    pub resources: HashMap<Arc<ResKey>, Resource>,
    /// The watch delivered its initial snapshot.
    pub synced: bool,
    /// During a relist: the keys the fresh snapshot has delivered so far (the others are
    /// dropped at its end; until then the old rows stay on screen).
    pub relisting: Option<HashSet<ResKey>>,
    /// What each revision after `touched_since` did, so the table follows the rows that changed
    /// instead of rebuilding a million: the first listing's keys as they arrive (the server's
    /// key order), its end, then each change. Once listed, the oldest are dropped past
    /// [`TOUCHED_MAX`] (and `touched_since` moves on); a relist starts it afresh. A table older
    /// than `touched_since` rebuilds.
    pub touched: Vec<Touch>,
    pub touched_since: u64,
    /// Why the watch stopped for good (permission denied…), if it did.
    pub failed: Option<String>,
    /// Bumped on every change, so derived views know when to rebuild.
    pub revision: u64,
}

impl TypeData {
    pub fn new(info: TypeInfo) -> TypeData {
        let resource_type = info.r#type.clone().unwrap_or_default();
        TypeData {
            gvk: gvk(&resource_type),
            scope: Scope::try_from(info.scope).unwrap_or(Scope::Undefined),
            info,
            resources: HashMap::new(),
            synced: false,
            relisting: None,
            touched: Vec::new(),
            touched_since: 0,
            failed: None,
            revision: 0,
        }
    }

    pub fn kind(&self) -> &str {
        self.info
            .r#type
            .as_ref()
            .map(|t| t.kind.as_str())
            .unwrap_or("?")
    }

    /// Applies one event of this type's watch.
    pub fn apply(&mut self, event: WatchEvent) -> Change {
        let listing = !self.synced && self.relisting.is_none();
        let (change, touch) = match event.event {
            Some(Event::Upsert(upsert)) => {
                let Some(resource) = upsert.resource else {
                    return Change::Nothing;
                };
                let Some(id) = resource.id.as_ref() else {
                    return Change::Nothing;
                };
                let key = ResKey::of(id);
                if let Some(seen) = self.relisting.as_mut() {
                    seen.insert(key.clone());
                }
                // An update keeps the stored key (the rows share it); a new key is stored once.
                match self
                    .resources
                    .get_key_value(&key)
                    .map(|(k, _)| Arc::clone(k))
                {
                    Some(stored) => {
                        self.resources.insert(Arc::clone(&stored), resource);
                        (Change::Updated, Some(Touch::Changed(stored)))
                    }
                    None => {
                        let key = Arc::new(key);
                        self.resources.insert(Arc::clone(&key), resource);
                        let touch = if listing {
                            Touch::Listed(key)
                        } else {
                            Touch::Changed(key)
                        };
                        (Change::Created, Some(touch))
                    }
                }
            }
            Some(Event::Delete(delete)) => {
                let Some(id) = delete.resource.as_ref().and_then(|r| r.id.as_ref()) else {
                    return Change::Nothing;
                };
                match self.resources.remove_entry(&ResKey::of(id)) {
                    Some((key, _)) => (Change::Deleted, Some(Touch::Changed(key))),
                    None => return Change::Nothing,
                }
            }
            Some(Event::EndOfSnapshot(_)) => {
                let touch = match self.relisting.take() {
                    Some(seen) => {
                        self.resources.retain(|key, _| seen.contains(key.as_ref()));
                        None
                    }
                    None => listing.then_some(Touch::ListingEnd),
                };
                self.synced = true;
                (Change::Synced, touch)
            }
            Some(Event::Bookmark(_)) | None => return Change::Nothing,
        };
        self.revision += 1;
        match touch {
            Some(touch) if self.relisting.is_none() => {
                self.touched.push(touch);
                if self.synced && self.touched.len() > TOUCHED_MAX {
                    let dropped = self.touched.len() - TOUCHED_MAX / 2;
                    self.touched.drain(..dropped);
                    self.touched_since += dropped as u64;
                }
            }
            _ => self.forget_touched(),
        }
        change
    }

    /// Starts the log of changed keys afresh at the current revision.
    fn forget_touched(&mut self) {
        self.touched = Vec::new();
        self.touched_since = self.revision;
    }

    /// What changed after `revision`, if the log still holds all of it.
    pub fn touched_after(&self, revision: u64) -> Option<&[Touch]> {
        let from = usize::try_from(revision.checked_sub(self.touched_since)?).ok()?;
        self.touched.get(from..)
    }

    /// The server could not resume: a fresh snapshot follows.
    pub fn begin_relist(&mut self) {
        self.relisting = Some(HashSet::new());
        self.revision += 1;
        self.forget_touched();
    }
}

/// Every type the server registers, and what the watches delivered.
#[derive(Debug, Clone, Default)]
pub struct Store {
    /// Sorted by `group.version.kind`.
    pub types: Vec<TypeData>,
    index: HashMap<String, usize>,
}

impl Store {
    pub fn new(mut infos: Vec<TypeInfo>) -> Store {
        infos.sort_by_key(|info| info.r#type.as_ref().map(gvk).unwrap_or_default());
        let types: Vec<TypeData> = infos.into_iter().map(TypeData::new).collect();
        let index = types
            .iter()
            .enumerate()
            .map(|(i, data)| (data.gvk.clone(), i))
            .collect();
        Store { types, index }
    }

    /// Follows a new list of the server's types (DESIGN §15: types registered and deleted while
    /// the dashboard runs): types it lacked are added, empty, and returned (to be watched);
    /// types the server no longer has are dropped with their resources and named in the second
    /// list. The types it kept keep their resources.
    pub fn merge(&mut self, infos: Vec<TypeInfo>) -> (Vec<TypeInfo>, Vec<String>) {
        let listed: HashSet<String> = infos
            .iter()
            .map(|info| info.r#type.as_ref().map(gvk).unwrap_or_default())
            .collect();
        let gone: Vec<String> = self
            .types
            .iter()
            .filter(|data| !listed.contains(&data.gvk))
            .map(|data| data.gvk.clone())
            .collect();
        let added: Vec<TypeInfo> = infos
            .into_iter()
            .filter(|info| {
                self.position(&info.r#type.as_ref().map(gvk).unwrap_or_default())
                    .is_none()
            })
            .collect();
        let mut types = std::mem::take(&mut self.types);
        types.retain(|data| listed.contains(&data.gvk));
        types.extend(added.iter().cloned().map(TypeData::new));
        types.sort_by(|a, b| a.gvk.cmp(&b.gvk));
        self.index = types
            .iter()
            .enumerate()
            .map(|(i, data)| (data.gvk.clone(), i))
            .collect();
        self.types = types;
        (added, gone)
    }

    pub fn position(&self, gvk: &str) -> Option<usize> {
        self.index.get(gvk).copied()
    }

    pub fn get(&self, gvk: &str) -> Option<&TypeData> {
        self.position(gvk).map(|i| &self.types[i])
    }

    pub fn get_mut(&mut self, gvk: &str) -> Option<&mut TypeData> {
        self.position(gvk).map(|i| &mut self.types[i])
    }

    pub fn resource(&self, at: &ResRef) -> Option<&Resource> {
        self.get(&at.gvk)?.resources.get(&at.key)
    }

    /// The resource an id names (by type, tenancy and name; a different uid means the owner
    /// was deleted and recreated, so it is not the same resource).
    pub fn by_id(&self, id: &Id) -> Option<(ResRef, &Resource)> {
        let gvk = gvk(id.r#type.as_ref()?);
        let key = ResKey::of(id);
        let resource = self.get(&gvk)?.resources.get(&key)?;
        let same = id.uid.is_empty()
            || resource.id.as_ref().map(|stored| stored.uid.as_str()) == Some(id.uid.as_str());
        same.then_some((ResRef { gvk, key }, resource))
    }

    /// Resources whose owner is `owner` (matched by uid), every type, sorted.
    pub fn children(&self, owner: &Resource) -> Vec<ResRef> {
        let Some(owner_uid) = owner.id.as_ref().map(|id| id.uid.as_str()) else {
            return Vec::new();
        };
        let mut children: Vec<ResRef> = self
            .types
            .iter()
            .flat_map(|data| {
                data.resources
                    .iter()
                    .filter(|(_, resource)| {
                        resource.owner.as_ref().map(|owner| owner.uid.as_str()) == Some(owner_uid)
                    })
                    .map(|(key, _)| ResRef {
                        gvk: data.gvk.clone(),
                        key: ResKey::clone(key),
                    })
            })
            .collect();
        children.sort();
        children
    }

    /// Every owner uid → its children, built in one pass (for trees over many resources).
    pub fn children_index(&self) -> HashMap<&str, Vec<ResRef>> {
        let mut index: HashMap<&str, Vec<ResRef>> = HashMap::new();
        for data in &self.types {
            for (key, resource) in &data.resources {
                if let Some(owner) = resource.owner.as_ref() {
                    index.entry(owner.uid.as_str()).or_default().push(ResRef {
                        gvk: data.gvk.clone(),
                        key: ResKey::clone(key),
                    });
                }
            }
        }
        for children in index.values_mut() {
            children.sort();
        }
        index
    }

    /// Resource counts per type.
    pub fn counts(&self) -> Vec<(String, usize)> {
        self.types
            .iter()
            .map(|data| (data.gvk.clone(), data.resources.len()))
            .collect()
    }

    /// Every tenancy: the partitions and namespaces that exist, and any other tenancy a
    /// resource is in; sorted (`(partition, "")` for a partition).
    pub fn tenancies(&self) -> Vec<(String, String)> {
        let mut seen: HashSet<(String, String)> = HashSet::new();
        for data in &self.types {
            for key in data.resources.keys() {
                match data.gvk.as_str() {
                    PARTITION => {
                        seen.insert((key.name.clone(), String::new()));
                    }
                    NAMESPACE => {
                        seen.insert((key.partition.clone(), key.name.clone()));
                    }
                    _ if !key.partition.is_empty() => {
                        seen.insert((key.partition.clone(), key.namespace.clone()));
                    }
                    _ => {}
                }
            }
        }
        let mut tenancies: Vec<(String, String)> = seen.into_iter().collect();
        tenancies.sort();
        tenancies
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{end_of_snapshot, info, resource, upsert};
    use proto::resource::v1::watch_event::Delete;

    #[test]
    fn events_create_update_delete_and_sync() {
        let mut data = TypeData::new(info("demo", "v1", "Concept", Scope::Namespace));
        let jazz = resource("demo.v1.Concept", "default/jazz", "modal", 1);
        assert_eq!(data.apply(upsert(jazz.clone())), Change::Created);
        assert_eq!(data.apply(upsert(jazz.clone())), Change::Updated);
        assert!(!data.synced);
        assert_eq!(data.apply(end_of_snapshot("10")), Change::Synced);
        assert!(data.synced);
        let delete = WatchEvent {
            event: Some(Event::Delete(Delete {
                resource: Some(jazz),
            })),
            version: "11".into(),
            actor: String::new(),
        };
        assert_eq!(data.apply(delete.clone()), Change::Deleted);
        assert_eq!(data.apply(delete), Change::Nothing);
        assert!(data.resources.is_empty());
        assert_eq!(data.revision, 4);
    }

    #[test]
    fn a_relist_keeps_old_rows_until_the_fresh_snapshot_ends() {
        let mut data = TypeData::new(info("demo", "v1", "Concept", Scope::Namespace));
        data.apply(upsert(resource("demo.v1.Concept", "default/jazz", "a", 1)));
        data.apply(upsert(resource("demo.v1.Concept", "default/jazz", "b", 1)));
        data.apply(end_of_snapshot("5"));
        data.begin_relist();
        data.apply(upsert(resource("demo.v1.Concept", "default/jazz", "b", 2)));
        // "a" is still shown while the relist is under way…
        assert_eq!(data.resources.len(), 2);
        data.apply(end_of_snapshot("9"));
        // …and gone once the fresh snapshot says it no longer exists.
        let names: Vec<&str> = data.resources.keys().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["b"]);
    }

    #[test]
    fn children_are_found_by_owner_uid_across_types() {
        let mut store = Store::new(vec![
            info("demo", "v2", "Artist", Scope::Namespace),
            info("demo", "v2", "Album", Scope::Namespace),
        ]);
        let artist = resource("demo.v2.Artist", "default/jazz", "miles", 1);
        let mut album = resource("demo.v2.Album", "default/jazz", "kind-of-blue", 1);
        album.owner = artist.id.clone();
        let mut orphan = resource("demo.v2.Album", "default/jazz", "orphan", 1);
        let mut stale_owner = artist.id.clone().unwrap_or_default();
        stale_owner.uid = "01AAAAAAAAAAAAAAAAAAAAAAAA".into();
        orphan.owner = Some(stale_owner);
        for (gvk, resource) in [
            ("demo.v2.Artist", artist.clone()),
            ("demo.v2.Album", album),
            ("demo.v2.Album", orphan),
        ] {
            store
                .get_mut(gvk)
                .map(|data| data.apply(upsert(resource)))
                .expect("type registered");
        }
        let children = store.children(&artist);
        assert_eq!(children.len(), 1);
        assert_eq!(children[0].key.name, "kind-of-blue");
        assert_eq!(
            store.children_index().values().map(Vec::len).sum::<usize>(),
            2
        );
        assert_eq!(
            store.tenancies(),
            vec![("default".to_owned(), "jazz".to_owned())]
        );
    }
}
