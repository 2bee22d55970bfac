use std::collections::{HashMap, HashSet};

use proptest::prelude::*;

use super::*;

fn series(names: &[(&str, &str)]) -> Vec<(String, String)> {
    names
        .iter()
        .map(|(s, m)| (s.to_string(), m.to_string()))
        .collect()
}

fn guard(hour: usize, token: usize) -> Guard {
    let mut g = Guard::new(Settings {
        max_new_series_per_hour: hour,
        max_new_series_per_hour_per_token: token,
        max_known_series: usize::MAX,
    });
    g.seeded();
    g
}

#[test]
fn new_series_past_the_hourly_bound_are_refused_and_known_ones_still_taken() {
    let mut g = guard(3, 0);
    let t = 10 * HOUR_MS + 1_000;
    assert_eq!(
        g.admit(t, None, &series(&[("a", "m"), ("b", "m"), ("a", "m")])),
        Ok(2)
    );
    let refused = g
        .admit(t, None, &series(&[("c", "m"), ("d", "m")]))
        .expect_err("over the bound");
    assert_eq!((refused.new, refused.used, refused.limit), (2, 2, 3));
    assert_eq!(refused.setting, "cardinality.max_new_series_per_hour");
    assert_eq!(refused.retry_after_s, 3599);
    assert_eq!(g.admit(t, None, &series(&[("a", "m"), ("b", "m")])), Ok(0));
    assert_eq!(g.admit(t, None, &series(&[("c", "m")])), Ok(1));
    // The next hour starts a new count.
    assert_eq!(
        g.admit(11 * HOUR_MS, None, &series(&[("d", "m"), ("e", "m")])),
        Ok(2)
    );
}

#[test]
fn each_token_has_its_own_bound_within_the_instance_one() {
    let mut g = guard(10, 2);
    let t = HOUR_MS;
    assert_eq!(
        g.admit(t, Some("x"), &series(&[("a", "m"), ("b", "m")])),
        Ok(2)
    );
    let refused = g
        .admit(t, Some("x"), &series(&[("c", "m")]))
        .expect_err("x is over");
    assert_eq!(
        refused.setting,
        "cardinality.max_new_series_per_hour_per_token"
    );
    assert_eq!(g.admit(t, Some("y"), &series(&[("c", "m")])), Ok(1));
    // Without auth there is no token: only the instance bound applies.
    assert_eq!(
        g.admit(t, None, &series(&[("d", "m"), ("e", "m"), ("f", "m")])),
        Ok(3)
    );
}

#[test]
fn before_the_seed_every_series_is_taken_and_learnt_uncounted() {
    let mut g = Guard::new(Settings {
        max_new_series_per_hour: 1,
        max_new_series_per_hour_per_token: 0,
        max_known_series: usize::MAX,
    });
    let many: Vec<(String, String)> = (0..100).map(|i| (format!("s{i}"), "m".into())).collect();
    assert_eq!(g.admit(0, None, &many), Ok(100));
    g.know([("old", "m")]);
    g.seeded();
    assert_eq!(g.admit(1, None, &many), Ok(0));
    assert_eq!(g.admit(1, None, &series(&[("old", "m")])), Ok(0));
    assert_eq!(g.admit(1, None, &series(&[("new", "m")])), Ok(1));
    assert!(g.admit(1, None, &series(&[("newer", "m")])).is_err());
}

proptest! {
    /// Against a brute-force model: per clock hour, the series first taken
    /// never pass either bound, a refused request takes nothing, and a
    /// series once taken is never counted again.
    #[test]
    fn the_guard_matches_a_model(
        requests in prop::collection::vec(
            (0..4i64, prop::option::of(0..3u8), prop::collection::vec((0..12u8, 0..2u8), 0..5)),
            1..60,
        ),
        hour_limit in 0..8usize,
        token_limit in 0..5usize,
    ) {
        let mut g = guard(hour_limit, token_limit);
        let mut known: HashSet<(String, String)> = HashSet::new();
        let mut counts: HashMap<(i64, Option<u8>), usize> = HashMap::new();
        let mut now = 0i64;
        for (step, token, names) in requests {
            now += step * 1_200_000;
            let hour = now / HOUR_MS;
            let candidates: Vec<(String, String)> = names
                .iter()
                .map(|(s, m)| (format!("s{s}"), format!("m{m}")))
                .collect();
            let fresh: HashSet<(String, String)> = candidates
                .iter()
                .filter(|c| !known.contains(*c))
                .cloned()
                .collect();
            let name = token.map(|t| format!("t{t}"));
            let used = counts.get(&(hour, None)).copied().unwrap_or(0);
            let by_token = token.map_or(0, |t| counts.get(&(hour, Some(t))).copied().unwrap_or(0));
            let over_hour = hour_limit > 0 && !fresh.is_empty() && used + fresh.len() > hour_limit;
            let over_token = token.is_some() && token_limit > 0 && !fresh.is_empty()
                && by_token + fresh.len() > token_limit;
            let got = g.admit(now, name.as_deref(), &candidates);
            if over_hour || over_token {
                prop_assert!(got.is_err());
            } else {
                prop_assert_eq!(got, Ok(fresh.len()));
                *counts.entry((hour, None)).or_default() += fresh.len();
                if let Some(t) = token {
                    *counts.entry((hour, Some(t))).or_default() += fresh.len();
                }
                known.extend(fresh);
            }
        }
    }
}

#[test]
fn the_known_series_stop_at_their_bound_and_the_guard_then_says_it_bounds_nothing() {
    let mut g = Guard::new(Settings {
        max_new_series_per_hour: 2,
        max_new_series_per_hour_per_token: 0,
        max_known_series: 3,
    });
    g.know([("a", "m"), ("b", "m"), ("c", "m")]);
    g.seeded();
    assert!(!g.is_full());
    // A known series is not new; a fourth would pass the bound.
    assert_eq!(g.admit(0, None, &[("a".into(), "m".into())]), Ok(0));
    assert_eq!(g.admit(0, None, &[("d".into(), "m".into())]), Ok(1));
    assert!(g.is_full(), "d was not remembered");
    assert_eq!(g.known.len(), 3);
    // From now on nothing is counted (or refused), and nothing grows.
    for i in 0..10 {
        assert_eq!(g.admit(0, None, &[(format!("x{i}"), "m".into())]), Ok(0));
    }
    assert_eq!(g.known.len(), 3);
}
