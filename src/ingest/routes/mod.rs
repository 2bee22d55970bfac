//! Routes (`[[mqtt.routes]]`): the topics and payloads of firmware people
//! already run (Zigbee2MQTT, Tasmota, Shelly, ESPHome, Home Assistant, The
//! Things Stack), mapped onto readings without a shim in between.
//!
//! - `pattern`: topic patterns with named captures, and their filters.
//! - `settings`: the keys of a route; `presets`: the routes the book shows.
//! - `route`: a route checked at startup, each fault naming its key.
//! - `map`: one message through its route: readings, nothing, or why.

mod map;
mod pattern;
mod presets;
mod route;
mod settings;

pub use map::{Mapped, map};
pub use route::{Route, compile};
pub use settings::RouteSettings;
