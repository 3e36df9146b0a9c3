//! The owner tree: ancestors and descendants of one resource.

use super::Cursor;
use crate::model::{ResRef, Store};

/// One line of the owner tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeLine {
    /// Box-drawing indentation (`│ ├─ `).
    pub prefix: String,
    pub at: ResRef,
    /// Whether this is the resource the tree was opened on.
    pub focus: bool,
}

/// The owner tree screen: the resource it was opened on, and its lines.
#[derive(Debug, Clone, Default)]
pub struct TreeScreen {
    pub focus: Option<ResRef>,
    pub lines: Vec<TreeLine>,
    stamp: Vec<u64>,
    pub cursor: Cursor,
}

impl TreeScreen {
    /// The resource under the cursor.
    pub fn focused(&self) -> Option<ResRef> {
        self.lines
            .get(self.cursor.selected)
            .map(|line| line.at.clone())
    }

    /// Rebuilds the lines when any type changed; keeps the cursor on the same resource.
    pub(super) fn prepare(&mut self, store: &Store, page: usize) {
        let Some(focus) = self.focus.clone() else {
            self.lines.clear();
            return;
        };
        let stamp: Vec<u64> = store.types.iter().map(|t| t.revision).collect();
        if stamp == self.stamp && !self.lines.is_empty() {
            return;
        }
        let selected = self
            .lines
            .get(self.cursor.selected)
            .map(|line| line.at.clone());
        self.lines = owner_tree(store, &focus);
        self.stamp = stamp;
        if let Some(selected) = selected
            && let Some(at) = self.lines.iter().position(|line| line.at == selected)
        {
            self.cursor.selected = at;
        }
        self.cursor.clamp(self.lines.len(), page);
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
