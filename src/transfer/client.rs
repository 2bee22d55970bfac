//! The HTTP client import, export and delete use: a running instance's
//! API, with retries while it is busy or restarting, and its errors.

use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::config::Settings;

/// Why a transfer stopped.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// What was asked cannot be done as asked; nothing was sent.
    #[error("{0}")]
    Usage(String),
    /// A local file could not be read or written.
    #[error("{0}")]
    Io(String),
    /// The service could not be reached, or refused the token.
    #[error("{0}")]
    Service(String),
}

impl TransferError {
    /// A local file's error, naming the file.
    pub fn file(path: &std::path::Path, e: impl std::fmt::Display) -> Self {
        Self::Io(format!("{}: {e}", path.display()))
    }
}

/// How long an import keeps retrying a service that does not answer, or
/// answers 503, before it stops (its checkpoint keeps what was done).
const RETRY_FOR: Duration = Duration::from_secs(600);

/// The service's base URL and token, from the environment or the config.
pub struct Client {
    pub(super) http: reqwest::Client,
    base: String,
    token: Option<String>,
    /// Requests sent again (the service busy, unavailable or unreachable).
    retries: std::sync::atomic::AtomicU64,
}

/// What the service said to a batch.
pub enum Posted {
    Stored,
    /// 400 or 413: something in the batch can never be stored as it is.
    Refused(String),
}

impl Client {
    /// `HOURGLASS_URL` or the configured `http.listen` (a wildcard address
    /// read as loopback); `HOURGLASS_TOKEN` as the bearer token.
    pub fn new(settings: &Settings) -> Result<Self, TransferError> {
        let base = match std::env::var("HOURGLASS_URL") {
            Ok(url) if !url.is_empty() => url.trim_end_matches('/').to_owned(),
            _ => {
                let mut addr = settings.http.listen;
                if addr.ip().is_unspecified() {
                    addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
                }
                format!("http://{addr}")
            }
        };
        if !base.starts_with("http://") && !base.starts_with("https://") {
            return Err(TransferError::Usage(format!(
                "HOURGLASS_URL {base:?} must be an http:// or https:// address of an instance"
            )));
        }
        // https:// (an instance behind a TLS proxy): rustls with the
        // system's roots (SSL_CERT_FILE or SSL_CERT_DIR name others).
        crate::runtime::install_crypto_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| {
                TransferError::Service(format!("building the HTTP client: {}", causes(&e)))
            })?;
        Ok(Self {
            http,
            base,
            token: std::env::var("HOURGLASS_TOKEN")
                .ok()
                .filter(|t| !t.is_empty()),
            retries: std::sync::atomic::AtomicU64::new(0),
        })
    }

    pub fn retries(&self) -> u64 {
        self.retries.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn authorized(&self, r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// Sends `request`: the answer when it is a success, else the error
    /// the service gave (or that none answered).
    pub(super) async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, TransferError> {
        let response = self
            .authorized(request)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        let status = response.status();
        if !status.is_success() {
            let message = error_message(response).await;
            return Err(TransferError::Service(format!(
                "the service answered {status}: {message}"
            )));
        }
        Ok(response)
    }

    /// Whether a service answers at all: a clear message before any work.
    pub async fn check(&self) -> Result<(), TransferError> {
        self.http
            .get(format!("{}/health/live", self.base))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map(|_| ())
            .map_err(|e| self.unreachable(&e))
    }

    /// That no service answered, with every cause (a refused connection,
    /// a certificate the system does not trust).
    fn unreachable(&self, e: &reqwest::Error) -> TransferError {
        TransferError::Service(format!(
            "no Hourglass answers at {} ({}); start it, or set HOURGLASS_URL",
            self.base,
            causes(e)
        ))
    }

    /// NDJSON readings, each with its `ts`, to `POST /api/v1/readings`.
    pub async fn post_ndjson(&self, body: bytes::Bytes) -> Result<Posted, TransferError> {
        self.post("/api/v1/readings", "application/x-ndjson", body)
            .await
    }

    /// CSV rows after their header row, to `POST /api/v1/readings`.
    pub async fn post_csv(
        &self,
        body: bytes::Bytes,
        ts_unit: crate::ingest::decode::csv::TsUnit,
    ) -> Result<Posted, TransferError> {
        let path = format!("/api/v1/readings?ts_unit={}", ts_unit.as_str());
        self.post(&path, "text/csv; charset=utf-8", body).await
    }

    pub async fn post_line_protocol(
        &self,
        body: bytes::Bytes,
        precision: &str,
    ) -> Result<Posted, TransferError> {
        let path = format!("/api/v2/write?precision={precision}");
        self.post(&path, "text/plain; charset=utf-8", body).await
    }

    /// Posts until the service answers for good: retried while it is
    /// unreachable, overloaded or unavailable, for [`RETRY_FOR`].
    async fn post(
        &self,
        path: &str,
        content_type: &str,
        body: bytes::Bytes,
    ) -> Result<Posted, TransferError> {
        let url = format!("{}{path}", self.base);
        let started = Instant::now();
        let mut delay = Duration::from_millis(100);
        loop {
            let request = self
                .authorized(self.http.post(&url))
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(body.clone());
            let wait = match request.send().await {
                Ok(r) if r.status().is_success() => return Ok(Posted::Stored),
                Ok(r) => {
                    let status = r.status();
                    let retry_after = r
                        .headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<u64>().ok())
                        .map(Duration::from_secs);
                    let message = error_message(r).await;
                    match status {
                        StatusCode::BAD_REQUEST
                        | StatusCode::PAYLOAD_TOO_LARGE
                        | StatusCode::UNPROCESSABLE_ENTITY => return Ok(Posted::Refused(message)),
                        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                            return Err(TransferError::Service(format!(
                                "the service refused the token ({status}: {message}); set HOURGLASS_TOKEN to a token with the ingest scope"
                            )));
                        }
                        s if s == StatusCode::TOO_MANY_REQUESTS || s.is_server_error() => {
                            retry_after.unwrap_or(delay)
                        }
                        s => {
                            return Err(TransferError::Service(format!(
                                "the service answered {s}: {message}"
                            )));
                        }
                    }
                }
                Err(_) if started.elapsed() < RETRY_FOR => delay,
                Err(e) => {
                    return Err(TransferError::Service(format!(
                        "the service at {} did not answer for {} ({e}); run the import again to resume",
                        self.base,
                        humantime::format_duration(RETRY_FOR)
                    )));
                }
            };
            if started.elapsed() >= RETRY_FOR {
                return Err(TransferError::Service(format!(
                    "the service at {} stayed unavailable for {}; run the import again to resume",
                    self.base,
                    humantime::format_duration(RETRY_FOR)
                )));
            }
            self.retries
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(wait).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }
}

/// `hourglass delete`: `DELETE /api/v1/readings` with `query`; its answer.
pub async fn delete(
    settings: &Settings,
    query: &[(String, String)],
) -> Result<serde_json::Value, TransferError> {
    let client = Client::new(settings)?;
    let url = reqwest::Url::parse_with_params(
        &format!("{}/api/v1/readings", client.base()),
        query.iter(),
    )
    .map_err(|e| TransferError::Usage(format!("the service URL {}: {e}", client.base())))?;
    let r = client.send(client.http.delete(url)).await?;
    r.json()
        .await
        .map_err(|e| TransferError::Service(format!("the answer was not JSON: {e}")))
}

/// The `error` (or InfluxDB's `message`) of an error answer, else its text.
async fn error_message(r: reqwest::Response) -> String {
    message_of(&r.text().await.unwrap_or_default())
}

/// [`error_message`] of an answer's text, with the reason of its first
/// detail: a refused line's own reason (a timestamp past the service's
/// `ingest.max_age`, which the command's settings may not share), not
/// only that the request was refused.
fn message_of(text: &str) -> String {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(text) else {
        return text.to_owned();
    };
    let Some(message) = v
        .get("error")
        .or_else(|| v.get("message"))
        .and_then(|m| m.as_str())
    else {
        return text.to_owned();
    };
    match v.pointer("/details/0/reason").and_then(|r| r.as_str()) {
        Some(reason) => format!("{message}: {reason}"),
        None => message.to_owned(),
    }
}

/// `e` and each of its causes, joined.
fn causes(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_answer_is_told_with_its_first_details_reason() {
        let refused = r#"{"error":"1 of 1 readings are invalid; nothing was stored","details":[{"index":0,"reason":"ts is more than 7days in the past"}]}"#;
        assert_eq!(
            message_of(refused),
            "1 of 1 readings are invalid; nothing was stored: ts is more than 7days in the past"
        );
        assert_eq!(message_of(r#"{"error":"busy"}"#), "busy");
        assert_eq!(
            message_of(r#"{"code":"invalid","message":"bad line"}"#),
            "bad line"
        );
        assert_eq!(message_of("not json"), "not json");
        assert_eq!(message_of(r#"{"other":1}"#), r#"{"other":1}"#);
    }
}
