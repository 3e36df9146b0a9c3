//! Sealed values: every value the state machine stores (resources, a restore's staged records,
//! remembered requests, the applied index, the membership and a restore's id) ends with a CRC-32
//! of its key and its bytes, checked on every read. A record that fails its check is
//! [`RecordDamage`], never a value decoded from damaged bytes: the node treats its state as
//! damaged and rebuilds it (see `state_machine`), and no client is answered from it.
//!
//! The key is in the sum so that a value found under another key (a damaged branch page) fails
//! too. Written from on-disk format 3; [`seal_environment`] seals an older environment's values
//! once, when it is opened.

use heed::types::Bytes;
use heed::{Database, RwTxn};

/// Bytes a seal adds to a value.
pub(crate) const SEAL_LEN: usize = 4;

/// A stored value whose checksum does not match its key and bytes (or that is too short to hold
/// one): the state machine's file is damaged there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the stored record {key} in the state machine fails its checksum ({why})")]
pub(crate) struct RecordDamage {
    /// The record's key, for people (`group/kind/partition/namespace/name` for a resource).
    pub key: String,
    pub why: &'static str,
}

fn sum(key: &[u8], value: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&(key.len() as u32).to_le_bytes());
    hasher.update(key);
    hasher.update(value);
    hasher.finalize()
}

/// `value` followed by its seal.
pub(crate) fn seal(key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut sealed = Vec::with_capacity(value.len() + SEAL_LEN);
    sealed.extend_from_slice(value);
    sealed.extend_from_slice(&sum(key, value).to_le_bytes());
    sealed
}

/// `value` sealed in place (its seal appended): no copy.
pub(crate) fn seal_vec(key: &[u8], mut value: Vec<u8>) -> Vec<u8> {
    let seal = sum(key, &value).to_le_bytes();
    value.extend_from_slice(&seal);
    value
}

/// A protobuf message encoded and sealed, in one buffer.
pub(crate) fn seal_message(key: &[u8], message: &impl prost::Message) -> Vec<u8> {
    let mut sealed = Vec::with_capacity(message.encoded_len() + SEAL_LEN);
    message
        .encode(&mut sealed)
        .unwrap_or_else(|_| unreachable!("a Vec grows to hold any message"));
    let seal = sum(key, &sealed).to_le_bytes();
    sealed.extend_from_slice(&seal);
    sealed
}

/// The value of a sealed record, once its seal matches.
pub(crate) fn open<'v>(key: &[u8], stored: &'v [u8]) -> Result<&'v [u8], RecordDamage> {
    let Some(split) = stored.len().checked_sub(SEAL_LEN) else {
        return Err(damage(key, "it is shorter than its checksum"));
    };
    let (value, seal) = stored.split_at(split);
    let expected = u32::from_le_bytes(seal.try_into().unwrap_or_default());
    if sum(key, value) != expected {
        return Err(damage(key, "its bytes changed since they were written"));
    }
    Ok(value)
}

fn damage(key: &[u8], why: &'static str) -> RecordDamage {
    RecordDamage {
        key: key_label(key),
        why,
    }
}

/// A key for people: a resource key as its path, a text key as text, anything else in hex.
pub(crate) fn key_label(key: &[u8]) -> String {
    if let Some(resource) = super::schema::parse_resource_key(key) {
        return format!(
            "{}/{}/{}/{}/{}",
            resource.group, resource.kind, resource.partition, resource.namespace, resource.name
        );
    }
    match std::str::from_utf8(key) {
        Ok(text) if text.chars().all(|c| !c.is_control()) => format!("{text:?}"),
        _ => key.iter().map(|byte| format!("{byte:02x}")).collect(),
    }
}

/// Records sealed per write transaction while an environment is sealed: bounds the memory a
/// large state needs to be sealed.
const SEAL_BATCH: usize = 4096;

/// Seals every value of `db` written before values were sealed (format 2 and older), except the
/// keys in `except`. Runs once, inside the transaction that records the new format.
pub(crate) fn seal_database(
    db: Database<Bytes, Bytes>,
    wtxn: &mut RwTxn<'_>,
    except: &[&[u8]],
) -> heed::Result<u64> {
    let mut sealed = 0u64;
    let mut after: Option<Vec<u8>> = None;
    loop {
        let batch: Vec<(Vec<u8>, Vec<u8>)> = {
            let bound = after
                .as_deref()
                .map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
            let range = (bound, std::ops::Bound::Unbounded);
            let mut batch = Vec::new();
            for item in db.range(wtxn, &range)? {
                let (key, value) = item?;
                batch.push((key.to_vec(), value.to_vec()));
                if batch.len() == SEAL_BATCH {
                    break;
                }
            }
            batch
        };
        let Some((last, _)) = batch.last() else {
            return Ok(sealed);
        };
        after = Some(last.clone());
        for (key, value) in &batch {
            if except.contains(&key.as_slice()) {
                continue;
            }
            db.put(wtxn, key, &seal(key, value))?;
            sealed += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_opens_to_itself() {
        let sealed = seal(b"k", b"value");
        assert_eq!(sealed.len(), 5 + SEAL_LEN);
        assert_eq!(open(b"k", &sealed), Ok(&b"value"[..]));
        assert_eq!(open(b"k", &seal(b"k", b"")), Ok(&b""[..]));
    }

    #[test]
    fn every_flipped_bit_and_every_cut_is_damage() {
        let sealed = seal(b"key", b"some stored bytes");
        for at in 0..sealed.len() {
            for bit in 0..8 {
                let mut flipped = sealed.clone();
                flipped[at] ^= 1 << bit;
                assert!(open(b"key", &flipped).is_err(), "byte {at} bit {bit}");
            }
        }
        for len in 0..sealed.len() {
            assert!(open(b"key", &sealed[..len]).is_err(), "cut to {len}");
        }
    }

    #[test]
    fn a_value_under_another_key_is_damage() {
        let sealed = seal(b"one", b"value");
        let damage = open(b"two", &sealed).expect_err("another key");
        assert!(damage.to_string().contains("\"two\""), "{damage}");
        // The key's length is in the sum: bytes moved between key and value do not pass.
        assert!(open(b"ke", &seal(b"key", b"value")).is_err());
        assert!(open(b"keyv", &seal(b"key", b"value")[1..]).is_err());
    }

    #[test]
    fn a_message_is_sealed_as_its_encoding() {
        let message = proto::resource::v1::Id {
            name: "x".into(),
            uid: "u".into(),
            ..Default::default()
        };
        let sealed = seal_message(b"k", &message);
        assert_eq!(sealed, seal(b"k", &prost::Message::encode_to_vec(&message)));
    }

    #[test]
    fn resource_keys_are_named_as_paths() {
        let key = super::super::schema::resource_key(&crate::storage::StorageKey {
            group: "demo".into(),
            kind: "Artist".into(),
            partition: "default".into(),
            namespace: "default".into(),
            name: "x".into(),
        });
        assert_eq!(key_label(&key), "demo/Artist/default/default/x");
        assert_eq!(key_label(&[1, 2, 255]), "0102ff");
    }
}
