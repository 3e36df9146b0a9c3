//! `resctl get TYPE [NAME]`: list resources of a type (sorted by tenancy and name, or by
//! `--sort-by`; `-l` selects on metadata; lists arrive in pages) or show one; `-w` watches on.

use anyhow::Context as _;
use proto::client::describe;
use proto::resource::v1::Resource;

use crate::cli::GetArgs;
use crate::output;
use crate::session::Session;

/// One resource by name; an error that names it when it does not exist.
pub async fn read(session: &Session, type_name: &str, name: &str) -> anyhow::Result<Resource> {
    let id = session.id(type_name, name).await?;
    session
        .client
        .read(&id)
        .await
        .with_context(|| format!("cannot read {}", describe::id_label(&id)))?
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{} not found (list what exists with `resctl get {type_name}`)",
                describe::id_label(&id)
            )
        })
}

/// Resources of a type in the session's tenancy (or all of them), sorted.
pub async fn list(
    session: &Session,
    type_name: &str,
    all_tenancies: bool,
    prefix: &str,
) -> anyhow::Result<Vec<Resource>> {
    list_matching(session, type_name, all_tenancies, prefix, "").await
}

/// How many resources a page of a listing holds: the server holds one page at a time.
pub const PAGE_SIZE: u32 = 500;

/// [`list`] of the resources whose metadata matches `selector`, asked for in pages.
pub async fn list_matching(
    session: &Session,
    type_name: &str,
    all_tenancies: bool,
    prefix: &str,
    selector: &str,
) -> anyhow::Result<Vec<Resource>> {
    let info = session.resolve_type(type_name).await?;
    let tenancy = session.tenancy(info.scope(), all_tenancies);
    let resource_type = info.r#type.clone().unwrap_or_default();
    let options = proto::client::ListOptions {
        name_prefix: prefix.to_owned(),
        selector: selector.to_owned(),
        ..proto::client::ListOptions::default()
    };
    let bar = session.interactive.then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_message(format!("listing {type_name}"));
        bar
    });
    let mut resources = Vec::new();
    session
        .client
        .list_in_pages(&resource_type, &tenancy, &options, PAGE_SIZE, |page| {
            resources.extend(page);
            if let Some(bar) = &bar {
                bar.set_message(format!("listing {type_name}: {} so far", resources.len()));
                bar.tick();
            }
        })
        .await
        .with_context(|| format!("cannot list {}", proto::codec::gvk(&resource_type)))?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    resources.sort_by_key(|resource| {
        let id = resource.id.clone().unwrap_or_default();
        let tenancy = id.tenancy.unwrap_or_default();
        (tenancy.partition, tenancy.namespace, id.name)
    });
    Ok(resources)
}

/// What an empty listing says: where it looked, and how to look elsewhere.
fn nothing_found(type_name: &str, tenancy: &proto::resource::v1::Tenancy, all: bool) -> String {
    match (all, tenancy.partition.as_str(), tenancy.namespace.as_str()) {
        (true, _, _) => format!("no {type_name} found in any tenancy"),
        (false, "", "") => format!("no {type_name} found"),
        (false, partition, "") => {
            format!("no {type_name} found in partition {partition} (-A: every partition)")
        }
        (false, partition, namespace) => format!(
            "no {type_name} found in namespace {namespace} of partition {partition} (-n NAMESPACE: another one, -A: every namespace)"
        ),
    }
}

pub async fn run(session: &Session, args: &GetArgs) -> anyhow::Result<u8> {
    let codec = session.codec().await?;
    // `TYPE/NAME` (what `-o name` prints) reads that one resource.
    let (type_name, name) = match (&args.name, args.resource_type.split_once('/')) {
        (None, Some((type_name, name))) if !name.is_empty() => (type_name, Some(name.to_owned())),
        _ => (args.resource_type.as_str(), args.name.clone()),
    };
    if args.watch {
        // The watch lists first (its snapshot), then streams the changes.
        let watch = crate::cli::WatchArgs {
            resource_type: type_name.to_owned(),
            name_prefix: args.prefix.clone(),
            from_version: None,
            selector: args.selector.clone(),
            all_namespaces: args.all_namespaces,
            count: None,
            show_actor: false,
        };
        return super::watch::run(session, &watch).await;
    }
    let args = &GetArgs {
        resource_type: type_name.to_owned(),
        name,
        all_namespaces: args.all_namespaces,
        prefix: args.prefix.clone(),
        selector: args.selector.clone(),
        sort_by: args.sort_by.clone(),
        watch: false,
        at: args.at.clone(),
    };
    let text = match &args.name {
        Some(name) if args.at.is_some() => {
            let version = args.at.as_deref().unwrap_or_default();
            let resource =
                super::history::get_at(session, &args.resource_type, name, version).await?;
            output::render_resources(codec, &[resource], session.output, true)?
        }
        Some(name) => {
            let resource = read(session, &args.resource_type, name).await?;
            output::render_resources(codec, &[resource], session.output, true)?
        }
        None => {
            let mut resources = list_matching(
                session,
                &args.resource_type,
                args.all_namespaces,
                args.prefix.as_deref().unwrap_or(""),
                args.selector.as_deref().unwrap_or(""),
            )
            .await?;
            if let Some(path) = &args.sort_by {
                sort_by(codec, &mut resources, path)?;
            }
            if resources.is_empty() && !session.output.is_structured() {
                let info = session.resolve_type(&args.resource_type).await?;
                let tenancy = session.tenancy(info.scope(), args.all_namespaces);
                crate::say!(
                    "{}",
                    nothing_found(&args.resource_type, &tenancy, args.all_namespaces)
                );
                return Ok(0);
            }
            output::render_resources(codec, &resources, session.output, false)?
        }
    };
    output::print(&text)?;
    if let Some(why) = session.client.last_stale() {
        crate::say!("warning: {why}; --consistent reads through the leader");
    }
    if session.output == output::OutputFormat::Wide {
        // Which member answered (with several --server addresses it may not be the first).
        crate::say!("served by {}", session.client.server());
    }
    Ok(0)
}

/// Sorts by the value `path` selects in each resource's JSON: numbers as numbers (before
/// text), text as text, resources without the value last; ties keep their order.
pub fn sort_by(
    codec: &proto::codec::Codec,
    resources: &mut Vec<Resource>,
    path: &crate::jsonpath::JsonPath,
) -> anyhow::Result<()> {
    #[derive(PartialEq, PartialOrd)]
    enum Key {
        Number(f64),
        Text(String),
        Missing,
    }
    let mut keyed = Vec::with_capacity(resources.len());
    for resource in resources.drain(..) {
        let value = codec.to_value(&resource)?;
        let text = path.render(&value);
        let key = match text.trim() {
            "" => Key::Missing,
            trimmed => match trimmed.parse::<f64>() {
                Ok(number) if number.is_finite() => Key::Number(number),
                _ => Key::Text(text),
            },
        };
        keyed.push((key, resource));
    }
    keyed.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
    resources.extend(keyed.into_iter().map(|(_, resource)| resource));
    Ok(())
}

#[cfg(test)]
mod tests {
    use proto::resource::v1::Tenancy;

    #[test]
    fn an_empty_listing_says_where_it_looked() {
        let in_default = Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        };
        let said = super::nothing_found("Artist", &in_default, false);
        assert!(
            said.contains("namespace default") && said.contains("-A"),
            "{said}"
        );
        assert_eq!(
            super::nothing_found("Partition", &Tenancy::default(), false),
            "no Partition found"
        );
        assert!(super::nothing_found("Artist", &in_default, true).contains("any tenancy"));
    }
}
