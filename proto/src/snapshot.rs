//! The operator snapshot file: what `ClusterService.SnapshotSave` streams and `SnapshotRestore`
//! takes, and what `resctl snapshot inspect` reads.
//!
//! Layout: the magic `RESDSNAP`, the format version (u32 big-endian), the header length (u32
//! big-endian) and the encoded [`SnapshotHeader`], then the body: one record per resource, each a
//! u32 big-endian length and an encoded `Resource`, then (format 2) `history_count` records of
//! objects' history, each a length and an encoded `SnapshotHistoryRecord`. The header's SHA-256
//! covers the body. Format 1 files (no history) are read too.

use std::collections::BTreeMap;

use prost::Message;
use sha2::{Digest, Sha256};

use crate::cluster::v1::{SnapshotHeader, SnapshotHistoryRecord};
use crate::resource::v1::Resource;

pub const MAGIC: &[u8; 8] = b"RESDSNAP";
pub const FORMAT_VERSION: u32 = 2;
/// The oldest format this build reads.
pub const OLDEST_FORMAT_VERSION: u32 = 1;
/// Largest header accepted when reading.
const MAX_HEADER_BYTES: usize = 1 << 20;
/// Largest record accepted when reading (a resource is at most a few MiB).
const MAX_RECORD_BYTES: usize = 64 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotError {
    #[error(
        "not a resd snapshot (snapshot files start with {:?}; this one does not)",
        String::from_utf8_lossy(MAGIC)
    )]
    NotASnapshot,
    #[error(
        "snapshot format version {0} is not supported (this build reads versions {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION})"
    )]
    UnsupportedVersion(u32),
    #[error("the snapshot is truncated: {0}")]
    Truncated(&'static str),
    #[error("the snapshot is corrupt: {0}")]
    Corrupt(String),
}

/// Writes a body record by record while hashing and counting it.
#[derive(Default)]
pub struct BodyWriter {
    hasher: Sha256,
    counts: BTreeMap<String, u64>,
    resources: u64,
    history: u64,
    bytes: u64,
}

impl std::fmt::Debug for BodyWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodyWriter")
            .field("resources", &self.resources)
            .finish_non_exhaustive()
    }
}

/// The GVK a snapshot counts a resource under.
pub fn gvk_of(resource: &Resource) -> String {
    resource
        .id
        .as_ref()
        .and_then(|id| id.r#type.as_ref())
        .map(|t| format!("{}.{}.{}", t.group, t.group_version, t.kind))
        .unwrap_or_default()
}

impl BodyWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Encodes one record, appending it to `out`, and accounts for it.
    pub fn record(&mut self, resource: &Resource, out: &mut Vec<u8>) {
        let start = out.len();
        let encoded = resource.encode_to_vec();
        out.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
        out.extend_from_slice(&encoded);
        self.hasher.update(&out[start..]);
        self.bytes += (out.len() - start) as u64;
        self.resources += 1;
        *self.counts.entry(gvk_of(resource)).or_default() += 1;
    }

    /// Encodes one history record (after every resource), appending it to `out`.
    pub fn history_record(&mut self, record: &SnapshotHistoryRecord, out: &mut Vec<u8>) {
        let start = out.len();
        let encoded = record.encode_to_vec();
        out.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
        out.extend_from_slice(&encoded);
        self.hasher.update(&out[start..]);
        self.bytes += (out.len() - start) as u64;
        self.history += 1;
    }

    /// The header for the body written so far.
    pub fn header(
        self,
        raft_index: u64,
        node_id: u64,
        created_at: prost_types::Timestamp,
    ) -> SnapshotHeader {
        SnapshotHeader {
            format_version: FORMAT_VERSION,
            raft_index,
            created_at: Some(created_at),
            counts: self.counts.into_iter().collect(),
            resource_count: self.resources,
            sha256: hex(&self.hasher.finalize()),
            body_bytes: self.bytes,
            node_id,
            history_count: self.history,
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes before the body: magic, version, header.
pub fn preamble(header: &SnapshotHeader) -> Vec<u8> {
    let encoded = header.encode_to_vec();
    let mut out = Vec::with_capacity(16 + encoded.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_be_bytes());
    out.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
    out.extend_from_slice(&encoded);
    out
}

fn take<'a>(
    bytes: &mut &'a [u8],
    count: usize,
    what: &'static str,
) -> Result<&'a [u8], SnapshotError> {
    if bytes.len() < count {
        return Err(SnapshotError::Truncated(what));
    }
    let (head, rest) = bytes.split_at(count);
    *bytes = rest;
    Ok(head)
}

fn take_u32(bytes: &mut &[u8], what: &'static str) -> Result<u32, SnapshotError> {
    let raw = take(bytes, 4, what)?;
    Ok(u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]))
}

/// Reads the header only (for `inspect` on a partial read); returns it and the body.
pub fn read_header(mut bytes: &[u8]) -> Result<(SnapshotHeader, &[u8]), SnapshotError> {
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(if bytes.len() < MAGIC.len() && MAGIC.starts_with(bytes) {
            SnapshotError::Truncated("in the magic bytes")
        } else {
            SnapshotError::NotASnapshot
        });
    }
    bytes = &bytes[MAGIC.len()..];
    let version = take_u32(&mut bytes, "in the format version")?;
    if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(SnapshotError::UnsupportedVersion(version));
    }
    let header_len = take_u32(&mut bytes, "in the header length")? as usize;
    if header_len > MAX_HEADER_BYTES {
        return Err(SnapshotError::Corrupt(format!(
            "header length {header_len} is implausible"
        )));
    }
    let header_bytes = take(&mut bytes, header_len, "in the header")?;
    let header = SnapshotHeader::decode(header_bytes)
        .map_err(|error| SnapshotError::Corrupt(format!("undecodable header: {error}")))?;
    Ok((header, bytes))
}

/// Reads and verifies a whole snapshot: header, checksum, every record, the counts.
pub fn read(bytes: &[u8]) -> Result<(SnapshotHeader, Vec<Resource>), SnapshotError> {
    read_with_history(bytes).map(|(header, resources, _)| (header, resources))
}

/// [`read`], and the history records after the resources.
#[allow(clippy::type_complexity)]
pub fn read_with_history(
    bytes: &[u8],
) -> Result<(SnapshotHeader, Vec<Resource>, Vec<SnapshotHistoryRecord>), SnapshotError> {
    let (header, body) = read_header(bytes)?;
    if (body.len() as u64) < header.body_bytes {
        return Err(SnapshotError::Truncated("in the body"));
    }
    if body.len() as u64 > header.body_bytes {
        return Err(SnapshotError::Corrupt(format!(
            "{} bytes follow the {}-byte body",
            body.len() as u64 - header.body_bytes,
            header.body_bytes
        )));
    }
    let digest = hex(&Sha256::digest(body));
    if digest != header.sha256 {
        return Err(SnapshotError::Corrupt(format!(
            "body checksum {digest} does not match the header's {}",
            header.sha256
        )));
    }
    let mut rest = body;
    let mut resources = Vec::with_capacity(header.resource_count.min(1 << 20) as usize);
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    while !rest.is_empty() && (resources.len() as u64) < header.resource_count {
        let len = take_u32(&mut rest, "in a record length")? as usize;
        if len > MAX_RECORD_BYTES {
            return Err(SnapshotError::Corrupt(format!(
                "record length {len} is implausible"
            )));
        }
        let record = take(&mut rest, len, "in a record")?;
        let resource = Resource::decode(record).map_err(|error| {
            SnapshotError::Corrupt(format!(
                "record {} is undecodable: {error}",
                resources.len()
            ))
        })?;
        *counts.entry(gvk_of(&resource)).or_default() += 1;
        resources.push(resource);
    }
    if resources.len() as u64 != header.resource_count {
        return Err(SnapshotError::Corrupt(format!(
            "{} records, the header says {}",
            resources.len(),
            header.resource_count
        )));
    }
    let header_counts: BTreeMap<String, u64> = header.counts.clone().into_iter().collect();
    if counts != header_counts {
        return Err(SnapshotError::Corrupt(
            "per-type counts differ from the header".into(),
        ));
    }
    let mut history = Vec::new();
    while !rest.is_empty() {
        let index = header.resource_count + history.len() as u64;
        let len = take_u32(&mut rest, "in a record length")? as usize;
        if len > MAX_RECORD_BYTES {
            return Err(SnapshotError::Corrupt(format!(
                "record length {len} is implausible"
            )));
        }
        let record = take(&mut rest, len, "in a record")?;
        history.push(SnapshotHistoryRecord::decode(record).map_err(|error| {
            SnapshotError::Corrupt(format!("record {index} (history) is undecodable: {error}"))
        })?);
    }
    if history.len() as u64 != header.history_count {
        return Err(SnapshotError::Corrupt(format!(
            "{} history records, the header says {}",
            history.len(),
            header.history_count
        )));
    }
    Ok((header, resources, history))
}

/// Where the preamble ends in the first bytes of a file: `Ok(Some((header, body_offset)))` once
/// they hold the whole header, `Ok(None)` while they could still be the start of a snapshot,
/// and an error as soon as they cannot (not a snapshot, another version, an implausible header).
pub fn parse_preamble(bytes: &[u8]) -> Result<Option<(SnapshotHeader, usize)>, SnapshotError> {
    match read_header(bytes) {
        Ok((header, body)) => Ok(Some((header, bytes.len() - body.len()))),
        Err(SnapshotError::Truncated(_)) => Ok(None),
        Err(error) => Err(error),
    }
}

/// Checks a body as it streams in: never more bytes than the header declares, and at the end
/// exactly that many with the header's checksum.
pub struct BodyVerifier {
    hasher: Sha256,
    expected_bytes: u64,
    expected_sha256: String,
    seen: u64,
}

impl std::fmt::Debug for BodyVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodyVerifier")
            .field("expected_bytes", &self.expected_bytes)
            .field("seen", &self.seen)
            .finish_non_exhaustive()
    }
}

impl BodyVerifier {
    pub fn new(header: &SnapshotHeader) -> Self {
        BodyVerifier {
            hasher: Sha256::new(),
            expected_bytes: header.body_bytes,
            expected_sha256: header.sha256.clone(),
            seen: 0,
        }
    }

    /// Accounts for the next body bytes.
    pub fn update(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        self.seen += bytes.len() as u64;
        if self.seen > self.expected_bytes {
            return Err(SnapshotError::Corrupt(format!(
                "the body is longer than the {} bytes the header declares",
                self.expected_bytes
            )));
        }
        self.hasher.update(bytes);
        Ok(())
    }

    /// Checks the length and the checksum once the body is complete.
    pub fn finish(self) -> Result<(), SnapshotError> {
        if self.seen < self.expected_bytes {
            return Err(SnapshotError::Truncated("in the body"));
        }
        let digest = hex(&self.hasher.finalize());
        if digest != self.expected_sha256 {
            return Err(SnapshotError::Corrupt(format!(
                "body checksum {digest} does not match the header's {}",
                self.expected_sha256
            )));
        }
        Ok(())
    }
}

/// Reads the next body record from `reader` (a verified body, read from its start):
/// `Ok(None)` at the end of the body. `index` (the record's position) names it in errors.
pub fn read_history_record<R: std::io::Read>(
    reader: &mut R,
    index: u64,
) -> Result<Option<SnapshotHistoryRecord>, SnapshotError> {
    let Some(record) = read_raw(reader, index)? else {
        return Ok(None);
    };
    SnapshotHistoryRecord::decode(record.as_slice())
        .map(Some)
        .map_err(|error| {
            SnapshotError::Corrupt(format!("record {index} (history) is undecodable: {error}"))
        })
}

/// One record's bytes (none at the end of the body).
fn read_raw<R: std::io::Read>(
    reader: &mut R,
    index: u64,
) -> Result<Option<Vec<u8>>, SnapshotError> {
    let mut length = [0u8; 4];
    let mut filled = 0;
    while filled < length.len() {
        match reader.read(&mut length[filled..]) {
            Ok(0) if filled == 0 => return Ok(None),
            Ok(0) => return Err(SnapshotError::Truncated("in a record length")),
            Ok(read) => filled += read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(SnapshotError::Corrupt(format!("cannot read: {error}"))),
        }
    }
    let len = u32::from_be_bytes(length) as usize;
    if len > MAX_RECORD_BYTES {
        return Err(SnapshotError::Corrupt(format!(
            "record {index}: length {len} is implausible"
        )));
    }
    let mut record = vec![0u8; len];
    reader
        .read_exact(&mut record)
        .map_err(|error| match error.kind() {
            std::io::ErrorKind::UnexpectedEof => SnapshotError::Truncated("in a record"),
            _ => SnapshotError::Corrupt(format!("cannot read: {error}")),
        })?;
    Ok(Some(record))
}

/// Reads the next resource record (the first `resource_count` records of a body).
pub fn read_record<R: std::io::Read>(
    reader: &mut R,
    index: u64,
) -> Result<Option<Resource>, SnapshotError> {
    let Some(record) = read_raw(reader, index)? else {
        return Ok(None);
    };
    Resource::decode(record.as_slice())
        .map(Some)
        .map_err(|error| SnapshotError::Corrupt(format!("record {index} is undecodable: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::v1::{Id, Type};

    fn resource(kind: &str, name: &str) -> Resource {
        Resource {
            id: Some(Id {
                uid: "01ARZ3NDEKTSV4RRFFQ69G5FAV".into(),
                name: name.into(),
                r#type: Some(Type {
                    group: "demo".into(),
                    group_version: "v2".into(),
                    kind: kind.into(),
                }),
                tenancy: None,
            }),
            version: "7".into(),
            ..Default::default()
        }
    }

    fn file(resources: &[Resource]) -> Vec<u8> {
        let mut body = Vec::new();
        let mut writer = BodyWriter::new();
        for resource in resources {
            writer.record(resource, &mut body);
        }
        let header = writer.header(42, 1, prost_types::Timestamp::default());
        let mut out = preamble(&header);
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn a_written_snapshot_reads_back_with_its_counts() {
        let resources = vec![
            resource("Artist", "a"),
            resource("Artist", "b"),
            resource("Album", "c"),
        ];
        let (header, read_back) = read(&file(&resources)).expect("valid");
        assert_eq!(read_back, resources);
        assert_eq!(header.raft_index, 42);
        assert_eq!(header.resource_count, 3);
        assert_eq!(header.counts["demo.v2.Artist"], 2);
        assert_eq!(header.counts["demo.v2.Album"], 1);
    }

    #[test]
    fn an_empty_snapshot_is_valid() {
        let (header, resources) = read(&file(&[])).expect("valid");
        assert_eq!(header.resource_count, 0);
        assert!(resources.is_empty());
    }

    #[test]
    fn every_truncation_is_rejected() {
        let bytes = file(&[resource("Artist", "a"), resource("Album", "b")]);
        for cut in 0..bytes.len() {
            let error = read(&bytes[..cut]).expect_err("truncated");
            assert!(
                matches!(
                    error,
                    SnapshotError::Truncated(_)
                        | SnapshotError::NotASnapshot
                        | SnapshotError::Corrupt(_)
                ),
                "cut at {cut}: {error:?}"
            );
        }
    }

    #[test]
    fn a_flipped_body_byte_fails_the_checksum() {
        let mut bytes = file(&[resource("Artist", "a")]);
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        let error = read(&bytes).expect_err("corrupt");
        assert!(
            matches!(error, SnapshotError::Corrupt(ref why) if why.contains("checksum")),
            "{error:?}"
        );
    }

    #[test]
    fn a_streamed_body_is_verified_chunk_by_chunk_and_read_record_by_record() {
        let resources = vec![resource("Artist", "a"), resource("Album", "b")];
        let bytes = file(&resources);
        assert_eq!(parse_preamble(&bytes[..10]), Ok(None));
        assert_eq!(
            parse_preamble(b"GARBAGE!garbage!").expect_err("not ours"),
            SnapshotError::NotASnapshot
        );
        let (header, offset) = parse_preamble(&bytes).expect("valid").expect("complete");
        let body = &bytes[offset..];
        let mut verifier = BodyVerifier::new(&header);
        for piece in body.chunks(7) {
            verifier.update(piece).expect("within the declared length");
        }
        verifier.finish().expect("checksum");
        let mut reader = body;
        let mut read_back = Vec::new();
        while let Some(resource) = read_record(&mut reader, read_back.len() as u64).expect("record")
        {
            read_back.push(resource);
        }
        assert_eq!(read_back, resources);

        let mut short = BodyVerifier::new(&header);
        short.update(&body[..body.len() - 1]).expect("shorter");
        assert!(matches!(short.finish(), Err(SnapshotError::Truncated(_))));
        let mut long = BodyVerifier::new(&header);
        let mut longer = body.to_vec();
        longer.push(0);
        assert!(matches!(
            long.update(&longer),
            Err(SnapshotError::Corrupt(_))
        ));
    }

    #[test]
    fn other_files_and_versions_are_named_as_such() {
        assert_eq!(
            read(b"hello, world").expect_err("not ours"),
            SnapshotError::NotASnapshot
        );
        let mut bytes = file(&[]);
        bytes[11] = 9;
        assert_eq!(
            read(&bytes).expect_err("future"),
            SnapshotError::UnsupportedVersion(9)
        );
    }
}
