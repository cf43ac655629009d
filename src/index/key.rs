//! A key as the index files it: its keyed hash, split into the stripe that owns the key and
//! the tag its stripe's table files it under (kept in the slot, so a table grows without
//! reading a key or hashing again).

use crate::base::hash::KeyHasher;
use crate::model::slot::Slot;

/// What only the index asks of a slot: its place in the table.
impl Slot {
    /// The hash the table files this slot under (see [`Key`]).
    pub(super) fn table_hash(&self) -> u64 {
        let [a, b, c] = self.tag;
        table_hash(u32::from_le_bytes([a, b, c, 0]))
    }

    /// Whether this slot's key has the table tag `tag` (see [`Key::is`]).
    fn has_tag(&self, tag: u32) -> bool {
        self.tag == tag_bytes(tag)
    }
}

/// A key with its keyed hash. Made once per operation (`Index::lock`), so the key is
/// hashed once whether the operation picks a stripe, looks a slot up or inserts one.
///
/// One keyed hash gives two independent parts: bits 32 and up pick the stripe, and the low
/// `TAG_BITS` are the key's tag, from which the stripe's table derives the hash it files the
/// key under. The tag is kept in the slot, so the table grows (rehashes every entry) without
/// reading a key or computing a keyed hash. A table of more than 2^`TAG_BITS` buckets (over
/// eight million keys in one stripe) would have more buckets than tags, and probe longer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Key<'a> {
    pub(super) bytes: &'a [u8],
    /// The whole keyed hash: a marker's name for the key.
    pub(super) keyed: u64,
    /// The table hash: `table_hash(tag)`.
    pub(super) hash: u64,
    pub(super) tag: u32,
    /// Bits 32 to 63 of the keyed hash.
    pub(super) stripe_bits: u32,
}

/// Bits of the keyed hash kept in a slot (the padding holds three bytes).
const TAG_BITS: u32 = 24;

/// The table tag of a key whose keyed hash is `keyed`: its low `TAG_BITS` bits.
pub(super) fn tag_of(keyed: u64) -> u32 {
    (keyed as u32) & ((1 << TAG_BITS) - 1)
}

/// The hash a stripe's table files a key of tag `tag` under: a multiply spreads the tag
/// over the table's bucket bits (the low ones) and its control bits (the top seven).
pub(super) fn table_hash(tag: u32) -> u64 {
    u64::from(tag).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The three bytes of a 24-bit table tag, as a slot stores them.
pub(super) fn tag_bytes(tag: u32) -> [u8; 3] {
    let [a, b, c, _] = tag.to_le_bytes();
    [a, b, c]
}

impl<'a> Key<'a> {
    /// Whether the table entry (`k`, `s`) is this key. The tag is compared first: a
    /// control-byte match of another key then costs no read of its boxed key (a cache
    /// miss), and only keys with equal 24-bit tags are compared byte by byte.
    pub(super) fn is(&self, k: &[u8], s: &Slot) -> bool {
        debug_assert!(
            s.has_tag(self.tag) || k != self.bytes,
            "a key's slot carries its tag"
        );
        s.has_tag(self.tag) && k == self.bytes
    }

    pub(super) fn new(hasher: &KeyHasher, bytes: &'a [u8]) -> Self {
        let keyed = hasher.hash(bytes);
        let tag = tag_of(keyed);
        Key {
            bytes,
            keyed,
            hash: table_hash(tag),
            tag,
            stripe_bits: (keyed >> 32) as u32,
        }
    }

    pub(crate) fn bytes(&self) -> &'a [u8] {
        self.bytes
    }
}
