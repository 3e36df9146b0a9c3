//! How token secrets are stored and recognised (DESIGN §12.3).
//!
//! A secret of the shape resctl and the server generate (64 hex digits: 256 random bits) is
//! stored as its SHA-256, `sha256:<hex>`: nobody can guess such a secret, so a fast hash
//! protects it fully and a request's token is found with one hash. A secret a person chose may
//! be guessable, so it is stored salted and slow: `pbkdf2-sha256:<iterations>:<salt>:<hash>`
//! (PBKDF2-HMAC-SHA256). A stolen snapshot or WAL then costs an attacker that many HMACs per
//! guess, and a table made for one cluster does not serve another.
//!
//! A request presents only the secret, so finding its token takes one slow hash per salt in use.
//! Chosen secrets therefore share one salt where they can: a writer takes the salt the node
//! already knows from stored tokens ([`prefer_salt`]), else a salt made once per process (two
//! nodes writing the first chosen secrets at once give two salts; later writes converge on
//! one). Which salt a secret got never matters for correctness: each stored value names its own.

use std::sync::RwLock;

use sha2::Digest;

/// PBKDF2 rounds for a chosen secret: about 20–40 ms of one core here, in a release build.
pub(crate) const ITERATIONS: u32 = 100_000;
/// Bytes of salt.
const SALT_LEN: usize = 16;
/// Fewest and most rounds a stored value may name (a `secret_hash` written to make every
/// lookup expensive, or cheap to attack, does not parse and so is refused).
const MIN_ITERATIONS: u32 = 10_000;
const MAX_ITERATIONS: u32 = 4 * ITERATIONS;
/// Salts a lookup tries, the most used first: chosen secrets share one salt unless someone
/// writes hashes by hand (and then only their own tokens go unfound).
pub(crate) const MAX_SALTS: usize = 4;

/// A salt chosen secrets are hashed with.
pub(crate) type Salt = [u8; SALT_LEN];

/// The salt this process hashes chosen secrets with (see the module's doc).
static PREFERRED_SALT: RwLock<Option<Salt>> = RwLock::new(None);

/// Makes `salt` the one later chosen secrets get: the token store calls it with the salt of the
/// stored tokens.
pub(crate) fn prefer_salt(salt: Salt) {
    *PREFERRED_SALT.write().unwrap_or_else(|p| p.into_inner()) = Some(salt);
}

fn salt() -> Result<Salt, String> {
    if let Some(salt) = *PREFERRED_SALT.read().unwrap_or_else(|p| p.into_inner()) {
        return Ok(salt);
    }
    let mut fresh = [0u8; SALT_LEN];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut fresh)
        .map_err(|_| "the system random source failed".to_owned())?;
    let mut preferred = PREFERRED_SALT.write().unwrap_or_else(|p| p.into_inner());
    Ok(*preferred.get_or_insert(fresh))
}

/// Whether `secret` has the shape of a generated one: 64 lowercase hex digits, with at least 12
/// different digits (256 random bits have 16 but for a chance of about 10⁻¹⁵; `0000…` or a
/// repeated word does not pass).
pub(crate) fn is_generated(secret: &str) -> bool {
    secret.len() == 64
        && secret
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && {
            let mut seen = 0u16;
            for b in secret.bytes() {
                let digit = if b.is_ascii_digit() {
                    b - b'0'
                } else {
                    b - b'a' + 10
                };
                seen |= 1 << digit;
            }
            seen.count_ones() >= 12
        }
}

/// The SHA-256 of a secret as stored for a generated one, `sha256:<hex>`; also the key of the
/// in-memory cache of verified chosen secrets.
pub(crate) fn fast_hash(secret: &str) -> String {
    let digest = sha2::Sha256::digest(secret.as_bytes());
    let mut text = String::with_capacity(7 + 64);
    text.push_str("sha256:");
    text.push_str(&hex(&digest));
    text
}

/// The stored form of a secret: fast for a generated one, salted and slow for a chosen one.
pub(crate) fn store(secret: &str) -> Result<String, String> {
    if is_generated(secret) {
        return Ok(fast_hash(secret));
    }
    let salt = salt()?;
    Ok(StoredSecret::Slow {
        iterations: ITERATIONS,
        salt,
        hash: slow_hash(secret, &salt, ITERATIONS),
    }
    .to_string())
}

/// PBKDF2-HMAC-SHA256 of `secret`.
pub(crate) fn slow_hash(secret: &str, salt: &Salt, iterations: u32) -> [u8; 32] {
    let mut out = [0u8; 32];
    let rounds = std::num::NonZeroU32::new(iterations.max(1)).unwrap_or(std::num::NonZeroU32::MIN);
    ring::pbkdf2::derive(
        ring::pbkdf2::PBKDF2_HMAC_SHA256,
        rounds,
        salt,
        secret.as_bytes(),
        &mut out,
    );
    out
}

/// A stored `secret_hash`, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StoredSecret {
    /// `sha256:<64 hex>`.
    Fast(String),
    /// `pbkdf2-sha256:<iterations>:<32 hex salt>:<64 hex hash>`.
    Slow {
        iterations: u32,
        salt: Salt,
        hash: [u8; 32],
    },
}

impl StoredSecret {
    /// `None` for anything but the two forms above (with [`MIN_ITERATIONS`] to
    /// [`MAX_ITERATIONS`] rounds).
    pub(crate) fn parse(value: &str) -> Option<StoredSecret> {
        if let Some(digest) = value.strip_prefix("sha256:") {
            return (digest.len() == 64 && unhex::<32>(digest).is_some())
                .then(|| StoredSecret::Fast(value.to_owned()));
        }
        let rest = value.strip_prefix("pbkdf2-sha256:")?;
        let mut parts = rest.split(':');
        let iterations = parts.next()?;
        let iterations: u32 = (iterations.len() <= 8
            && iterations.bytes().all(|b| b.is_ascii_digit()))
        .then(|| iterations.parse().ok())??;
        let salt = unhex::<SALT_LEN>(parts.next()?)?;
        let hash = unhex::<32>(parts.next()?)?;
        if parts.next().is_some() || !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&iterations) {
            return None;
        }
        Some(StoredSecret::Slow {
            iterations,
            salt,
            hash,
        })
    }
}

impl std::fmt::Display for StoredSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoredSecret::Fast(text) => f.write_str(text),
            StoredSecret::Slow {
                iterations,
                salt,
                hash,
            } => write!(f, "pbkdf2-sha256:{iterations}:{}:{}", hex(salt), hex(hash)),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(HEX[usize::from(byte >> 4)]));
        text.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    text
}

/// Lowercase hex of exactly `N` bytes.
fn unhex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != N * 2 {
        return None;
    }
    let digit = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in text.as_bytes().chunks(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_secrets_are_hashed_fast_and_chosen_ones_salted_and_slow() {
        let generated = proto::tls::new_secret().expect("secret");
        assert!(is_generated(&generated), "{generated}");
        assert_eq!(store(&generated).expect("stored"), fast_hash(&generated));

        for chosen in [
            "correct-horse-battery-staple",
            &"0".repeat(64),
            &"deadbeef".repeat(8),
            &generated.to_uppercase(),
        ] {
            assert!(!is_generated(chosen), "{chosen}");
            let stored = store(chosen).expect("stored");
            let Some(StoredSecret::Slow {
                iterations,
                salt,
                hash,
            }) = StoredSecret::parse(&stored)
            else {
                panic!("{chosen} stored as {stored}");
            };
            assert_eq!(iterations, ITERATIONS);
            assert_eq!(hash, slow_hash(chosen, &salt, iterations));
            assert!(!stored.contains(&fast_hash(chosen)[7..]), "{stored}");
            assert_eq!(
                StoredSecret::parse(&stored).map(|s| s.to_string()),
                Some(stored)
            );
        }
        // Another salt gives another hash.
        let a = slow_hash("correct-horse-battery-staple", &[1; SALT_LEN], 1000);
        let b = slow_hash("correct-horse-battery-staple", &[2; SALT_LEN], 1000);
        assert_ne!(a, b);
    }

    #[test]
    fn only_well_formed_stored_values_parse() {
        let fast = fast_hash("abc");
        assert_eq!(
            fast,
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            StoredSecret::parse(&fast),
            Some(StoredSecret::Fast(fast.clone()))
        );
        let salt = "00".repeat(SALT_LEN);
        let hash = "11".repeat(32);
        assert!(StoredSecret::parse(&format!("pbkdf2-sha256:100000:{salt}:{hash}")).is_some());
        for bad in [
            "sha256:ABC".to_owned(),
            fast.to_uppercase(),
            format!("{fast}0"),
            format!("pbkdf2-sha256:0:{salt}:{hash}"),
            format!("pbkdf2-sha256:1000:{salt}:{hash}"),
            format!("pbkdf2-sha256:99999999:{salt}:{hash}"),
            format!("pbkdf2-sha256:-1:{salt}:{hash}"),
            format!("pbkdf2-sha256:1000:{salt}"),
            format!("pbkdf2-sha256:1000:{salt}:{hash}:x"),
            format!("pbkdf2-sha256:1000:{}:{hash}", "zz".repeat(SALT_LEN)),
            format!("md5:{hash}"),
            String::new(),
        ] {
            assert_eq!(StoredSecret::parse(&bad), None, "{bad}");
        }
    }
}
