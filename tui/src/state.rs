//! Everything the dashboard shows, as plain data. [`crate::update`] changes it in response to
//! messages; [`State::prepare`] rebuilds what is derived from it (the sorted, filtered rows;
//! the owner tree) once before each frame; [`crate::view`] draws it and changes nothing.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use proto::client::describe;
use proto::client::edit::{EditSession, Problem};
use proto::client::placement::PlacementMap;
use proto::cluster::v1::{MembersResponse, SnapshotHeader, StatusResponse};
use proto::codec::Codec;
use proto::resource::v1::{Id, Resource};

use crate::model::{ResKey, ResRef, Store};

/// Most lines the event tail keeps.
pub const EVENT_TAIL: usize = 1_000;

/// The top-level screens, in tab order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Screen {
    Types,
    Resources,
    Detail,
    Tree,
    Cluster,
    Controllers,
    Events,
    Snapshot,
}

impl Screen {
    /// The screens with a tab (Detail and Tree are reached from a resource).
    pub const TABS: [Screen; 6] = [
        Screen::Types,
        Screen::Resources,
        Screen::Cluster,
        Screen::Controllers,
        Screen::Events,
        Screen::Snapshot,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Screen::Types => "Types",
            Screen::Resources => "Resources",
            Screen::Detail => "Detail",
            Screen::Tree => "Owner tree",
            Screen::Cluster => "Cluster",
            Screen::Controllers => "Controllers",
            Screen::Events => "Events",
            Screen::Snapshot => "Snapshot",
        }
    }

    /// The tab a screen belongs to (Detail and Tree sit under Resources).
    pub fn tab(self) -> Screen {
        match self {
            Screen::Detail | Screen::Tree => Screen::Resources,
            screen => screen,
        }
    }
}

/// How the dashboard's link to the server is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    Connecting,
    Live,
    /// The last data stays on screen; the watches and the poller retry.
    Disconnected {
        error: String,
    },
}

/// What the dashboard knows about the cluster (refreshed in the background).
#[derive(Debug, Clone, Default)]
pub struct ClusterInfo {
    /// The node the dashboard talks to.
    pub status: Option<StatusResponse>,
    pub members: Option<MembersResponse>,
    /// Each member's own status (commit and applied index), or why it could not be asked.
    pub nodes: BTreeMap<u64, Result<StatusResponse, String>>,
    pub placement: Option<PlacementMap>,
    /// Why the last refresh of the controllers failed, if it did.
    pub placement_error: Option<String>,
    /// What the token cannot see of the cluster (its status was refused), if anything.
    pub denied: Option<String>,
    /// Who the dashboard acts as: `Some(accessor)` with ACLs on.
    pub identity: Option<String>,
}

/// A scrolled list: the selected row and the first row shown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cursor {
    pub selected: usize,
    pub offset: usize,
}

impl Cursor {
    /// Keeps the selection inside `len` rows and visible in a window of `height` rows.
    pub fn clamp(&mut self, len: usize, height: usize) {
        self.selected = self.selected.min(len.saturating_sub(1));
        let height = height.max(1);
        if self.selected < self.offset {
            self.offset = self.selected;
        } else if self.selected >= self.offset + height {
            self.offset = self.selected + 1 - height;
        }
        self.offset = self.offset.min(len.saturating_sub(height));
    }

    pub fn moved(self, delta: isize, len: usize) -> Cursor {
        let last = len.saturating_sub(1) as isize;
        let selected = (self.selected as isize + delta).clamp(0, last.max(0)) as usize;
        Cursor { selected, ..self }
    }
}

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

/// The sorted, filtered rows of the current type (rebuilt by [`State::prepare`]).
#[derive(Debug, Clone, Default)]
pub struct Rows {
    pub gvk: String,
    pub keys: Vec<ResKey>,
    /// What the rows were built from; a different stamp means rebuild.
    stamp: (u64, String, SortKey, bool, TenancyFilter),
}

/// One line of the owner tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeLine {
    /// Box-drawing indentation (`│ ├─ `).
    pub prefix: String,
    pub at: ResRef,
    /// Whether this is the resource the tree was opened on.
    pub focus: bool,
}

/// What is typed on the bottom line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputKind {
    /// `:` — a type to jump to, or a screen name.
    Command,
    /// `/` — narrows the resource table as you type.
    Filter,
    /// The snapshot file to save to or open.
    SnapshotPath(SnapshotPurpose),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotPurpose {
    Save,
    Open,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    pub kind: InputKind,
    pub text: String,
}

/// A choice in a confirmation dialog; every dialog starts on `Cancel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Choice {
    #[default]
    Cancel,
    Confirm,
}

impl Choice {
    pub fn toggled(self) -> Choice {
        match self {
            Choice::Cancel => Choice::Confirm,
            Choice::Confirm => Choice::Cancel,
        }
    }
}

/// What a delete would run into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletePlan {
    pub at: ResRef,
    pub id: Id,
    pub version: String,
    pub label: String,
    pub finalizers: Vec<String>,
    /// `Kind/name` of each direct child (deleted with it, after their own finalizers).
    pub children: Vec<String>,
    /// The controllers that release its finalizers, where they run.
    pub controllers: Vec<String>,
    /// Finalizers no controller releases.
    pub unowned: Vec<String>,
    pub choice: Choice,
}

/// An overlay on top of the screen; it takes the keys while open.
#[derive(Debug, Clone)]
pub enum Dialog {
    Help {
        scroll: u16,
    },
    ConfirmDelete(Box<DeletePlan>),
    /// Hand leadership to `node` (at `api_addr`)?
    ConfirmTransfer {
        node: u64,
        api_addr: String,
        choice: Choice,
    },
    /// Why a resource marked for deletion is still there (recomputed live from the store).
    WhyStuck {
        at: ResRef,
    },
    /// An edit round that did not save: `e` edits again, `esc` gives up.
    EditProblem {
        session: Box<EditSession>,
        problem: Problem,
    },
    Message {
        title: String,
        text: String,
    },
}

/// A line of the event tail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventLine {
    pub at: SystemTime,
    pub kind: EventKind,
    pub text: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Created,
    Updated,
    Deleted,
    /// Connection changes, relists, failures.
    Notice,
}

impl EventKind {
    pub fn label(self) -> &'static str {
        match self {
            EventKind::Created => "CREATE",
            EventKind::Updated => "UPDATE",
            EventKind::Deleted => "DELETE",
            EventKind::Notice => "NOTICE",
        }
    }
}

/// What a snapshot file holds.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotInfo {
    pub path: PathBuf,
    pub bytes: u64,
    pub header: SnapshotHeader,
}

impl SnapshotInfo {
    /// Resources per `group.version.kind`, sorted.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.header
            .counts
            .iter()
            .map(|(gvk, count)| (gvk.clone(), *count))
            .collect()
    }
}

/// One type after a restore: what the snapshot held and what the cluster now lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyRow {
    pub gvk: String,
    pub expected: u64,
    pub actual: u64,
}

/// The snapshot stepper: save → inspect → confirm → restore → verify. Every step says what
/// it waits for, and `esc` leaves it (cancelling a save or restore under way).
#[derive(Debug, Clone, PartialEq)]
pub enum SnapshotStep {
    /// Nothing under way: `s` saves a new snapshot, `o` opens a file.
    Start,
    Saving {
        path: PathBuf,
        written: u64,
        total: Option<u64>,
    },
    Opening {
        path: PathBuf,
    },
    Inspect(Box<SnapshotInfo>),
    Confirm {
        info: Box<SnapshotInfo>,
        choice: Choice,
    },
    Restoring {
        info: Box<SnapshotInfo>,
        sent: u64,
        total: u64,
    },
    Verifying {
        info: Box<SnapshotInfo>,
        restored_index: u64,
    },
    Verified {
        info: Box<SnapshotInfo>,
        restored_index: u64,
        rows: Vec<VerifyRow>,
    },
    Failed {
        what: String,
        error: String,
        info: Option<Box<SnapshotInfo>>,
    },
}

/// A line for the footer, replaced by the next one and cleared after a few seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flash {
    pub text: String,
    pub error: bool,
    pub at: SystemTime,
}

/// The whole dashboard.
#[derive(Debug, Clone)]
pub struct State {
    /// The server the dashboard was pointed at.
    pub server: String,
    pub link: Link,
    pub cluster: ClusterInfo,
    pub codec: Option<Arc<Codec>>,
    /// Why the type registry could not be read, if it could not.
    pub types_error: Option<String>,
    pub store: Store,

    pub screen: Screen,
    /// Where `esc` goes back to from Detail and Tree.
    pub back: Vec<Screen>,
    pub types_cursor: Cursor,
    /// The type the resource table shows.
    pub current_type: Option<String>,
    pub rows: Rows,
    pub resource_cursor: Cursor,
    /// The selected resource, kept by key across updates.
    pub selected: Option<ResKey>,
    pub filter: String,
    pub sort: SortKey,
    pub descending: bool,
    pub tenancy: TenancyFilter,
    /// The resource Detail shows.
    pub detail: Option<ResRef>,
    pub detail_scroll: u16,
    /// The resource the owner tree was opened on, and its lines.
    pub tree_focus: Option<ResRef>,
    pub tree: Vec<TreeLine>,
    tree_stamp: Vec<u64>,
    pub tree_cursor: Cursor,
    pub cluster_cursor: Cursor,
    pub controllers_cursor: Cursor,
    pub events: VecDeque<EventLine>,
    /// Lines back from the newest (0 follows the tail).
    pub events_scroll: usize,
    pub snapshot: SnapshotStep,

    pub input: Option<Input>,
    pub dialog: Option<Dialog>,
    pub flash: Option<Flash>,
    /// The clock the views read (ages); advanced by ticks, fixed in tests.
    pub now: SystemTime,
    /// Rows the body can show (the last frame's size), for paging and scrolling.
    pub page: usize,
    /// `:` commands to run once the type registry is known (from the command line).
    pub start: Vec<String>,
    pub quit: bool,
}

impl State {
    pub fn new(server: impl Into<String>, now: SystemTime) -> State {
        State {
            server: server.into(),
            link: Link::Connecting,
            cluster: ClusterInfo::default(),
            codec: None,
            types_error: None,
            store: Store::default(),
            screen: Screen::Types,
            back: Vec::new(),
            types_cursor: Cursor::default(),
            current_type: None,
            rows: Rows::default(),
            resource_cursor: Cursor::default(),
            selected: None,
            filter: String::new(),
            sort: SortKey::Name,
            descending: false,
            tenancy: TenancyFilter::All,
            detail: None,
            detail_scroll: 0,
            tree_focus: None,
            tree: Vec::new(),
            tree_stamp: Vec::new(),
            tree_cursor: Cursor::default(),
            cluster_cursor: Cursor::default(),
            controllers_cursor: Cursor::default(),
            events: VecDeque::new(),
            events_scroll: 0,
            snapshot: SnapshotStep::Start,
            input: None,
            dialog: None,
            flash: None,
            now,
            page: 20,
            start: Vec::new(),
            quit: false,
        }
    }

    /// The resource under the cursor on the current screen (table row, detail, tree line).
    pub fn focused(&self) -> Option<ResRef> {
        match self.screen {
            Screen::Resources => Some(ResRef {
                gvk: self.current_type.clone()?,
                key: self.selected.clone()?,
            }),
            Screen::Detail => self.detail.clone(),
            Screen::Tree => self
                .tree
                .get(self.tree_cursor.selected)
                .map(|line| line.at.clone()),
            _ => None,
        }
    }

    pub fn focused_resource(&self) -> Option<(ResRef, &Resource)> {
        let at = self.focused()?;
        let resource = self.store.resource(&at)?;
        Some((at, resource))
    }

    pub fn flash(&mut self, text: impl Into<String>) {
        self.flash = Some(Flash {
            text: text.into(),
            error: false,
            at: self.now,
        });
    }

    pub fn flash_error(&mut self, text: impl Into<String>) {
        self.flash = Some(Flash {
            text: text.into(),
            error: true,
            at: self.now,
        });
    }

    pub fn push_event(&mut self, kind: EventKind, text: String) {
        if self.events.len() == EVENT_TAIL {
            self.events.pop_front();
        }
        self.events.push_back(EventLine {
            at: self.now,
            kind,
            text,
        });
        if self.events_scroll > 0 {
            // Keep the lines under the reader's eyes still while new ones arrive.
            self.events_scroll = (self.events_scroll + 1).min(self.events.len());
        }
    }

    /// Rebuilds what is derived from the data (rows, tree) if its inputs changed, and keeps
    /// the selections valid. Called once before each frame, not per message, so a burst of
    /// events costs one sort.
    pub fn prepare(&mut self) {
        self.prepare_rows();
        self.prepare_tree();
        let page = self.page;
        self.types_cursor.clamp(self.store.types.len(), page);
        let members = self
            .cluster
            .members
            .as_ref()
            .map_or(0, |members| members.members.len());
        self.cluster_cursor.clamp(members, page);
        let controllers = self
            .cluster
            .placement
            .as_ref()
            .map_or(0, |map| map.controllers.len());
        self.controllers_cursor.clamp(controllers, page);
    }

    fn prepare_rows(&mut self) {
        let Some(gvk) = self.current_type.clone() else {
            self.rows = Rows::default();
            return;
        };
        let Some(data) = self.store.get(&gvk) else {
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
        if self.rows.gvk != gvk || self.rows.stamp != stamp {
            let filter = self.filter.to_lowercase();
            let mut keys: Vec<&ResKey> = data
                .resources
                .keys()
                .filter(|key| self.tenancy.matches(key))
                .filter(|key| filter.is_empty() || key.name.to_lowercase().contains(&filter))
                .collect();
            sort_keys(&mut keys, &data.resources, self.sort);
            if self.descending {
                keys.reverse();
            }
            self.rows = Rows {
                gvk: gvk.clone(),
                keys: keys.into_iter().cloned().collect(),
                stamp,
            };
        }
        // Keep the selection on the same resource; if it went away, on the same row.
        let len = self.rows.keys.len();
        if let Some(selected) = &self.selected
            && let Some(at) = self.rows.keys.iter().position(|key| key == selected)
        {
            self.resource_cursor.selected = at;
        }
        self.resource_cursor.clamp(len, self.page);
        self.selected = self.rows.keys.get(self.resource_cursor.selected).cloned();
    }

    fn prepare_tree(&mut self) {
        let Some(focus) = self.tree_focus.clone() else {
            self.tree.clear();
            return;
        };
        let stamp: Vec<u64> = self.store.types.iter().map(|t| t.revision).collect();
        if stamp == self.tree_stamp && !self.tree.is_empty() {
            return;
        }
        let selected = self
            .tree
            .get(self.tree_cursor.selected)
            .map(|line| line.at.clone());
        self.tree = owner_tree(&self.store, &focus);
        self.tree_stamp = stamp;
        if let Some(selected) = selected
            && let Some(at) = self.tree.iter().position(|line| line.at == selected)
        {
            self.tree_cursor.selected = at;
        }
        self.tree_cursor.clamp(self.tree.len(), self.page);
    }

    /// `Kind/name` of a resource in the store.
    pub fn label_of(&self, at: &ResRef) -> String {
        let kind = at.gvk.rsplit('.').next().unwrap_or(&at.gvk);
        format!("{kind}/{}", at.key.name)
    }
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

/// The ancestors of `focus` (owner chain up to the root), then every descendant of the root,
/// drawn with box-drawing indentation. An owner that no longer exists ends the chain.
pub fn owner_tree(store: &Store, focus: &ResRef) -> Vec<TreeLine> {
    let Some(mut root_resource) = store.resource(focus) else {
        return Vec::new();
    };
    let mut root = focus.clone();
    let mut seen = vec![root.clone()];
    while let Some(owner) = root_resource.owner.as_ref() {
        let Some((at, resource)) = store.by_id(owner) else {
            break;
        };
        if seen.contains(&at) {
            break; // a cycle: owners are validated, but never loop on bad data
        }
        seen.push(at.clone());
        root = at;
        root_resource = resource;
    }
    let children = store.children_index();
    let mut lines = Vec::new();
    let mut stack: Vec<(ResRef, String, String)> = vec![(root, String::new(), String::new())];
    while let Some((at, prefix, child_prefix)) = stack.pop() {
        let uid = store
            .resource(&at)
            .and_then(|r| r.id.as_ref())
            .map(|id| id.uid.clone())
            .unwrap_or_default();
        lines.push(TreeLine {
            prefix,
            focus: &at == focus,
            at,
        });
        if lines.len() > 100_000 {
            break;
        }
        if let Some(kids) = children.get(uid.as_str()) {
            let last = kids.len().saturating_sub(1);
            // Pushed in reverse so they pop in order.
            for (i, kid) in kids.iter().enumerate().rev() {
                let (branch, continuation) = if i == last {
                    ("└─ ", "   ")
                } else {
                    ("├─ ", "│  ")
                };
                stack.push((
                    kid.clone(),
                    format!("{child_prefix}{branch}"),
                    format!("{child_prefix}{continuation}"),
                ));
            }
        }
    }
    lines
}
