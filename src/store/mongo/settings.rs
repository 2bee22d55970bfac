//! `[mongodb]`: the server, the collections, TLS.

use std::path::PathBuf;
use std::time::Duration;

use mongodb::options::{Tls, TlsOptions};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use crate::settings::{Invalid, check_file, invalid, serialize_secret};

pub const DEFAULT_DATABASE: &str = "hourglass";
pub const DEFAULT_COLLECTION: &str = "buckets";
pub const DEFAULT_DEAD_LETTER_COLLECTION: &str = "rejected";
pub const DEFAULT_ROLLUP_COLLECTION: &str = "rollups";
pub const DEFAULT_LATE_COLLECTION: &str = "late";
pub const DEFAULT_SENSOR_COLLECTION: &str = "sensors";
pub const DEFAULT_METADATA_COLLECTION: &str = "metadata";
pub const DEFAULT_CHANGE_COLLECTION: &str = "changes";
pub const DEFAULT_SERVER_SELECTION_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// May hold credentials: never printed.
    #[serde(serialize_with = "serialize_secret")]
    pub uri: SecretString,
    pub database: String,
    pub collection: String,
    /// Readings storage can never apply (a bucket of the wrong shape) go here.
    pub dead_letter_collection: String,
    /// Dead letters are deleted this long after they were written (a TTL
    /// index on `at`); `None` ("off") keeps them until re-driven.
    #[serde(with = "crate::store::settings::retention")]
    pub dead_letter_retention: Option<Duration>,
    /// Hour and day summaries of the buckets (see `store::rollup`).
    pub rollup_collection: String,
    /// Late markers: hours written after they ended, to roll up again (see
    /// `store::rollup::late`).
    pub late_collection: String,
    /// The sensor registry: metrics, labels, last seen.
    pub sensor_collection: String,
    /// The metadata document: granularity and schema versions (see
    /// `store::mongo::metadata`).
    pub metadata_collection: String,
    /// The change log the query caches of every instance follow (see
    /// `store::mongo::changes`).
    pub change_collection: String,
    #[serde(with = "humantime_serde")]
    pub server_selection_timeout: Duration,
    /// WiredTiger's block compressor for the collections this creates.
    pub block_compressor: BlockCompressor,
    pub tls: TlsSettings,
}

/// How WiredTiger compresses the blocks of a collection Hourglass creates
/// (an existing collection keeps what it was created with).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BlockCompressor {
    /// What MongoDB's own time-series collections use: about 60 % of
    /// snappy's bytes for buckets and rollups (`loadtest storage`).
    Zstd,
    /// MongoDB's default.
    Snappy,
    Zlib,
    None,
    /// The server's setting (`storage.wiredTiger.collectionConfig.blockCompressor`).
    Server,
}

impl BlockCompressor {
    /// Its name in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            Self::Zstd => "zstd",
            Self::Snappy => "snappy",
            Self::Zlib => "zlib",
            Self::None => "none",
            Self::Server => "server",
        }
    }

    /// The `create` command's `storageEngine` option, unless the server decides.
    pub fn storage_engine(self) -> Option<mongodb::bson::Document> {
        (self != Self::Server).then(|| {
            mongodb::bson::doc! {
                "wiredTiger": { "configString": format!("block_compressor={}", self.name()) }
            }
        })
    }
}

/// TLS to MongoDB (the URI's `tls=true&tlsCAFile=…` options work too).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsSettings {
    pub enabled: bool,
    /// PEM file of the certificate authorities to trust; system roots if unset.
    pub ca_file: Option<PathBuf>,
    /// PEM file holding the client certificate and its key, for mutual TLS.
    pub cert_key_file: Option<PathBuf>,
    /// Never in production: accepts any server certificate.
    pub allow_invalid_certificates: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            uri: SecretString::from(""),
            database: DEFAULT_DATABASE.to_owned(),
            collection: DEFAULT_COLLECTION.to_owned(),
            dead_letter_collection: DEFAULT_DEAD_LETTER_COLLECTION.to_owned(),
            dead_letter_retention: None,
            rollup_collection: DEFAULT_ROLLUP_COLLECTION.to_owned(),
            late_collection: DEFAULT_LATE_COLLECTION.to_owned(),
            sensor_collection: DEFAULT_SENSOR_COLLECTION.to_owned(),
            change_collection: DEFAULT_CHANGE_COLLECTION.to_owned(),
            metadata_collection: DEFAULT_METADATA_COLLECTION.to_owned(),
            server_selection_timeout: DEFAULT_SERVER_SELECTION_TIMEOUT,
            block_compressor: BlockCompressor::Zstd,
            tls: TlsSettings::default(),
        }
    }
}

impl Settings {
    pub fn validate(&self) -> Result<(), Invalid> {
        let uri = self.uri.expose_secret();
        if uri.trim().is_empty() {
            return Err(invalid(
                "mongodb.uri",
                "is not set: set it in the config file or HOURGLASS__MONGODB__URI (`make run` starts a local server and sets it for you)",
            ));
        }
        if !uri.starts_with("mongodb://") && !uri.starts_with("mongodb+srv://") {
            return Err(invalid(
                "mongodb.uri",
                "must start with mongodb:// or mongodb+srv://",
            ));
        }
        for (key, name) in [
            ("mongodb.database", &self.database),
            ("mongodb.collection", &self.collection),
            (
                "mongodb.dead_letter_collection",
                &self.dead_letter_collection,
            ),
            ("mongodb.rollup_collection", &self.rollup_collection),
            ("mongodb.late_collection", &self.late_collection),
            ("mongodb.sensor_collection", &self.sensor_collection),
            ("mongodb.metadata_collection", &self.metadata_collection),
            ("mongodb.change_collection", &self.change_collection),
        ] {
            if name.is_empty() || name.contains(['$', '.', '\0', '/', ' ']) {
                return Err(invalid(key, "must be non-empty without $ . / space or NUL"));
            }
        }
        let mut seen = vec![self.collection.as_str()];
        for (key, name) in [
            (
                "mongodb.dead_letter_collection",
                &self.dead_letter_collection,
            ),
            ("mongodb.rollup_collection", &self.rollup_collection),
            ("mongodb.late_collection", &self.late_collection),
            ("mongodb.sensor_collection", &self.sensor_collection),
            ("mongodb.metadata_collection", &self.metadata_collection),
            ("mongodb.change_collection", &self.change_collection),
        ] {
            if seen.contains(&name.as_str()) {
                return Err(invalid(key, "must differ from the other collections"));
            }
            seen.push(name);
        }
        if self.tls.enabled {
            check_file("mongodb.tls.ca_file", self.tls.ca_file.as_ref())?;
            check_file("mongodb.tls.cert_key_file", self.tls.cert_key_file.as_ref())?;
        }
        Ok(())
    }
}

/// The driver's TLS options for `mongodb.tls`, when it is enabled.
pub fn tls_options(settings: &TlsSettings) -> Option<Tls> {
    settings.enabled.then(|| {
        Tls::Enabled(
            TlsOptions::builder()
                .ca_file_path(settings.ca_file.clone())
                .cert_key_file_path(settings.cert_key_file.clone())
                .allow_invalid_certificates(settings.allow_invalid_certificates.then_some(true))
                .build(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_settings_become_driver_options() {
        assert!(
            tls_options(&TlsSettings::default()).is_none(),
            "off by default"
        );
        let settings = TlsSettings {
            enabled: true,
            ca_file: Some(PathBuf::from("/etc/ca.pem")),
            cert_key_file: Some(PathBuf::from("/etc/client.pem")),
            allow_invalid_certificates: false,
        };
        match tls_options(&settings) {
            Some(Tls::Enabled(o)) => {
                assert_eq!(o.ca_file_path, settings.ca_file);
                assert_eq!(o.cert_key_file_path, settings.cert_key_file);
                assert_eq!(o.allow_invalid_certificates, None);
            }
            other => panic!("expected TLS, got {other:?}"),
        }
    }
}
