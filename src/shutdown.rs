//! One shutdown for the whole service, in the style of mini-redis' `Shutdown`:
//! a single trigger that every stage subscribes to, and one deadline that all
//! of them share (`shutdown.timeout` after the trigger).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// `[shutdown]`: how long stopping may take.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl Settings {
    pub fn validate(&self) -> Result<(), crate::settings::Invalid> {
        crate::settings::longer_than_zero(&[("shutdown.timeout", self.timeout)])
    }
}

/// A cheap-to-clone handle on the service's shutdown.
#[derive(Clone, Debug)]
pub struct Shutdown {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    triggered: CancellationToken,
    deadline: OnceLock<Instant>,
    timeout: Duration,
}

impl Shutdown {
    /// Everything must be finished `timeout` after [`Shutdown::trigger`].
    pub fn new(timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                triggered: CancellationToken::new(),
                deadline: OnceLock::new(),
                timeout,
            }),
        }
    }

    /// Starts the shutdown (again is a no-op): input stops, the deadline starts.
    pub fn trigger(&self) {
        self.inner
            .deadline
            .get_or_init(|| Instant::now() + self.inner.timeout);
        self.inner.triggered.cancel();
    }

    pub fn is_triggered(&self) -> bool {
        self.inner.triggered.is_cancelled()
    }

    /// Resolves once the shutdown has started.
    pub async fn triggered(&self) {
        self.inner.triggered.cancelled().await;
    }

    /// Resolves at the shared deadline: whatever is not done by then is given up.
    pub async fn deadline_passed(&self) {
        self.triggered().await;
        if let Some(deadline) = self.inner.deadline.get() {
            tokio::time::sleep_until(*deadline).await;
        }
    }
}

/// Resolves on the first SIGTERM or SIGINT (Ctrl-C).
pub async fn signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_deadline_is_shared_and_counted_from_the_trigger() {
        let shutdown = Shutdown::new(Duration::from_secs(30));
        assert!(!shutdown.is_triggered());
        tokio::time::sleep(Duration::from_secs(100)).await;
        let t0 = Instant::now();
        shutdown.trigger();
        let other = shutdown.clone();
        shutdown.triggered().await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        other.trigger();
        other.deadline_passed().await;
        assert_eq!(
            t0.elapsed(),
            Duration::from_secs(30),
            "a second trigger does not move it"
        );
    }
}
