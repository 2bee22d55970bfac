//! What `hourglass --version` says: the release, the commit it was built
//! from, and the layouts it writes (which decide what may run beside it on
//! one database; see CHANGELOG.md).

use std::sync::LazyLock;

use crate::store::SCHEMA_VERSION;
use crate::store::rollup::ROLLUP_SCHEMA_VERSION;

/// `0.2.0 (commit 1234abcd5678)`, for `-V`.
pub fn short_version() -> &'static str {
    static SHORT: LazyLock<String> = LazyLock::new(|| {
        format!(
            "{} (commit {})",
            env!("CARGO_PKG_VERSION"),
            env!("HOURGLASS_COMMIT")
        )
    });
    &SHORT
}

/// The short version and the layouts, for `--version`.
pub fn long_version() -> &'static str {
    static LONG: LazyLock<String> = LazyLock::new(|| {
        format!(
            "{}\nbucket layout {SCHEMA_VERSION}, rollup layout {ROLLUP_SCHEMA_VERSION}",
            short_version()
        )
    });
    &LONG
}
