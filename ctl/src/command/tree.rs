//! `resctl tree TYPE NAME`: the owner chain up to the root and every descendant, each with its
//! worst condition, finalizers and deletion mark.

use std::future::Future;
use std::pin::Pin;

use proto::client::{Client, ClientError, describe};
use proto::codec::gvk;
use proto::resource::v1::{Id, Resource};
use serde::Serialize;

use crate::cli::NamedArgs;
use crate::output::{self, OutputFormat};
use crate::session::Session;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TreeNode {
    #[serde(rename = "type")]
    pub resource_type: String,
    pub name: String,
    pub tenancy: String,
    pub uid: String,
    /// The worst condition, e.g. `Accepted=True`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub finalizers: Vec<String>,
    pub deleting: bool,
    /// The resource no longer exists (an owner that was deleted).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub missing: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<TreeNode>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Tree {
    /// From the root owner down to the resource's direct owner.
    pub ancestors: Vec<TreeNode>,
    /// The resource with all its descendants.
    pub node: TreeNode,
}

impl TreeNode {
    fn of(resource: &Resource) -> TreeNode {
        let id = resource.id.clone().unwrap_or_default();
        TreeNode {
            resource_type: id.r#type.as_ref().map(gvk).unwrap_or_default(),
            name: id.name.clone(),
            tenancy: describe::tenancy_label(id.tenancy.as_ref()),
            uid: id.uid.clone(),
            condition: describe::worst_condition(resource).map(describe::condition_label),
            finalizers: proto::meta::finalizers(resource)
                .into_iter()
                .map(str::to_owned)
                .collect(),
            deleting: proto::meta::is_marked_for_deletion(resource),
            missing: false,
            children: Vec::new(),
        }
    }

    fn missing(id: &Id) -> TreeNode {
        TreeNode {
            resource_type: id.r#type.as_ref().map(gvk).unwrap_or_default(),
            name: id.name.clone(),
            tenancy: describe::tenancy_label(id.tenancy.as_ref()),
            uid: id.uid.clone(),
            condition: None,
            finalizers: Vec::new(),
            deleting: false,
            missing: true,
            children: Vec::new(),
        }
    }

    /// Every node of this subtree, depth first.
    pub fn walk(&self) -> Vec<&TreeNode> {
        let mut nodes = vec![self];
        for child in &self.children {
            nodes.extend(child.walk());
        }
        nodes
    }
}

/// Deepest owner chain followed (owners are set on create, so chains cannot cycle).
const MAX_DEPTH: usize = 32;

/// Reads `id` if it is still the same resource (same uid when the id carries one).
pub async fn read_exact(client: &Client, id: &Id) -> Result<Option<Resource>, ClientError> {
    let mut by_name = id.clone();
    by_name.uid.clear();
    Ok(client.read(&by_name).await?.filter(|resource| {
        id.uid.is_empty()
            || resource
                .id
                .as_ref()
                .is_some_and(|stored| stored.uid == id.uid)
    }))
}

/// The owned resources of `owner` (by uid), recursively, sorted by type and name.
pub fn descendants<'a>(
    client: &'a Client,
    owner: &'a Id,
    depth: usize,
) -> Pin<Box<dyn Future<Output = Result<Vec<TreeNode>, ClientError>> + Send + 'a>> {
    Box::pin(async move {
        if depth >= MAX_DEPTH || owner.uid.is_empty() {
            return Ok(Vec::new());
        }
        let mut children = client.list_by_owner(owner).await?;
        children.sort_by_key(|r| {
            let id = r.id.clone().unwrap_or_default();
            (id.r#type.as_ref().map(gvk).unwrap_or_default(), id.name)
        });
        let mut nodes = Vec::with_capacity(children.len());
        for child in &children {
            let mut node = TreeNode::of(child);
            let child_id = child.id.clone().unwrap_or_default();
            node.children = descendants(client, &child_id, depth + 1).await?;
            nodes.push(node);
        }
        Ok(nodes)
    })
}

pub async fn tree(session: &Session, type_name: &str, name: &str) -> anyhow::Result<Tree> {
    let resource = super::get::read(session, type_name, name).await?;
    let client = &session.client;
    let mut ancestors = Vec::new();
    let mut owner = resource.owner.clone();
    while let Some(owner_id) = owner.take() {
        if ancestors.len() >= MAX_DEPTH {
            break;
        }
        match read_exact(client, &owner_id).await? {
            Some(parent) => {
                ancestors.push(TreeNode::of(&parent));
                owner = parent.owner.clone();
            }
            None => ancestors.push(TreeNode::missing(&owner_id)),
        }
    }
    ancestors.reverse();
    let mut node = TreeNode::of(&resource);
    let id = resource.id.clone().unwrap_or_default();
    node.children = descendants(client, &id, 0).await?;
    Ok(Tree { ancestors, node })
}

fn label(node: &TreeNode) -> String {
    let kind = node.resource_type.rsplit('.').next().unwrap_or_default();
    let mut text = format!("{kind}/{}", node.name);
    if node.missing {
        text.push_str("  (gone)");
        return text;
    }
    text.push_str("  ");
    text.push_str(node.condition.as_deref().unwrap_or("-"));
    if !node.finalizers.is_empty() {
        text.push_str(&format!("  finalizers: {}", node.finalizers.join(",")));
    }
    if node.deleting {
        text.push_str("  (deleting)");
    }
    text
}

fn render_children(children: &[TreeNode], prefix: &str, text: &mut String) {
    for (index, child) in children.iter().enumerate() {
        let last = index + 1 == children.len();
        text.push_str(prefix);
        text.push_str(if last { "└── " } else { "├── " });
        text.push_str(&label(child));
        text.push('\n');
        let deeper = format!("{prefix}{}", if last { "    " } else { "│   " });
        render_children(&child.children, &deeper, text);
    }
}

/// The tree as text: the chain from the root, the resource marked, its descendants below.
pub fn render_text(tree: &Tree) -> String {
    let mut text = String::new();
    let mut prefix = String::new();
    for (index, ancestor) in tree.ancestors.iter().enumerate() {
        if index > 0 {
            text.push_str(&prefix);
            text.push_str("└── ");
            prefix.push_str("    ");
        }
        text.push_str(&label(ancestor));
        text.push('\n');
    }
    if !tree.ancestors.is_empty() {
        text.push_str(&prefix);
        text.push_str("└── ");
        prefix.push_str("    ");
    }
    text.push_str(&label(&tree.node));
    text.push_str("  ◀\n");
    render_children(&tree.node.children, &prefix, &mut text);
    text
}

pub async fn run(session: &Session, args: &NamedArgs) -> anyhow::Result<u8> {
    let tree = tree(session, &args.resource_type, &args.name).await?;
    let text = match session.output {
        OutputFormat::Json | OutputFormat::JsonPath => output::json(&tree)?,
        OutputFormat::Yaml => output::yaml(&tree)?,
        OutputFormat::Name => tree
            .ancestors
            .iter()
            .chain(tree.node.walk())
            .map(|node| format!("{}/{}\n", node.resource_type, node.name))
            .collect(),
        OutputFormat::Table | OutputFormat::Wide | OutputFormat::CustomColumns => {
            render_text(&tree)
        }
    };
    output::print(&text)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(kind: &str, name: &str, children: Vec<TreeNode>) -> TreeNode {
        TreeNode {
            resource_type: format!("demo.v2.{kind}"),
            name: name.into(),
            tenancy: "default/default".into(),
            uid: String::new(),
            condition: Some("Accepted=True".into()),
            finalizers: Vec::new(),
            deleting: false,
            missing: false,
            children,
        }
    }

    #[test]
    fn a_tree_renders_ancestors_above_and_descendants_below() {
        let mut album = node("Album", "blue", vec![node("Track", "so-what", vec![])]);
        album.finalizers = vec!["demo.resd.io/cleanup".into()];
        let tree = Tree {
            ancestors: vec![node("Label", "columbia", vec![])],
            node: node(
                "Artist",
                "miles",
                vec![album, node("Album", "sketches", vec![])],
            ),
        };
        assert_eq!(
            render_text(&tree),
            "Label/columbia  Accepted=True\n\
             └── Artist/miles  Accepted=True  ◀\n    \
             ├── Album/blue  Accepted=True  finalizers: demo.resd.io/cleanup\n    \
             │   └── Track/so-what  Accepted=True\n    \
             └── Album/sketches  Accepted=True\n"
        );
    }
}
