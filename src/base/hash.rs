//! Hashing: the index's keyed hashes (secret), and the stable FNV-1a hash that fingerprints
//! and log lines use (not secret).

use crate::base::limits::HASH_SECRET_LEN;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

/// The index's keyed hashes: SipHash-1-3 under a secret of two 128-bit keys, one for the
/// hash that picks a key's stripe and table bucket (and names its marker), one for the
/// markers' second hash. A durable engine keeps the secret in its file (`store/storage/`), so a
/// key hashes the same after a restart and a marker, which holds no key bytes, finds its
/// key again; a memory-only engine draws one at open. Clients choose keys: without the
/// secret they can neither aim keys at one stripe nor make a key collide with a marker.
#[derive(Clone)]
pub(crate) struct KeyHasher {
    table: (u64, u64),
    check: (u64, u64),
}

impl std::fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The keys are secret.
        f.write_str("KeyHasher")
    }
}

/// The file's secret as four little-endian words, the keys of every keyed hash made from
/// it (the index's, the commit log's MAC).
pub(crate) fn secret_words(secret: &[u8; HASH_SECRET_LEN]) -> [u64; 4] {
    let mut words = [0u64; 4];
    for (word, bytes) in words.iter_mut().zip(secret.chunks_exact(8)) {
        let mut w = [0u8; 8];
        w.copy_from_slice(bytes);
        *word = u64::from_le_bytes(w);
    }
    words
}

impl KeyHasher {
    pub(crate) fn from_secret(secret: &[u8; HASH_SECRET_LEN]) -> Self {
        let [t0, t1, c0, c1] = secret_words(secret);
        Self {
            table: (t0, t1),
            check: (c0, c1),
        }
    }

    /// A fresh secret, drawn from the standard library's randomly keyed hasher (seeded by
    /// the operating system): each word is a keyed hash under keys nobody outside the
    /// process knows.
    pub(crate) fn random_secret() -> [u8; HASH_SECRET_LEN] {
        let state = RandomState::new();
        let mut secret = [0u8; HASH_SECRET_LEN];
        for (i, word) in secret.chunks_exact_mut(8).enumerate() {
            word.copy_from_slice(&state.hash_one(i as u64).to_le_bytes());
        }
        secret
    }

    /// A hasher under a fresh secret (memory-only engines, tests).
    pub(crate) fn random() -> Self {
        Self::from_secret(&Self::random_secret())
    }

    /// The keyed hash of `bytes` that picks its stripe and bucket and names its marker.
    pub(crate) fn hash(&self, bytes: &[u8]) -> u64 {
        sip(self.table, bytes)
    }

    /// The second, independent keyed hash of `bytes` that a marker keeps.
    pub(crate) fn check(&self, bytes: &[u8]) -> u64 {
        sip(self.check, bytes)
    }
}

/// SipHash-1-3 of `bytes` under `keys`, length first: the byte stream is the length as 8
/// little-endian bytes, then `bytes`, the same on every platform, since the hashes are
/// persisted (markers keep them). Written out here rather than through a `Hasher` because
/// it runs once per call on every claim: whole words are read straight from the slice, and
/// the length word needs no buffering. `sip_matches_the_reference` pins it to an
/// independent implementation.
fn sip(keys: (u64, u64), bytes: &[u8]) -> u64 {
    let (k0, k1) = keys;
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    let compress = |v: &mut [u64; 4], m: u64| {
        v[3] ^= m;
        sip_round(v);
        v[0] ^= m;
    };
    compress(&mut v, bytes.len() as u64);
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        compress(&mut v, u64::from_le_bytes(w));
    }
    // The last block: the remaining bytes, and the stream's length (mod 256) in the top byte.
    let tail = words.remainder();
    let mut last = [0u8; 8];
    last[..tail.len()].copy_from_slice(tail);
    last[7] = (bytes.len() as u64).wrapping_add(8) as u8;
    compress(&mut v, u64::from_le_bytes(last));
    v[2] ^= 0xff;
    for _ in 0..3 {
        sip_round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// One SipRound.
#[inline(always)]
fn sip_round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13) ^ v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16) ^ v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21) ^ v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17) ^ v[2];
    v[2] = v[2].rotate_left(32);
}

/// A stable 64-bit FNV-1a hash, used for request fingerprints. Stable across versions and
/// platforms because fingerprints are persisted.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The stable 64-bit hash of a key that log lines carry instead of the key: FNV-1a 64 over
/// the key's bytes, written in logs as 16 lower-case hex digits (`{:016x}`).
///
/// It is the same in every process, on every machine and in every version, so the lines of
/// one key correlate across restarts, and an operator can find a known key's lines by
/// computing its hash. It is **not secret**: it keeps keys out of casual reading of the
/// logs, but anyone who can guess a key (sequential order numbers, e-mail addresses) can
/// hash the guess and match it. Treat logs that must hide keys from such a reader as
/// holding the keys.
///
/// ```
/// assert_eq!(format!("{:016x}", idemkv::admin::key_hash(b"order-42")), "7d1deb86a05662d4");
/// ```
pub fn key_hash(key: &[u8]) -> u64 {
    fnv1a64(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::Hasher;

    /// The reference: the `siphasher` crate's SipHash-1-3 over the same byte stream.
    fn reference(keys: (u64, u64), bytes: &[u8]) -> u64 {
        let mut h = siphasher::sip::SipHasher13::new_with_keys(keys.0, keys.1);
        h.write(&(bytes.len() as u64).to_le_bytes());
        h.write(bytes);
        h.finish()
    }

    #[test]
    fn sip_matches_the_reference() {
        // Every tail length, several whole words, and keys with high and low bits set.
        let bytes: Vec<u8> = (0..300u32)
            .map(|i| (i.wrapping_mul(167) ^ 0x5a) as u8)
            .collect();
        let keys = [
            (0, 0),
            (u64::MAX, u64::MAX),
            (0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908),
            (0xdead_beef_0123_4567, 0x89ab_cdef_fedc_ba98),
        ];
        for keys in keys {
            for len in 0..bytes.len() {
                for start in [0, 1, 7] {
                    let b = &bytes[start..(start + len).min(bytes.len())];
                    assert_eq!(
                        sip(keys, b),
                        reference(keys, b),
                        "len {} keys {keys:?}",
                        b.len()
                    );
                }
            }
        }
    }
}
