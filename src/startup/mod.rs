//! Wires the parts together: [`Application::build`] connects storage, opens
//! the journal and replays what it holds, and binds the listener;
//! [`Application::run_until_stopped`] serves until the shutdown future
//! resolves, then drains.
//!
//! - `application`: building, serving and the tasks it starts.
//! - `births`: Sparkplug births kept in the database.
//! - `stop`: the stop in order, within the shutdown's deadline.
//! - `version`: the release, commit and layouts `--version` prints.
//! - `tokens`: tokens reloaded without a restart.
//! - `losses`: what a stop could not store, recorded for the next start.
//! - `operator`: the operator commands' own connection (rebuild, instances,
//!   re-drive).

mod application;
mod births;
mod losses;
mod operator;
mod stop;
mod tokens;
mod version;

pub use application::Application;
pub use operator::{forget_instance, instances, rebuild_rollups, redrive};
pub use version::{long_version, short_version};
