//! The listing routes: label names, a label's values and the series that
//! match `match[]` selectors, from the sensor registry, within
//! `query.max_listed`.

use std::collections::BTreeSet;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use promql_parser::label::Matcher;
use promql_parser::parser::Expr;
use serde::Serialize;

use super::admission::admitted;
use super::answer::Success;
use super::failure::Failure;
use super::params::{Form, parse_time};
use crate::api::AppState;
use crate::auth::Principal;
use crate::query::promql::{self, LabelSet, Limits, PromError};
use crate::store::SensorQuery;

/// The matchers of each `match[]`, parsed (and their regexes compiled) on
/// the blocking pool, not on an async worker.
async fn match_sets(form: &Form, limits: Limits) -> Result<Vec<Vec<Matcher>>, Failure> {
    let texts: Vec<String> = form.all("match[]").map(str::to_owned).collect();
    tokio::task::spawn_blocking(move || parse_match_sets(&texts, limits))
        .await
        .map_err(|_| Failure::from(PromError::Execution("the selectors failed to parse".into())))?
}

/// The matchers of each `match[]`: each must be a plain selector.
fn parse_match_sets(texts: &[String], limits: Limits) -> Result<Vec<Vec<Matcher>>, Failure> {
    // Together they are one request's selectors: one query's bounds.
    let total: usize = texts.iter().map(String::len).sum();
    if total > limits.max_length {
        return Err(Failure::bad_data(format!(
            "the match[] selectors are {total} bytes together; at most {} are accepted (query.max_query_length)",
            limits.max_length
        )));
    }
    let mut regexes = 0;
    texts
        .iter()
        .map(|m| {
            let expr =
                promql::compile::parse_counted(m, &limits, &mut regexes).map_err(|e| match e {
                    PromError::BadData(e) => {
                        Failure::bad_data(format!("invalid parameter \"match[]\": {e}"))
                    }
                    other => Failure::from(other),
                })?;
            let Expr::VectorSelector(vs) = expr else {
                return Err(Failure::bad_data(format!(
                    "invalid parameter \"match[]\": {m:?} is not a series selector"
                )));
            };
            Ok(promql::compile::matchers(&vs)?)
        })
        .collect()
}

/// Checks `start`/`end` parse (they do not narrow listings: the registry
/// keeps series, not their time ranges).
fn check_times(form: &Form) -> Result<(), Failure> {
    for name in ["start", "end"] {
        if let Some(t) = form.get(name).filter(|t| !t.is_empty()) {
            parse_time(name, t)?;
        }
    }
    Ok(())
}

fn limit_of(form: &Form, max: usize) -> Result<usize, Failure> {
    match form.get("limit").filter(|l| !l.is_empty()) {
        None => Ok(max),
        Some(l) => match l.parse::<usize>() {
            Ok(0) => Ok(max),
            Ok(n) => Ok(n.min(max)),
            Err(_) => Err(Failure::bad_data(format!(
                "invalid parameter \"limit\": {l:?} is not a number"
            ))),
        },
    }
}

/// Every label set the `match[]` sets select (all series without any), at
/// most `limit`; whether more were left out.
async fn listed(
    state: &AppState,
    principal: &Principal,
    form: &Form,
    limit: usize,
) -> Result<(Vec<LabelSet>, bool), Failure> {
    let sets = match_sets(form, state.settings.query.limits()).await?;
    let admitted = admitted(state, form).await?;
    let may_access = |s: &str| principal.may_access(s);
    let work = async {
        let mut out: BTreeSet<LabelSet> = BTreeSet::new();
        let mut truncated = false;
        if sets.is_empty() {
            state
                .store
                // Keeping a sensor ends the scan: only once the limit is hit.
                .sensors(SensorQuery::default(), 1, |info| {
                    if !may_access(&info.sensor) {
                        return false;
                    }
                    for m in &info.metrics {
                        if out.len() >= limit {
                            truncated = true;
                            return true;
                        }
                        out.insert(promql::labels_of(info, m));
                    }
                    false
                })
                .await
                .map_err(PromError::from)?;
        }
        for matchers in &sets {
            let found = promql::select(state.store.as_ref(), matchers, limit, &may_access).await?;
            truncated |= found.len() > limit;
            out.extend(found.into_iter().map(|f| f.labels));
        }
        if out.len() > limit {
            truncated = true;
            out = out.into_iter().take(limit).collect();
        }
        Ok::<_, PromError>((out.into_iter().collect(), truncated))
    };
    let got = tokio::time::timeout_at(admitted.deadline, work)
        .await
        .map_err(|_| Failure::timeout())??;
    admitted.done(state, "promql_listing", crate::query::Cost::default());
    Ok(got)
}

/// A listing's answer, warning when the limit left entries out.
fn with_warning<T: Serialize>(data: T, truncated: bool) -> Response {
    let mut answer = Success::new(data);
    if truncated {
        answer.warnings.push("results truncated due to limit");
    }
    Json(answer).into_response()
}

fn listing_limit(state: &AppState) -> usize {
    state.settings.query.max_listed
}

/// A sorted list of names from every listed series, at most `limit=`.
async fn names_of(
    state: &AppState,
    principal: &Principal,
    form: &Form,
    pick: impl Fn(&LabelSet) -> Vec<&str>,
) -> Result<Response, Failure> {
    check_times(form)?;
    let limit = limit_of(form, listing_limit(state))?;
    let (sets, truncated) = listed(state, principal, form, listing_limit(state)).await?;
    let names: BTreeSet<&str> = sets.iter().flat_map(&pick).collect();
    let cut = truncated || names.len() > limit;
    let names: Vec<&str> = names.into_iter().take(limit).collect();
    Ok(with_warning(names, cut))
}

pub async fn labels(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RawQuery(raw): RawQuery,
    body: Bytes,
) -> Result<Response, Failure> {
    let form = Form::new(raw.as_deref(), &body);
    names_of(&state, &principal, &form, |l| {
        l.keys().map(String::as_str).collect()
    })
    .await
}

pub async fn label_values(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, Failure> {
    let form = Form::new(raw.as_deref(), &[]);
    names_of(&state, &principal, &form, |l| {
        l.get(&name).map(String::as_str).into_iter().collect()
    })
    .await
}

pub async fn series(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RawQuery(raw): RawQuery,
    body: Bytes,
) -> Result<Response, Failure> {
    let form = Form::new(raw.as_deref(), &body);
    if form.get("match[]").is_none() {
        return Err(Failure::bad_data("no match[] parameter provided"));
    }
    check_times(&form)?;
    let limit = limit_of(&form, listing_limit(&state))?;
    let (sets, truncated) = listed(&state, &principal, &form, limit).await?;
    Ok(with_warning(sets, truncated))
}
