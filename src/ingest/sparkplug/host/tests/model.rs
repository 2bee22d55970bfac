//! The host against a model: random births, data, deaths, stale deaths,
//! lost and reordered messages, over time.

use super::*;

#[derive(Debug, Clone)]
enum Op {
    Birth(usize),
    Data {
        node: usize,
        value: i16,
        alias: bool,
        skip: bool,
    },
    UnknownAlias(usize),
    Death {
        node: usize,
        stale: bool,
    },
    Advance(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..3usize).prop_map(Op::Birth),
        (
            0..3usize,
            any::<i16>(),
            any::<bool>(),
            prop::bool::weighted(0.1)
        )
            .prop_map(|(node, value, alias, skip)| Op::Data {
                node,
                value,
                alias,
                skip
            }),
        (0..3usize).prop_map(Op::UnknownAlias),
        (0..3usize, any::<bool>()).prop_map(|(node, stale)| Op::Death { node, stale }),
        (0..5_000u32).prop_map(Op::Advance),
    ]
}

#[derive(Default, Clone)]
struct ModelNode {
    online: bool,
    bd: u64,
    seq: u64,
}

proptest! {
    #[test]
    fn the_host_stores_exactly_what_a_model_says_and_never_floods_rebirths(ops in proptest::collection::vec(op(), 1..120)) {
        let mut h = Host::new(rules());
        let mut model: Vec<ModelNode> = vec![ModelNode::default(); 3];
        let mut now = NOW;
        let names = ["n0", "n1", "n2"];
        let mut rebirths: HashMap<usize, Vec<u64>> = HashMap::new();
        let mut record = |fx: &Effects, now: u64| {
            for (_, n) in &fx.rebirth {
                let i = names.iter().position(|x| x == n).expect("a node");
                rebirths.entry(i).or_default().push(now);
            }
        };
        for op in ops {
            match op {
                Op::Birth(i) => {
                    let m = &mut model[i];
                    m.bd += 1;
                    m.seq = 0;
                    let fx = h.handle(&topic(Kind::NBirth, names[i], None), &birth(0, m.bd, now), now);
                    prop_assert_eq!(fx.readings.len(), 2);
                    prop_assert!(fx.dead_letter.is_none());
                    m.online = true;
                    record(&fx, now);
                }
                Op::Data { node: i, value, alias, skip } => {
                    let m = &mut model[i];
                    m.seq += if skip { 2 } else { 1 };
                    let mut p = data(m.seq % 256, now, f64::from(value));
                    if !alias {
                        p.metrics[0].name = Some("Inputs/temp".into());
                        p.metrics[0].alias = None;
                    }
                    let fx = h.handle(&topic(Kind::NData, names[i], None), &p, now);
                    if m.online {
                        prop_assert!(fx.dead_letter.is_none());
                        prop_assert_eq!(fx.readings.len(), 1);
                        prop_assert_eq!(fx.readings[0].value, f64::from(value));
                        prop_assert_eq!(&*fx.readings[0].sensor, names[i]);
                    } else {
                        prop_assert!(fx.dead_letter.is_some());
                        prop_assert!(fx.readings.is_empty());
                    }
                    record(&fx, now);
                }
                Op::UnknownAlias(i) => {
                    let m = &mut model[i];
                    m.seq += 1;
                    let mut p = data(m.seq % 256, now, 1.0);
                    p.metrics[0].alias = Some(99);
                    let fx = h.handle(&topic(Kind::NData, names[i], None), &p, now);
                    prop_assert!(fx.dead_letter.is_some());
                    prop_assert!(fx.readings.is_empty());
                    record(&fx, now);
                }
                Op::Death { node: i, stale } => {
                    let m = &mut model[i];
                    let bd = if stale { m.bd.wrapping_sub(1) } else { m.bd };
                    let fx = h.handle(&topic(Kind::NDeath, names[i], None), &death(bd), now);
                    if !stale || m.bd == 0 {
                        m.online = false;
                    } else {
                        prop_assert!(fx.stale_death || !m.online);
                    }
                    record(&fx, now);
                }
                Op::Advance(ms) => {
                    now += u64::from(ms);
                    let fx = h.tick(now);
                    record(&fx, now);
                }
            }
        }
        // Never two rebirth requests to one node within the cooldown.
        for times in rebirths.values() {
            let sorted: BTreeSet<u64> = times.iter().copied().collect();
            prop_assert_eq!(sorted.len(), times.len());
            let v: Vec<u64> = sorted.into_iter().collect();
            for w in v.windows(2) {
                prop_assert!(w[1] - w[0] >= rules().rebirth_cooldown_ms);
            }
        }
    }
}
