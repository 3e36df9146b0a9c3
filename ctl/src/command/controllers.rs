//! `resctl controllers`: the placement map — every controller against every node, where it
//! runs, its queue depth and its last error.

use std::collections::BTreeMap;

use proto::cluster::v1::{ListControllersResponse, Placement};
use proto::codec::gvk;
use serde::Serialize;

use crate::output::{self, OutputFormat, Table};
use crate::session::Session;

#[derive(Debug, Clone, Serialize)]
pub struct ControllerOnNode {
    pub node_id: u64,
    pub running: bool,
    pub queue_depth: u64,
    pub reconciles_ok: u64,
    pub reconciles_failed: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub last_error: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub last_reconcile: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ControllerPlacement {
    pub name: String,
    pub managed_type: String,
    pub placement: String,
    pub nodes: Vec<ControllerOnNode>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PlacementMap {
    pub controllers: Vec<ControllerPlacement>,
    /// Nodes that could not be asked, with why.
    pub unreachable: BTreeMap<u64, String>,
    pub node_ids: Vec<u64>,
}

pub fn placement_label(placement: i32) -> &'static str {
    match Placement::try_from(placement) {
        Ok(Placement::Singleton) => "singleton",
        Ok(Placement::EachServer) => "each-server",
        _ => "unspecified",
    }
}

pub fn placement_map(response: &ListControllersResponse) -> PlacementMap {
    let mut controllers: BTreeMap<String, ControllerPlacement> = BTreeMap::new();
    let mut unreachable = BTreeMap::new();
    let mut node_ids = Vec::new();
    for node in &response.nodes {
        node_ids.push(node.node_id);
        if !node.error.is_empty() {
            unreachable.insert(node.node_id, node.error.clone());
        }
        for controller in &node.controllers {
            let entry = controllers
                .entry(controller.name.clone())
                .or_insert_with(|| ControllerPlacement {
                    name: controller.name.clone(),
                    managed_type: controller
                        .managed_type
                        .as_ref()
                        .map(gvk)
                        .unwrap_or_default(),
                    placement: placement_label(controller.placement).to_owned(),
                    nodes: Vec::new(),
                });
            entry.nodes.push(ControllerOnNode {
                node_id: node.node_id,
                running: controller.running,
                queue_depth: controller.queue_depth,
                reconciles_ok: controller.reconciles_ok,
                reconciles_failed: controller.reconciles_failed,
                last_error: controller.last_error.clone(),
                last_reconcile: controller
                    .last_reconcile
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
            });
        }
    }
    node_ids.sort_unstable();
    PlacementMap {
        controllers: controllers.into_values().collect(),
        unreachable,
        node_ids,
    }
}

pub fn render_table(map: &PlacementMap, wide: bool) -> String {
    let mut headers = vec![
        "CONTROLLER".to_owned(),
        "TYPE".to_owned(),
        "PLACEMENT".to_owned(),
    ];
    headers.extend(map.node_ids.iter().map(|id| format!("NODE {id}")));
    let mut table = Table::new(headers);
    for controller in &map.controllers {
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
        OutputFormat::Json => output::json(&map)?,
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
