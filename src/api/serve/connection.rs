//! One connection, served until it ends, idles, stalls or gives way: a
//! thin driver around [`super::progress`]'s verdicts.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::progress::{Bounds, Counted, Progress, Verdict, now_ms, verdict};

/// What ends a connection besides itself.
pub struct Ends {
    /// The server stops: the request in progress finishes, then it closes.
    pub stopping: CancellationToken,
    /// It gives way to a new connection: dropped at once.
    pub give_way: CancellationToken,
}

/// Serves `stream` with `service` until it ends, idles or stalls past
/// `bounds`, gives way, or the server stops (then the request in progress
/// has `bounds.idle_ms` more to finish).
pub async fn serve_one(
    stream: TcpStream,
    builder: &auto::Builder<TokioExecutor>,
    service: Counted,
    bounds: Bounds,
    ends: Ends,
) {
    let progress: Arc<Progress> = service.progress.clone();
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let mut until = now_ms();
    loop {
        let wait = Duration::from_millis(until.saturating_sub(now_ms()));
        tokio::select! {
            _ = conn.as_mut() => return,
            () = tokio::time::sleep(wait) => {
                match verdict(progress.snapshot(), now_ms(), bounds) {
                    Verdict::Keep { until_ms } => until = until_ms,
                    Verdict::Idle => break,
                    // Dropping the connection closes its socket.
                    Verdict::Cut => return,
                }
            }
            () = ends.give_way.cancelled() => return,
            () = ends.stopping.cancelled() => break,
        }
    }
    conn.as_mut().graceful_shutdown();
    // A response the client does not read would hold it for ever.
    let _ = tokio::time::timeout(Duration::from_millis(bounds.idle_ms), conn.as_mut()).await;
}
