//! Wires the parts together: [`Application::build`] connects storage, opens
//! the journal and replays what it holds, and binds the listener;
//! [`Application::run_until_stopped`] serves until the shutdown future
//! resolves, then drains.
//!
//! - `application`: building, serving and the tasks it starts.
//! - `births`: Sparkplug births kept in the database.
//! - `stop`: the stop in order, within the shutdown's deadline.
//! - `operator`: the operator commands' own connection (rebuild, instances,
//!   re-drive).

mod application;
mod births;
mod operator;
mod stop;

pub use application::Application;
pub use operator::{forget_instance, instances, rebuild_rollups, redrive};
