//! Every key the dashboard answers to, in one table: [`crate::update`] dispatches through it
//! and the `?` help is generated from it, so the two cannot disagree.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use crate::state::Screen;

/// What a key does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Quit,
    Help,
    CommandBar,
    Filter,
    Back,
    Up,
    Down,
    PageUp,
    PageDown,
    Top,
    Bottom,
    Open,
    NextTab,
    PrevTab,
    Tab(Screen),
    Edit,
    Delete,
    Tree,
    WhyStuck,
    Sort,
    ReverseSort,
    NextTenancy,
    SnapshotSave,
    SnapshotOpen,
    SnapshotRestore,
    /// Hand leadership to the selected member (asks first).
    TransferLeader,
    /// The events screen: show or hide lease and report heartbeats.
    Heartbeats,
    /// The detail screen: show or hide the resource's history.
    History,
    /// The detail screen's history pane: blame instead of a version's changes.
    Blame,
    /// Dialogs: switch between Cancel and the action.
    Toggle,
    /// Dialogs: do it (the same as choosing the action and pressing enter).
    Yes,
    /// Dialogs: the highlighted choice.
    Choose,
    Cancel,
    /// Close a dialog that only shows something (help, a message, why stuck).
    Close,
    /// ctrl-c: close the prompt or dialog that is open, else quit.
    Interrupt,
}

/// Where a binding applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Everywhere, also in dialogs and the input line.
    Always,
    /// Everywhere outside dialogs and the input line.
    Global,
    /// Lists and tables.
    List,
    /// Where a resource is selected: the resource table, its detail, the owner tree.
    Resource,
    /// The resource table.
    Table,
    /// The cluster screen.
    Cluster,
    /// The events screen.
    Events,
    /// The detail screen.
    Detail,
    Snapshot,
    /// Confirmation dialogs.
    Dialog,
    /// The edit-problem dialog (a conflict or a rejected document).
    EditProblem,
    /// Dialogs that only show something: help, messages, why stuck.
    Info,
    /// The why-stuck dialog.
    Stuck,
}

impl Scope {
    pub fn title(self) -> &'static str {
        match self {
            Scope::Always => "Always (also while typing or in a dialog)",
            Scope::Global => "Everywhere",
            Scope::List => "Lists",
            Scope::Resource => "Resources (table, detail, tree)",
            Scope::Table => "Resource table",
            Scope::Cluster => "Cluster",
            Scope::Events => "Events",
            Scope::Detail => "Detail",
            Scope::Snapshot => "Snapshot",
            Scope::Dialog => "Dialogs",
            Scope::EditProblem => "After an edit that did not save",
            Scope::Info => "Help, messages, why stuck",
            Scope::Stuck => "Why stuck",
        }
    }

    /// Whether bindings of this scope apply on `screen` (outside dialogs).
    pub fn applies_on(self, screen: Screen) -> bool {
        match self {
            Scope::Always | Scope::Global => true,
            Scope::List => !matches!(screen, Screen::Snapshot),
            Scope::Resource => matches!(screen, Screen::Resources | Screen::Detail | Screen::Tree),
            Scope::Table => screen == Screen::Resources,
            Scope::Cluster => screen == Screen::Cluster,
            Scope::Events => screen == Screen::Events,
            Scope::Detail => screen == Screen::Detail,
            Scope::Snapshot => screen == Screen::Snapshot,
            Scope::Dialog | Scope::EditProblem | Scope::Info | Scope::Stuck => false,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Binding {
    pub code: KeyCode,
    pub modifiers: KeyModifiers,
    /// How help shows the key.
    pub label: &'static str,
    pub scope: Scope,
    pub action: Action,
    pub help: &'static str,
}

const fn key(
    code: KeyCode,
    label: &'static str,
    scope: Scope,
    action: Action,
    help: &'static str,
) -> Binding {
    Binding {
        code,
        modifiers: KeyModifiers::NONE,
        label,
        scope,
        action,
        help,
    }
}

const fn ctrl(
    c: char,
    label: &'static str,
    scope: Scope,
    action: Action,
    help: &'static str,
) -> Binding {
    Binding {
        code: Char(c),
        modifiers: KeyModifiers::CONTROL,
        label,
        scope,
        action,
        help,
    }
}

use Action as A;
use KeyCode::{BackTab, Char, Down, End, Enter, Esc, Home, Left, PageDown, PageUp, Right, Up};
use Scope as S;

/// The keymap. Earlier bindings win when two match; scope-specific ones come first.
pub const KEYMAP: &[Binding] = &[
    // Dialogs (checked first while one is open).
    key(
        Left,
        "←/→/tab",
        S::Dialog,
        A::Toggle,
        "switch between Cancel and the action",
    ),
    key(Right, "←/→/tab", S::Dialog, A::Toggle, ""),
    key(KeyCode::Tab, "←/→/tab", S::Dialog, A::Toggle, ""),
    key(
        Enter,
        "enter",
        S::Dialog,
        A::Choose,
        "do what is highlighted (Cancel at first)",
    ),
    key(Char('y'), "y", S::Dialog, A::Yes, "confirm"),
    key(Char('n'), "n/esc", S::Dialog, A::Cancel, "cancel"),
    key(Esc, "n/esc", S::Dialog, A::Cancel, ""),
    key(
        Char('e'),
        "e",
        S::EditProblem,
        A::Edit,
        "open the editor again",
    ),
    key(
        Esc,
        "esc",
        S::EditProblem,
        A::Cancel,
        "give up the edit (nothing saved)",
    ),
    key(
        Char('e'),
        "e",
        S::Stuck,
        A::Edit,
        "edit the resource (remove a finalizer by hand)",
    ),
    key(Char('w'), "w/n", S::Stuck, A::Close, "close (as esc does)"),
    key(Char('n'), "w/n", S::Stuck, A::Close, ""),
    key(Esc, "esc/enter/q", S::Info, A::Close, "close"),
    key(Enter, "esc/enter/q", S::Info, A::Close, ""),
    key(Char('q'), "esc/enter/q", S::Info, A::Close, ""),
    key(Char('?'), "esc/enter/q", S::Info, A::Close, ""),
    // Snapshot stepper.
    key(
        Char('s'),
        "s",
        S::Snapshot,
        A::SnapshotSave,
        "save a new snapshot (asks for the file)",
    ),
    key(
        Char('o'),
        "o",
        S::Snapshot,
        A::SnapshotOpen,
        "open a snapshot file to inspect",
    ),
    key(
        Char('r'),
        "r",
        S::Snapshot,
        A::SnapshotRestore,
        "restore the inspected snapshot (asks first)",
    ),
    key(
        Left,
        "←/→/tab",
        S::Snapshot,
        A::Toggle,
        "confirm step: switch between Cancel and Restore",
    ),
    key(Right, "←/→/tab", S::Snapshot, A::Toggle, ""),
    key(KeyCode::Tab, "←/→/tab", S::Snapshot, A::Toggle, ""),
    key(
        Enter,
        "enter",
        S::Snapshot,
        A::Choose,
        "confirm step: do what is highlighted",
    ),
    key(Char('y'), "y", S::Snapshot, A::Yes, "confirm step: restore"),
    key(
        Esc,
        "esc",
        S::Snapshot,
        A::Cancel,
        "cancel the step under way / start over",
    ),
    // Resources.
    key(
        Char('e'),
        "e",
        S::Resource,
        A::Edit,
        "edit in $EDITOR (saved with compare-and-swap)",
    ),
    key(
        Char('d'),
        "d",
        S::Resource,
        A::Delete,
        "delete (asks first, shows what blocks)",
    ),
    key(
        Char('o'),
        "o",
        S::Resource,
        A::Tree,
        "owner tree: ancestors and descendants",
    ),
    key(
        Char('w'),
        "w",
        S::Resource,
        A::WhyStuck,
        "why is this stuck (marked for deletion)",
    ),
    key(
        Char('/'),
        "/",
        S::Table,
        A::Filter,
        "filter as you type: text in any column, or a selector (team=billing, !k, k in (a,b))",
    ),
    key(
        Char('L'),
        "L",
        S::Cluster,
        A::TransferLeader,
        "make the selected member the leader (asks first)",
    ),
    key(
        Char('/'),
        "/",
        S::Events,
        A::Filter,
        "filter the events as you type: a type, a name, a reason, an actor",
    ),
    key(
        Char('v'),
        "v",
        S::Detail,
        A::History,
        "the resource's history beside it: versions, who, when; ↑↓ pick one to see its changes",
    ),
    key(
        Char('b'),
        "b",
        S::Detail,
        A::Blame,
        "blame: each field with the version and actor that last changed it",
    ),
    key(
        Char('h'),
        "h",
        S::Events,
        A::Heartbeats,
        "show or hide lease and report heartbeats (hidden at first)",
    ),
    key(Char('s'), "s", S::Table, A::Sort, "sort by the next column"),
    key(Char('S'), "S", S::Table, A::ReverseSort, "reverse the sort"),
    key(
        Char('n'),
        "n",
        S::Table,
        A::NextTenancy,
        "next tenancy (all, each partition, each namespace)",
    ),
    // Lists.
    key(Up, "↑/k", S::List, A::Up, "up"),
    key(Char('k'), "↑/k", S::List, A::Up, ""),
    key(Down, "↓/j", S::List, A::Down, "down"),
    key(Char('j'), "↓/j", S::List, A::Down, ""),
    key(PageUp, "pgup/ctrl-b", S::List, A::PageUp, "page up"),
    ctrl('b', "pgup/ctrl-b", S::List, A::PageUp, ""),
    key(PageDown, "pgdn/ctrl-f", S::List, A::PageDown, "page down"),
    ctrl('f', "pgdn/ctrl-f", S::List, A::PageDown, ""),
    key(Home, "g/home", S::List, A::Top, "first row"),
    key(Char('g'), "g/home", S::List, A::Top, ""),
    key(
        End,
        "G/end",
        S::List,
        A::Bottom,
        "last row (the events tail follows again)",
    ),
    key(Char('G'), "G/end", S::List, A::Bottom, ""),
    key(
        Enter,
        "enter",
        S::List,
        A::Open,
        "open: a type's resources, a resource's detail",
    ),
    // Everywhere.
    key(Char('?'), "?", S::Global, A::Help, "this help"),
    key(
        Char(':'),
        ":",
        S::Global,
        A::CommandBar,
        "jump to a type (kind or group.version.kind) or a screen",
    ),
    key(Esc, "esc", S::Global, A::Back, "back / clear the filter"),
    key(KeyCode::Tab, "tab", S::Global, A::NextTab, "next screen"),
    key(
        BackTab,
        "shift-tab",
        S::Global,
        A::PrevTab,
        "previous screen",
    ),
    key(
        Char('1'),
        "1",
        S::Global,
        A::Tab(Screen::Types),
        "types with counts",
    ),
    key(
        Char('2'),
        "2",
        S::Global,
        A::Tab(Screen::Resources),
        "resources of the current type",
    ),
    key(
        Char('3'),
        "3",
        S::Global,
        A::Tab(Screen::Cluster),
        "cluster: nodes, roles, indexes, lag",
    ),
    key(
        Char('4'),
        "4",
        S::Global,
        A::Tab(Screen::Controllers),
        "controllers × nodes (placement)",
    ),
    key(
        Char('5'),
        "5",
        S::Global,
        A::Tab(Screen::Events),
        "event tail of the watches",
    ),
    key(
        Char('6'),
        "6",
        S::Global,
        A::Tab(Screen::Snapshot),
        "snapshot save / inspect / restore",
    ),
    key(Char('q'), "q", S::Global, A::Quit, "quit"),
    ctrl(
        'c',
        "ctrl-c",
        S::Always,
        A::Interrupt,
        "close the prompt or dialog that is open; quit when none is",
    ),
];

/// The input line's keys (typed text is not in [`KEYMAP`]: every printable key types itself).
pub const INPUT_HELP: &[(&str, &str)] = &[
    (
        "enter",
        "run the command / keep the filter / use the file name",
    ),
    ("esc", "cancel (a filter is cleared)"),
    ("backspace", "delete a character"),
    ("ctrl-u", "clear the line"),
];

fn matches(binding: &Binding, event: &KeyEvent) -> bool {
    // Shifted characters arrive with SHIFT set (and as the upper-case char); compare
    // characters without it.
    let modifiers = match event.code {
        Char(_) | BackTab => event.modifiers - KeyModifiers::SHIFT,
        _ => event.modifiers,
    };
    binding.code == event.code && binding.modifiers == modifiers
}

/// The action of `event` among the bindings of `scopes`, in keymap order.
pub fn lookup(event: &KeyEvent, scopes: &[Scope]) -> Option<Action> {
    KEYMAP
        .iter()
        .find(|binding| scopes.contains(&binding.scope) && matches(binding, event))
        .map(|binding| binding.action)
}

/// The scopes whose bindings apply on `screen` outside dialogs, most specific first.
pub fn screen_scopes(screen: Screen) -> Vec<Scope> {
    [
        Scope::Snapshot,
        Scope::Detail,
        Scope::Resource,
        Scope::Table,
        Scope::Cluster,
        Scope::Events,
        Scope::List,
        Scope::Global,
    ]
    .into_iter()
    .filter(|scope| scope.applies_on(screen))
    .collect()
}

/// The help text: per scope, each action once with all its keys.
pub fn help_sections() -> Vec<(&'static str, Vec<(String, &'static str)>)> {
    let order = [
        Scope::Always,
        Scope::Global,
        Scope::List,
        Scope::Table,
        Scope::Resource,
        Scope::Cluster,
        Scope::Events,
        Scope::Detail,
        Scope::Snapshot,
        Scope::Dialog,
        Scope::EditProblem,
        Scope::Info,
        Scope::Stuck,
    ];
    let mut sections = Vec::new();
    for scope in order {
        let mut lines: Vec<(String, &'static str)> = Vec::new();
        for binding in KEYMAP
            .iter()
            .filter(|b| b.scope == scope && !b.help.is_empty())
        {
            lines.push((binding.label.to_owned(), binding.help));
        }
        sections.push((scope.title(), lines));
    }
    sections.push((
        "Input line (: / and file names)",
        INPUT_HELP
            .iter()
            .map(|(key, help)| ((*key).to_owned(), *help))
            .collect(),
    ));
    sections
}

#[cfg(test)]
mod tests {
    use super::*;

    fn press(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    #[test]
    fn specific_scopes_win_over_global_ones() {
        let table = screen_scopes(Screen::Resources);
        assert_eq!(lookup(&press(Char('s')), &table), Some(Action::Sort));
        let snapshot = screen_scopes(Screen::Snapshot);
        assert_eq!(
            lookup(&press(Char('s')), &snapshot),
            Some(Action::SnapshotSave)
        );
        assert_eq!(lookup(&press(Esc), &snapshot), Some(Action::Cancel));
        assert_eq!(lookup(&press(Char('q')), &snapshot), Some(Action::Quit));
        // The types list has no resource actions.
        assert_eq!(
            lookup(&press(Char('e')), &screen_scopes(Screen::Types)),
            None
        );
    }

    #[test]
    fn shifted_characters_and_control_keys_match() {
        let shifted = KeyEvent::new(Char('G'), KeyModifiers::SHIFT);
        assert_eq!(lookup(&shifted, &[Scope::List]), Some(Action::Bottom));
        let ctrl_c = KeyEvent::new(Char('c'), KeyModifiers::CONTROL);
        assert_eq!(lookup(&ctrl_c, &[Scope::Always]), Some(Action::Interrupt));
        assert_eq!(lookup(&ctrl_c, &[Scope::Global]), None);
        assert_eq!(lookup(&press(Char('c')), &[Scope::Always]), None);
    }

    #[test]
    fn every_action_with_help_is_listed_once_per_scope() {
        let sections = help_sections();
        let global = &sections[1];
        assert_eq!(global.0, "Everywhere");
        let quit: Vec<_> = global
            .1
            .iter()
            .filter(|(_, help)| *help == "quit")
            .collect();
        assert_eq!(quit.len(), 1);
        // Every binding is reachable from help: either it has text or a sibling with the
        // same label has.
        for binding in KEYMAP {
            assert!(
                KEYMAP.iter().any(|other| other.scope == binding.scope
                    && other.label == binding.label
                    && !other.help.is_empty()),
                "{} in {:?} has no help line",
                binding.label,
                binding.scope
            );
        }
    }
}
