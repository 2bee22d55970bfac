//! `[http]`: the listener and the limits of the API.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::settings::{Invalid, at_least_one, invalid, longer_than_zero};

pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 256;
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Address to listen on; port 0 picks a free one.
    pub listen: SocketAddr,
    pub max_body_bytes: usize,
    /// How long a synchronous write waits for its flush before answering 503.
    #[serde(with = "humantime_serde")]
    pub write_timeout: Duration,
    /// API requests served at once; more get 503 straight away.
    pub max_concurrent_requests: usize,
    /// Longest an API request may take in all, body upload included (503 after).
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// A connection that has not sent a whole request head this long after
    /// it opened (or, over HTTP/1, after it began one) is closed.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// A connection with no request in progress this long is closed, and
    /// one whose response body has not moved this long is cut; bytes that
    /// carry no request (HTTP/2 PINGs) do not count.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Connections open at once; at the cap, one that has not sent a
    /// request head (or has nothing in progress) gives way to a new one.
    pub max_connections: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            // 127.0.0.1:8080: local only until configured otherwise.
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

impl Settings {
    pub fn validate(&self) -> Result<(), Invalid> {
        at_least_one(&[
            ("http.max_body_bytes", self.max_body_bytes),
            ("http.max_concurrent_requests", self.max_concurrent_requests),
            ("http.max_connections", self.max_connections),
        ])?;
        longer_than_zero(&[
            ("http.write_timeout", self.write_timeout),
            ("http.request_timeout", self.request_timeout),
            ("http.header_read_timeout", self.header_read_timeout),
            ("http.idle_timeout", self.idle_timeout),
        ])?;
        if self.request_timeout <= self.write_timeout {
            return Err(invalid(
                "http.request_timeout",
                "must be longer than http.write_timeout, or synchronous writes could never answer",
            ));
        }
        if self.max_connections <= self.max_concurrent_requests {
            // Requests being handled never give way to a new connection:
            // with no more connections than requests, slow uploads could
            // hold them all and leave /health/live unanswered.
            return Err(invalid(
                "http.max_connections",
                "must be more than http.max_concurrent_requests, so that at the cap a connection that is not being served can give way to a new one",
            ));
        }
        Ok(())
    }
}
