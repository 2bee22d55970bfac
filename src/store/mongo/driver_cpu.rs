//! The CPU the official driver spends, told apart from the service's own.
//!
//! The driver runs in two places. Its calls run inside the tasks that await
//! them (a call encodes a command, writes it, reads and decodes the reply in
//! the caller's poll), so no thread holds that CPU alone: each call on the
//! write path and the rollup upkeep is awaited through [`Timed`], which adds
//! this thread's CPU time across each poll of the call. Its background work
//! (server monitoring, the connection pool, dialing, the readiness of its
//! sockets) runs on its own thread (`crate::runtime::driver`), whose CPU is
//! counted as it parks. Both make
//! `hourglass_mongodb_driver_cpu_seconds_total`; the `peers` load test
//! reports the service's CPU with and without it. Calls not wrapped
//! (startup, administration, queries) and the tasks the driver spawns from
//! a call (an implicit session's return to its pool) count as the
//! service's, so the split errs on the service's side. A poll costs two
//! reads of the thread's clock (a system call each), counted as the
//! driver's.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context, Poll};

use prometheus::Counter;

use crate::runtime::thread_cpu_seconds as thread_cpu;

pin_project_lite::pin_project! {
    /// A driver call whose CPU time goes to `counter` (none: not counted).
    pub(super) struct Timed<'a, F> {
        #[pin]
        inner: F,
        counter: Option<&'a Counter>,
    }
}

/// `call` with its CPU counted into `counter`.
pub(super) fn timed<F: IntoFuture>(call: F, counter: Option<&Counter>) -> Timed<'_, F::IntoFuture> {
    Timed {
        inner: call.into_future(),
        counter,
    }
}

impl<F: Future> Future for Timed<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let Some(counter) = this.counter else {
            return this.inner.poll(cx);
        };
        let start = thread_cpu();
        let out = this.inner.poll(cx);
        if let (Some(a), Some(b)) = (start, thread_cpu()) {
            counter.inc_by((b - a).max(0.0));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Burns this thread's CPU for about `seconds` of its own clock.
    fn burn(seconds: f64) -> u64 {
        let (start, mut x) = (thread_cpu().expect("a thread clock"), 1u64);
        while thread_cpu().expect("a thread clock") - start < seconds {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
            }
        }
        x
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_cpu_of_a_call_s_polls_is_counted_and_not_the_callers() {
        let counter = Counter::new("driver_cpu", "test").expect("a counter");
        // The call burns in each of its two polls; the caller burns between them.
        let call = async {
            burn(0.02);
            tokio::task::yield_now().await;
            burn(0.02)
        };
        let (_, caller) = tokio::join!(timed(call, Some(&counter)), async {
            tokio::task::yield_now().await;
            let before = thread_cpu().expect("a thread clock");
            burn(0.05);
            thread_cpu().expect("a thread clock") - before
        });
        let got = counter.get();
        // Both of the call's polls are in, and none of the caller's 50 ms.
        assert!(got >= 0.04, "{got}");
        assert!(
            got < 0.04 + caller * 0.5,
            "{got} with the caller's {caller}"
        );
        // Uncounted: nothing is read.
        let before = counter.get();
        timed(async { burn(0.01) }, None).await;
        assert_eq!(counter.get(), before);
    }
}
