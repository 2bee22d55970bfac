//! The accept loop: at most `http.max_connections` open, and at the cap a
//! connection that has not sent a request head (or has nothing in
//! progress) gives way to the new one, oldest first, so a probe is never
//! stuck in the listen queue behind slow clients.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::super::Settings;
use super::connection::{Ends, serve_one};
use super::progress::{Bounds, Counted, Progress, gives_way, now_ms};

/// How long the accept loop pauses after a failed accept (out of file
/// descriptors, say) before trying again.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// How often a new connection waiting at the cap looks again for one that
/// may give way.
const ROOM_RETRY: Duration = Duration::from_millis(100);

/// Streams one HTTP/2 connection may carry at once.
const MAX_STREAMS: u32 = 64;
/// Bytes of one request's headers (HTTP/2's header list).
const MAX_HEADER_BYTES: u32 = 64 * 1024;

/// The open connections, as the accept loop sees them.
type Open = Arc<Mutex<HashMap<u64, (Arc<Progress>, CancellationToken)>>>;

fn builder(settings: &Settings) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(MAX_HEADER_BYTES)
        .max_pending_accept_reset_streams(Some(20))
        .max_local_error_reset_streams(Some(1024));
    builder
}

/// Asks the connection that gives way to close, if one may.
fn make_room(open: &Open) -> bool {
    let open = open.lock().unwrap_or_else(|e| e.into_inner());
    let victim = gives_way(
        now_ms(),
        open.iter().map(|(id, (p, _))| (*id, p.snapshot())),
    );
    match victim.and_then(|id| open.get(&id)) {
        Some((_, give_way)) => {
            give_way.cancel();
            true
        }
        None => false,
    }
}

/// Serves `app` on `listener` until `stop` completes, then lets each open
/// connection finish its request in progress and close.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    settings: &Settings,
    stop: impl Future<Output = ()>,
) {
    // Long: the accept loop: accept, find room (giving way at the cap), spawn; then the drain.
    let max = settings.max_connections;
    let permits = Arc::new(Semaphore::new(max));
    let stopping = CancellationToken::new();
    let builder = Arc::new(builder(settings));
    let bounds = Bounds {
        head_ms: u64::try_from(settings.header_read_timeout.as_millis()).unwrap_or(u64::MAX),
        idle_ms: u64::try_from(settings.idle_timeout.as_millis()).unwrap_or(u64::MAX),
    };
    let open: Open = Arc::default();
    let mut next_id = 0u64;
    tokio::pin!(stop);
    loop {
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
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                // At the cap: one that gives way makes room; while every
                // connection is at work, the new one waits for one to end
                // or to finish its request.
                let permit = loop {
                    make_room(&open);
                    tokio::select! {
                        permit = permits.clone().acquire_owned() => break permit.ok(),
                        () = tokio::time::sleep(ROOM_RETRY) => {}
                        () = &mut stop => break None,
                    }
                };
                match permit {
                    Some(permit) => permit,
                    None => break,
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let progress = Progress::new(now_ms());
        let give_way = CancellationToken::new();
        next_id += 1;
        let id = next_id;
        open.lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, (progress.clone(), give_way.clone()));
        let service = Counted {
            app: app.clone(),
            progress,
        };
        let (builder, open, stopping) = (builder.clone(), open.clone(), stopping.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let ends = Ends { stopping, give_way };
            serve_one(stream, &builder, service, bounds, ends).await;
            open.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        });
    }
    drop(listener);
    stopping.cancel();
    // Every connection holds a permit until it ends.
    let _ = permits.acquire_many(max as u32).await;
}
