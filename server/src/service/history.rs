//! An object's history (DESIGN §18): `ListHistory` and `Read { at_version }`, over what storage
//! keeps (`storage::history`). Reading it needs read on the object, as it is or as it last was;
//! every entry must be the named object's (a uid of another object names nothing here).

use proto::resource::v1::{
    HistoryEntry, Id, ListHistoryRequest, ListHistoryResponse, ReadRequest, ReadResponse, Resource,
    history_entry,
};

use super::{Error, ResourceService, convert};
use crate::acl::Authorizer;
use crate::registry::Registration;
use crate::resource::DisplayId;
use crate::storage::history::MAX_PAGE;
use crate::storage::{Consistency, StorageError, Version};

/// Entries a page holds when the request names no limit.
const DEFAULT_PAGE: usize = 100;
/// Bytes a page holds at most (one entry at least).
const MAX_PAGE_BYTES: usize = 4 << 20;

/// Whether `resource` (a history entry's) is the object `id` names: its type (any version),
/// tenancy and name.
fn same_object(id: &Id, resource: Option<&Resource>) -> bool {
    let Some(found) = resource.and_then(|r| r.id.as_ref()) else {
        return false;
    };
    let kind = |id: &Id| {
        id.r#type
            .as_ref()
            .map(|t| (t.group.clone(), t.kind.clone()))
    };
    kind(found) == kind(id) && found.tenancy == id.tenancy && found.name == id.name
}

fn parse_version(field: &str, text: &str) -> Result<Version, Error> {
    text.parse::<Version>()
        .map_err(|why| Error::invalid(format!("{field}: {why}")))
}

/// The page token of a history page that stops before `version` (its last entry's).
fn token_of(version: &str) -> String {
    format!("h{version}")
}

fn before_of(token: &str) -> Result<Option<Version>, Error> {
    if token.is_empty() {
        return Ok(None);
    }
    let version = token.strip_prefix('h').ok_or_else(|| {
        Error::invalid("page_token: not a token this server issued for ListHistory")
    })?;
    parse_version("page_token", version).map(Some)
}

impl ResourceService {
    /// The checks before a history read: the id, the read grant (whether it needs the object),
    /// the tenancy; then the uid named (an empty one: the current object's).
    async fn history_target(
        &self,
        authorizer: &dyn Authorizer,
        consistency: Consistency,
        id: Option<Id>,
    ) -> Result<(Id, std::sync::Arc<Registration>, bool, String), Error> {
        let (id, registration) = self.check_request_id(id, "id")?;
        let needs_resource = super::read::read_grant(&registration, authorizer, &id)?;
        let uid = if id.uid.is_empty() {
            // Any version: the object is the same whichever version stores it.
            match self.backend.read(consistency, &id).await {
                Ok(resource) => resource.id.map(|id| id.uid).unwrap_or_default(),
                Err(StorageError::GroupVersionMismatch { stored }) => {
                    stored.id.map(|id| id.uid).unwrap_or_default()
                }
                Err(StorageError::NotFound) => {
                    return Err(Error::NotFound(format!(
                        "resource not found: {} (a deleted object's history is read by its uid \
                         while its retention lasts: `resctl history TYPE NAME --uid UID`)",
                        DisplayId(&id)
                    )));
                }
                Err(error) => return Err(error.into()),
            }
        } else {
            id.uid.clone()
        };
        Ok((id, registration, needs_resource, uid))
    }

    /// Refuses entries that are not `id`'s, and — when the type's read grant depends on the
    /// object — a caller who may not read it as it last was (`newest`). Keeps of `entries`
    /// those the caller may read as they were stored: a grant on the version asked for does
    /// not open another version's (DESIGN §12.3), so an entry stored in a version the caller
    /// may not read is left out.
    fn check_entries(
        &self,
        authorizer: &dyn Authorizer,
        registration: &Registration,
        id: &Id,
        needs_resource: bool,
        newest: Option<&HistoryEntry>,
        entries: Vec<HistoryEntry>,
    ) -> Result<Vec<HistoryEntry>, Error> {
        let not_found = || Error::NotFound(format!("no history of {}", DisplayId(id)));
        if entries
            .iter()
            .chain(newest)
            .any(|entry| !same_object(id, entry.resource.as_ref()))
        {
            return Err(not_found());
        }
        if needs_resource {
            let Some(last) = newest.and_then(|entry| entry.resource.as_ref()) else {
                return Err(not_found());
            };
            let last_id = last.id.clone().unwrap_or_default();
            (registration.acls.read)(authorizer, &last_id, Some(last))?;
        }
        let asked = registration.resource_type.group_version.as_str();
        Ok(entries
            .into_iter()
            .filter(|entry| {
                let Some(resource) = entry.resource.as_ref() else {
                    return false;
                };
                if convert::group_version_of(resource) == asked && !needs_resource {
                    return true;
                }
                let stored_id = resource.id.clone().unwrap_or_default();
                (registration.acls.read)(authorizer, &stored_id, Some(resource)).is_ok()
            })
            .collect())
    }

    pub(crate) async fn list_history(
        &self,
        authorizer: &dyn Authorizer,
        consistency: Consistency,
        request: ListHistoryRequest,
    ) -> Result<ListHistoryResponse, Error> {
        let before = before_of(&request.page_token)?;
        let limit = match request.limit as usize {
            0 => DEFAULT_PAGE,
            n => n.min(MAX_PAGE),
        };
        let (id, registration, needs_resource, uid) = self
            .history_target(authorizer, consistency, request.id)
            .await?;
        let mut page = self
            .backend
            .history(consistency, &uid, before, limit + 1)
            .await?;
        // Authorized on the object as it last was: the newest entry of all, not of this page.
        let newest = match (before, page.entries.first()) {
            (None, Some(first)) => Some(first.clone()),
            _ => self
                .backend
                .history(consistency, &uid, None, 1)
                .await?
                .entries
                .pop(),
        };
        if newest.is_none() {
            return Err(Error::NotFound(format!(
                "no history of {} (uid {uid:?}): its type keeps none, or its retention ended",
                DisplayId(&id)
            )));
        }
        let mut more = page.entries.len() > limit;
        page.entries.truncate(limit);
        // A page is bounded in bytes too (a Type may keep megabytes per object): at least one
        // entry, then as many as fit.
        let mut bytes = 0usize;
        let mut fits = 0usize;
        for entry in &page.entries {
            bytes += prost::Message::encoded_len(entry);
            if fits > 0 && bytes > MAX_PAGE_BYTES {
                break;
            }
            fits += 1;
        }
        if fits < page.entries.len() {
            page.entries.truncate(fits);
            more = true;
        }
        let last = page.entries.last().map(|entry| entry.version.clone());
        let entries = self.check_entries(
            authorizer,
            &registration,
            &id,
            needs_resource,
            newest.as_ref(),
            page.entries,
        )?;
        let next_page_token = match (more, last) {
            (true, Some(version)) => token_of(&version),
            _ => String::new(),
        };
        Ok(ListHistoryResponse {
            entries,
            next_page_token,
        })
    }

    /// A Read with `at_version`: the object as it was then, from its history (converted to the
    /// version asked for where its Type converts).
    pub(super) async fn read_at(
        &self,
        authorizer: &dyn Authorizer,
        consistency: Consistency,
        request: ReadRequest,
    ) -> Result<ReadResponse, Error> {
        let at = parse_version("at_version", &request.at_version)?;
        let (id, registration, needs_resource, uid) = self
            .history_target(authorizer, consistency, request.id)
            .await?;
        // The newest entry at or before `at`.
        let before = match at.position.checked_add(1) {
            Some(position) => Version::at(at.index, position),
            None => Version::new(at.index.saturating_add(1)),
        };
        let page = self
            .backend
            .history(consistency, &uid, Some(before), 1)
            .await?;
        let newest = self
            .backend
            .history(consistency, &uid, None, 1)
            .await?
            .entries
            .pop();
        let mut page = page;
        let found = page.entries.len();
        page.entries = self.check_entries(
            authorizer,
            &registration,
            &id,
            needs_resource,
            newest.as_ref(),
            std::mem::take(&mut page.entries),
        )?;
        if page.entries.len() < found {
            return Err(Error::PermissionDenied(format!(
                "{} was stored at version {at} in a version of its type this token may not read",
                DisplayId(&id)
            )));
        }
        if newest.is_none() {
            return Err(Error::OutOfRange(format!(
                "{} keeps no history at version {at}: its type keeps none, or its retention ended",
                DisplayId(&id)
            )));
        }
        let Some(entry) = page.entries.first() else {
            // Nothing kept at or before `at`: created later, or what was then is dropped.
            return Err(if page.dropped {
                Error::OutOfRange(format!(
                    "{}: version {at} is older than its history keeps; the oldest kept is {}",
                    DisplayId(&id),
                    page.oldest.as_deref().unwrap_or("none")
                ))
            } else {
                Error::NotFound(format!(
                    "{} did not exist at version {at}: it was created later (at version {})",
                    DisplayId(&id),
                    page.oldest.as_deref().unwrap_or("none")
                ))
            });
        };
        if entry.operation == history_entry::Operation::Delete as i32 {
            return Err(Error::NotFound(format!(
                "{} did not exist at version {at}: it was deleted at version {} by {}",
                DisplayId(&id),
                entry.version,
                entry.actor
            )));
        }
        let resource = entry.resource.clone().unwrap_or_default();
        let resource = if convert::group_version_of(&resource)
            != registration.resource_type.group_version
            && convert::converts_from(&registration, convert::group_version_of(&resource))
        {
            self.converted_read(authorizer, &registration, resource)
                .await?
        } else {
            resource
        };
        Ok(ReadResponse {
            resource: Some(resource),
        })
    }
}

/// Which history each type keeps (storage's [`crate::storage::history::HistoryPolicy`]): a
/// registered type's Type says (`data.history`), built-in types keep what the agent's
/// `--history-*` flags say.
#[derive(Debug)]
pub(crate) struct TypeHistory {
    registry: std::sync::Arc<crate::registry::Registry>,
    builtin: crate::resource::Retention,
    node_bytes: u64,
}

impl TypeHistory {
    pub(crate) fn new(
        registry: std::sync::Arc<crate::registry::Registry>,
        builtin: crate::resource::Retention,
        node_bytes: u64,
    ) -> Self {
        TypeHistory {
            registry,
            builtin,
            node_bytes,
        }
    }
}

/// Built-in types whose objects keep no history: the server's bookkeeping and heartbeats
/// (tombstones, leases renewed every few seconds, replica reports, events whose count rises
/// with every occurrence) — a history of them is noise that would crowd out the node's bound.
const NO_HISTORY: [(&str, &str); 4] = [
    ("internal", "Tombstone"),
    ("coordination", "Lease"),
    ("coordination", "Replica"),
    ("events", "Event"),
];

impl crate::storage::history::HistoryPolicy for TypeHistory {
    fn retention(&self, group: &str, kind: &str) -> crate::resource::Retention {
        if NO_HISTORY.contains(&(group, kind)) {
            return crate::resource::Retention::OFF;
        }
        self.registry
            .history_of(group, kind)
            .unwrap_or(self.builtin)
    }

    fn node_bytes(&self) -> u64 {
        self.node_bytes
    }
}
