//! `GET /`: the web console, compiled into the binary (no build step, nothing
//! fetched at run time). The page reads the service's own API with the
//! token it asks for; the files themselves need none.
//!
//! Five files do not need a crate: `include_bytes!` keeps them in the binary
//! and each route names its content type. uPlot (MIT, `vendor/LICENSE-uPlot`)
//! draws the charts: 51 KB, time axes in any zone, and bands for the
//! min/max of each point, which the buckets' pre-aggregates give.

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use serde::Serialize;

use super::AppState;

/// A static file: its content type and bytes.
struct Asset(&'static str, &'static [u8]);

const INDEX: Asset = Asset(
    "text/html; charset=utf-8",
    include_bytes!("assets/index.html"),
);
const APP_JS: Asset = Asset(
    "text/javascript; charset=utf-8",
    include_bytes!("assets/app.js"),
);
const APP_CSS: Asset = Asset("text/css; charset=utf-8", include_bytes!("assets/app.css"));
const UPLOT_JS: Asset = Asset(
    "text/javascript; charset=utf-8",
    include_bytes!("assets/vendor/uPlot.iife.min.js"),
);
const UPLOT_CSS: Asset = Asset(
    "text/css; charset=utf-8",
    include_bytes!("assets/vendor/uPlot.min.css"),
);
const UPLOT_LICENSE: Asset = Asset(
    "text/plain; charset=utf-8",
    include_bytes!("assets/vendor/LICENSE-uPlot"),
);

impl IntoResponse for &'static Asset {
    fn into_response(self) -> axum::response::Response {
        (
            [
                (header::CONTENT_TYPE, self.0),
                // A new binary may serve new files under the same names.
                (header::CACHE_CONTROL, "no-cache"),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            ],
            self.1,
        )
            .into_response()
    }
}

/// What the page needs to know before its first API call.
#[derive(Debug, Serialize)]
struct ConsoleConfig {
    /// Whether the API asks for a token.
    auth: bool,
    version: &'static str,
}

async fn config(State(state): State<AppState>) -> Json<ConsoleConfig> {
    Json(ConsoleConfig {
        auth: state.auth.enabled(),
        version: env!("CARGO_PKG_VERSION"),
    })
}

/// The console's routes, open like the health routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { &INDEX }))
        .route("/console/app.js", get(|| async { &APP_JS }))
        .route("/console/app.css", get(|| async { &APP_CSS }))
        .route("/console/uPlot.iife.min.js", get(|| async { &UPLOT_JS }))
        .route("/console/uPlot.min.css", get(|| async { &UPLOT_CSS }))
        .route("/console/LICENSE-uPlot", get(|| async { &UPLOT_LICENSE }))
        .route("/console/config.json", get(config))
}
