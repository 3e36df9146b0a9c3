//! `resctl tui`: the dashboard (the `tui` crate) on this session's client.

use std::time::Duration;

use crate::cli::{GlobalArgs, TuiArgs};
use crate::session::Session;

pub async fn run(session: &Session, args: &TuiArgs, global: &GlobalArgs) -> anyhow::Result<u8> {
    if !(args.refresh.is_finite() && (0.2..=3600.0).contains(&args.refresh)) {
        return Err(crate::UsageError(format!(
            "--refresh {} is out of range: give seconds between 0.2 and 3600",
            args.refresh
        ))
        .into());
    }
    // Tenancy flags given explicitly narrow the table; otherwise it shows every tenancy.
    let mut start = Vec::new();
    if global.namespace.is_some() {
        start.push(format!("ns {}/{}", session.partition, session.namespace));
    } else if global.partition.is_some() {
        start.push(format!("ns {}", session.partition));
    }
    if let Some(resource_type) = &args.resource_type {
        start.push(resource_type.clone());
    }
    let options = tui::Options {
        refresh: Duration::from_secs_f64(args.refresh),
        start,
    };
    tui::run(session.client.clone(), options).await?;
    Ok(0)
}
