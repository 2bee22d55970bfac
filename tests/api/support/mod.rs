//! What the suites share, apart from them: the service under test
//! (`helpers`: `spawn_app`, settings, waits), a real Mosquitto per test
//! (`broker`), the database's own view (`database`), query plans to compare
//! (`plans`) and the Python clients (`python`).

pub mod broker;
pub mod database;
pub mod helpers;
pub mod plans;
pub mod python;
