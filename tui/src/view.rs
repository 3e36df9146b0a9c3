//! Drawing: `render(state, frame)` reads the state and changes nothing. Each screen draws only
//! the rows that fit (a type with 10,000 resources costs one screenful per frame).

mod columns;
mod dialogs;
mod resources;
mod screens;
mod snapshot;

use proto::client::describe;
use proto::resource::v1::State as ConditionState;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{HighlightSpacing, Paragraph, Table, TableState};

use crate::state::{Cursor, InputKind, Link, Screen, SnapshotPurpose, State};

/// Rows of chrome around a table body: header line, tab line, footer, two borders and the
/// table's column header.
const CHROME_ROWS: u16 = 6;

/// How many table rows a terminal of `height` rows shows (what paging moves by).
pub fn page_rows(height: u16) -> usize {
    usize::from(height.saturating_sub(CHROME_ROWS)).max(1)
}

pub(crate) fn selected_style() -> Style {
    Style::default()
        .bg(Color::DarkGray)
        .add_modifier(Modifier::BOLD)
}

pub(crate) fn title_style() -> Style {
    Style::default()
        .fg(Color::Cyan)
        .add_modifier(Modifier::BOLD)
}

pub(crate) fn dim() -> Style {
    Style::default().fg(Color::DarkGray)
}

pub(crate) fn state_color(state: i32) -> Color {
    match ConditionState::try_from(state) {
        Ok(ConditionState::True) => Color::Green,
        Ok(ConditionState::False) => Color::Red,
        _ => Color::Yellow,
    }
}

/// The worst condition of a resource as a coloured span (`-` when it has none).
pub(crate) fn condition_span(resource: &proto::resource::v1::Resource) -> Span<'static> {
    match describe::worst_condition(resource) {
        Some(condition) => {
            let mut text = describe::condition_label(condition);
            if describe::is_stale(resource) {
                text.push_str(" (stale)");
            }
            Span::styled(text, Style::default().fg(state_color(condition.state)))
        }
        None => Span::styled("-", dim()),
    }
}

pub fn render(state: &State, frame: &mut Frame) {
    let [header, tabs, body, footer] = frame.area().layout(&Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Min(3),
        Constraint::Length(1),
    ]));
    render_header(state, frame, header);
    render_tabs(state, frame, tabs);
    match state.screen {
        Screen::Types => screens::types(state, frame, body),
        Screen::Resources => resources::table(state, frame, body),
        Screen::Detail => resources::detail(state, frame, body),
        Screen::Tree => resources::tree(state, frame, body),
        Screen::Cluster => screens::cluster(state, frame, body),
        Screen::Controllers => screens::controllers(state, frame, body),
        Screen::Events => screens::events(state, frame, body),
        Screen::Snapshot => snapshot::render(state, frame, body),
    }
    render_footer(state, frame, footer);
    if let Some(dialog) = &state.dialog {
        dialogs::render(state, dialog, frame);
    }
}

fn render_header(state: &State, frame: &mut Frame, area: Rect) {
    let sep = || Span::styled(" │ ", dim());
    let link = match &state.link {
        Link::Connecting => Span::styled(
            format!("… connecting to {}", state.server),
            Style::default().fg(Color::Yellow),
        ),
        Link::Live => Span::styled("● live", Style::default().fg(Color::Green)),
        Link::Disconnected { error } => Span::styled(
            format!("◌ disconnected — retrying ({error})"),
            Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
        ),
    };
    // The link comes first: when it is down, that is the news.
    let mut spans = vec![
        Span::styled(" resd ", title_style().add_modifier(Modifier::REVERSED)),
        Span::raw(" "),
        link,
    ];
    if let Some(accessor) = &state.cluster.identity {
        spans.push(sep());
        spans.push(Span::raw("as "));
        spans.push(Span::styled(
            accessor.clone(),
            Style::default().add_modifier(Modifier::BOLD),
        ));
    }
    if let Some(status) = &state.cluster.status {
        if !status.cluster_name.is_empty() {
            spans.push(sep());
            spans.push(Span::raw("cluster "));
            spans.push(Span::styled(
                status.cluster_name.clone(),
                Style::default().add_modifier(Modifier::BOLD),
            ));
        }
        spans.push(sep());
        spans.push(Span::raw(format!(
            "node {} {} ({})",
            status.node_id,
            status.api_addr,
            describe::role_label(status.role)
        )));
        spans.push(sep());
        spans.push(Span::raw(if status.leader_id == 0 {
            "no leader".to_owned()
        } else {
            format!("leader {}", status.leader_id)
        }));
        spans.push(sep());
        spans.push(Span::raw(format!("term {}", status.term)));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

fn render_tabs(state: &State, frame: &mut Frame, area: Rect) {
    let mut spans = Vec::new();
    for (i, screen) in Screen::TABS.iter().enumerate() {
        let mut title = screen.title().to_owned();
        if *screen == Screen::Resources
            && let Some(gvk) = &state.resources.current_type
        {
            title = gvk.clone();
        }
        let text = format!(" {} {title} ", i + 1);
        let style = if state.screen.tab() == *screen {
            Style::default()
                .fg(Color::Black)
                .bg(Color::Cyan)
                .add_modifier(Modifier::BOLD)
        } else {
            Style::default()
        };
        spans.push(Span::styled(text, style));
    }
    if state.screen != state.screen.tab() {
        spans.push(Span::styled(
            format!(" › {}", state.screen.title()),
            title_style(),
        ));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

fn render_footer(state: &State, frame: &mut Frame, area: Rect) {
    let line = if let Some(input) = &state.input {
        let prompt = match &input.kind {
            InputKind::Command => ":".to_owned(),
            InputKind::Filter | InputKind::EventFilter => "/".to_owned(),
            InputKind::SnapshotPath(SnapshotPurpose::Save) => "save snapshot to: ".to_owned(),
            InputKind::SnapshotPath(SnapshotPurpose::Open) => "open snapshot file: ".to_owned(),
        };
        let hint = match &input.kind {
            InputKind::Command => {
                "   (a kind, group.version.Kind, or a screen; enter runs, esc cancels)"
            }
            InputKind::Filter => "   (enter keeps the filter, esc clears it)",
            InputKind::EventFilter => {
                "   (a type, name, reason or actor; enter keeps it, esc clears it)"
            }
            InputKind::SnapshotPath(_) => "   (enter goes, esc cancels)",
        };
        Line::from(vec![
            Span::styled(prompt, title_style()),
            Span::raw(input.text.clone()),
            Span::styled("█", Style::default().fg(Color::Cyan)),
            Span::styled(hint, dim()),
        ])
    } else if let Some(flash) = &state.flash {
        let color = if flash.error {
            Color::Red
        } else {
            Color::Green
        };
        Line::from(Span::styled(
            format!(" {}", flash.text),
            Style::default().fg(color),
        ))
    } else {
        let hints: &[(&str, &str)] = match state.screen {
            Screen::Types => &[("enter", "resources"), (":", "jump to type")],
            Screen::Resources => &[
                ("enter", "detail"),
                ("e", "edit"),
                ("d", "delete"),
                ("o", "owner tree"),
                ("w", "why stuck"),
                ("/", "filter"),
                ("s", "sort"),
                ("n", "tenancy"),
            ],
            Screen::Detail => &[
                ("e", "edit"),
                ("d", "delete"),
                ("o", "owner tree"),
                ("w", "why stuck"),
                ("esc", "back"),
            ],
            Screen::Tree => &[
                ("enter", "detail"),
                ("e", "edit"),
                ("d", "delete"),
                ("esc", "back"),
            ],
            Screen::Cluster => &[("↑↓", "select"), ("L", "make leader")],
            Screen::Controllers => &[("↑↓", "select")],
            Screen::Events => &[("↑↓", "scroll"), ("G", "follow")],
            Screen::Snapshot => &[
                ("s", "save"),
                ("o", "open"),
                ("r", "restore"),
                ("esc", "cancel step"),
            ],
        };
        let mut spans = Vec::new();
        for (key, what) in hints.iter().chain([("?", "help"), ("q", "quit")].iter()) {
            spans.push(Span::styled(format!(" {key}"), title_style()));
            spans.push(Span::raw(format!(" {what} ")));
        }
        Line::from(spans)
    };
    frame.render_widget(Paragraph::new(line), area);
}

/// Draws `table`, whose rows are the window of a list that starts at `cursor.offset`, with
/// the selected row highlighted and marked `▶`.
pub(crate) fn render_window(frame: &mut Frame, area: Rect, table: Table<'_>, cursor: Cursor) {
    let table = table
        .row_highlight_style(selected_style())
        .highlight_symbol("▶ ")
        .highlight_spacing(HighlightSpacing::Always);
    let mut table_state =
        TableState::default().with_selected(Some(cursor.selected.saturating_sub(cursor.offset)));
    frame.render_stateful_widget(table, area, &mut table_state);
}

/// A rectangle of `width` × `height` centred in `area` (clipped to it).
pub(crate) fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let width = width.min(area.width);
    let height = height.min(area.height);
    Rect {
        x: area.x + (area.width - width) / 2,
        y: area.y + (area.height - height) / 2,
        width,
        height,
    }
}

#[cfg(test)]
mod tests;
