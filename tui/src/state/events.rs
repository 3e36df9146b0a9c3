//! The event tail of the watches.

use std::collections::VecDeque;
use std::time::SystemTime;

/// Most lines the event tail keeps.
pub const EVENT_TAIL: usize = 1_000;

/// A line of the event tail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventLine {
    pub at: SystemTime,
    pub kind: EventKind,
    pub text: String,
    /// A change of a lease or a replica's report: a heartbeat, hidden unless asked for.
    pub heartbeat: bool,
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

/// The types whose changes are heartbeats (leases renewed, replicas reporting every few
/// seconds): two replicas would fill the tail with them.
pub const HEARTBEAT_TYPES: [&str; 2] = ["coordination.v1.Lease", "coordination.v1.Replica"];

/// The event tail, how far back the reader scrolled, and what it shows.
#[derive(Debug, Clone, Default)]
pub struct EventsScreen {
    pub lines: VecDeque<EventLine>,
    /// Shown lines back from the newest (0 follows the tail).
    pub scroll: usize,
    /// `/`: only lines holding this text (any case): a type, a name, a reason, an actor.
    pub filter: String,
    /// `h`: heartbeats shown too.
    pub show_heartbeats: bool,
}

impl EventsScreen {
    pub fn push(&mut self, at: SystemTime, kind: EventKind, text: String, heartbeat: bool) {
        if self.lines.len() == EVENT_TAIL {
            self.lines.pop_front();
        }
        let line = EventLine {
            at,
            kind,
            text,
            heartbeat,
        };
        let shown = self.shows(&line);
        self.lines.push_back(line);
        if self.scroll > 0 && shown {
            // Keep the lines under the reader's eyes still while new ones arrive.
            self.scroll = (self.scroll + 1).min(self.lines.len());
        }
    }

    /// Whether `line` is shown under the filter and the heartbeat switch.
    pub fn shows(&self, line: &EventLine) -> bool {
        (self.show_heartbeats || !line.heartbeat)
            && (self.filter.is_empty()
                || line
                    .text
                    .to_lowercase()
                    .contains(&self.filter.to_lowercase())
                || line.kind.label().eq_ignore_ascii_case(&self.filter))
    }

    /// The lines shown, oldest first.
    pub fn visible(&self) -> Vec<&EventLine> {
        self.lines.iter().filter(|line| self.shows(line)).collect()
    }

    /// Lines the filter or the heartbeat switch hides.
    pub fn hidden(&self) -> usize {
        self.lines.len() - self.visible().len()
    }
}
