//! Constants of the Idempotency-Key layer (feature `http`): defaults and the stored
//! response's limits.

use crate::api::constants::{KEY_LEN_MAX_DEFAULT, RESPONSE_LEN_LIMIT};

/// Default longest Idempotency-Key, in bytes after unescaping: the engine's default key
/// limit (the scope is carried apart and has its own), so that a default layer on a
/// default engine never passes a key the engine refuses.
#[cfg(feature = "http")]
pub(crate) const HTTP_KEY_LEN_MAX_DEFAULT: usize = KEY_LEN_MAX_DEFAULT;
/// Default largest request body buffered for the fingerprint (1 MiB); larger ones get 413.
#[cfg(feature = "http")]
pub(crate) const HTTP_BODY_LEN_MAX_DEFAULT: usize = 1 << 20;
/// Retry-After, in seconds, of a 503 for an engine limit (which gives no hint of its own).
#[cfg(feature = "http")]
pub(crate) const HTTP_OVERLOADED_RETRY_AFTER_SECS: u64 = 1;
/// Version of the stored-response encoding (after its magic). Bumped on any incompatible
/// change; a stored response of an unknown version is answered with 500, never misread.
#[cfg(feature = "http")]
pub(crate) const HTTP_STORED_VERSION: u8 = 1;
/// Most header values a stored response carries. Stored values are untrusted (a damaged
/// file, an `import`, the shared table): the decoder checks every count and length against
/// these limits before it reads or allocates, and the encoder keeps to them, so that every
/// response it stores decodes. Far above what the allow-listed headers of one response hold.
#[cfg(feature = "http")]
pub(crate) const HTTP_STORED_HEADERS_MAX: usize = 100;
/// Longest header name of a stored response, in bytes.
#[cfg(feature = "http")]
pub(crate) const HTTP_STORED_HEADER_NAME_LEN_MAX: usize = 256;
/// Longest header value of a stored response, in bytes (8 KiB, a common server's limit for
/// a whole header line).
#[cfg(feature = "http")]
pub(crate) const HTTP_STORED_HEADER_VALUE_LEN_MAX: usize = 8 << 10;
/// Most bytes of header names and values one stored response carries in all.
#[cfg(feature = "http")]
pub(crate) const HTTP_STORED_HEADERS_LEN_MAX: usize = 64 << 10;
/// Largest stored response, in bytes: the engine's ceiling for any stored response, which no
/// `response_len_max` can raise.
#[cfg(feature = "http")]
pub(crate) const HTTP_STORED_LEN_MAX: usize = RESPONSE_LEN_LIMIT;
