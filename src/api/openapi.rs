//! `GET /api/v1/openapi.json`: the API described from the handlers' own
//! types and annotations (utoipa), so it cannot drift from them silently; a
//! test checks it lists every route.

use axum::Json;
use utoipa::OpenApi;

use super::{delete, export, health, ingest, query};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Hourglass",
        description = "IoT time-series ingestion into MongoDB buckets."
    ),
    paths(
        ingest::post_readings,
        delete::delete_readings,
        query::put_labels,
        query::list_sensors,
        query::average,
        query::series,
        query::latest,
        query::uptime,
        query::group_average,
        query::group_series,
        query::list_dead_letters,
        export::export,
        document,
        health::live,
        health::ready,
        health::metrics,
    ),
    components(schemas(
        delete::DeleteResponse,
        query::Coarse,
        query::Point,
        query::AverageResponse,
        query::SeriesResponse,
        query::Group,
        query::GroupResponse,
        query::LatestResponse,
        query::UptimeResponse,
        query::GapEntry,
        query::SensorEntry,
        query::SensorList,
        query::DeadLetterEntry,
        query::DeadLetterList,
    ))
)]
struct ApiDoc;

/// This document.
#[utoipa::path(get, path = "/api/v1/openapi.json", responses((status = 200, description = "This document")))]
pub async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
