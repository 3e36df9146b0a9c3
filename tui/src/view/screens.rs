//! The types list, the cluster view, the placement map and the event tail.

use proto::client::describe;
use proto::cluster::v1::Scope;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span, Text};
use ratatui::widgets::{Block, Paragraph, Row, Table, Wrap};

use super::{dim, render_window, title_style};
use crate::clock;
use crate::state::{EventKind, State};

/// `3s ago` from an RFC 3339 time, `never` for none.
fn ago(rfc3339: &str, now: std::time::SystemTime) -> String {
    if rfc3339.is_empty() {
        return "never".into();
    }
    rfc3339
        .parse::<prost_types::Timestamp>()
        .ok()
        .and_then(|timestamp| std::time::SystemTime::try_from(timestamp).ok())
        .map(|at| {
            format!(
                "{} ago",
                describe::age_label(now.duration_since(at).unwrap_or_default())
            )
        })
        .unwrap_or_else(|| rfc3339.to_owned())
}

/// The items of `all` at the indexes `keep` (columns a narrow terminal shows).
fn keep_columns<T>(all: Vec<T>, keep: &[usize]) -> Vec<T> {
    all.into_iter()
        .enumerate()
        .filter(|(index, _)| keep.contains(index))
        .map(|(_, item)| item)
        .collect()
}

fn bold_header<'a>(cells: Vec<&'a str>) -> Row<'a> {
    Row::new(cells).style(Style::default().add_modifier(Modifier::BOLD))
}

fn scope_label(scope: Scope) -> &'static str {
    match scope {
        Scope::Cluster => "cluster",
        Scope::Partition => "partition",
        Scope::Namespace => "namespace",
        Scope::Any => "any",
        Scope::Undefined => "?",
    }
}

/// Whether `glob` (`*` matches any run of characters) matches `text`.
fn glob_matches(glob: &str, text: &str) -> bool {
    let parts: Vec<&str> = glob.split('*').collect();
    if parts.len() == 1 {
        return glob == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// How full the fullest quota that counts each type is (percent, 80 and over), by `group.Kind`
/// glob, and the fullest `bytes` quota (shown on the quota type's own row).
fn quotas_near_their_limit(state: &State) -> (Vec<(String, u64)>, Option<u64>) {
    let mut counts = Vec::new();
    let mut bytes: Option<u64> = None;
    let Some(quotas) = state
        .store
        .types
        .iter()
        .find(|t| t.gvk == "tenancy.v1.Quota")
    else {
        return (counts, bytes);
    };
    for quota in quotas.resources.values() {
        let Some(data) = quota.data.as_ref().and_then(|any| {
            <proto::tenancy::v1::Quota as prost::Message>::decode(any.value.as_slice()).ok()
        }) else {
            continue;
        };
        for (key, limit) in &data.hard {
            let used = data.used.get(key).copied().unwrap_or(0);
            let percent = if *limit == 0 {
                if used > 0 { 100 } else { 0 }
            } else {
                used.saturating_mul(100) / limit
            };
            if percent < 80 {
                continue;
            }
            match key.strip_prefix("count/") {
                Some(glob) => counts.push((glob.to_owned(), percent)),
                None => bytes = Some(bytes.map_or(percent, |b| b.max(percent))),
            }
        }
    }
    (counts, bytes)
}

pub(super) fn types(state: &State, frame: &mut Frame, area: Rect) {
    let block = Block::bordered().title(Span::styled(
        format!(" Types ({}) ", state.store.types.len()),
        title_style(),
    ));
    if state.store.types.is_empty() {
        let text = match &state.types_error {
            Some(error) => format!("Cannot read the type registry: {error}\n\nRetrying…"),
            None => format!("Reading the type registry from {}…", state.server),
        };
        frame.render_widget(
            Paragraph::new(text).block(block).wrap(Wrap { trim: false }),
            area,
        );
        return;
    }
    let height = usize::from(area.height.saturating_sub(3)).max(1);
    let cursor = state.types.cursor;
    let (near_counts, near_bytes) = quotas_near_their_limit(state);
    let rows: Vec<Row> = state
        .store
        .types
        .iter()
        .skip(cursor.offset)
        .take(height)
        .map(|data| {
            let watch = if let Some(error) = &data.failed {
                Span::styled(format!("stopped: {error}"), Style::default().fg(Color::Red))
            } else if data.relisting.is_some() {
                Span::styled("listing again", Style::default().fg(Color::Yellow))
            } else if data.synced {
                Span::styled("live", Style::default().fg(Color::Green))
            } else {
                Span::styled("listing…", Style::default().fg(Color::Yellow))
            };
            let deleting = data
                .resources
                .values()
                .filter(|r| proto::meta::is_marked_for_deletion(r))
                .count();
            let failing = data
                .resources
                .values()
                .filter(|r| {
                    describe::worst_condition(r).is_some_and(|c| describe::severity(c.state) == 2)
                })
                .count();
            let mut health = Vec::new();
            if failing > 0 {
                health.push(Span::styled(
                    format!("{failing} false "),
                    Style::default().fg(Color::Red),
                ));
            }
            if deleting > 0 {
                health.push(Span::styled(
                    format!("{deleting} deleting"),
                    Style::default().fg(Color::Magenta),
                ));
            }
            // The fullest quota that counts this type (objects), or any quota's bytes on the
            // quota type's own row.
            let group_kind = data
                .info
                .r#type
                .as_ref()
                .map(|t| format!("{}.{}", t.group, t.kind))
                .unwrap_or_default();
            let fullest = near_counts
                .iter()
                .filter(|(glob, _)| glob_matches(glob, &group_kind))
                .map(|(_, percent)| *percent)
                .chain(
                    (data.gvk == "tenancy.v1.Quota")
                        .then_some(near_bytes)
                        .flatten(),
                )
                .max();
            if let Some(percent) = fullest {
                health.push(Span::styled(
                    format!(" quota {percent}%"),
                    Style::default().fg(if percent >= 100 {
                        Color::Red
                    } else {
                        Color::Yellow
                    }),
                ));
            }
            Row::new(vec![
                Line::from(data.gvk.clone()),
                Line::from(data.kind().to_owned()),
                Line::from(scope_label(data.scope)),
                Line::from(data.resources.len().to_string()),
                Line::from(health),
                Line::from(watch),
            ])
        })
        .collect();
    let table = Table::new(
        rows,
        [
            Constraint::Fill(3),
            Constraint::Fill(2),
            Constraint::Length(10),
            Constraint::Length(7),
            Constraint::Length(22),
            Constraint::Fill(2),
        ],
    )
    .header(bold_header(vec![
        "TYPE",
        "KIND",
        "SCOPE",
        "COUNT",
        "ATTENTION",
        "WATCH",
    ]))
    .block(block);
    render_window(frame, area, table, cursor);
}

pub(super) fn cluster(state: &State, frame: &mut Frame, area: Rect) {
    let alarms = state
        .cluster
        .status
        .as_ref()
        .map_or(0, |status| status.alarms.len().min(3) as u16);
    let [top, bottom] = area.layout(&Layout::vertical([
        Constraint::Length(9 + alarms),
        Constraint::Min(4),
    ]));
    let status_lines: Vec<Line> = match (&state.cluster.denied, &state.cluster.status) {
        (Some(denied), _) => vec![Line::from(Span::styled(
            denied.clone(),
            Style::default().fg(Color::Yellow),
        ))],
        (None, None) => vec![Line::from(format!(
            "Asking {} for its status…",
            state.server
        ))],
        (None, Some(status)) => {
            let field = |name: &str, value: String| {
                Line::from(vec![
                    Span::styled(format!("  {name:<16}"), dim()),
                    Span::raw(value),
                ])
            };
            let leader = if status.leader_id == 0 {
                "none (an election is under way?)".to_owned()
            } else {
                format!("node {} at {}", status.leader_id, status.leader_api_addr)
            };
            vec![
                field(
                    "cluster",
                    if status.cluster_name.is_empty() {
                        "-".into()
                    } else {
                        status.cluster_name.clone()
                    },
                ),
                field(
                    "connected to",
                    format!(
                        "node {} at {} ({}, storage {})",
                        status.node_id,
                        status.api_addr,
                        describe::role_label(status.role),
                        status.storage
                    ),
                ),
                field("leader", leader),
                field("term", status.term.to_string()),
                field(
                    "indexes",
                    format!(
                        "commit {} · applied {} · last log {} · snapshot {}",
                        status.commit_index,
                        status.applied_index,
                        status.last_log_index,
                        status.snapshot_index
                    ),
                ),
                field(
                    "log writes",
                    format!(
                        "{} entries in {} fsyncs ({} operations) · disk {} free",
                        status.log_entries,
                        status.log_commits,
                        status.log_operations,
                        describe::bytes_label(status.disk_free_bytes)
                    ),
                ),
                Line::from(vec![
                    Span::styled(format!("  {:<16}", "writes (60 s)"), dim()),
                    Span::styled(
                        describe::sparkline(&status.writes_per_second),
                        Style::default().fg(Color::Cyan),
                    ),
                    Span::raw(format!(
                        "  {}",
                        describe::activity_label(status.write_rate, status.apply_p99_ms)
                    )),
                ]),
            ]
            .into_iter()
            .chain(status.alarms.iter().map(|alarm| {
                Line::from(vec![
                    Span::styled(format!("  {:<16}", "alarm"), dim()),
                    Span::styled(alarm.clone(), Style::default().fg(Color::Red)),
                ])
            }))
            .collect()
        }
    };
    frame.render_widget(
        Paragraph::new(Text::from(status_lines))
            .block(Block::bordered().title(Span::styled(" This node ", title_style()))),
        top,
    );
    let title = match (&state.cluster.members_error, &state.cluster.members) {
        (Some((error, since)), _) => format!(
            " Members — as of {} ago: they cannot be asked now ({error}) ",
            describe::age_label(state.now.duration_since(*since).unwrap_or_default())
        ),
        (None, Some(members)) if members.no_leader => format!(
            " Members — no leader answers: node {}'s own view ",
            members.answered_by
        ),
        _ => " Members ".to_owned(),
    };
    let stale = state.cluster.members_error.is_some()
        || state.cluster.members.as_ref().is_some_and(|m| m.no_leader);
    let title_style = if stale {
        Style::default()
            .fg(Color::Yellow)
            .add_modifier(Modifier::BOLD)
    } else {
        title_style()
    };
    let block = Block::bordered().title(Span::styled(title, title_style));
    let Some(members) = &state.cluster.members else {
        frame.render_widget(
            Paragraph::new("Asking for the members…").block(block),
            bottom,
        );
        return;
    };
    let leader_commit = members
        .members
        .iter()
        .find(|m| m.leader)
        .and_then(|m| state.cluster.nodes.get(&m.node_id))
        .and_then(|status| status.as_ref().ok())
        .map(|status| status.commit_index);
    let height = usize::from(bottom.height.saturating_sub(3)).max(1);
    // A narrow terminal keeps whole addresses and the health, and leaves the figures out
    // (the node panel above has this node's).
    let columns: Vec<usize> = if bottom.width < 120 {
        vec![0, 1, 2, 8, 12]
    } else {
        (0..13).collect()
    };
    let rows: Vec<Row> = members
        .members
        .iter()
        .skip(state.nodes.cursor.offset)
        .take(height)
        .map(|member| {
            let node = state.cluster.nodes.get(&member.node_id);
            let (role, term, commit, applied) = match node {
                Some(Ok(status)) => (
                    describe::member_role(member.leader, member.voter, Some(status.role)),
                    status.term.to_string(),
                    status.commit_index.to_string(),
                    status.applied_index.to_string(),
                ),
                _ => (
                    describe::member_role(member.leader, member.voter, None),
                    "-".to_owned(),
                    "-".to_owned(),
                    "-".to_owned(),
                ),
            };
            // Writes per second and apply p99 over the last 10 s, and the last 12 s as a line.
            let activity = match node {
                Some(Ok(status)) => (
                    format!("{:.1}", status.write_rate),
                    format!("{}", status.apply_p99_ms),
                    describe::sparkline(
                        &status.writes_per_second
                            [status.writes_per_second.len().saturating_sub(12)..],
                    ),
                ),
                _ => ("-".to_owned(), "-".to_owned(), String::new()),
            };
            let lag = match (node, leader_commit) {
                (Some(Ok(status)), Some(commit)) => {
                    Some(commit.saturating_sub(status.applied_index))
                }
                _ => member.lag,
            };
            let health = match node {
                Some(Err(error)) => Span::styled(
                    format!("unreachable: {error}"),
                    Style::default().fg(Color::Red),
                ),
                _ if !member.reachable => Span::styled(
                    "unreachable from the leader",
                    Style::default().fg(Color::Red),
                ),
                Some(Ok(status)) if !status.ready => Span::styled(
                    format!("not serving: {}", status.not_ready_reason),
                    Style::default().fg(Color::Yellow),
                ),
                Some(Ok(status)) if !status.alarms.is_empty() => {
                    Span::styled(status.alarms.join("; "), Style::default().fg(Color::Red))
                }
                _ if lag.is_some_and(|lag| lag > 100) => Span::styled(
                    format!("catching up ({} behind)", lag.unwrap_or_default()),
                    Style::default().fg(Color::Yellow),
                ),
                // What is known is old: no health is claimed.
                _ if stale => Span::styled(
                    "unknown (no leader answers)",
                    Style::default().fg(Color::Yellow),
                ),
                _ => Span::styled("healthy", Style::default().fg(Color::Green)),
            };
            let role_style = if member.leader {
                Style::default()
                    .fg(Color::Cyan)
                    .add_modifier(Modifier::BOLD)
            } else {
                Style::default()
            };
            let cells = vec![
                Line::from(member.node_id.to_string()),
                Line::from(member.api_addr.clone()),
                Line::from(Span::styled(role, role_style)),
                Line::from(if member.voter { "yes" } else { "no" }),
                Line::from(term),
                Line::from(commit),
                Line::from(applied),
                Line::from(member.match_index.to_string()),
                Line::from(lag.map_or_else(|| "?".to_owned(), |lag| lag.to_string())),
                Line::from(activity.0),
                Line::from(activity.1),
                Line::from(Span::styled(activity.2, Style::default().fg(Color::Cyan))),
                Line::from(health),
            ];
            Row::new(keep_columns(cells, &columns))
        })
        .collect();
    let api_width = members
        .members
        .iter()
        .map(|m| m.api_addr.len())
        .max()
        .unwrap_or(0)
        .max(3) as u16
        + 1;
    let table = Table::new(
        rows,
        keep_columns(
            vec![
                Constraint::Length(4),
                Constraint::Length(api_width),
                Constraint::Length(10),
                Constraint::Length(5),
                Constraint::Length(5),
                Constraint::Length(8),
                Constraint::Length(8),
                Constraint::Length(8),
                Constraint::Length(6),
                Constraint::Length(8),
                Constraint::Length(6),
                Constraint::Length(12),
                Constraint::Fill(1),
            ],
            &columns,
        ),
    )
    .header(bold_header(keep_columns(
        vec![
            "NODE",
            "API",
            "ROLE",
            "VOTER",
            "TERM",
            "COMMIT",
            "APPLIED",
            "MATCH",
            "LAG",
            "WRITES/S",
            "P99 MS",
            "LAST 12 S",
            "HEALTH",
        ],
        &columns,
    )))
    .block(block);
    render_window(frame, bottom, table, state.nodes.cursor);
}

pub(super) fn controllers(state: &State, frame: &mut Frame, area: Rect) {
    let [top, bottom] = area.layout(&Layout::vertical([
        Constraint::Min(5),
        Constraint::Length(8),
    ]));
    let mut title = vec![Span::styled(" Controllers × nodes ", title_style())];
    if let Some(error) = &state.cluster.placement_error {
        title.push(Span::styled(
            format!("· last refresh failed: {error} "),
            Style::default().fg(Color::Red),
        ));
    }
    let block = Block::bordered().title(Line::from(title));
    let Some(map) = &state.cluster.placement else {
        frame.render_widget(
            Paragraph::new("Asking every node for its controllers…").block(block),
            area,
        );
        return;
    };
    let mut header = vec![
        "CONTROLLER".to_owned(),
        "TYPE".to_owned(),
        "PLACEMENT".to_owned(),
    ];
    header.extend(map.node_ids.iter().map(|id| format!("NODE {id}")));
    let height = usize::from(top.height.saturating_sub(3)).max(1);
    let cursor = state.controllers.cursor;
    let rows_cells: Vec<Vec<Line>> = map
        .controllers
        .iter()
        .skip(cursor.offset)
        .take(height)
        .map(|controller| {
            let mut cells = vec![
                Line::from(controller.name.clone()),
                Line::from(controller.managed_type.clone()),
                Line::from(controller.placement.clone()),
            ];
            if !controller.replicas.is_empty() {
                // Outside the server: who runs (holds the lease), then how many wait, in the
                // node columns.
                // The placement column counts the replicas (the node columns may be one).
                let sharded = controller.replicas.iter().any(|r| r.shard.is_some());
                cells[2] = Line::from(format!(
                    "{} ({})",
                    if sharded { "sharded" } else { "external" },
                    controller.replicas.len()
                ));
                let running: Vec<&str> = controller
                    .replicas
                    .iter()
                    .filter(|r| r.running)
                    .map(|r| r.identity.as_str())
                    .collect();
                let waiting = controller.replicas.len() - running.len();
                let (first, color) = match running.as_slice() {
                    [] => ("none runs".to_owned(), Color::Yellow),
                    many if sharded => (format!("● {} shards", many.len()), Color::Green),
                    [one] => (format!("● {one} leads"), Color::Green),
                    many => (format!("● {} run", many.len()), Color::Green),
                };
                let mut summary = vec![
                    Line::from(Span::styled(first, Style::default().fg(color))),
                    Line::from(Span::styled(
                        format!(
                            "{waiting} {}",
                            if sharded {
                                "out of the ring"
                            } else {
                                "waiting"
                            }
                        ),
                        dim(),
                    )),
                ];
                summary.truncate(map.node_ids.len().max(1));
                cells.extend(summary);
                while cells.len() < 3 + map.node_ids.len() {
                    cells.push(Line::from(""));
                }
                return cells;
            }
            for node_id in &map.node_ids {
                let cell = match controller.on(*node_id) {
                    _ if map.unreachable.contains_key(node_id) => {
                        Span::styled("unreachable", Style::default().fg(Color::Red))
                    }
                    None => Span::styled("-", dim()),
                    Some(node) if node.running => {
                        let mut text = format!("● q={}", node.queue_depth);
                        if !node.last_reconcile.is_empty() {
                            text.push_str(&format!(
                                " {}",
                                ago(&node.last_reconcile, state.now).trim_end_matches(" ago")
                            ));
                        }
                        if node.reconciles_failed > 0 {
                            text.push_str(&format!(" err={}", node.reconciles_failed));
                        }
                        let color = if node.last_error.is_empty() {
                            Color::Green
                        } else {
                            Color::Red
                        };
                        Span::styled(text, Style::default().fg(color))
                    }
                    Some(_) => Span::styled("standby", dim()),
                };
                cells.push(Line::from(cell));
            }
            cells
        })
        .collect();
    // Whole controller names always; a narrow terminal leaves the type out (the panel below
    // names it) and gives the nodes what is left.
    let name_width = map
        .controllers
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(0)
        .max("CONTROLLER".len()) as u16
        + 1;
    let narrow = top.width < 110;
    let mut widths = vec![
        Constraint::Length(name_width),
        Constraint::Fill(2),
        Constraint::Length(13),
    ];
    let node_width = if narrow {
        Constraint::Fill(1)
    } else {
        Constraint::Length(18)
    };
    widths.extend(map.node_ids.iter().map(|_| node_width));
    let keep: Vec<usize> = (0..widths.len()).filter(|i| !(narrow && *i == 1)).collect();
    let rows: Vec<Row> = rows_cells
        .into_iter()
        .map(|cells| Row::new(keep_columns(cells, &keep)))
        .collect();
    let table = Table::new(rows, keep_columns(widths, &keep))
        .header(
            Row::new(keep_columns(header, &keep))
                .style(Style::default().add_modifier(Modifier::BOLD)),
        )
        .block(block);
    render_window(frame, top, table, cursor);

    let mut lines = Vec::new();
    if let Some(controller) = map.controllers.get(cursor.selected) {
        lines.push(Line::from(vec![
            Span::styled(
                controller.name.clone(),
                Style::default().add_modifier(Modifier::BOLD),
            ),
            Span::raw(format!(
                " reconciles {} ({})",
                controller.managed_type, controller.placement
            )),
        ]));
        for replica in &controller.replicas {
            let state = replica.state_label();
            let mut spans = vec![Span::raw(format!(
                "  replica {} on {} ({}): {state} · queue {} · {} ok · {} failed",
                replica.identity,
                replica.host,
                replica.tenancy,
                replica.queue_depth,
                replica.reconciles_ok,
                replica.reconciles_failed,
            ))];
            if !replica.last_error.is_empty() {
                spans.push(Span::styled(
                    format!(" · last error: {}", replica.last_error),
                    Style::default().fg(Color::Red),
                ));
            }
            lines.push(Line::from(spans));
        }
        for node in &controller.nodes {
            let mut spans = vec![Span::raw(format!(
                "  node {}: {} · queue {} · {} ok · {} failed · last reconcile {}",
                node.node_id,
                if node.running { "running" } else { "standby" },
                node.queue_depth,
                node.reconciles_ok,
                node.reconciles_failed,
                ago(&node.last_reconcile, state.now),
            ))];
            if !node.last_error.is_empty() {
                spans.push(Span::styled(
                    format!(" · last error: {}", node.last_error),
                    Style::default().fg(Color::Red),
                ));
            }
            lines.push(Line::from(spans));
        }
    }
    for (node_id, error) in &map.unreachable {
        lines.push(Line::from(Span::styled(
            format!("  node {node_id} unreachable: {error}"),
            Style::default().fg(Color::Red),
        )));
    }
    frame.render_widget(
        Paragraph::new(Text::from(lines))
            .block(Block::bordered().title(" Selected controller "))
            .wrap(Wrap { trim: false }),
        bottom,
    );
}

pub(super) fn events(state: &State, frame: &mut Frame, area: Rect) {
    let visible = state.events.visible();
    let following = if state.events.scroll == 0 {
        Span::styled("· following ", Style::default().fg(Color::Green))
    } else {
        Span::styled(
            format!("· paused {} back (G follows) ", state.events.scroll),
            Style::default().fg(Color::Yellow),
        )
    };
    let mut title = vec![
        Span::styled(format!(" Events ({}) ", visible.len()), title_style()),
        following,
    ];
    if !state.events.filter.is_empty() {
        title.push(Span::styled(
            format!("· /{} ", state.events.filter),
            Style::default().fg(Color::Cyan),
        ));
    }
    let hidden = state.events.lines.len() - visible.len();
    if hidden > 0 {
        let why = if state.events.show_heartbeats {
            "filtered out"
        } else {
            "hidden: heartbeats (h) or filtered"
        };
        title.push(Span::styled(format!("· {hidden} {why} "), dim()));
    }
    let block = Block::bordered().title(Line::from(title));
    if visible.is_empty() {
        let text = if state.events.lines.is_empty() {
            "No changes since the dashboard started. Writes, deletes and status updates \
             show up here as they happen."
        } else {
            "Nothing matches: esc clears the filter, h shows lease and report heartbeats."
        };
        frame.render_widget(
            Paragraph::new(text).block(block).wrap(Wrap { trim: false }),
            area,
        );
        return;
    }
    let height = usize::from(area.height.saturating_sub(2)).max(1);
    let end = visible.len() - state.events.scroll.min(visible.len());
    let start = end.saturating_sub(height);
    let lines: Vec<Line> = visible[start..end]
        .iter()
        .map(|event| {
            let color = match event.kind {
                EventKind::Created => Color::Green,
                EventKind::Updated => Color::Cyan,
                EventKind::Deleted => Color::Magenta,
                EventKind::Notice => Color::Yellow,
            };
            Line::from(vec![
                Span::styled(format!("{} ", clock::time_of_day(event.at)), dim()),
                Span::styled(
                    format!("{:<7}", event.kind.label()),
                    Style::default().fg(color),
                ),
                Span::raw(event.text.clone()),
            ])
        })
        .collect();
    frame.render_widget(Paragraph::new(Text::from(lines)).block(block), area);
}
