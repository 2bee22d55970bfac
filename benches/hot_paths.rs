//! The service's hot paths, without I/O: what a reading costs in CPU before
//! it reaches the database. `make bench` runs these and prints a summary.

use std::hint::black_box;

use bumpalo::Bump;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use hourglass::Granularity;
use hourglass::pure::{
    Batcher, BatcherLimits, BucketUpdate, CsvFormat, DecodeContext, Hold, ImportConverter,
    ImportFormat, Precision, TimeWindow, Versioning, decode_csv, decode_line_protocol,
    decode_ndjson, decode_readings, journal_decode, journal_encode, update_statement,
};
use tokio::time::{Duration, Instant};

/// The service's allocator (see main.rs), so these figures are its.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The service's allocator options too.
#[cfg(not(target_env = "msvc"))]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static MALLOC_CONF: &[u8; 44] = hourglass::MALLOC_CONF;

const READINGS: usize = 10_000;
const NOW: i64 = 1_700_000_000;

/// 10 000 readings: 100 sensors × 2 metrics × 50 consecutive seconds.
fn body() -> Vec<u8> {
    json_body(100, 0, 50)
}

/// `sensors` × 2 metrics at each of `seconds` seconds from `from` (seconds
/// after an hour before `NOW`), tick by tick, as a JSON array.
fn json_body(sensors: i64, from: i64, seconds: i64) -> Vec<u8> {
    let mut items = Vec::new();
    for second in from..from + seconds {
        for sensor in 0..sensors {
            for metric in 0..2 {
                let ts = (NOW - 3600 + second) * 1000;
                items.push(format!(
                    r#"{{"sensor":"truck-{sensor:04}","metric":"m{metric}","ts":{ts},"value":{}.5}}"#,
                    (sensor * 7 + second) % 113
                ));
            }
        }
    }
    format!("[{}]", items.join(",")).into_bytes()
}

/// The same 10 000 readings as line protocol: one line per sensor and
/// second with both metrics as fields (Telegraf's shape), nanoseconds.
fn line_protocol_body() -> Vec<u8> {
    let mut out = String::new();
    for second in 0..50 {
        for sensor in 0..100 {
            let ts = (NOW - 3600 + second) * 1_000_000_000;
            let v = (sensor * 7 + second) % 113;
            out.push_str(&format!(
                "truck,sensor=truck-{sensor:04},site=s{} m0={v}.5,m1={v}.5 {ts}\n",
                sensor % 4
            ));
        }
    }
    out.into_bytes()
}

/// 10 000 readings one to a line, a measurement per metric and its field
/// `value`, in seconds: the shape `loadtest peers` sends, with as many
/// lines per series (8) as its bodies hold, so an eighth of the lines are
/// a series' first in the body.
fn line_protocol_value_body() -> Vec<u8> {
    let mut out = String::new();
    for second in 0..8 {
        for sensor in 0..625 {
            for metric in 0..2 {
                let ts = NOW - 3600 + second;
                let v = (sensor * 7 + second + metric) % 113;
                out.push_str(&format!(
                    "m{metric},sensor=truck-{sensor:04} value={v}.125 {ts}\n"
                ));
            }
        }
    }
    out.into_bytes()
}

fn ctx() -> DecodeContext {
    DecodeContext {
        now: NOW,
        window: TimeWindow {
            max_age: Duration::from_secs(86_400),
            max_future: Duration::from_secs(300),
        },
        max_readings: READINGS,
    }
}

const LIMITS: BatcherLimits = BatcherLimits {
    flush_interval: Duration::from_secs(1),
    max_pending_readings: 1_000_000,
    max_buffered_readings: 1_000_000,
    max_buckets: 1_000_000,
    max_flush_buckets: 1_000_000,
    hold: Hold {
        grace: Duration::from_secs(10),
        max_hold: Duration::from_secs(300),
    },
};

fn updates(body: &[u8], g: Granularity) -> Vec<BucketUpdate> {
    let readings = decode_readings(body, &ctx()).expect("valid");
    let mut b: Batcher<()> = Batcher::new(g, LIMITS);
    b.offer(readings, None, Instant::now(), 0).expect("room");
    b.take_all()
        .expect("a batch")
        .items
        .into_iter()
        .map(|i| i.update)
        .collect()
}

fn benches(c: &mut Criterion) {
    let body = body();
    let mut group = c.benchmark_group("hot_paths");
    group.throughput(Throughput::Elements(READINGS as u64));

    group.bench_function("decode_10k_readings", |b| {
        b.iter(|| decode_readings(black_box(&body), &ctx()).expect("valid"))
    });

    // Line protocol: parse, map onto sensors, metrics and labels, validate.
    let lines = line_protocol_body();
    let tags = ["sensor".to_owned()];
    group.bench_function("decode_10k_line_protocol", |b| {
        b.iter(|| {
            let arena = Bump::new();
            let d = decode_line_protocol(
                black_box(&lines),
                Precision::Nanoseconds,
                &ctx(),
                &tags,
                &arena,
            )
            .expect("in bounds");
            assert_eq!(d.len(), READINGS);
            d.len()
        })
    });

    let value_lines = line_protocol_value_body();
    group.bench_function("decode_10k_line_protocol_value", |b| {
        b.iter(|| {
            let arena = Bump::new();
            let d = decode_line_protocol(
                black_box(&value_lines),
                Precision::Seconds,
                &ctx(),
                &tags,
                &arena,
            )
            .expect("in bounds");
            assert_eq!(d.len(), READINGS);
            d.len()
        })
    });

    // The request path of `loadtest peers`' line protocol into buckets a
    // previous body opened, with the readings grouped by series (as the
    // service hands them over) and in line order (time order, interleaved).
    for grouped in [true, false] {
        let name = if grouped { "grouped" } else { "interleaved" };
        let earlier = line_protocol_value_body();
        group.bench_function(
            format!("line_protocol_value_into_open_buckets_10k_{name}"),
            |b| {
                b.iter_batched(
                    || {
                        let mut batcher: Batcher<()> = Batcher::new(Granularity::Minute, LIMITS);
                        let arena = Bump::new();
                        let d = decode_line_protocol(
                            &earlier,
                            Precision::Seconds,
                            &ctx(),
                            &tags,
                            &arena,
                        )
                        .expect("in bounds");
                        batcher
                            .offer(d.readings(), None, Instant::now(), 0)
                            .expect("room");
                        batcher
                    },
                    |mut batcher| {
                        let arena = Bump::new();
                        let mut d = decode_line_protocol(
                            black_box(&value_lines),
                            Precision::Seconds,
                            &ctx(),
                            &tags,
                            &arena,
                        )
                        .expect("in bounds");
                        let readings = if grouped {
                            d.take_grouped()
                        } else {
                            d.readings()
                        };
                        batcher
                            .offer(readings, None, Instant::now(), 1)
                            .expect("room");
                        batcher
                    },
                    BatchSize::LargeInput,
                )
            },
        );
    }

    // What a journaled write adds to the request path: framing with its
    // CRC-32C, then reading the frame back for the batcher.
    group.bench_function("journal_encode_10k", |b| {
        let readings = decode_readings(&body, &ctx()).expect("valid");
        b.iter(|| journal_encode(black_box(&readings)))
    });
    group.bench_function("journal_decode_10k", |b| {
        let readings = decode_readings(&body, &ctx()).expect("valid");
        let frame = journal_encode(&readings);
        b.iter(|| journal_decode(black_box(&frame)).expect("valid"))
    });

    group.bench_function("batcher_hold_and_take_10k", |b| {
        b.iter_batched(
            || decode_readings(&body, &ctx()).expect("valid"),
            |readings| {
                let mut batcher: Batcher<()> = Batcher::new(Granularity::Minute, LIMITS);
                batcher
                    .offer_held(readings, 1, Instant::now(), 0, 0)
                    .expect("room");
                batcher.take_all().expect("a batch")
            },
            BatchSize::SmallInput,
        )
    });

    // 12 000 buckets held (1 200 series, 10 minutes), as while the
    // database is slow; then 10 000 readings of the fleet's next 8 seconds.
    let held: Vec<Vec<u8>> = (0..10).map(|m| json_body(600, m * 60, 1)).collect();
    let next = json_body(600, 9 * 60 + 1, 8);
    group.bench_function("batcher_hold_10k_among_12k_buckets", |b| {
        b.iter_batched(
            || {
                let mut batcher: Batcher<()> = Batcher::new(Granularity::Minute, LIMITS);
                for body in &held {
                    let readings = decode_readings(body, &ctx()).expect("valid");
                    batcher
                        .offer_held(readings, 1, Instant::now(), 0, 0)
                        .expect("room");
                }
                (batcher, decode_readings(&next, &ctx()).expect("valid"))
            },
            |(mut batcher, readings)| {
                batcher
                    .offer_held(readings, 2, Instant::now(), 0, 0)
                    .expect("room");
                batcher
            },
            BatchSize::LargeInput,
        )
    });

    group.bench_function("batcher_absorb_and_take_10k", |b| {
        b.iter_batched(
            || decode_readings(&body, &ctx()).expect("valid"),
            |readings| {
                let mut batcher: Batcher<()> = Batcher::new(Granularity::Minute, LIMITS);
                batcher
                    .offer(readings, None, Instant::now(), 0)
                    .expect("room");
                batcher.take_all().expect("a batch")
            },
            BatchSize::SmallInput,
        )
    });

    for g in [Granularity::Minute, Granularity::Hour] {
        let ups = updates(&body, g);
        group.bench_function(format!("update_documents_10k_{g:?}").to_lowercase(), |b| {
            b.iter(|| {
                ups.iter()
                    .map(|u| update_statement(u, g, Versioning::PLAIN).expect("encoded"))
                    .collect::<Vec<_>>()
            })
        });
    }

    group.bench_function("whole_path_10k_minute", |b| {
        b.iter(|| {
            let readings = decode_readings(black_box(&body), &ctx()).expect("valid");
            let mut batcher: Batcher<()> = Batcher::new(Granularity::Minute, LIMITS);
            batcher
                .offer(readings, None, Instant::now(), 0)
                .expect("room");
            let batch = batcher.take_all().expect("a batch");
            batch
                .items
                .iter()
                .map(|i| {
                    update_statement(&i.update, Granularity::Minute, Versioning::PLAIN)
                        .expect("encoded")
                })
                .collect::<Vec<_>>()
        })
    });
    group.finish();
}

/// The planner for long ranges: what a query decides before it reads.
fn plans(c: &mut Criterion) {
    use hourglass::pure::{Calendar, Grid, Need, Plan};
    let mut group = c.benchmark_group("query_plans");
    let (from, to) = (1_700_000_000 + 3723, 1_700_000_000 + 400 * 86_400 - 61);
    group.bench_function("plan_average_400d_minute", |b| {
        b.iter(|| {
            let plan = Plan::new(
                Granularity::Minute,
                Need::Aggregates,
                from,
                to,
                Grid::whole(from, to),
            );
            let mut s = plan.start(&[]);
            black_box(plan.ask(&mut s))
        })
    });
    let berlin = jiff::tz::TimeZone::get("Europe/Berlin").expect("bundled");
    group.bench_function("plan_series_400d_1d_berlin", |b| {
        b.iter(|| {
            let grid = Grid::calendar(from, to, Calendar::Day, &berlin, 10_000).expect("grid");
            let plan = Plan::new(Granularity::Minute, Need::Aggregates, from, to, grid);
            let mut s = plan.start(&[]);
            black_box(plan.ask(&mut s))
        })
    });
    group.finish();
}

/// Sparkplug B: 100 NDATA payloads of 100 metrics each, by alias (a
/// gateway's shape), decoded from protobuf and resolved by the host.
fn sparkplug(c: &mut Criterion) {
    use hourglass::pure::{
        SparkplugHost, SparkplugKind, SparkplugRules, SparkplugTopic, sparkplug_decode,
    };
    use prost::Message;
    use srad_types::payload::metric::Value;
    use srad_types::payload::{DataType, Metric, Payload};

    let now_ms = (NOW as u64) * 1000;
    let metric = |k: u64, name: bool, v: f64| Metric {
        name: name.then(|| format!("Line {}/Sensor {k}", k % 4)),
        alias: Some(k),
        timestamp: Some(now_ms - 3_600_000),
        datatype: Some(if k.is_multiple_of(2) {
            DataType::Double
        } else {
            DataType::Int32
        } as u32),
        value: Some(if k.is_multiple_of(2) {
            Value::DoubleValue(v)
        } else {
            Value::IntValue((v as i32) as u32)
        }),
        ..Metric::new()
    };
    let payload = |seq: u64, name: bool| {
        Payload {
            timestamp: Some(now_ms - 3_600_000),
            metrics: (0..100)
                .map(|k| metric(k, name, (seq * 7 + k) as f64 - 50.0))
                .collect(),
            seq: Some(seq),
            uuid: None,
            body: None,
        }
        .encode_to_vec()
    };
    let birth = sparkplug_decode(&payload(0, true)).expect("a birth");
    let data: Vec<Vec<u8>> = (1..=100).map(|s| payload(s % 256, false)).collect();
    let topic = |kind| SparkplugTopic {
        group: "plant",
        kind,
        node: "gw-1",
        device: None,
    };
    let rules = SparkplugRules {
        device_sensor: "{edge_node}.{device}".into(),
        node_sensor: "{edge_node}".into(),
        reorder_timeout_ms: 2000,
        rebirth_cooldown_ms: 30_000,
        window: ctx().window,
        property_labels: false,
        max_edge_nodes: 10_000,
        max_devices_per_node: 1_000,
        max_state_bytes: 256 << 20,
    };
    let mut group = c.benchmark_group("hot_paths");
    group.throughput(Throughput::Elements(READINGS as u64));
    group.bench_function("sparkplug_10k_metrics", |b| {
        b.iter_batched(
            || {
                let mut host = SparkplugHost::new(rules.clone());
                host.handle(&topic(SparkplugKind::NBirth), &birth, now_ms);
                host
            },
            |mut host| {
                let mut n = 0;
                for p in &data {
                    let decoded = sparkplug_decode(black_box(p)).expect("decodes");
                    n += host
                        .handle(&topic(SparkplugKind::NData), &decoded, now_ms)
                        .readings
                        .len();
                }
                assert_eq!(n, READINGS);
                n
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// `hourglass import`'s client side: each line of a file checked and
/// turned into the line protocol it sends.
fn import(c: &mut Criterion) {
    let mut csv_text = String::from("sensor,metric,ts,value\n");
    let mut ndjson = String::new();
    for second in 0..50 {
        for sensor in 0..100 {
            for metric in 0..2 {
                let ts = (NOW - 3600 + second) * 1000;
                let v = (sensor * 7 + second) % 113;
                csv_text.push_str(&format!("truck-{sensor:04},m{metric},{ts},{v}.5\n"));
                ndjson.push_str(&format!(
                    r#"{{"sensor":"truck-{sensor:04}","metric":"m{metric}","ts":{ts},"value":{v}.5}}"#
                ));
                ndjson.push('\n');
            }
        }
    }
    let converter = ImportConverter::new;
    let mut group = c.benchmark_group("hot_paths");
    group.throughput(Throughput::Elements(READINGS as u64));
    // What the service does with a CSV file's rows (`text/csv`): the import
    // sends them as they are.
    group.bench_function("decode_10k_csv", |b| {
        let format = CsvFormat::default();
        b.iter(|| {
            let readings =
                decode_csv(black_box(csv_text.as_bytes()), &format, &ctx()).expect("valid");
            assert_eq!(readings.len(), READINGS);
            readings.len()
        })
    });
    let lines = line_protocol_body();
    let lines = std::str::from_utf8(&lines).expect("text");
    let lp_converter = converter(ImportFormat::LineProtocol);
    group.bench_function("import_line_protocol_10k", |b| {
        b.iter(|| {
            let mut out = Vec::with_capacity(1 << 20);
            let mut n = 0;
            for line in black_box(lines).lines() {
                n += lp_converter.line(line, None, &mut out).expect("valid");
                out.push(b'\n');
            }
            assert_eq!(n, READINGS);
            out
        })
    });
    let ndjson_converter = converter(ImportFormat::Ndjson);
    group.bench_function("import_ndjson_10k", |b| {
        b.iter(|| {
            let mut out = Vec::with_capacity(1 << 20);
            let mut n = 0;
            for line in black_box(&ndjson).lines() {
                n += ndjson_converter.line(line, None, &mut out).expect("valid");
                out.push(b'\n');
            }
            assert_eq!(n, READINGS);
            out
        })
    });
    // What the service does with those lines (`application/x-ndjson`).
    group.bench_function("decode_10k_ndjson", |b| {
        b.iter(|| {
            let readings = decode_ndjson(black_box(ndjson.as_bytes()), &ctx()).expect("valid");
            assert_eq!(readings.len(), READINGS);
            readings.len()
        })
    });
    group.finish();
}

/// The upkeep's read-back: bucket documents as the server returns them
/// (the upkeep's projection) into every minute's and the hour's slots.
fn rollups(c: &mut Criterion) {
    use hourglass::pure::{ReadBack, roll_hours_of};
    use mongodb::bson::{DateTime, Document, RawDocumentBuf, doc};
    let hour = (NOW / 3600 - 1) * 3600;
    let series: Vec<(String, String)> = (0..10)
        .map(|i| (format!("truck-{i:04}"), "temp".to_owned()))
        .collect();
    let mut docs = Vec::new();
    for minute in 0..60 {
        for (k, (sensor, metric)) in series.iter().enumerate() {
            let start = hour + minute * 60;
            let mut v = Document::new();
            let mut sum = 0.0;
            for second in 0..60 {
                let x = ((k as i64 * 7 + minute + second) % 113) as f64 + 0.5;
                v.insert(second.to_string(), x);
                sum += x;
            }
            let d = doc! {
                "sensor": sensor, "metric": metric,
                "start": DateTime::from_millis(start * 1000),
                "v": v, "n": 3_i64, "count": 60_i64, "sum": sum, "min": 0.5, "max": 112.5,
                "schema_version": 2,
            };
            docs.push(RawDocumentBuf::from_document(&d).expect("encodes"));
        }
    }
    let mut group = c.benchmark_group("rollups");
    group.throughput(Throughput::Elements(docs.len() as u64));
    group.bench_function("roll_up_read_back_600_minute_buckets", |b| {
        b.iter(|| {
            let mut read = ReadBack::new(
                Granularity::Minute,
                series.iter().map(|(s, m)| (s.as_str(), m.as_str())),
            );
            for d in &docs {
                read.add(black_box(d), |_, _| true).expect("readable");
            }
            series
                .iter()
                .map(|(s, m)| {
                    let buckets = read.take(s, m);
                    roll_hours_of(Granularity::Minute, 0.01, hour, hour + 3600, &buckets)
                })
                .collect::<Vec<_>>()
        })
    });
    group.finish();
}

criterion_group!(hot, benches, plans, sparkplug, import, rollups);
criterion_main!(hot);
