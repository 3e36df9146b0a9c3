//! `resctl acl bootstrap|whoami|token create|list|delete|policies`: the ACL system is made of
//! resources (`acl.v1.Token`, `acl.v1.Policy`); these commands are the short ways to the common
//! steps, and print secrets only when they are made.

use std::time::Duration;

use proto::acl::v1 as acl;
use proto::resource::v1::{Id, Resource, Tenancy, Type};
use serde::Serialize;

use crate::cli::{AclCommand, AclTokenCommand, TokenCreateArgs};
use crate::output::{self, OutputFormat, Table};
use crate::session::Session;

fn acl_type(kind: &str) -> Type {
    Type {
        group: "acl".into(),
        group_version: "v1".into(),
        kind: kind.into(),
    }
}

fn token_id(name: &str) -> Id {
    Id {
        uid: String::new(),
        name: name.to_owned(),
        r#type: Some(acl_type("Token")),
        tenancy: Some(Tenancy::default()),
    }
}

/// A duration such as `90s`, `30m`, `12h` or `7d`.
pub fn parse_duration(text: &str) -> anyhow::Result<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| anyhow::anyhow!("{text:?} is not a duration such as 30m, 12h or 7d"))?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => anyhow::bail!("{text:?}: the unit must be s, m, h or d (e.g. 30m, 12h, 7d)"),
    };
    if number == 0 {
        anyhow::bail!("{text:?}: the duration must be more than zero");
    }
    Ok(Duration::from_secs(number.saturating_mul(seconds)))
}

/// What `token list` shows of a token.
#[derive(Debug, Clone, Serialize)]
pub struct TokenView {
    pub accessor: String,
    pub policies: Vec<String>,
    pub expires_at: String,
    pub description: String,
}

/// What `token create` and `bootstrap` print.
#[derive(Debug, Clone, Serialize)]
pub struct SecretView {
    pub accessor: String,
    pub secret: String,
}

fn decode<M: prost::Message + Default>(resource: &Resource) -> anyhow::Result<M> {
    let data = resource
        .data
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("the server sent a resource without data"))?;
    Ok(M::decode(data.value.as_slice())?)
}

pub async fn create_token(session: &Session, args: &TokenCreateArgs) -> anyhow::Result<SecretView> {
    let secret =
        proto::tls::new_secret().map_err(|why| anyhow::anyhow!("cannot make a secret: {why}"))?;
    let expires_at = match &args.expires_in {
        None => String::new(),
        Some(text) => {
            let after = parse_duration(text)?;
            let at = time::OffsetDateTime::now_utc()
                + time::Duration::try_from(after)
                    .map_err(|_| anyhow::anyhow!("--expires-in {text} is too long"))?;
            at.replace_nanosecond(0)
                .unwrap_or(at)
                .format(&time::format_description::well_known::Rfc3339)?
        }
    };
    let token = acl::Token {
        description: args.description.clone(),
        policies: args.policies.clone(),
        expires_at,
        secret: secret.clone(),
        secret_hash: String::new(),
    };
    let existing = session.client.read(&token_id(&args.name)).await?;
    if existing.is_some() {
        anyhow::bail!(
            "token {} already exists; delete it first (`resctl acl token delete {}`) or choose another name",
            args.name,
            args.name
        );
    }
    session
        .client
        .write(&Resource {
            id: Some(token_id(&args.name)),
            data: Some(proto::to_any(&token)),
            ..Default::default()
        })
        .await?;
    Ok(SecretView {
        accessor: args.name.clone(),
        secret,
    })
}

pub async fn list_tokens(session: &Session) -> anyhow::Result<Vec<TokenView>> {
    let resources = session
        .client
        .list(&acl_type("Token"), &Tenancy::default(), "")
        .await?;
    resources
        .iter()
        .map(|resource| {
            let token: acl::Token = decode(resource)?;
            Ok(TokenView {
                accessor: resource
                    .id
                    .as_ref()
                    .map(|id| id.name.clone())
                    .unwrap_or_default(),
                policies: token.policies,
                expires_at: token.expires_at,
                description: token.description,
            })
        })
        .collect()
}

fn print_secret(session: &Session, view: &SecretView, what: &str) -> anyhow::Result<String> {
    Ok(match session.output {
        OutputFormat::Json | OutputFormat::JsonPath => output::json(view)?,
        OutputFormat::Yaml => output::yaml(view)?,
        OutputFormat::Name => format!("{}\n", view.secret),
        _ => format!(
            "{what}\naccessor  {}\nsecret    {}\n\nThe secret is shown only now: keep it (resctl --token, RESD_TOKEN, or `resctl context set NAME --to-token`).\n",
            view.accessor, view.secret
        ),
    })
}

pub async fn run(session: &Session, command: AclCommand) -> anyhow::Result<u8> {
    let text = match command {
        AclCommand::Bootstrap => {
            let response = session.client.acl_bootstrap().await?;
            let view = SecretView {
                accessor: response.accessor,
                secret: response.secret,
            };
            print_secret(
                session,
                &view,
                "ACLs bootstrapped: this token manages everything.",
            )?
        }
        AclCommand::Whoami => {
            let me = session.client.acl_who_am_i().await?;
            match session.output {
                OutputFormat::Json | OutputFormat::JsonPath | OutputFormat::Yaml => {
                    #[derive(Serialize)]
                    struct WhoAmI {
                        acls_enabled: bool,
                        accessor: String,
                        policies: Vec<String>,
                        expires_at: String,
                    }
                    let view = WhoAmI {
                        acls_enabled: me.acls_enabled,
                        accessor: me.accessor,
                        policies: me.policies,
                        expires_at: me.expires_at,
                    };
                    if session.output != OutputFormat::Yaml {
                        output::json(&view)?
                    } else {
                        output::yaml(&view)?
                    }
                }
                OutputFormat::Name => format!("{}\n", me.accessor),
                _ if !me.acls_enabled => {
                    "ACLs are disabled on this server: every request is allowed.\n".to_owned()
                }
                _ => {
                    let mut table = Table::new(["FIELD", "VALUE"]);
                    table.row(["accessor".to_owned(), me.accessor]);
                    table.row(["policies".to_owned(), me.policies.join(", ")]);
                    table.row([
                        "expires".to_owned(),
                        if me.expires_at.is_empty() {
                            "never".to_owned()
                        } else {
                            me.expires_at
                        },
                    ]);
                    table.render()
                }
            }
        }
        AclCommand::Token(AclTokenCommand::Create(args)) => {
            let view = create_token(session, &args).await?;
            print_secret(session, &view, &format!("token {} created.", view.accessor))?
        }
        AclCommand::Token(AclTokenCommand::List) => {
            let tokens = list_tokens(session).await?;
            match session.output {
                OutputFormat::Json | OutputFormat::JsonPath => output::json(&tokens)?,
                OutputFormat::Yaml => output::yaml(&tokens)?,
                OutputFormat::Name => tokens.iter().map(|t| format!("{}\n", t.accessor)).collect(),
                _ => {
                    let mut table = Table::new(["ACCESSOR", "POLICIES", "EXPIRES", "DESCRIPTION"]);
                    for token in &tokens {
                        table.row([
                            token.accessor.clone(),
                            token.policies.join(","),
                            if token.expires_at.is_empty() {
                                "never".to_owned()
                            } else {
                                token.expires_at.clone()
                            },
                            token.description.clone(),
                        ]);
                    }
                    table.render()
                }
            }
        }
        AclCommand::Token(AclTokenCommand::Delete { name }) => {
            let Some(stored) = session.client.read(&token_id(&name)).await? else {
                anyhow::bail!("token {name} does not exist (`resctl acl token list` shows them)");
            };
            session
                .client
                .delete(stored.id.as_ref().unwrap_or(&token_id(&name)), "")
                .await?;
            format!("token {name} deleted\n")
        }
        AclCommand::Policies => {
            let policies = session
                .client
                .list(&acl_type("Policy"), &Tenancy::default(), "")
                .await?;
            let mut table = Table::new(["POLICY", "RULES", "OPERATOR", "DESCRIPTION"]);
            table.row([
                "global-management".to_owned(),
                "* (built in)".to_owned(),
                "write".to_owned(),
                "Allows everything".to_owned(),
            ]);
            for resource in &policies {
                let policy: acl::Policy = decode(resource)?;
                table.row([
                    resource
                        .id
                        .as_ref()
                        .map(|id| id.name.clone())
                        .unwrap_or_default(),
                    policy.rules.len().to_string(),
                    match acl::Access::try_from(policy.operator) {
                        Ok(acl::Access::Unspecified) | Err(_) => "-".to_owned(),
                        Ok(access) => access
                            .as_str_name()
                            .trim_start_matches("ACCESS_")
                            .to_lowercase(),
                    },
                    policy.description.clone(),
                ]);
            }
            table.render()
        }
    };
    output::print(&text)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_a_number_and_a_unit() {
        assert_eq!(parse_duration("90s").expect("s"), Duration::from_secs(90));
        assert_eq!(parse_duration("30m").expect("m"), Duration::from_secs(1800));
        assert_eq!(
            parse_duration("12h").expect("h"),
            Duration::from_secs(43_200)
        );
        assert_eq!(
            parse_duration("7d").expect("d"),
            Duration::from_secs(604_800)
        );
        assert!(parse_duration("7").is_err());
        assert!(parse_duration("0h").is_err());
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("3w").is_err());
    }
}
