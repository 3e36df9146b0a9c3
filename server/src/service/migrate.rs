//! Storage-version migration (DESIGN §15.1): once a Type's `storage_version` changes, the type
//! controller rewrites the objects stored in its other versions into the storage version, a
//! bounded number per pass. A pass is stateless — what is left is read from storage each time
//! — so a migration resumes wherever it stopped (a restart, a leader change, a restore), and
//! each object is rewritten once: the rewrite is a compare-and-swap on the version it read,
//! and a rewritten object is in the storage version, which no later pass touches.

use std::sync::Arc;

use futures::StreamExt as _;
use proto::resource::v1::{Resource, Tenancy};

use super::{Error, ResourceService, convert};
use crate::acl::AllowAll;
use crate::registry::Scope;
use crate::registry::versions::Family;
use crate::resource::{self, DisplayId};
use crate::storage::{Consistency, StorageError, UnversionedType};

/// Status key of a Type's storage-version migration (DESIGN §15.1).
pub(crate) const MIGRATION_STATUS: &str = "migration";
/// Who the rewrites are recorded as (watchers see it as the events' actor).
pub(crate) const MIGRATION_ACTOR: &str = "controller/type-migration";
/// Rewrites in flight at once within a pass.
const CONCURRENT_REWRITES: usize = 16;

/// Where a Type's migration stands after a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MigrationPass {
    /// Objects of the Type stored in its storage version.
    pub migrated: u64,
    /// Objects of the Type stored in another of its versions.
    pub remaining: u64,
    /// The first object a pass could not convert, and why (it stays where it is).
    pub failed: Option<String>,
    /// The uids of the objects this pass could not convert (the next passes skip them, so the
    /// others go on).
    pub failing: Vec<String>,
}

impl ResourceService {
    /// One pass of the migration of the Type resource `type_name`: rewrites at most
    /// `max_rewrites` objects stored in another of its versions into its storage version,
    /// keeping their uid, generation, metadata, owner and statuses. `None` when the Type is not
    /// installed here or has one version (nothing to migrate).
    pub(crate) async fn migrate_pass(
        &self,
        type_name: &str,
        max_rewrites: usize,
        skip: &std::collections::HashSet<String>,
    ) -> Result<Option<MigrationPass>, Error> {
        let Some(installed) = self.registry.dynamic().installed(type_name) else {
            return Ok(None);
        };
        if !installed.family.converts() || installed.deleting {
            return Ok(None);
        }
        let family = installed.family.clone();
        let storage = family.storage_version().compiled.resource_type.clone();
        let Some(registration) = self.registry.resolve_stored(&storage) else {
            return Ok(None);
        };
        let everywhere = every_tenancy(registration.scope);
        // Read in place: only the version of each object is looked at, and only the objects a
        // pass rewrites are kept (a pass over a million objects holds at most a pass's worth).
        let mut scan = Scan {
            storage: storage.group_version.as_bytes().to_vec(),
            family: &family,
            max: max_rewrites,
            migrated: 0,
            remaining: 0,
            picked: Vec::new(),
            failed: None,
            skip,
        };
        self.backend
            .list_encoded(
                Consistency::Strong,
                &UnversionedType::of(&storage),
                &everywhere,
                "",
                None,
                &mut scan,
            )
            .await?;
        if let Some(error) = scan.failed {
            return Err(error.into());
        }
        let migrated = scan.migrated;
        let remaining = scan.remaining;
        let behind: Vec<Resource> = scan
            .picked
            .iter()
            .map(|bytes| {
                <Resource as prost::Message>::decode(bytes.as_slice())
                    .map_err(crate::storage::undecodable)
            })
            .collect::<Result<_, _>>()?;
        let fence = Self::fence(&AllowAll, &registration, None);
        let (fence, family) = (&fence, &family);
        let to = storage.group_version.as_str();
        let outcomes: Vec<Result<bool, (String, String)>> = futures::stream::iter(behind)
            .map(|stored| async move {
                let uid = stored
                    .id
                    .as_ref()
                    .map(|id| id.uid.clone())
                    .unwrap_or_default();
                self.rewrite(family, stored, to, fence)
                    .await
                    .map_err(|why| (uid, why))
            })
            .buffer_unordered(CONCURRENT_REWRITES)
            .collect()
            .await;
        let mut pass = MigrationPass {
            migrated,
            remaining,
            failed: None,
            failing: Vec::new(),
        };
        for outcome in outcomes {
            match outcome {
                Ok(true) => {
                    pass.migrated += 1;
                    pass.remaining -= 1;
                }
                Ok(false) => {}
                Err((uid, why)) => {
                    pass.failed.get_or_insert(why);
                    pass.failing.push(uid);
                }
            }
        }
        Ok(Some(pass))
    }
}

/// Counts a Type's objects by the version they are stored in, keeping the encodings of the first
/// `max` stored in another of its versions.
struct Scan<'a> {
    storage: Vec<u8>,
    family: &'a Family,
    max: usize,
    migrated: u64,
    remaining: u64,
    picked: Vec<Vec<u8>>,
    failed: Option<StorageError>,
    /// Objects (uids) not to pick: they failed to convert in an earlier pass.
    skip: &'a std::collections::HashSet<String>,
}

impl crate::storage::EncodedSink for Scan<'_> {
    fn take(&mut self, encoded: &[u8]) -> std::ops::ControlFlow<()> {
        let version = match crate::wire::proto::encoded_group_version(encoded) {
            Ok(version) => version.unwrap_or_default(),
            Err(error) => {
                self.failed = Some(error);
                return std::ops::ControlFlow::Break(());
            }
        };
        if version == self.storage.as_slice() {
            self.migrated += 1;
        } else if std::str::from_utf8(version)
            .ok()
            .and_then(|version| self.family.version(version))
            .is_some()
        {
            self.remaining += 1;
            if self.picked.len() < self.max {
                let skipped = !self.skip.is_empty()
                    && <crate::wire::proto::IdOnly as prost::Message>::decode(encoded)
                        .ok()
                        .and_then(|head| head.id)
                        .is_some_and(|id| self.skip.contains(&id.uid));
                if !skipped {
                    self.picked.push(encoded.to_vec());
                }
            }
        }
        std::ops::ControlFlow::Continue(())
    }
}

impl ResourceService {
    /// Rewrites one object in the storage version `to`: `true` when it did; `false` when the
    /// object changed or went meanwhile (the next pass sees it as it is now); an error says
    /// why it cannot be converted.
    async fn rewrite(
        &self,
        family: &Arc<Family>,
        stored: Resource,
        to: &str,
        fence: &crate::storage::Fence,
    ) -> Result<bool, String> {
        let name = DisplayId(stored.id.as_ref().unwrap_or(&Default::default())).to_string();
        let bytes = stored.data.as_ref().map_or(0, |d| d.value.len());
        let converted = if family.converts_inline(bytes) {
            convert::convert(family, stored, to, None)
        } else {
            let (family, to) = (family.clone(), to.to_owned());
            self.pool
                .run(move || convert::convert(&family, stored, &to, None))
                .await
                .map_err(|error| Error::Internal(error.to_string()))
                .and_then(|converted| converted)
        }
        .map_err(|error| format!("{name}: {error}"))?;
        let size = prost::Message::encoded_len(&converted);
        if size > self.max_resource_bytes {
            return Err(format!(
                "{name}: in {to} it is {size} bytes encoded, over the limit of {} bytes",
                self.max_resource_bytes
            ));
        }
        match self
            .backend
            .write_cas_as(converted, MIGRATION_ACTOR, fence)
            .await
        {
            Ok(_) => Ok(true),
            Err(
                StorageError::CasFailure
                | StorageError::WrongUid
                | StorageError::NotFound
                | StorageError::Fenced(_),
            ) => Ok(false),
            Err(error) => Err(format!("{name}: {error}")),
        }
    }
}

/// The tenancy that covers every object of a type of `scope` (its parts wildcards).
pub(super) fn every_tenancy(scope: Scope) -> Tenancy {
    match scope {
        Scope::Cluster => Tenancy::default(),
        Scope::Partition => Tenancy {
            partition: resource::WILDCARD.into(),
            namespace: String::new(),
        },
        Scope::Namespace | Scope::Any => Tenancy {
            partition: resource::WILDCARD.into(),
            namespace: resource::WILDCARD.into(),
        },
    }
}
