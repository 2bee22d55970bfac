//! MQTT routes: firmware's own topics and payloads (tests/fixtures/devices,
//! written from each project's documentation) published through Mosquitto
//! to the service with a preset: each reading stored exactly, nothing
//! else, the unusable rest dead-lettered naming the route and the reason.

use std::collections::BTreeMap;
use std::time::Duration;

use hourglass::Granularity;
use serde_json::Value;

use crate::broker::{Broker, Publisher};
use crate::helpers::*;
use crate::mqtt::mqtt_settings;

const WAIT: Duration = Duration::from_secs(60);

fn preset(name: &str) -> hourglass::RouteSettings {
    hourglass::RouteSettings {
        preset: Some(name.to_owned()),
        ..hourglass::RouteSettings::default()
    }
}

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// What is stored, by (sensor, metric): value and second.
async fn stored(app: &TestApp) -> BTreeMap<(String, String), (f64, i64)> {
    all_values(&app.buckets().await, Granularity::Minute)
        .into_iter()
        .map(|((s, m, ts), v)| ((s, m), (v, ts)))
        .collect()
}

fn expect(rows: &[(&str, &str, f64)]) -> BTreeMap<(String, String), f64> {
    rows.iter()
        .map(|(s, m, v)| (((*s).to_owned(), (*m).to_owned()), *v))
        .collect()
}

/// Publishes `messages` and waits for the service to have them all.
async fn publish_all(broker: &Broker, messages: &[(&str, String)]) {
    let mut p = Publisher::connect(broker, "device").await;
    for (topic, payload) in messages {
        p.publish(topic, payload.clone()).await;
    }
    p.flushed().await;
}

/// Dead letters' (topic, reason), `n` of them.
async fn letters(
    dead: &mut tokio::sync::mpsc::UnboundedReceiver<(String, Vec<u8>)>,
    n: usize,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    while out.len() < n {
        let (_, body) = tokio::time::timeout(WAIT, dead.recv())
            .await
            .expect("a dead letter in time")
            .expect("open");
        let letter: Value = serde_json::from_slice(&body).expect("JSON");
        out.push((
            letter["topic"].as_str().unwrap_or("").to_owned(),
            letter["reason"].as_str().unwrap_or("").to_owned(),
        ));
    }
    out
}

/// Zigbee2MQTT: a device's whole state as one object, timed on receipt;
/// friendly names with `/`, states, strings left out, availability and the
/// bridge taken and dropped.
#[tokio::test]
async fn zigbee2mqtt_devices_are_stored_field_by_field_and_the_bridge_is_ignored() {
    let broker = Broker::start().await;
    let mut settings = mqtt_settings(&broker);
    settings.mqtt.dead_letter_topic = "hourglass/dead".into();
    settings.mqtt.routes = vec![preset("zigbee2mqtt")];
    let app = spawn_app_with(settings).await;
    subscribed(&app).await;
    let mut watcher =
        Publisher::connect_subscribed(&broker, "watcher", Some("hourglass/dead")).await;
    let mut dead = watcher.messages();
    let t0 = now();
    let messages: Vec<(&str, String)> = vec![
        ("zigbee2mqtt/living_room/weather", r#"{"battery":97,"humidity":44.72,"linkquality":102,"pressure":1012.4,"temperature":21.34,"voltage":3005}"#.into()),
        ("zigbee2mqtt/kitchen_plug", r#"{"current":0.43,"energy":12.56,"linkquality":156,"power":98,"power_outage_memory":"restore","state":"ON","voltage":231}"#.into()),
        ("zigbee2mqtt/front_door", r#"{"battery":100,"contact":false,"linkquality":87,"temperature":22,"voltage":3025}"#.into()),
        ("zigbee2mqtt/hall_button", r#"{"action":"single","battery":100,"linkquality":60,"voltage":3042}"#.into()),
        ("zigbee2mqtt/WeatherGuestRoom", r#"{"temperature":24.59,"linkquality":39,"humidity":36.56,"pressure":990,"battery":"37.00","voltage":2975}"#.into()),
        ("zigbee2mqtt/living_room/weather/availability", r#"{"state":"online"}"#.into()),
        ("zigbee2mqtt/kitchen_plug/availability", "offline".into()),
        ("zigbee2mqtt/bridge/state", r#"{"state":"online"}"#.into()),
        ("zigbee2mqtt/bridge/event", r#"{"data":{"friendly_name":"0x00158d0006c4b533"},"type":"device_joined"}"#.into()),
        ("zigbee2mqtt/kitchen_plug/set", r#"{"state":"OFF"}"#.into()),
        // Unusable: a state word no table knows, and no number at all.
        ("zigbee2mqtt/odd", r#"{"mode":"eco"}"#.into()),
        ("zigbee2mqtt/broken", "not json".into()),
    ];
    publish_all(&broker, &messages).await;
    let expected = expect(&[
        ("living_room.weather", "battery", 97.0),
        ("living_room.weather", "humidity", 44.72),
        ("living_room.weather", "linkquality", 102.0),
        ("living_room.weather", "pressure", 1012.4),
        ("living_room.weather", "temperature", 21.34),
        ("living_room.weather", "voltage", 3005.0),
        ("kitchen_plug", "current", 0.43),
        ("kitchen_plug", "energy", 12.56),
        ("kitchen_plug", "linkquality", 156.0),
        ("kitchen_plug", "power", 98.0),
        ("kitchen_plug", "state", 1.0),
        ("kitchen_plug", "voltage", 231.0),
        ("front_door", "battery", 100.0),
        ("front_door", "contact", 0.0),
        ("front_door", "linkquality", 87.0),
        ("front_door", "temperature", 22.0),
        ("front_door", "voltage", 3025.0),
        ("hall_button", "battery", 100.0),
        ("hall_button", "linkquality", 60.0),
        ("hall_button", "voltage", 3042.0),
        ("WeatherGuestRoom", "temperature", 24.59),
        ("WeatherGuestRoom", "linkquality", 39.0),
        ("WeatherGuestRoom", "humidity", 36.56),
        ("WeatherGuestRoom", "pressure", 990.0),
        ("WeatherGuestRoom", "battery", 37.0),
        ("WeatherGuestRoom", "voltage", 2975.0),
    ]);
    eventually(WAIT, "every reading is stored", || async {
        stored(&app).await.keys().count() >= expected.len()
    })
    .await;
    let got = stored(&app).await;
    let t1 = now();
    let values: BTreeMap<(String, String), f64> =
        got.iter().map(|(k, (v, _))| (k.clone(), *v)).collect();
    assert_eq!(values, expected, "exactly these readings");
    assert!(
        got.values().all(|(_, ts)| (t0..=t1).contains(ts)),
        "timed on receipt"
    );
    let letters = letters(&mut dead, 2).await;
    let reasons: BTreeMap<String, String> = letters.into_iter().collect();
    assert!(
        reasons["zigbee2mqtt/odd"].contains("route \"zigbee2mqtt\"")
            && reasons["zigbee2mqtt/odd"].contains("mode"),
        "{reasons:?}"
    );
    assert!(
        reasons["zigbee2mqtt/broken"].contains("not JSON"),
        "{reasons:?}"
    );
    // Each message counted by its route: 5 stored, 5 ignored, 2 dead-lettered.
    for (outcome, n) in [("stored", 5.0), ("ignored", 5.0), ("dead_lettered", 2.0)] {
        let line = format!(
            "hourglass_mqtt_route_messages_total{{outcome=\"{outcome}\",route=\"zigbee2mqtt\"}}"
        );
        assert_eq!(app.metric(&line).await, n, "{outcome}");
    }
    app.stop().await.expect("clean stop");
}

/// Tasmota's local `Time` in the zone the route names, and The Things
/// Stack's `received_at`: each reading at the device's or network's second.
#[tokio::test]
async fn tasmota_and_the_things_stack_readings_keep_the_time_their_payload_gives() {
    let broker = Broker::start().await;
    let mut settings = mqtt_settings(&broker);
    let mut tasmota = preset("tasmota");
    tasmota.timezone = Some("Europe/Berlin".into());
    settings.mqtt.routes = vec![tasmota, preset("the-things-stack")];
    let app = spawn_app_with(settings).await;
    subscribed(&app).await;
    let t = now() - 600;
    let berlin = jiff::Timestamp::from_second(t)
        .expect("a time")
        .to_zoned(jiff::tz::TimeZone::get("Europe/Berlin").expect("a zone"))
        .datetime()
        .strftime("%Y-%m-%dT%H:%M:%S")
        .to_string();
    let utc = jiff::Timestamp::from_second(t + 5)
        .expect("a time")
        .to_string();
    let messages: Vec<(&str, String)> = vec![
        (
            "tele/TH16/SENSOR",
            format!(
                r#"{{"Time":"{berlin}","AM2301":{{"Temperature":22.6,"Humidity":32.4}},"TempUnit":"C"}}"#
            ),
        ),
        (
            "tele/S31B/SENSOR",
            format!(
                r#"{{"Time":"{berlin}","ENERGY":{{"TotalStartTime":"2022-09-24T18:51:27","Total":196.708,"Yesterday":0.000,"Today":0.000,"Period": 0,"Power": 7,"Voltage": 231,"Current":0.050}}}}"#
            ),
        ),
        (
            "tele/S31B/STATE",
            format!(
                r#"{{"Time":"{berlin}","Uptime":"9T04:03:29","Heap":25,"LoadAvg":19,"POWER":"ON","Wifi":{{"AP":2,"SSId":"jolt","RSSI":100,"Signal":-39}}}}"#
            ),
        ),
        ("tele/S31B/LWT", "Online".into()),
        (
            "v3/env-sensors@ttn/devices/lht65-office/up",
            format!(
                r#"{{"end_device_ids":{{"device_id":"lht65-office"}},"received_at":"{utc}","uplink_message":{{"f_port":2,"decoded_payload":{{"BatV":3.05,"TempC_SHT":21.35,"Hum_SHT":47.1,"Ext_sensor":"Temperature Sensor"}},"rx_metadata":[{{"rssi":-97}}]}}}}"#
            ),
        ),
    ];
    publish_all(&broker, &messages).await;
    let mut expected = BTreeMap::new();
    for (s, m, v, ts) in [
        ("TH16", "AM2301_Temperature", 22.6, t),
        ("TH16", "AM2301_Humidity", 32.4, t),
        ("S31B", "ENERGY_Total", 196.708, t),
        ("S31B", "ENERGY_Yesterday", 0.0, t),
        ("S31B", "ENERGY_Today", 0.0, t),
        ("S31B", "ENERGY_Period", 0.0, t),
        ("S31B", "ENERGY_Power", 7.0, t),
        ("S31B", "ENERGY_Voltage", 231.0, t),
        ("S31B", "ENERGY_Current", 0.05, t),
        ("S31B", "POWER", 1.0, t),
        ("S31B", "LoadAvg", 19.0, t),
        ("S31B", "Wifi_RSSI", 100.0, t),
        ("S31B", "Wifi_Signal", -39.0, t),
        ("lht65-office", "BatV", 3.05, t + 5),
        ("lht65-office", "TempC_SHT", 21.35, t + 5),
        ("lht65-office", "Hum_SHT", 47.1, t + 5),
    ] {
        expected.insert((s.to_owned(), m.to_owned(), ts), v);
    }
    eventually(WAIT, "every reading is stored exactly", || async {
        all_values(&app.buckets().await, Granularity::Minute) == expected
    })
    .await;
    app.stop().await.expect("clean stop");
}

/// ESPHome's and Home Assistant's plain states, Shelly's components: numbers
/// and state words, words that carry nothing skipped, a failed reading
/// (`nan`) dead-lettered.
#[tokio::test]
async fn esphome_home_assistant_and_shelly_states_are_numbers_and_words() {
    let broker = Broker::start().await;
    let mut settings = mqtt_settings(&broker);
    settings.mqtt.dead_letter_topic = "hourglass/dead".into();
    settings.mqtt.routes = vec![
        preset("home-assistant-statestream"),
        preset("shelly-gen2"),
        preset("esphome"),
    ];
    let app = spawn_app_with(settings).await;
    subscribed(&app).await;
    let mut watcher =
        Publisher::connect_subscribed(&broker, "watcher", Some("hourglass/dead")).await;
    let mut dead = watcher.messages();
    let messages: Vec<(&str, String)> = vec![
        ("livingroom/sensor/living_room_temperature/state", "21.5".into()),
        ("livingroom/sensor/living_room_humidity/state", "None".into()),
        ("livingroom/sensor/living_room_co2/state", "nan".into()),
        ("livingroom/text_sensor/ip_address/state", "192.168.1.50".into()),
        ("livingroom/status", "online".into()),
        ("plug-kitchen/switch/relay/state", "ON".into()),
        ("door-sensor/binary_sensor/front_door/state", "OFF".into()),
        ("homeassistant/light/master_bedroom_dimmer/state", "on".into()),
        ("homeassistant/sensor/kitchen_power/state", "98.4".into()),
        ("homeassistant/sensor/outdoor_temperature/state", "unavailable".into()),
        ("homeassistant/light/master_bedroom_dimmer/brightness", "255".into()),
        ("shelly1pmmini-solar/status/switch:0", r#"{"id":0, "source":"MQTT", "output":true, "apower":3.8, "voltage":231.0, "freq":50.1, "current":0.030, "aenergy":{"total":26064.252,"by_minute":[198.422,0.000,0.000],"minute_ts":1698999933},"temperature":{"tC":42.0, "tF":107.6}}"#.into()),
        ("shellyht-livingroom/status/humidity:0", r#"{"id": 0,"rh":57.0}"#.into()),
    ];
    publish_all(&broker, &messages).await;
    let expected = expect(&[
        ("livingroom", "living_room_temperature", 21.5),
        ("plug-kitchen", "relay", 1.0),
        ("door-sensor", "front_door", 0.0),
        ("light.master_bedroom_dimmer", "state", 1.0),
        ("sensor.kitchen_power", "state", 98.4),
        ("shelly1pmmini-solar", "switch_0_output", 1.0),
        ("shelly1pmmini-solar", "switch_0_apower", 3.8),
        ("shelly1pmmini-solar", "switch_0_voltage", 231.0),
        ("shelly1pmmini-solar", "switch_0_freq", 50.1),
        ("shelly1pmmini-solar", "switch_0_current", 0.03),
        ("shelly1pmmini-solar", "switch_0_aenergy_total", 26064.252),
        ("shelly1pmmini-solar", "switch_0_temperature_tC", 42.0),
        ("shellyht-livingroom", "humidity_0_rh", 57.0),
    ]);
    eventually(WAIT, "every reading is stored", || async {
        stored(&app).await.keys().count() >= expected.len()
    })
    .await;
    let values: BTreeMap<(String, String), f64> = stored(&app)
        .await
        .into_iter()
        .map(|(k, (v, _))| (k, v))
        .collect();
    assert_eq!(values, expected, "exactly these readings");
    let letters = letters(&mut dead, 1).await;
    assert_eq!(letters[0].0, "livingroom/sensor/living_room_co2/state");
    assert!(
        letters[0].1.contains("route \"esphome\"") && letters[0].1.contains("nan"),
        "{letters:?}"
    );
    app.stop().await.expect("clean stop");
}

/// A route's captures, fields and fixed values become its sensor's labels;
/// a label whose field is absent is left out, the readings stored anyway.
#[tokio::test]
async fn a_routes_captures_and_fields_become_the_sensors_labels() {
    let broker = Broker::start().await;
    let mut settings = mqtt_settings(&broker);
    settings.mqtt.routes = vec![hourglass::RouteSettings {
        topic: Some("plant/{site}/{sensor}".into()),
        exclude: Some(vec!["model".into(), "fw".into()]),
        labels: Some(BTreeMap::from([
            ("site".into(), "{site}".into()),
            ("model".into(), "field:/model".into()),
            ("firmware".into(), "field:/fw".into()),
            ("room".into(), "field:/room".into()),
            ("source".into(), "plant mqtt".into()),
        ])),
        ..Default::default()
    }];
    let app = spawn_app_with(settings).await;
    subscribed(&app).await;
    let messages: Vec<(&str, String)> = vec![
        (
            "plant/berlin/lb-th1",
            r#"{"model":"TH-16","fw":12,"t":21.5}"#.into(),
        ),
        (
            "plant/hamburg/lb-plug",
            r#"{"model":"S31","room":"kitchen","p":98}"#.into(),
        ),
    ];
    publish_all(&broker, &messages).await;
    eventually(WAIT, "the readings are stored", || async {
        stored(&app).await.len() == 2
    })
    .await;
    eventually(WAIT, "the routes' labels are the sensors'", || async {
        let s = app.get_json("/api/v1/sensors?prefix=lb-").await;
        s["sensors"][0]["labels"]
            == serde_json::json!({ "site": "hamburg", "model": "S31", "room": "kitchen", "source": "plant mqtt" })
            && s["sensors"][1]["labels"]
                == serde_json::json!({ "site": "berlin", "model": "TH-16", "firmware": "12", "source": "plant mqtt" })
    })
    .await;
    app.stop().await.expect("clean stop");
}

/// A route that cannot work stops the start, naming its key.
#[test]
fn a_route_that_cannot_work_stops_the_start_naming_its_key() {
    let mut settings = test_settings();
    settings.mqtt.enabled = true;
    settings.mqtt.url = "mqtt://127.0.0.1:1883".into();
    for (route, key) in [
        (
            hourglass::RouteSettings {
                topic: Some("devices/{id}/x".into()),
                ..Default::default()
            },
            "mqtt.routes[0].sensor",
        ),
        (
            hourglass::RouteSettings {
                topic: Some("devices/{sensor}".into()),
                pointer: Some("data".into()),
                ..Default::default()
            },
            "mqtt.routes[0].pointer",
        ),
        (preset("zigbee"), "mqtt.routes[0].preset"),
        (
            hourglass::RouteSettings {
                topic: Some("devices/{sensor}".into()),
                labels: Some(BTreeMap::from([("site".into(), "{site}".into())])),
                ..Default::default()
            },
            "mqtt.routes[0].labels",
        ),
        (
            hourglass::RouteSettings {
                topic: Some("devices/{sensor}".into()),
                labels: Some(BTreeMap::from([("__name__".into(), "x".into())])),
                ..Default::default()
            },
            "mqtt.routes[0].labels",
        ),
        // It would take its own dead letters, for ever.
        (
            hourglass::RouteSettings {
                topic: Some("hourglass/{sensor}".into()),
                ..Default::default()
            },
            "mqtt.routes[0].topic",
        ),
        (
            hourglass::RouteSettings {
                topic: Some("$share/g/{sensor}".into()),
                ..Default::default()
            },
            "mqtt.routes[0].topic",
        ),
    ] {
        settings.mqtt.routes = vec![route];
        let fault = settings.validate().expect_err("refused").to_string();
        assert!(fault.contains(key), "{fault}");
    }
}
