//! What a node decides from, as projections of its committed state (DESIGN §15,
//! `storage::projection`): the registry's registered types, the ACL tokens and policies, and
//! the clock of replica reports. Each is changed only here, by storage, in apply — never from a
//! watch of the node's own data — so every node holds exactly what it has applied.

use std::sync::Arc;

use proto::resource::v1::Resource;

use crate::acl::TokenStore;
use crate::registry::DynamicTypes;
use crate::storage::{Domain, Operation, Projection, UnversionedType, Version, WatchEvent};

use super::cluster::external::{self, ReportClock};

/// The registry's dynamic part over the stored `registry.v1.Type` resources.
pub(crate) struct Types(pub(crate) Arc<DynamicTypes>);

impl Projection for Types {
    fn name(&self) -> &'static str {
        "registry"
    }

    fn follows(&self) -> Vec<UnversionedType> {
        vec![UnversionedType::of(
            &crate::registry::builtin::registry_type(),
        )]
    }

    fn apply(&self, event: &WatchEvent, version: Version) {
        match &event.operation {
            Operation::Upsert(stored) => self.0.install(stored, version),
            Operation::Delete(stored) => {
                if let Some(id) = &stored.id {
                    self.0.uninstall(&id.name, version);
                }
            }
            Operation::EndOfSnapshot | Operation::Bookmark => {}
        }
    }

    fn reset(&self, stored: Vec<Resource>, revision: &dyn Fn(Domain) -> Version) {
        self.0.reset(&stored, revision(Domain::Types));
    }
}

/// The admission policies over the stored `policy.v1.AdmissionPolicy` resources.
pub(crate) struct Policies(pub(crate) Arc<crate::registry::policies::PolicyStore>);

impl Projection for Policies {
    fn name(&self) -> &'static str {
        "admission policies"
    }

    fn follows(&self) -> Vec<UnversionedType> {
        vec![UnversionedType {
            group: "policy".into(),
            kind: "AdmissionPolicy".into(),
        }]
    }

    fn apply(&self, event: &WatchEvent, version: Version) {
        match &event.operation {
            Operation::Upsert(stored) => self.0.install(stored, version),
            Operation::Delete(stored) => {
                if let Some(id) = &stored.id {
                    self.0.uninstall(&id.name, version);
                }
            }
            Operation::EndOfSnapshot | Operation::Bookmark => {}
        }
    }

    fn reset(&self, stored: Vec<Resource>, revision: &dyn Fn(Domain) -> Version) {
        self.0.reset(&stored, revision(Domain::Policies));
    }
}

/// A node's token store over the stored `acl.v1.Token` and `acl.v1.Policy` resources.
pub(crate) struct Acl(pub(crate) Arc<TokenStore>);

impl Projection for Acl {
    fn name(&self) -> &'static str {
        "acl"
    }

    fn follows(&self) -> Vec<UnversionedType> {
        ["Policy", "Token"]
            .into_iter()
            .map(|kind| UnversionedType {
                group: "acl".into(),
                kind: kind.into(),
            })
            .collect()
    }

    fn apply(&self, event: &WatchEvent, version: Version) {
        match &event.operation {
            Operation::Upsert(stored) => self.0.changed(stored, true, version),
            Operation::Delete(stored) => self.0.changed(stored, false, version),
            Operation::EndOfSnapshot | Operation::Bookmark => {}
        }
    }

    fn reset(&self, stored: Vec<Resource>, revision: &dyn Fn(Domain) -> Version) {
        self.0.reset(&stored, revision(Domain::Acl));
    }
}

/// When each external replica's report was first seen at its version, on this node
/// (`ListControllers` calls a silent one stale).
pub(crate) struct Reports(pub(crate) Arc<ReportClock>);

impl Projection for Reports {
    fn name(&self) -> &'static str {
        "replica reports"
    }

    fn follows(&self) -> Vec<UnversionedType> {
        vec![UnversionedType {
            group: "coordination".into(),
            kind: "Replica".into(),
        }]
    }

    fn apply(&self, event: &WatchEvent, _version: Version) {
        match &event.operation {
            Operation::Upsert(stored) => self.0.saw(&external::key_of(stored), &stored.version),
            Operation::Delete(stored) => self.0.forget(&external::key_of(stored)),
            Operation::EndOfSnapshot | Operation::Bookmark => {}
        }
    }

    fn reset(&self, stored: Vec<Resource>, _revision: &dyn Fn(Domain) -> Version) {
        let keys = stored.iter().map(external::key_of).collect();
        self.0.keep_only(&keys);
        for item in &stored {
            self.0.saw(&external::key_of(item), &item.version);
        }
    }
}
