//! Pages of a List (DESIGN §3): `limit` resources at a time, continued by an opaque
//! `page_token` naming the listing and the storage key of the last resource answered. Every
//! resource that exists for the whole listing appears exactly once across the pages, in key
//! order: each page starts strictly after the last key of the one before, whatever changed in
//! between. A token is base64url (no padding) of `internal.v1.PageToken`.

use prost::Message as _;
use proto::internal::v1::PageToken;
use proto::resource::v1::{Tenancy, Type};
use proto::selector::Selector;

use super::Error;
use crate::storage::StorageKey;

/// The layout of tokens this build makes and reads.
const TOKEN_LAYOUT: u32 = 1;

/// Longest token accepted, in characters (a token names a listing and a key: well under).
const MAX_TOKEN_LEN: usize = 8192;

/// The listing a token belongs to.
pub(super) struct Listing<'a> {
    pub(super) resource_type: &'a Type,
    pub(super) tenancy: &'a Tenancy,
    pub(super) name_prefix: &'a str,
    pub(super) selector: Option<&'a Selector>,
}

impl Listing<'_> {
    /// The token that continues this listing after `last`.
    pub(super) fn token_after(&self, last: &StorageKey) -> String {
        let token = PageToken {
            format: TOKEN_LAYOUT,
            group: self.resource_type.group.clone(),
            kind: self.resource_type.kind.clone(),
            partition: self.tenancy.partition.clone(),
            namespace: self.tenancy.namespace.clone(),
            name_prefix: self.name_prefix.to_owned(),
            selector: self.selector.map(ToString::to_string).unwrap_or_default(),
            after_partition: last.partition.clone(),
            after_namespace: last.namespace.clone(),
            after_name: last.name.clone(),
        };
        base64url(&token.encode_to_vec())
    }

    /// Where a page of this listing starts: after the key `text` names (`None`: from the
    /// start). A token that is not one of ours, or belongs to another listing, is
    /// InvalidArgument telling the client to list again.
    pub(super) fn resume_after(&self, text: &str) -> Result<Option<StorageKey>, Error> {
        if text.is_empty() {
            return Ok(None);
        }
        let again = "list again from the start, without page_token";
        let token = (text.len() <= MAX_TOKEN_LEN)
            .then(|| unbase64url(text))
            .flatten()
            .and_then(|bytes| PageToken::decode(bytes.as_slice()).ok())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "page_token invalid: it is not a token this server made (pass a next_page_token unchanged); {again}"
                ))
            })?;
        if token.format != TOKEN_LAYOUT {
            return Err(Error::invalid(format!(
                "page_token invalid: it was made by another version of resd (format {}), this one reads format {TOKEN_LAYOUT}; {again}",
                token.format
            )));
        }
        let selector = self.selector.map(ToString::to_string).unwrap_or_default();
        let differs = [
            (
                "type",
                token.group != self.resource_type.group || token.kind != self.resource_type.kind,
            ),
            (
                "tenancy",
                token.partition != self.tenancy.partition
                    || token.namespace != self.tenancy.namespace,
            ),
            ("name_prefix", token.name_prefix != self.name_prefix),
            ("selector", token.selector != selector),
        ];
        if let Some((field, _)) = differs.iter().find(|(_, differs)| *differs) {
            return Err(Error::invalid(format!(
                "page_token invalid: it continues a listing with another {field}; pass the {field} of the first page, or {again}"
            )));
        }
        Ok(Some(StorageKey {
            group: token.group,
            kind: token.kind,
            partition: token.after_partition,
            namespace: token.after_namespace,
            name: token.after_name,
        }))
    }
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn base64url(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

fn unbase64url(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| ALPHABET.iter().position(|a| *a == c).map(|v| v as u32);
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for chunk in text.as_bytes().chunks(4) {
        if chunk.len() == 1 {
            return None;
        }
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= value(*c)? << (18 - 6 * i);
        }
        for i in 0..chunk.len() - 1 {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing<'a>(
        resource_type: &'a Type,
        tenancy: &'a Tenancy,
        selector: Option<&'a Selector>,
    ) -> Listing<'a> {
        Listing {
            resource_type,
            tenancy,
            name_prefix: "m",
            selector,
        }
    }

    #[test]
    fn base64url_round_trips_every_length() {
        for len in 0..40 {
            let bytes: Vec<u8> = (0..len).map(|n| (n * 37 + 11) as u8).collect();
            let text = base64url(&bytes);
            assert!(!text.contains('='), "{text}");
            assert_eq!(unbase64url(&text), Some(bytes), "{len}");
        }
        assert_eq!(unbase64url("a"), None);
        assert_eq!(unbase64url("ab+/"), None);
    }

    #[test]
    fn a_token_resumes_its_listing_and_no_other() {
        let artist = crate::resource::parse_gvk("demo.v2.Artist").expect("gvk");
        let album = crate::resource::parse_gvk("demo.v2.Album").expect("gvk");
        let tenancy = Tenancy {
            partition: "default".into(),
            namespace: "*".into(),
        };
        let team = Selector::parse("team=billing").expect("selector");
        let last = StorageKey {
            group: "demo".into(),
            kind: "Artist".into(),
            partition: "default".into(),
            namespace: "jazz".into(),
            name: "miles".into(),
        };
        let token = listing(&artist, &tenancy, Some(&team)).token_after(&last);
        assert_eq!(
            listing(&artist, &tenancy, Some(&team)).resume_after(&token),
            Ok(Some(last))
        );
        // Another type, tenancy or selector: not this token's listing.
        for (other, field) in [
            (listing(&album, &tenancy, Some(&team)), "type"),
            (listing(&artist, &tenancy, None), "selector"),
        ] {
            let error = other.resume_after(&token).unwrap_err();
            assert!(
                error.to_string().contains(&format!("another {field}")),
                "{error}"
            );
        }
        let elsewhere = Tenancy {
            partition: "default".into(),
            namespace: "rock".into(),
        };
        assert!(
            listing(&artist, &elsewhere, Some(&team))
                .resume_after(&token)
                .unwrap_err()
                .to_string()
                .contains("another tenancy")
        );
        // Not a token at all, or too long: list again.
        for junk in ["not base64!", "AAAA", &"A".repeat(MAX_TOKEN_LEN + 4)] {
            let error = listing(&artist, &tenancy, Some(&team))
                .resume_after(junk)
                .unwrap_err();
            assert!(
                error.to_string().contains("list again"),
                "{junk:.20}: {error}"
            );
        }
        // A token of a later format.
        let later = PageToken {
            format: 2,
            ..PageToken::default()
        };
        let error = listing(&artist, &tenancy, None)
            .resume_after(&base64url(&later.encode_to_vec()))
            .unwrap_err();
        assert!(
            error.to_string().contains("another version of resd"),
            "{error}"
        );
    }
}
