//! Record headers as handlers see and set them: a user's headers pass through a stage, its
//! own (the stamp, dead-letter and transaction markers) never reach user code.
//!
//! Invariant: a [`Header`] handed to a processor or taken from an emission is never one of
//! Parsley's own ([`is_own_header`]): the runtime filters them out on the way in and drops
//! them on the way out, so a handler can neither read nor forge a stamp.
//!
//! At the bottom of the crate: it imports none of its modules.

use std::borrow::Cow;

/// One record header: its name and its value (`None`: a header without a value, as Kafka
/// allows). Kafka keeps a record's headers in order and allows a name twice.
pub type Header = (Cow<'static, str>, Option<Vec<u8>>);

/// Whether `name` is one of Parsley's own headers: the stamp (`ps`, formerly
/// `parsley.stamp`) and every name under `parsley.` (dead-letter causes, transaction markers).
pub fn is_own_header(name: &str) -> bool {
    parsley_clock::is_stamp_header(name) || name.starts_with("parsley.")
}

/// `headers` without Parsley's own: borrowed when it holds none of them.
pub fn user_headers(headers: &[Header]) -> Cow<'_, [Header]> {
    if headers.iter().any(|(n, _)| is_own_header(n)) {
        Cow::Owned(
            headers
                .iter()
                .filter(|(n, _)| !is_own_header(n))
                .cloned()
                .collect(),
        )
    } else {
        Cow::Borrowed(headers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stamp_and_every_parsley_name_are_own_and_filtered_out() {
        assert!(is_own_header("ps"));
        assert!(is_own_header("parsley.stamp"));
        assert!(is_own_header("parsley.dlq.reason"));
        assert!(!is_own_header("traceparent"));
        assert!(!is_own_header("psx"));
        let h = |n: &'static str| (Cow::Borrowed(n), Some(n.as_bytes().to_vec()));
        let all = [h("ps"), h("traceparent"), h("parsley.txn"), h("tracestate")];
        assert_eq!(
            user_headers(&all).as_ref(),
            [h("traceparent"), h("tracestate")]
        );
        let mine = [h("traceparent")];
        assert!(matches!(user_headers(&mine), Cow::Borrowed(_)));
    }
}
