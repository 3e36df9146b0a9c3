//! `AclCheck` (DESIGN §17, `resctl auth can-i`): whether an identity may do a verb on a
//! resource, decided by the same hooks the resource service runs for that request, with the
//! rule that decided in words.

use proto::cluster::v1::AclCheckResponse;
use proto::resource::v1::Id;

use super::validate::Wildcards;
use super::{Error, ResourceService};
use crate::acl::Authorizer;

/// What a verb asks of the type's ACL hooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Read,
    List,
    Write,
}

impl Verb {
    fn parse(verb: &str) -> Result<Verb, Error> {
        Ok(match verb.to_ascii_lowercase().as_str() {
            "read" | "get" => Verb::Read,
            "list" | "watch" => Verb::List,
            "write" | "delete" | "create" | "update" | "patch" | "apply" => Verb::Write,
            "" => {
                return Err(Error::invalid(
                    "verb is required: read, list, write, delete or watch",
                ));
            }
            other => {
                return Err(Error::invalid(format!(
                    "verb {other:?} is not one of read, list, write, delete, watch (or get, create, update, patch)"
                )));
            }
        })
    }
}

impl ResourceService {
    /// Whether `subject` may do `verb` on `id`, as the resource service would decide that
    /// request now (before looking at what is stored: a type whose hooks also read the data,
    /// like a Type's schema ownership, says so in the reason).
    pub(crate) fn acl_check(
        &self,
        subject: &dyn Authorizer,
        id: Option<Id>,
        verb: &str,
    ) -> Result<AclCheckResponse, Error> {
        let verb = Verb::parse(verb)?;
        let mut id = id.ok_or_else(|| {
            Error::invalid("id is required: the type and tenancy (and name) to ask about")
        })?;
        let wildcards = match verb {
            Verb::List => Wildcards::Allowed,
            Verb::Read | Verb::Write => Wildcards::Forbidden,
        };
        let registration = self.scope_id(&mut id, "id", wildcards)?;
        if verb != Verb::List && id.name.is_empty() {
            return Err(Error::invalid(
                "id.name is required for read, write and delete (list and watch take none)",
            ));
        }
        let decided = match verb {
            Verb::Read => (registration.acls.read)(subject, &id, None),
            Verb::List => {
                (registration.acls.list)(subject, &id.tenancy.clone().unwrap_or_default())
            }
            Verb::Write => registration.check_write_access_before_existence(subject, &id),
        };
        let explained = subject.explain(&id);
        Ok(match decided {
            Ok(()) => AclCheckResponse {
                allowed: true,
                reason: match verb {
                    Verb::List => format!(
                        "listing is open: it returns only the objects the token may read ({explained})"
                    ),
                    _ if registration.gvk() == crate::registry::builtin::REGISTRY_TYPE
                        && verb == Verb::Write =>
                    {
                        format!(
                            "{explained}; writing a Type also needs `schema` write on what it claims"
                        )
                    }
                    _ => explained,
                },
            },
            Err(refused) => AclCheckResponse {
                allowed: false,
                reason: format!("{refused} ({explained})"),
            },
        })
    }
}
