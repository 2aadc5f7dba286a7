//! The README's five-minute tour, run as a user pastes it: its command
//! blocks in order, through bash, with three substitutions a user makes or
//! a test must: the demo's printed address for `PORT`, free ports for the
//! tour's 9464 and 9465 (no test takes a fixed port), and the built binary
//! for `scripts/demo.sh` and `target/release/modstream`. The thresholds'
//! change, which the README says in words, is a `sed` here.

mod support;

use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The tour's section of the README: its command blocks (indented lines
/// outside fences, one block per run of them) and its TOML file.
fn tour(readme: &str) -> (Vec<Vec<String>>, String) {
    let start = readme
        .find("## A five-minute tour")
        .expect("the tour's section");
    let section = &readme[start..];
    let end = section[3..].find("\n## ").map_or(section.len(), |i| i + 3);
    let (mut blocks, mut toml) = (Vec::new(), String::new());
    let (mut block, mut fence): (Vec<String>, Option<String>) = (Vec::new(), None);
    for line in section[..end].lines() {
        if let Some(lang) = line.strip_prefix("```") {
            fence = match fence {
                Some(_) => None,
                None => Some(lang.to_string()),
            };
            continue;
        }
        match (&fence, line.strip_prefix("    ")) {
            (Some(lang), _) if lang == "toml" => {
                toml.push_str(line);
                toml.push('\n');
            }
            (None, Some(command)) => block.push(command.to_string()),
            _ if !block.is_empty() => blocks.push(std::mem::take(&mut block)),
            _ => {}
        }
    }
    if !block.is_empty() {
        blocks.push(block);
    }
    (blocks, toml)
}

/// A line of the README as this test runs it.
struct Paste {
    binary: String,
    kafka: String,
    metrics: u16,
    tour: u16,
}

impl Paste {
    fn text(&self, text: &str) -> String {
        text.replace("scripts/demo.sh", &format!("{} demo", self.binary))
            .replace("target/release/modstream", &self.binary)
            .replace("127.0.0.1:PORT", &self.kafka)
            .replace("9464", &self.metrics.to_string())
            .replace("9465", &self.tour.to_string())
    }

    /// A block through bash in `dir`, bounded in time; its stdout.
    fn run(&self, lines: &[String], dir: &std::path::Path) -> String {
        let script = lines
            .iter()
            .map(|l| self.text(l))
            .collect::<Vec<_>>()
            .join("\n");
        let out = Command::new("timeout")
            .args(["120", "bash", "-c", &script])
            .current_dir(dir)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{script}\nstdout:\n{stdout}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }
}

/// The demo's stdout, line by line, until `until` (at most 120 s).
fn read_until(lines: &mpsc::Receiver<String>, seen: &mut String, until: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !seen.contains(until) {
        let line = lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("the demo did not print {until:?}:\n{seen}"));
        seen.push_str(&line);
        seen.push('\n');
    }
}

/// The count `uniq -c` printed for a verdict (0 if none).
fn count(uniq: &str, verdict: &str) -> u64 {
    uniq.lines()
        .find(|l| l.contains(&format!("\"verdict\":\"{verdict}\"")))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

struct Demo(Child);

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_readme_tour_runs_as_pasted() {
    let readme = std::fs::read_to_string(support::repo_root().join("README.md")).unwrap();
    let (blocks, toml) = tour(&readme);
    assert_eq!(blocks.len(), 5, "the tour's command blocks: {blocks:#?}");
    assert!(
        blocks[0][0].starts_with("scripts/demo.sh --rate"),
        "{blocks:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut paste = Paste {
        binary: env!("CARGO_BIN_EXE_modstream").to_string(),
        kafka: String::new(),
        metrics: support::free_port(),
        tour: support::free_port(),
    };

    // 1. The demo, paced, serving its metrics on a free port.
    let command = format!(
        "exec {} --listen 127.0.0.1:{}",
        paste.text(&blocks[0][0]),
        paste.metrics
    );
    let mut child = Command::new("bash")
        .args(["-c", &command])
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _demo = Demo(child);
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let mut seen = String::new();
    read_until(&lines, &mut seen, "pipeline joined");
    paste.kafka = seen
        .lines()
        .find_map(|l| l.strip_prefix("embedded Kafka at "))
        .expect("the demo prints its address")
        .trim()
        .to_string();

    // 2. One verdict as it is written.
    let verdict: serde_json::Value =
        serde_json::from_str(paste.run(&blocks[1], dir.path()).trim()).expect("one verdict");
    assert!(
        verdict["event_id"].is_string() && verdict["reason"]["rule"] == "default",
        "{verdict}"
    );

    // 3. Health and metrics.
    let health = paste.run(&blocks[2], dir.path());
    assert!(health.contains("\"ready\":true"), "{health}");
    assert!(
        health.contains("modstream_verdicts_total{verdict=\"allow\"}"),
        "{health}"
    );

    // 4. An instance of one's own, its thresholds changed live.
    std::fs::write(dir.path().join("tour.toml"), paste.text(&toml)).unwrap();
    let mut step = blocks[3].clone();
    step.push("echo ---".into());
    step.push("sed -i 's/review_at = 0.5/review_at = 0.005/; s/block_at = 0.85/block_at = 0.99/' tour.toml".into());
    step.extend(blocks[4].iter().cloned());
    step.push("kill %1; wait".into());
    let counts = paste.run(&step, dir.path());
    let (before, after) = counts.split_once("---\n").expect("both counts");
    assert_eq!(
        before
            .lines()
            .map(|l| count(l, "allow") + count(l, "block") + count(l, "review"))
            .sum::<u64>(),
        40,
        "{counts}"
    );
    // At 0.5 a review is rare (a score between 0.5 and 0.85); at 0.005
    // most benign posts' scores are above it.
    assert!(
        count(before, "review") <= 5 && count(after, "review") >= 10,
        "the reloaded thresholds judge the next posts: {counts}"
    );
}
