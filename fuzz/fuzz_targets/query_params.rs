//! Query parameters through planning and folding: never a panic.
#![no_main]

use hourglass::Granularity;
use hourglass::pure::{Grid, Need, Plan, Step, parse_instant, parse_step};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: (&str, &str, &str, bool)| {
    let (from, to, step, hour) = data;
    let (Ok(from_ms), Ok(to_ms)) = (parse_instant("from", from), parse_instant("to", to)) else {
        return;
    };
    // The API's own limits: from before to, at most 400 days, at most 10 000 points.
    if from_ms >= to_ms || (i128::from(to_ms) - i128::from(from_ms)) > 400 * 86_400_000 {
        return;
    }
    let (f, t) = (from_ms.div_euclid(1000) + 1, to_ms.div_euclid(1000) + 1);
    if f >= t {
        return;
    }
    let g = if hour {
        Granularity::Hour
    } else {
        Granularity::Minute
    };
    let grid = match parse_step(step) {
        Ok(Step::Fixed(step)) if step <= 400 * 86_400 => Grid::aligned(f, t, step),
        Ok(_) => return,
        Err(_) => Grid::whole(f, t),
    };
    let points = grid.points();
    if points > 10_000 {
        return;
    }
    let plan = Plan::new(g, Need::Aggregates, f, t, grid);
    let mut s = plan.start(&[]);
    // Unanswered asks move down the levels; a handful reach the buckets.
    for _ in 0..16 {
        if plan.ask(&mut s).is_none() {
            break;
        }
    }
    assert_eq!(plan.finish(s).len(), points);
});
