//! `resctl controllers`: the placement map — every controller against every node, where it
//! runs, its queue depth and its last error.

use proto::client::placement::{PlacementMap, placement_map};

use crate::output::{self, OutputFormat, Table};
use crate::session::Session;

pub fn render_table(map: &PlacementMap, wide: bool) -> String {
    let mut headers = vec![
        "CONTROLLER".to_owned(),
        "TYPE".to_owned(),
        "PLACEMENT".to_owned(),
    ];
    headers.extend(map.node_ids.iter().map(|id| format!("NODE {id}")));
    let mut table = Table::new(headers);
    for controller in map.controllers.iter().filter(|c| c.replicas.is_empty()) {
        let mut row = vec![
            controller.name.clone(),
            controller.managed_type.clone(),
            controller.placement.clone(),
        ];
        for node_id in &map.node_ids {
            let cell = match controller.nodes.iter().find(|n| n.node_id == *node_id) {
                _ if map.unreachable.contains_key(node_id) => "unreachable".to_owned(),
                None => "-".to_owned(),
                Some(node) if node.running => {
                    let mut cell = format!("running q={}", node.queue_depth);
                    if wide {
                        cell.push_str(&format!(
                            " ok={} err={}",
                            node.reconciles_ok, node.reconciles_failed
                        ));
                    }
                    if !node.last_error.is_empty() {
                        cell.push_str(" !");
                    }
                    cell
                }
                Some(_) => "standby".to_owned(),
            };
            row.push(cell);
        }
        table.row(row);
    }
    let mut text = table.render();
    // Controllers outside the server: one line per replica.
    let mut replicas = Table::new([
        "EXTERNAL", "REPLICA", "HOST", "TENANCY", "STATE", "QUEUE", "OK", "FAILED",
    ]);
    let mut any = false;
    for controller in map.controllers.iter().filter(|c| !c.replicas.is_empty()) {
        for replica in &controller.replicas {
            any = true;
            let state = replica.state_label();
            replicas.row([
                controller.name.clone(),
                replica.identity.clone(),
                replica.host.clone(),
                replica.tenancy.clone(),
                state,
                replica.queue_depth.to_string(),
                replica.reconciles_ok.to_string(),
                replica.reconciles_failed.to_string(),
            ]);
        }
    }
    if any {
        text.push('\n');
        text.push_str(&replicas.render());
    }
    for controller in map.controllers.iter().filter(|c| !c.replicas.is_empty()) {
        for replica in controller
            .replicas
            .iter()
            .filter(|r| !r.last_error.is_empty())
        {
            text.push_str(&format!(
                "! {} in replica {}: {}\n",
                controller.name, replica.identity, replica.last_error
            ));
        }
    }
    for controller in &map.controllers {
        for node in &controller.nodes {
            if !node.last_error.is_empty() {
                text.push_str(&format!(
                    "! {} on node {}: {}\n",
                    controller.name, node.node_id, node.last_error
                ));
            }
        }
    }
    for (node_id, error) in &map.unreachable {
        text.push_str(&format!("node {node_id} unreachable: {error}\n"));
    }
    text
}

pub async fn run(session: &Session) -> anyhow::Result<u8> {
    let response = session.client.list_controllers(true).await?;
    let map = placement_map(&response);
    let text = match session.output {
        OutputFormat::Json | OutputFormat::JsonPath => output::json(&map)?,
        OutputFormat::Yaml => output::yaml(&map)?,
        OutputFormat::Name => map
            .controllers
            .iter()
            .map(|c| format!("{}\n", c.name))
            .collect(),
        format => render_table(&map, format == OutputFormat::Wide),
    };
    output::print(&text)?;
    Ok(0)
}
