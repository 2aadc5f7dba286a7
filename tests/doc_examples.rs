//! Every example in README.md and docs/ works as shown: each TOML block
//! parses and validates (a configuration, or a policy file against the
//! shipped models), each YAML block parses (a policy file is checked too), and each `modstream` command names only flags its
//! `--help` (for `modstream bench`: its options) knows. docs/configuration.md's
//! key table and config/modstream.toml hold the same keys and defaults.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use modstream::config::Settings;
use modstream::inference::manifest::Manifest;
use modstream::policy::{ModelLabels, Ruleset};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every page of docs/.
fn pages() -> Vec<(PathBuf, String)> {
    let mut paths = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect()
}

/// A page's code: its fenced blocks (language, text, first line) and its
/// indented lines (4 spaces, outside fences), and the inline code spans of
/// its prose.
struct Code {
    fenced: Vec<(String, String, usize)>,
    indented: Vec<(String, usize)>,
    spans: Vec<(String, usize)>,
}

fn code_of(text: &str) -> Code {
    let mut code = Code {
        fenced: Vec::new(),
        indented: Vec::new(),
        spans: Vec::new(),
    };
    let mut fence: Option<(String, String, usize)> = None;
    let (mut paragraph, mut paragraph_at) = (String::new(), 0);
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("```") {
            match fence.take() {
                Some(block) => code.fenced.push(block),
                None => fence = Some((rest.trim().to_string(), String::new(), n + 1)),
            }
            continue;
        }
        if let Some((_, body, _)) = fence.as_mut() {
            body.push_str(line);
            body.push('\n');
            continue;
        }
        if let Some(rest) = line.strip_prefix("    ") {
            if !rest.starts_with("- ") && !rest.starts_with('|') {
                code.indented.push((rest.to_string(), n));
            }
            continue;
        }
        // Prose: a paragraph's spans may run over a line break.
        if line.trim().is_empty() {
            spans_of(&paragraph, paragraph_at, &mut code.spans);
            paragraph.clear();
        } else {
            if paragraph.is_empty() {
                paragraph_at = n;
            }
            paragraph.push_str(line);
            paragraph.push(' ');
        }
    }
    spans_of(&paragraph, paragraph_at, &mut code.spans);
    code
}

/// The inline code spans of a paragraph (each at the paragraph's line).
fn spans_of(paragraph: &str, at: usize, spans: &mut Vec<(String, usize)>) {
    let mut parts = paragraph.split('`');
    parts.next();
    while let (Some(span), Some(_)) = (parts.next(), parts.next()) {
        spans.push((span.split_whitespace().collect::<Vec<_>>().join(" "), at));
    }
}

/// The shipped models under the names the docs' policies give them.
fn model_labels() -> Vec<ModelLabels> {
    let profanity = Manifest::load(&root().join("models/profanity-check")).unwrap();
    let minilm = Manifest::load(&root().join("models/minilm-l6")).unwrap();
    ["default", "profanity"]
        .iter()
        .map(|n| ModelLabels::of(n, &profanity))
        .chain(
            ["minilm", "minilm-int8"]
                .iter()
                .map(|n| ModelLabels::of(n, &minilm)),
        )
        .collect()
}

/// A configuration example as a whole file: the sections a start needs
/// that the example leaves out are added (brokers, an input topic).
fn as_config(example: &str) -> String {
    let mut text = String::new();
    if !example.contains("[kafka]") {
        text.push_str("[kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n");
    }
    if !example.contains("[input]") {
        text.push_str("[input]\ntopics = [\"posts\"]\n");
    }
    text.push_str(example);
    text
}

/// A policy file against the shipped models.
fn policy(body: &str, format: config::FileFormat, labels: &[ModelLabels]) -> Result<(), String> {
    Ruleset::parse(body, format, labels)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A TOML example: a policy file (it has rules), else a configuration.
fn toml_example(body: &str, labels: &[ModelLabels]) -> Result<(), String> {
    if body.contains("[[rules]]") {
        policy(body, config::FileFormat::Toml, labels)
    } else {
        Settings::from_toml(&as_config(body))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// A YAML example: a policy file (it has rules), else any YAML document.
fn yaml_example(body: &str, labels: &[ModelLabels]) -> Result<(), String> {
    if body.contains("rules:") {
        policy(body, config::FileFormat::Yaml, labels)
    } else {
        config::Config::builder()
            .add_source(config::File::from_str(body, config::FileFormat::Yaml))
            .build()
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

#[test]
fn every_toml_and_yaml_example_parses_and_validates() {
    let labels = model_labels();
    let mut checked = 0;
    let mut failed = Vec::new();
    for (path, text) in pages() {
        for (lang, body, line) in code_of(&text).fenced {
            let result = match lang.as_str() {
                "toml" => toml_example(&body, &labels),
                "yaml" | "yml" => yaml_example(&body, &labels),
                _ => continue,
            };
            checked += 1;
            if let Err(e) = result {
                failed.push(format!("{}:{line}: {e}", path.display()));
            }
        }
    }
    assert!(checked >= 10, "{checked} TOML examples found");
    assert!(
        failed.is_empty(),
        "examples that do not parse:\n{}",
        failed.join("\n")
    );
}

/// One `modstream` invocation a doc shows: its subcommand and flags.
#[derive(Debug)]
struct Invocation {
    at: String,
    subcommand: String,
    flags: Vec<String>,
}

/// The invocations of modstream (or of a script that hands its arguments
/// to one) in a command line.
fn invocations(line: &str, at: &str) -> Vec<Invocation> {
    let tokens: Vec<&str> = line.split_whitespace().collect();
    let mut out = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let subcommand = match *t {
            "modstream" | "target/release/modstream" => {
                let word = |k: usize| {
                    tokens
                        .get(k)
                        .filter(|s| s.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
                };
                match (word(i + 1), word(i + 2)) {
                    // A subcommand of its own subcommands.
                    (Some(&"topics"), Some(action)) => format!("topics {action}"),
                    (Some(s), _) => s.to_string(),
                    _ => continue,
                }
            }
            "scripts/demo.sh" => "demo".to_string(),
            _ => continue,
        };
        let flags = tokens[i + 1..]
            .iter()
            .take_while(|t| !["|", "&&", ";", "&", "#"].contains(t))
            .filter_map(|t| {
                let t = t.trim_start_matches(['[', '(']);
                let flag = t.strip_prefix("--")?;
                let name: String = flag
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                (!name.is_empty()).then(|| format!("--{name}"))
            })
            .collect();
        out.push(Invocation {
            at: at.to_string(),
            subcommand,
            flags,
        });
    }
    out
}

/// Every command line of the docs, continuations joined.
fn command_lines() -> Vec<(String, String)> {
    let mut lines = Vec::new();
    for (path, text) in pages() {
        let name = path.strip_prefix(root()).unwrap().display().to_string();
        let code = code_of(&text);
        let mut blocks: Vec<(String, usize)> = code
            .fenced
            .iter()
            .filter(|(lang, _, _)| ["sh", "bash", "shell", "console"].contains(&lang.as_str()))
            .flat_map(|(_, body, line)| {
                body.lines()
                    .enumerate()
                    .map(move |(k, l)| (l.to_string(), line + k))
            })
            .collect();
        blocks.extend(code.indented);
        let mut pending: Option<(String, usize)> = None;
        for (l, n) in blocks {
            let (mut joined, start) = pending.take().unwrap_or((String::new(), n));
            joined.push_str(l.trim_end().trim_end_matches('\\'));
            joined.push(' ');
            if l.trim_end().ends_with('\\') {
                pending = Some((joined, start));
            } else {
                lines.push((joined, format!("{name}:{start}")));
            }
        }
        for (span, n) in code.spans {
            if span.starts_with("modstream ") || span.starts_with("scripts/demo.sh ") {
                lines.push((span, format!("{name}:{n}")));
            }
        }
    }
    lines
}

/// `modstream SUBCOMMAND --help`, or for the bench its options' source.
fn help_of(subcommand: &str, cache: &mut HashMap<String, String>) -> String {
    cache
        .entry(subcommand.to_string())
        .or_insert_with(|| {
            if subcommand == "bench" {
                // The bench's own binary: its clap fields (`match_shares` is
                // --match-shares) and the names given with `long = "..."`.
                let mut flags = String::new();
                for file in ["bench/src/options.rs", "bench/src/main.rs"] {
                    let source = std::fs::read_to_string(root().join(file)).unwrap();
                    for l in source.lines().map(str::trim) {
                        let field = l.strip_prefix("pub ").unwrap_or(l);
                        if let Some((name, _)) = field.split_once(':')
                            && !name.is_empty()
                            && name
                                .chars()
                                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                        {
                            flags.push_str(&format!("--{} ", name.replace('_', "-")));
                        }
                        if let Some((_, rest)) = l.split_once("long = \"") {
                            let name = rest.split('"').next().unwrap_or_default();
                            flags.push_str(&format!("--{name} "));
                        }
                    }
                }
                return flags;
            }
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_modstream"))
                .args(subcommand.split(' '))
                .arg("--help")
                .output()
                .unwrap();
            assert!(out.status.success(), "modstream {subcommand} --help");
            String::from_utf8(out.stdout).unwrap()
        })
        .clone()
}

#[test]
fn every_command_shown_names_only_flags_its_help_knows() {
    let mut cache = HashMap::new();
    let mut checked = 0;
    let mut unknown = Vec::new();
    for (line, at) in command_lines() {
        for inv in invocations(&line, &at) {
            let help = help_of(&inv.subcommand, &mut cache);
            for flag in &inv.flags {
                checked += 1;
                let known = help.contains(&format!("{flag} "))
                    || help.contains(&format!("{flag}\n"))
                    || help.contains(&format!("{flag}="))
                    || help.contains(&format!("{flag},"));
                if !known && flag != "--help" {
                    unknown.push(format!("{}: modstream {} {flag}", inv.at, inv.subcommand));
                }
            }
        }
    }
    assert!(checked > 50, "{checked} flags checked");
    assert!(
        unknown.is_empty(),
        "flags their command does not know:\n{}",
        unknown.join("\n")
    );
}

/// docs/configuration.md's table: key → default, as written.
fn documented_keys() -> BTreeMap<String, String> {
    let page = std::fs::read_to_string(root().join("docs/configuration.md")).unwrap();
    page.lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            let key = cells.first()?.strip_prefix("| `")?.strip_suffix('`')?;
            Some((key.to_string(), cells.get(1)?.to_string()))
        })
        .collect()
}

/// Every key config/modstream.toml sets, dotted, with its value.
fn shipped_keys() -> BTreeMap<String, toml::Value> {
    fn walk(prefix: &str, table: &toml::Table, out: &mut BTreeMap<String, toml::Value>) {
        for (k, v) in table {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                toml::Value::Table(t) => walk(&key, t, out),
                _ => {
                    out.insert(key, v.clone());
                }
            }
        }
    }
    let text = std::fs::read_to_string(root().join("config/modstream.toml")).unwrap();
    let table: toml::Table = toml::from_str(&text).unwrap();
    let mut out = BTreeMap::new();
    walk("", &table, &mut out);
    out
}

/// The keys a TOML file shows commented out (`# key = value`), dotted with
/// the section they stand in (a header commented out counts too).
fn commented_keys(text: &str) -> std::collections::BTreeSet<String> {
    let mut section = String::new();
    let mut keys = std::collections::BTreeSet::new();
    for line in text.lines() {
        let commented = line.trim_start().starts_with('#');
        let bare = line.trim_start().trim_start_matches('#').trim();
        if let Some(header) = bare.strip_prefix('[') {
            if commented && !header.ends_with(']') {
                continue;
            }
            let name = header.trim_matches(|c| c == '[' || c == ']').trim();
            // An array of tables: its keys are documented as `name[].key`.
            let array = header.starts_with('[');
            section = format!("{name}{}", if array { "[]" } else { "" });
            continue;
        }
        let Some((name, _)) = bare.split_once(" =") else {
            continue;
        };
        let plain = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if commented && plain {
            keys.insert(if section.is_empty() {
                name.to_string()
            } else {
                format!("{section}.{name}")
            });
        }
    }
    keys
}

/// A documented key (`LABEL` standing for any one name) and a key as
/// written are the same.
fn same_key(documented: &str, written: &str) -> bool {
    let (d, w): (Vec<&str>, Vec<&str>) = (
        documented.split('.').collect(),
        written.split('.').collect(),
    );
    d.len() == w.len() && d.iter().zip(&w).all(|(d, w)| d == w || *d == "LABEL")
}

#[test]
fn a_commented_key_counts_only_in_its_own_section() {
    let keys =
        commented_keys("[a]\n# x = 1\n[b]\n# [b.c]\n# y = \"v\"\n# not a key\n# [[d]]\n# z = 2\n");
    let want: std::collections::BTreeSet<String> = ["a.x", "b.c.y", "d[].z"]
        .iter()
        .map(|k| k.to_string())
        .collect();
    assert_eq!(keys, want);
    assert!(same_key("policy.labels.LABEL.x", "policy.labels.threat.x"));
    assert!(!same_key("policy.x", "policy.labels.threat.x"));
}

#[test]
fn the_configuration_page_and_the_shipped_file_hold_the_same_keys_and_defaults() {
    let documented = documented_keys();
    let shipped = shipped_keys();
    let text = std::fs::read_to_string(root().join("config/modstream.toml")).unwrap();
    let commented = commented_keys(&text);
    assert!(
        documented.len() > 80,
        "{} keys documented",
        documented.len()
    );
    let mut wrong = Vec::new();
    for (key, value) in &shipped {
        match documented.get(key) {
            None => wrong.push(format!(
                "{key}: set in config/modstream.toml, not documented"
            )),
            Some(default) => {
                // A required key: the shipped file's value, in the cell.
                let written = (default.strip_prefix("required (shipped file: "))
                    .and_then(|r| r.strip_suffix(')'))
                    .unwrap_or(default);
                let written = written.trim().trim_matches('`');
                let parsed: Result<toml::Table, _> = toml::from_str(&format!("v = {written}"));
                if parsed.ok().and_then(|t| t.get("v").cloned()).as_ref() != Some(value) {
                    wrong.push(format!(
                        "{key}: documented default {default}, the file says {value}"
                    ));
                }
            }
        }
    }
    let required: Vec<&str> = (documented.iter())
        .filter(|(_, d)| d.starts_with("required"))
        .map(|(k, _)| k.as_str())
        .collect();
    let mut want: Vec<&str> = modstream::config::REQUIRED
        .iter()
        .map(|(k, _)| *k)
        .collect();
    want.sort();
    if required != want {
        wrong.push(format!(
            "required keys: documented {required:?}, the code's {want:?}"
        ));
    }
    for (key, default) in &documented {
        if shipped.contains_key(key) {
            continue;
        }
        // Optional keys: shown commented out in their own section of the
        // file, unset by default.
        let shown = commented.iter().any(|c| same_key(key, c));
        if !default.starts_with("unset") || !shown {
            wrong.push(format!(
                "{key}: documented ({default}), not in config/modstream.toml"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/configuration.md against config/modstream.toml:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_page_is_over_four_hundred_lines_but_the_generated_benchmarks() {
    for (path, text) in pages() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name == "benchmarks.md" {
            continue;
        }
        let lines = text.lines().count();
        assert!(lines <= 420, "{name}: {lines} lines");
    }
}
