//! The code's own conventions, checked: dependencies point one way (a
//! module uses only those below it, no two files of a folder import each
//! other, a folder's `mod.rs` holds only its modules and re-exports), and a
//! function longer than a screen says why.

use std::path::{Path, PathBuf};

/// The modules, bottom to top, as declared above.
const LAYERS: &[&str] = &[
    "settings",
    "runtime",
    "telemetry",
    "shutdown",
    "domain",
    "batcher",
    "cardinality",
    "journal",
    "store",
    "query",
    "auth",
    "ingest",
    "api",
    "config",
    "startup",
    "transfer",
];

/// The crate's `src` folder and every source file below it.
fn sources() -> (PathBuf, Vec<PathBuf>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    (src, all)
}

/// Fails with `rule` and every place that breaks it, if any does.
fn none_found(found: &[String], rule: &str) {
    assert!(found.is_empty(), "{rule}: {found:#?}");
}

/// The identifier `s` starts with.
fn identifier(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src is readable") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a source file belongs to.
fn module_of(src: &Path, file: &Path) -> Option<&'static str> {
    let first = file.strip_prefix(src).ok()?.components().next()?;
    let name = first.as_os_str().to_str()?.trim_end_matches(".rs");
    LAYERS.iter().copied().find(|l| *l == name)
}

/// `crate::<module>` paths in the code of `text` (comments left out).
fn uses(text: &str) -> Vec<&'static str> {
    let mut found = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if let Some(l) = LAYERS.iter().copied().find(|l| *l == name) {
                found.push(l);
            }
        }
        // `use crate::{a, b}` names several at once.
        if let Some(group) = code.split("crate::{").nth(1) {
            for part in group.split([',', '}']) {
                let name = part.trim().split("::").next().unwrap_or_default();
                if let Some(l) = LAYERS.iter().copied().find(|l| *l == name) {
                    found.push(l);
                }
            }
        }
    }
    found
}

fn rank(module: &str) -> usize {
    LAYERS
        .iter()
        .position(|l| *l == module)
        .unwrap_or(usize::MAX)
}

#[test]
fn no_module_uses_a_module_above_it() {
    let (src, all) = sources();
    let mut upward = Vec::new();
    for file in &all {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        let text = std::fs::read_to_string(file).expect("readable");
        for used in uses(&text) {
            if rank(used) > rank(module) {
                upward.push(format!("{} uses crate::{used}", file.display()));
            }
        }
    }
    assert!(upward.is_empty(), "imports that point up: {upward:#?}");
    assert!(all.len() > 20, "the scan found the sources");
}

/// `super::<name>` paths in the code of `text`: the siblings a file of a
/// module uses.
fn sibling_uses(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let ident = identifier;
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        for (i, _) in code.match_indices("super::") {
            let rest = &code[i + "super::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                for part in group.split([',', '}']) {
                    found.push(ident(part.trim()));
                }
            } else {
                found.push(ident(rest));
            }
        }
    }
    found.retain(|n| !n.is_empty());
    found
}

#[test]
fn no_two_files_of_a_module_import_each_other() {
    let (src, all) = sources();
    let stem = |p: &Path| p.file_stem().and_then(|s| s.to_str()).map(str::to_owned);
    // (directory, file) -> the sibling files or folders it uses.
    let mut edges = std::collections::BTreeSet::new();
    for file in &all {
        let (Some(dir), Some(name)) = (file.parent(), stem(file)) else {
            continue;
        };
        if dir == src || name == "mod" {
            continue;
        }
        let siblings: Vec<String> = std::fs::read_dir(dir)
            .expect("readable")
            .filter_map(|e| stem(&e.ok()?.path()))
            .filter(|n| *n != "mod" && *n != name)
            .collect();
        let text = std::fs::read_to_string(file).expect("readable");
        for used in sibling_uses(&text) {
            if siblings.contains(&used) {
                edges.insert((dir.to_path_buf(), name.clone(), used));
            }
        }
    }
    let circles: Vec<String> = edges
        .iter()
        .filter(|(dir, a, b)| a < b && edges.contains(&(dir.clone(), b.clone(), a.clone())))
        .map(|(dir, a, b)| format!("{}: {a} and {b}", dir.display()))
        .collect();
    assert!(
        circles.is_empty(),
        "files that import each other: {circles:#?}"
    );
    assert!(!edges.is_empty(), "the scan found sibling imports");
}

/// The code of a file up to its unit tests, comments left out.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("mod tests") {
            break;
        }
        out.push_str(line.split("//").next().unwrap_or_default());
        out.push('\n');
    }
    out
}

/// The items `code` (a `mod.rs`) defines itself at its top level, not
/// those it re-exports.
fn defined_items(code: &str) -> std::collections::BTreeSet<String> {
    let item = regex::Regex::new(
        r"(?m)^(?:pub(?:\([^)]*\))?\s+)?(?:async\s+|const\s+(?:fn)|unsafe\s+)*(?:fn|struct|enum|const|static|type|trait)\s+([A-Za-z_][A-Za-z0-9_]*)",
    )
    .expect("a valid pattern");
    item.captures_iter(code)
        .filter_map(|c| c.get(1))
        .map(|m| m.as_str().to_owned())
        .collect()
}

/// The first names of every path `code` takes from `prefix` (`super` or
/// `crate::a::b`), groups over several lines included.
fn names_from(code: &str, prefix: &str) -> Vec<String> {
    let ident = |s: &str| identifier(s.trim_start());
    let mut found = Vec::new();
    let needle = format!("{prefix}::");
    for (i, _) in code.match_indices(&needle) {
        let before = code[..i].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &code[i + needle.len()..];
        let Some(group) = rest.strip_prefix('{') else {
            found.push(ident(rest));
            continue;
        };
        // The group's top-level parts: `a::{b, c}` names `a`.
        let (mut depth, mut part) = (0usize, String::new());
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    found.push(ident(&part));
                    part.clear();
                    continue;
                }
                _ => {}
            }
            part.push(c);
        }
        found.push(ident(&part));
    }
    found.retain(|n| !n.is_empty());
    found
}

#[test]
fn no_file_takes_from_its_folders_mod_rs_anything_but_a_re_export() {
    let (src, all) = sources();
    let mut taken = Vec::new();
    let mut folders = 0;
    for hub in all.iter().filter(|f| f.ends_with("mod.rs")) {
        let Some(dir) = hub.parent() else { continue };
        let defined = defined_items(&code_of(&std::fs::read_to_string(hub).expect("readable")));
        let path = dir
            .strip_prefix(&src)
            .expect("under src")
            .components()
            .filter_map(|c| c.as_os_str().to_str())
            .collect::<Vec<_>>()
            .join("::");
        let own = format!("crate::{path}");
        // The folder's files, and its sub-folders' `mod.rs`.
        let members = all.iter().filter(|f| {
            (f.parent() == Some(dir) && !f.ends_with("mod.rs"))
                || (f.ends_with("mod.rs") && f.parent().and_then(Path::parent) == Some(dir))
        });
        folders += 1;
        for file in members {
            let code = code_of(&std::fs::read_to_string(file).expect("readable"));
            for name in names_from(&code, "super")
                .into_iter()
                .chain(names_from(&code, &own))
            {
                if defined.contains(&name) {
                    taken.push(format!(
                        "{} takes {name} from {}",
                        file.display(),
                        hub.display()
                    ));
                }
            }
        }
    }
    taken.sort();
    taken.dedup();
    none_found(
        &taken,
        "a mod.rs holds its modules and re-exports; move these into a file of their own",
    );
    assert!(folders > 10, "the scan found the folders");
}

#[test]
fn the_hub_scan_sees_definitions_and_imports_over_several_lines() {
    let hub = "pub use a::B;\npub(crate) struct Shared {\n    x: u8,\n}\nfn helper() {}\npub async fn run() {}\n";
    let defined = defined_items(hub);
    assert_eq!(
        defined.into_iter().collect::<Vec<_>>(),
        vec!["Shared", "helper", "run"]
    );
    let file = "use super::{\n    Shared, helper,\n    a::{B, C},\n};\nuse crate::x::y::Z;\nlet v = super::super::w;\n";
    assert_eq!(
        names_from(file, "super"),
        vec!["Shared", "helper", "a", "super"]
    );
    assert_eq!(names_from(file, "crate::x::y"), vec!["Z"]);
    assert!(code_of("use super::A;\n// super::B\nmod tests {\n use super::C;\n}").contains("A"));
    assert!(!code_of("use super::A;\n// super::B\nmod tests {\n use super::C;\n}").contains('B'));
}

#[test]
fn the_sibling_scan_sees_single_and_grouped_imports() {
    let text = "use super::acks::Pending;\nuse super::{Shared, intake::offer};\n// super::x\n";
    assert_eq!(sibling_uses(text), vec!["acks", "Shared", "intake"]);
}

#[test]
fn the_scan_sees_single_and_grouped_imports_and_skips_comments() {
    let text = "use crate::store::X;\nuse crate::{api, domain::Y};\n// crate::startup\n";
    assert_eq!(uses(text), vec!["store", "api", "domain"]);
}

/// Functions longer than this many lines say why (a `// Long:` line in their
/// body): past a screen, a function usually does two things.
const LONG_FUNCTION_LINES: usize = 80;

/// Each function of `code` with its first line (from 1), its length in lines
/// (signature to closing brace) and its text; unit tests left out.
fn functions(code: &str) -> Vec<(usize, usize, String)> {
    let lines: Vec<&str> = code.lines().collect();
    let end = lines
        .iter()
        .position(|l| l.trim_start().starts_with("mod tests"))
        .unwrap_or(lines.len());
    let start = regex::Regex::new(
        r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+[A-Za-z_0-9]+",
    )
    .expect("a valid pattern");
    let mut out = Vec::new();
    let mut i = 0;
    while i < end {
        if !start.is_match(lines[i]) {
            i += 1;
            continue;
        }
        let (mut depth, mut opened, mut j) = (0i64, false, i);
        while j < end {
            let code = lines[j].split("//").next().unwrap_or_default();
            for c in code.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if (opened && depth <= 0) || (!opened && code.trim_end().ends_with(';')) {
                break;
            }
            j += 1;
        }
        if opened {
            let text = lines[i..=j.min(end - 1)].join("\n");
            out.push((i + 1, j - i + 1, text));
            i = j + 1;
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn no_function_runs_past_a_screen_without_saying_why() {
    // The service's sources and the load test's scenarios.
    let (_, mut all) = sources();
    files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("loadtest/src"),
        &mut all,
    );
    let mut unexplained = Vec::new();
    let mut long = 0;
    for file in all
        .iter()
        .filter(|f| !f.components().any(|c| c.as_os_str() == "tests"))
    {
        let text = std::fs::read_to_string(file).expect("readable");
        for (line, length, body) in functions(&text) {
            if length <= LONG_FUNCTION_LINES {
                continue;
            }
            long += 1;
            if !body
                .lines()
                .any(|l| l.trim_start().starts_with("// Long: "))
            {
                unexplained.push(format!("{}:{line} ({length} lines)", file.display()));
            }
        }
    }
    none_found(
        &unexplained,
        &format!(
            "functions over {LONG_FUNCTION_LINES} lines: split them, or say why in a `// Long:` line"
        ),
    );
    assert!(long > 0, "the scan measured functions");
}

#[test]
fn the_function_scan_measures_from_signature_to_closing_brace() {
    let code = "fn a() {\n    let x = 1;\n}\n\npub(crate) async fn b(\n    x: u8,\n) -> u8 {\n    // } not counted\n    x\n}\nfn c();\nmod tests {\n    fn d() {}\n}\n";
    let found: Vec<(usize, usize)> = functions(code)
        .into_iter()
        .map(|(l, n, _)| (l, n))
        .collect();
    assert_eq!(found, vec![(1, 3), (5, 6)]);
}
