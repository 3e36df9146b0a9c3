//! The resource table's state (type, rows, cursor, filter, sort, tenancy) and the detail pane's.

use proto::client::describe;
use proto::resource::v1::Resource;

use super::Cursor;
use crate::model::{ResKey, ResRef, Store};

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
                [
                    key.name.as_str(),
                    &key.tenancy_label(),
                    &resource.version,
                    &condition,
                    &finalizers,
                    &owner,
                ]
                .iter()
                .any(|cell| cell.to_lowercase().contains(text.as_str()))
            }
        }
    }
}

/// The sorted, filtered rows of the current type (rebuilt by [`State::prepare`]).
#[derive(Debug, Clone, Default)]
pub struct Rows {
    pub gvk: String,
    pub keys: Vec<ResKey>,
    /// What the rows were built from; a different stamp means rebuild.
    stamp: (u64, String, SortKey, bool, TenancyFilter),
    /// While the type's first listing arrives: how many of its arrivals the rows hold (new
    /// ones are appended, filtered, unsorted and in arrival order whatever the sort; the
    /// listing's end sorts them once).
    appended: Option<usize>,
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

    /// Rebuilds the rows when the data, filter, sort or tenancy changed; keeps the selection
    /// on the same resource.
    pub(super) fn prepare(&mut self, store: &Store, page: usize) {
        let Some(gvk) = self.current_type.clone() else {
            self.rows = Rows::default();
            return;
        };
        let Some(data) = store.get(&gvk) else {
            self.rows = Rows::default();
            return;
        };
        let stamp = (
            data.revision,
            self.filter.clone(),
            self.sort,
            self.descending,
            self.tenancy.clone(),
        );
        // While the listing arrives, with nothing but the data changed: append what arrived (a
        // million resources come in hundreds of batches; filtering and sorting them all after
        // each would leave no time to draw or read keys). The listing's end sorts once.
        let same_view = self.rows.gvk == gvk
            && (
                &self.rows.stamp.1,
                self.rows.stamp.2,
                self.rows.stamp.3,
                &self.rows.stamp.4,
            ) == (&stamp.1, stamp.2, stamp.3, &stamp.4);
        let appending = match self.rows.appended {
            Some(appended)
                if same_view
                    && !data.synced
                    && data.relisting.is_none()
                    && appended <= data.arrivals.len() =>
            {
                Some(appended)
            }
            _ => None,
        };
        let filter = RowFilter::of(&self.filter);
        let keeps = |key: &ResKey, resource: &Resource| {
            self.tenancy.matches(key) && filter.keeps(key, resource)
        };
        if let Some(appended) = appending {
            if self.rows.stamp.0 != stamp.0 {
                let arrived = data.arrivals[appended..].iter().filter(|key| {
                    data.resources
                        .get(*key)
                        .is_some_and(|resource| keeps(key, resource))
                });
                self.rows.keys.extend(arrived.cloned());
                self.rows.appended = Some(data.arrivals.len());
                self.rows.stamp = stamp;
            }
        } else if self.rows.gvk != gvk || self.rows.stamp != stamp {
            let mut keys: Vec<&ResKey> = data
                .resources
                .iter()
                .filter(|(key, resource)| keeps(key, resource))
                .map(|(key, _)| key)
                .collect();
            sort_keys(&mut keys, &data.resources, self.sort);
            if self.descending {
                keys.reverse();
            }
            let listing = !data.synced && data.relisting.is_none();
            self.rows = Rows {
                gvk: gvk.clone(),
                keys: keys.into_iter().cloned().collect(),
                stamp,
                appended: listing.then_some(data.arrivals.len()),
            };
        }
        // Keep the selection on the same resource; if it went away, on the same row.
        let len = self.rows.keys.len();
        if let Some(selected) = &self.selected
            && let Some(at) = self.rows.keys.iter().position(|key| key == selected)
        {
            self.cursor.selected = at;
        }
        self.cursor.clamp(len, page);
        self.selected = self.rows.keys.get(self.cursor.selected).cloned();
    }
}

/// A resource's detail.
#[derive(Debug, Clone, Default)]
pub struct DetailScreen {
    /// The resource Detail shows.
    pub at: Option<ResRef>,
    pub scroll: u16,
}

fn sort_keys(
    keys: &mut [&ResKey],
    resources: &std::collections::HashMap<ResKey, Resource>,
    by: SortKey,
) {
    // Versions are raft indexes, `index` or `index.n` for writes batched into one entry.
    let version = |key: &ResKey| {
        let version = resources.get(key).map_or("", |r| r.version.as_str());
        let (index, within) = version.split_once('.').unwrap_or((version, "0"));
        (
            index.parse::<u64>().unwrap_or(0),
            within.parse::<u64>().unwrap_or(0),
        )
    };
    let uid = |key: &ResKey| {
        resources
            .get(key)
            .and_then(|r| r.id.as_ref())
            .map(|id| id.uid.clone())
            .unwrap_or_default()
    };
    let worst = |key: &ResKey| {
        resources
            .get(key)
            .and_then(describe::worst_condition)
            .map(|condition| describe::severity(condition.state))
            .unwrap_or(0)
    };
    match by {
        SortKey::Name => keys.sort_unstable_by(|a, b| a.name.cmp(&b.name).then(a.cmp(b))),
        SortKey::Tenancy => keys.sort_unstable(),
        SortKey::Version => keys.sort_by_cached_key(|key| (version(key), (*key).clone())),
        // Newest first: a ULID sorts by creation time.
        SortKey::Age => {
            keys.sort_by_cached_key(|key| (std::cmp::Reverse(uid(key)), (*key).clone()))
        }
        // Worst first.
        SortKey::Condition => {
            keys.sort_by_cached_key(|key| (std::cmp::Reverse(worst(key)), (*key).clone()))
        }
    }
}
