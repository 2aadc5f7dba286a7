//! The docs say what the code and the files do: every figure in
//! docs/benchmarks.md's prose is in a file of its section, the README's
//! `modstream plan` examples are what plan prints, the reliability page is
//! rendered from its rows. (The bench's generated tables are checked by
//! bench/tests/tables.rs, beside the code that renders them.)

use std::path::Path;

use modstream_bench::TABLES_BEGIN;

/// Words after which a number is a version, not a figure.
const VERSION_WORDS: &[&str] = &[
    "Kafka",
    "onnxruntime",
    "Runtime",
    "Python",
    "Rust",
    "Apicurio",
    "CUDA",
    "cuDNN",
    "Temurin",
    "OpenJDK",
    "version",
    "confluent-kafka",
    "tokenizers",
];

/// One `## ` section of a doc: its prose paragraphs (generated blocks,
/// indented code and fences left out), the text of its generated blocks,
/// and the files it names (links, relative to the doc; bench-tables paths,
/// relative to the repository).
struct Section {
    title: String,
    paragraphs: Vec<(usize, String)>,
    blocks: String,
    files: Vec<std::path::PathBuf>,
}

fn sections(doc: &str, root: &Path, doc_dir: &Path) -> Vec<Section> {
    let mut out: Vec<Section> = Vec::new();
    let (mut in_block, mut in_fence) = (false, false);
    let mut paragraph: Option<(usize, String)> = None;
    let flush = |p: &mut Option<(usize, String)>, s: &mut Vec<Section>| {
        if let (Some(p), Some(last)) = (p.take(), s.last_mut()) {
            last.paragraphs.push(p);
        }
    };
    for (i, line) in doc.lines().enumerate() {
        if let Some(title) = line.strip_prefix("## ") {
            flush(&mut paragraph, &mut out);
            out.push(Section {
                title: title.to_string(),
                paragraphs: Vec::new(),
                blocks: String::new(),
                files: Vec::new(),
            });
            continue;
        }
        let Some(section) = out.last_mut() else {
            continue;
        };
        if let Some(path) = line.strip_prefix(TABLES_BEGIN) {
            let paths = path.trim().trim_end_matches("-->");
            section
                .files
                .extend(paths.split_whitespace().map(|p| root.join(p)));
            in_block = true;
            continue;
        }
        if line.starts_with("<!-- /bench-tables") {
            in_block = false;
            continue;
        }
        if in_block {
            section.blocks.push_str(line);
            section.blocks.push('\n');
            continue;
        }
        if line.starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence || line.starts_with("    ") {
            continue;
        }
        for link in line.split("](").skip(1) {
            let target = link.split(')').next().unwrap_or_default();
            if target.ends_with(".json") || target.ends_with(".md") {
                section.files.push(doc_dir.join(target));
            }
        }
        if line.trim().is_empty() || line.starts_with('#') || line.starts_with('|') {
            flush(&mut paragraph, &mut out);
            continue;
        }
        match &mut paragraph {
            Some((_, text)) => {
                text.push(' ');
                text.push_str(line);
            }
            None => paragraph = Some((i + 1, line.to_string())),
        }
    }
    flush(&mut paragraph, &mut out);
    out
}

/// Prose without what is not a measured figure: code spans (settings,
/// commands, test bounds), link targets, issue numbers.
fn prose_figures(text: &str) -> Vec<String> {
    let mut plain = String::new();
    for (i, part) in text.split('`').enumerate() {
        if i % 2 == 0 {
            plain.push_str(part);
            plain.push(' ');
        }
    }
    let mut cleaned = String::new();
    for (i, part) in plain.split("](").enumerate() {
        if i == 0 {
            cleaned.push_str(part);
        } else if let Some((_, rest)) = part.split_once(')') {
            cleaned.push_str(rest);
        }
    }
    let words: Vec<&str> = cleaned.split_whitespace().collect();
    let mut figures = Vec::new();
    let mut skip_issue_numbers = false;
    for (w, word) in words.iter().enumerate() {
        let previous = if w > 0 { words[w - 1] } else { "" };
        if ["issue", "issues", "Issue", "Issues"].contains(&previous) {
            skip_issue_numbers = true;
        } else if !(word.chars().next().is_some_and(|c| c.is_ascii_digit())
            || ["to", "and"].contains(word))
        {
            skip_issue_numbers = false;
        }
        if skip_issue_numbers || VERSION_WORDS.contains(&previous) {
            continue;
        }
        figures.extend(numbers_in_word(word));
    }
    figures
}

/// Numbers standing alone in a word ("1,032", "46 ms", "(0.94×"), not
/// parts of names or versions ("fp32", "p99", "1.9.1", "bench-cost").
fn numbers_in_word(word: &str) -> Vec<String> {
    let chars: Vec<char> = word.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts = chars[i].is_ascii_digit()
            && (i == 0 || !(chars[i - 1].is_alphanumeric() || "._-/".contains(chars[i - 1])));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        let mut number = String::new();
        while j < chars.len() {
            let c = chars[j];
            let thousands = c == ','
                && chars
                    .get(j + 1..j + 4)
                    .is_some_and(|d| d.iter().all(char::is_ascii_digit))
                && !chars.get(j + 4).is_some_and(char::is_ascii_digit);
            if c.is_ascii_digit() {
                number.push(c);
                j += 1;
            } else if thousands {
                j += 1;
            } else {
                break;
            }
        }
        if chars.get(j) == Some(&'.') && chars.get(j + 1).is_some_and(char::is_ascii_digit) {
            number.push('.');
            j += 1;
            while chars.get(j).is_some_and(char::is_ascii_digit) {
                number.push(chars[j]);
                j += 1;
            }
        }
        let version =
            chars.get(j) == Some(&'.') && chars.get(j + 1).is_some_and(char::is_ascii_digit);
        let part_of_name = chars.get(j).is_some_and(|c| c.is_alphabetic() || *c == '_');
        if !version && !part_of_name {
            out.push(number);
        }
        while chars
            .get(j)
            .is_some_and(|c| c.is_ascii_digit() || *c == '.')
        {
            j += 1;
        }
        i = j;
    }
    out
}

/// Every number a file holds (JSON values, table cells).
fn numbers_in_file(text: &str) -> Vec<f64> {
    text.split(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == 'e' || c == 'E'))
        .filter_map(|t| t.trim_matches(|c: char| !c.is_ascii_digit()).parse().ok())
        .collect()
}

/// `figure` (as written, with its decimals) is one of `pool` rounded, in
/// the units a doc writes it in (%, ms from s, µs, MiB from bytes, ...).
fn quoted_from(figure: &str, pool: &[f64]) -> bool {
    let Ok(x) = figure.parse::<f64>() else {
        return true;
    };
    let decimals = figure.split_once('.').map_or(0, |(_, d)| d.len() as i32);
    let scale = 10f64.powi(decimals);
    let units = [1.0, 100.0, 1e3, 1e-3, 1e-6, 1e6, 1.0 / 1_048_576.0];
    pool.iter().any(|p| {
        units
            .iter()
            .any(|u| ((p * u * scale).round() - x * scale).abs() < 1e-6)
    })
}

#[test]
fn every_figure_in_the_benchmarks_prose_is_in_a_file_of_its_section() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/benchmarks.md")).unwrap();
    let mut unfounded = Vec::new();
    let mut checked = 0;
    for section in sections(&doc, root, &root.join("docs")) {
        let mut pool = numbers_in_file(&section.blocks);
        for file in &section.files {
            let text = std::fs::read_to_string(file)
                .unwrap_or_else(|e| panic!("## {}: names {} ({e})", section.title, file.display()));
            pool.extend(numbers_in_file(&text));
        }
        for (line, paragraph) in &section.paragraphs {
            for figure in prose_figures(paragraph) {
                let small = !figure.contains('.')
                    && figure.parse::<u64>().is_ok_and(|n| n <= 10 || n == 100);
                if small {
                    continue;
                }
                checked += 1;
                if !quoted_from(&figure, &pool) {
                    unfounded.push(format!("line {line} ({}): {figure}", section.title));
                }
            }
        }
    }
    assert!(checked > 80, "{checked} figures checked");
    assert!(
        unfounded.is_empty(),
        "figures in docs/benchmarks.md's prose that no file of their section holds \
         (quote a file, or write a setting as code):\n{}",
        unfounded.join("\n")
    );
}

#[test]
fn a_figure_no_file_holds_is_found_and_settings_in_code_are_not_figures() {
    let figures = prose_figures(
        "int8 does 563/s (1.47×) against fp32's 1,032 in issue 24 on Kafka 4.4 with \
         `max_batch_size = 64`, see [a](bench-cost/bench.json); p99 at 46 ms, v1.9.1",
    );
    assert_eq!(figures, ["563", "1.47", "1032", "46"]);
    let pool = numbers_in_file(r#"{"per_s": 563.2, "bytes": 1082130432, "p99": 0.0461}"#);
    assert!(quoted_from("563", &pool));
    assert!(quoted_from("1032", &pool), "MiB from bytes");
    assert!(quoted_from("46", &pool), "ms from s");
    assert!(!quoted_from("1.47", &pool));
}

/// The indented block of `doc` that starts with a line beginning `first`.
fn indented_block<'a>(doc: &'a str, first: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = doc.lines().collect();
    // `first`'s lines begin the block's first lines, one each.
    let begins: Vec<&str> = first.lines().collect();
    let start = (0..lines.len())
        .position(|start| {
            begins.iter().enumerate().all(|(i, b)| {
                (lines.get(start + i))
                    .and_then(|l| l.strip_prefix("    "))
                    .is_some_and(|l| l.starts_with(b))
            })
        })
        .unwrap_or_else(|| panic!("no indented block starting {first:?}"));
    lines[start..]
        .iter()
        .take_while(|l| l.starts_with("    "))
        .map(|l| &l[4..])
        .collect()
}

#[test]
fn the_operations_pages_plan_examples_are_what_plan_prints_from_their_reports() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("docs/operations.md")).unwrap();
    let examples: [(&[&str], &str); 3] = [
        (
            &[
                "--rate",
                "100000",
                "--p99",
                "50",
                "--from",
                "docs/bench/bench.json",
            ],
            "From the bench report docs/bench/bench.json:",
        ),
        (
            &[
                "--rate",
                "1000",
                "--from",
                "docs/bench-cost/bench.json",
                "--contender",
                "int8",
            ],
            "From the bench report docs/bench-cost/bench.json:",
        ),
        (
            &[
                "--rate",
                "100000",
                "--from",
                "docs/bench/bench.json",
                "--gpu-rate",
                "200000",
            ],
            "From the bench report docs/bench/bench.json: alt-profanity-check 1.9.1 on 2 cores, 2 worker(s), CPUExecutionProvider, broker embedded.\nOne instance holds 13161",
        ),
    ];
    for (args, first) in examples {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_modstream"))
            .arg("plan")
            .args(args)
            .current_dir(root)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let printed = String::from_utf8(out.stdout).unwrap();
        let printed: Vec<&str> = printed.lines().filter(|l| !l.trim().is_empty()).collect();
        let shown = indented_block(&readme, first);
        assert_eq!(
            shown,
            printed,
            "docs/operations.md's example of `modstream plan {}`",
            args.join(" ")
        );
    }
}

#[test]
fn the_reliability_page_is_rendered_from_its_committed_rows() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(root.join("scripts/reliability-table.sh"))
        .arg("--print")
        .current_dir(root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = String::from_utf8(out.stdout).unwrap();
    let page = std::fs::read_to_string(root.join("docs/reliability.md")).unwrap();
    assert!(
        page == rendered,
        "docs/reliability.md is not what scripts/reliability-table.sh renders from docs/reliability/rows (and soak.json); run it"
    );
}
