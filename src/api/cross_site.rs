//! Cross-site writes refused: a web page a user visits can make their
//! browser POST a form (`application/x-www-form-urlencoded` or
//! `text/plain`, no preflight) to any address it reaches, `/write` and
//! `/api/v2/write` among them; with authentication off (or a token in a
//! URL) that would write. Browsers say where a request comes from
//! (`Sec-Fetch-Site`, `Origin`); a state-changing request they mark as
//! coming from another site is refused with 403. Clients that are not
//! browsers (curl, Telegraf, the InfluxDB clients, Grafana's server) send
//! neither header and are not affected.

use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ApiError;

/// Whether the headers of a request show a browser sending it from
/// another site.
pub fn is_cross_site(headers: &HeaderMap) -> bool {
    let get = |name| headers.get(name).and_then(|v| v.to_str().ok());
    match get("sec-fetch-site") {
        Some("cross-site") => return true,
        Some("same-origin" | "none") => return false,
        _ => {}
    }
    let Some(origin) = get(header::ORIGIN.as_str()) else {
        return false;
    };
    // The origin's host and port must be the address this request was sent
    // to (`Host`); "null" (a sandboxed page, a file) is never.
    let origin_host = origin
        .split_once("://")
        .map(|(_, rest)| rest.trim_end_matches('/'));
    match (origin_host, get(header::HOST.as_str())) {
        (Some(from), Some(host)) => !from.eq_ignore_ascii_case(host),
        _ => true,
    }
}

/// Refuses a state-changing request a browser sent from another site.
pub async fn refuse_cross_site(request: Request, next: Next) -> Response {
    let changes = !matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD | axum::http::Method::OPTIONS
    );
    if changes && is_cross_site(request.headers()) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "a browser's request from another site may not change anything here (Origin / Sec-Fetch-Site)",
        )
        .into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    axum::http::HeaderName::from_static(k),
                    axum::http::HeaderValue::from_static(v),
                )
            })
            .collect()
    }

    #[test]
    fn only_what_a_browser_marks_as_from_another_site_is_cross_site() {
        assert!(!is_cross_site(&headers(&[("host", "h:8080")])), "curl");
        assert!(is_cross_site(&headers(&[("sec-fetch-site", "cross-site")])));
        assert!(!is_cross_site(&headers(&[
            ("sec-fetch-site", "same-origin"),
            ("origin", "http://elsewhere")
        ])));
        assert!(!is_cross_site(&headers(&[
            ("origin", "http://h:8080"),
            ("host", "h:8080")
        ])));
        assert!(is_cross_site(&headers(&[
            ("origin", "http://evil.example"),
            ("host", "h:8080")
        ])));
        assert!(is_cross_site(&headers(&[
            ("origin", "null"),
            ("host", "h")
        ])));
        // same-site (another port or subdomain) is judged by its Origin.
        assert!(is_cross_site(&headers(&[
            ("sec-fetch-site", "same-site"),
            ("origin", "http://h:3000"),
            ("host", "h:8080")
        ])));
    }
}
