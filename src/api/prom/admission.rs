//! A PromQL query's admission: the service's own, shortened by the
//! request's `timeout=`.

use std::time::Duration;

use super::failure::Failure;
use super::params::{Form, parse_duration};
use crate::api::AppState;
use crate::api::query::{Admitted, admit};

pub(super) async fn admitted<'a>(
    state: &'a AppState,
    form: &Form,
) -> Result<Admitted<'a>, Failure> {
    let timeout = form
        .get("timeout")
        .filter(|t| !t.is_empty())
        .map(|t| parse_duration("timeout", t))
        .transpose()?;
    let mut a = admit(state)
        .await
        .map_err(|e| Failure::unavailable(e.message))?;
    if let Some(t) = timeout {
        a.shorten(Duration::from_millis(t.max(1).unsigned_abs()));
    }
    Ok(a)
}
