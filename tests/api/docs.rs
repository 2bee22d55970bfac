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

/// Every ```sh block of a markdown file, in order.
fn shell_blocks(file: &str) -> Vec<String> {
    let text = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    text.split("```sh\n")
        .skip(1)
        .map(|b| b.split_once("```").expect("a closed block").0.to_owned())
        .collect()
}

/// Commands and the answers shown under them: a step is the command lines
/// up to the comment lines that follow them (joined by newlines).
fn steps(block: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut command = String::new();
    let mut answer = String::new();
    for line in block.lines() {
        if let Some(shown) = line.strip_prefix("# ") {
            if !answer.is_empty() {
                answer.push('\n');
            }
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

/// Runs `script` (shell blocks of one page, `localhost:8080` already
/// pointed at a test instance) in one shell, so the variables a step sets
/// hold for the next, and compares each step's answer with what it shows.
/// `hourglass` on the PATH is the binary under test.
async fn runs_as_shown(page: &str, script: &str) -> usize {
    let steps = steps(script);
    assert!(!steps.is_empty(), "{page}: no step shows an answer");
    // Each step's answer ends with a line of its own.
    let script: String = steps
        .iter()
        .map(|(command, _)| format!("{command}echo; echo '<<step>>'\n"))
        .collect();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_hourglass"));
    let path = format!(
        "{}:{}",
        bin.parent().expect("a directory").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let dir = tempfile::tempdir().expect("a scratch directory");
    let out = tokio::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(dir.path())
        .env("PATH", path)
        .output()
        .await
        .expect("bash runs");
    assert!(
        out.status.success(),
        "{page}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let answers: Vec<&str> = text.split("<<step>>").map(str::trim).collect();
    for ((command, shown), got) in steps.iter().zip(&answers) {
        assert!(
            matches(shown, got),
            "{page}: {command}\nshows {shown}\nanswered {got}"
        );
    }
    steps.len()
}

#[tokio::test]
async fn the_readmes_curl_session_answers_what_it_shows() {
    let app = spawn_app().await;
    let host = app.address.trim_start_matches("http://").to_owned();
    let block = shell_block("README.md", "## A curl session").replace("localhost:8080", &host);
    assert_eq!(
        runs_as_shown("README.md", &block).await,
        4,
        "the session's steps"
    );
    app.stop().await.expect("clean stop");
}

/// The book's pages whose commands run here, each on an instance of its
/// own. A command that needs more than the test's stack (a build, Docker,
/// a long fuzzing run) is shown in a ```console block instead.
const PAGES: &[&str] = &[
    "docs/src/querying/json-api.md",
    "docs/src/sending/readings.md",
    "docs/src/querying/grafana.md",
    "docs/src/operating/import-export.md",
];

#[tokio::test]
async fn the_books_commands_answer_what_they_show() {
    for page in PAGES {
        let app = spawn_app().await;
        let host = app.address.trim_start_matches("http://").to_owned();
        let script = shell_blocks(page)
            .join("\n")
            .replace("localhost:8080", &host);
        runs_as_shown(page, &script).await;
        app.stop().await.expect("clean stop");
    }
    // Every page's shell blocks are among those run.
    let mut unrun = Vec::new();
    for path in book_pages() {
        let relative = path
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .expect("inside")
            .display()
            .to_string();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.contains("```sh\n") && !PAGES.contains(&relative.as_str()) {
            unrun.push(relative);
        }
    }
    assert!(
        unrun.is_empty(),
        "pages whose shell blocks no test runs: {unrun:?}"
    );
}

/// Every file of the book's source (`docs/src`).
fn book_pages() -> Vec<PathBuf> {
    let mut pages = Vec::new();
    let mut dirs = vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("readable") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                pages.push(path);
            }
        }
    }
    pages
}

#[test]
fn a_shown_answer_matches_only_what_it_shows() {
    assert!(matches(r#"{"a":…,"b":2}"#, r#"{"a":"x","b":2}"#));
    assert!(matches(r#"[…,"70"]"#, r#"[1796155878.608,"70"]"#));
    assert!(!matches(r#"{"a":…,"b":2}"#, r#"{"a":"x","b":3}"#));
    assert!(!matches(r#"{"count":2}"#, r#"{"count":3}"#));
    assert!(!matches(r#"{"count":2}"#, r#"{"count":2,"x":1}"#));
}

/// Every configuration snippet of the book (a ```toml block; Telegraf's,
/// `[[outputs…]]`, aside) loads with the service's own loader, given only
/// the storage server's address where it names none: a snippet startup
/// would refuse fails here.
#[test]
fn the_books_configuration_snippets_load() {
    let mut loaded = 0;
    for path in book_pages() {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for block in text.split("```toml\n").skip(1) {
            let block = block.split_once("```").expect("a closed block").0;
            // Indented inside a list item, as Markdown allows.
            let block: String = block
                .lines()
                .map(|l| format!("{}\n", l.trim_start()))
                .collect();
            if block.contains("[[outputs.") {
                continue;
            }
            // The whole default file, included by mdBook.
            let block = match block.trim().strip_prefix("{{#include ") {
                Some(include) => {
                    let target = include.trim_end_matches("}}").trim();
                    std::fs::read_to_string(path.parent().expect("a directory").join(target))
                        .expect("the included file")
                }
                None => block,
            };
            let mut file = block.clone();
            for (section, key, value) in [
                ("[mongodb]", "uri", "mongodb://127.0.0.1:27017"),
                ("[mqtt]", "url", "mqtt://127.0.0.1:1883"),
            ] {
                let line = format!("{key} = \"{value}\"\n");
                if !file.contains(&format!("{section}\n")) {
                    file.push_str(&format!("\n{section}\n{line}"));
                } else if !section_has(&file, section, key) {
                    file = file.replacen(&format!("{section}\n"), &format!("{section}\n{line}"), 1);
                }
            }
            let scratch = tempfile::NamedTempFile::new().expect("a file");
            std::fs::write(scratch.path(), &file).expect("written");
            if let Err(e) = hourglass::Settings::load_file(scratch.path()) {
                panic!(
                    "{}: the snippet does not load: {e}\n{block}",
                    path.display()
                );
            }
            loaded += 1;
        }
    }
    assert!(loaded >= 3, "{loaded} snippets");
}

/// Whether `section` of a TOML text sets `key`.
fn section_has(text: &str, section: &str, key: &str) -> bool {
    text.split_once(&format!("{section}\n"))
        .is_some_and(|(_, rest)| {
            rest.lines()
                .take_while(|l| !l.starts_with('['))
                .any(|l| l.split('=').next().is_some_and(|k| k.trim() == key))
        })
}

/// The command-line reference is the binary's own help, as it prints it;
/// after a change to the commands, `HOURGLASS_BLESS=1` rewrites the page.
#[test]
fn the_cli_reference_is_the_binarys_help() {
    let help = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .args(args)
            .arg("--help")
            .output()
            .expect("the binary runs");
        assert!(out.status.success(), "{args:?}");
        String::from_utf8(out.stdout).expect("utf-8")
    };
    let top = help(&[]);
    let commands: Vec<&str> = top
        .split_once("Commands:\n")
        .expect("a command list")
        .1
        .lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.len() >= 7, "{commands:?}");
    let mut page = String::from(
        "# Command-line reference\n\n\
         Each command's help, as `hourglass <command> --help` prints it (a test\n\
         keeps this page equal to the binary's). `import`, `export` and `delete`\n\
         are clients of a running instance; the others work on the database\n\
         named by the configuration.\n",
    );
    for (title, args) in std::iter::once(("hourglass".to_owned(), Vec::new())).chain(
        commands
            .iter()
            .map(|c| (format!("hourglass {c}"), vec![*c])),
    ) {
        page.push_str(&format!("\n## `{title}`\n\n```text\n{}```\n", help(&args)));
    }
    generated_page("docs/src/reference/cli.md", &page, "the binary's help");
}

/// Checks that the committed page at `path` is `page`, generated from
/// `source`; with `HOURGLASS_BLESS` set, writes it first.
fn generated_page(path: &str, page: &str, source: &str) {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path);
    if std::env::var_os("HOURGLASS_BLESS").is_some() {
        std::fs::write(&file, page).expect("written");
    }
    let shown = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        shown == page,
        "{path} differs from {source}: run the test with HOURGLASS_BLESS=1 and review the change"
    );
}

/// The HTTP API reference is the service's own OpenAPI document rendered
/// as a page; after a change to the routes, `HOURGLASS_BLESS=1` rewrites it.
/// Every parameter, request body and answer must be described, and every
/// route behind a scope must list what its layers answer (401, 403, 503):
/// a route added without them fails here rather than reaching the page.
#[tokio::test]
async fn the_http_api_reference_is_the_openapi_document() {
    let app = spawn_app().await;
    let doc = app.get_json("/api/v1/openapi.json").await;
    app.stop().await.expect("clean stop");
    let mut page = String::from(
        "# HTTP API reference\n\n\
         Rendered from the service's OpenAPI document, which it serves at\n\
         `GET /api/v1/openapi.json` (a test keeps this page equal to it). The\n\
         Prometheus-compatible routes are under [Grafana and PromQL](../querying/grafana.md),\n\
         the InfluxDB write routes under [line protocol](../sending/line-protocol.md);\n\
         the JSON routes are explained with examples in [the JSON query API](../querying/json-api.md).\n\
         A route's scope is the token scope it needs when `auth.enabled` is on.\n\
         An `Error` body is `{\"error\": \"<what went wrong>\"}`, with `\"details\"`\n\
         (`[{\"index\", \"reason\"}]`) where a write's answer names readings.\n\n\
         | method | path | scope | what |\n|---|---|---|---|\n",
    );
    let scope = |tags: &serde_json::Value| {
        match tags[0].as_str().unwrap_or("") {
            "health" | "" => "none",
            "delete" => "admin",
            "export" => "query",
            other => other,
        }
        .to_owned()
    };
    let paths = doc["paths"].as_object().expect("paths");
    let mut sections = String::new();
    let mut undescribed = Vec::new();
    for (path, ops) in paths {
        for (method, op) in ops.as_object().expect("operations") {
            let method = method.to_uppercase();
            let route = format!("{method} {path}");
            let summary = markdown_text(op["summary"].as_str().unwrap_or(""));
            assert!(!summary.is_empty(), "{route} has no summary");
            let scope = scope(&op["tags"]);
            page.push_str(&format!("| {method} | `{path}` | {scope} | {summary} |\n"));
            sections.push_str(&format!("\n## `{route}`\n\n{summary}\n"));
            if let Some(params) = op["parameters"].as_array().filter(|p| !p.is_empty()) {
                sections
                    .push_str("\n| parameter | in | required | description |\n|---|---|---|---|\n");
                for p in params {
                    let name = p["name"].as_str().unwrap_or("");
                    let description = described(&p["description"]);
                    if description.is_empty() {
                        undescribed.push(format!("{route}: parameter {name}"));
                    }
                    sections.push_str(&format!(
                        "| `{name}` | {} | {} | {} |\n",
                        p["in"].as_str().unwrap_or(""),
                        if p["required"] == true { "yes" } else { "no" },
                        markdown_text(description),
                    ));
                }
            }
            let body = &op["requestBody"];
            if !body.is_null() {
                let description = described(&body["description"]);
                if description.is_empty() {
                    undescribed.push(format!("{route}: request body"));
                }
                sections.push_str(&format!(
                    "\nRequest body: {}. {}.\n",
                    contents(&body["content"]),
                    markdown_text(description.trim_end_matches('.'))
                ));
            }
            let responses = op["responses"].as_object().expect("responses");
            sections.push_str("\n| answer | body | headers | description |\n|---|---|---|---|\n");
            for (code, r) in responses {
                let description = described(&r["description"]);
                if description.is_empty() {
                    undescribed.push(format!("{route}: answer {code}"));
                }
                let headers: Vec<String> = r["headers"]
                    .as_object()
                    .map(|h| h.keys().map(|name| format!("`{name}`")).collect())
                    .unwrap_or_default();
                sections.push_str(&format!(
                    "| `{code}` | {} | {} | {} |\n",
                    contents(&r["content"]),
                    headers.join(", "),
                    markdown_text(description)
                ));
            }
            // What the layers in front of a route behind a scope answer
            // (api/routes.rs: the token check, the concurrency limit and
            // the request timeout), whatever its handler does.
            if scope != "none" {
                for code in ["401", "403", "503"] {
                    assert!(
                        responses.contains_key(code),
                        "{route} needs the {scope} scope yet lists no {code}"
                    );
                }
            }
        }
    }
    assert!(
        undescribed.is_empty(),
        "undescribed in the OpenAPI document (add a description to the route's #[utoipa::path]): {undescribed:#?}"
    );
    page.push_str(&sections);
    generated_page(
        "docs/src/reference/http-api.md",
        &page,
        "/api/v1/openapi.json",
    );
}

/// A description of the OpenAPI document, trimmed; empty when absent.
fn described(description: &serde_json::Value) -> &str {
    description.as_str().unwrap_or("").trim()
}

/// Prose of the OpenAPI document in a table cell: on one line, `|`
/// escaped, and angle brackets outside code spans (inside one they show as
/// written).
fn markdown_text(text: &str) -> String {
    text.replace('\n', " ")
        .split('`')
        .enumerate()
        .map(|(i, part)| {
            let part = part.replace('|', "\\|");
            if i % 2 == 1 {
                part
            } else {
                part.replace('<', "&lt;").replace('>', "&gt;")
            }
        })
        .collect::<Vec<_>>()
        .join("`")
}

/// A `content` map of the OpenAPI document as a table cell: each media
/// type with the schema of its body, by name (`SensorList`) or by type
/// (`string`); "none" for an answer without a body.
fn contents(content: &serde_json::Value) -> String {
    let Some(types) = content.as_object().filter(|c| !c.is_empty()) else {
        return "none".to_owned();
    };
    types
        .iter()
        .map(|(media, c)| {
            let schema = &c["schema"];
            let name = match schema["$ref"].as_str() {
                Some(r) => r.rsplit('/').next().unwrap_or(r).to_owned(),
                None => schema["type"].as_str().unwrap_or("any").to_owned(),
            };
            format!("`{name}` ({media})")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The security page's table names, for every input surface, the tests that
/// show its bounds: each named test exists (a renamed or removed test would
/// leave a surface with no test, a gap in plain sight).
#[test]
fn every_test_the_security_table_names_exists() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("docs/src/operating/security.md"))
        .expect("the security page");
    let mut named = 0;
    for row in page.lines().filter(|l| l.starts_with("| ")) {
        let Some(tests) = row.trim_end_matches('|').rsplit('|').next() else {
            continue;
        };
        for name in tests.split('`').skip(1).step_by(2) {
            let Some((module, function)) = name.rsplit_once("::") else {
                continue;
            };
            let base = root.join("tests/api").join(module.replace("::", "/"));
            let source = [base.with_extension("rs"), base.join("mod.rs")]
                .iter()
                .find_map(|p| std::fs::read_to_string(p).ok())
                .unwrap_or_else(|| panic!("{name}: no module {module} under tests/api"));
            assert!(
                source.contains(&format!("fn {function}(")),
                "{name}: no test {function} in {module}"
            );
            named += 1;
        }
    }
    assert!(named >= 20, "the table names {named} tests");
}
