//! Read, List, ListByOwner and WatchList.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use proto::resource::v1::{
    self as pb, Id, ListByOwnerRequest, ListByOwnerResponse, ListRequest, ListResponse,
    ReadRequest, ReadResponse, Resource, Tenancy, Type, WatchListRequest,
};

use super::validate::{self, Absent, Violations, Wildcards};
use super::{Error, ResourceService, convert};
use crate::acl::{AclError, Authorizer};
use crate::registry::{ReadAcl, Registration};
use crate::resource::{self, DisplayId};
use crate::storage::{
    Consistency, Operation, SharedEvent, StorageError, UnversionedType, WatchEvent,
};
use proto::selector::Selector;

/// The stream WatchList answers with.
pub(crate) type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Error>> + Send>>;

/// WatchList's answer as the storage shares it: each event is the one copy every watcher of the
/// change holds (see [`SharedEvent::wire`]: the gRPC server encodes it once for all of them).
pub(crate) type SharedWatchStream = Pin<Box<dyn Stream<Item = Result<SharedEvent, Error>> + Send>>;

/// The grants a watch is checked against, as they are now: the gRPC layer replaces the
/// authorizer whenever the caller's token or its policies change (DESIGN §12.3: watches follow
/// the current grants).
pub(super) type LiveGrants = tokio::sync::watch::Receiver<Arc<dyn Authorizer>>;

/// Grants that never change (the server's own watches, controllers).
pub(super) fn fixed_grants(authorizer: Arc<dyn Authorizer>) -> LiveGrants {
    tokio::sync::watch::channel(authorizer).1
}

/// An event as it goes on the wire.
pub(crate) fn pb_event(event: &WatchEvent) -> pb::WatchEvent {
    let body = match &event.operation {
        Operation::Upsert(resource) => pb::watch_event::Event::Upsert(pb::watch_event::Upsert {
            resource: Some(resource.clone()),
        }),
        Operation::Delete(resource) => pb::watch_event::Event::Delete(pb::watch_event::Delete {
            resource: Some(resource.clone()),
        }),
        Operation::EndOfSnapshot => {
            pb::watch_event::Event::EndOfSnapshot(pb::watch_event::EndOfSnapshot {})
        }
        Operation::Bookmark => pb::watch_event::Event::Bookmark(pb::watch_event::Bookmark {}),
    };
    pb::WatchEvent {
        event: Some(body),
        version: event.version.clone(),
        actor: event.actor.clone(),
    }
}

/// An event's `pb::WatchEvent` encoding, made once and shared by every watcher it goes to.
pub(crate) fn wire_event(event: &SharedEvent) -> bytes::Bytes {
    event.wire(|event| prost::Message::encode_to_vec(&pb_event(event)).into())
}

/// What the CEL conversions of one List may spend together: some tens of milliseconds of one
/// core, where storage hands the list over (DESIGN §15.1; each page of a list gets as much).
const LIST_CONVERSION_UNITS: u64 = 2_000_000;

/// A validated List or WatchList query.
struct Query {
    registration: Arc<Registration>,
    resource_type: Type,
    tenancy: Tenancy,
    name_prefix: String,
    /// `None`: every resource.
    selector: Option<Selector>,
}

/// A stored encoding that does not decode: the store is damaged there.
fn undecodable(error: prost::DecodeError) -> Error {
    crate::storage::undecodable(error).into()
}

/// A read's grant before storage: refused, granted, or (`true`) granted only once the stored
/// object is known (the type's read hook needs it).
pub(super) fn read_grant(
    registration: &Registration,
    authorizer: &dyn Authorizer,
    id: &Id,
) -> Result<bool, Error> {
    match (registration.acls.read)(authorizer, id, None) {
        Ok(()) => Ok(false),
        Err(AclError::NeedResource) => Ok(true),
        Err(denied) => Err(denied.into()),
    }
}

/// What a Read answers when storage found nothing, another incarnation or another version.
fn read_error(id: &Id, error: StorageError) -> Error {
    match error {
        StorageError::NotFound => Error::NotFound(format!("resource not found: {}", DisplayId(id))),
        StorageError::GroupVersionMismatch { stored } => {
            let stored_version = stored
                .id
                .and_then(|id| id.r#type)
                .map(|t| t.group_version)
                .unwrap_or_default();
            let requested = id
                .r#type
                .as_ref()
                .map(|t| t.group_version.clone())
                .unwrap_or_default();
            Error::invalid(format!(
                "resource was requested with GroupVersion {requested:?}, but stored with GroupVersion {stored_version:?}"
            ))
        }
        error => error.into(),
    }
}

impl ResourceService {
    pub(crate) async fn read(
        &self,
        authorizer: &dyn Authorizer,
        consistency: Consistency,
        request: ReadRequest,
    ) -> Result<ReadResponse, Error> {
        if !request.at_version.is_empty() {
            return self.read_at(authorizer, consistency, request).await;
        }
        let (id, registration, needs_resource) = self.prepare_read(authorizer, request).await?;
        let resource = match self.backend.read(consistency, &id).await {
            Ok(resource) => resource,
            Err(StorageError::GroupVersionMismatch { stored })
                if convert::converts_from(&registration, convert::group_version_of(&stored)) =>
            {
                self.converted_read(authorizer, &registration, *stored)
                    .await?
            }
            Err(error) => return Err(read_error(&id, error)),
        };
        if needs_resource {
            (registration.acls.read)(authorizer, &id, Some(&resource))?;
        }
        Ok(ReadResponse {
            resource: Some(resource),
        })
    }

    /// [`ResourceService::read`] answered with the stored encoding of the resource (the
    /// `resource` of a `ReadResponse`; see `service::encoded`): decoded only when the type's
    /// read hook asks for the resource.
    pub(crate) async fn read_encoded(
        &self,
        authorizer: &dyn Authorizer,
        consistency: Consistency,
        request: ReadRequest,
    ) -> Result<Vec<u8>, Error> {
        if !request.at_version.is_empty() {
            let answer = self.read_at(authorizer, consistency, request).await?;
            return Ok(prost::Message::encode_to_vec(
                &answer.resource.unwrap_or_default(),
            ));
        }
        let (id, registration, needs_resource) = self.prepare_read(authorizer, request).await?;
        let bytes = match self.backend.read_encoded(consistency, &id).await {
            Ok(bytes) => bytes,
            Err(StorageError::GroupVersionMismatch { stored })
                if convert::converts_from(&registration, convert::group_version_of(&stored)) =>
            {
                let converted = self
                    .converted_read(authorizer, &registration, *stored)
                    .await?;
                if needs_resource {
                    (registration.acls.read)(authorizer, &id, Some(&converted))?;
                }
                return Ok(prost::Message::encode_to_vec(&converted));
            }
            Err(error) => return Err(read_error(&id, error)),
        };
        if needs_resource {
            let resource =
                <Resource as prost::Message>::decode(bytes.as_slice()).map_err(undecodable)?;
            (registration.acls.read)(authorizer, &id, Some(&resource))?;
        }
        Ok(bytes)
    }

    /// `stored`, of another version of `registration`'s Type, converted to the version asked
    /// for (on the rule pool when its conversions are not cheap).
    pub(super) async fn converted_read(
        &self,
        authorizer: &dyn Authorizer,
        registration: &Arc<Registration>,
        stored: Resource,
    ) -> Result<Resource, Error> {
        // Read as stored too: a grant on the version asked for does not open another version
        // (DESIGN §12.3: access holds on the object as stored as well as on the request).
        let stored_id = stored.id.clone().unwrap_or_default();
        (registration.acls.read)(authorizer, &stored_id, Some(&stored))?;
        let Some(family) = registration
            .registered
            .as_ref()
            .map(|installed| installed.family.clone())
        else {
            return Err(Error::Internal("a conversion without a family".into()));
        };
        let to = registration.resource_type.group_version.clone();
        if family.converts_inline(stored.data.as_ref().map_or(0, |d| d.value.len())) {
            return convert::convert(&family, stored, &to, None);
        }
        self.pool
            .run(move || convert::convert(&family, stored, &to, None))
            .await
            .map_err(|error| Error::Internal(error.to_string()))?
    }

    /// A Read's checks before storage: the id, the read hook (whether it needs the resource),
    /// then the tenancy.
    async fn prepare_read(
        &self,
        authorizer: &dyn Authorizer,
        request: ReadRequest,
    ) -> Result<(Id, Arc<Registration>, bool), Error> {
        let (id, registration) = self.check_request_id(request.id, "id")?;
        // The ACL check comes before the tenancy check so that tenancy existence does not leak.
        let needs_resource = read_grant(&registration, authorizer, &id)?;
        let tenancy = id.tenancy.clone().unwrap_or_default();
        self.tenancy_state(registration.scope, &tenancy).await?;
        Ok((id, registration, needs_resource))
    }

    /// Checks a List (`absent: Required`) or WatchList (`absent: Defaults`: every tenancy of
    /// the type's scope) query.
    fn query(
        &self,
        resource_type: Option<Type>,
        tenancy: Option<Tenancy>,
        name_prefix: String,
        selector: &str,
        absent: Absent,
    ) -> Result<Query, Error> {
        let mut violations = Violations::default();
        let selector = validate::check_selector(&mut violations, selector);
        validate::check_type(&mut violations, "type", resource_type.as_ref());
        validate::check_tenancy(
            &mut violations,
            "tenancy",
            tenancy.as_ref(),
            Wildcards::Allowed,
            absent,
        );
        validate::check_name_prefix(&mut violations, &name_prefix);
        violations.finish()?;
        let tenancy = tenancy.or_else(|| {
            (absent == Absent::Defaults).then(|| Tenancy {
                partition: resource::WILDCARD.into(),
                namespace: resource::WILDCARD.into(),
            })
        });
        let (Some(resource_type), Some(mut tenancy)) = (resource_type, tenancy) else {
            return Err(Error::invalid("type and tenancy are required"));
        };
        let registration = self.resolve_type(&resource_type, "type")?;
        validate::apply_scope(
            "tenancy",
            &registration.gvk(),
            registration.scope,
            &mut tenancy,
            Wildcards::Allowed,
        )?;
        Ok(Query {
            registration,
            resource_type,
            tenancy,
            name_prefix,
            selector,
        })
    }

    /// The listed resources decoded: [`Self::list_encoded`] (one filtering path for both).
    pub(crate) async fn list(
        &self,
        authorizer: &dyn Authorizer,
        consistency: Consistency,
        request: ListRequest,
    ) -> Result<ListResponse, Error> {
        self.list_encoded(authorizer, consistency, request)
            .await?
            .decode()
    }

    /// [`Self::list`] without decoding what needs no decoding: each resource stays in its
    /// stored encoding, copied once from the backend's read into the answer; only its id is
    /// read (type version, ACL), and the whole resource only for a type whose read hook needs
    /// it.
    pub(crate) async fn list_encoded(
        &self,
        authorizer: &dyn Authorizer,
        consistency: Consistency,
        request: ListRequest,
    ) -> Result<EncodedList, Error> {
        self.list_encoded_for(authorizer, consistency, request, None)
            .await
    }

    /// [`Self::list_encoded`] for a caller that came through a port's admission: the list's
    /// bytes count against its share as well as the node's, until the answer is dropped.
    pub(crate) async fn list_encoded_for(
        &self,
        authorizer: &dyn Authorizer,
        consistency: Consistency,
        request: ListRequest,
        caller: Option<&crate::limits::Admitted>,
    ) -> Result<EncodedList, Error> {
        let query = self.query(
            request.r#type,
            request.tenancy,
            request.name_prefix,
            &request.selector,
            Absent::Required,
        )?;
        (query.registration.acls.list)(authorizer, &query.tenancy)?;
        let listing = super::page::Listing {
            resource_type: &query.resource_type,
            tenancy: &query.tenancy,
            name_prefix: &query.name_prefix,
            selector: query.selector.as_ref(),
        };
        let after = listing.resume_after(&request.page_token)?;
        let mut visible = VisibleList {
            authorizer,
            read_acl: &query.registration.acls.read,
            everything_readable: query.registration.acls.read_is_default()
                && authorizer.reads_everything(),
            group_version: &query.resource_type.group_version,
            family: convert::family_of(&query.registration),
            conversions: crate::registry::cel::Meter::new(LIST_CONVERSION_UNITS),
            selector: query.selector.as_ref(),
            list: EncodedList::charged_to(self.list_budget.clone(), caller),
            page: (request.limit > 0).then_some(PageEnd {
                limit: request.limit as usize,
                last: None,
                more: false,
            }),
            failed: None,
        };
        // A Type's CEL conversions run where storage hands the list over: on a thread this
        // worker's other tasks move away from, when the runtime has workers to move them to.
        let costly = visible
            .family
            .is_some_and(crate::registry::versions::Family::has_cel_conversions);
        let unversioned = UnversionedType::of(&query.resource_type);
        let read = self.backend.list_encoded(
            consistency,
            &unversioned,
            &query.tenancy,
            &query.name_prefix,
            after.as_ref(),
            &mut visible,
        );
        let handle = tokio::runtime::Handle::current();
        if costly && handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
            tokio::task::block_in_place(|| handle.block_on(read))?;
        } else {
            read.await?;
        }
        if let Some(error) = visible.failed {
            return Err(error);
        }
        if let Some(PageEnd {
            last: Some(last),
            more: true,
            ..
        }) = &visible.page
        {
            visible.list.end_page(&listing.token_after(last));
        }
        Ok(visible.list)
    }

    pub(crate) async fn list_by_owner(
        &self,
        authorizer: &dyn Authorizer,
        request: ListByOwnerRequest,
    ) -> Result<ListByOwnerResponse, Error> {
        let mut violations = Violations::default();
        validate::check_id(
            &mut violations,
            "owner",
            request.owner.as_ref(),
            Wildcards::Allowed,
            &self.registry,
        );
        if request
            .owner
            .as_ref()
            .is_some_and(|owner| owner.uid.is_empty())
        {
            violations.push(
                "owner.uid",
                "owner uid is required: children are matched on their owner's uid",
            );
        }
        let selector = validate::check_selector(&mut violations, &request.selector);
        violations.finish()?;
        let Some(mut owner) = request.owner else {
            return Err(Error::invalid("owner is required"));
        };
        self.scope_id(&mut owner, "owner", Wildcards::Allowed)?;
        let children = self.backend.list_by_owner(&owner).await?;
        let resources = children
            .into_iter()
            .filter(|child| {
                selector
                    .as_ref()
                    .is_none_or(|selector| selector.matches(&child.metadata))
            })
            .filter(|child| {
                let Some(child_type) = child.id.as_ref().and_then(|id| id.r#type.as_ref()) else {
                    return false;
                };
                match self.registry.resolve_stored(child_type) {
                    Some(child_registration) => {
                        readable(&child_registration.acls.read, authorizer, child)
                    }
                    None => false,
                }
            })
            .collect();
        Ok(ListByOwnerResponse { resources })
    }

    /// The resources `owner` (a complete id, uid included, as stored) owns that `authorizer` may
    /// read, without resolving the owner's type: what the reaper asks of a resource already
    /// deleted, whose type may have been unregistered since (a registered type's last resources
    /// are reaped after their Type is gone).
    pub(crate) async fn children_of(
        &self,
        authorizer: &dyn Authorizer,
        owner: &Id,
    ) -> Result<Vec<Resource>, Error> {
        let children = self.backend.list_by_owner(owner).await?;
        Ok(children
            .into_iter()
            .filter(|child| {
                child
                    .id
                    .as_ref()
                    .and_then(|id| id.r#type.as_ref())
                    .and_then(|child_type| self.registry.resolve_stored(child_type))
                    .is_some_and(|registration| {
                        readable(&registration.acls.read, authorizer, child)
                    })
            })
            .collect())
    }

    /// Opens a watch: an Upsert per current match, one EndOfSnapshot, then every change. Errors in
    /// the request are returned before the stream starts; later errors end the stream.
    pub(crate) async fn watch_list(
        self: &Arc<Self>,
        authorizer: Arc<dyn Authorizer>,
        request: WatchListRequest,
    ) -> Result<WatchStream, Error> {
        let events = self
            .watch_list_shared(fixed_grants(authorizer), request)
            .await?;
        Ok(events
            .map(|item| item.map(|event| pb_event(event.event())))
            .boxed())
    }

    /// WatchList with the events as the storage shares them. Every event is checked against
    /// the grants of the moment; when they change so that the watch's type and tenancy are no
    /// longer readable, it ends with PermissionDenied.
    pub(crate) async fn watch_list_shared(
        self: &Arc<Self>,
        grants: LiveGrants,
        request: WatchListRequest,
    ) -> Result<SharedWatchStream, Error> {
        if request.shard.is_some() {
            return self.watch_shard(grants, request).await;
        }
        self.watch_list_plain(grants, request).await
    }

    /// WatchList without a shard selector.
    pub(super) async fn watch_list_plain(
        &self,
        grants: LiveGrants,
        request: WatchListRequest,
    ) -> Result<SharedWatchStream, Error> {
        let authorizer = grants.borrow().clone();
        let since = match request.since_version.as_str() {
            "" => None,
            text => Some(text.parse::<crate::storage::Version>().map_err(|why| {
                Error::invalid(format!(
                    "since_version invalid: {why}: pass the version of a WatchEvent"
                ))
            })?),
        };
        let query = self.query(
            request.r#type,
            request.tenancy,
            request.name_prefix,
            &request.selector,
            Absent::Defaults,
        )?;
        (query.registration.acls.list)(authorizer.as_ref(), &query.tenancy)?;
        let watch = self
            .backend
            .watch_list(
                &UnversionedType::of(&query.resource_type),
                &query.tenancy,
                &query.name_prefix,
                since,
                crate::storage::WatchOptions {
                    selector: query.selector,
                    progress: request.bookmarks,
                },
            )
            .await?;
        let scope = WatchScope {
            read_acl: query.registration.acls.read.clone(),
            list_acl: query.registration.acls.list.clone(),
            read_is_default: query.registration.acls.read_is_default(),
            resource_type: query.resource_type,
            tenancy: query.tenancy,
            name_prefix: query.name_prefix,
            types: self.registry.dynamic().clone(),
            pool: self.pool.clone(),
        };
        let bookmarks = request.bookmarks.then(Bookmarks::new);
        let events = following_grants(watch, grants, scope, bookmarks);
        Ok(until_shutdown(events, self.shutdown.clone()))
    }
}

/// What a watch covers, to check events and changed grants against.
struct WatchScope {
    read_acl: ReadAcl,
    list_acl: crate::registry::ListAcl,
    read_is_default: bool,
    resource_type: Type,
    tenancy: Tenancy,
    name_prefix: String,
    /// The registered types as they are when each event comes: an event of another version
    /// of the watched Type is converted by its versions of the moment (DESIGN §15.1).
    types: Arc<crate::registry::DynamicTypes>,
    /// Where costly conversions run.
    pool: crate::registry::pool::Pool,
}

impl WatchScope {
    /// `event` as this watch sees it: as stored, or converted when it is of another version
    /// of the watched Type (on the rule pool unless its conversions are cheap); `None` when it
    /// is not visible.
    async fn present(
        &self,
        authorizer: &dyn Authorizer,
        event: SharedEvent,
    ) -> Result<Option<SharedEvent>, Error> {
        let resource = match &event.event().operation {
            Operation::Upsert(resource) | Operation::Delete(resource) => resource,
            Operation::EndOfSnapshot | Operation::Bookmark => return Ok(Some(event)),
        };
        if same_group_version(resource, &self.resource_type) {
            return Ok(self.visible(authorizer, &event).then_some(event));
        }
        let Some(registration) = self.types.resolve(&self.resource_type) else {
            return Ok(None);
        };
        if !convert::converts_from(&registration, convert::group_version_of(resource))
            || !readable(&self.read_acl, authorizer, resource)
        {
            return Ok(None);
        }
        let bytes = resource.data.as_ref().map_or(0, |d| d.value.len());
        let inline =
            convert::family_of(&registration).is_none_or(|family| family.converts_inline(bytes));
        let converted = if inline {
            convert::as_requested(&registration, resource.clone())?
        } else {
            let (registration, resource) = (registration.clone(), resource.clone());
            self.pool
                .run(move || convert::as_requested(&registration, resource))
                .await
                .map_err(|error| Error::Internal(error.to_string()))??
        };
        let Some(converted) = converted else {
            return Ok(None);
        };
        let operation = match &event.event().operation {
            Operation::Delete(_) => Operation::Delete(converted),
            _ => Operation::Upsert(converted),
        };
        let event = SharedEvent::new(WatchEvent {
            version: event.event().version.clone(),
            operation,
            actor: event.event().actor.clone(),
        });
        Ok(self.visible(authorizer, &event).then_some(event))
    }

    fn visible(&self, authorizer: &dyn Authorizer, event: &SharedEvent) -> bool {
        match &event.event().operation {
            Operation::Upsert(resource) | Operation::Delete(resource) => {
                same_group_version(resource, &self.resource_type)
                    && readable(&self.read_acl, authorizer, resource)
            }
            Operation::EndOfSnapshot | Operation::Bookmark => true,
        }
    }

    /// `Ok` while `authorizer` may still watch this: the type's list hook passes, and (for a
    /// type read by resource rules, in one namespace) something the watch names may still be
    /// readable (each event is checked on its own as well).
    fn still_allowed(&self, authorizer: &dyn Authorizer) -> Result<(), Error> {
        (self.list_acl)(authorizer, &self.tenancy)?;
        let concrete = self.tenancy.partition != resource::WILDCARD
            && self.tenancy.namespace != resource::WILDCARD;
        if self.read_is_default
            && concrete
            && !authorizer.may_read_some(
                &resource::gvk(&self.resource_type),
                &self.tenancy.partition,
                &self.tenancy.namespace,
                &self.name_prefix,
            )
        {
            return Err(Error::from(AclError::PermissionDenied(format!(
                "token lost read on {} {}/{}: the watch ended",
                resource::gvk(&self.resource_type),
                self.tenancy.partition,
                self.tenancy.namespace
            ))));
        }
        Ok(())
    }
}

/// How often a watch that asked for bookmarks gets one while nothing it sees changes (DESIGN:
/// at least every 5 s).
const BOOKMARK_EVERY: std::time::Duration = std::time::Duration::from_secs(4);

/// A watch's bookmarks: the last version it has gone past (sent or not) and when the next
/// bookmark is due. A quiet watch gets one at every due time, its version repeated while
/// nothing moves (a watcher learns the watch is alive; DESIGN: at least every 5 s).
struct Bookmarks {
    /// The version of the last event read from storage (empty: none yet).
    version: String,
    /// Bookmarks start once the snapshot (or the resumed history) has ended.
    started: bool,
    /// A bookmark is due at this moment unless an event was sent since.
    due: tokio::time::Instant,
    /// The version of the last event or bookmark sent.
    sent: String,
}

impl Bookmarks {
    fn new() -> Self {
        Bookmarks {
            version: String::new(),
            started: false,
            due: tokio::time::Instant::now() + BOOKMARK_EVERY,
            sent: String::new(),
        }
    }

    /// Storage produced `event` (whether or not the watcher sees it).
    fn went_past(&mut self, event: &SharedEvent) {
        if matches!(event.event().operation, Operation::EndOfSnapshot) {
            self.started = true;
        }
        if !event.event().version.is_empty() {
            self.version = event.event().version.clone();
        }
    }

    /// `event` was sent to the watcher.
    fn sent(&mut self, event: &SharedEvent) {
        self.due = tokio::time::Instant::now() + BOOKMARK_EVERY;
        if !event.event().version.is_empty() {
            self.sent = event.event().version.clone();
        }
    }

    /// The bookmark due now (once the snapshot has ended and a version is known).
    fn take(&mut self) -> Option<SharedEvent> {
        self.due = tokio::time::Instant::now() + BOOKMARK_EVERY;
        if !self.started || self.version.is_empty() {
            return None;
        }
        self.sent = self.version.clone();
        Some(SharedEvent::new(WatchEvent {
            version: self.version.clone(),
            operation: Operation::Bookmark,
            actor: String::new(),
        }))
    }
}

/// The storage watch's events (its selector applied already) that the grants of the moment let
/// through, with bookmarks when asked for; ends with PermissionDenied once changed grants no
/// longer allow the watch.
fn following_grants(
    watch: crate::storage::Watch,
    grants: LiveGrants,
    scope: WatchScope,
    bookmarks: Option<Bookmarks>,
) -> SharedWatchStream {
    struct State {
        watch: crate::storage::Watch,
        grants: LiveGrants,
        /// Whether the grants may still change (their sender lives).
        live: bool,
        scope: WatchScope,
        bookmarks: Option<Bookmarks>,
    }
    futures::stream::unfold(
        Some(State {
            watch,
            grants,
            live: true,
            scope,
            bookmarks,
        }),
        |state| async move {
            let mut state = state?;
            loop {
                let due = state.bookmarks.as_ref().map(|b| b.due);
                tokio::select! {
                    biased;
                    changed = state.grants.changed(), if state.live => {
                        if changed.is_err() {
                            state.live = false;
                            continue;
                        }
                        let current = state.grants.borrow_and_update().clone();
                        if let Err(error) = state.scope.still_allowed(current.as_ref()) {
                            return Some((Err(error), None));
                        }
                    }
                    event = state.watch.next() => match event {
                        None => return None,
                        Some(Err(error)) => return Some((Err(Error::from(error)), None)),
                        Some(Ok(event)) => {
                            if let Some(bookmarks) = state.bookmarks.as_mut() {
                                bookmarks.went_past(&event);
                            }
                            // Storage's progress marks only move the bookmarks.
                            if matches!(event.event().operation, Operation::Bookmark) {
                                continue;
                            }
                            let grants = state.grants.borrow().clone();
                            let presented = state.scope.present(grants.as_ref(), event).await;
                            let event = match presented {
                                Ok(Some(event)) => event,
                                Ok(None) => continue,
                                Err(error) => return Some((Err(error), None)),
                            };
                            if let Some(bookmarks) = state.bookmarks.as_mut() {
                                bookmarks.sent(&event);
                            }
                            return Some((Ok(event), Some(state)));
                        }
                    },
                    () = sleep_until_due(due) => {
                        let bookmark = state.bookmarks.as_mut().and_then(Bookmarks::take);
                        if let Some(bookmark) = bookmark {
                            return Some((Ok(bookmark), Some(state)));
                        }
                    }
                }
            }
        },
    )
    .boxed()
}

/// Sleeps until `due`; forever without one.
async fn sleep_until_due(due: Option<tokio::time::Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// Ends a stream with `Unavailable` when the server shuts down, and after its first error.
fn until_shutdown<T: Send + 'static>(
    events: Pin<Box<dyn Stream<Item = Result<T, Error>> + Send>>,
    shutdown: tokio_util::sync::CancellationToken,
) -> Pin<Box<dyn Stream<Item = Result<T, Error>> + Send>> {
    futures::stream::unfold(Some((events, shutdown)), |state| async move {
        let (mut events, shutdown) = state?;
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => Some((
                Err(Error::ShuttingDown("the server is shutting down; watch again (on another server)".into())),
                None,
            )),
            item = events.next() => match item {
                None => None,
                Some(Err(error)) => Some((Err(error), None)),
                Some(Ok(event)) => Some((Ok(event), Some((events, shutdown)))),
            },
        }
    })
    .boxed()
}

fn same_group_version(resource: &Resource, resource_type: &Type) -> bool {
    resource
        .id
        .as_ref()
        .and_then(|id| id.r#type.as_ref())
        .is_some_and(|stored| stored.group_version == resource_type.group_version)
}

/// Whether the read hook lets this caller see this (stored) resource.
fn readable(read_acl: &ReadAcl, authorizer: &dyn Authorizer, resource: &Resource) -> bool {
    match &resource.id {
        Some(id) => read_acl(authorizer, id, Some(resource)).is_ok(),
        None => read_acl(authorizer, &Id::default(), Some(resource)).is_ok(),
    }
}

/// A `ListResponse` as it goes on the wire: each listed resource as stored, behind the
/// `resources` field's tag and its length (the bytes prost would write for the decoded list).
/// Held in chunks of about [`LIST_CHUNK`] bytes (a resource never spans two), so a long list
/// never reallocates and copies what it already holds, whatever the allocator.
#[derive(Debug, Default)]
pub(crate) struct EncodedList {
    chunks: Vec<Vec<u8>>,
    bytes: usize,
    count: usize,
    /// The node's budget for lists being answered, charged as the list grows and released
    /// when it has been sent (dropped).
    charge: Option<crate::limits::Charge>,
    /// The caller's share, likewise, and who the caller is (for the refusal).
    caller: Option<(crate::limits::Charge, String)>,
}

/// What a list answer's bytes are charged to (the node's budget, the caller's share), released
/// when dropped.
#[derive(Debug)]
pub(crate) struct ListCharges {
    _node: Option<crate::limits::Charge>,
    _caller: Option<crate::limits::Charge>,
}

/// The size an [`EncodedList`] chunk is given (a larger resource gets a chunk of its own size).
const LIST_CHUNK: usize = 1 << 20;

impl EncodedList {
    /// An empty list whose bytes count against `budget`, and the caller's share, while it lives.
    pub(crate) fn charged_to(
        budget: Arc<crate::limits::ByteBudget>,
        caller: Option<&crate::limits::Admitted>,
    ) -> Self {
        EncodedList {
            charge: Some(crate::limits::Charge::new(budget)),
            caller: caller.map(|admitted| {
                (
                    crate::limits::Charge::new(admitted.share.bytes()),
                    admitted.share.who().to_owned(),
                )
            }),
            ..EncodedList::default()
        }
    }

    /// Appends one resource's encoding, unless a budget it is charged to has no room.
    pub(crate) fn try_push(&mut self, resource: &[u8]) -> Result<(), crate::limits::LimitError> {
        use crate::limits::LimitError;
        let framed = resource.len() + 8;
        if let Some((charge, who)) = self.caller.as_mut() {
            charge.add(framed).map_err(|used| LimitError::CallerBytes {
                who: who.clone(),
                used,
                limit: charge.budget().limit(),
            })?;
        }
        if let Some(charge) = self.charge.as_mut() {
            charge.add(framed).map_err(|used| LimitError::ListBytes {
                used,
                limit: charge.budget().limit(),
            })?;
        }
        self.push(resource);
        Ok(())
    }

    /// Appends one resource's encoding.
    pub(crate) fn push(&mut self, resource: &[u8]) {
        let framed =
            crate::wire::proto::field_len(crate::wire::proto::RESOURCE_FIELD, resource.len());
        let room = self
            .chunks
            .last()
            .is_some_and(|chunk| chunk.capacity() - chunk.len() >= framed);
        if !room {
            // A small list stays small: each new chunk is four times what the list holds, up
            // to LIST_CHUNK, and never less than the resource.
            let size = (4 * self.bytes.max(framed)).min(LIST_CHUNK).max(framed);
            self.chunks.push(Vec::with_capacity(size));
        }
        let chunk = self.chunks.last_mut().expect("a chunk with room");
        crate::wire::proto::put_bytes_field(crate::wire::proto::RESOURCE_FIELD, resource, chunk);
        self.bytes += framed;
        self.count += 1;
    }

    /// How many resources it holds.
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// Ends the answer with `ListResponse.next_page_token` (after the resources, where a
    /// decoder finds it as well as anywhere).
    pub(crate) fn end_page(&mut self, next_page_token: &str) {
        const NEXT_PAGE_TOKEN: u32 = 2;
        let mut field = Vec::with_capacity(crate::wire::proto::field_len(
            NEXT_PAGE_TOKEN,
            next_page_token.len(),
        ));
        crate::wire::proto::put_bytes_field(
            NEXT_PAGE_TOKEN,
            next_page_token.as_bytes(),
            &mut field,
        );
        self.bytes += field.len();
        self.chunks.push(field);
    }

    /// The length of the encoded `ListResponse`.
    pub(crate) fn encoded_len(&self) -> usize {
        self.bytes
    }

    /// The encoded `ListResponse`, in pieces to be written one after the other.
    pub(crate) fn chunks(&self) -> impl Iterator<Item = &[u8]> {
        self.chunks.iter().map(Vec::as_slice)
    }

    /// [`EncodedList::chunks`], handed over, with what they are charged to (keep it until
    /// they are sent).
    pub(crate) fn into_chunks(self) -> (Vec<Vec<u8>>, ListCharges) {
        (
            self.chunks,
            ListCharges {
                _node: self.charge,
                _caller: self.caller.map(|(charge, _)| charge),
            },
        )
    }

    /// The list decoded.
    pub(crate) fn decode(&self) -> Result<ListResponse, Error> {
        let mut list = ListResponse::default();
        for chunk in self.chunks() {
            // Each chunk holds whole `resources` elements: a `ListResponse` of its own.
            <ListResponse as prost::Message>::merge(&mut list, chunk).map_err(undecodable)?;
        }
        Ok(list)
    }
}

/// Keeps, framed, the listed resources of the asked group version that the caller may read;
/// the first resource that does not decode ends the listing with its error.
struct VisibleList<'a> {
    authorizer: &'a dyn Authorizer,
    read_acl: &'a ReadAcl,
    /// The read hook is the default one and the caller reads everything: only the group
    /// version decides, read in place (no id is decoded per resource).
    everything_readable: bool,
    group_version: &'a str,
    /// The versions of the listed type, when objects stored in another of them are listed
    /// converted (DESIGN §15.1).
    family: Option<&'a crate::registry::versions::Family>,
    /// What the conversions of this list may spend, together (they run where storage hands
    /// the list over, so a Type's costly conversions cannot hold a thread for long).
    conversions: crate::registry::cel::Meter,
    /// Only resources whose metadata matches (read in place, after the cheaper checks).
    selector: Option<&'a Selector>,
    list: EncodedList,
    /// A page's end, when the listing has a limit.
    page: Option<PageEnd>,
    failed: Option<Error>,
}

/// Where a page ends: after `limit` resources, the last of them `last`; `more` once another
/// visible resource was found behind it (so the page gets a next token, and the last page
/// none).
struct PageEnd {
    limit: usize,
    last: Option<crate::storage::StorageKey>,
    more: bool,
}

impl VisibleList<'_> {
    /// `bytes` converted to the listed version when they are stored in another version of the
    /// same Type; `None` when they are listed as they are (or not at all).
    fn converted(&mut self, bytes: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        let Some(family) = self.family else {
            return Ok(None);
        };
        let Some(stored) = crate::wire::proto::encoded_group_version(bytes)? else {
            return Ok(None);
        };
        if stored == self.group_version.as_bytes() {
            return Ok(None);
        }
        if std::str::from_utf8(stored)
            .ok()
            .and_then(|from| family.version(from))
            .is_none()
        {
            return Ok(None);
        }
        // Only what this caller sees is converted: read on the object as stored (as well as on
        // the version listed, checked after) and the selector, on the stored bytes.
        if !self.everything_readable {
            let stored_id = <crate::wire::proto::IdOnly as prost::Message>::decode(bytes)
                .map_err(undecodable)?
                .id
                .unwrap_or_default();
            if (self.read_acl)(self.authorizer, &stored_id, None).is_err() {
                return Ok(None);
            }
        }
        if let Some(selector) = self.selector {
            let metadata = <crate::wire::proto::MetadataOnly as prost::Message>::decode(bytes)
                .map_err(undecodable)?
                .metadata;
            if !selector.matches(&metadata) {
                return Ok(None);
            }
        }
        let resource = <Resource as prost::Message>::decode(bytes).map_err(undecodable)?;
        let converted =
            convert::convert_metered(family, resource, self.group_version, None, &mut self.conversions)
                .map_err(|error| match error {
                    Error::FailedPrecondition(why) if self.conversions.left() == 0 => {
                        Error::ResourceExhausted(format!(
                            "converting this list to {} costs more than the {LIST_CONVERSION_UNITS} units one List may spend on conversions ({why}): list in pages (a limit), or in the storage version {}",
                            self.group_version, family.storage
                        ))
                    }
                    other => other,
                })?;
        Ok(Some(prost::Message::encode_to_vec(&converted)))
    }

    fn visible(&self, bytes: &[u8]) -> Result<bool, Error> {
        if !self.readable(bytes)? {
            return Ok(false);
        }
        let Some(selector) = self.selector else {
            return Ok(true);
        };
        let metadata = <crate::wire::proto::MetadataOnly as prost::Message>::decode(bytes)
            .map_err(undecodable)?
            .metadata;
        Ok(selector.matches(&metadata))
    }

    fn readable(&self, bytes: &[u8]) -> Result<bool, Error> {
        if self.everything_readable {
            let group_version = crate::wire::proto::encoded_group_version(bytes)?;
            return Ok(group_version == Some(self.group_version.as_bytes()));
        }
        let id = <crate::wire::proto::IdOnly as prost::Message>::decode(bytes)
            .map_err(undecodable)?
            .id
            .unwrap_or_default();
        let same_version = id
            .r#type
            .as_ref()
            .is_some_and(|t| t.group_version == self.group_version);
        if !same_version {
            return Ok(false);
        }
        Ok(match (self.read_acl)(self.authorizer, &id, None) {
            Ok(()) => true,
            Err(AclError::NeedResource) => {
                let resource = <Resource as prost::Message>::decode(bytes).map_err(undecodable)?;
                (self.read_acl)(self.authorizer, &id, Some(&resource)).is_ok()
            }
            Err(_) => false,
        })
    }
}

impl crate::storage::EncodedSink for VisibleList<'_> {
    fn take(&mut self, stored: &[u8]) -> std::ops::ControlFlow<()> {
        let converted = match self.converted(stored) {
            Ok(converted) => converted,
            Err(error) => {
                self.failed = Some(error);
                return std::ops::ControlFlow::Break(());
            }
        };
        let encoded = converted.as_deref().unwrap_or(stored);
        match self.visible(encoded) {
            Ok(true) => {
                if let Some(page) = self.page.as_mut() {
                    if self.list.len() >= page.limit {
                        page.more = true;
                        return std::ops::ControlFlow::Break(());
                    }
                    match <crate::wire::proto::IdOnly as prost::Message>::decode(encoded) {
                        Ok(head) => {
                            page.last =
                                Some(crate::storage::StorageKey::of(&head.id.unwrap_or_default()));
                        }
                        Err(error) => {
                            self.failed = Some(undecodable(error));
                            return std::ops::ControlFlow::Break(());
                        }
                    }
                }
                if let Err(exhausted) = self.list.try_push(encoded) {
                    self.failed = Some(Error::from(exhausted));
                    return std::ops::ControlFlow::Break(());
                }
            }
            Ok(false) => {}
            Err(error) => {
                self.failed = Some(error);
                return std::ops::ControlFlow::Break(());
            }
        }
        std::ops::ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use std::ops::ControlFlow;
    use std::sync::Arc;

    use prost::Message as _;

    use super::{EncodedList, VisibleList};
    use crate::acl::{AclError, AllowAll};
    use crate::registry::ReadAcl;
    use crate::storage::EncodedSink as _;
    use crate::storage::conformance::Fixture;

    /// An artist stored as `v999`, which a listing of `v2` leaves out.
    fn of_another_version(fixture: &Fixture) -> proto::resource::v1::Resource {
        let mut other_version = fixture.artist("other-version");
        if let Some(t) = other_version.id.as_mut().and_then(|id| id.r#type.as_mut()) {
            t.group_version = "v999".into();
        }
        other_version
    }

    /// A record that does not decode ends the listing with an error saying so.
    fn stops_at_an_undecodable_resource(visible: &mut VisibleList<'_>) {
        assert_eq!(visible.take(b"\x0a\xff"), ControlFlow::Break(()));
        assert!(
            visible
                .failed
                .as_ref()
                .is_some_and(|e| e.to_string().contains("does not decode")),
            "{:?}",
            visible.failed
        );
    }

    #[test]
    fn a_listing_keeps_the_asked_version_frames_it_and_stops_at_an_undecodable_resource() {
        let fixture = Fixture::new();
        let kept = fixture.artist("kept");
        let other_version = of_another_version(&fixture);
        let denied = fixture.artist("denied");
        let read_acl: ReadAcl = Arc::new(|_, id, _| {
            if id.name == "denied" {
                Err(AclError::PermissionDenied("no".into()))
            } else {
                Ok(())
            }
        });
        let group_version = kept
            .id
            .as_ref()
            .unwrap()
            .r#type
            .as_ref()
            .unwrap()
            .group_version
            .clone();
        let mut visible = VisibleList {
            authorizer: &AllowAll,
            read_acl: &read_acl,
            everything_readable: false,
            group_version: &group_version,
            family: None,
            conversions: crate::registry::cel::Meter::new(super::LIST_CONVERSION_UNITS),
            selector: None,
            page: None,
            list: EncodedList::default(),
            failed: None,
        };
        for resource in [&kept, &other_version, &denied] {
            assert_eq!(
                visible.take(&resource.encode_to_vec()),
                ControlFlow::Continue(())
            );
        }
        stops_at_an_undecodable_resource(&mut visible);
        assert_eq!(visible.list.len(), 1);
        let kept_len = kept.encoded_len();
        assert_eq!(
            visible.list.encoded_len(),
            1 + prost::encoding::encoded_len_varint(kept_len as u64) + kept_len
        );
        let decoded = visible.list.decode().expect("the framed list decodes");
        assert_eq!(decoded.resources, vec![kept]);
    }

    #[test]
    fn a_caller_who_reads_everything_gets_the_asked_version_without_per_item_checks() {
        use crate::acl::Authorizer as _;
        use crate::registry::Acls;

        let fixture = Fixture::new();
        let kept = fixture.artist("kept");
        let other_version = of_another_version(&fixture);
        let mut untyped = fixture.artist("untyped");
        untyped.id.as_mut().unwrap().r#type = None;
        let defaults = Acls::default();
        assert!(defaults.read_is_default() && AllowAll.reads_everything());
        let mut visible = VisibleList {
            authorizer: &AllowAll,
            read_acl: &defaults.read,
            everything_readable: true,
            group_version: "v2",
            family: None,
            conversions: crate::registry::cel::Meter::new(super::LIST_CONVERSION_UNITS),
            selector: None,
            list: EncodedList::default(),
            page: None,
            failed: None,
        };
        for resource in [&kept, &other_version, &untyped] {
            assert_eq!(
                visible.take(&resource.encode_to_vec()),
                ControlFlow::Continue(())
            );
        }
        stops_at_an_undecodable_resource(&mut visible);
        assert_eq!(visible.list.decode().unwrap().resources, vec![kept]);
    }

    #[test]
    fn only_the_default_read_hook_allows_listing_without_per_item_checks() {
        use crate::registry::Acls;

        assert!(Acls::default().read_is_default());
        assert!(!Acls::acl_managed(|_, _| Ok(())).read_is_default());
        let custom = Acls {
            read: Arc::new(|_, _, _| Err(AclError::NeedResource)),
            ..Acls::default()
        };
        assert!(!custom.read_is_default());
    }

    #[test]
    fn a_list_in_many_chunks_is_the_same_list_prost_would_encode() {
        use proto::resource::v1::ListResponse;

        let fixture = Fixture::new();
        let mut resources = Vec::new();
        for i in 0..3_000 {
            let mut resource = fixture.artist(&format!("artist-{i:05}"));
            resource.metadata.insert("bio".into(), "x".repeat(i % 700));
            resources.push(resource);
        }
        // One larger than a chunk, between the others.
        resources[1_500]
            .metadata
            .insert("payload".into(), "y".repeat(3 << 20));
        let mut list = EncodedList::default();
        for resource in &resources {
            list.push(&resource.encode_to_vec());
        }
        assert!(list.chunks().count() > 3, "several chunks");
        assert!(
            list.chunks()
                .all(|chunk| ListResponse::decode(chunk).is_ok()),
            "no resource spans two chunks"
        );
        let expected = ListResponse {
            resources: resources.clone(),
            ..ListResponse::default()
        }
        .encode_to_vec();
        let written: Vec<u8> = list.chunks().flatten().copied().collect();
        assert_eq!(list.encoded_len(), expected.len());
        assert!(written == expected, "the chunks are prost's encoding");
        assert_eq!(list.len(), resources.len());
        assert!(list.decode().expect("decodes").resources == resources);
    }

    #[test]
    fn a_page_ends_with_its_token_as_prost_would_encode_it() {
        use proto::resource::v1::ListResponse;

        let fixture = Fixture::new();
        let resources = vec![fixture.artist("one"), fixture.artist("two")];
        let mut list = EncodedList::default();
        for resource in &resources {
            list.push(&resource.encode_to_vec());
        }
        list.end_page("next-token");
        let expected = ListResponse {
            resources: resources.clone(),
            next_page_token: "next-token".into(),
        };
        let written: Vec<u8> = list.chunks().flatten().copied().collect();
        assert_eq!(written, expected.encode_to_vec());
        assert_eq!(list.encoded_len(), written.len());
        assert_eq!(list.len(), 2, "the token is no resource");
        assert_eq!(list.decode().expect("decodes"), expected);
    }
}
