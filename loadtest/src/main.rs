//! hourglass-loadtest: measures Hourglass as its users would. See loadtest/README.md.

mod backfill;
mod ctx;
mod dashboard;
mod dataset;
mod designs;
mod exception;
mod fleet;
mod history;
#[cfg(test)]
mod layering;
mod mqtt_shapes;
mod panel_timing;
mod peer_loads;
mod peer_servers;
mod peers;
mod percentile;
mod procs;
mod promql;
mod query;
mod range_probe;
mod ranges;
mod report;
mod send;
mod storage;
mod transfer;
mod verify;
mod versions;
mod waits;

use clap::{Parser, Subcommand};

use crate::ctx::{Ctx, Global};
use crate::dataset::{Dataset, DatasetArgs};
use crate::report::Report;

#[derive(Parser)]
#[command(version, about = "Load tests and benchmarks for Hourglass")]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Simulated sensors sending live at 1/interval Hz for --seconds.
    Fleet {
        #[command(flatten)]
        data: DatasetArgs,
        #[arg(long, value_enum, default_value = "http")]
        transport: fleet::Transport,
        /// Readings per HTTP request.
        #[arg(long, default_value_t = 100)]
        batch: usize,
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Skip the final verify.
        #[arg(long)]
        no_verify: bool,
        /// Answer from MongoDB instead of the journal.
        #[arg(long)]
        no_journal: bool,
        /// Bucket granularity: minute or hour.
        #[arg(long, default_value = "minute")]
        granularity: String,
        /// Days of minute buckets of the same series loaded straight into the
        /// database first: the history the live writes run beside.
        #[arg(long, default_value_t = 0)]
        preload_days: u32,
    },
    /// The same readings over MQTT three ways (one a message, a device's
    /// object through the zigbee2mqtt preset, line protocol), journal on:
    /// CPU per reading against the JSON path's, and memory.
    MqttShapes {
        #[command(flatten)]
        data: DatasetArgs,
        /// Skip the final verify.
        #[arg(long)]
        no_verify: bool,
    },
    /// Several instances round robin on one database: what versions cost in bytes.
    Versions {
        #[command(flatten)]
        data: DatasetArgs,
        #[arg(long, default_value_t = 2)]
        instances: usize,
        #[arg(long, default_value = "minute")]
        granularity: String,
        /// Skip the lone instance's prune (it waits 70 s for it).
        #[arg(long)]
        no_prune: bool,
    },
    /// History uploaded in large batches as fast as the service takes it.
    Backfill {
        #[command(flatten)]
        data: DatasetArgs,
        #[arg(long, default_value_t = 5000)]
        batch: usize,
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
        #[arg(long)]
        no_verify: bool,
        /// Run the service with the journal off (on by default, as shipped).
        #[arg(long)]
        no_journal: bool,
        /// Hours before now at which the data ends.
        #[arg(long, default_value_t = 1)]
        lag_hours: i64,
    },
    /// `hourglass import` of files (NDJSON, CSV) against the HTTP path on the
    /// same data, and `hourglass export` of what was imported.
    Transfer {
        #[command(flatten)]
        data: DatasetArgs,
        /// Hours before now at which the data ends.
        #[arg(long, default_value_t = 1)]
        lag_hours: i64,
        /// Interleaved rounds of every path (the last one stores).
        #[arg(long, default_value_t = transfer::ROUNDS)]
        rounds: usize,
    },
    /// A mix of average and series queries.
    Query {
        #[command(flatten)]
        data: DatasetArgs,
        #[arg(long, default_value_t = 200)]
        queries: usize,
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
    },
    /// Query cost as the range grows (1, 7, 60, 400 days) and group queries.
    Ranges {
        /// Days of minute data of the long series.
        #[arg(long, default_value_t = 400)]
        days: u32,
        /// Times each query runs.
        #[arg(long, default_value_t = 20)]
        repeats: usize,
        /// Sensors of the fleet the group queries cover (`lt-000*`: at most 100).
        #[arg(long, default_value_t = 100)]
        fleet_sensors: u32,
        /// Seconds between readings of the long series.
        #[arg(long, default_value_t = 60)]
        interval: u32,
    },
    /// Write cost as a series' history grows, and fleet panels over days,
    /// cold and on refresh, on the server in front of it.
    History {
        /// Buckets of the long series.
        #[arg(long, default_value_t = 50_000)]
        long_history: i64,
        /// Sensors of the 8-day panels (a reading every 15 minutes).
        #[arg(long, default_value_t = 72)]
        panel_sensors: u32,
        /// Sensors of the group average (two days, a reading every 5 minutes).
        #[arg(long, default_value_t = 150)]
        group_sensors: u32,
        /// Times each query runs, cold and on refresh.
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Run the service with the journal off (on by default, as shipped).
        #[arg(long)]
        no_journal: bool,
        /// Only the panels' backfill and its catch-up, alone and with a
        /// refreshing dashboard (no write cost, settled panels or group).
        #[arg(long)]
        catch_up_only: bool,
    },
    /// The same PromQL against Hourglass, Prometheus and VictoriaMetrics on the same samples.
    Promql {
        #[arg(long, default_value_t = 100)]
        sensors: u32,
        /// Days of data: one reading per --sparse-interval, the last day one per --dense-interval.
        #[arg(long, default_value_t = 30)]
        days: u32,
        /// Times each query runs on each system.
        #[arg(long, default_value_t = 5)]
        repeats: usize,
        /// Seconds between readings before the last day.
        #[arg(long, default_value_t = 900)]
        sparse_interval: u32,
        /// Seconds between readings in the last day.
        #[arg(long, default_value_t = 60)]
        dense_interval: u32,
    },
    /// Compares the database with the dataset the generator knows.
    Verify {
        #[command(flatten)]
        data: DatasetArgs,
        /// Epoch seconds of the dataset's first reading.
        #[arg(long)]
        start: i64,
        #[arg(long, default_value = "minute")]
        granularity: String,
    },
    /// One document per reading vs minute vs hour buckets, same server, same data.
    CompareDesigns {
        #[command(flatten)]
        data: DatasetArgs,
        #[arg(long, default_value_t = 5000)]
        batch: usize,
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
    },
    /// The same data into VictoriaMetrics and InfluxDB 1.x, next to Hourglass.
    Peers {
        #[command(flatten)]
        data: DatasetArgs,
        #[arg(long, default_value_t = 5000)]
        batch: usize,
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
        /// Seconds Hourglass' idle CPU is measured before each of its loads
        #[arg(long, default_value_t = 10)]
        idle_seconds: u64,
    },
    /// Bytes per reading: the same readings at several intervals in minute
    /// and hour buckets, by collection, as BSON and as compressed pages,
    /// beside one document per reading, VictoriaMetrics and InfluxDB.
    Storage {
        #[command(flatten)]
        args: storage::StorageArgs,
    },
    /// The standard full run: every scenario, one report.
    All {
        /// Scale of the datasets (1 = the committed report's sizes).
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
    },
}

fn recent(args: DatasetArgs, lag_hours: i64) -> Dataset {
    Dataset::recent(args, lag_hours * 3600)
}

fn scaled(sensors: u32, metrics: u32, seconds: f64, interval: u32) -> DatasetArgs {
    DatasetArgs {
        sensors,
        metrics,
        seconds: seconds.max(60.0) as u32,
        interval,
        seed: 42,
    }
}

async fn all(ctx: &Ctx, scale: f64) -> anyhow::Result<(Report, bool)> {
    let mut report = Report::new("Hourglass load test: full run");
    let mut ok = true;
    let backfill_data = recent(scaled(50, 2, 3600.0 * scale, 1), 1);
    let (r, good) = backfill::run(ctx, &backfill_data, 5000, 4, true, true).await?;
    report.merge(r);
    ok &= good;
    // 4 000 readings (or messages) a second: enough that per-second fixed costs
    // (a flush, the metrics scrape) do not dominate the per-reading CPU.
    // Journal off (acknowledged once stored) and on (once journaled), side
    // by side on the same fleet.
    for transport in [fleet::Transport::Http, fleet::Transport::Mqtt] {
        for journal in [false, true] {
            let data = Dataset::recent(scaled(2000, 2, 30.0 * scale, 1), 0);
            let (r, good) =
                fleet::run(ctx, data, transport, 500, 8, true, journal, "minute", 0).await?;
            report.merge(r);
            ok &= good;
        }
    }
    // The same 1 200 readings a second (what the stand-in stores with room to spare) as MQTT messages of three shapes.
    let (r, good) = mqtt_shapes::run(ctx, scaled(200, 6, 60.0 * scale, 1), true).await?;
    report.merge(r);
    ok &= good;
    report.merge(query::run(ctx, &recent(scaled(20, 2, 3600.0 * scale, 1), 1), 400, 4).await?);
    let designs_data = recent(scaled(20, 2, 3.0 * 3600.0 * scale, 1), 1);
    let (r, good) = designs::run(ctx, &designs_data, 5000, 4).await?;
    report.merge(r);
    ok &= good;
    report.merge(
        peers::run(
            ctx,
            &recent(scaled(50, 2, 3600.0 * scale, 1), 1),
            5000,
            4,
            peers::IDLE_SAMPLE,
        )
        .await?,
    );
    let (r, good) = transfer::run(
        ctx,
        &recent(scaled(50, 2, 3600.0 * scale, 1), 1),
        transfer::ROUNDS,
    )
    .await?;
    report.merge(r);
    ok &= good;
    Ok((report, ok))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Long: one arm per subcommand, each a call with its arguments.
    hourglass::install_crypto_provider();
    let cli = Cli::parse();
    let run = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros()
            % 0xffff_ffff
    );
    let ctx = Ctx {
        global: cli.global,
        run,
    };
    let (name, (report, ok)) = match cli.command {
        Cmd::Fleet {
            data,
            transport,
            batch,
            concurrency,
            no_verify,
            no_journal,
            granularity,
            preload_days,
        } => (
            "fleet",
            fleet::run(
                &ctx,
                Dataset::recent(data, 0),
                transport,
                batch,
                concurrency,
                !no_verify,
                !no_journal,
                match granularity.as_str() {
                    "hour" => "hour",
                    _ => "minute",
                },
                preload_days,
            )
            .await?,
        ),
        Cmd::MqttShapes { data, no_verify } => (
            "mqtt-shapes",
            mqtt_shapes::run(&ctx, data, !no_verify).await?,
        ),
        Cmd::Versions {
            data,
            instances,
            granularity,
            no_prune,
        } => (
            "versions",
            versions::run(
                &ctx,
                Dataset::recent(data, 0),
                instances,
                match granularity.as_str() {
                    "hour" => "hour",
                    _ => "minute",
                },
                !no_prune,
            )
            .await?,
        ),
        Cmd::Backfill {
            data,
            batch,
            concurrency,
            no_verify,
            no_journal,
            lag_hours,
        } => (
            "backfill",
            backfill::run(
                &ctx,
                &recent(data, lag_hours),
                batch,
                concurrency,
                !no_verify,
                !no_journal,
            )
            .await?,
        ),
        Cmd::Transfer {
            data,
            lag_hours,
            rounds,
        } => (
            "transfer",
            transfer::run(&ctx, &recent(data, lag_hours), rounds).await?,
        ),
        Cmd::Query {
            data,
            queries,
            concurrency,
        } => (
            "query",
            (
                query::run(&ctx, &recent(data, 1), queries, concurrency).await?,
                true,
            ),
        ),
        Cmd::Ranges {
            days,
            repeats,
            fleet_sensors,
            interval,
        } => (
            "ranges",
            ranges::run(&ctx, days, repeats, fleet_sensors, interval).await?,
        ),
        Cmd::History {
            long_history,
            panel_sensors,
            group_sensors,
            repeats,
            no_journal,
            catch_up_only,
        } => (
            "history",
            history::run(
                &ctx,
                history::Args {
                    long_history,
                    panel_sensors,
                    group_sensors,
                    repeats,
                    journal: !no_journal,
                    catch_up_only,
                },
            )
            .await?,
        ),
        Cmd::Promql {
            sensors,
            days,
            repeats,
            sparse_interval,
            dense_interval,
        } => (
            "promql",
            promql::run(
                &ctx,
                sensors,
                days,
                repeats,
                (sparse_interval, dense_interval),
            )
            .await?,
        ),
        Cmd::Verify {
            data,
            start,
            granularity,
        } => {
            let database = ctx.global.database.clone();
            (
                "verify",
                verify::run(&ctx, &Dataset::new(data, start), &granularity, &database).await?,
            )
        }
        Cmd::CompareDesigns {
            data,
            batch,
            concurrency,
        } => (
            "designs",
            designs::run(&ctx, &recent(data, 1), batch, concurrency).await?,
        ),
        Cmd::Peers {
            data,
            batch,
            concurrency,
            idle_seconds,
        } => (
            "peers",
            (
                peers::run(
                    &ctx,
                    &recent(data, 1),
                    batch,
                    concurrency,
                    std::time::Duration::from_secs(idle_seconds),
                )
                .await?,
                true,
            ),
        ),
        Cmd::Storage { args } => ("storage", (storage::run(&ctx, &args).await?, true)),
        Cmd::All { scale } => ("full", all(&ctx, scale).await?),
    };
    report.print(ctx.global.json)?;
    if !ctx.global.no_files {
        let dir = ctx
            .global
            .results_dir
            .join(ctx.global.name.clone().unwrap_or_else(|| name.to_owned()));
        report.write(&dir)?;
        if !ctx.global.json {
            println!("\nReport: {}", dir.join("report.md").display());
        }
    }
    if !ok {
        anyhow::bail!("verification failed: the database does not match what was sent");
    }
    Ok(())
}
