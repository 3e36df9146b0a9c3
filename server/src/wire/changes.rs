//! Log entries of changes (`Op::Changes`, the write path's every entry) encoded straight from
//! the typed changes, as `resd.raft.v1.Command` — byte for byte what building the message and
//! encoding it with prost gives (`storage::raft::codec`'s tests compare the two for every shape
//! of batch), without first copying every resource into a message on the leader.

use prost::Message;
use proto::raft::v1 as pb;
use proto::resource::v1::Resource;

use super::proto::{field_len as framed_len, put_field_header as frame};
use crate::storage::WriteCondition;
use crate::storage::raft::codec::{delete_cas, guards_of, history_of, request_id_text};
use crate::storage::raft::op::{Change, Tagged};

/// `Op::Changes` encoded exactly as `codec::command_of` builds and prost encodes it, written straight from the typed
/// changes: the resources are not first copied into protobuf messages (a copy of every write,
/// on the leader, for nothing).
pub(crate) fn encode(changes: &[Tagged]) -> Vec<u8> {
    let parts: Vec<ChangeFields> = changes.iter().map(ChangeFields::of).collect();
    if let [one] = parts.as_slice() {
        // One change travels as a plain command (see `codec::command_of`); its oneof tag in `Command`
        // is the same as in `BatchOperation` (write 1, delete 2).
        let len = one.len();
        let mut buf = Vec::with_capacity(framed_len(one.tag(), len));
        frame(one.tag(), len, &mut buf);
        one.encode(&mut buf);
        return buf;
    }
    // Command { batch = 6: Batch { operations = 1 (repeated): BatchOperation { write | delete } } }
    const BATCH: u32 = 6;
    const OPERATIONS: u32 = 1;
    let operations: usize = parts
        .iter()
        .map(|part| framed_len(OPERATIONS, framed_len(part.tag(), part.len())))
        .sum();
    let mut buf = Vec::with_capacity(framed_len(BATCH, operations));
    frame(BATCH, operations, &mut buf);
    for part in &parts {
        let len = part.len();
        frame(OPERATIONS, framed_len(part.tag(), len), &mut buf);
        frame(part.tag(), len, &mut buf);
        part.encode(&mut buf);
    }
    buf
}

/// The fields of one change's `WriteCas` or `DeleteCas`, borrowed where they are large.
enum ChangeFields<'a> {
    Write(WriteFields<'a>),
    Delete(pb::DeleteCas),
}

/// `WriteCas` by reference to its resource.
struct WriteFields<'a> {
    resource: &'a Resource,
    request_id: String,
    actor: &'a String,
    merged: bool,
    guards: Vec<pb::Guard>,
    history: Option<pb::History>,
}

impl<'a> ChangeFields<'a> {
    fn of(tagged: &'a Tagged) -> Self {
        match &tagged.change {
            Change::Write(resource, condition) => ChangeFields::Write(WriteFields {
                resource,
                request_id: request_id_text(tagged.request_id),
                actor: &tagged.actor,
                merged: *condition == WriteCondition::Merged,
                guards: guards_of(&tagged.fence),
                history: tagged.keep.map(history_of),
            }),
            Change::Delete { id, version } => ChangeFields::Delete(delete_cas(id, version, tagged)),
        }
    }

    /// Its field number in `Command` and in `BatchOperation`.
    fn tag(&self) -> u32 {
        match self {
            ChangeFields::Write(_) => 1,
            ChangeFields::Delete(_) => 2,
        }
    }

    /// The encoded length of the message, without its own key and length.
    fn len(&self) -> usize {
        match self {
            ChangeFields::Write(write) => write.len(),
            ChangeFields::Delete(delete) => delete.encoded_len(),
        }
    }

    /// Writes the message's fields.
    fn encode(&self, buf: &mut Vec<u8>) {
        match self {
            ChangeFields::Write(write) => write.encode(buf),
            ChangeFields::Delete(delete) => buf.extend_from_slice(&delete.encode_to_vec()),
        }
    }
}

impl WriteFields<'_> {
    fn len(&self) -> usize {
        use prost::encoding::{bool, message, string};
        let mut len = message::encoded_len(1, self.resource);
        if !self.request_id.is_empty() {
            len += string::encoded_len(2, &self.request_id);
        }
        if !self.actor.is_empty() {
            len += string::encoded_len(3, self.actor);
        }
        if self.merged {
            len += bool::encoded_len(4, &self.merged);
        }
        len += message::encoded_len_repeated(5, &self.guards);
        if let Some(history) = &self.history {
            len += message::encoded_len(6, history);
        }
        len
    }

    /// As `prost` encodes `WriteCas`: fields in order, defaults left out.
    fn encode(&self, buf: &mut Vec<u8>) {
        use prost::encoding::{bool, message, string};
        message::encode(1, self.resource, buf);
        if !self.request_id.is_empty() {
            string::encode(2, &self.request_id, buf);
        }
        if !self.actor.is_empty() {
            string::encode(3, self.actor, buf);
        }
        if self.merged {
            bool::encode(4, &self.merged, buf);
        }
        for guard in &self.guards {
            message::encode(5, guard, buf);
        }
        if let Some(history) = &self.history {
            message::encode(6, history, buf);
        }
    }
}
