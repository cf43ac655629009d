//! The HTTP layer's stored-response decoder over arbitrary bytes, as a damaged file, an
//! `import` or a row of the shared table could hand it: it never panics; a value it accepts
//! encodes and decodes back to the same response and is replayed as it is (marked
//! `Idempotent-Replayed`); a value it refuses is answered with the 500
//! `stored-response-corrupted` problem. Built with RUSTFLAGS="--cfg idemkv_sabotage" (the
//! hook is compiled only then).
#![no_main]

#[cfg(not(idemkv_sabotage))]
compile_error!(
    "stored_response reaches the decoder through a test hook: build it with \
     RUSTFLAGS=\"--cfg shuttle --cfg idemkv_sabotage\" (docs/testing.md)"
);

use idemkv::http::stored_hooks::{decode_stored, encode_stored, replay_stored};
use libfuzzer_sys::fuzz_target;

/// The magic and version that open every stored response.
const HEAD: &[u8] = b"idemkv-http\x01";

fuzz_target!(|bytes: &[u8]| {
    check(bytes);
    // The same bytes behind a valid head, so that the search spends its time on the
    // status, the counts and the lengths rather than on finding the magic.
    check(&[HEAD, bytes].concat());
});

fn check(bytes: &[u8]) {
    let replay = replay_stored(bytes);
    match decode_stored(bytes) {
        Ok(response) => {
            let again = encode_stored(&response)
                .unwrap_or_else(|e| panic!("a decoded response does not encode: {e}"));
            assert_eq!(decode_stored(&again).as_ref(), Ok(&response));
            let (status, headers, body) = replay;
            assert_eq!((status, &body), (response.0, &response.2));
            // The mark replaces any stored header of its name; the others replay as stored.
            let (marks, rest): (Vec<_>, Vec<_>) = headers
                .into_iter()
                .partition(|(n, _)| n == "idempotent-replayed");
            assert_eq!(
                marks,
                [("idempotent-replayed".to_owned(), b"true".to_vec())]
            );
            let stored: Vec<_> = response
                .1
                .into_iter()
                .filter(|(n, _)| n != "idempotent-replayed")
                .collect();
            assert_eq!(rest, stored);
        }
        Err(_) => {
            assert_eq!(replay.0, 500);
            let body = String::from_utf8_lossy(&replay.2);
            assert!(
                body.contains("urn:idemkv:problem:stored-response-corrupted"),
                "{body}"
            );
        }
    }
}
