//! The HTTP side of [`crate::auth`]: a middleware that authenticates every
//! request of a route for its scope, and the answers for refusals.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ApiError;
use crate::auth::{AuthError, Keyring, Scope, presented_token};

/// How a route's clients present their token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forms {
    /// `Authorization: Bearer`: Hourglass' own API.
    Bearer,
    /// Also `Token` and Basic (password = token): InfluxDB 2.x clients.
    Influx,
    /// Also the query's `p`: InfluxDB 1.x clients (`u`/`p`).
    InfluxV1,
}

/// Middleware state: the authenticator, the scope a route needs, and the
/// token forms it takes.
#[derive(Clone)]
pub struct Require {
    pub auth: Arc<Keyring>,
    pub scope: Scope,
    /// Which ways of presenting a token the route takes.
    pub forms: Forms,
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        let status = match e {
            AuthError::NoToken => StatusCode::UNAUTHORIZED,
            AuthError::Scope { .. } | AuthError::Sensor { .. } => StatusCode::FORBIDDEN,
        };
        ApiError::new(status, e.to_string())
    }
}

/// 401 without a valid token, 403 without the route's scope; otherwise the
/// request goes on with its [`crate::auth::Principal`] in the extensions.
pub async fn authorize(State(require): State<Require>, mut req: Request, next: Next) -> Response {
    let mut token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|a| presented_token(a, require.forms != Forms::Bearer));
    if token.is_none() && require.forms == Forms::InfluxV1 {
        token = req.uri().query().and_then(|q| {
            url::form_urlencoded::parse(q.as_bytes())
                .find(|(k, _)| k == "p")
                .map(|(_, v)| v.into_owned())
        });
    }
    match require
        .auth
        .current()
        .authenticate_token(token.as_deref(), require.scope)
    {
        Ok(principal) => {
            req.extensions_mut().insert(principal);
            next.run(req).await
        }
        Err(e) => {
            let no_token = e == AuthError::NoToken;
            let mut response = ApiError::from(e).into_response();
            if no_token {
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            response
        }
    }
}
