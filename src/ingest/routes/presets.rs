//! The presets: routes for firmware people already run, as the book shows
//! them (docs/src/sending/devices.md), so they can be copied and changed.

use super::settings::{Payload, RouteSettings, TsFormat};

/// The preset names.
pub const NAMES: &[&str] = &[
    "zigbee2mqtt",
    "tasmota",
    "shelly-gen2",
    "esphome",
    "home-assistant-statestream",
    "the-things-stack",
];

fn strings(xs: &[&str]) -> Option<Vec<String>> {
    Some(xs.iter().map(|&x| x.to_owned()).collect())
}

fn some(x: &str) -> Option<String> {
    Some(x.to_owned())
}

/// The routes of preset `name` (a preset may be several), if it is one.
pub fn preset(name: &str) -> Option<Vec<RouteSettings>> {
    // Long: one arm per preset, each the route the book shows.
    let base = RouteSettings {
        name: some(name),
        ..RouteSettings::default()
    };
    let routes = match name {
        // zigbee2mqtt/<friendly name> (which may hold `/`): the device's
        // whole state as one object.
        "zigbee2mqtt" => vec![RouteSettings {
            topic: some("zigbee2mqtt/{sensor#}"),
            ignore: strings(&[
                "zigbee2mqtt/bridge/#",
                "zigbee2mqtt/{device#}/availability",
                "zigbee2mqtt/{device#}/set",
                "zigbee2mqtt/{device#}/set/#",
                "zigbee2mqtt/{device#}/get",
                "zigbee2mqtt/{device#}/get/#",
            ]),
            payload: Some(Payload::Json),
            exclude: strings(&["last_seen", "action", "update*", "elapsed"]),
            ..base
        }],
        // tele/<topic>/SENSOR every TelePeriod: one object per sensor
        // driver (AM2301, ENERGY, ...), `Time` in the device's local time
        // without a zone (give `timezone`; UTC by default).
        "tasmota" => vec![
            RouteSettings {
                name: some("tasmota"),
                topic: some("tele/{sensor}/SENSOR"),
                payload: Some(Payload::Json),
                separator: some("_"),
                exclude: strings(&["Time", "TempUnit", "PressureUnit", "ENERGY_TotalStartTime"]),
                ts: some("field:/Time"),
                ts_format: Some(TsFormat::Local),
                timezone: some("UTC"),
                ..base.clone()
            },
            RouteSettings {
                name: some("tasmota-state"),
                topic: some("tele/{sensor}/STATE"),
                payload: Some(Payload::Json),
                separator: some("_"),
                include: strings(&["POWER*", "Wifi_RSSI", "Wifi_Signal", "LoadAvg"]),
                ts: some("field:/Time"),
                ts_format: Some(TsFormat::Local),
                timezone: some("UTC"),
                ..base
            },
        ],
        // <device id>/status/<component> (with "Generic status update over
        // MQTT" on): switch:0, temperature:0, ... Names join the component.
        "shelly-gen2" => vec![RouteSettings {
            topic: some("{sensor}/status/{component}"),
            payload: Some(Payload::Json),
            metric: some("{component}_{field}"),
            separator: some("_"),
            exclude: strings(&[
                "id",
                "source",
                "*_by_minute*",
                "*_minute_ts",
                "temperature_tF",
                "tF",
                "errors*",
            ]),
            ..base
        }],
        // <node>/<component>/<object id>/state: a number, or ON/OFF.
        "esphome" => vec![RouteSettings {
            topic: some("{sensor}/{component}/{metric}/state"),
            // Text sensors hold text (an IP address, a version).
            ignore: strings(&["+/text_sensor/+/state"]),
            payload: Some(Payload::Auto),
            ..base
        }],
        // <base>/<domain>/<object id>/state: the state as text; the sensor
        // is the entity id (`sensor.kitchen_temperature`).
        "home-assistant-statestream" => vec![RouteSettings {
            topic: some("homeassistant/{domain}/{entity}/state"),
            payload: Some(Payload::Auto),
            sensor: some("{domain}.{entity}"),
            metric: some("state"),
            ..base
        }],
        // v3/<app>[@<tenant>]/devices/<device>/up: the payload formatter's
        // fields, timed by the network server.
        "the-things-stack" => vec![RouteSettings {
            topic: some("v3/{app}/devices/{sensor}/up"),
            payload: Some(Payload::Json),
            pointer: some("/uplink_message/decoded_payload"),
            separator: some("_"),
            ts: some("field:/received_at"),
            ts_format: Some(TsFormat::Rfc3339),
            ..base
        }],
        _ => return None,
    };
    Some(routes)
}
