//! `resctl get TYPE [NAME]`: list resources of a type (sorted by tenancy and name) or show one.

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
    let info = session.resolve_type(type_name).await?;
    let tenancy = session.tenancy(info.scope(), all_tenancies);
    let resource_type = info.r#type.clone().unwrap_or_default();
    let mut resources = session
        .client
        .list(&resource_type, &tenancy, prefix)
        .await
        .with_context(|| format!("cannot list {}", proto::codec::gvk(&resource_type)))?;
    resources.sort_by_key(|resource| {
        let id = resource.id.clone().unwrap_or_default();
        let tenancy = id.tenancy.unwrap_or_default();
        (tenancy.partition, tenancy.namespace, id.name)
    });
    Ok(resources)
}

pub async fn run(session: &Session, args: &GetArgs) -> anyhow::Result<u8> {
    let codec = session.codec().await?;
    let text = match &args.name {
        Some(name) => {
            let resource = read(session, &args.resource_type, name).await?;
            output::render_resources(codec, &[resource], session.output, true)?
        }
        None => {
            let resources = list(
                session,
                &args.resource_type,
                args.all_namespaces,
                args.prefix.as_deref().unwrap_or(""),
            )
            .await?;
            if resources.is_empty() && !session.output.is_structured() {
                eprintln!("no {} found", args.resource_type);
                return Ok(0);
            }
            output::render_resources(codec, &resources, session.output, false)?
        }
    };
    output::print(&text)?;
    if session.output == output::OutputFormat::Wide {
        // Which member answered (with several --server addresses it may not be the first).
        eprintln!("served by {}", session.client.server());
    }
    Ok(0)
}
