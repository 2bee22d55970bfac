//! The documentation's commands, run as they are written.

use std::path::PathBuf;

use crate::helpers::spawn_app;

/// A shell block of a markdown file: the first ```sh fence after `heading`.
fn shell_block(file: &str, heading: &str) -> String {
    let text = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    let after = text
        .split_once(heading)
        .unwrap_or_else(|| panic!("{file} has no {heading:?}"))
        .1;
    let block = after
        .split_once("```sh\n")
        .unwrap_or_else(|| panic!("no shell block after {heading:?}"))
        .1;
    block
        .split_once("```")
        .expect("a closed block")
        .0
        .to_owned()
}

/// Commands and the answers shown under them: a step is the command lines
/// up to the comment lines that follow them.
fn steps(block: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut command = String::new();
    let mut answer = String::new();
    for line in block.lines() {
        if let Some(shown) = line.strip_prefix("# ") {
            answer.push_str(shown);
        } else if line.trim().is_empty() {
            continue;
        } else {
            if !answer.is_empty() {
                out.push((std::mem::take(&mut command), std::mem::take(&mut answer)));
            }
            command.push_str(line);
            command.push('\n');
        }
    }
    if !answer.is_empty() {
        out.push((command, answer));
    }
    out
}

/// `…` in a shown answer stands for any text (a time, a timestamp).
fn matches(shown: &str, got: &str) -> bool {
    let parts: Vec<&str> = shown.split('…').collect();
    let Some(rest) = got.strip_prefix(parts[0]) else {
        return false;
    };
    let mut rest = rest;
    for (i, part) in parts.iter().enumerate().skip(1) {
        if i == parts.len() - 1 {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

#[tokio::test]
async fn the_readmes_curl_session_answers_what_it_shows() {
    let app = spawn_app().await;
    let host = app.address.trim_start_matches("http://").to_owned();
    let block = shell_block("README.md", "## A curl session").replace("localhost:8080", &host);
    let steps = steps(&block);
    assert_eq!(steps.len(), 4, "the session's steps: {steps:?}");
    // One shell, so the variables a step sets hold for the next; each
    // step's answer ends with a line of its own.
    let script: String = steps
        .iter()
        .map(|(command, _)| format!("{command}echo; echo '<<step>>'\n"))
        .collect();
    let out = tokio::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .output()
        .await
        .expect("bash runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let answers: Vec<&str> = text.split("<<step>>").map(str::trim).collect();
    for ((command, shown), got) in steps.iter().zip(&answers) {
        assert!(
            matches(shown, got),
            "{command}\nshows {shown}\nanswered {got}"
        );
    }
    app.stop().await.expect("clean stop");
}

#[test]
fn a_shown_answer_matches_only_what_it_shows() {
    assert!(matches(r#"{"a":…,"b":2}"#, r#"{"a":"x","b":2}"#));
    assert!(matches(r#"[…,"70"]"#, r#"[1796155878.608,"70"]"#));
    assert!(!matches(r#"{"a":…,"b":2}"#, r#"{"a":"x","b":3}"#));
    assert!(!matches(r#"{"count":2}"#, r#"{"count":3}"#));
    assert!(!matches(r#"{"count":2}"#, r#"{"count":2,"x":1}"#));
}
