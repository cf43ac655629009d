//! Request fingerprints: 128-bit BLAKE3 hashes of a request's bytes or of the canonical
//! encoding of a serde value, so that a retry of the same request matches however its
//! maps were ordered.
//!
//! # The canonical encoding
//!
//! [`Fingerprint::of`] serializes the value into a type-tagged, self-delimiting byte
//! stream and hashes it. Every value starts with a one-byte tag:
//!
//! | tag | value | followed by |
//! |---|---|---|
//! | `0x00` | end of a sequence or map | — |
//! | `0x01` | unit, unit struct (JSON `null` as `serde_json::Value`) | — |
//! | `0x02` | `None` | — |
//! | `0x03` | `Some` | the value |
//! | `0x04`, `0x05` | `false`, `true` | — |
//! | `0x06` | a negative number | its magnitude, 16 bytes big-endian |
//! | `0x07` | a non-negative number | its value, 16 bytes big-endian |
//! | `0x08` | any other float | its `f64` bits, 8 bytes big-endian |
//! | `0x09` | a string, a `char` | its length (8 bytes big-endian), its UTF-8 |
//! | `0x0a` | a byte string (`serialize_bytes`) | its length (8 bytes big-endian), the bytes |
//! | `0x0b` | a sequence, tuple, tuple struct, array | the elements, then `0x00` |
//! | `0x0c` | a map, struct | the entries (key, value) sorted by the key's bytes, then `0x00` |
//!
//! Scalars have a fixed length, strings a length prefix, and containers an end tag that
//! starts no value, so no encoding is a prefix of another and a sequence of them splits
//! one way only: `["ab","c"]` and `["a","bc"]` differ. Only representation is erased:
//!
//! - **Numbers compare by value.** Every integer type writes its value (`5u8`, `5i64` and
//!   `5u128` are one number); a float with an integral value within ±(2¹²⁸ − 1) is that
//!   integer (`1.0` is `1`, `-0.0` is `0`, as JSON canonicalization (RFC 8785) has it); other
//!   floats are `f64`s (an `f32` widens exactly), every NaN is one quiet NaN.
//! - **Sequences** (a `Vec`, a slice, a tuple, an array, a tuple struct) are one kind.
//! - **Maps and structs** are one kind: a struct's fields are string keys, skipped fields
//!   are absent. Entries are sorted by their key's encoding, so insertion and hashing
//!   order do not matter. Two equal keys are [`FingerprintError::DuplicateKey`].
//! - **Newtype structs** are their content. **Enums** are written as serde_json writes
//!   them (externally tagged): a unit variant is its name as a string, any other variant a
//!   one-entry map from its name to its content. Variant indices are not used, so
//!   reordering an enum's variants keeps its fingerprints.
//! - `char` is a one-character string.
//!
//! `None`, `Some(x)` and unit keep tags of their own, so `Option<()>`'s two values and
//! `Some(None)` against `None` differ. A consequence: a typed field `Option<T>` and the
//! `serde_json::Value` of the same document differ (JSON writes both `None` and unit as
//! `null`, and `Some(x)` as `x`), as do integer map keys, which JSON writes as strings, and
//! byte strings, which JSON writes as arrays. Fingerprint a request as one type every time:
//! the type the handler parses it into, or `serde_json::Value`. The serializer reports
//! itself human-readable, as serde_json does, so types such as addresses and UUIDs are
//! strings.
//!
//! Every limit is in `model/constants.rs`: the nesting depth (`FINGERPRINT_DEPTH_MAX`, enough
//! for anything serde_json parses) and the encoding's length
//! (`FINGERPRINT_ENCODING_LEN_MAX`).
//!
//! # The hash
//!
//! BLAKE3 in its key-derivation mode, one context string for raw bytes and another for
//! canonical values, truncated to its first 16 bytes (read big-endian). A fingerprint's
//! high 64 bits are never all zero (an all-zero high half is replaced by 1, a change of
//! probability 2⁻⁶⁴), so a 128-bit fingerprint never equals a 64-bit one.

use crate::model::constants::{
    FINGERPRINT_CONTEXT_BYTES, FINGERPRINT_CONTEXT_VALUE, FINGERPRINT_DEPTH_MAX,
    FINGERPRINT_ENCODING_LEN_MAX,
};
use crate::model::error::FingerprintError;
use serde::ser::{self, Serialize};
use std::fmt;

const TAG_END: u8 = 0x00;
const TAG_UNIT: u8 = 0x01;
const TAG_NONE: u8 = 0x02;
const TAG_SOME: u8 = 0x03;
const TAG_FALSE: u8 = 0x04;
const TAG_TRUE: u8 = 0x05;
const TAG_NEG: u8 = 0x06;
const TAG_INT: u8 = 0x07;
const TAG_FLOAT: u8 = 0x08;
const TAG_STR: u8 = 0x09;
const TAG_BYTES: u8 = 0x0a;
const TAG_SEQ: u8 = 0x0b;
const TAG_MAP: u8 = 0x0c;

/// The one NaN of the encoding (the quiet NaN `f64::NAN` is on common platforms).
const CANONICAL_NAN_BITS: u64 = 0x7ff8_0000_0000_0000;
/// 2¹²⁸ as an `f64` (exact): floats below it in magnitude convert to `u128` exactly.
const TWO_POW_128: f64 = 340_282_366_920_938_463_463_374_607_431_768_211_456.0;

/// A 128-bit request fingerprint.
///
/// A claim whose fingerprint differs from the one stored for its key is refused with
/// `FingerprintMismatch`: the key was reused for a different request. Fingerprints are
/// persisted, so their values are stable across versions and platforms.
///
/// ```
/// use idemkv::Fingerprint;
/// use std::collections::{BTreeMap, HashMap};
///
/// // The same JSON document with its members in another order.
/// let a: serde_json::Value = serde_json::from_str(r#"{"order":42,"amount":1999}"#)?;
/// let b: serde_json::Value = serde_json::from_str(r#"{"amount":1999,"order":42}"#)?;
/// assert_eq!(Fingerprint::of(&a)?, Fingerprint::of(&b)?);
///
/// // Raw bytes are compared byte for byte.
/// assert_ne!(
///     Fingerprint::of_bytes(br#"{"order":42,"amount":1999}"#),
///     Fingerprint::of_bytes(br#"{"amount":1999,"order":42}"#),
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(u128);

impl Fingerprint {
    /// The fingerprint of `bytes` as they are, byte for byte: for a request whose bytes the
    /// caller controls (a body it signs, a message as delivered).
    pub fn of_bytes(bytes: &[u8]) -> Fingerprint {
        Fingerprint::hash(FINGERPRINT_CONTEXT_BYTES, bytes)
    }

    /// The fingerprint of a structured request, independent of map order and of how its
    /// numbers are typed (module docs, "The canonical encoding"): the same JSON document
    /// with its members reordered, parsed into the same type, gives the same fingerprint.
    /// Never equal to an [`of_bytes`](Fingerprint::of_bytes) fingerprint of any bytes
    /// (another hash context).
    pub fn of<T: Serialize + ?Sized>(value: &T) -> Result<Fingerprint, FingerprintError> {
        let encoding = canonical(value)?;
        Ok(Fingerprint::hash(FINGERPRINT_CONTEXT_VALUE, &encoding))
    }

    /// The fingerprint as a number (the hash's first 16 bytes, big-endian).
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// The fingerprint's 16 bytes, big-endian (the hash's first 16 bytes).
    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }

    fn hash(context: &str, bytes: &[u8]) -> Fingerprint {
        let mut hasher = blake3::Hasher::new_derive_key(context);
        hasher.update(bytes);
        let mut first = [0u8; 16];
        hasher.finalize_xof().fill(&mut first);
        let mut value = u128::from_be_bytes(first);
        if value >> 64 == 0 {
            value |= 1 << 64;
        }
        Fingerprint(value)
    }
}

impl fmt::Display for Fingerprint {
    /// 32 lowercase hexadecimal digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({:032x})", self.0)
    }
}

/// The canonical encoding of `value` (module docs).
pub(crate) fn canonical<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, FingerprintError> {
    let mut encoder = Encoder {
        out: Vec::new(),
        depth: 0,
        failed: None,
    };
    let result = value.serialize(&mut encoder);
    // A `Serialize` implementation may swallow an error and carry on; the first error
    // stands, so a half-written encoding is never hashed.
    if let Some(error) = encoder.failed {
        return Err(error);
    }
    result?;
    Ok(encoder.out)
}

struct Encoder {
    out: Vec<u8>,
    /// Depth of the value being written (the top value is at 0).
    depth: usize,
    /// The first error raised, kept even if the value's implementation ignores it.
    failed: Option<FingerprintError>,
}

impl Encoder {
    fn fail(&mut self, error: FingerprintError) -> FingerprintError {
        if self.failed.is_none() {
            self.failed = Some(error.clone());
        }
        error
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), FingerprintError> {
        if bytes.len() > FINGERPRINT_ENCODING_LEN_MAX.saturating_sub(self.out.len()) {
            return Err(self.fail(FingerprintError::TooLarge {
                max: FINGERPRINT_ENCODING_LEN_MAX,
            }));
        }
        self.out.extend_from_slice(bytes);
        Ok(())
    }

    fn tag(&mut self, tag: u8) -> Result<(), FingerprintError> {
        self.write(&[tag])
    }

    /// Writes a value one level deeper than the current one.
    fn nested<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), FingerprintError> {
        if self.depth >= FINGERPRINT_DEPTH_MAX {
            return Err(self.fail(FingerprintError::TooDeep {
                max: FINGERPRINT_DEPTH_MAX,
            }));
        }
        self.depth += 1;
        let result = value.serialize(&mut *self);
        self.depth -= 1;
        // An error the value's own implementation raised (`ser::Error::custom`) is kept
        // too, in case an enclosing implementation ignores it.
        result.map_err(|error| self.fail(error))
    }

    fn int(&mut self, negative: bool, magnitude: u128) -> Result<(), FingerprintError> {
        let tag = if negative && magnitude != 0 {
            TAG_NEG
        } else {
            TAG_INT
        };
        let mut bytes = [0u8; 17];
        bytes[0] = tag;
        bytes[1..].copy_from_slice(&magnitude.to_be_bytes());
        self.write(&bytes)
    }

    fn float(&mut self, v: f64) -> Result<(), FingerprintError> {
        if v.is_nan() {
            return self.float_bits(CANONICAL_NAN_BITS);
        }
        if v.is_finite() && v.fract() == 0.0 && v.abs() < TWO_POW_128 {
            // Exact: an integral float below 2^128 in magnitude is a u128.
            return self.int(v < 0.0, v.abs() as u128);
        }
        self.float_bits(v.to_bits())
    }

    fn float_bits(&mut self, bits: u64) -> Result<(), FingerprintError> {
        let mut bytes = [0u8; 9];
        bytes[0] = TAG_FLOAT;
        bytes[1..].copy_from_slice(&bits.to_be_bytes());
        self.write(&bytes)
    }

    fn string(&mut self, tag: u8, bytes: &[u8]) -> Result<(), FingerprintError> {
        let mut head = [0u8; 9];
        head[0] = tag;
        head[1..].copy_from_slice(&(bytes.len() as u64).to_be_bytes());
        self.write(&head)?;
        self.write(bytes)
    }

    /// Opens a map: what follows up to the matching `MapEncoder::finish` is its entries.
    fn map(&mut self, extra_ends: usize) -> Result<MapEncoder<'_>, FingerprintError> {
        self.tag(TAG_MAP)?;
        let start = self.out.len();
        Ok(MapEncoder {
            enc: self,
            start,
            entries: Vec::new(),
            key_start: None,
            extra_ends,
        })
    }

    /// Opens an enum variant with content: a one-entry map from its name to the content.
    fn variant(&mut self, variant: &str) -> Result<(), FingerprintError> {
        self.tag(TAG_MAP)?;
        self.string(TAG_STR, variant.as_bytes())
    }

    fn serialize_error(&mut self, message: &str) -> FingerprintError {
        self.fail(FingerprintError::Serialize {
            message: message.to_owned(),
        })
    }
}

impl ser::Error for FingerprintError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        FingerprintError::Serialize {
            message: msg.to_string(),
        }
    }
}

impl<'a> ser::Serializer for &'a mut Encoder {
    type Ok = ();
    type Error = FingerprintError;
    type SerializeSeq = SeqEncoder<'a>;
    type SerializeTuple = SeqEncoder<'a>;
    type SerializeTupleStruct = SeqEncoder<'a>;
    type SerializeTupleVariant = SeqEncoder<'a>;
    type SerializeMap = MapEncoder<'a>;
    type SerializeStruct = MapEncoder<'a>;
    type SerializeStructVariant = MapEncoder<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), FingerprintError> {
        self.tag(if v { TAG_TRUE } else { TAG_FALSE })
    }

    fn serialize_i8(self, v: i8) -> Result<(), FingerprintError> {
        self.serialize_i128(i128::from(v))
    }

    fn serialize_i16(self, v: i16) -> Result<(), FingerprintError> {
        self.serialize_i128(i128::from(v))
    }

    fn serialize_i32(self, v: i32) -> Result<(), FingerprintError> {
        self.serialize_i128(i128::from(v))
    }

    fn serialize_i64(self, v: i64) -> Result<(), FingerprintError> {
        self.serialize_i128(i128::from(v))
    }

    fn serialize_i128(self, v: i128) -> Result<(), FingerprintError> {
        self.int(v < 0, v.unsigned_abs())
    }

    fn serialize_u8(self, v: u8) -> Result<(), FingerprintError> {
        self.serialize_u128(u128::from(v))
    }

    fn serialize_u16(self, v: u16) -> Result<(), FingerprintError> {
        self.serialize_u128(u128::from(v))
    }

    fn serialize_u32(self, v: u32) -> Result<(), FingerprintError> {
        self.serialize_u128(u128::from(v))
    }

    fn serialize_u64(self, v: u64) -> Result<(), FingerprintError> {
        self.serialize_u128(u128::from(v))
    }

    fn serialize_u128(self, v: u128) -> Result<(), FingerprintError> {
        self.int(false, v)
    }

    fn serialize_f32(self, v: f32) -> Result<(), FingerprintError> {
        self.float(f64::from(v))
    }

    fn serialize_f64(self, v: f64) -> Result<(), FingerprintError> {
        self.float(v)
    }

    fn serialize_char(self, v: char) -> Result<(), FingerprintError> {
        let mut buf = [0u8; 4];
        self.string(TAG_STR, v.encode_utf8(&mut buf).as_bytes())
    }

    fn serialize_str(self, v: &str) -> Result<(), FingerprintError> {
        self.string(TAG_STR, v.as_bytes())
    }

    fn serialize_bytes(self, v: &[u8]) -> Result<(), FingerprintError> {
        self.string(TAG_BYTES, v)
    }

    fn serialize_none(self) -> Result<(), FingerprintError> {
        self.tag(TAG_NONE)
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), FingerprintError> {
        self.tag(TAG_SOME)?;
        self.nested(value)
    }

    fn serialize_unit(self) -> Result<(), FingerprintError> {
        self.tag(TAG_UNIT)
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), FingerprintError> {
        self.tag(TAG_UNIT)
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), FingerprintError> {
        self.string(TAG_STR, variant.as_bytes())
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), FingerprintError> {
        self.nested(value)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), FingerprintError> {
        self.variant(variant)?;
        self.nested(value)?;
        self.tag(TAG_END)
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<SeqEncoder<'a>, FingerprintError> {
        self.tag(TAG_SEQ)?;
        Ok(SeqEncoder { enc: self, ends: 1 })
    }

    fn serialize_tuple(self, len: usize) -> Result<SeqEncoder<'a>, FingerprintError> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> Result<SeqEncoder<'a>, FingerprintError> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<SeqEncoder<'a>, FingerprintError> {
        self.variant(variant)?;
        self.tag(TAG_SEQ)?;
        Ok(SeqEncoder { enc: self, ends: 2 })
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<MapEncoder<'a>, FingerprintError> {
        self.map(0)
    }

    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<MapEncoder<'a>, FingerprintError> {
        self.map(0)
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<MapEncoder<'a>, FingerprintError> {
        self.variant(variant)?;
        self.map(1)
    }
}

/// A sequence being written; `ends` end tags close it (two for a tuple variant: its
/// sequence and its one-entry map).
pub(crate) struct SeqEncoder<'a> {
    enc: &'a mut Encoder,
    ends: usize,
}

impl SeqEncoder<'_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), FingerprintError> {
        self.enc.nested(value)
    }

    fn finish(self) -> Result<(), FingerprintError> {
        for _ in 0..self.ends {
            self.enc.tag(TAG_END)?;
        }
        Ok(())
    }
}

impl ser::SerializeSeq for SeqEncoder<'_> {
    type Ok = ();
    type Error = FingerprintError;

    fn serialize_element<T: Serialize + ?Sized>(
        &mut self,
        value: &T,
    ) -> Result<(), FingerprintError> {
        self.element(value)
    }

    fn end(self) -> Result<(), FingerprintError> {
        self.finish()
    }
}

impl ser::SerializeTuple for SeqEncoder<'_> {
    type Ok = ();
    type Error = FingerprintError;

    fn serialize_element<T: Serialize + ?Sized>(
        &mut self,
        value: &T,
    ) -> Result<(), FingerprintError> {
        self.element(value)
    }

    fn end(self) -> Result<(), FingerprintError> {
        self.finish()
    }
}

impl ser::SerializeTupleStruct for SeqEncoder<'_> {
    type Ok = ();
    type Error = FingerprintError;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        value: &T,
    ) -> Result<(), FingerprintError> {
        self.element(value)
    }

    fn end(self) -> Result<(), FingerprintError> {
        self.finish()
    }
}

impl ser::SerializeTupleVariant for SeqEncoder<'_> {
    type Ok = ();
    type Error = FingerprintError;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        value: &T,
    ) -> Result<(), FingerprintError> {
        self.element(value)
    }

    fn end(self) -> Result<(), FingerprintError> {
        self.finish()
    }
}

/// A map (or struct) being written. Its entries are written in the order given, from
/// `start` on, and put in key order when it finishes.
pub(crate) struct MapEncoder<'a> {
    enc: &'a mut Encoder,
    /// Where the first entry starts in the output.
    start: usize,
    /// Each entry written: where its key starts, where its value starts, where it ends.
    entries: Vec<(usize, usize, usize)>,
    /// The key written without its value yet.
    key_start: Option<usize>,
    /// End tags written after the map's own (one for a struct variant's one-entry map).
    extra_ends: usize,
}

impl MapEncoder<'_> {
    fn key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), FingerprintError> {
        if self.key_start.is_some() {
            return Err(self.enc.serialize_error("a map key followed another key"));
        }
        let key_start = self.enc.out.len();
        self.enc.nested(key)?;
        self.key_start = Some(key_start);
        Ok(())
    }

    fn value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), FingerprintError> {
        let Some(key_start) = self.key_start.take() else {
            return Err(self.enc.serialize_error("a map value without a key"));
        };
        let value_start = self.enc.out.len();
        self.enc.nested(value)?;
        self.entries
            .push((key_start, value_start, self.enc.out.len()));
        Ok(())
    }

    fn field<T: Serialize + ?Sized>(
        &mut self,
        name: &'static str,
        value: &T,
    ) -> Result<(), FingerprintError> {
        self.key(name)?;
        self.value(value)
    }

    /// Puts the entries in the order of their keys' encodings and closes the map.
    fn finish(self) -> Result<(), FingerprintError> {
        if self.key_start.is_some() {
            return Err(self.enc.serialize_error("a map key without its value"));
        }
        if self.enc.failed.is_some() || self.start > self.enc.out.len() {
            return Err(self.enc.serialize_error("a map's entries were cut short"));
        }
        let region = self.enc.out.split_off(self.start);
        // Offsets into `region`; every entry lies in it unless an implementation carried
        // on past an error, which `failed` has already refused.
        let slice = |from: usize, to: usize| {
            let from = from.checked_sub(self.start)?;
            let to = to.checked_sub(self.start)?;
            region.get(from..to)
        };
        let mut entries = Vec::with_capacity(self.entries.len());
        for &(key_start, value_start, end) in &self.entries {
            match (slice(key_start, value_start), slice(key_start, end)) {
                (Some(key), Some(entry)) => entries.push((key, entry)),
                _ => return Err(self.enc.serialize_error("a map's entries were cut short")),
            }
        }
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        if entries.windows(2).any(|pair| pair[0].0 == pair[1].0) {
            return Err(self.enc.fail(FingerprintError::DuplicateKey));
        }
        for (_, entry) in entries {
            self.enc.out.extend_from_slice(entry);
        }
        self.enc.tag(TAG_END)?;
        for _ in 0..self.extra_ends {
            self.enc.tag(TAG_END)?;
        }
        Ok(())
    }
}

impl ser::SerializeMap for MapEncoder<'_> {
    type Ok = ();
    type Error = FingerprintError;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), FingerprintError> {
        self.key(key)
    }

    fn serialize_value<T: Serialize + ?Sized>(
        &mut self,
        value: &T,
    ) -> Result<(), FingerprintError> {
        self.value(value)
    }

    fn end(self) -> Result<(), FingerprintError> {
        self.finish()
    }
}

impl ser::SerializeStruct for MapEncoder<'_> {
    type Ok = ();
    type Error = FingerprintError;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        name: &'static str,
        value: &T,
    ) -> Result<(), FingerprintError> {
        self.field(name, value)
    }

    fn end(self) -> Result<(), FingerprintError> {
        self.finish()
    }
}

impl ser::SerializeStructVariant for MapEncoder<'_> {
    type Ok = ();
    type Error = FingerprintError;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        name: &'static str,
        value: &T,
    ) -> Result<(), FingerprintError> {
        self.field(name, value)
    }

    fn end(self) -> Result<(), FingerprintError> {
        self.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;
    use serde_json::{json, Value};
    use std::collections::{BTreeMap, HashMap};

    fn fp<T: Serialize + ?Sized>(value: &T) -> Fingerprint {
        Fingerprint::of(value).unwrap()
    }

    fn parse(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    /// A string's encoding: its tag, its length (8 bytes big-endian), its bytes.
    fn enc_str(s: &str) -> Vec<u8> {
        let mut out = vec![TAG_STR];
        out.extend_from_slice(&(s.len() as u64).to_be_bytes());
        out.extend_from_slice(s.as_bytes());
        out
    }

    fn enc_int(tag: u8, magnitude: u128) -> Vec<u8> {
        let mut out = vec![tag];
        out.extend_from_slice(&magnitude.to_be_bytes());
        out
    }

    #[test]
    fn reordered_json_documents_have_one_fingerprint() {
        let a = parse(
            r#"{"order":42,"lines":[{"sku":"A","qty":1},{"qty":2,"sku":"B"}],"meta":{"x":null,"y":true}}"#,
        );
        let b = parse(
            r#"{ "meta": {"y": true, "x": null}, "lines": [{"qty": 1, "sku": "A"},
                {"sku": "B", "qty": 2}], "order": 42 }"#,
        );
        assert_eq!(fp(&a), fp(&b));
        // The raw bytes differ, and `of_bytes` says so.
        assert_ne!(
            Fingerprint::of_bytes(br#"{"a":1,"b":2}"#),
            Fingerprint::of_bytes(br#"{"b":2,"a":1}"#)
        );
        // Element order of an array is part of the value.
        assert_ne!(fp(&parse("[1,2]")), fp(&parse("[2,1]")));
    }

    #[test]
    fn hash_map_and_btree_map_agree_whatever_the_insertion_order() {
        let words = ["delta", "alpha", "charlie", "bravo", "echo", "foxtrot"];
        let mut btree = BTreeMap::new();
        let mut forward = HashMap::new();
        let mut backward = HashMap::new();
        for (i, w) in words.iter().enumerate() {
            btree.insert(w.to_string(), i);
            forward.insert(w.to_string(), i);
        }
        for (i, w) in words.iter().enumerate().rev() {
            backward.insert(w.to_string(), i as u8);
        }
        assert_eq!(fp(&btree), fp(&forward));
        assert_eq!(fp(&btree), fp(&backward));
        // A struct is a map with its field names as keys.
        #[derive(Serialize)]
        struct Req {
            order: u32,
            amount: i64,
        }
        assert_eq!(
            fp(&Req {
                order: 42,
                amount: 1999
            }),
            fp(&parse(r#"{"amount":1999,"order":42}"#))
        );
    }

    #[test]
    fn distinct_values_have_distinct_fingerprints() {
        let pairs: Vec<(Value, Value)> = vec![
            (json!("1"), json!(1)),
            (json!([]), json!({})),
            (json!(["ab", "c"]), json!(["a", "bc"])),
            (json!({"a": "bc"}), json!({"ab": "c"})),
            (json!([[1], []]), json!([[], [1]])),
            (json!({"a": [1, 2]}), json!({"a": [1], "b": 2})),
            (json!(true), json!(1)),
            (json!(null), json!(false)),
            (json!(-1), json!(1)),
            (json!(0.5), json!(0)),
            (json!(""), json!([])),
        ];
        for (a, b) in &pairs {
            assert_ne!(fp(a), fp(b), "{a} and {b}");
        }
        // Option and unit keep their own tags.
        let none: Option<()> = None;
        assert_ne!(fp(&none), fp(&()));
        assert_ne!(fp(&Some(())), fp(&()));
        assert_ne!(fp(&Some(())), fp(&none));
        assert_ne!(fp(&Some(None::<u8>)), fp(&None::<Option<u8>>));
        assert_ne!(fp(&Some(5u8)), fp(&5u8));
        // A byte string is not a string.
        assert_ne!(fp(&Bytes(b"ab")), fp("ab"));
        assert_ne!(fp(&Bytes(b"ab")), fp(&b"ab"[..]));
        // Structured and raw fingerprints never meet, even of the encoding itself.
        let v = json!({"a": 1});
        assert_ne!(fp(&v), Fingerprint::of_bytes(&canonical(&v).unwrap()));
    }

    /// A value that serializes as a byte string (as `serde_bytes` does).
    struct Bytes<'a>(&'a [u8]);

    impl Serialize for Bytes<'_> {
        fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }

    #[test]
    fn numbers_compare_by_value() {
        let five = fp(&5u8);
        assert_eq!(fp(&5i64), five);
        assert_eq!(fp(&5u128), five);
        assert_eq!(fp(&5.0f64), five);
        assert_eq!(fp(&5.0f32), five);
        assert_eq!(fp(&-0.0f64), fp(&0u8));
        assert_eq!(fp(&-7i8), fp(&-7.0f64));
        assert_eq!(fp(&0.5f32), fp(&0.5f64));
        assert_eq!(fp(&f64::NAN), fp(&-f64::NAN));
        assert_eq!(fp(&f64::NAN), fp(&f32::NAN));
        assert_eq!(fp(&f64::from_bits(0x7ff0_0000_0000_0001)), fp(&f64::NAN));
        assert_ne!(fp(&f64::INFINITY), fp(&f64::NEG_INFINITY));
        assert_ne!(fp(&f64::INFINITY), fp(&f64::NAN));
        assert_eq!(fp(&i128::MIN), fp(&(i128::MIN as f64)));
        assert_eq!(fp(&u64::MAX), fp(&u128::from(u64::MAX)));
        // 2^128 is beyond every integer type: it stays a float.
        assert_ne!(fp(&u128::MAX), fp(&(u128::MAX as f64)));
        assert_eq!(
            canonical(&(u128::MAX as f64)).unwrap()[0],
            TAG_FLOAT,
            "2^128 as a float"
        );
        // JSON spellings of one number.
        let ten = fp(&parse("10"));
        assert_eq!(fp(&parse("1e1")), ten);
        assert_eq!(fp(&parse("10.0")), ten);
        assert_eq!(fp(&parse("[-0.0]")), fp(&parse("[0]")));
        assert_ne!(fp(&parse("10.5")), ten);
    }

    #[test]
    fn representation_is_erased_for_newtypes_tuples_chars_and_enums() {
        #[derive(Serialize)]
        struct Id(u32);
        #[derive(Serialize)]
        struct Pair(u8, String);
        assert_eq!(fp(&Id(7)), fp(&7u32));
        assert_eq!(fp(&(1u8, "x")), fp(&parse(r#"[1,"x"]"#)));
        assert_eq!(fp(&Pair(1, "x".into())), fp(&[json!(1), json!("x")][..]));
        assert_eq!(fp(&'é'), fp("é"));

        #[derive(Serialize)]
        enum Before {
            Refund,
            Charge(u32),
            Split(u8, u8),
            Move { from: u8, to: u8 },
        }
        // The same variants in another order, with other indices.
        #[derive(Serialize)]
        enum After {
            Move { to: u8, from: u8 },
            Split(u8, u8),
            Charge(u32),
            Refund,
        }
        assert_eq!(fp(&Before::Refund), fp(&After::Refund));
        assert_eq!(fp(&Before::Charge(3)), fp(&After::Charge(3)));
        assert_eq!(fp(&Before::Split(1, 2)), fp(&After::Split(1, 2)));
        assert_eq!(
            fp(&Before::Move { from: 1, to: 2 }),
            fp(&After::Move { to: 2, from: 1 })
        );
        // As serde_json writes them.
        for v in [
            Before::Refund,
            Before::Charge(3),
            Before::Split(1, 2),
            Before::Move { from: 1, to: 2 },
        ] {
            assert_eq!(fp(&v), fp(&serde_json::to_value(&v).unwrap()));
        }
    }

    #[test]
    fn the_encoding_and_the_fingerprints_are_stable() {
        // Fingerprints are persisted: this pins the encoding of the module docs byte for
        // byte, and the hash over it.
        let value = parse(r#"{"b":[1,-2,2.5,"x",true,null],"a":{}}"#);
        let mut expected = vec![TAG_MAP];
        expected.extend(enc_str("a"));
        expected.extend([TAG_MAP, TAG_END]);
        expected.extend(enc_str("b"));
        expected.push(TAG_SEQ);
        expected.extend(enc_int(TAG_INT, 1));
        expected.extend(enc_int(TAG_NEG, 2));
        expected.push(TAG_FLOAT);
        expected.extend(2.5f64.to_bits().to_be_bytes());
        expected.extend(enc_str("x"));
        expected.extend([TAG_TRUE, TAG_UNIT, TAG_END, TAG_END]);
        assert_eq!(canonical(&value).unwrap(), expected);
        let mut option = vec![TAG_SEQ, TAG_SOME];
        option.extend(enc_int(TAG_INT, 3));
        option.extend([TAG_NONE, TAG_END]);
        assert_eq!(canonical(&(Some(3u8), None::<u8>)).unwrap(), option);

        // Computed independently (BLAKE3's Python binding in key-derivation mode over the
        // bytes above).
        assert_eq!(fp(&value).to_string(), "e87e115a45e332a387c804d1a9617eb1");
        assert_eq!(
            Fingerprint::of_bytes(b"").to_string(),
            "279bba64c559c59fd150c6c8cb0e6cc9"
        );
        assert_eq!(
            Fingerprint::of_bytes(br#"{"order":42}"#).to_string(),
            "5260f0132f994fd4c4c1c9791d6f53ee"
        );
        // The fingerprint is the BLAKE3 derived key's first 16 bytes.
        let full = blake3::derive_key(FINGERPRINT_CONTEXT_VALUE, &expected);
        assert_eq!(fp(&value).to_bytes()[..], full[..16]);
        assert_eq!(
            fp(&value).as_u128(),
            u128::from_be_bytes(fp(&value).to_bytes())
        );
    }

    #[test]
    fn nesting_is_limited_and_everything_serde_json_parses_fits() {
        fn arrays(depth: usize) -> Value {
            (0..depth).fold(json!([]), |inner, _| json!([inner]))
        }
        // The top array is at depth 0, so the innermost of n + 1 nested arrays is at n.
        assert!(Fingerprint::of(&arrays(FINGERPRINT_DEPTH_MAX)).is_ok());
        assert_eq!(
            Fingerprint::of(&arrays(FINGERPRINT_DEPTH_MAX + 1)),
            Err(FingerprintError::TooDeep {
                max: FINGERPRINT_DEPTH_MAX
            })
        );
        let mut object = json!(1);
        for _ in 0..=FINGERPRINT_DEPTH_MAX {
            object = json!({ "k": object });
        }
        assert!(matches!(
            Fingerprint::of(&object),
            Err(FingerprintError::TooDeep { .. })
        ));
        // Options and newtypes count too: each link of the chain is two levels (the
        // newtype's content, the `Option`'s content), so the last `None` of k links below
        // the top one is at depth 2k + 1.
        #[derive(Serialize)]
        struct Chain(Option<Box<Chain>>);
        let chain = |links: usize| (0..links).fold(Chain(None), |c, _| Chain(Some(Box::new(c))));
        let links_max = (FINGERPRINT_DEPTH_MAX - 1) / 2;
        assert!(Fingerprint::of(&chain(links_max)).is_ok());
        assert!(matches!(
            Fingerprint::of(&chain(links_max + 1)),
            Err(FingerprintError::TooDeep { .. })
        ));
        // The deepest document serde_json parses fits.
        let text = |n: usize| "[".repeat(n) + &"]".repeat(n);
        let parsed = (1..)
            .map(|n| serde_json::from_str::<Value>(&text(n)))
            .take_while(Result::is_ok)
            .last()
            .unwrap()
            .unwrap();
        assert!(Fingerprint::of(&parsed).is_ok());
    }

    #[test]
    fn equal_keys_in_one_map_are_refused() {
        #[derive(Serialize)]
        struct Req {
            a: u8,
            #[serde(flatten)]
            rest: BTreeMap<String, u8>,
        }
        let rest = BTreeMap::from([("a".to_string(), 2)]);
        assert_eq!(
            Fingerprint::of(&Req { a: 1, rest }),
            Err(FingerprintError::DuplicateKey)
        );
        // Keys equal as canonical values although their types differ.
        struct TwoOnes;
        impl Serialize for TwoOnes {
            fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use ser::SerializeMap;
                let mut map = s.serialize_map(Some(2))?;
                map.serialize_entry(&1u8, "x")?;
                map.serialize_entry(&1.0f64, "y")?;
                map.end()
            }
        }
        assert_eq!(
            Fingerprint::of(&TwoOnes),
            Err(FingerprintError::DuplicateKey)
        );
        let other = Req {
            a: 1,
            rest: BTreeMap::from([("b".to_string(), 2)]),
        };
        assert_eq!(fp(&other), fp(&json!({"a": 1, "b": 2})));
    }

    /// Fails to serialize, as a `Serialize` implementation may.
    struct Failing;

    impl Serialize for Failing {
        fn serialize<S: ser::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(ser::Error::custom("lock poisoned"))
        }
    }

    /// Ignores its element's failure and carries on, against serde's contract.
    struct Swallowing;

    impl Serialize for Swallowing {
        fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use ser::SerializeSeq;
            let mut seq = s.serialize_seq(None)?;
            let _ = seq.serialize_element(&Failing);
            seq.serialize_element(&1u8)?;
            seq.end()
        }
    }

    #[test]
    fn a_failing_serialize_is_an_error_even_when_its_caller_ignores_it() {
        let failed = FingerprintError::Serialize {
            message: "lock poisoned".into(),
        };
        assert_eq!(Fingerprint::of(&Failing), Err(failed.clone()));
        assert_eq!(Fingerprint::of(&[Failing]), Err(failed.clone()));
        assert_eq!(Fingerprint::of(&Swallowing), Err(failed.clone()));
        let in_map = BTreeMap::from([("k", Swallowing)]);
        assert_eq!(Fingerprint::of(&in_map), Err(failed.clone()));
        assert_eq!(
            failed.to_string(),
            "the value failed to serialize: lock poisoned"
        );
        // A key written twice without its value breaks the map contract.
        struct KeyKey;
        impl Serialize for KeyKey {
            fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use ser::SerializeMap;
                let mut map = s.serialize_map(None)?;
                map.serialize_key("a")?;
                map.serialize_key("b")?;
                map.end()
            }
        }
        assert!(matches!(
            Fingerprint::of(&KeyKey),
            Err(FingerprintError::Serialize { .. })
        ));
    }

    #[test]
    fn an_encoding_past_its_limit_is_refused() {
        let long = "x".repeat(FINGERPRINT_ENCODING_LEN_MAX);
        assert_eq!(
            Fingerprint::of(&long),
            Err(FingerprintError::TooLarge {
                max: FINGERPRINT_ENCODING_LEN_MAX
            })
        );
    }

    /// A random JSON value of at most `depth` levels: integers, non-integral floats,
    /// strings, booleans, nulls, arrays and objects. Without integral floats, two such
    /// values are equal as `Value`s exactly when they are equal in the canonical model.
    fn random_value(rng: &mut fastrand::Rng, depth: usize) -> Value {
        let kinds = if depth == 0 { 6 } else { 8 };
        match rng.usize(..kinds) {
            0 => Value::Null,
            1 => Value::Bool(rng.bool()),
            2 => json!(rng.u64(..4)),
            3 => json!(-(rng.i64(1..4))),
            4 => json!(rng.i64(-4..4) as f64 + 0.25),
            5 => {
                let s: String = (0..rng.usize(..3)).map(|_| rng.char('a'..='c')).collect();
                Value::String(s)
            }
            6 => Value::Array(
                (0..rng.usize(..4))
                    .map(|_| random_value(rng, depth - 1))
                    .collect(),
            ),
            _ => Value::Object(
                (0..rng.usize(..4))
                    .map(|_| {
                        let key: String =
                            (0..rng.usize(..3)).map(|_| rng.char('a'..='c')).collect();
                        (key, random_value(rng, depth - 1))
                    })
                    .collect(),
            ),
        }
    }

    /// `value` as JSON text with every object's members in a random order, random
    /// whitespace, and numbers spelled in another way where JSON allows it.
    fn shuffled_text(rng: &mut fastrand::Rng, value: &Value, out: &mut String) {
        let space = |rng: &mut fastrand::Rng, out: &mut String| {
            out.push_str(&" ".repeat(rng.usize(..2)));
        };
        match value {
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    space(rng, out);
                    shuffled_text(rng, item, out);
                }
                out.push(']');
            }
            Value::Object(map) => {
                let mut members: Vec<_> = map.iter().collect();
                rng.shuffle(&mut members);
                out.push('{');
                for (i, (key, item)) in members.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    space(rng, out);
                    out.push_str(&serde_json::to_string(key).unwrap());
                    out.push(':');
                    space(rng, out);
                    shuffled_text(rng, item, out);
                }
                out.push('}');
            }
            Value::Number(n) if n.is_u64() && rng.bool() => out.push_str(&format!("{n}.0")),
            other => out.push_str(&other.to_string()),
        }
    }

    #[test]
    fn random_documents_reordered_keep_their_fingerprint_and_distinct_ones_differ() {
        let mut rng = fastrand::Rng::with_seed(0x1de4_0f19);
        let values: Vec<Value> = (0..300).map(|_| random_value(&mut rng, 3)).collect();
        let prints: Vec<Fingerprint> = values.iter().map(fp).collect();
        for (value, print) in values.iter().zip(&prints) {
            let mut text = String::new();
            shuffled_text(&mut rng, value, &mut text);
            assert_eq!(fp(&parse(&text)), *print, "{text}");
            // The same members collected into a HashMap in another order.
            if let Value::Object(map) = value {
                let mut members: Vec<_> = map.iter().collect();
                rng.shuffle(&mut members);
                let hashed: HashMap<&String, &Value> = members.into_iter().collect();
                assert_eq!(fp(&hashed), *print);
            }
        }
        let mut equal_pairs = 0;
        for i in 0..values.len() {
            for j in i + 1..values.len() {
                let same = values[i] == values[j];
                equal_pairs += usize::from(same);
                assert_eq!(
                    prints[i] == prints[j],
                    same,
                    "{} against {}",
                    values[i],
                    values[j]
                );
            }
        }
        // Both sides of the equivalence were exercised.
        assert!(equal_pairs > 0);
    }
}
