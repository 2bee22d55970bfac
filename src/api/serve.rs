//! The HTTP server: hyper's connection builder with a timer, so a client
//! that trickles a request head is cut off (`http.header_read_timeout`), a
//! connection silent both ways with no request in progress is closed
//! (`http.idle_timeout`), and no more
//! than `http.max_connections` are open at once (more wait in the listen
//! queue). `axum::serve` sets none of these.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::Settings;

/// How long the accept loop pauses after a failed accept (out of file
/// descriptors, say) before trying again.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// Serves `app` on `listener` until `stop` completes, then lets each open
/// connection finish its request in progress and close.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    settings: &Settings,
    stop: impl Future<Output = ()>,
) {
    let max = settings.max_connections;
    let permits = Arc::new(Semaphore::new(max));
    let stopping = CancellationToken::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    let idle = settings.idle_timeout;
    tokio::pin!(stop);
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = &mut stop => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    debug!(error = %e, "Accepting a connection failed; trying again.");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        let builder = builder.clone();
        let app = app.clone();
        let stopping = stopping.clone();
        tokio::spawn(async move {
            let _permit = permit;
            connection(stream, &builder, app, idle, stopping).await;
        });
    }
    drop(listener);
    stopping.cancel();
    // Every connection holds a permit until it ends.
    let _ = permits.acquire_many(max as u32).await;
}

/// Serves one connection until it ends, is idle for `idle`, or the server
/// stops; then once more `idle` for its request in progress to finish.
async fn connection(
    stream: TcpStream,
    builder: &auto::Builder<TokioExecutor>,
    app: Router,
    idle: Duration,
    stopping: CancellationToken,
) {
    let origin = Instant::now();
    let activity = Arc::new(AtomicU64::new(0));
    let io = TokioIo::new(Tracked {
        inner: stream,
        origin,
        activity: activity.clone(),
    });
    let busy = Arc::new(AtomicUsize::new(0));
    let service = InFlight {
        inner: TowerToHyperService::new(app),
        busy: busy.clone(),
        origin,
        activity: activity.clone(),
    };
    let conn = builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(conn);
    let last = || origin + Duration::from_millis(activity.load(Ordering::Relaxed));
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            () = tokio::time::sleep_until(last() + idle) => {
                // A handler still working (a long import, say) is not idle:
                // its own timeouts bound it.
                if busy.load(Ordering::Relaxed) > 0 {
                    Tracked::touch(origin, &activity);
                } else if last() + idle <= Instant::now() {
                    break;
                }
            }
            () = stopping.cancelled() => break,
        }
    }
    conn.as_mut().graceful_shutdown();
    // A response the client does not read would hold it for ever.
    let _ = tokio::time::timeout(idle, conn.as_mut()).await;
}

/// A service that counts the requests whose response head is not yet
/// written, and notes activity when one completes.
struct InFlight<S> {
    inner: S,
    busy: Arc<AtomicUsize>,
    origin: Instant,
    activity: Arc<AtomicU64>,
}

/// Ends one request's count when its handler finishes or is dropped.
struct Busy {
    busy: Arc<AtomicUsize>,
    origin: Instant,
    activity: Arc<AtomicU64>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.busy.fetch_sub(1, Ordering::Relaxed);
        Tracked::touch(self.origin, &self.activity);
    }
}

impl<S, R> hyper::service::Service<R> for InFlight<S>
where
    S: hyper::service::Service<R>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn call(&self, request: R) -> Self::Future {
        self.busy.fetch_add(1, Ordering::Relaxed);
        let guard = Busy {
            busy: self.busy.clone(),
            origin: self.origin,
            activity: self.activity.clone(),
        };
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await;
            drop(guard);
            response
        })
    }
}

pin_project_lite::pin_project! {
    /// A stream that notes when bytes last went either way.
    struct Tracked {
        #[pin]
        inner: TcpStream,
        origin: Instant,
        activity: Arc<AtomicU64>,
    }
}

impl Tracked {
    fn touch(origin: Instant, activity: &AtomicU64) {
        let ms = u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        activity.store(ms, Ordering::Relaxed);
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let polled = this.inner.poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            Self::touch(*this.origin, this.activity);
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.project();
        let polled = this.inner.poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            Self::touch(*this.origin, this.activity);
        }
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.project();
        let polled = this.inner.poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            Self::touch(*this.origin, this.activity);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}
