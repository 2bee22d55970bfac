//! The CPU the official driver spends, told apart from the service's own.
//!
//! The driver runs inside the tasks that await it (it encodes a command,
//! writes it, reads and decodes the reply in the caller's poll), so no
//! thread or task holds its CPU alone. Each driver call on the write path
//! and the rollup upkeep is awaited through [`Timed`], which adds this
//! thread's CPU time across each poll of the call to
//! `hourglass_mongodb_driver_cpu_seconds_total`. The `peers` load test
//! reports the service's CPU with and without it. What is not wrapped
//! (startup, administration, queries) and the driver's own background
//! tasks (server monitoring, the connection pool) count as the service's,
//! so the split errs on the service's side. A poll costs two reads of the
//! thread's clock (a system call each), counted as the driver's.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context, Poll};

use prometheus::Counter;

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

/// This thread's CPU time in seconds, where the system has such a clock.
#[cfg(unix)]
fn thread_cpu() -> Option<f64> {
    use nix::time::{ClockId, clock_gettime};
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
        .ok()
        .map(|t| t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9)
}

#[cfg(not(unix))]
fn thread_cpu() -> Option<f64> {
    None
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
