//! Whether a request may be answered from the results cache: a query with
//! `Cache-Control: no-cache` (or `no-store`) is computed afresh.

use axum::extract::Request;
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;

use super::AppState;

tokio::task_local! {
    /// Whether the request asked not to be answered from the results cache
    /// (`Cache-Control: no-cache` or `no-store`).
    static NO_CACHE: bool;
}

/// How a query of this request may use the results cache.
pub(crate) fn cache_use(state: &AppState) -> Option<crate::query::CacheUse<'_>> {
    if state.settings.query.cache_bytes == 0 {
        return None;
    }
    let now = jiff::Timestamp::now().as_second();
    let r = &state.settings.retention;
    let shortest = [r.buckets, r.hour, r.day, r.days30]
        .into_iter()
        .flatten()
        .min();
    let horizon = shortest.map_or(i64::MIN, |d| {
        now - i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 4) + 86_400
    });
    let read = !NO_CACHE.try_with(|b| *b).unwrap_or(false);
    Some(crate::query::CacheUse {
        cache: &state.cache,
        horizon,
        read,
        now,
    })
}

/// Runs the request knowing whether it bypasses the results cache.
pub(super) async fn cache_control(req: Request, next: Next) -> Response {
    let bypass = req
        .headers()
        .get_all(header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|d| {
            let d = d.trim();
            d.eq_ignore_ascii_case("no-cache") || d.eq_ignore_ascii_case("no-store")
        });
    NO_CACHE.scope(bypass, next.run(req)).await
}
