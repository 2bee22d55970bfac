//! What a connection has done, counted where it is done: request heads as
//! the service is called, bodies frame by frame as they move. Bytes that
//! carry no request (HTTP/2 PINGs, SETTINGS, window updates, a trickled
//! head) count for nothing, so they cannot keep a connection open. The
//! verdicts on a connection are pure functions of a snapshot and the time.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use axum::Router;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// Milliseconds since the process's first look at the clock: one scale
/// for every connection, so their ages compare.
pub fn now_ms() -> u64 {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    let epoch = EPOCH.get_or_init(std::time::Instant::now);
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// One connection's counters, shared by its service, its bodies, its
/// driver and the accept loop.
#[derive(Debug)]
pub struct Progress {
    /// When it was accepted ([`now_ms`]).
    pub accepted_ms: u64,
    /// Request heads received.
    heads: AtomicU64,
    /// Requests whose handler has not answered yet.
    pending: AtomicUsize,
    /// Responses whose body is not finished.
    streaming: AtomicUsize,
    /// The last request head, body frame or end of an exchange.
    last_ms: AtomicU64,
}

/// A moment's copy of [`Progress`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    pub accepted_ms: u64,
    pub heads: u64,
    pub pending: usize,
    pub streaming: usize,
    pub last_ms: u64,
}

impl Progress {
    pub fn new(accepted_ms: u64) -> Arc<Self> {
        Arc::new(Self {
            accepted_ms,
            heads: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            streaming: AtomicUsize::new(0),
            last_ms: AtomicU64::new(accepted_ms),
        })
    }

    fn touch(&self) {
        self.last_ms.fetch_max(now_ms(), Ordering::AcqRel);
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            accepted_ms: self.accepted_ms,
            heads: self.heads.load(Ordering::Acquire),
            pending: self.pending.load(Ordering::Acquire),
            streaming: self.streaming.load(Ordering::Acquire),
            last_ms: self.last_ms.load(Ordering::Acquire),
        }
    }
}

/// The bounds a connection is judged by.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// A first request head is due this long after the connection opens.
    pub head_ms: u64,
    /// With nothing in progress, this long without a request closes it; a
    /// response body that has not moved this long closes it too.
    pub idle_ms: u64,
}

/// What becomes of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Serving; look again at this time.
    Keep { until_ms: u64 },
    /// Nothing in progress for the idle time: closed gracefully.
    Idle,
    /// No request head in time, or a response body that does not move:
    /// dropped at once.
    Cut,
}

/// The verdict on `s` at `now_ms`.
pub fn verdict(s: Snapshot, now_ms: u64, b: Bounds) -> Verdict {
    if s.heads == 0 {
        let due = s.accepted_ms.saturating_add(b.head_ms);
        return if now_ms >= due {
            Verdict::Cut
        } else {
            Verdict::Keep { until_ms: due }
        };
    }
    if s.pending > 0 {
        // A handler still working is bounded by its own timeouts.
        return Verdict::Keep {
            until_ms: now_ms.saturating_add(b.idle_ms),
        };
    }
    let due = s.last_ms.saturating_add(b.idle_ms);
    match (now_ms >= due, s.streaming > 0) {
        (false, _) => Verdict::Keep { until_ms: due },
        (true, true) => Verdict::Cut,
        (true, false) => Verdict::Idle,
    }
}

/// How long an answer's body may not move before its connection may give
/// way at the cap (a client that stopped reading an export).
pub const STALLED_MS: u64 = 5_000;

/// Whether a connection may be closed to make room for a new one at
/// `now_ms`: it has sent no request head, has nothing in progress, or only
/// answers whose bodies have not moved for [`STALLED_MS`]. A request being
/// handled never gives way (there are at most `http.max_concurrent_requests`
/// of them, fewer than `http.max_connections`).
pub fn may_give_way(s: Snapshot, now_ms: u64) -> bool {
    s.heads == 0
        || (s.pending == 0 && (s.streaming == 0 || now_ms.saturating_sub(s.last_ms) >= STALLED_MS))
}

/// Which of `candidates` gives way for a new connection: the oldest that
/// never sent a request head, else the longest idle, else the longest
/// stalled; none while every one is serving a request.
pub fn gives_way<K: Copy>(
    now_ms: u64,
    candidates: impl IntoIterator<Item = (K, Snapshot)>,
) -> Option<K> {
    candidates
        .into_iter()
        .filter(|(_, s)| may_give_way(*s, now_ms))
        .min_by_key(|(_, s)| {
            (
                s.heads > 0,
                s.streaming > 0,
                if s.heads == 0 {
                    s.accepted_ms
                } else {
                    s.last_ms
                },
            )
        })
        .map(|(k, _)| k)
}

/// The service a connection runs: the router, with each request head,
/// body frame and answer counted.
#[derive(Clone)]
pub struct Counted {
    pub app: Router,
    pub progress: Arc<Progress>,
}

/// Ends one count when dropped, noting the time.
struct Guard {
    progress: Arc<Progress>,
    streaming: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let counter = if self.streaming {
            &self.progress.streaming
        } else {
            &self.progress.pending
        };
        counter.fetch_sub(1, Ordering::AcqRel);
        self.progress.touch();
    }
}

fn guard(progress: &Arc<Progress>, streaming: bool) -> Guard {
    let counter = if streaming {
        &progress.streaming
    } else {
        &progress.pending
    };
    counter.fetch_add(1, Ordering::AcqRel);
    Guard {
        progress: progress.clone(),
        streaming,
    }
}

pin_project_lite::pin_project! {
    /// A body whose frames count as progress; with a guard, its end (or
    /// drop) ends a response's count.
    pub struct CountedBody<B> {
        #[pin]
        inner: B,
        progress: Arc<Progress>,
        guard: Option<Guard>,
    }
}

impl<B: Body> Body for CountedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(_))) => this.progress.touch(),
            Poll::Ready(None | Some(Err(_))) => {
                this.guard.take();
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl hyper::service::Service<axum::http::Request<Incoming>> for Counted {
    type Response = axum::http::Response<CountedBody<axum::body::Body>>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn call(&self, request: axum::http::Request<Incoming>) -> Self::Future {
        use tower::ServiceExt;
        let progress = self.progress.clone();
        progress.heads.fetch_add(1, Ordering::AcqRel);
        progress.touch();
        let pending = guard(&progress, false);
        let request = request.map(|body| CountedBody {
            inner: body,
            progress: progress.clone(),
            guard: None,
        });
        let app = self.app.clone();
        Box::pin(async move {
            let response = app.oneshot(request).await?;
            let streaming = guard(&progress, true);
            drop(pending);
            Ok(response.map(|body| CountedBody {
                inner: body,
                progress,
                guard: Some(streaming),
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Bounds = Bounds {
        head_ms: 10_000,
        idle_ms: 60_000,
    };

    fn snap(heads: u64, pending: usize, streaming: usize, last_ms: u64) -> Snapshot {
        Snapshot {
            accepted_ms: 0,
            heads,
            pending,
            streaming,
            last_ms,
        }
    }

    #[test]
    fn a_connection_without_a_head_is_cut_at_the_head_timeout_whatever_else_it_sends() {
        assert_eq!(
            verdict(snap(0, 0, 0, 0), 9_999, B),
            Verdict::Keep { until_ms: 10_000 }
        );
        assert_eq!(verdict(snap(0, 0, 0, 9_999), 10_000, B), Verdict::Cut);
    }

    #[test]
    fn idle_counts_from_the_last_request_and_a_stalled_body_is_cut() {
        assert_eq!(
            verdict(snap(3, 0, 0, 5_000), 64_999, B),
            Verdict::Keep { until_ms: 65_000 }
        );
        assert_eq!(verdict(snap(3, 0, 0, 5_000), 65_000, B), Verdict::Idle);
        assert_eq!(verdict(snap(3, 0, 1, 5_000), 65_000, B), Verdict::Cut);
        // A handler at work is its own timeouts' to bound.
        assert!(matches!(
            verdict(snap(3, 1, 0, 0), 10_000_000, B),
            Verdict::Keep { .. }
        ));
    }

    #[test]
    fn the_oldest_without_a_head_gives_way_first_then_the_longest_idle_never_one_at_work() {
        let s = |accepted_ms, heads, pending, last_ms| Snapshot {
            accepted_ms,
            heads,
            pending,
            streaming: 0,
            last_ms,
        };
        let all = [
            ("busy", s(0, 1, 1, 0)),
            ("idle-old", s(1, 2, 0, 5)),
            ("headless-new", s(30, 0, 0, 30)),
            ("headless-old", s(20, 0, 0, 20)),
        ];
        assert_eq!(gives_way(10, all), Some("headless-old"));
        assert_eq!(gives_way(10, all[..2].iter().copied()), Some("idle-old"));
        assert_eq!(gives_way(10, all[..1].iter().copied()), None);
        // An answer whose client stopped reading gives way once stalled,
        // after every idle one.
        let stalled = Snapshot {
            streaming: 1,
            ..s(0, 1, 0, 100)
        };
        let now = 100 + STALLED_MS;
        assert_eq!(gives_way(now - 1, [("stalled", stalled)]), None);
        assert_eq!(gives_way(now, [("stalled", stalled)]), Some("stalled"));
        assert_eq!(
            gives_way(now, [("stalled", stalled), ("idle-old", all[1].1)]),
            Some("idle-old")
        );
    }
}
