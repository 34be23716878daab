//! The endpoint's interactive query: `GET /store/{name}/{key}`, the value of one key of a
//! store as JSON (module `crate::query`).
//!
//! The key is the path's last segment, percent-decoded (RFC 3986: `%2F` for a `/` in the key,
//! `%25` for a `%`) and taken as a `String` key encoded by the store's key codec: only stores
//! with `String` keys are served. The store name is the segment before it, taken as it is.
//!
//! | outcome | status | body |
//! |---|---|---|
//! | the key has a value | 200 | `{"store": name, "key": key, "value": value as JSON}` |
//! | the key has none | 404 | the same, `"value": null` |
//! | no such store | 404 | text naming it |
//! | a store whose keys are not `String`, a key that does not percent-decode | 400 | text |
//! | the key's task runs on another instance | 421 | text naming the task |
//! | a task restoring, no owner known, no answer in time | 503 | text |
//! | anything else (a state read failed) | 500 | text |

use super::{Answer, Served};
use crate::query::{QueryError, get_json};

/// The answer to `GET /store/{rest}`.
pub(super) fn answer(rest: &str, served: &Served) -> Answer {
    let Some((name, key)) = rest.rsplit_once('/') else {
        return Answer::text(400, "the path is /store/{name}/{key}\n");
    };
    let Some(key) = percent_decode(key) else {
        return Answer::text(400, "the key does not percent-decode to UTF-8\n");
    };
    let stages = served.stages.iter().map(|(spec, metrics)| (spec, metrics));
    let json = |value: &str| {
        let quote = |s: &str| serde_json::to_string(s).expect("a string serialises");
        Answer {
            content_type: "application/json",
            ..Answer::text(
                0,
                format!(
                    "{{\"store\":{},\"key\":{},\"value\":{value}}}\n",
                    quote(name),
                    quote(&key)
                ),
            )
        }
    };
    match get_json(name, &key, stages) {
        Ok(Some(value)) => Answer {
            status: 200,
            ..json(&value)
        },
        Ok(None) => Answer {
            status: 404,
            ..json("null")
        },
        Err(e) => {
            let status = match e {
                QueryError::UnknownStore { .. } => 404,
                QueryError::WrongTypes { .. } | QueryError::Key { .. } => 400,
                QueryError::NotOwned { .. } => 421,
                QueryError::Restoring { .. }
                | QueryError::OwnerUnknown { .. }
                | QueryError::NoAnswer { .. }
                | QueryError::StageEnded { .. } => 503,
                _ => 500,
            };
            Answer::text(status, format!("{e}\n"))
        }
    }
}

/// `segment` percent-decoded (`%XX` for any byte), as UTF-8; `None` for a malformed escape or
/// bytes that are not UTF-8.
fn percent_decode(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_the_percent_decoded_last_segment() {
        assert_eq!(percent_decode("u-1").as_deref(), Some("u-1"));
        assert_eq!(percent_decode("a%2Fb%20c%25").as_deref(), Some("a/b c%"));
        assert_eq!(percent_decode("caf%C3%A9").as_deref(), Some("café"));
        assert_eq!(percent_decode("%2"), None, "a cut escape");
        assert_eq!(percent_decode("%zz"), None, "not hex");
        assert_eq!(percent_decode("%FF"), None, "not UTF-8");
    }
}
