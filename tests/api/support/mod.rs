//! What the suites share, apart from them: the service under test
//! (`helpers`: `spawn_app`, settings, waits), a real Mosquitto per test
//! (`broker`), the database's own view (`database`), query plans to compare
//! (`plans`), the Python clients (`python`) and checks of what was stored
//! (`rollup_checks`).

pub mod broker;
pub mod database;
pub mod helpers;
pub mod plans;
pub mod python;
pub mod rollup_checks;
