//! The Python scripts some suites drive: real client libraries and a real
//! browser, from the interpreter `make test` installs them into.

use serde_json::Value;

/// The interpreter with the test clients (`HOURGLASS_TEST_PYTHON`, else
/// the checkout's `.venv`).
pub fn python() -> String {
    std::env::var("HOURGLASS_TEST_PYTHON").unwrap_or_else(|_| ".venv/bin/python".into())
}

/// A script's standard output, once it exited successfully.
pub fn stdout_of(what: &str, out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The JSON a script prints on its last line, once it exited successfully.
pub fn last_json(what: &str, out: &std::process::Output) -> Value {
    let stdout = stdout_of(what, out);
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{what} printed no JSON ({e}): {stdout}"))
}
