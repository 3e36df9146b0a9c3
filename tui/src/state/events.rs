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

/// The event tail and how far back the reader scrolled.
#[derive(Debug, Clone, Default)]
pub struct EventsScreen {
    pub lines: VecDeque<EventLine>,
    /// Lines back from the newest (0 follows the tail).
    pub scroll: usize,
}

impl EventsScreen {
    pub fn push(&mut self, at: SystemTime, kind: EventKind, text: String) {
        if self.lines.len() == EVENT_TAIL {
            self.lines.pop_front();
        }
        self.lines.push_back(EventLine { at, kind, text });
        if self.scroll > 0 {
            // Keep the lines under the reader's eyes still while new ones arrive.
            self.scroll = (self.scroll + 1).min(self.lines.len());
        }
    }
}
