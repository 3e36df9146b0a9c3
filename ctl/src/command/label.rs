//! `resctl label TYPE NAME k=v k2-`: set and remove metadata keys of one resource. The write is
//! a compare-and-swap on the version read; a write that loses a race reads again and retries
//! (a few times), so a label never overwrites another writer's change unseen.

use anyhow::Context as _;
use proto::client::{ClientError, describe};
use proto::resource::v1::Resource;
use serde::Serialize;

use crate::cli::{LabelArgs, LabelChange};
use crate::output::{self, OutputFormat};
use crate::session::Session;

/// Tries before giving up on a resource that keeps changing under us.
const ATTEMPTS: usize = 5;

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Labelled {
    #[serde(rename = "type")]
    pub resource_type: String,
    pub name: String,
    pub tenancy: String,
    /// The version written (or the one read, when nothing changed).
    pub version: String,
    /// `labeled`, or `unchanged` when every change was already so.
    pub result: String,
}

/// `changes` applied to `metadata`: whether anything changed, or why not (a key set already
/// to another value, without `overwrite`).
pub fn relabel(
    metadata: &mut std::collections::BTreeMap<String, String>,
    changes: &[LabelChange],
    overwrite: bool,
) -> Result<bool, String> {
    let mut changed = false;
    for change in changes {
        match change {
            LabelChange::Set(key, value) => match metadata.get(key) {
                Some(current) if current == value => {}
                Some(current) if !overwrite => {
                    return Err(format!(
                        "{key} is already {current:?}: pass --overwrite to set it to {value:?}"
                    ));
                }
                _ => {
                    metadata.insert(key.clone(), value.clone());
                    changed = true;
                }
            },
            LabelChange::Remove(key) => changed |= metadata.remove(key).is_some(),
        }
    }
    Ok(changed)
}

/// Applies the changes to one resource with compare-and-swap.
pub async fn label(session: &Session, args: &LabelArgs) -> anyhow::Result<Labelled> {
    let id = session.id(&args.resource_type, &args.name).await?;
    let label = describe::id_label(&id);
    for _ in 0..ATTEMPTS {
        let mut resource: Resource =
            super::get::read(session, &args.resource_type, &args.name).await?;
        let done = |resource: &Resource, result: &str| {
            let id = resource.id.clone().unwrap_or_default();
            Labelled {
                resource_type: id
                    .r#type
                    .as_ref()
                    .map(proto::codec::gvk)
                    .unwrap_or_default(),
                name: id.name,
                tenancy: describe::tenancy_label(id.tenancy.as_ref()),
                version: resource.version.clone(),
                result: result.into(),
            }
        };
        let changed = relabel(&mut resource.metadata, &args.changes, args.overwrite)
            .map_err(|why| crate::UsageError(format!("{label}: {why}")))?;
        if !changed {
            return Ok(done(&resource, "unchanged"));
        }
        // The version read stays on the resource: the write is a compare-and-swap on it.
        match session.client.write(&resource).await {
            Ok(written) => return Ok(done(&written, "labeled")),
            Err(ClientError::Conflict { .. }) => continue,
            Err(error) => return Err(error).with_context(|| format!("cannot label {label}")),
        }
    }
    anyhow::bail!("cannot label {label}: it changed under us {ATTEMPTS} times in a row; try again")
}

pub async fn run(session: &Session, args: &LabelArgs) -> anyhow::Result<u8> {
    let labelled = label(session, args).await?;
    let text = match session.output {
        format if format.is_structured() => match format {
            OutputFormat::Yaml => output::yaml(&labelled)?,
            _ => output::json(&labelled)?,
        },
        _ => format!(
            "{}/{} {} (version {})\n",
            labelled.resource_type, labelled.name, labelled.result, labelled.version
        ),
    };
    output::print(&text)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn changes_set_remove_and_refuse_to_overwrite_unasked() {
        let mut metadata = BTreeMap::from([("team".to_owned(), "billing".to_owned())]);
        let set = |k: &str, v: &str| LabelChange::Set(k.into(), v.into());
        assert_eq!(
            relabel(&mut metadata, &[set("team", "billing")], false),
            Ok(false),
            "the same value changes nothing"
        );
        let refused = relabel(&mut metadata, &[set("team", "search")], false).unwrap_err();
        assert!(refused.contains("--overwrite"), "{refused}");
        assert_eq!(metadata["team"], "billing", "nothing changed");
        assert_eq!(
            relabel(
                &mut metadata,
                &[set("team", "search"), set("tier", "gold")],
                true
            ),
            Ok(true)
        );
        assert_eq!(
            relabel(&mut metadata, &[LabelChange::Remove("tier".into())], false),
            Ok(true)
        );
        assert_eq!(
            relabel(&mut metadata, &[LabelChange::Remove("tier".into())], false),
            Ok(false)
        );
        assert_eq!(metadata, BTreeMap::from([("team".into(), "search".into())]));
    }

    #[test]
    fn a_change_is_key_equals_value_or_key_minus() {
        use crate::cli::parse_label_change;
        assert_eq!(
            parse_label_change("team=billing"),
            Ok(LabelChange::Set("team".into(), "billing".into()))
        );
        assert_eq!(
            parse_label_change("team-"),
            Ok(LabelChange::Remove("team".into()))
        );
        assert_eq!(
            parse_label_change("empty="),
            Ok(LabelChange::Set("empty".into(), String::new()))
        );
        for bad in [
            "team",
            "finalizers=x",
            "deletionTimestamp-",
            "team=a b",
            "=x",
        ] {
            assert!(parse_label_change(bad).is_err(), "{bad}");
        }
    }
}
