//! Everything the dashboard shows, as plain data, one module per screen (as `view/` draws
//! them): [`crate::update`] changes it in response to messages; [`State::prepare`] rebuilds
//! what is derived from it (the sorted, filtered rows; the owner tree) once before each frame;
//! [`crate::view`] draws it and changes nothing. A screen's state is a field of [`State`]
//! named after it.

mod cluster;
mod dialogs;
mod events;
mod resources;
mod snapshot;
mod tree;

use std::sync::Arc;
use std::time::SystemTime;

use proto::codec::Codec;
use proto::resource::v1::Resource;

pub use self::cluster::{ClusterInfo, ControllersScreen, NodesScreen};
pub use self::dialogs::{Choice, DeletePlan, Dialog, Input, InputKind};
pub use self::events::{EVENT_TAIL, EventKind, EventLine, EventsScreen, HEARTBEAT_TYPES};
pub use self::resources::{
    DetailScreen, HistoryPane, ResourcesScreen, Rows, SortKey, TenancyFilter,
};
pub use self::snapshot::{SnapshotInfo, SnapshotPurpose, SnapshotStep, VerifyRow};
pub use self::tree::{TreeLine, TreeScreen, owner_tree};
use crate::model::{ResRef, Store};

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

/// The types screen: every registered type with its count.
#[derive(Debug, Clone, Default)]
pub struct TypesScreen {
    pub cursor: Cursor,
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
    pub types: TypesScreen,
    pub resources: ResourcesScreen,
    pub detail: DetailScreen,
    pub tree: TreeScreen,
    pub nodes: NodesScreen,
    pub controllers: ControllersScreen,
    pub events: EventsScreen,
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
            types: TypesScreen::default(),
            resources: ResourcesScreen::default(),
            detail: DetailScreen::default(),
            tree: TreeScreen::default(),
            nodes: NodesScreen::default(),
            controllers: ControllersScreen::default(),
            events: EventsScreen::default(),
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
            Screen::Resources => self.resources.focused(),
            Screen::Detail => self.detail.at.clone(),
            Screen::Tree => self.tree.focused(),
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
        self.events.push(self.now, kind, text, false);
    }

    /// [`Self::push_event`] of a change of `gvk` (a heartbeat's is hidden by default).
    pub fn push_change(&mut self, gvk: &str, kind: EventKind, text: String) {
        let heartbeat = HEARTBEAT_TYPES.contains(&gvk);
        self.events.push(self.now, kind, text, heartbeat);
    }

    /// Rebuilds what is derived from the data (rows, tree) if its inputs changed, and keeps
    /// the selections valid. Called once before each frame, not per message, so a burst of
    /// events costs one sort.
    pub fn prepare(&mut self) {
        let page = self.page;
        self.resources.prepare(&self.store, page);
        // The owner tree walks every resource: only while it is on screen (it catches up
        // when shown again).
        if self.screen == Screen::Tree {
            self.tree.prepare(&self.store, page);
        }
        self.types.cursor.clamp(self.store.types.len(), page);
        let members = self
            .cluster
            .members
            .as_ref()
            .map_or(0, |members| members.members.len());
        self.nodes.cursor.clamp(members, page);
        let controllers = self
            .cluster
            .placement
            .as_ref()
            .map_or(0, |map| map.controllers.len());
        self.controllers.cursor.clamp(controllers, page);
    }

    /// `Kind/name` of a resource in the store.
    pub fn label_of(&self, at: &ResRef) -> String {
        let kind = at.gvk.rsplit('.').next().unwrap_or(&at.gvk);
        format!("{kind}/{}", at.key.name)
    }
}
