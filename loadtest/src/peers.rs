//! `peers`: the same data as Influx line protocol into VictoriaMetrics and
//! InfluxDB 1.x (both started here on free ports, with throw-away data
//! directories), the same queries, next to Hourglass.

use std::time::Duration;

use crate::ctx::Ctx;
use crate::dataset::Dataset;
use crate::peer_loads::{
    Format, PEER_IDLE_SAMPLE, Peer, hourglass_peer, influx_peer, victoria_peer,
};
use crate::report::{Plot, Report, Section, f};

/// Interleaved rounds of the five loads, each on fresh servers (see `run`).
const ROUNDS: usize = 3;

/// How long the service's idle CPU is measured before each load.
pub(crate) const IDLE_SAMPLE: Duration = Duration::from_secs(10);

pub async fn run(
    ctx: &Ctx,
    data: &Dataset,
    batch: usize,
    concurrency: usize,
    idle_sample: Duration,
) -> anyhow::Result<Report> {
    let n = data.len() as f64;
    let loads = load_rounds(ctx, data, batch, concurrency, idle_sample).await?;
    let peers = loads.rows();
    let mut report = Report::new("Hourglass and its peers");
    report
        .sections
        .push(table(&peers, data, batch, concurrency));
    let ratios = Ratios::of(&loads);
    notes(&mut report, &loads, &peers, &ratios, data, idle_sample);
    report.plots.push(Plot::Bars {
        file: "peers-cpu.svg".into(),
        title: "CPU seconds per million readings".into(),
        y: "CPU s".into(),
        bars: peers
            .iter()
            .map(|p| (p.name.replace(" (service only)", ""), p.cpu_s / n * 1e6))
            .collect(),
    });
    ratios.set(&mut report, &loads, &peers, n);
    Ok(report)
}

/// Every load of every round (see [`load_rounds`]).
struct Loads {
    /// Per round: VictoriaMetrics, InfluxDB, then the Hourglass rows.
    rounds: Vec<Vec<Peer>>,
    /// Per round: VictoriaMetrics before the first Hourglass load and after
    /// each.
    victorias: Vec<Vec<Peer>>,
    /// Every VictoriaMetrics load.
    victoria_runs: Vec<Peer>,
}

/// The peers load in about a second, where scheduling noise moves their
/// CPU figure by a third, and this machine's speed drifts by a fifth
/// within minutes: the loads run in ROUNDS interleaved rounds, each on
/// fresh servers, and VictoriaMetrics loads again after each Hourglass
/// load, so that each Hourglass load has a VictoriaMetrics load just
/// before and just after it; its ratio is over their mean CPU, and each
/// row's ratio the median of its rounds' ratios.
async fn load_rounds(
    ctx: &Ctx,
    data: &Dataset,
    batch: usize,
    concurrency: usize,
    idle_sample: Duration,
) -> anyhow::Result<Loads> {
    let (end, from24, from1) = (data.end(), data.end() - 86_400, data.end() - 3600);
    let mut rounds: Vec<Vec<Peer>> = Vec::with_capacity(ROUNDS);
    let mut victorias: Vec<Vec<Peer>> = Vec::with_capacity(ROUNDS);
    let mut victoria_runs: Vec<Peer> = Vec::new();
    for _ in 0..ROUNDS {
        let first = victoria_peer(ctx, data, batch, concurrency, (from24, end)).await?;
        let mut round = vec![
            first.clone(),
            influx_peer(ctx, data, batch, concurrency, (from1, from24, end)).await?,
        ];
        let mut vm = vec![first.clone()];
        victoria_runs.push(first);
        // Hourglass thrice: the JSON API, then the very bodies the peers
        // got, with the journal off and on.
        for format in [
            Format::Json,
            Format::LineProtocol,
            Format::LineProtocolJournaled,
        ] {
            round.push(
                hourglass_peer(
                    ctx,
                    format,
                    data,
                    batch,
                    concurrency,
                    (from1, from24, end),
                    idle_sample,
                )
                .await?,
            );
            let after = victoria_peer(ctx, data, batch, concurrency, (from24, end)).await?;
            vm.push(after.clone());
            victoria_runs.push(after);
        }
        rounds.push(round);
        victorias.push(vm);
    }
    Ok(Loads {
        rounds,
        victorias,
        victoria_runs,
    })
}

impl Loads {
    /// Per Hourglass row (index 2 on): each round's `cpu(row)` over the
    /// mean `vm_cpu` of that round's VictoriaMetrics loads just before and
    /// after it, sorted.
    fn ratios_against(&self, cpu: fn(&Peer) -> f64, vm_cpu: fn(&Peer) -> f64) -> Vec<Vec<f64>> {
        (2..self.rounds[0].len())
            .map(|i| {
                let mut r: Vec<f64> = self
                    .rounds
                    .iter()
                    .zip(&self.victorias)
                    .map(|(round, vm)| {
                        let around = (vm_cpu(&vm[i - 2]) + vm_cpu(&vm[i - 1])) / 2.0;
                        cpu(&round[i]).max(0.0) / around.max(1e-9)
                    })
                    .collect();
                r.sort_by(f64::total_cmp);
                r
            })
            .collect()
    }

    /// Against VictoriaMetrics' CPU at its last answer.
    fn ratios_of(&self, cpu: fn(&Peer) -> f64) -> Vec<Vec<f64>> {
        self.ratios_against(cpu, |vm| vm.cpu_s)
    }

    /// Each system's run of median CPU; VictoriaMetrics' among all its loads.
    fn rows(&self) -> Vec<Peer> {
        let mut peers: Vec<Peer> = (0..self.rounds[0].len())
            .map(|i| {
                let mut runs: Vec<Peer> = self.rounds.iter().map(|r| r[i].clone()).collect();
                runs.sort_by(|a, b| a.cpu_s.total_cmp(&b.cpu_s));
                runs.swap_remove(ROUNDS / 2)
            })
            .collect();
        let mut victoria_runs = self.victoria_runs.clone();
        victoria_runs.sort_by(|a, b| a.cpu_s.total_cmp(&b.cpu_s));
        peers[0] = victoria_runs.swap_remove(victoria_runs.len() / 2);
        peers
    }
}

/// The Hourglass rows' CPU ratios to VictoriaMetrics, each counted several
/// ways (see the notes).
struct Ratios {
    cpu: Vec<Vec<f64>>,
    above_idle: Vec<Vec<f64>>,
    without_driver: Vec<Vec<f64>>,
    own_work: Vec<Vec<f64>>,
    settled: Vec<Vec<f64>>,
    settled_without_driver: Vec<Vec<f64>>,
    settled_above_idle: Vec<Vec<f64>>,
}

impl Ratios {
    fn of(loads: &Loads) -> Self {
        // Each system counted until it has done what the load asked: the
        // peers until settled (Hourglass' rows already run until stored and
        // rolled up).
        let settled = |cpu: fn(&Peer) -> f64| loads.ratios_against(cpu, |vm| vm.settled_cpu_s);
        Self {
            cpu: loads.ratios_of(|p| p.cpu_s),
            above_idle: loads.ratios_of(|p| p.cpu_s - p.idle_s),
            // Without the CPU spent inside the official driver: the
            // service's own work (see `store/mongo/driver_cpu.rs`).
            without_driver: loads.ratios_of(|p| p.cpu_s - p.driver_s),
            // Both: the service's own work per reading, as a database that
            // does not stretch the load would leave it.
            own_work: loads.ratios_of(|p| p.cpu_s - p.driver_s - (p.idle_s - p.idle_driver_s)),
            settled: settled(|p| p.cpu_s),
            settled_without_driver: settled(|p| p.cpu_s - p.driver_s),
            settled_above_idle: loads.ratios_against(
                |p| p.cpu_s - p.driver_s - (p.idle_s - p.idle_driver_s),
                |vm| vm.settled_cpu_s - vm.settled_idle_s,
            ),
        }
    }
}

/// The table: one row per system.
fn table(peers: &[Peer], data: &Dataset, batch: usize, concurrency: usize) -> Section {
    let n = data.len() as f64;
    let mut sec = Section::new(
        &format!(
            "Peers: {} readings as line protocol in batches of {batch}, {concurrency} at a time",
            data.len()
        ),
        &[
            "system",
            "readings/s",
            "CPU s per million readings (a peer's at its last answer)",
            "the same, until settled",
            "of which the MongoDB driver",
            "peak RSS MiB",
            "bytes per reading (disk)",
            "avg 1h ms",
            "series 24h/1h ms",
        ],
    );
    for p in peers {
        sec.row(vec![
            p.name.into(),
            f(p.readings_per_s),
            f(p.cpu_s / n * 1e6),
            f(p.settled_cpu_s / n * 1e6),
            if p.idle_s > 0.0 || p.driver_s > 0.0 {
                f(p.driver_s / n * 1e6)
            } else {
                "-".into()
            },
            f(p.rss_mib),
            f(p.disk_bytes / n),
            f(p.avg_ms),
            f(p.series_ms),
        ]);
    }
    sec
}

/// What the report says of the figures: how they were taken, and each
/// Hourglass row's ratios.
fn notes(
    report: &mut Report,
    loads: &Loads,
    peers: &[Peer],
    ratios: &Ratios,
    data: &Dataset,
    idle_sample: Duration,
) {
    // Long: one note per way of counting, each a sentence with its figures.
    let n = data.len() as f64;
    let Ratios {
        cpu: ratios,
        above_idle,
        without_driver,
        own_work,
        settled,
        settled_without_driver,
        settled_above_idle,
    } = ratios;
    // The median of VictoriaMetrics' loads counted until settled, and above
    // its idle CPU.
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let vm_settled = median(
        loads
            .victoria_runs
            .iter()
            .map(|p| p.settled_cpu_s)
            .collect(),
    );
    let vm_settled_above_idle = median(
        loads
            .victoria_runs
            .iter()
            .map(|p| p.settled_cpu_s - p.settled_idle_s)
            .collect(),
    );
    report.notes.push("Disk bytes are what each data directory holds right after the load: VictoriaMetrics keeps its newest parts in memory even after a forced flush (a lower bound), InfluxDB 1.x holds its write-ahead log before compaction (an upper bound). Compare them only after a long run.".into());
    report.notes.push(format!("Each system loaded {ROUNDS} times in interleaved rounds, each on a fresh server; a row is its run of median CPU (the peers' loads take a tenth of a CPU second and vary by a third from run to run, and this machine's speed drifts by a fifth within minutes). CPU is each process's CPU-time clock, to the nanosecond: /proc's 10 ms ticks were a tenth of a peer's load. VictoriaMetrics loaded again after each Hourglass load ({} loads in all, its row their median): each Hourglass ratio is over the mean of the VictoriaMetrics loads just before and after it, and a row's ratio is the median of its rounds' ratios.", ROUNDS * 4));
    report.notes.push("The data ends an hour ago, so Hourglass marks its hours late and rolls them up once the writes pause: each Hourglass row's CPU runs until that upkeep is done.".into());
    // Late writes into a UTC day that has ended complete that whole day (every
    // hour of each series, its 30-day slot): a run started in the first hour
    // or so after midnight measures that too.
    let today = jiff::Timestamp::now().as_second().div_euclid(86_400);
    if data.start.div_euclid(86_400) < today {
        report.notes.push("This run's data lies in a UTC day that had ended by the run's end, so Hourglass' loads after midnight also rolled up that whole day (every hour of every series, and its 30-day slot): their CPU is not comparable with runs whose data lies in the current day (those started after about 01:15 UTC).".into());
    }
    report.notes.push("Hourglass' journaled row runs the service's default: each answer waits for the journal's fsync, not MongoDB, and the load's CPU and time run until every reading is stored (a bucket is written once its minute has closed, not once per request). The other Hourglass rows run with the journal off, so each answer means stored.".into());
    report.notes.push("Hourglass' row counts the service process only; its storage is the Python stand-in SecantusDB (bytes are the collection's data and index sizes as the server reports them), so its throughput is the stand-in's. The CPU column is the fair comparison of the ingest paths.".into());
    for (h, r) in peers[2..].iter().zip(ratios) {
        report.notes.push(format!(
            "Service CPU per reading, {}: {} µs against VictoriaMetrics' {} µs; ratio {} (the median of the rounds' ratios {}).",
            h.name,
            f(h.cpu_s / n * 1e6),
            f(peers[0].cpu_s / n * 1e6),
            f(r[ROUNDS / 2]),
            r.iter().map(|&x| f(x)).collect::<Vec<_>>().join(", ")
        ));
    }
    // The same ratios above each Hourglass run's idle CPU.
    for (h, r) in peers[2..].iter().zip(above_idle) {
        report.notes.push(format!(
            "{}, above its idle CPU ({:.2} ms a second, measured for {} s before the load, times the load's {:.1} s on the stand-in): {} µs per reading; ratio {} (rounds {}). What a faster database would leave of the figure above: the idle share shrinks with the load's duration.",
            h.name,
            h.idle_s * 1e3 / h.seconds.max(1e-9),
            idle_sample.as_secs(),
            h.seconds,
            f((h.cpu_s - h.idle_s).max(0.0) / n * 1e6),
            f(r[ROUNDS / 2]),
            r.iter().map(|&x| f(x)).collect::<Vec<_>>().join(", ")
        ));
    }
    // The same ratios without the CPU spent inside the official driver:
    // the service's own work (see `store/mongo/driver_cpu.rs`).
    for (h, r) in peers[2..].iter().zip(without_driver) {
        report.notes.push(format!(
            "{}, without the CPU spent by the MongoDB driver ({} µs per reading: encoding commands, socket I/O, decoding replies on the write path and the rollup upkeep, and its own thread's monitoring and pool upkeep): {} µs per reading; ratio {} (rounds {}).",
            h.name,
            f(h.driver_s / n * 1e6),
            f((h.cpu_s - h.driver_s).max(0.0) / n * 1e6),
            f(r[ROUNDS / 2]),
            r.iter().map(|&x| f(x)).collect::<Vec<_>>().join(", ")
        ));
    }
    // Both: the service's own work per reading, as a database that does not
    // stretch the load would leave it.
    for (h, r) in peers[2..].iter().zip(own_work) {
        report.notes.push(format!(
            "{}, without the driver and above its own idle CPU (the idle CPU less the driver's share of it): {} µs per reading; ratio {} (rounds {}). The idle share is the stand-in's stretch of the load.",
            h.name,
            f((h.cpu_s - h.driver_s - (h.idle_s - h.idle_driver_s)).max(0.0) / n * 1e6),
            f(r[ROUNDS / 2]),
            r.iter().map(|&x| f(x)).collect::<Vec<_>>().join(", ")
        ));
    }
    // Each system counted until it has done what the load asked: the peers
    // until settled (Hourglass' rows already run until stored and rolled
    // up).
    report.notes.push(format!(
        "VictoriaMetrics answers a write before it has done most of the work: a second or so later it turns the acknowledged rows into parts (sorted, compressed, indexed). The ratios above stop its clock at its last answer. Counted until it settles (its CPU back at its idle rate, measured for {} s before the load, for a whole second), VictoriaMetrics spent {} µs per reading ({} above its idle CPU) against {} µs at its last answer, the medians of its {} loads; InfluxDB 1.x spent {} µs against {}. Hourglass' rows already run until every reading is stored and rolled up, so the ratios below count each system until it has done what the load asked. Each is over the VictoriaMetrics loads just before and after it, counted the same way.",
        PEER_IDLE_SAMPLE.as_secs(),
        f(vm_settled / n * 1e6),
        f(vm_settled_above_idle / n * 1e6),
        f(peers[0].cpu_s / n * 1e6),
        ROUNDS * 4,
        f(peers[1].settled_cpu_s / n * 1e6),
        f(peers[1].cpu_s / n * 1e6),
    ));
    for (((h, a), b), c) in peers[2..]
        .iter()
        .zip(settled)
        .zip(settled_without_driver)
        .zip(settled_above_idle)
    {
        let rounds = |r: &Vec<f64>| r.iter().map(|&x| f(x)).collect::<Vec<_>>().join(", ");
        report.notes.push(format!(
            "{}, against VictoriaMetrics until settled: ratio {} (rounds {}); without the driver {} (rounds {}); without the driver and above idle CPU, against VictoriaMetrics above its idle CPU, {} (rounds {}).",
            h.name,
            f(a[ROUNDS / 2]),
            rounds(a),
            f(b[ROUNDS / 2]),
            rounds(b),
            f(c[ROUNDS / 2]),
            rounds(c),
        ));
    }
}

impl Ratios {
    /// The ratios and every VictoriaMetrics load into the report's JSON.
    fn set(&self, report: &mut Report, loads: &Loads, peers: &[Peer], n: f64) {
        // Long: one key per figure the report's readers compare across runs.
        let Ratios {
            cpu: ratios,
            above_idle,
            without_driver,
            own_work,
            settled,
            settled_without_driver,
            settled_above_idle,
        } = self;
        let victorias = &loads.victorias;
        report.set("peers", peers.iter().map(|p| serde_json::json!({
            "system": p.name, "readings_per_s": p.readings_per_s, "cpu_s_per_million": p.cpu_s / n * 1e6,
            "settled_cpu_s_per_million": p.settled_cpu_s / n * 1e6, "settled_idle_cpu_s_per_million": p.settled_idle_s / n * 1e6,
            "driver_cpu_s_per_million": p.driver_s / n * 1e6, "peak_rss_mib": p.rss_mib, "bytes_per_reading": p.disk_bytes / n, "avg_1h_ms": p.avg_ms, "series_24h_ms": p.series_ms,
            "avg_1h_answer": p.avg_answer,
        })).collect::<Vec<_>>());
        // Each VictoriaMetrics load in the order run, per round: the spread
        // behind every ratio above.
        report.set(
            "victoria_metrics_cpu_s_per_million_by_round",
            victorias
                .iter()
                .map(|vm| vm.iter().map(|p| p.cpu_s / n * 1e6).collect::<Vec<_>>())
                .collect::<Vec<_>>(),
        );
        report.set(
            "victoria_metrics_settled_cpu_s_per_million_by_round",
            victorias
                .iter()
                .map(|vm| {
                    vm.iter()
                        .map(|p| p.settled_cpu_s / n * 1e6)
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>(),
        );
        report.set(
            "cpu_ratios_to_victoria_metrics_settled",
            serde_json::json!({
                "with_driver": settled,
                "without_driver": settled_without_driver,
                "without_driver_above_idle": settled_above_idle,
                "rows": ["json", "line_protocol", "line_protocol_journaled"],
            }),
        );
        report.set(
            "cpu_ratios_to_victoria_metrics",
            serde_json::json!({
                "json": ratios[0],
                "line_protocol": ratios[1],
                "line_protocol_journaled": ratios[2],
            }),
        );
        report.set(
            "cpu_ratios_without_driver_to_victoria_metrics",
            serde_json::json!({
                "json": without_driver[0],
                "line_protocol": without_driver[1],
                "line_protocol_journaled": without_driver[2],
            }),
        );
        report.set(
            "cpu_ratios_without_driver_above_idle_to_victoria_metrics",
            serde_json::json!({
                "json": own_work[0],
                "line_protocol": own_work[1],
                "line_protocol_journaled": own_work[2],
            }),
        );
        report.set(
            "cpu_ratios_above_idle_to_victoria_metrics",
            serde_json::json!({
                "json": above_idle[0],
                "line_protocol": above_idle[1],
                "line_protocol_journaled": above_idle[2],
            }),
        );
    }
}
