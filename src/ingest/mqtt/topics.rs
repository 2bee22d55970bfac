//! Topics: which sensor (and metric) a message is about, and what we subscribe to.

use super::shared::Unusable;
use crate::domain::{MetricName, SensorId};
use crate::ingest::decode::Implied;
use crate::telemetry::metrics::Rejection;

/// Splits `{prefix}/{sensor}` or `{prefix}/{sensor}/{metric}`.
pub fn parse_topic<'a>(prefix: &str, topic: &'a str) -> Result<Implied<'a>, Unusable> {
    let rest = topic
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('/'))
        .ok_or_else(|| Unusable::new(Rejection::Topic, format!("topic is not under {prefix}/")))?;
    let mut parts = rest.split('/');
    let sensor = parts.next().unwrap_or_default();
    let metric = parts.next();
    if parts.next().is_some() {
        return Err(Unusable::new(
            Rejection::Topic,
            "topic must be {prefix}/{sensor} or {prefix}/{sensor}/{metric}",
        ));
    }
    SensorId::parse(sensor).map_err(|e| Unusable::new(Rejection::Topic, format!("topic: {e}")))?;
    if let Some(m) = metric {
        MetricName::parse(m).map_err(|e| Unusable::new(Rejection::Topic, format!("topic: {e}")))?;
    }
    Ok(Implied {
        sensor: Some(sensor),
        metric,
    })
}

/// The subscription filter: `{prefix}/#`, through `$share/{group}/` when set.
pub fn subscription(prefix: &str, shared_group: Option<&str>) -> String {
    shared_filter(&format!("{prefix}/#"), shared_group)
}

/// `filter`, through `$share/{group}/` when set.
pub fn shared_filter(filter: &str, shared_group: Option<&str>) -> String {
    match shared_group {
        Some(group) => format!("$share/{group}/{filter}"),
        None => filter.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_name_the_sensor_and_maybe_the_metric() {
        let t = parse_topic("sensors", "sensors/s1/temp").expect("valid");
        assert_eq!((t.sensor, t.metric), (Some("s1"), Some("temp")));
        let t = parse_topic("a/b", "a/b/s1").expect("valid");
        assert_eq!((t.sensor, t.metric), (Some("s1"), None));
        for bad in [
            "sensors",
            "sensors/",
            "other/s1",
            "sensors/s1/temp/x",
            "sensors/s$/t",
            "sensors/s1/a.b",
            "sensorss1",
        ] {
            assert!(parse_topic("sensors", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn shared_groups_subscribe_through_share() {
        assert_eq!(subscription("sensors", None), "sensors/#");
        assert_eq!(subscription("sensors", Some("hg")), "$share/hg/sensors/#");
    }
}
