//! The endpoint's interactive query: `GET /store/{name}/{key}`, the value of one key of a
//! store as JSON (module `crate::query`); with `?stale=true`, read from this instance's
//! standby of the key's task when the task does not run here, the answer naming its source
//! (`crate::query::StaleStore::get`).
//!
//! The key is the path's last segment, percent-decoded (RFC 3986: `%2F` for a `/` in the key,
//! `%25` for a `%`) and taken as a `String` key encoded by the store's key codec: only stores
//! with `String` keys are served. The store name is the segment before it, taken as it is. The
//! query may be empty, `stale=true` or `stale=false`; anything else is refused (400), so that a
//! misspelt opt-in is not taken for a plain read.
//!
//! | outcome | status | body |
//! |---|---|---|
//! | the key has a value | 200 | `{"store": name, "key": key, "value": value as JSON}`; stale: `"partition": p, "source": "owner"` or `"source": "standby", "position": offset, "lag": offsets or null` added |
//! | the key has none | 404 | the same, `"value": null` |
//! | no such store | 404 | text naming it |
//! | a store whose keys are not `String`, a key that does not percent-decode, another query | 400 | text |
//! | the key's task runs on another instance (stale: and has no standby here) | 421 | text naming the task |
//! | a task restoring, no owner known, no answer in time | 503 | text |
//! | anything else (a state read failed) | 500 | text |

use super::{Answer, Served};
use crate::query::{QueryError, Source, get_json, get_json_stale};

/// The answer to `GET /store/{rest}?{query}`.
pub(super) fn answer(rest: &str, query: &str, served: &Served) -> Answer {
    let Some((name, key)) = rest.rsplit_once('/') else {
        return Answer::text(400, "the path is /store/{name}/{key}\n");
    };
    let Some(key) = percent_decode(key) else {
        return Answer::text(400, "the key does not percent-decode to UTF-8\n");
    };
    let Some(stale) = stale_of(query) else {
        return Answer::text(
            400,
            "the query is empty, stale=true or stale=false\n".to_string(),
        );
    };
    let stages = served.stages.iter().map(|(spec, metrics)| (spec, metrics));
    let read = if stale {
        get_json_stale(name, &key, stages).map(|read| {
            let more = match read.source {
                Source::Owner => format!(",\"partition\":{},\"source\":\"owner\"", read.partition),
                Source::Standby { position, lag } => format!(
                    ",\"partition\":{},\"source\":\"standby\",\"position\":{position},\"lag\":{}",
                    read.partition,
                    lag.map_or("null".to_string(), |l| l.to_string())
                ),
            };
            (read.value, more)
        })
    } else {
        get_json(name, &key, stages).map(|value| (value, String::new()))
    };
    match read {
        Ok((value, more)) => Answer {
            content_type: "application/json",
            ..Answer::text(
                if value.is_some() { 200 } else { 404 },
                body(name, &key, value.as_deref().unwrap_or("null"), &more),
            )
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

/// The JSON body of a read of `key` in store `name`: `value` is JSON text already, `more` the
/// fields after it (each with its leading comma).
fn body(name: &str, key: &str, value: &str, more: &str) -> String {
    let quote = |s: &str| serde_json::to_string(s).expect("a string serialises");
    format!(
        "{{\"store\":{},\"key\":{},\"value\":{value}{more}}}\n",
        quote(name),
        quote(key)
    )
}

/// Whether `query` asks for a stale read: `Some(false)` for an empty query or `stale=false`,
/// `Some(true)` for `stale=true`, `None` for anything else.
fn stale_of(query: &str) -> Option<bool> {
    match query {
        "" | "stale=false" => Some(false),
        "stale=true" => Some(true),
        _ => None,
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
    fn a_stale_read_is_asked_for_by_stale_true_only_and_another_query_is_refused() {
        assert_eq!(stale_of(""), Some(false));
        assert_eq!(stale_of("stale=false"), Some(false));
        assert_eq!(stale_of("stale=true"), Some(true));
        assert_eq!(stale_of("stael=true"), None, "a misspelt opt-in");
        assert_eq!(stale_of("stale=yes"), None);
        assert_eq!(stale_of("stale=true&x=1"), None);
    }

    #[test]
    fn a_body_quotes_the_name_and_key_and_adds_the_source_after_the_value() {
        assert_eq!(
            body("counts", "a\"b", "3", ""),
            "{\"store\":\"counts\",\"key\":\"a\\\"b\",\"value\":3}\n"
        );
        assert_eq!(
            body(
                "counts",
                "k",
                "null",
                ",\"partition\":1,\"source\":\"owner\""
            ),
            "{\"store\":\"counts\",\"key\":\"k\",\"value\":null,\"partition\":1,\"source\":\"owner\"}\n"
        );
    }

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
