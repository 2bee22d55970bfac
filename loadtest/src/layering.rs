//! The scenarios' modules use each other one way: no chain of `crate::`
//! (or `super::`) imports among this crate's files leads back to where it
//! started.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The modules of `text`'s `crate::<name>` and `super::<name>` paths that
/// are among `names` (comments left out; `{a, b}` groups read).
fn uses(text: &str, names: &BTreeSet<String>) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.trim()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        for prefix in ["crate::", "super::"] {
            for (i, _) in code.match_indices(prefix) {
                let rest = &code[i + prefix.len()..];
                let named: Vec<String> = match rest.strip_prefix('{') {
                    Some(group) => group.split([',', '}']).map(ident).collect(),
                    None => vec![ident(rest)],
                };
                found.extend(named.into_iter().filter(|n| names.contains(n)));
            }
        }
    }
    found
}

/// A cycle in `edges`, as the modules along it, if there is one.
fn cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        at: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(k) = path.iter().position(|p| p == at) {
            let mut found = path[k..].to_vec();
            found.push(at.to_owned());
            return Some(found);
        }
        if done.contains(at) {
            return None;
        }
        path.push(at.to_owned());
        for next in edges.get(at).into_iter().flatten() {
            if let Some(found) = visit(next, edges, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(at.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|start| visit(start, edges, &mut Vec::new(), &mut done))
}

#[test]
fn no_chain_of_imports_among_the_scenarios_leads_back_to_its_start() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files: Vec<_> = std::fs::read_dir(&src)
        .expect("src is readable")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    let name = |p: &Path| p.file_stem().and_then(|s| s.to_str()).map(str::to_owned);
    let names: BTreeSet<String> = files.iter().filter_map(|p| name(p)).collect();
    let mut edges = BTreeMap::new();
    for file in &files {
        let Some(from) = name(file).filter(|n| n != "main" && n != "layering") else {
            continue;
        };
        let text = std::fs::read_to_string(file).expect("readable");
        let mut used = uses(&text, &names);
        used.remove(&from);
        edges.insert(from, used);
    }
    assert!(
        edges.values().map(BTreeSet::len).sum::<usize>() > 10,
        "the scan found the imports"
    );
    assert_eq!(cycle(&edges), None, "modules that import each other");
}

#[test]
fn the_cycle_check_finds_a_chain_of_three_and_passes_a_tree() {
    let of = |pairs: &[(&str, &str)]| {
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in pairs {
            edges.entry((*a).into()).or_default().insert((*b).into());
        }
        edges
    };
    let circle = of(&[
        ("ranges", "exception"),
        ("exception", "probe"),
        ("probe", "ranges"),
    ]);
    assert_eq!(
        cycle(&circle),
        Some(vec![
            "exception".into(),
            "probe".into(),
            "ranges".into(),
            "exception".into()
        ])
    );
    let tree = of(&[
        ("ranges", "exception"),
        ("ranges", "probe"),
        ("exception", "probe"),
    ]);
    assert_eq!(cycle(&tree), None);
}

#[test]
fn the_scan_reads_grouped_and_sibling_paths_and_skips_comments() {
    let names: BTreeSet<String> = ["ctx", "report", "ranges", "waits"]
        .map(String::from)
        .into();
    let text = "use crate::{ctx::Ctx, report::f};\nlet x = super::ranges::y();\n// crate::waits\n";
    assert_eq!(
        uses(text, &names),
        ["ctx", "ranges", "report"].map(String::from).into()
    );
}
