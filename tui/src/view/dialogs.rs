//! Overlays: help, delete confirmation, why-is-this-stuck, edit problems, messages.

use proto::client::edit::Problem;
use proto::meta;
use ratatui::Frame;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span, Text};
use ratatui::widgets::{Block, Clear, Paragraph, Wrap};

use super::snapshot::buttons_line;
use super::{centered, dim, title_style};
use crate::keymap;
use crate::model::ResRef;
use crate::state::{DeletePlan, Dialog, State};

fn popup(frame: &mut Frame, title: String, lines: Vec<Line<'static>>, width: u16, scroll: u16) {
    let width = width.min(frame.area().width);
    let inner = usize::from(width.saturating_sub(2)).max(1);
    // Wrapped lines take more rows than there are lines.
    let rows: usize = lines
        .iter()
        .map(|line| line.width().max(1).div_ceil(inner))
        .sum();
    let height = u16::try_from(rows).unwrap_or(u16::MAX).saturating_add(2);
    let area = centered(frame.area(), width, height);
    frame.render_widget(Clear, area);
    frame.render_widget(
        Paragraph::new(Text::from(lines))
            .block(
                Block::bordered()
                    .title(Span::styled(title, title_style()))
                    .border_style(Style::default().fg(Color::Cyan)),
            )
            .wrap(Wrap { trim: false })
            .scroll((scroll, 0)),
        area,
    );
}

pub(super) fn render(state: &State, dialog: &Dialog, frame: &mut Frame) {
    match dialog {
        Dialog::Help { scroll } => {
            let mut lines = Vec::new();
            for (title, bindings) in keymap::help_sections() {
                lines.push(Line::from(Span::styled(title, title_style())));
                for (keys, help) in bindings {
                    lines.push(Line::from(vec![
                        Span::styled(format!("  {keys:<14}"), Style::default().fg(Color::Yellow)),
                        Span::raw(help),
                    ]));
                }
                lines.push(Line::default());
            }
            let height = frame.area().height.saturating_sub(4);
            let area = centered(frame.area(), 86, height);
            frame.render_widget(Clear, area);
            frame.render_widget(
                Paragraph::new(Text::from(lines))
                    .block(
                        Block::bordered()
                            .title(Span::styled(
                                " Keys · ↑↓ scroll · esc closes ",
                                title_style(),
                            ))
                            .border_style(Style::default().fg(Color::Cyan)),
                    )
                    .scroll((*scroll, 0)),
                area,
            );
        }
        Dialog::ConfirmDelete(plan) => {
            popup(frame, " Delete? ".into(), delete_lines(plan), 84, 0);
        }
        Dialog::ConfirmTransfer {
            node,
            api_addr,
            choice,
        } => {
            let button = |label: &str, chosen: bool| {
                if chosen {
                    Span::styled(
                        format!("[ {label} ]"),
                        Style::default().add_modifier(Modifier::REVERSED | Modifier::BOLD),
                    )
                } else {
                    Span::raw(format!("  {label}  "))
                }
            };
            let lines = vec![
                Line::from(format!(
                    "Make node {node} ({api_addr}) the leader? Writes pause for about two seconds"
                )),
                Line::from(
                    "while the leader waits for it to hold the whole log; singleton controllers move with it.",
                ),
                Line::default(),
                Line::from(vec![
                    button("Cancel", *choice == crate::state::Choice::Cancel),
                    Span::raw("   "),
                    button("Transfer", *choice == crate::state::Choice::Confirm),
                    Span::styled("    tab switches · y transfers · esc cancels", dim()),
                ]),
            ];
            popup(frame, " Transfer leadership? ".into(), lines, 100, 0);
        }
        Dialog::WhyStuck { at } => {
            popup(
                frame,
                format!(" Why is {} still here? ", state.label_of(at)),
                why_stuck_lines(state, at),
                90,
                0,
            );
        }
        Dialog::EditProblem { session, problem } => {
            let mut lines = Vec::new();
            match problem {
                Problem::Conflict {
                    changes,
                    yours,
                    read_version,
                    server_version,
                } => {
                    lines.push(Line::from(Span::styled(
                        format!(
                            "{} changed on the server while you edited (version {read_version} → {server_version}); nothing was saved.",
                            session.label()
                        ),
                        Style::default().fg(Color::Yellow).add_modifier(Modifier::BOLD),
                    )));
                    lines.push(Line::default());
                    lines.push(Line::from(
                        "Server's changes since you opened it (- before, + now):",
                    ));
                    for line in changes.lines().take(30) {
                        let color = if line.starts_with('+') {
                            Color::Green
                        } else {
                            Color::Red
                        };
                        lines.push(Line::from(Span::styled(
                            format!("  {line}"),
                            Style::default().fg(color),
                        )));
                    }
                    lines.push(Line::from("Yours, not saved (- as read, + yours):"));
                    for line in yours.lines().take(20) {
                        let color = if line.starts_with('+') {
                            Color::Green
                        } else {
                            Color::Red
                        };
                        lines.push(Line::from(Span::styled(
                            format!("  {line}"),
                            Style::default().fg(color),
                        )));
                    }
                    lines.push(Line::default());
                    lines.push(Line::from(
                        "e opens the server's version with your changes merged in (yours win where both changed).",
                    ));
                }
                Problem::Rejected(message) => {
                    lines.push(Line::from(Span::styled(
                        format!("{} was not saved:", session.label()),
                        Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
                    )));
                    lines.push(Line::from(message.clone()));
                    lines.push(Line::default());
                    lines.push(Line::from(
                        "e opens your edit again, with the error on top.",
                    ));
                }
            }
            lines.push(Line::from(vec![
                Span::styled("e", title_style()),
                Span::raw(" edit again · "),
                Span::styled("esc", title_style()),
                Span::raw(" give up (nothing saved)"),
            ]));
            popup(frame, " Edit not saved ".into(), lines, 96, 0);
        }
        Dialog::Message { title, text } => {
            let mut lines: Vec<Line> = text.lines().map(|l| Line::from(l.to_owned())).collect();
            lines.push(Line::default());
            lines.push(Line::from(Span::styled("esc closes", dim())));
            popup(frame, format!(" {title} "), lines, 80, 0);
        }
    }
}

fn delete_lines(plan: &DeletePlan) -> Vec<Line<'static>> {
    let mut lines = vec![
        Line::from(Span::styled(
            format!("Delete {} (version {})?", plan.label, plan.version),
            Style::default().add_modifier(Modifier::BOLD),
        )),
        Line::default(),
    ];
    if plan.finalizers.is_empty() {
        lines.push(Line::from(Span::styled(
            "No finalizers: it is deleted at once.",
            Style::default().fg(Color::Green),
        )));
    } else {
        lines.push(Line::from(Span::styled(
            "It will be marked for deletion and stay until these finalizers are removed:",
            Style::default().fg(Color::Yellow),
        )));
        for finalizer in &plan.finalizers {
            lines.push(Line::from(format!("  - {finalizer}")));
        }
        if !plan.controllers.is_empty() {
            lines.push(Line::from("Released by:"));
            for controller in &plan.controllers {
                lines.push(Line::from(format!("  {controller}")));
            }
        }
        for finalizer in &plan.unowned {
            lines.push(Line::from(Span::styled(
                format!(
                    "No controller releases {finalizer}: nothing will remove it; remove it by hand \
                     with e (edit)."
                ),
                Style::default().fg(Color::Red),
            )));
        }
    }
    if !plan.children.is_empty() {
        lines.push(Line::default());
        lines.push(Line::from(format!(
            "{} owned resources are deleted after it (their own finalizers apply):",
            plan.children.len()
        )));
        for child in plan.children.iter().take(8) {
            lines.push(Line::from(format!("  {child}")));
        }
        if plan.children.len() > 8 {
            lines.push(Line::from(format!(
                "  … and {} more",
                plan.children.len() - 8
            )));
        }
    }
    lines.push(Line::default());
    lines.push(buttons_line(plan.choice, "Delete"));
    lines
}

/// Live from the store: the pending finalizers, who releases each (and where it runs), the
/// children still present.
pub(super) fn why_stuck_lines(state: &State, at: &ResRef) -> Vec<Line<'static>> {
    let Some(resource) = state.store.resource(at) else {
        return vec![
            Line::from(Span::styled(
                format!("{} is gone: the deletion finished.", state.label_of(at)),
                Style::default().fg(Color::Green),
            )),
            Line::default(),
            Line::from(Span::styled("esc closes", dim())),
        ];
    };
    let mut lines = Vec::new();
    if !meta::is_marked_for_deletion(resource) {
        lines.push(Line::from(
            "It is not marked for deletion, so nothing holds it.",
        ));
    } else {
        lines.push(Line::from(format!(
            "Marked for deletion at {}.",
            resource
                .metadata
                .get(meta::DELETION_TIMESTAMP_KEY)
                .cloned()
                .unwrap_or_else(|| "?".into())
        )));
        let finalizers = meta::finalizers(resource);
        if finalizers.is_empty() {
            lines.push(Line::from(Span::styled(
                "No finalizers are left: the server removes it any moment now.",
                Style::default().fg(Color::Green),
            )));
        } else {
            lines.push(Line::from(Span::styled(
                format!("Pending finalizers ({}):", finalizers.len()),
                Style::default()
                    .fg(Color::Yellow)
                    .add_modifier(Modifier::BOLD),
            )));
            let placement = state.cluster.placement.as_ref();
            for finalizer in finalizers {
                lines.push(Line::from(Span::styled(
                    format!("  - {finalizer}"),
                    Style::default().add_modifier(Modifier::BOLD),
                )));
                let managing: Vec<_> = placement
                    .map(|map| map.releasing(finalizer).collect())
                    .unwrap_or_default();
                if placement.is_none() {
                    lines.push(Line::from(Span::styled(
                        "      controllers not known yet (asking the nodes…)",
                        dim(),
                    )));
                } else if managing.is_empty() {
                    lines.push(Line::from(Span::styled(
                        format!(
                            "      no controller releases {finalizer}: nothing will remove it; e edits the resource to remove it by hand"
                        ),
                        Style::default().fg(Color::Red),
                    )));
                }
                for controller in managing {
                    let running: Vec<_> = controller.running().collect();
                    if running.is_empty() {
                        lines.push(Line::from(Span::styled(
                            format!(
                                "      {} ({}) runs nowhere right now (standby on nodes {}) — no leader?",
                                controller.name,
                                controller.placement,
                                controller
                                    .nodes
                                    .iter()
                                    .map(|n| n.node_id.to_string())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                            Style::default().fg(Color::Red),
                        )));
                    }
                    for node in running {
                        let mut spans = vec![Span::raw(format!(
                            "      released by {} running on node {} (queue {}, {} ok, {} failed)",
                            controller.name,
                            node.node_id,
                            node.queue_depth,
                            node.reconciles_ok,
                            node.reconciles_failed
                        ))];
                        if !node.last_error.is_empty() {
                            spans.push(Span::styled(
                                format!("; last error: {}", node.last_error),
                                Style::default().fg(Color::Red),
                            ));
                        }
                        lines.push(Line::from(spans));
                    }
                }
            }
        }
    }
    let children = state.store.children(resource);
    if !children.is_empty() {
        lines.push(Line::default());
        lines.push(Line::from(format!(
            "{} owned resources will be deleted after it is gone:",
            children.len()
        )));
        for child in children.iter().take(8) {
            lines.push(Line::from(format!("  {}", state.label_of(child))));
        }
    }
    lines.push(Line::default());
    lines.push(Line::from(vec![
        Span::styled("e", title_style()),
        Span::raw(" edit (remove a finalizer by hand) · "),
        Span::styled("esc", title_style()),
        Span::raw(" close"),
    ]));
    lines
}
