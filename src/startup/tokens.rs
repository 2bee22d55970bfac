//! Tokens rotate without a restart: the tokens file (`auth.tokens_file`) is
//! read every [`READ_EVERY`] and its tokens put in force when its text
//! changed; SIGHUP also re-reads the configuration file (`auth.tokens`). A
//! set that does not check out is refused whole and the one in force stays.

use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::auth::{self, Keyring};
use crate::config::Settings;
use crate::shutdown::Shutdown;
use crate::telemetry::metrics::Metrics;

/// How often the tokens file is read for a change.
const READ_EVERY: Duration = Duration::from_secs(2);

/// Reloads the tokens until the shutdown (see the module doc). `config`:
/// the configuration file to re-read on SIGHUP; without one (the service
/// embedded, as in tests) the settings the service started with are kept
/// and only the tokens file is re-read.
pub(super) async fn run(
    keyring: Arc<Keyring>,
    started_with: auth::Settings,
    config: Option<PathBuf>,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
) {
    let mut hangups = config.as_ref().and_then(|_| {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .inspect_err(|e| warn!(error = %e, "Could not listen for SIGHUP; tokens reload only when the tokens file changes."))
            .ok()
    });
    let mut seen = fingerprint(&started_with);
    let mut tick = tokio::time::interval(READ_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let why = tokio::select! {
            _ = shutdown.triggered() => return,
            Some(()) = async {
                match hangups.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            } => "SIGHUP",
            _ = tick.tick() => {
                let now = fingerprint(&started_with);
                if now == seen {
                    continue;
                }
                seen = now;
                "the tokens file changed"
            }
        };
        let settings = match &config {
            Some(path) => Settings::load(Some(path))
                .map(|s| s.auth)
                .map_err(|e| e.to_string()),
            None => Ok(started_with.clone()),
        };
        let outcome = settings.and_then(|s| keyring.reload(&s).map_err(|e| e.to_string()));
        match outcome {
            Ok(tokens) => {
                metrics.auth_reloads.with_label_values(&["applied"]).inc();
                info!(
                    why,
                    tokens, "Reloaded the tokens; the set before is no longer accepted."
                );
            }
            Err(reason) => {
                metrics.auth_reloads.with_label_values(&["refused"]).inc();
                warn!(why, %reason, "Did not reload the tokens; the set in force stays.");
            }
        }
    }
}

/// A hash of the tokens file's text (or of why it cannot be read), so a
/// change of any kind is seen, a symlink swapped under it included.
fn fingerprint(settings: &auth::Settings) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    if let Some(path) = &settings.tokens_file {
        match auth::read_bounded(path) {
            Ok(text) => text.hash(&mut hasher),
            Err(e) => e.kind().hash(&mut hasher),
        }
    }
    hasher.finish()
}
