//! What every component's settings type shares: the error that names an
//! invalid key, and a few checks and serde helpers. Each component owns its
//! settings next to its code; `config` assembles, loads and validates the tree.

use std::path::PathBuf;

use secrecy::{ExposeSecret, SecretString};

/// A setting that cannot work, named by its `section.key`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct Invalid {
    pub key: std::borrow::Cow<'static, str>,
    pub reason: String,
}

pub fn invalid(key: &'static str, reason: impl Into<String>) -> Invalid {
    Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

/// [`invalid`] for a key built at run time (`mqtt.routes[2].topic`).
pub fn invalid_at(key: String, reason: impl Into<String>) -> Invalid {
    Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

/// `path`, when set, must be a readable file.
pub fn check_file(key: &'static str, path: Option<&PathBuf>) -> Result<(), Invalid> {
    match path {
        Some(p) if !p.is_file() => Err(invalid(
            key,
            format!("{} is not a readable file", p.display()),
        )),
        _ => Ok(()),
    }
}

/// Each `(key, value)` must be at least 1.
pub fn at_least_one(values: &[(&'static str, usize)]) -> Result<(), Invalid> {
    match values.iter().find(|(_, v)| *v == 0) {
        Some((key, _)) => Err(invalid(key, "must be at least 1")),
        None => Ok(()),
    }
}

/// Each `(key, duration)` must be longer than zero.
pub fn longer_than_zero(values: &[(&'static str, std::time::Duration)]) -> Result<(), Invalid> {
    match values.iter().find(|(_, v)| v.is_zero()) {
        Some((key, _)) => Err(invalid(key, "must be longer than zero")),
        None => Ok(()),
    }
}

/// Only used to seed figment with defaults; the value is never logged.
pub fn serialize_secret<S: serde::Serializer>(s: &SecretString, ser: S) -> Result<S::Ok, S::Error> {
    ser.serialize_str(s.expose_secret())
}

pub fn serialize_opt_secret<S: serde::Serializer>(
    s: &Option<SecretString>,
    ser: S,
) -> Result<S::Ok, S::Error> {
    match s {
        Some(s) => serialize_secret(s, ser),
        None => ser.serialize_none(),
    }
}
