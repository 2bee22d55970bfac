//! The store's error ([`StoreError`]), and how MongoDB errors are classed, the way its drivers class them: error
//! labels first, then the driver's error kinds, then named server codes.
//!
//! Two classes, and every error lands in one of them:
//! - [`Class::Outage`]: the server, the network, authentication, authorization,
//!   write concern or topology is in the way. Nothing is wrong with the data;
//!   the same statement succeeds once the outage ends, so it is retried for as
//!   long as it lasts.
//! - [`Class::Poison`]: the statement itself can never be applied (a bucket
//!   that is not in the expected shape, a document over the size limit). Its
//!   readings go to the dead-letter collection.
//!
//! A code in neither list is classed by where it arrives: a per-statement
//! write error is about that statement's document (poison), a whole-command
//! error is taken for an outage, but [`is_unclassed`]: a bucket update
//! refused so is sent again only a few times, then dead-lettered (a
//! deterministic refusal must not be retried for ever). A whole-command poison error is never
//! pinned on every statement: the store splits the command until it finds the
//! statement that causes it.

use mongodb::error::{Error as MongoError, ErrorKind, WriteFailure};

/// A failed storage operation, in the two classes below (plus reads
/// of buckets this version cannot parse).
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The server, network, authorization or topology is in the way: retry.
    #[error("storage is unavailable: {0}")]
    Outage(String),
    /// The operation itself can never succeed as it is.
    #[error("storage refused the operation: {0}")]
    Poison(String),
    /// A stored bucket does not have a layout this version can read.
    #[error("a stored bucket could not be read: {0}")]
    Unreadable(String),
    /// A whole command failed with an error no list classes
    /// (`errors::is_unclassed`): sent again, a bounded number of times.
    #[error("storage refused the operation with an unclassed error: {0}")]
    Unclassed(String),
    /// The server stopped a read at the time it was given (`maxTimeMS`).
    #[error("the server stopped the read at its time limit: {0}")]
    Timeout(String),
    /// Hours of the range are being rolled up again, and reading their
    /// buckets instead would outlast the query's time: ready in about this
    /// many seconds.
    #[error("hours of the range are being rolled up again after a backfill; ready in about {0} s")]
    CatchingUp(u64),
}

/// What a failed write means for the statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Outage,
    Poison,
}

/// Labels under which MongoDB's drivers retry an operation.
pub const OUTAGE_LABELS: &[&str] = &[
    "RetryableWriteError",
    "TransientTransactionError",
    "SystemOverloadedError",
    "RetryableError",
    "NoWritesPerformed",
];

/// Server codes of an outage: the network, topology, shutdown, interruption,
/// authentication, authorization, write concern, resource pressure.
pub const OUTAGE_CODES: &[(i32, &str)] = &[
    (6, "HostUnreachable"),
    (7, "HostNotFound"),
    (11, "UserNotFound"),
    (13, "Unauthorized"),
    (18, "AuthenticationFailed"),
    (24, "LockTimeout"),
    (46, "LockBusy"),
    (50, "MaxTimeMSExpired"),
    (63, "StaleShardVersion"),
    (64, "WriteConcernFailed"),
    (74, "NodeNotFound"),
    (79, "UnknownReplWriteConcern"),
    (89, "NetworkTimeout"),
    (91, "ShutdownInProgress"),
    (100, "UnsatisfiableWriteConcern"),
    (112, "WriteConflict"),
    (117, "ConflictingOperationInProgress"),
    (133, "FailedToSatisfyReadPreference"),
    (134, "ReadConcernMajorityNotAvailableYet"),
    (150, "StaleEpoch"),
    (175, "QueryPlanKilled"),
    (189, "PrimarySteppedDown"),
    (202, "NetworkInterfaceExceededTimeLimit"),
    (216, "ElectionInProgress"),
    (249, "StaleDbVersion"),
    (262, "ExceededTimeLimit"),
    (279, "ClientDisconnect"),
    (317, "ConnectionPoolExpired"),
    (358, "InternalTransactionNotSupported"),
    (384, "ConnectionError"),
    (402, "ResourceExhausted"),
    (462, "IngressRequestRateLimitExceeded"),
    (9001, "SocketException"),
    (10107, "NotWritablePrimary"),
    (11600, "InterruptedAtShutdown"),
    (11601, "Interrupted"),
    (11602, "InterruptedDueToReplStateChange"),
    (12586, "BackgroundOperationInProgressForDatabase"),
    (12587, "BackgroundOperationInProgressForNamespace"),
    (13388, "StaleConfig"),
    (13435, "NotPrimaryNoSecondaryOk"),
    (13436, "NotPrimaryOrSecondary"),
    (14031, "OutOfDiskSpace"),
];

/// Server codes of a statement that can never be applied as it is.
pub const POISON_CODES: &[(i32, &str)] = &[
    (2, "BadValue"),
    (4, "NoSuchKey"),
    (9, "FailedToParse"),
    (10, "UserDataInconsistent"),
    (14, "TypeMismatch"),
    (15, "Overflow"),
    (16, "InvalidLength"),
    (17, "ProtocolError"),
    (22, "InvalidBSON"),
    (28, "PathNotViable"),
    (40, "ConflictingUpdateOperators"),
    (52, "DollarPrefixedFieldName"),
    (53, "InvalidIdField"),
    (54, "NotSingleValueField"),
    (55, "InvalidDBRef"),
    (56, "EmptyFieldName"),
    (57, "DottedFieldName"),
    (66, "ImmutableField"),
    (121, "DocumentValidationFailure"),
    (10334, "BSONObjectTooLarge"),
    (17124, "SizeOfNonArray"),
    (17280, "KeyTooLong"),
    (17419, "DocumentTooLargeAfterUpdate"),
    (40390, "ObjectToArrayOfNonObject"),
    (40400, "MergeObjectsOfNonObject"),
];

/// The duplicate-key code: an upsert that lost the race to create its bucket.
/// Neither class: the statement is sent again and then updates the bucket.
pub const DUPLICATE_KEY: i32 = 11000;

pub fn is_outage_code(code: i32) -> bool {
    OUTAGE_CODES.iter().any(|&(c, _)| c == code)
}

pub fn is_poison_code(code: i32) -> bool {
    POISON_CODES.iter().any(|&(c, _)| c == code)
}

/// A per-statement write error (`writeErrors[i]` of an unordered update).
pub fn classify_write_error(code: i32) -> Class {
    if is_outage_code(code) {
        Class::Outage
    } else {
        Class::Poison
    }
}

/// Codes of a read the server stopped at its time limit.
pub const TIME_LIMIT_CODES: &[i32] = &[50, 262];

/// What the server said, without the driver's debug dump of its reply: the
/// reason a dead letter keeps and the console shows.
pub fn describe(e: &MongoError) -> String {
    e.kind.to_string()
}

/// The server's code of a command error, if it is one.
pub fn command_code(e: &MongoError) -> Option<i32> {
    match &*e.kind {
        ErrorKind::Command(c) => Some(c.code),
        _ => None,
    }
}

/// An error for a whole command, as the driver reports it.
pub fn classify(e: &MongoError) -> Class {
    class_of(|label| e.contains_label(label), &e.kind)
}

fn class_of(has_label: impl Fn(&str) -> bool, kind: &ErrorKind) -> Class {
    if OUTAGE_LABELS.iter().any(|l| has_label(l)) {
        return Class::Outage;
    }
    match kind {
        ErrorKind::Command(c) => classify_command_code(c.code),
        ErrorKind::Write(WriteFailure::WriteError(w)) => classify_write_error(w.code),
        // The write concern could not be confirmed: the write is retried until it is.
        ErrorKind::Write(WriteFailure::WriteConcernError(_)) => Class::Outage,
        // A statement that cannot even be encoded can never be sent.
        ErrorKind::InvalidArgument { .. }
        | ErrorKind::BsonSerialization(_)
        | ErrorKind::BsonDeserialization(_) => Class::Poison,
        // The network, server selection, DNS, authentication, a closed pool,
        // the client shutting down, and anything the driver adds later.
        _ => Class::Outage,
    }
}

/// A whole command failed with an error no list names: no retry label, a
/// server code in neither list. Retried like an outage, but only a bounded
/// number of times (a deterministic refusal would otherwise be retried for
/// ever while the journal fills); then its buckets are dead-lettered.
pub fn is_unclassed(e: &MongoError) -> bool {
    !OUTAGE_LABELS.iter().any(|l| e.contains_label(l))
        && command_code(e).is_some_and(|c| !is_outage_code(c) && !is_poison_code(c))
}

/// A whole command failed with `code`: only known poison is poison.
pub fn classify_command_code(code: i32) -> Class {
    if is_poison_code(code) {
        Class::Poison
    } else {
        Class::Outage
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::doc;

    #[test]
    fn every_listed_code_is_in_exactly_one_class() {
        for &(code, name) in OUTAGE_CODES {
            assert!(!is_poison_code(code), "{name} is in both lists");
            assert_eq!(classify_write_error(code), Class::Outage, "{name}");
            assert_eq!(classify_command_code(code), Class::Outage, "{name}");
        }
        for &(code, name) in POISON_CODES {
            assert_eq!(classify_write_error(code), Class::Poison, "{name}");
            assert_eq!(classify_command_code(code), Class::Poison, "{name}");
        }
        assert!(!is_outage_code(DUPLICATE_KEY) && !is_poison_code(DUPLICATE_KEY));
    }

    #[test]
    fn the_codes_the_old_list_got_wrong_are_outages() {
        for code in [13, 11601, 13388, 91, 100, 64, 18, 262, 50] {
            assert_eq!(classify_write_error(code), Class::Outage, "{code}");
        }
    }

    #[test]
    fn unknown_codes_are_classed_by_where_they_arrive() {
        let unknown = 987_654;
        assert_eq!(classify_write_error(unknown), Class::Poison);
        assert_eq!(classify_command_code(unknown), Class::Outage);
    }

    fn command_error(code: i32) -> ErrorKind {
        let reply = doc! { "ok": 0, "code": code, "codeName": "X", "errmsg": "injected" };
        ErrorKind::Command(mongodb::bson::from_document(reply).expect("a command error"))
    }

    #[test]
    fn labels_come_before_codes() {
        let none = |_: &str| false;
        assert_eq!(class_of(none, &command_error(2)), Class::Poison);
        for label in OUTAGE_LABELS {
            assert_eq!(
                class_of(|l| l == *label, &command_error(2)),
                Class::Outage,
                "{label}"
            );
        }
        assert_eq!(class_of(none, &command_error(13388)), Class::Outage);
    }

    #[test]
    fn network_errors_are_outages() {
        let io = MongoError::from(std::io::Error::other("connection reset"));
        assert_eq!(classify(&io), Class::Outage);
    }
}
