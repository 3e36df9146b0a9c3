//! `resctl auth can-i VERB TYPE [NAME]`: asks the server (`ClusterService.AclCheck`) whether the
//! token in use, or another token by its accessor, may do a verb on a resource, and prints
//! `yes` or `no` with the rule that decided. Exit 0 yes, 1 no.

use serde::Serialize;

use crate::cli::{AuthCommand, CanIArgs};
use crate::output::{self, OutputFormat};
use crate::session::Session;

/// One answer of the server.
#[derive(Debug, Clone, Serialize)]
pub struct CanI {
    pub allowed: bool,
    pub verb: String,
    #[serde(rename = "type")]
    pub resource_type: String,
    pub name: String,
    /// The token answered for (empty: the caller's own).
    pub token: String,
    pub reason: String,
}

pub async fn can_i(session: &Session, args: &CanIArgs) -> anyhow::Result<CanI> {
    let name = args.name.clone().unwrap_or_default();
    let id = session.id(&args.resource_type, &name).await?;
    let token = args.as_token.clone().unwrap_or_default();
    let answer = session.client.acl_check(&id, &args.verb, &token).await?;
    Ok(CanI {
        allowed: answer.allowed,
        verb: args.verb.clone(),
        resource_type: id
            .r#type
            .as_ref()
            .map(|t| format!("{}.{}.{}", t.group, t.group_version, t.kind))
            .unwrap_or_default(),
        name,
        token,
        // What the cluster says is printed: no control characters reach the terminal.
        reason: output::clean(&answer.reason).into_owned(),
    })
}

pub async fn run(session: &Session, command: AuthCommand) -> anyhow::Result<u8> {
    let AuthCommand::CanI(args) = command;
    // 1 is "no": an error (an unknown type, verb or token, an unreachable server) is 2.
    let answer = match can_i(session, &args).await {
        Ok(answer) => answer,
        Err(error) => {
            output::say_line(&format!("error: {error:#}"));
            return Ok(2);
        }
    };
    let text = match session.output {
        OutputFormat::Json | OutputFormat::JsonPath => output::json(&answer)?,
        OutputFormat::Yaml => output::yaml(&answer)?,
        _ => format!(
            "{}\n{}\n",
            if answer.allowed { "yes" } else { "no" },
            answer.reason
        ),
    };
    output::print(&text)?;
    Ok(if answer.allowed { 0 } else { 1 })
}
