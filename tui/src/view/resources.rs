//! The resource table of one type, a resource's detail, and the owner tree.

use proto::client::describe;
use proto::meta;
use proto::resource::v1::Resource;
use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span, Text};
use ratatui::widgets::{Block, Paragraph, Row, Table, Wrap};

use super::columns::{self, Column};
use super::{condition_span, dim, render_window, selected_style, state_color, title_style};
use crate::model::{ResRef, Store};
use crate::state::State;

/// `album-cleanup` (a finalizer after its domain; the detail shows it whole) or `2 finalizers`.
fn finalizers_cell(resource: &Resource) -> Span<'static> {
    let finalizers = meta::finalizers(resource);
    let text = match finalizers.len() {
        0 => "-".to_owned(),
        1 => finalizers
            .iter()
            .next()
            .map(|f| f.rsplit('/').next().unwrap_or(f).to_owned())
            .unwrap_or_default(),
        n => format!("{n} finalizers"),
    };
    if meta::is_marked_for_deletion(resource) {
        Span::styled(
            format!("deleting: {text}"),
            Style::default().fg(Color::Magenta),
        )
    } else if finalizers.is_empty() {
        Span::styled(text, dim())
    } else {
        Span::raw(text)
    }
}

/// Blank columns between table columns.
const COLUMN_SPACING: u16 = 2;

/// The resource table's columns; NAME matters most, then CONDITION and TENANCY.
const TABLE_COLUMNS: [Column; 7] = [
    Column {
        header: std::borrow::Cow::Borrowed("NAME"),
        min: 12,
        max: 63,
        priority: 9,
    },
    Column {
        header: std::borrow::Cow::Borrowed("TENANCY"),
        min: 9,
        max: 40,
        priority: 6,
    },
    Column {
        header: std::borrow::Cow::Borrowed("VERSION"),
        min: 7,
        max: 20,
        priority: 4,
    },
    Column {
        header: std::borrow::Cow::Borrowed("AGE"),
        min: 3,
        max: 8,
        priority: 5,
    },
    Column {
        header: std::borrow::Cow::Borrowed("CONDITION"),
        min: 12,
        max: 40,
        priority: 7,
    },
    Column {
        header: std::borrow::Cow::Borrowed("FINALIZERS"),
        min: 8,
        max: 30,
        priority: 2,
    },
    Column {
        header: std::borrow::Cow::Borrowed("OWNER"),
        min: 8,
        max: 50,
        priority: 3,
    },
];

pub(super) fn table(state: &State, frame: &mut Frame, area: Rect) {
    let Some(gvk) = &state.resources.current_type else {
        let text = "No type chosen yet.\n\nPress 1 and enter on a type, or : and a kind (for \
                    example :Executive) to list its resources.";
        frame.render_widget(
            Paragraph::new(text)
                .block(Block::bordered().title(" Resources "))
                .wrap(Wrap { trim: false }),
            area,
        );
        return;
    };
    let Some(data) = state.store.get(gvk) else {
        frame.render_widget(
            Paragraph::new(format!("{gvk} is not registered on this server."))
                .block(Block::bordered().title(" Resources ")),
            area,
        );
        return;
    };
    let mut title = vec![
        Span::styled(format!(" {gvk} "), title_style()),
        Span::raw(format!(
            "· {} · {} of {} · sorted by {} {} ",
            state.resources.tenancy.label(),
            state.resources.rows.keys.len(),
            data.resources.len(),
            state.resources.sort.label(),
            if state.resources.descending {
                "↓"
            } else {
                "↑"
            }
        )),
    ];
    if !state.resources.filter.is_empty() {
        title.push(Span::styled(
            format!("· filter \"{}\" ", state.resources.filter),
            Style::default().fg(Color::Yellow),
        ));
    }
    if data.info.deprecated {
        // The version's deprecation (DESIGN §15.1), as resctl prints it on stderr.
        let message = if data.info.deprecation_message.is_empty() {
            format!("{gvk} is deprecated")
        } else {
            data.info.deprecation_message.clone()
        };
        title.push(Span::styled(
            format!("· {message} "),
            Style::default().fg(Color::Yellow),
        ));
    }
    if data.relisting.is_some() {
        title.push(Span::styled(
            "· listing again… ",
            Style::default().fg(Color::Yellow),
        ));
    }
    let block = Block::bordered().title(Line::from(title));
    if state.resources.rows.keys.is_empty() {
        let text = if let Some(error) = &data.failed {
            format!("The watch of {gvk} stopped: {error}")
        } else if let Some(problem) = state.resources.filter_problem() {
            format!(
                "The filter \"{}\" is no selector: {problem} (esc clears it).",
                state.resources.filter
            )
        } else if !data.synced {
            format!("Listing {gvk}…")
        } else if !state.resources.filter.is_empty() {
            format!(
                "Nothing matches the filter \"{}\" (esc clears it).",
                state.resources.filter
            )
        } else {
            format!(
                "No {} resources in {} (n switches tenancy; resctl apply creates some).",
                data.kind(),
                state.resources.tenancy.label()
            )
        };
        frame.render_widget(Paragraph::new(text).block(block), area);
        return;
    }
    let height = usize::from(area.height.saturating_sub(3));
    let cursor = state.resources.cursor;
    let visible = state
        .resources
        .rows
        .keys
        .iter()
        .skip(cursor.offset)
        .take(height.max(1));
    // The type's own columns (DESIGN §15.1), after NAME and TENANCY.
    let extra: Vec<(String, Vec<String>)> = data
        .info
        .columns
        .iter()
        .map(|column| {
            let path = column
                .json_path
                .trim_start_matches('.')
                .split('.')
                .map(str::to_owned)
                .collect();
            (column.name.to_uppercase(), path)
        })
        .collect();
    let mut table_columns: Vec<Column> = TABLE_COLUMNS[..2].to_vec();
    table_columns.extend(extra.iter().map(|(name, _)| Column {
        header: std::borrow::Cow::Owned(name.clone()),
        min: 4,
        max: 30,
        priority: 5,
    }));
    table_columns.extend(TABLE_COLUMNS[2..].iter().cloned());
    let cells: Vec<(Style, Vec<Span<'static>>)> = visible
        .filter_map(|key| {
            let resource = data.resources.get(key)?;
            let owner = resource
                .owner
                .as_ref()
                .map(describe::short_label)
                .unwrap_or_else(|| "-".to_owned());
            let style = if meta::is_marked_for_deletion(resource) {
                Style::default().add_modifier(Modifier::ITALIC)
            } else {
                Style::default()
            };
            let mut row = vec![Span::raw(key.name.clone()), Span::raw(key.tenancy_label())];
            if !extra.is_empty() {
                let document = state
                    .codec
                    .as_ref()
                    .and_then(|codec| codec.to_value(resource).ok());
                for (_, path) in &extra {
                    let cell = document
                        .as_ref()
                        .and_then(|document| {
                            path.iter()
                                .try_fold(document, |value, part| value.get(part))
                        })
                        .map(|value| match value {
                            serde_json::Value::String(text) => text.clone(),
                            other => other.to_string(),
                        });
                    row.push(match cell {
                        Some(text) => Span::raw(text),
                        None => Span::styled("<none>", dim()),
                    });
                }
            }
            row.extend([
                Span::raw(resource.version.clone()),
                Span::raw(describe::age_of(resource, state.now)),
                condition_span(resource),
                finalizers_cell(resource),
                Span::raw(owner),
            ]);
            Some((style, row))
        })
        .collect();
    // Sized to what is on screen; on a narrow terminal NAME keeps its width longest.
    let mut natural = vec![0u16; table_columns.len()];
    for (_, row) in &cells {
        for (width, cell) in natural.iter_mut().zip(row) {
            *width = (*width).max(cell.width() as u16);
        }
    }
    // Borders (2) and the selection marker (2).
    let available = area.width.saturating_sub(4);
    let widths = columns::fit(&table_columns, &natural, available, COLUMN_SPACING);
    let shown = |index: &usize| widths[*index] > 0;
    let rows: Vec<Row> = cells
        .iter()
        .map(|(style, row)| {
            Row::new(
                (0..row.len())
                    .filter(shown)
                    .map(|index| Line::from(columns::cut_span(&row[index], widths[index])))
                    .collect::<Vec<_>>(),
            )
            .style(*style)
        })
        .collect();
    let header = Row::new(
        (0..table_columns.len())
            .filter(shown)
            .map(|index| columns::ellipsize(&table_columns[index].header, widths[index]))
            .collect::<Vec<_>>(),
    )
    .style(Style::default().add_modifier(Modifier::BOLD));
    let widths: Vec<Constraint> = widths
        .iter()
        .filter(|width| **width > 0)
        .map(|width| Constraint::Length(*width))
        .collect();
    let table = Table::new(rows, widths)
        .header(header)
        .column_spacing(COLUMN_SPACING)
        .block(block);
    render_window(frame, area, table, cursor);
}

/// The lines of a resource's detail: identity, deletion, finalizers, metadata, status
/// conditions (observed vs current generation), children, data as YAML.
pub(super) fn detail_lines(state: &State, at: &ResRef) -> Vec<Line<'static>> {
    let Some(resource) = state.store.resource(at) else {
        return vec![Line::from(format!(
            "{} is gone (deleted, or no longer matches the watch).",
            state.label_of(at)
        ))];
    };
    let id = resource.id.clone().unwrap_or_default();
    let section = |name: &str| Line::from(Span::styled(name.to_owned(), title_style()));
    let field = |name: &str, value: String| {
        Line::from(vec![
            Span::styled(format!("  {name:<12}"), dim()),
            Span::raw(value),
        ])
    };
    let mut lines = vec![
        Line::from(Span::styled(
            describe::id_label(&id),
            Style::default().add_modifier(Modifier::BOLD),
        )),
        field("uid", id.uid.clone()),
        field("version", resource.version.clone()),
        field("generation", resource.generation.clone()),
        field("age", describe::age_of(resource, state.now)),
        field(
            "owner",
            resource
                .owner
                .as_ref()
                .map(describe::id_label)
                .unwrap_or_else(|| "-".to_owned()),
        ),
    ];
    lines.push(Line::default());
    let finalizers = meta::finalizers(resource);
    if meta::is_marked_for_deletion(resource) {
        lines.push(Line::from(Span::styled(
            format!(
                "Marked for deletion ({}); it stays until its finalizers are removed — w shows what holds it",
                resource
                    .metadata
                    .get(meta::DELETION_TIMESTAMP_KEY)
                    .cloned()
                    .unwrap_or_default()
            ),
            Style::default().fg(Color::Magenta).add_modifier(Modifier::BOLD),
        )));
        lines.push(Line::default());
    }
    lines.push(section("Status"));
    let mut statuses: Vec<_> = resource.status.iter().collect();
    statuses.sort_by_key(|(key, _)| key.as_str());
    if statuses.is_empty() {
        lines.push(Line::from(Span::styled(
            "  no status yet (no controller has reconciled it)",
            dim(),
        )));
    }
    for (key, status) in statuses {
        let observed = if status.observed_generation == resource.generation {
            Span::styled(
                format!(
                    "observed generation {} (current)",
                    status.observed_generation
                ),
                Style::default().fg(Color::Green),
            )
        } else {
            Span::styled(
                format!(
                    "observed generation {} of {} (stale: not reconciled since the last change)",
                    status.observed_generation, resource.generation
                ),
                Style::default().fg(Color::Yellow),
            )
        };
        lines.push(Line::from(vec![
            Span::styled(
                format!("  {key}  "),
                Style::default().add_modifier(Modifier::BOLD),
            ),
            observed,
        ]));
        for condition in &status.conditions {
            let color = state_color(condition.state);
            let mut spans = vec![
                Span::styled("    ● ", Style::default().fg(color)),
                Span::styled(
                    format!(
                        "{}={}",
                        condition.r#type,
                        describe::state_label(condition.state)
                    ),
                    Style::default().fg(color).add_modifier(Modifier::BOLD),
                ),
            ];
            if !condition.reason.is_empty() {
                spans.push(Span::raw(format!("  {}", condition.reason)));
            }
            if !condition.message.is_empty() {
                spans.push(Span::styled(format!("  {}", condition.message), dim()));
            }
            lines.push(Line::from(spans));
        }
    }
    lines.push(Line::default());
    lines.push(section("Finalizers"));
    if finalizers.is_empty() {
        lines.push(Line::from(Span::styled("  none", dim())));
    }
    for finalizer in &finalizers {
        lines.push(Line::from(format!("  - {finalizer}")));
    }
    lines.push(Line::default());
    lines.push(section("Metadata"));
    let mut metadata: Vec<(&String, &String)> = resource.metadata.iter().collect();
    metadata.sort();
    if metadata.is_empty() {
        lines.push(Line::from(Span::styled("  none", dim())));
    }
    for (key, value) in metadata {
        lines.push(Line::from(vec![
            Span::styled(format!("  {key}: "), dim()),
            Span::raw(value.clone()),
        ]));
    }
    lines.push(Line::default());
    let children = state.store.children(resource);
    lines.push(section(&format!("Children ({})", children.len())));
    if children.is_empty() {
        lines.push(Line::from(Span::styled("  none", dim())));
    }
    for child in children.iter().take(50) {
        lines.push(Line::from(format!(
            "  {}",
            child_label(&state.store, child)
        )));
    }
    if children.len() > 50 {
        lines.push(Line::from(format!(
            "  … and {} more (o shows the tree)",
            children.len() - 50
        )));
    }
    lines.push(Line::default());
    lines.push(section("Data"));
    match data_yaml(state, resource) {
        Ok(yaml) => lines.extend(yaml.lines().map(|line| Line::from(format!("  {line}")))),
        Err(error) => lines.push(Line::from(Span::styled(
            format!("  cannot decode the data: {error}"),
            Style::default().fg(Color::Red),
        ))),
    }
    lines
}

fn data_yaml(state: &State, resource: &Resource) -> Result<String, String> {
    let Some(codec) = &state.codec else {
        return Err("the type registry has not been read yet".into());
    };
    let value = codec.to_value(resource).map_err(|e| e.to_string())?;
    match value.get("data") {
        None => Ok("{}".into()),
        Some(data) => serde_yaml_ng::to_string(data).map_err(|e| e.to_string()),
    }
}

fn child_label(store: &Store, at: &ResRef) -> String {
    let kind = at.gvk.rsplit('.').next().unwrap_or(&at.gvk);
    let mut label = format!("{kind}/{}", at.key.name);
    if let Some(resource) = store.resource(at) {
        if let Some(condition) = describe::worst_condition(resource) {
            label.push_str(&format!("  {}", describe::condition_label(condition)));
        }
        if meta::is_marked_for_deletion(resource) {
            label.push_str("  (deleting)");
        }
    }
    label
}

pub(super) fn detail(state: &State, frame: &mut Frame, area: Rect) {
    let Some(at) = &state.detail.at else {
        frame.render_widget(
            Paragraph::new("Nothing selected.").block(Block::bordered().title(" Detail ")),
            area,
        );
        return;
    };
    let lines = detail_lines(state, at);
    let (area, pane_area) = match &state.detail.history {
        Some(_) => {
            let [left, right] = ratatui::layout::Layout::horizontal([
                Constraint::Percentage(50),
                Constraint::Percentage(50),
            ])
            .areas(area);
            (left, Some(right))
        }
        None => (area, None),
    };
    let title = if pane_area.is_some() {
        format!(" {} · esc closes the history ", state.label_of(at))
    } else {
        format!(
            " {} · ↑↓ scroll · v history · b blame · esc back ",
            state.label_of(at)
        )
    };
    frame.render_widget(
        Paragraph::new(Text::from(lines))
            .block(Block::bordered().title(Span::styled(title, title_style())))
            .scroll((state.detail.scroll, 0)),
        area,
    );
    if let (Some(pane), Some(pane_area)) = (&state.detail.history, pane_area) {
        history_pane(state, pane, frame, pane_area);
    }
}

/// The versions kept (the selected one marked) over what it changed, or the blame.
fn history_pane(state: &State, pane: &crate::state::HistoryPane, frame: &mut Frame, area: Rect) {
    use proto::client::history;
    let title = if pane.blame {
        " Blame · b versions · esc close "
    } else {
        " History · ↑↓ version · b blame · esc close "
    };
    let block = Block::bordered().title(Span::styled(title, title_style()));
    let entries = match &pane.entries {
        None => {
            frame.render_widget(Paragraph::new("reading the history…").block(block), area);
            return;
        }
        Some(Err(error)) => {
            frame.render_widget(
                Paragraph::new(format!("cannot read the history: {error}"))
                    .block(block)
                    .wrap(Wrap { trim: false }),
                area,
            );
            return;
        }
        Some(Ok(entries)) if entries.is_empty() => {
            frame.render_widget(
                Paragraph::new("No history kept (its type keeps none, or its retention ended).")
                    .block(block)
                    .wrap(Wrap { trim: false }),
                area,
            );
            return;
        }
        Some(Ok(entries)) => entries,
    };
    let Some(codec) = state.codec.as_ref() else {
        frame.render_widget(Paragraph::new("waiting for the types…").block(block), area);
        return;
    };
    let mut lines: Vec<Line> = Vec::new();
    if pane.blame {
        match history::blame(codec, entries) {
            Ok(blamed) => {
                for field in blamed {
                    lines.push(Line::from(vec![
                        Span::styled(
                            format!("{:<8} ", field.version),
                            Style::default().fg(Color::Cyan),
                        ),
                        Span::styled(format!("{:<20} ", field.actor), dim()),
                        Span::raw(format!("{}: {}", field.field, history::text(&field.value))),
                    ]));
                }
            }
            Err(error) => lines.push(Line::from(format!("cannot decode a version: {error}"))),
        }
        frame.render_widget(
            Paragraph::new(Text::from(lines))
                .block(block)
                .wrap(Wrap { trim: false }),
            area,
        );
        return;
    }
    // The versions: a window around the selected one.
    let list_height = usize::from(area.height.saturating_sub(2) / 2).max(3);
    let start = pane.selected.saturating_sub(list_height / 2);
    for (index, entry) in entries.iter().enumerate().skip(start).take(list_height) {
        let marker = if index == pane.selected { "▶ " } else { "  " };
        let style = if index == pane.selected {
            selected_style()
        } else {
            Style::default()
        };
        lines.push(Line::from(vec![
            Span::raw(marker),
            Span::styled(
                format!(
                    "{:<8} {:<7} {:<22} {}",
                    entry.version,
                    history::operation_name(entry),
                    entry.actor,
                    history::time_of(entry)
                ),
                style,
            ),
        ]));
    }
    lines.push(Line::from(Span::styled(
        "─".repeat(usize::from(area.width.saturating_sub(2))),
        dim(),
    )));
    let selected = &entries[pane.selected.min(entries.len() - 1)];
    let leaves = |entry: &proto::resource::v1::HistoryEntry| {
        history::leaves(codec, &entry.resource.clone().unwrap_or_default())
    };
    match (leaves(selected), entries.get(pane.selected + 1)) {
        (Ok(_), _) if history::operation_name(selected) == "delete" => {
            lines.push(Line::from(format!("deleted by {}", selected.actor)));
        }
        (Ok(_), None) => lines.push(Line::from(Span::styled(
            "the oldest version kept: nothing to compare it with",
            dim(),
        ))),
        (Ok(after), Some(previous)) => match leaves(previous) {
            Ok(before) => {
                let changes = history::field_changes(&before, &after);
                if changes.is_empty() {
                    lines.push(Line::from(Span::styled("no field changed", dim())));
                }
                for change in changes {
                    let color = match (&change.before, &change.after) {
                        (None, _) => Color::Green,
                        (_, None) => Color::Red,
                        _ => Color::Yellow,
                    };
                    lines.push(Line::from(Span::styled(
                        change.line(),
                        Style::default().fg(color),
                    )));
                }
            }
            Err(error) => lines.push(Line::from(format!("cannot decode a version: {error}"))),
        },
        (Err(error), _) => lines.push(Line::from(format!("cannot decode this version: {error}"))),
    }
    frame.render_widget(
        Paragraph::new(Text::from(lines))
            .block(block)
            .wrap(Wrap { trim: false }),
        area,
    );
}

pub(super) fn tree(state: &State, frame: &mut Frame, area: Rect) {
    let Some(focus) = &state.tree.focus else {
        return;
    };
    let block = Block::bordered().title(Span::styled(
        format!(" Owner tree of {} ", state.label_of(focus)),
        title_style(),
    ));
    if state.tree.lines.is_empty() {
        frame.render_widget(
            Paragraph::new(format!("{} is gone.", state.label_of(focus))).block(block),
            area,
        );
        return;
    }
    let height = usize::from(area.height.saturating_sub(2)).max(1);
    let cursor = state.tree.cursor;
    let lines: Vec<Line> = state
        .tree
        .lines
        .iter()
        .enumerate()
        .skip(cursor.offset)
        .take(height)
        .map(|(i, line)| {
            let marker = if i == cursor.selected { "▶ " } else { "  " };
            let mut spans = vec![Span::raw(marker), Span::styled(line.prefix.clone(), dim())];
            let mut name_style = Style::default();
            if line.focus {
                name_style = name_style.add_modifier(Modifier::BOLD).fg(Color::Cyan);
            }
            spans.push(Span::styled(state.label_of(&line.at), name_style));
            spans.push(Span::styled(
                format!("  {}", line.at.key.tenancy_label()),
                dim(),
            ));
            if let Some(resource) = state.store.resource(&line.at) {
                spans.push(Span::raw("  "));
                spans.push(condition_span(resource));
                let finalizers = meta::finalizers(resource);
                if !finalizers.is_empty() {
                    spans.push(Span::raw(format!(
                        "  [{}]",
                        finalizers.into_iter().collect::<Vec<_>>().join(", ")
                    )));
                }
                if meta::is_marked_for_deletion(resource) {
                    spans.push(Span::styled(
                        "  deleting",
                        Style::default().fg(Color::Magenta),
                    ));
                }
            }
            if line.focus {
                spans.push(Span::styled("  ◀", Style::default().fg(Color::Cyan)));
            }
            let mut rendered = Line::from(spans);
            if i == cursor.selected {
                rendered = rendered.style(selected_style());
            }
            rendered
        })
        .collect();
    frame.render_widget(Paragraph::new(Text::from(lines)).block(block), area);
}
