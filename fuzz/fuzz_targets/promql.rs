//! PromQL through the whole path: the limits, the parser, the compiler, the
//! reads' plan, their windows and the evaluation, over a few series held in
//! memory, on a thread with a worker's stack (as the service runs it).
//! Never a panic, never an overflow; an answer holds one value per
//! evaluation time, and what is refused is refused with a message.
#![no_main]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hourglass::pure::{
    PromBudget, PromLabels, PromLimits, PromMemory, PromSteps, Sample, WORKER_STACK_BYTES,
};
use libfuzzer_sys::fuzz_target;

/// Three sensors at two sites with three metrics, a reading every 15 to 45 s
/// over two hours before `NOW`, a counter that resets once.
const NOW_MS: i64 = 1_700_000_000_000;

fn memory() -> &'static PromMemory {
    static MEMORY: OnceLock<PromMemory> = OnceLock::new();
    MEMORY.get_or_init(|| {
        let mut series = Vec::new();
        for (k, (sensor, site)) in [("s-a", "x"), ("s-b", "x"), ("s-c", "y")]
            .into_iter()
            .enumerate()
        {
            for (m, metric) in ["temp", "hum", "energy"].into_iter().enumerate() {
                let labels: PromLabels = [("__name__", metric), ("sensor", sensor), ("site", site)]
                    .into_iter()
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .collect();
                let mut t = NOW_MS / 1000 - 7200;
                let mut v = 100.0 * (k + 1) as f64;
                let mut samples = Vec::new();
                while t < NOW_MS / 1000 {
                    v = if metric == "energy" {
                        if samples.len() == 100 {
                            3.0
                        } else {
                            v + (t % 7) as f64
                        }
                    } else {
                        ((t * 31 + m as i64) % 97) as f64 / 4.0
                    };
                    samples.push(Sample { t, v });
                    t += 15 + (t % 31);
                }
                series.push((labels, samples));
            }
        }
        PromMemory { series }
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    let query = query.to_owned();
    let handle = std::thread::Builder::new()
        .stack_size(WORKER_STACK_BYTES)
        .spawn(move || {
            let budget = PromBudget {
                limits: PromLimits::default(),
                max_series: 50,
                max_samples: 200_000,
                max_range_ms: 400 * 86_400_000,
                max_memory: 256 << 20,
                deadline: Instant::now().checked_add(Duration::from_secs(2)),
            };
            // An instant query and a range query of an hour at 1 min.
            for steps in [
                PromSteps::new(NOW_MS, NOW_MS, 1),
                PromSteps::new(NOW_MS - 3_600_000, NOW_MS, 60_000),
            ] {
                match memory().evaluate(&query, steps, &budget) {
                    Ok(outcome) => match outcome.value {
                        hourglass::pure::PromValue::Vector(series) => {
                            for s in &series {
                                assert_eq!(s.values.len(), steps.n, "{query}");
                            }
                        }
                        hourglass::pure::PromValue::Scalar(v) => assert_eq!(v.len(), steps.n),
                        hourglass::pure::PromValue::String(_) => panic!("a string answer: {query}"),
                    },
                    Err(e) => assert!(!e.to_string().is_empty(), "{query}"),
                }
            }
        })
        .expect("a thread");
    handle.join().expect("no panic");
});
