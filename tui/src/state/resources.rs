//! The resource table's state (type, rows, cursor, filter, sort, tenancy) and the detail pane's.

use std::cmp::{Ordering, Reverse};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use proto::client::describe;
use proto::resource::v1::Resource;

use super::Cursor;
use crate::model::{ResKey, ResRef, Store, Touch, TypeData};

/// The resource table's sort column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortKey {
    #[default]
    Name,
    Tenancy,
    Version,
    Age,
    Condition,
}

impl SortKey {
    pub const ALL: [SortKey; 5] = [
        SortKey::Name,
        SortKey::Tenancy,
        SortKey::Version,
        SortKey::Age,
        SortKey::Condition,
    ];

    pub fn label(self) -> &'static str {
        match self {
            SortKey::Name => "name",
            SortKey::Tenancy => "tenancy",
            SortKey::Version => "version",
            SortKey::Age => "age",
            SortKey::Condition => "condition",
        }
    }

    pub fn next(self) -> SortKey {
        let at = SortKey::ALL.iter().position(|k| *k == self).unwrap_or(0);
        SortKey::ALL[(at + 1) % SortKey::ALL.len()]
    }
}

/// Which tenancies the resource table shows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TenancyFilter {
    #[default]
    All,
    Partition(String),
    Namespace {
        partition: String,
        namespace: String,
    },
}

impl TenancyFilter {
    pub fn label(&self) -> String {
        match self {
            TenancyFilter::All => "all tenancies".into(),
            TenancyFilter::Partition(partition) => format!("partition {partition}"),
            TenancyFilter::Namespace {
                partition,
                namespace,
            } => format!("{partition}/{namespace}"),
        }
    }

    /// Cluster-scoped resources show under every filter (they belong to no tenancy).
    pub fn matches(&self, key: &ResKey) -> bool {
        match self {
            TenancyFilter::All => true,
            _ if key.partition.is_empty() => true,
            TenancyFilter::Partition(partition) => &key.partition == partition,
            TenancyFilter::Namespace {
                partition,
                namespace,
            } => {
                &key.partition == partition
                    && (key.namespace.is_empty() || &key.namespace == namespace)
            }
        }
    }
}

/// What the `/` filter keeps: with an operator (`=`, `!=`, `!`, `in`, `notin`) it is a selector
/// over metadata, as `resctl get -l` takes; otherwise text found in any column (name, tenancy,
/// version, condition, finalizers, owner), in any case.
#[derive(Debug, Clone)]
pub(crate) enum RowFilter {
    All,
    Text(String),
    Selector(proto::selector::Selector),
    /// A selector that does not parse: nothing matches, and the table says why.
    Invalid(String),
}

impl RowFilter {
    pub(crate) fn of(text: &str) -> RowFilter {
        let text = text.trim();
        if text.is_empty() {
            return RowFilter::All;
        }
        let words: Vec<&str> = text
            .split(|c: char| c.is_whitespace() || c == '(')
            .collect();
        let is_selector = text.contains('=')
            || text.starts_with('!')
            || text.contains(",!")
            || words.iter().any(|word| *word == "in" || *word == "notin");
        if !is_selector {
            return RowFilter::Text(text.to_lowercase());
        }
        match proto::selector::Selector::parse(text) {
            Ok(selector) => RowFilter::Selector(selector),
            Err(error) => RowFilter::Invalid(error.to_string()),
        }
    }

    pub(crate) fn keeps(&self, key: &ResKey, resource: &Resource) -> bool {
        match self {
            RowFilter::All => true,
            RowFilter::Selector(selector) => selector.matches(&resource.metadata),
            RowFilter::Invalid(_) => false,
            RowFilter::Text(text) => {
                // The cheap columns first, without copying them.
                if contains_folded(&key.name, text)
                    || contains_folded(&resource.version, text)
                    || contains_folded(&key.tenancy_label(), text)
                {
                    return true;
                }
                let condition = describe::worst_condition(resource)
                    .map(describe::condition_label)
                    .unwrap_or_default();
                let owner = resource
                    .owner
                    .as_ref()
                    .map(describe::short_label)
                    .unwrap_or_default();
                let finalizers = proto::meta::finalizers(resource)
                    .into_iter()
                    .collect::<Vec<_>>()
                    .join(",");
                [condition, finalizers, owner]
                    .iter()
                    .any(|cell| contains_folded(cell, text))
            }
        }
    }
}

/// The sorted, filtered rows of the current type (kept by [`State::prepare`]).
#[derive(Debug, Clone, Default)]
pub struct Rows {
    pub gvk: String,
    /// The same keys the store holds (shared, not copied).
    pub keys: Vec<Arc<ResKey>>,
    /// The data's revision and the view the rows were built for.
    revision: u64,
    view: View,
    /// Whether the rows are the type's first listing, appended as it arrives in the server's
    /// key order (`in_order`: whether that is still the table's order; if not, the listing's
    /// end sorts once).
    listing: bool,
    in_order: bool,
}

/// What the table shows of its type: filter, sort and tenancy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct View {
    filter: String,
    sort: SortKey,
    descending: bool,
    tenancy: TenancyFilter,
}

/// The resource table of one type.
#[derive(Debug, Clone, Default)]
pub struct ResourcesScreen {
    /// The type the table shows.
    pub current_type: Option<String>,
    pub rows: Rows,
    pub cursor: Cursor,
    /// The selected resource, kept by key across updates.
    pub selected: Option<ResKey>,
    pub filter: String,
    pub sort: SortKey,
    pub descending: bool,
    pub tenancy: TenancyFilter,
}

impl ResourcesScreen {
    /// Why the filter keeps nothing, when it is a selector that does not parse.
    pub fn filter_problem(&self) -> Option<String> {
        match RowFilter::of(&self.filter) {
            RowFilter::Invalid(why) => Some(why),
            _ => None,
        }
    }

    /// The selected resource.
    pub fn focused(&self) -> Option<ResRef> {
        Some(ResRef {
            gvk: self.current_type.clone()?,
            key: self.selected.clone()?,
        })
    }

    /// Selects the resource on the cursor's row.
    pub fn select_at_cursor(&mut self) {
        self.selected = self
            .rows
            .keys
            .get(self.cursor.selected)
            .map(|key| ResKey::clone(key));
    }

    fn view(&self) -> View {
        View {
            filter: self.filter.clone(),
            sort: self.sort,
            descending: self.descending,
            tenancy: self.tenancy.clone(),
        }
    }

    /// Brings the rows up to date with the data, filter, sort and tenancy, doing as little as
    /// the change needs (a million rows are rebuilt only when nothing smaller will do); keeps
    /// the selection on the same resource.
    pub(super) fn prepare(&mut self, store: &Store, page: usize) {
        let Some(gvk) = self.current_type.clone() else {
            self.rows = Rows::default();
            return;
        };
        let Some(data) = store.get(&gvk) else {
            self.rows = Rows::default();
            return;
        };
        let view = self.view();
        let same_type = self.rows.gvk == gvk;
        if same_type && self.rows.view == view && self.rows.revision == data.revision {
            self.cursor.clamp(self.rows.keys.len(), page);
            return;
        }
        let filter = RowFilter::of(&view.filter);
        let keeps = |key: &ResKey, resource: &Resource| {
            view.tenancy.matches(key) && filter.keeps(key, resource)
        };
        let order = Order {
            by: view.sort,
            descending: view.descending,
            resources: &data.resources,
        };
        let rows = &mut self.rows;
        if same_type && rows.view == view && data.relisting.is_some() {
            // A relist keeps the old rows on screen until its end (then they are rebuilt).
        } else if same_type
            && rows.view == view
            && data
                .touched_after(rows.revision)
                .is_some_and(|touches| rows.follow(touches, data, &order, &keeps))
        {
            rows.revision = data.revision;
        } else if same_type
            && rows.revision == data.revision
            && !rows.listing
            && (&rows.view.filter, &rows.view.tenancy) == (&view.filter, &view.tenancy)
            && (rows.view.sort == view.sort || order.by_key_alone())
        {
            // Only the order changed: the rows are the same.
            if rows.view.sort == view.sort {
                rows.keys.reverse();
            } else {
                order.sort(&mut rows.keys);
            }
            rows.view = view;
        } else if same_type
            && rows.revision == data.revision
            && (rows.view.sort, rows.view.descending, &rows.view.tenancy)
                == (view.sort, view.descending, &view.tenancy)
            && RowFilter::of(&rows.view.filter).narrows_to(&filter)
        {
            // A longer filter keeps some of what the shorter one kept, in the same order.
            // (The tenancy is the rows' already.)
            rows.keys.retain(|key| {
                filter.keeps_by_key(key).unwrap_or_else(|| {
                    data.resources
                        .get(key.as_ref())
                        .is_some_and(|resource| filter.keeps(key, resource))
                })
            });
            rows.view = view;
        } else {
            let ranked = data
                .resources
                .iter()
                .filter(|(key, resource)| keeps(key, resource))
                .map(|(key, resource)| (order.rank_of(key, Some(resource)), Arc::clone(key)))
                .collect();
            let keys = order.sorted(ranked);
            *rows = Rows {
                gvk: gvk.clone(),
                keys,
                revision: data.revision,
                view,
                listing: !data.synced && data.relisting.is_none(),
                in_order: true,
            };
        }
        // Keep the selection on the same resource; if it went away, on the same row.
        if let Some(selected) = &self.selected
            && let Some(at) = self.rows.position(selected, &order)
        {
            self.cursor.selected = at;
        }
        self.cursor.clamp(self.rows.keys.len(), page);
        self.select_at_cursor();
    }
}

impl Rows {
    /// Follows what the data did since the rows' revision: appends what the first listing
    /// brings, sorts once at its end if it came in another order, and moves each row that
    /// changed after it. `false` if the rows cannot follow (a change during the listing): they
    /// are then rebuilt.
    fn follow(
        &mut self,
        touches: &[Touch],
        data: &TypeData,
        order: &Order<'_>,
        keeps: &impl Fn(&ResKey, &Resource) -> bool,
    ) -> bool {
        let kept = |key: &Arc<ResKey>| {
            data.resources
                .get(key.as_ref())
                .is_some_and(|resource| keeps(key, resource))
        };
        let mut changed: Vec<&Arc<ResKey>> = Vec::new();
        for touch in touches {
            match touch {
                Touch::Listed(key) if self.listing => {
                    if kept(key) {
                        if self.in_order
                            && self
                                .keys
                                .last()
                                .is_some_and(|last| order.cmp(last, key).is_gt())
                        {
                            self.in_order = false;
                        }
                        self.keys.push(Arc::clone(key));
                    }
                }
                Touch::ListingEnd if self.listing => {
                    if !self.in_order {
                        order.sort(&mut self.keys);
                    }
                    self.listing = false;
                    self.in_order = true;
                }
                Touch::Changed(key) if !self.listing => changed.push(key),
                _ => return false,
            }
        }
        if changed.is_empty() {
            return true;
        }
        // Out with every changed row (it may sort elsewhere now, be filtered out or be gone)…
        if order.by_key_alone() && changed.len() <= 1_024 {
            let mut at: Vec<usize> = changed
                .iter()
                .filter_map(|key| self.keys.binary_search_by(|row| order.cmp(row, key)).ok())
                .collect();
            at.sort_unstable();
            at.dedup();
            for index in at.into_iter().rev() {
                self.keys.remove(index);
            }
        } else {
            // The rows hold the store's own keys, and the log names the very key a row holds
            // (an update keeps it; a deletion logs it): comparing addresses reads no key.
            let gone: HashSet<*const ResKey> = changed.iter().map(|key| Arc::as_ptr(key)).collect();
            self.keys.retain(|row| !gone.contains(&Arc::as_ptr(row)));
        }
        // …and in again where it belongs, if it is still there and kept (once, though a key
        // deleted and created again was logged twice).
        let mut once = HashSet::new();
        let mut fresh: Vec<Arc<ResKey>> = changed
            .into_iter()
            .filter_map(|key| data.resources.get_key_value(key.as_ref()))
            .filter(|(key, resource)| keeps(key, resource) && once.insert(Arc::as_ptr(key)))
            .map(|(key, _)| Arc::clone(key))
            .collect();
        if fresh.is_empty() {
            return true;
        }
        order.sort(&mut fresh);
        let mut rest = std::mem::take(&mut self.keys).into_iter();
        let mut merged = Vec::with_capacity(rest.len() + fresh.len());
        for key in fresh {
            let before = rest
                .as_slice()
                .partition_point(|row| order.cmp(row, &key).is_lt());
            merged.extend(rest.by_ref().take(before));
            merged.push(key);
        }
        merged.extend(rest);
        self.keys = merged;
        true
    }

    /// Where `key` is in the rows, if it is.
    fn position(&self, key: &ResKey, order: &Order<'_>) -> Option<usize> {
        if self.listing && !self.in_order {
            return self.keys.iter().position(|row| row.as_ref() == key);
        }
        let at = self.keys.partition_point(|row| order.cmp(row, key).is_lt());
        (self.keys.get(at).map(AsRef::as_ref) == Some(key)).then_some(at)
    }
}

impl RowFilter {
    /// Whether the filter keeps `key`'s row, if its key alone tells (a text found in the name).
    fn keeps_by_key(&self, key: &ResKey) -> Option<bool> {
        match self {
            RowFilter::All => Some(true),
            RowFilter::Invalid(_) => Some(false),
            RowFilter::Text(text) if contains_folded(&key.name, text) => Some(true),
            RowFilter::Text(_) | RowFilter::Selector(_) => None,
        }
    }

    /// Whether everything `narrower` keeps, `self` keeps too (typing more of a text filter).
    fn narrows_to(&self, narrower: &RowFilter) -> bool {
        match (self, narrower) {
            (RowFilter::All, _) => true,
            (RowFilter::Text(wide), RowFilter::Text(narrow)) => narrow.contains(wide.as_str()),
            _ => false,
        }
    }
}

/// A resource's detail.
#[derive(Debug, Clone, Default)]
pub struct DetailScreen {
    /// The resource Detail shows.
    pub at: Option<ResRef>,
    pub scroll: u16,
    /// `v`: its history beside it (DESIGN §18), read when opened.
    pub history: Option<HistoryPane>,
}

/// The detail screen's history pane: the versions kept, the one selected (its changes shown),
/// or with `b` the blame of every field.
#[derive(Debug, Clone, Default)]
pub struct HistoryPane {
    /// Newest first; `None` while it is read.
    pub entries: Option<Result<Vec<proto::resource::v1::HistoryEntry>, String>>,
    /// The version selected (an index into `entries`).
    pub selected: usize,
    /// Blame instead of the selected version's changes.
    pub blame: bool,
}

/// A string's first 16 bytes as a number that sorts as the string does (shorter strings are
/// padded with zeros, which no name holds).
fn prefix(text: &str) -> u128 {
    let mut bytes = [0u8; 16];
    let len = text.len().min(16);
    bytes[..len].copy_from_slice(&text.as_bytes()[..len]);
    u128::from_be_bytes(bytes)
}

/// Whether `haystack` contains `needle` (already lower case), in any case.
fn contains_folded(haystack: &str, needle: &str) -> bool {
    if needle.is_empty() {
        return true;
    }
    if haystack.is_ascii() && needle.is_ascii() {
        return haystack
            .as_bytes()
            .windows(needle.len())
            .any(|window| window.eq_ignore_ascii_case(needle.as_bytes()));
    }
    haystack.to_lowercase().contains(needle)
}

/// The table's order: the sort column's value, then the key (partition, namespace, name) so
/// that no two rows tie; reversed when descending.
struct Order<'a> {
    by: SortKey,
    descending: bool,
    resources: &'a HashMap<Arc<ResKey>, Resource>,
}

/// What a row sorts by before its key: its column's value, then the start of its key (the key
/// itself only where both are equal), so that most comparisons read no string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Rank<'a> {
    /// The name's first 16 bytes (the rest, and ties, by the name itself).
    Name(u128),
    Tenancy(KeyStart),
    /// Versions are raft indexes, `index` or `index.n` for writes batched into one entry.
    Version(u64, u64, KeyStart),
    /// Newest first: a ULID sorts by creation time (its first 16 characters, then all).
    Age(Reverse<u128>, Reverse<&'a str>, KeyStart),
    /// Worst first.
    Condition(Reverse<u8>, KeyStart),
}

/// The first 32 bytes of `partition NUL namespace NUL name`: in the key's order wherever two
/// differ (no name holds a NUL).
type KeyStart = [u128; 2];

fn key_start(key: &ResKey) -> KeyStart {
    let mut bytes = [0u8; 32];
    let parts: [&[u8]; 5] = [
        key.partition.as_bytes(),
        b"\0",
        key.namespace.as_bytes(),
        b"\0",
        key.name.as_bytes(),
    ];
    let mut at = 0;
    for part in parts {
        let take = part.len().min(32 - at);
        bytes[at..at + take].copy_from_slice(&part[..take]);
        at += take;
    }
    let (high, low) = bytes.split_at(16);
    [
        u128::from_be_bytes(high.try_into().unwrap_or_default()),
        u128::from_be_bytes(low.try_into().unwrap_or_default()),
    ]
}

impl<'a> Order<'a> {
    /// Whether a row's place depends on its key alone (not on what changes with its data).
    fn by_key_alone(&self) -> bool {
        matches!(self.by, SortKey::Name | SortKey::Tenancy)
    }

    fn rank(&self, key: &ResKey) -> Rank<'a> {
        if self.by_key_alone() {
            return self.rank_of(key, None);
        }
        self.rank_of(key, self.resources.get(key))
    }

    /// `key`'s rank, `resource` being what it names (looked up by [`Order::rank`]; a rebuild
    /// walking the store has it at hand).
    fn rank_of(&self, key: &ResKey, resource: Option<&'a Resource>) -> Rank<'a> {
        match self.by {
            SortKey::Name => Rank::Name(prefix(&key.name)),
            SortKey::Tenancy => Rank::Tenancy(key_start(key)),
            SortKey::Version => {
                let version = resource.map_or("", |r| r.version.as_str());
                let (index, within) = version.split_once('.').unwrap_or((version, "0"));
                Rank::Version(
                    index.parse().unwrap_or(0),
                    within.parse().unwrap_or(0),
                    key_start(key),
                )
            }
            SortKey::Age => {
                let uid = resource
                    .and_then(|r| r.id.as_ref())
                    .map_or("", |id| id.uid.as_str());
                Rank::Age(Reverse(prefix(uid)), Reverse(uid), key_start(key))
            }
            SortKey::Condition => Rank::Condition(
                Reverse(
                    resource
                        .and_then(describe::worst_condition)
                        .map_or(0, |condition| describe::severity(condition.state)),
                ),
                key_start(key),
            ),
        }
    }

    fn ranked(
        &self,
        (rank_a, a): (Rank<'_>, &ResKey),
        (rank_b, b): (Rank<'_>, &ResKey),
    ) -> Ordering {
        let ordering = rank_a.cmp(&rank_b).then_with(|| match self.by {
            SortKey::Name => a.name.cmp(&b.name).then_with(|| a.cmp(b)),
            _ => a.cmp(b),
        });
        if self.descending {
            ordering.reverse()
        } else {
            ordering
        }
    }

    fn cmp(&self, a: &ResKey, b: &ResKey) -> Ordering {
        self.ranked((self.rank(a), a), (self.rank(b), b))
    }

    /// Sorts `keys` into the table's order, each row's rank found once.
    fn sort(&self, keys: &mut Vec<Arc<ResKey>>) {
        let ranked: Vec<(Rank<'a>, Arc<ResKey>)> =
            keys.drain(..).map(|key| (self.rank(&key), key)).collect();
        *keys = self.sorted(ranked);
    }

    fn sorted(&self, mut ranked: Vec<(Rank<'a>, Arc<ResKey>)>) -> Vec<Arc<ResKey>> {
        ranked.sort_unstable_by(|a, b| self.ranked((a.0, &a.1), (b.0, &b.1)));
        ranked.into_iter().map(|(_, key)| key).collect()
    }
}

#[cfg(test)]
mod tests;
