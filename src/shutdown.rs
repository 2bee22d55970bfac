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

/// Resolves on the first SIGTERM or SIGINT (Ctrl-C). The handlers are
/// installed when this is called, not when the future is first polled: the
/// service logs its address before it polls it, and a SIGTERM sent in
/// between took the default action (killed, nothing drained). Needs a
/// tokio runtime; a handler that cannot be installed never resolves.
pub fn signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let (interrupt, terminate) = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::interrupt()).ok(),
            signal(SignalKind::terminate()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let first = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = first(interrupt) => {}
                _ = first(terminate) => {}
            }
        }
        #[cfg(not(unix))]
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Before its fix the handlers were installed on the first poll, and
    /// this SIGTERM killed the test process.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_sigterm_that_comes_before_the_first_poll_is_caught() {
        let stopped = signal();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success());
        tokio::time::timeout(Duration::from_secs(60), stopped)
            .await
            .expect("the SIGTERM resolves it");
    }

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
