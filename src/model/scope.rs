//! Scopes: the namespace (tenant, client, operation) a key lives in, carried beside the
//! key so that two scopes' equal keys are two keys and no caller has to invent a delimiter
//! inside the key limit.
//!
//! Inside the engine a key is its *scoped key*: the scope's length (one byte), the scope,
//! then the key. The length prefix makes the encoding injective (`("ab", "c")` and
//! `("a", "bc")` differ), and the empty scope, the unscoped key, is the key behind a zero
//! byte. The index, the writer's publication and every internal call work on scoped keys;
//! records store the scope and the key apart, and recovery rebuilds the scoped key from
//! them. Only the public calls take a scope and a key.

use crate::base::sync::Arc;
use crate::model::constants::{SCOPED_INLINE_LEN, SCOPED_STACK_LEN, SCOPE_LEN_MAX};

// The length prefix is one byte.
const _: () = assert!(SCOPE_LEN_MAX <= u8::MAX as usize);

/// A call's scoped key, owned: inline up to `SCOPED_INLINE_LEN` bytes, else shared. A claim
/// answered without a lease (a replay, a copy that finds the key in progress) then costs no
/// allocation; one that hands out a lease shares the key with it ([`ScopedKey::shared`]).
#[derive(Clone)]
pub(crate) enum ScopedKey {
    Inline {
        len: u8,
        bytes: [u8; SCOPED_INLINE_LEN],
    },
    Shared(Arc<[u8]>),
}

// An inline key's length fits its byte.
const _: () = assert!(SCOPED_INLINE_LEN <= u8::MAX as usize);

impl ScopedKey {
    /// The scoped key of `key` within `scope`; `None` for a scope past `SCOPE_LEN_MAX`.
    pub(crate) fn new(scope: &[u8], key: &[u8]) -> Option<Self> {
        let len = prefix(scope)?;
        match Self::inline(&[&[len], scope, key]) {
            Some(inline) => Some(inline),
            None => scoped_shared(scope, key).map(Self::Shared),
        }
    }

    /// `key` without a scope: the key behind a zero byte, which is always within the limit.
    pub(crate) fn unscoped(key: &[u8]) -> Self {
        Self::inline(&[&[0], key]).unwrap_or_else(|| Self::Shared(unscoped_shared(key)))
    }

    /// A copy of `scoped`, bytes that are already a scoped key.
    pub(crate) fn copied(scoped: &[u8]) -> Self {
        Self::inline(&[scoped]).unwrap_or_else(|| Self::Shared(Arc::from(scoped)))
    }

    /// `parts`, one after the other, inline; `None` if they are longer than it holds.
    fn inline(parts: &[&[u8]]) -> Option<Self> {
        let mut bytes = [0u8; SCOPED_INLINE_LEN];
        let end = gather(&mut bytes, parts)?;
        // At most SCOPED_INLINE_LEN, which fits a byte (asserted above).
        #[allow(clippy::cast_possible_truncation)]
        let len = end as u8;
        Some(Self::Inline { len, bytes })
    }

    /// The key in a shared allocation, for a remote backend to keep beyond the call: a copy
    /// of an inline key, the same allocation for a shared one.
    #[cfg_attr(not(any(test, feature = "postgres")), allow(dead_code))]
    pub(crate) fn shared(&self) -> Arc<[u8]> {
        match self {
            Self::Inline { .. } => Arc::from(&**self),
            Self::Shared(shared) => Arc::clone(shared),
        }
    }
}

/// Equal when the bytes are, inline or shared.
impl PartialEq for ScopedKey {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for ScopedKey {}

impl std::hash::Hash for ScopedKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (**self).hash(state);
    }
}

impl std::fmt::Debug for ScopedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

impl std::ops::Deref for ScopedKey {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Shared(shared) => shared,
        }
    }
}

/// The scoped key of `key` within `scope`, or `None` if the scope is longer than
/// `SCOPE_LEN_MAX` (no key lives there).
pub(crate) fn scoped(scope: &[u8], key: &[u8]) -> Option<Box<[u8]>> {
    let mut out = Vec::with_capacity(1 + scope.len() + key.len());
    write_scoped(&mut out, scope, key).then(|| out.into_boxed_slice())
}

/// [`scoped`] in one shared allocation: the form of a key too long for [`ScopedKey`]'s
/// inline bytes, and the one a remote backend keeps. Built on the stack first, so the shared slice is allocated once, at its size, and filled
/// by one copy (one longer than `SCOPED_STACK_LEN` takes a second allocation). Collecting
/// the three parts as one exact-size iterator also allocates once, but copies byte by byte:
/// in alternating one-core runs of the memory-only bench it was the slower in three of four.
pub(crate) fn scoped_shared(scope: &[u8], key: &[u8]) -> Option<Arc<[u8]>> {
    let len = prefix(scope)?;
    let mut buf = [0u8; SCOPED_STACK_LEN];
    match gather(&mut buf, &[&[len], scope, key]) {
        Some(end) => Some(Arc::from(&buf[..end])),
        None => scoped(scope, key).map(Arc::from),
    }
}

/// Copies `parts` one after the other to the start of `buf` and returns their length;
/// `None`, with nothing copied, if they do not fit.
fn gather(buf: &mut [u8], parts: &[&[u8]]) -> Option<usize> {
    let end: usize = parts.iter().map(|p| p.len()).sum();
    if end > buf.len() {
        return None;
    }
    let mut at = 0;
    for part in parts {
        buf[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    Some(end)
}

/// [`scoped_shared`] of `key` without a scope, which is always within the limit.
pub(crate) fn unscoped_shared(key: &[u8]) -> Arc<[u8]> {
    std::iter::once(0).chain(key.iter().copied()).collect()
}

/// Writes the scoped key of `key` within `scope` into `out` (cleared first); false, with
/// `out` empty, if the scope is longer than `SCOPE_LEN_MAX`.
pub(crate) fn write_scoped(out: &mut Vec<u8>, scope: &[u8], key: &[u8]) -> bool {
    out.clear();
    let Some(len) = prefix(scope) else {
        return false;
    };
    out.push(len);
    out.extend_from_slice(scope);
    out.extend_from_slice(key);
    true
}

/// The byte a scoped key of `scope` starts with (the scope's length), or `None` if the
/// scope is longer than `SCOPE_LEN_MAX`.
pub(crate) fn prefix(scope: &[u8]) -> Option<u8> {
    u8::try_from(scope.len())
        .ok()
        .filter(|&l| usize::from(l) <= SCOPE_LEN_MAX)
}

/// Whether `bytes` is a scoped key: a length byte the rest is long enough for.
pub(crate) fn is_scoped(bytes: &[u8]) -> bool {
    bytes
        .split_first()
        .is_some_and(|(&len, rest)| rest.len() >= usize::from(len))
}

/// The scope and the key of a scoped key. Every scoped key is built by [`scoped`],
/// [`scoped_shared`] or a [`ScopedKey`] constructor; bytes that are not one (which the engine never makes) read as an
/// unscoped key.
pub(crate) fn split(scoped: &[u8]) -> (&[u8], &[u8]) {
    let parts = scoped
        .split_first()
        .and_then(|(&len, rest)| rest.split_at_checked(usize::from(len)));
    parts.unwrap_or((&[], scoped))
}

/// The key part of a scoped key.
pub(crate) fn key_of(scoped: &[u8]) -> &[u8] {
    split(scoped).1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scoped_keys_split_back_and_never_meet() {
        let pairs: [(&[u8], &[u8]); 5] = [
            (b"", b"k"),
            (b"ab", b"c"),
            (b"a", b"bc"),
            (b"\x01", b"k"),
            (b"", b"\x01k"),
        ];
        let keys: Vec<Box<[u8]>> = pairs.iter().map(|(s, k)| scoped(s, k).unwrap()).collect();
        for (i, (scope, key)) in pairs.iter().enumerate() {
            assert_eq!(split(&keys[i]), (*scope, *key));
            assert!(is_scoped(&keys[i]));
            for j in i + 1..pairs.len() {
                assert_ne!(keys[i], keys[j], "{:?} and {:?}", pairs[i], pairs[j]);
            }
        }
        // The shared form is the same bytes, on either side of its stack buffer's size.
        let long = [7u8; SCOPED_STACK_LEN];
        let edges = [
            (&b""[..], &long[..SCOPED_STACK_LEN - 1]),
            (&b""[..], &long[..]),
            (&b"s"[..], &long[..]),
        ];
        for (scope, key) in pairs.iter().copied().chain(edges) {
            assert_eq!(
                scoped_shared(scope, key).as_deref(),
                scoped(scope, key).as_deref()
            );
        }
        assert!(scoped_shared(&[0; SCOPE_LEN_MAX + 1], b"k").is_none());
        // So is a call's owned form, inline or shared, on either side of its inline size.
        let inline_edges = [
            (&b""[..], &long[..SCOPED_INLINE_LEN - 1]),
            (&b""[..], &long[..SCOPED_INLINE_LEN]),
            (&b"s"[..], &long[..SCOPED_INLINE_LEN - 2]),
            (&b"s"[..], &long[..SCOPED_INLINE_LEN - 1]),
        ];
        for (scope, key) in pairs.iter().copied().chain(edges).chain(inline_edges) {
            let owned = ScopedKey::new(scope, key).unwrap();
            let inline = matches!(owned, ScopedKey::Inline { .. });
            assert_eq!(inline, 1 + scope.len() + key.len() <= SCOPED_INLINE_LEN);
            assert_eq!(Some(&*owned), scoped(scope, key).as_deref());
            assert_eq!(&*owned.shared(), &*owned);
        }
        assert!(ScopedKey::new(&[0; SCOPE_LEN_MAX + 1], b"k").is_none());
        // Bytes the engine never makes: no length byte, or one past the end.
        assert!(!is_scoped(b""));
        assert!(!is_scoped(b"k"));
        assert!(!is_scoped(b"\x03ab"));
        // The unscoped key is the key behind a zero byte.
        assert_eq!(&*scoped(b"", b"order-42").unwrap(), b"\0order-42");
        assert_eq!(key_of(b"\0order-42"), b"order-42");
    }

    #[test]
    fn a_scope_past_its_limit_has_no_key() {
        let longest = vec![7u8; SCOPE_LEN_MAX];
        let key = scoped(&longest, b"k").unwrap();
        assert_eq!(split(&key), (&longest[..], &b"k"[..]));
        assert!(scoped(&[7u8; SCOPE_LEN_MAX + 1], b"k").is_none());
        let mut buf = vec![1, 2, 3];
        assert!(!write_scoped(&mut buf, &[7u8; SCOPE_LEN_MAX + 1], b"k"));
        assert!(buf.is_empty());
        // Bytes the engine never builds read as unscoped, without a panic.
        assert_eq!(split(b""), (&b""[..], &b""[..]));
        assert_eq!(split(b"\x09ab"), (&b""[..], &b"\x09ab"[..]));
    }
}
