//! `resctl context`: list, select, create and delete named servers in the contexts file.

use anyhow::Context as _;

use crate::cli::ContextCommand;
use crate::context::{ContextEntry, ContextsFile};
use crate::output::{self, OutputFormat, Table};

pub fn run(command: ContextCommand, format: OutputFormat) -> anyhow::Result<u8> {
    let path = crate::context::path()
        .context("cannot locate the contexts file: set RESCTL_CONFIG or HOME")?;
    let mut file = ContextsFile::load(&path)?;
    match command {
        ContextCommand::List => {
            let text = match format {
                OutputFormat::Json | OutputFormat::JsonPath => output::json(&file)?,
                OutputFormat::Yaml => output::yaml(&file)?,
                OutputFormat::Name => file
                    .contexts
                    .keys()
                    .map(|name| format!("{name}\n"))
                    .collect(),
                OutputFormat::Table | OutputFormat::Wide | OutputFormat::CustomColumns => {
                    if file.contexts.is_empty() {
                        format!(
                            "no contexts in {}; add one with `resctl context set NAME --to-server HOST:PORT`\n",
                            path.display()
                        )
                    } else {
                        let mut table = Table::new([
                            "CURRENT",
                            "NAME",
                            "SERVER",
                            "PARTITION",
                            "NAMESPACE",
                            "TOKEN",
                            "TLS",
                        ]);
                        for (name, entry) in &file.contexts {
                            let current = file.current.as_deref() == Some(name.as_str());
                            table.row([
                                if current { "*" } else { "" }.to_owned(),
                                name.clone(),
                                entry.server.clone().unwrap_or_else(|| "-".into()),
                                entry.partition.clone().unwrap_or_else(|| "-".into()),
                                entry.namespace.clone().unwrap_or_else(|| "-".into()),
                                if entry.token.is_some() { "set" } else { "-" }.to_owned(),
                                match (&entry.ca_cert, &entry.client_cert) {
                                    (Some(_), Some(_)) => "mutual",
                                    (Some(_), None) => "on",
                                    _ => "-",
                                }
                                .to_owned(),
                            ]);
                        }
                        table.render()
                    }
                }
            };
            output::print(&text)?;
        }
        ContextCommand::Use { name } => {
            file.select(Some(&name))?;
            file.current = Some(name.clone());
            file.save(&path)?;
            output::print(&format!("now using context {name}\n"))?;
        }
        ContextCommand::Set(args) => {
            if let Some(timeout) = args.request_timeout.as_deref().filter(|t| !t.is_empty()) {
                crate::cli::parse_duration(timeout)
                    .map_err(|why| crate::UsageError(format!("--to-request-timeout: {why}")))?;
            }
            let entry = file
                .contexts
                .entry(args.name.clone())
                .or_insert_with(ContextEntry::default);
            for (field, value) in [
                (&mut entry.server, args.server),
                (&mut entry.token, args.token),
                (&mut entry.partition, args.partition),
                (&mut entry.namespace, args.namespace),
                (&mut entry.ca_cert, args.ca_cert.map(absolute)),
                (&mut entry.client_cert, args.client_cert.map(absolute)),
                (&mut entry.client_key, args.client_key.map(absolute)),
                (&mut entry.request_timeout, args.request_timeout),
            ] {
                if let Some(value) = value {
                    *field = Some(value).filter(|v| !v.is_empty());
                }
            }
            if file.current.is_none() {
                file.current = Some(args.name.clone());
            }
            file.save(&path)?;
            output::print(&format!(
                "context {} saved in {}\n",
                args.name,
                path.display()
            ))?;
        }
        ContextCommand::Remove { name } => {
            if file.contexts.remove(&name).is_none() {
                anyhow::bail!("context {name:?} does not exist");
            }
            if file.current.as_deref() == Some(name.as_str()) {
                file.current = None;
            }
            file.save(&path)?;
            output::print(&format!("context {name} removed\n"))?;
        }
    }
    Ok(0)
}

/// A file path as given, made absolute against the current directory (a context is used from
/// anywhere); `~/` is expanded. An empty value (which clears the field) stays empty.
fn absolute(path: String) -> String {
    if path.is_empty() {
        return path;
    }
    let expanded = crate::context::expand_home(&path);
    std::path::absolute(&expanded)
        .unwrap_or(expanded)
        .display()
        .to_string()
}
