//! `mqtt-shapes`: the same readings over MQTT three ways, journal on (as
//! shipped): one reading a message on `sensors/{sensor}/{metric}` (the JSON
//! path), a Zigbee2MQTT-like object per sensor through the `zigbee2mqtt`
//! preset, and line protocol on `telegraf/<sensor>`. Reports each one's CPU
//! per reading beside the JSON path's, and its memory.

use crate::ctx::Ctx;
use crate::dataset::{Dataset, DatasetArgs};
use crate::fleet::{self, Transport};
use crate::report::{Report, Section, f};

/// The routes' target: CPU per reading at most this multiple of the JSON
/// path's.
const TARGET_RATIO: f64 = 1.2;

pub async fn run(ctx: &Ctx, args: DatasetArgs, verify: bool) -> anyhow::Result<(Report, bool)> {
    // Long: the three runs in turn, then one row of figures each.
    let mut report = Report::new("Hourglass MQTT shapes");
    let mut ok = true;
    let mut figures = Vec::new();
    for transport in [
        Transport::Mqtt,
        Transport::MqttRoute,
        Transport::MqttLineProtocol,
    ] {
        let data = Dataset::recent(args.clone(), 0);
        let (r, good) = fleet::run(ctx, data, transport, 1, 8, verify, true, "minute", 0).await?;
        let key = format!("fleet_{}_journal", format!("{transport:?}").to_lowercase());
        // Each shape on a server as the first found it: the stand-in keeps
        // everything in memory.
        if ctx.global.url.is_none() {
            mongodb::Client::with_uri_str(ctx.mongodb_uri()?)
                .await?
                .database(&ctx.database(&key))
                .drop()
                .await?;
        }
        figures.push((transport, r.data.get(&key).cloned().unwrap_or_default()));
        report.merge(r);
        ok &= good;
    }
    // The intake's CPU (decode, journal, batcher) while the readings are
    // offered: what a message's shape changes. Storing comes after, costs
    // the same for every shape, and its wait (the stand-in's pace) would
    // add idle time to the whole-run figure.
    let per_reading = |v: &serde_json::Value| v["service_cpu_us_per_reading_offering"].as_f64();
    let whole_run = |v: &serde_json::Value| v["service_cpu_us_per_reading"].as_f64();
    let json_path = figures.first().and_then(|(_, v)| per_reading(v));
    let mut section = Section::new(
        &format!(
            "MQTT shapes: {} sensors × {} metrics a second, journal on",
            args.sensors, args.metrics
        ),
        &[
            "shape",
            "readings a message",
            "readings/s stored",
            "CPU µs/reading while offered",
            "× the JSON path",
            "CPU µs/reading until stored",
            "peak RSS MiB",
            "pending readings (thirds of the run)",
        ],
    );
    let mut ratios = serde_json::Map::new();
    for (transport, v) in &figures {
        let ratio = per_reading(v).zip(json_path).map(|(a, b)| a / b);
        let shape = match transport {
            Transport::Mqtt => "sensors/{sensor}/{metric}, JSON",
            Transport::MqttRoute => "zigbee2mqtt preset, one object",
            _ => "line protocol, a line per metric",
        };
        let per_message = if matches!(transport, Transport::Mqtt) {
            1
        } else {
            args.metrics
        };
        section.row(vec![
            shape.to_owned(),
            per_message.to_string(),
            v["stored_per_s"].as_f64().map_or("–".into(), f),
            per_reading(v).map_or("–".into(), f),
            ratio.map_or("–".into(), f),
            whole_run(v).map_or("–".into(), f),
            v["peak_rss_mib"].as_f64().map_or("–".into(), f),
            pending_thirds(*transport, &report),
        ]);
        ratios.insert(
            format!("{transport:?}").to_lowercase(),
            serde_json::json!(ratio),
        );
        if matches!(transport, Transport::MqttRoute) {
            ok &= ratio.is_some_and(|r| r <= TARGET_RATIO);
        }
    }
    report.sections.push(section);
    report.notes.push(format!(
        "MQTT shapes: target CPU per reading through the route at most {TARGET_RATIO}× the JSON path's; memory flat (pending readings by thirds of the run)."
    ));
    report.set("mqtt_shapes_cpu_ratio", ratios);
    Ok((report, ok))
}

/// The run's pending readings, by thirds: flat when storage keeps up.
fn pending_thirds(transport: Transport, report: &Report) -> String {
    let key = format!(
        "fleet_{}_journal_pending",
        format!("{transport:?}").to_lowercase()
    );
    report
        .data
        .get(&key)
        .and_then(|v| v["thirds"].as_array())
        .map(|t| {
            t.iter()
                .map(|x| x.as_f64().map_or("–".into(), f))
                .collect::<Vec<_>>()
                .join(" / ")
        })
        .unwrap_or_else(|| "–".into())
}
