//! Parsing the `Idempotency-Key` header.

use std::fmt;

/// Why an `Idempotency-Key` header was refused (each is answered with 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyError {
    /// The request has no `Idempotency-Key` header.
    Missing,
    /// The header appears more than once.
    Repeated,
    /// The value is not a structured-field String (or, unless strict, a bare token).
    Malformed(&'static str),
    /// The key is empty.
    Empty,
    /// The key (after unescaping) is longer than the configured maximum.
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The longest accepted.
        max: usize,
    },
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::Missing => f.write_str("the request has no Idempotency-Key header"),
            KeyError::Repeated => f.write_str("the Idempotency-Key header appears more than once"),
            KeyError::Malformed(why) => write!(f, "the Idempotency-Key header is malformed: {why}"),
            KeyError::Empty => f.write_str("the Idempotency-Key is empty"),
            KeyError::TooLong { len, max } => write!(
                f,
                "the Idempotency-Key is {len} bytes long; at most {max} are accepted"
            ),
        }
    }
}

/// Parses one header value. A structured-field String (RFC 8941 §3.3.3: `"..."`, printable
/// ASCII, `\"` and `\\` the only escapes) is always accepted; unless `strict`, so is a bare
/// token of RFC 9110 `tchar`s plus `:` and `/` (clients often send a UUID unquoted, which
/// starts with a digit and so is not an sf-token). Parameters after the String are refused.
pub(crate) fn parse(value: &[u8], strict: bool, max: usize) -> Result<Vec<u8>, KeyError> {
    // RFC 8941 parsing discards leading and trailing spaces.
    let value = trim_sp(value);
    let key = match value.first() {
        Some(b'"') => parse_sf_string(value)?,
        Some(_) if strict => {
            return Err(KeyError::Malformed(
                "expected a quoted structured-field String",
            ))
        }
        Some(_) => parse_token(value)?,
        None => return Err(KeyError::Empty),
    };
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > max {
        return Err(KeyError::TooLong {
            len: key.len(),
            max,
        });
    }
    Ok(key)
}

fn trim_sp(mut v: &[u8]) -> &[u8] {
    while let [b' ', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' '] = v {
        v = rest;
    }
    v
}

fn parse_sf_string(value: &[u8]) -> Result<Vec<u8>, KeyError> {
    let mut out = Vec::with_capacity(value.len());
    let mut bytes = value.iter().skip(1);
    loop {
        match bytes.next() {
            None => return Err(KeyError::Malformed("the String has no closing quote")),
            Some(b'\\') => match bytes.next() {
                Some(&c @ (b'"' | b'\\')) => out.push(c),
                _ => {
                    return Err(KeyError::Malformed(
                        "only \\\" and \\\\ may be escaped in a String",
                    ))
                }
            },
            Some(b'"') => break,
            Some(&c @ 0x20..=0x7e) => out.push(c),
            Some(_) => {
                return Err(KeyError::Malformed(
                    "a String holds printable ASCII characters only",
                ))
            }
        }
    }
    if bytes.next().is_some() {
        return Err(KeyError::Malformed(
            "nothing may follow the String (parameters are not accepted)",
        ));
    }
    Ok(out)
}

fn parse_token(value: &[u8]) -> Result<Vec<u8>, KeyError> {
    if value.iter().all(|&c| is_tchar(c) || c == b':' || c == b'/') {
        Ok(value.to_vec())
    } else {
        Err(KeyError::Malformed(
            "an unquoted key may hold only token characters (letters, digits, !#$%&'*+-.^_`|~:/)",
        ))
    }
}

/// RFC 9110 §5.6.2 `tchar`.
fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sf_strings_unescape() {
        assert_eq!(parse(br#""abc""#, true, 64).unwrap(), b"abc");
        assert_eq!(parse(br#"  "a\"b\\c"  "#, true, 64).unwrap(), br#"a"b\c"#);
        assert_eq!(parse(br#""a b""#, true, 64).unwrap(), b"a b");
    }

    #[test]
    fn malformed_strings_are_refused() {
        for bad in [
            &br#""abc"#[..],
            br#""a\nb""#,
            br#""abc";p=1"#,
            br#""abc"x"#,
            b"\"a\tb\"",
            b"\"a\xc3\xa9\"",
        ] {
            assert!(
                matches!(parse(bad, false, 64), Err(KeyError::Malformed(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn tokens_only_when_lenient() {
        let uuid = b"8e03978e-40d5-43e8-bc93-6894a57f9324";
        assert_eq!(parse(uuid, false, 64).unwrap(), uuid);
        assert!(matches!(parse(uuid, true, 64), Err(KeyError::Malformed(_))));
        assert!(matches!(
            parse(b"a b", false, 64),
            Err(KeyError::Malformed(_))
        ));
        assert!(matches!(
            parse(b"a,b", false, 64),
            Err(KeyError::Malformed(_))
        ));
    }

    #[test]
    fn empty_and_long_keys() {
        assert_eq!(parse(b"\"\"", false, 4), Err(KeyError::Empty));
        assert_eq!(parse(b"   ", false, 4), Err(KeyError::Empty));
        assert_eq!(parse(b"abcd", false, 4).unwrap(), b"abcd");
        assert_eq!(
            parse(b"\"abcde\"", false, 4),
            Err(KeyError::TooLong { len: 5, max: 4 })
        );
    }
}
