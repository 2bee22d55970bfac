//! Tokens rotate without a restart. The tokens file (`auth.tokens_file`) is
//! read every [`READ_EVERY`]; a text that differs from the one in force and
//! reads the same twice in a row (no half-written file) is checked and put
//! in force, the very bytes read. SIGHUP re-reads the configuration's
//! `[auth]` (its `auth.tokens`) and the file at once. A set that does not
//! check out is refused whole, logged once, and tried again as the files
//! change; the set in force stays.

use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::Signal;
use tracing::{info, warn};

use crate::auth::{self, Keyring};
use crate::config::Settings;
use crate::shutdown::Shutdown;
use crate::telemetry::metrics::Metrics;

/// How often the tokens file is read for a change.
const READ_EVERY: Duration = Duration::from_secs(2);

/// The longest a read of the tokens file may take (a hung mount).
const READ_WITHIN: Duration = Duration::from_secs(5);

/// What reloads the tokens: the configuration file for SIGHUP, and the
/// signal's stream, installed before the service's slow start (a SIGHUP's
/// default action would end the process).
pub struct Reload {
    pub config: PathBuf,
    pub hangups: Signal,
}

/// Reloads the tokens until the shutdown (see the module doc). Without a
/// [`Reload`] (the service embedded, as in tests) only the tokens file is
/// watched, with the `auth.tokens` the service started with.
pub(super) async fn run(
    keyring: Arc<Keyring>,
    started_with: auth::Settings,
    reload: Option<Reload>,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
) {
    let (config, mut hangups) = match reload {
        Some(r) => (Some(r.config), Some(r.hangups)),
        None => (None, None),
    };
    let path = started_with.tokens_file.clone();
    let mut settings = started_with;
    let mut state = Watch::default();
    let mut tick = tokio::time::interval(READ_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let hangup = tokio::select! {
            _ = shutdown.triggered() => return,
            Some(()) = async {
                match hangups.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            } => true,
            _ = tick.tick() => false,
        };
        if hangup {
            match reread(config.as_deref(), &settings) {
                Ok(next) => settings = next,
                Err(reason) => {
                    refused(&metrics, "SIGHUP", &reason);
                    continue;
                }
            }
        }
        let Some(file) = &path else {
            if hangup {
                apply(&keyring, &settings, None, &metrics, "SIGHUP");
            }
            continue;
        };
        let text = read(file.clone()).await;
        let seen = fingerprint(&text);
        if !hangup {
            if state.applied == Some(seen) {
                state.candidate = None;
                continue;
            }
            // Twice the same before it counts: a file being written is not
            // read halfway.
            if state.candidate != Some(seen) {
                state.candidate = Some(seen);
                continue;
            }
            // Refused as it is: said once, tried again when it changes.
            if state.refused == Some(seen) {
                continue;
            }
        }
        let why = if hangup {
            "SIGHUP"
        } else {
            "the tokens file changed"
        };
        if apply(&keyring, &settings, text.as_deref().ok(), &metrics, why) {
            state.applied = Some(seen);
            state.refused = None;
        } else {
            state.refused = Some(seen);
        }
    }
}

/// The configuration's `[auth]` as `config` says now (`settings` without
/// one), refused if it names another tokens file.
fn reread(
    config: Option<&std::path::Path>,
    settings: &auth::Settings,
) -> Result<auth::Settings, String> {
    let next = match config {
        Some(file) => Settings::load_auth(file).map_err(|e| e.to_string())?,
        None => settings.clone(),
    };
    if next.tokens_file != settings.tokens_file {
        return Err(auth::AuthConfigError::TokensFileChanged.to_string());
    }
    Ok(next)
}

/// What the watch of the tokens file has seen, by fingerprint.
#[derive(Default)]
struct Watch {
    /// The text in force (none at first: the first stable read applies).
    applied: Option<u64>,
    /// A new text read once, waiting to read the same again.
    candidate: Option<u64>,
    /// A text refused (with the `auth.tokens` in force then).
    refused: Option<u64>,
}

/// Puts `settings` with the file's `text` in force; whether it did.
fn apply(
    keyring: &Keyring,
    settings: &auth::Settings,
    text: Option<&str>,
    metrics: &Metrics,
    why: &str,
) -> bool {
    match keyring.reload(settings, text) {
        Ok(tokens) => {
            metrics.auth_reloads.with_label_values(&["applied"]).inc();
            info!(
                why,
                tokens, "Reloaded the tokens; the set before is no longer accepted."
            );
            true
        }
        Err(e) => {
            refused(metrics, why, &e.to_string());
            false
        }
    }
}

fn refused(metrics: &Metrics, why: &str, reason: &str) {
    metrics.auth_reloads.with_label_values(&["refused"]).inc();
    warn!(
        why,
        reason, "Did not reload the tokens; the set in force stays."
    );
}

/// The tokens file's text, read off the async workers and bounded in time.
async fn read(path: PathBuf) -> Result<String, String> {
    let reading = tokio::task::spawn_blocking(move || auth::read_bounded(&path));
    match tokio::time::timeout(READ_WITHIN, reading).await {
        Ok(Ok(Ok(text))) => Ok(text),
        Ok(Ok(Err(e))) => Err(e.to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the read took too long".to_owned()),
    }
}

/// A hash of the file's text, or of why it cannot be read: a change of any
/// kind is seen, a symbolic link swapped under it included.
fn fingerprint(text: &Result<String, String>) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}
