//! `GET /api/v1/openapi.json`: the API described from the handlers' own
//! types and annotations (utoipa), so it cannot drift from them silently;
//! tests check that it lists every route, and that every parameter and
//! answer in it is described (the HTTP API reference is rendered from it).

use axum::Json;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::{Object, RefOr, Type};
use utoipa::{Modify, OpenApi};

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
        query::at,
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
        query::AtReading,
        query::AtValue,
        query::AtResponse,
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
    )),
    modifiers(&LayerHeaders)
)]
struct ApiDoc;

/// The headers the API's layers add to every route's answers, whatever the
/// handler: `Retry-After` on a 503 or 429 (`routes::with_retry_after`;
/// `/health/*` is outside those layers) and `WWW-Authenticate` on a 401
/// (`auth::authorize`).
struct LayerHeaders;

impl Modify for LayerHeaders {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let api = doc
            .paths
            .paths
            .iter_mut()
            .filter(|(p, _)| p.starts_with("/api/"));
        for (_, item) in api {
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
            ];
            for op in operations.into_iter().flatten() {
                for (status, response) in op.responses.responses.iter_mut() {
                    let RefOr::T(response) = response else {
                        continue;
                    };
                    let (name, header) = match status.as_str() {
                        "429" | "503" => (
                            "Retry-After",
                            HeaderBuilder::new()
                                .schema(Object::with_type(Type::Integer))
                                .description(Some(
                                    "Seconds to wait before sending the request again",
                                )),
                        ),
                        "401" => (
                            "WWW-Authenticate",
                            HeaderBuilder::new()
                                .schema(Object::with_type(Type::String))
                                .description(Some("`Bearer`: the token to present")),
                        ),
                        _ => continue,
                    };
                    response.headers.insert(name.to_owned(), header.build());
                }
            }
        }
    }
}

/// This document.
#[utoipa::path(get, path = "/api/v1/openapi.json",
    responses((status = 200, body = Object, description = "This document, OpenAPI 3.1")))]
pub async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
