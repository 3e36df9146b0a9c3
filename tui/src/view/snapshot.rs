//! The snapshot stepper: save → inspect → confirm → restore → verify.

use std::collections::BTreeSet;

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span, Text};
use ratatui::widgets::{Block, Gauge, Paragraph, Row, Table, Wrap};

use super::{dim, title_style};
use crate::state::{Choice, SnapshotInfo, SnapshotStep, State};

const STEPS: [&str; 5] = ["Save or open", "Inspect", "Confirm", "Restore", "Verify"];

fn step_index(step: &SnapshotStep) -> usize {
    match step {
        SnapshotStep::Start | SnapshotStep::Saving { .. } | SnapshotStep::Opening { .. } => 0,
        SnapshotStep::Inspect(_) => 1,
        SnapshotStep::Confirm { .. } => 2,
        SnapshotStep::Restoring { .. } => 3,
        SnapshotStep::Verifying { .. } | SnapshotStep::Verified { .. } => 4,
        SnapshotStep::Failed { info, .. } => usize::from(info.is_some()) * 3,
    }
}

fn bytes_label(bytes: u64) -> String {
    match bytes {
        0..1_024 => format!("{bytes} B"),
        1_024..1_048_576 => format!("{:.1} KiB", bytes as f64 / 1_024.0),
        _ => format!("{:.1} MiB", bytes as f64 / 1_048_576.0),
    }
}

pub(super) fn render(state: &State, frame: &mut Frame, area: Rect) {
    let [steps, body] = area.layout(&Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(3),
    ]));
    let current = step_index(&state.snapshot);
    let mut spans = Vec::new();
    for (i, name) in STEPS.iter().enumerate() {
        if i > 0 {
            spans.push(Span::styled(" → ", dim()));
        }
        let style = match i.cmp(&current) {
            std::cmp::Ordering::Less => Style::default().fg(Color::Green),
            std::cmp::Ordering::Equal => Style::default()
                .fg(Color::Black)
                .bg(Color::Cyan)
                .add_modifier(Modifier::BOLD),
            std::cmp::Ordering::Greater => dim(),
        };
        let mark = match i.cmp(&current) {
            std::cmp::Ordering::Less => "✓",
            std::cmp::Ordering::Equal => "▶",
            std::cmp::Ordering::Greater => " ",
        };
        spans.push(Span::styled(format!("{mark}{} {name} ", i + 1), style));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), steps);
    let block = Block::bordered().title(Span::styled(" Snapshot ", title_style()));
    let inner = block.inner(body);
    frame.render_widget(block, body);
    match &state.snapshot {
        SnapshotStep::Start => {
            let text = "Save the cluster's resources to a file, look inside it, and restore it.\n\n\
                        s  save a new snapshot (asks for the file name)\n\
                        o  open a snapshot file saved earlier (resctl snapshot save works too)\n\n\
                        Once a snapshot is inspected, r restores it after a confirmation that \
                        shows what the cluster holds now and what it will hold.";
            frame.render_widget(Paragraph::new(text).wrap(Wrap { trim: false }), inner);
        }
        SnapshotStep::Saving {
            path,
            written,
            total,
        } => {
            let [text, gauge] = inner.layout(&Layout::vertical([
                Constraint::Length(2),
                Constraint::Length(1),
            ]));
            frame.render_widget(
                Paragraph::new(format!(
                    "Saving to {} (a temporary file beside it until every record is verified) — esc cancels",
                    path.display()
                )),
                text,
            );
            let ratio = total
                .filter(|total| *total > 0)
                .map_or(0.0, |total| (*written as f64 / total as f64).min(1.0));
            let label = match total {
                Some(total) => format!("{} of {}", bytes_label(*written), bytes_label(*total)),
                None => format!("{} received", bytes_label(*written)),
            };
            frame.render_widget(
                Gauge::default()
                    .ratio(ratio)
                    .label(label)
                    .gauge_style(Style::default().fg(Color::Cyan)),
                gauge,
            );
        }
        SnapshotStep::Opening { path } => {
            frame.render_widget(
                Paragraph::new(format!(
                    "Reading and verifying {} — esc cancels",
                    path.display()
                )),
                inner,
            );
        }
        SnapshotStep::Inspect(info) => {
            let mut lines = header_lines(info);
            lines.push(Line::default());
            lines.push(Line::from(vec![
                Span::styled("r", title_style()),
                Span::raw(" restore this snapshot into the cluster (asks first) · "),
                Span::styled("s", title_style()),
                Span::raw(" save another · "),
                Span::styled("o", title_style()),
                Span::raw(" open another · "),
                Span::styled("esc", title_style()),
                Span::raw(" start over"),
            ]));
            let [top, table] = inner.layout(&Layout::vertical([
                Constraint::Length(lines.len() as u16),
                Constraint::Min(2),
            ]));
            frame.render_widget(Paragraph::new(Text::from(lines)), top);
            let rows: Vec<Row> = info
                .counts()
                .into_iter()
                .map(|(gvk, count)| Row::new(vec![gvk, count.to_string()]))
                .collect();
            frame.render_widget(
                Table::new(rows, [Constraint::Length(36), Constraint::Length(10)])
                    .header(bold(Row::new(["TYPE", "RESOURCES"]))),
                table,
            );
        }
        SnapshotStep::Confirm { info, choice } => {
            let now: std::collections::BTreeMap<String, u64> = state
                .store
                .counts()
                .into_iter()
                .map(|(gvk, count)| (gvk, count as u64))
                .collect();
            let counts = info.counts();
            let types: BTreeSet<&String> = now.keys().chain(counts.keys()).collect();
            let rows: Vec<Row> = types
                .into_iter()
                .map(|gvk| {
                    let before = now.get(gvk).copied().unwrap_or(0);
                    let after = counts.get(gvk).copied().unwrap_or(0);
                    let style = if before == after {
                        Style::default()
                    } else {
                        Style::default().fg(Color::Yellow)
                    };
                    Row::new(vec![gvk.clone(), before.to_string(), after.to_string()]).style(style)
                })
                .collect();
            let [warning, table, buttons] = inner.layout(&Layout::vertical([
                Constraint::Length(3),
                Constraint::Min(2),
                Constraint::Length(1),
            ]));
            frame.render_widget(
                Paragraph::new(vec![
                    Line::from(Span::styled(
                        format!("Restore {}?", info.path.display()),
                        Style::default().add_modifier(Modifier::BOLD),
                    )),
                    Line::from(Span::styled(
                        "Every resource in the cluster is replaced by the snapshot's (taken at raft index "
                            .to_owned()
                            + &info.header.raft_index.to_string()
                            + "). Watches everywhere list again.",
                        Style::default().fg(Color::Yellow),
                    )),
                ])
                .wrap(Wrap { trim: false }),
                warning,
            );
            frame.render_widget(
                Table::new(
                    rows,
                    [
                        Constraint::Length(36),
                        Constraint::Length(12),
                        Constraint::Length(14),
                    ],
                )
                .header(bold(Row::new(["TYPE", "IN CLUSTER", "AFTER RESTORE"]))),
                table,
            );
            frame.render_widget(Paragraph::new(buttons_line(*choice, "Restore")), buttons);
        }
        SnapshotStep::Restoring { info, sent, total } => {
            let [text, gauge] = inner.layout(&Layout::vertical([
                Constraint::Length(2),
                Constraint::Length(1),
            ]));
            frame.render_widget(
                Paragraph::new(format!(
                    "Restoring {} — esc stops the upload (the server only switches once it has everything)",
                    info.path.display()
                )),
                text,
            );
            let ratio = if *total == 0 {
                0.0
            } else {
                (*sent as f64 / *total as f64).min(1.0)
            };
            frame.render_widget(
                Gauge::default()
                    .ratio(ratio)
                    .label(format!("{} of {}", bytes_label(*sent), bytes_label(*total)))
                    .gauge_style(Style::default().fg(Color::Cyan)),
                gauge,
            );
        }
        SnapshotStep::Verifying { restored_index, .. } => {
            frame.render_widget(
                Paragraph::new(format!(
                    "Restored (raft index {restored_index}). Counting every type on the server to compare with the snapshot…"
                )),
                inner,
            );
        }
        SnapshotStep::Verified {
            info,
            restored_index,
            rows,
        } => {
            let differ = rows.iter().filter(|r| r.expected != r.actual).count();
            let summary = if differ == 0 {
                Span::styled(
                    format!(
                        "Restored {} at raft index {restored_index}: all {} types match the snapshot.",
                        info.path.display(),
                        rows.len()
                    ),
                    Style::default()
                        .fg(Color::Green)
                        .add_modifier(Modifier::BOLD),
                )
            } else {
                Span::styled(
                    format!(
                        "Restored at raft index {restored_index}, but {differ} types differ from the snapshot (controllers may have changed them since; compare below)."
                    ),
                    Style::default()
                        .fg(Color::Yellow)
                        .add_modifier(Modifier::BOLD),
                )
            };
            let [top, table] = inner.layout(&Layout::vertical([
                Constraint::Length(2),
                Constraint::Min(2),
            ]));
            frame.render_widget(
                Paragraph::new(Line::from(summary)).wrap(Wrap { trim: false }),
                top,
            );
            let table_rows: Vec<Row> = rows
                .iter()
                .map(|row| {
                    let (mark, color) = if row.expected == row.actual {
                        ("✓", Color::Green)
                    } else {
                        ("✗", Color::Red)
                    };
                    Row::new(vec![
                        Line::from(row.gvk.clone()),
                        Line::from(row.expected.to_string()),
                        Line::from(row.actual.to_string()),
                        Line::from(Span::styled(mark, Style::default().fg(color))),
                    ])
                })
                .collect();
            frame.render_widget(
                Table::new(
                    table_rows,
                    [
                        Constraint::Length(36),
                        Constraint::Length(10),
                        Constraint::Length(10),
                        Constraint::Length(3),
                    ],
                )
                .header(bold(Row::new(["TYPE", "SNAPSHOT", "CLUSTER", ""]))),
                table,
            );
        }
        SnapshotStep::Failed { what, error, info } => {
            let mut lines = vec![
                Line::from(Span::styled(
                    format!("Could not {what}:"),
                    Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
                )),
                Line::from(error.clone()),
                Line::default(),
            ];
            if info.is_some() {
                lines.push(Line::from(
                    "r tries the restore again · s saves a new snapshot · o opens another · esc starts over",
                ));
            } else {
                lines.push(Line::from(
                    "s saves a new snapshot · o opens a file · esc starts over",
                ));
            }
            frame.render_widget(
                Paragraph::new(Text::from(lines)).wrap(Wrap { trim: false }),
                inner,
            );
        }
    }
}

fn bold(row: Row<'_>) -> Row<'_> {
    row.style(Style::default().add_modifier(Modifier::BOLD))
}

fn header_lines(info: &SnapshotInfo) -> Vec<Line<'static>> {
    let field = |name: &str, value: String| {
        Line::from(vec![
            Span::styled(format!("{name:<16}"), dim()),
            Span::raw(value),
        ])
    };
    let header = &info.header;
    vec![
        field("file", info.path.display().to_string()),
        field("size", bytes_label(info.bytes)),
        field(
            "taken",
            format!(
                "{} at raft index {} on node {}",
                header
                    .created_at
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_else(|| "-".into()),
                header.raft_index,
                header.node_id
            ),
        ),
        field("resources", header.resource_count.to_string()),
        field("sha256", header.sha256.clone()),
        field(
            "format",
            format!(
                "version {} (checksum and every record verified)",
                header.format_version
            ),
        ),
    ]
}

/// `[ Cancel ]  [ Delete ]` with the current choice highlighted.
pub(crate) fn buttons_line(choice: Choice, action: &str) -> Line<'static> {
    let on = Style::default()
        .fg(Color::Black)
        .bg(Color::Cyan)
        .add_modifier(Modifier::BOLD);
    let off = Style::default();
    let (cancel, confirm) = match choice {
        Choice::Cancel => (on, off),
        Choice::Confirm => (off, on.bg(Color::Red)),
    };
    let (cancel_text, confirm_text) = match choice {
        Choice::Cancel => ("[▸Cancel ]".to_owned(), format!("[ {action} ]")),
        Choice::Confirm => ("[ Cancel ]".to_owned(), format!("[▸{action} ]")),
    };
    Line::from(vec![
        Span::styled(cancel_text, cancel),
        Span::raw("  "),
        Span::styled(confirm_text, confirm),
        Span::styled("   ←/→ choose · enter · y yes · esc cancel", dim()),
    ])
}
