//! The shape of the source tree, read from the files as a newcomer would:
//! the modules of `src/` (and of the bench's `bench/src/`) import each other without a circle (sibling by
//! sibling, at every level: `crate::a` and `crate::b`, `tools::bench::x`
//! and `tools::bench::y`), no source file is over 600 lines, no function is
//! over 80 lines without a reason written above it (a comment line starting
//! `// Long:`; test code, which reads as one scenario top to bottom, is not
//! held to that), and docs/architecture.md names each top-level module's layer
//! as the imports make it (layer 0 imports no sibling; a module's layer is
//! one more than the highest layer it imports).
//!
//! Test code (`#[cfg(test)]` items, `tests.rs` files) is left out: tests
//! may reach across the house.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 600;
const MAX_FN_LINES: usize = 80;

type Module = Vec<String>;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`; `src/lib.rs` is the root.
fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Module = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The text without `#[cfg(test)]` items (a `mod x;` line, or an item up
/// to its closing brace) and without comments.
fn without_tests(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == "#[cfg(test)]" {
            i += 1;
            let mut depth = 0i32;
            let mut opened = false;
            while i < lines.len() {
                let line = lines[i];
                depth += line.matches('{').count() as i32 - line.matches('}').count() as i32;
                opened |= line.contains('{');
                i += 1;
                if (opened && depth <= 0) || (!opened && line.trim_end().ends_with(';')) {
                    break;
                }
            }
            continue;
        }
        let line = lines[i];
        let code = line.split("//").next().unwrap_or("");
        out.push_str(code);
        out.push('\n');
        i += 1;
    }
    out
}

/// Paths named after `crate::` or `super::`, with `use` groups expanded:
/// `crate::{a::X, b}` gives `crate::a::X` and `crate::b`.
fn referenced_paths(code: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let rest: String = bytes[i..bytes.len().min(i + 7)].iter().collect();
        let start_ok = i == 0 || !(bytes[i - 1].is_alphanumeric() || bytes[i - 1] == '_');
        if start_ok && (rest.starts_with("crate::") || rest.starts_with("super::")) {
            let (paths, end) = parse_path(&bytes, i);
            found.extend(paths);
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    found
}

/// One path starting at `i`, and where it ends; groups branch.
fn parse_path(c: &[char], mut i: usize) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    loop {
        let start = i;
        while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
            i += 1;
        }
        if i > start {
            prefix.push(c[start..i].iter().collect::<String>());
        }
        if i + 1 < c.len() && c[i] == ':' && c[i + 1] == ':' {
            i += 2;
            while i < c.len() && c[i].is_whitespace() {
                i += 1;
            }
            if i < c.len() && c[i] == '{' {
                i += 1;
                let mut all = Vec::new();
                loop {
                    while i < c.len() && (c[i].is_whitespace() || c[i] == ',') {
                        i += 1;
                    }
                    if i >= c.len() || c[i] == '}' {
                        i += 1;
                        break;
                    }
                    let (inner, end) = parse_path(c, i);
                    for p in inner {
                        let mut full = prefix.clone();
                        full.extend(p);
                        all.push(full);
                    }
                    i = end.max(i + 1);
                }
                return (all, i);
            }
            if i < c.len() && c[i] == '*' {
                return (vec![prefix], i + 1);
            }
            continue;
        }
        return (vec![prefix], i);
    }
}

/// An absolute module path for `path` as named in `from`.
fn absolute(from: &Module, path: &[String]) -> Module {
    let mut at: Module;
    let mut rest = path;
    if rest.first().map(String::as_str) == Some("crate") {
        at = Vec::new();
        rest = &rest[1..];
    } else {
        at = from.clone();
        while rest.first().map(String::as_str) == Some("super") {
            at.pop();
            rest = &rest[1..];
        }
    }
    at.extend(rest.iter().cloned());
    at
}

/// The longest known module that `path` lies in.
fn owning_module(modules: &BTreeSet<Module>, path: &Module) -> Module {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|m| modules.contains(m))
        .unwrap_or_default()
}

struct House {
    /// (parent, from-child, to-child): a sibling import under `parent`.
    edges: BTreeSet<(Module, String, String)>,
}

/// The service's crate (src/) and the bench's (bench/src/): each a house of
/// its own (the bench imports the service as `modstream::`, not `crate::`).
const CRATES: [&str; 2] = ["src", "bench/src"];

fn house(crate_src: &str) -> House {
    let src = root().join(crate_src);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.retain(|f| {
        f.file_name()
            .is_some_and(|n| n != "main.rs" && n != "tests.rs")
    });
    let modules: BTreeSet<Module> = files.iter().map(|f| module_of(&src, f)).collect();
    let mut edges = BTreeSet::new();
    for file in &files {
        let from = module_of(&src, file);
        let code = without_tests(&std::fs::read_to_string(file).unwrap());
        for path in referenced_paths(&code) {
            let to = owning_module(&modules, &absolute(&from, &path));
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            // A parent naming its child, or a child its ancestor: one module.
            if common == from.len() || common == to.len() {
                continue;
            }
            edges.insert((
                from[..common].to_vec(),
                from[common].clone(),
                to[common].clone(),
            ));
        }
    }
    House { edges }
}

/// A circle among the children of `parent`, if there is one.
fn circle(edges: &BTreeSet<(Module, String, String)>, parent: &Module) -> Option<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (p, a, b) in edges {
        if p == parent {
            next.entry(a).or_default().push(b);
        }
    }
    fn visit<'a>(
        node: &'a str,
        next: &BTreeMap<&'a str, Vec<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| *n == node) {
            let mut c: Vec<String> = path[at..].iter().map(|s| s.to_string()).collect();
            c.push(node.to_string());
            return Some(c);
        }
        if !done.insert(node) {
            return None;
        }
        path.push(node);
        for n in next.get(node).into_iter().flatten() {
            if let Some(c) = visit(n, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    let starts: Vec<&str> = next.keys().copied().collect();
    for start in starts {
        let mut path = Vec::new();
        if let Some(c) = visit(start, &next, &mut path, &mut done) {
            return Some(c);
        }
    }
    None
}

/// Each top-level module's layer.
fn layers(edges: &BTreeSet<(Module, String, String)>) -> BTreeMap<String, usize> {
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut layer: BTreeMap<String, usize> = files
        .iter()
        .map(|f| module_of(&src, f))
        .filter_map(|m| m.first().cloned())
        .filter(|m| m != "main")
        .map(|m| (m, 0))
        .collect();
    // Longest path; the graph has no circle (checked first), so this ends.
    for _ in 0..=layer.len() {
        for (p, a, b) in edges {
            if p.is_empty() {
                let want = layer.get(b).copied().unwrap_or(0) + 1;
                let l = layer.entry(a.clone()).or_insert(0);
                *l = (*l).max(want);
            }
        }
    }
    layer
}

#[test]
fn the_modules_import_each_other_without_a_circle() {
    let mut circles = Vec::new();
    for crate_src in CRATES {
        let house = house(crate_src);
        let parents: BTreeSet<&Module> = house.edges.iter().map(|(p, _, _)| p).collect();
        circles.extend(parents.iter().filter_map(|p| {
            circle(&house.edges, p).map(|c| {
                format!(
                    "{crate_src}: under crate::{}: {}",
                    p.join("::"),
                    c.join(" -> ")
                )
            })
        }));
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn docs_name_each_modules_layer_as_the_imports_make_it() {
    let house = house("src");
    let computed = layers(&house.edges);
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    // Rows of the layer table: | 2 | `hub`, `shadow` | ... |
    let mut documented: BTreeMap<String, usize> = BTreeMap::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 3 {
            continue;
        }
        let Ok(n) = cells[1].parse::<usize>() else {
            continue;
        };
        for name in cells[2].split(',') {
            let name = name.trim().trim_matches('`');
            if !name.is_empty() {
                documented.insert(name.to_string(), n);
            }
        }
    }
    let mut wrong = Vec::new();
    for (module, layer) in &computed {
        match documented.get(module) {
            Some(d) if d == layer => {}
            Some(d) => wrong.push(format!(
                "{module}: docs say layer {d}, imports make it {layer}"
            )),
            None => wrong.push(format!("{module}: not in the layer table (layer {layer})")),
        }
    }
    for module in documented.keys() {
        if !computed.contains_key(module) {
            wrong.push(format!("{module}: in the layer table, but no such module"));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/architecture.md layer table:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_source_file_over_600_lines_and_no_long_function_without_a_reason() {
    let mut files = Vec::new();
    for dir in ["src", "tests", "bench/src", "bench/tests"] {
        rust_files(&root().join(dir), &mut files);
    }
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let name = file.strip_prefix(root()).unwrap().display().to_string();
        if lines.len() > MAX_FILE_LINES {
            found.push(format!("{name}: {} lines", lines.len()));
        }
        let test_code = name.starts_with("tests/")
            || name.starts_with("bench/tests/")
            || name.ends_with("/tests.rs");
        // Test modules close a file: the functions before them.
        let code_lines = lines
            .iter()
            .position(|l| l.trim() == "#[cfg(test)]")
            .unwrap_or(lines.len());
        for (i, line) in lines
            .iter()
            .enumerate()
            .take(if test_code { 0 } else { code_lines })
        {
            let trimmed = line.trim_start();
            let is_fn = [
                "fn ",
                "pub fn ",
                "pub(crate) fn ",
                "pub(super) fn ",
                "async fn ",
                "pub async fn ",
            ]
            .iter()
            .any(|p| trimmed.starts_with(p));
            if !is_fn || line.trim_end().ends_with(';') {
                continue;
            }
            let indent = line.len() - trimmed.len();
            let close = " ".repeat(indent) + "}";
            let Some(end) = lines[i..].iter().position(|l| l.trim_end() == close) else {
                continue;
            };
            if end < MAX_FN_LINES {
                continue;
            }
            // The comments and attributes right above the function.
            let reason = lines[..i]
                .iter()
                .rev()
                .take_while(|l| {
                    let t = l.trim_start();
                    t.starts_with("//") || t.starts_with("#[")
                })
                .any(|l| l.trim_start().starts_with("// Long:"));
            if !reason {
                let fname = trimmed.split('(').next().unwrap_or(trimmed);
                found.push(format!(
                    "{name}:{}: `{fname}` is {} lines with no `// Long:` reason above it",
                    i + 1,
                    end + 1
                ));
            }
        }
    }
    assert!(found.is_empty(), "too long:\n{}", found.join("\n"));
}

#[test]
fn the_checker_sees_groups_nested_paths_and_super() {
    let code = "use crate::{a::X, b::{c::Y, d}};\nfn f() { crate::e::f(); super::g::H; }";
    let paths = referenced_paths(code);
    let names: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        names,
        [
            "crate::a::X",
            "crate::b::c::Y",
            "crate::b::d",
            "crate::e::f",
            "super::g::H"
        ]
    );
    let from: Module = vec!["tools".into(), "bench".into(), "x".into()];
    assert_eq!(absolute(&from, &paths[4]), ["tools", "bench", "g", "H"]);
    let edges: BTreeSet<(Module, String, String)> = [
        (vec![], "a".to_string(), "b".to_string()),
        (vec![], "b".to_string(), "c".to_string()),
        (vec![], "c".to_string(), "a".to_string()),
    ]
    .into();
    assert_eq!(circle(&edges, &vec![]).unwrap(), ["a", "b", "c", "a"]);
    let code = "fn a() {}\n#[cfg(test)]\nmod tests {\n    use crate::z;\n}\n";
    assert!(referenced_paths(&without_tests(code)).is_empty());
}

/// The hub routes between its stages: it holds only what routing needs
/// (at most 12 fields) and is one object in at most 3 files; `src/`'s
/// top holds at most 6 files beside `lib.rs` and `main.rs` (the rest sit
/// in the folder of the stage they serve).
#[test]
fn the_hub_is_a_small_router_and_the_tree_shows_the_stages() {
    let hub = std::fs::read_to_string(root().join("src/hub/mod.rs")).unwrap();
    let start = hub
        .find("pub struct Hub<")
        .expect("struct Hub in src/hub/mod.rs");
    let body = &hub[start..];
    let body = &body[..body.find("\n}").unwrap()];
    let fields: Vec<&str> = body
        .lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.starts_with("//") && !l.starts_with("#[") && l.contains(':'))
        .collect();
    assert!(
        fields.len() <= 12,
        "struct Hub has {} fields:\n{}",
        fields.len(),
        fields.join("\n")
    );
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let mut impl_files: Vec<String> = files
        .iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.lines().any(|l| {
                let l = l.trim_start();
                l.starts_with("impl") && names_hub(l)
            })
        })
        .map(|f| f.strip_prefix(root()).unwrap().display().to_string())
        .collect();
    impl_files.sort();
    assert!(
        impl_files.len() <= 3,
        "impl Hub in {} files: {impl_files:?}",
        impl_files.len()
    );
    let top: Vec<String> = std::fs::read_dir(root().join("src"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "rs"))
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .filter(|n| n != "lib.rs" && n != "main.rs")
        .collect();
    assert!(top.len() <= 6, "{} files at src/'s top: {top:?}", top.len());
}

/// Whether an `impl` line names the type `Hub` (`Hub<D>`, `super::Hub<D>`,
/// `Hub {`), not another type whose name ends so.
fn names_hub(line: &str) -> bool {
    line.match_indices("Hub").any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + 3..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_') && matches!(after, Some('<' | ' '))
    })
}
