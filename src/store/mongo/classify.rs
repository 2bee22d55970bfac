//! A driver error as the store tells it: a time limit, an outage, a
//! statement that can never apply, or one no list classes; and a reply whose
//! write concern was not met.

use mongodb::bson::Document;

use crate::store::StoreError;
use crate::store::errors::{self, Class};

/// A read's error: one the server stopped at its `maxTimeMS` is a timeout
/// (the query ran out of time), not an outage.
pub(super) fn classify_read(e: mongodb::error::Error) -> StoreError {
    match errors::command_code(&e) {
        Some(code) if errors::TIME_LIMIT_CODES.contains(&code) => {
            StoreError::Timeout(e.to_string())
        }
        _ => classify(e),
    }
}

pub(super) fn classify(e: mongodb::error::Error) -> StoreError {
    // The driver's messages hold no credentials: the URI is never part of them.
    if errors::is_unclassed(&e) {
        return StoreError::Unclassed(e.to_string());
    }
    match errors::classify(&e) {
        Class::Outage => StoreError::Outage(e.to_string()),
        Class::Poison => StoreError::Poison(e.to_string()),
    }
}

/// What a reply says when the server applied a write but could not confirm
/// it with the write concern asked for: not stored yet (sending it again is
/// harmless, every write here is idempotent).
pub(super) fn unconfirmed(reply: &Document) -> Option<String> {
    reply
        .get_document("writeConcernError")
        .ok()
        .map(|wce| format!("write concern error: {wce}"))
}

#[cfg(test)]
mod tests {
    use mongodb::bson::doc;

    use super::*;

    #[test]
    fn a_reply_with_a_write_concern_error_is_unconfirmed() {
        let ok = doc! { "n": 1, "nModified": 1, "ok": 1 };
        assert_eq!(unconfirmed(&ok), None);
        let wce = doc! {
            "n": 1,
            "writeConcernError": { "code": 64, "errmsg": "waiting for replication timed out" },
            "ok": 1,
        };
        assert!(unconfirmed(&wce).is_some_and(|m| m.contains("64")));
    }
}
