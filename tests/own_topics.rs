//! A user's own topics and shape on Apache Kafka, as docs/inputs.md's "A
//! nested shape, end to end" shows them: its configuration and policy
//! files written as shown (the brokers replaced), in a folder of their own,
//! and its commands run as shown from another directory: `topics create`,
//! `run --until-caught-up`, `explain`. Beside them, the mistakes of a first
//! hour: a policy that names its one model other than `default`, and an
//! input topic one letter off an existing one.

mod support;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::Broker;

/// The section's blocks: the event (JSON), my.toml and policy.toml (by
/// their first lines), and its command lines.
struct Section {
    event: String,
    config: String,
    policy: String,
    commands: Vec<String>,
}

fn section() -> Section {
    let page = std::fs::read_to_string(support::repo_root().join("docs/inputs.md")).unwrap();
    let start = page
        .find("### A nested shape, end to end")
        .expect("the section");
    let rest = &page[start..];
    let end = rest[4..].find("\n### ").map_or(rest.len(), |i| i + 4);
    let (mut fenced, mut commands) = (Vec::new(), Vec::new());
    let mut block: Option<(String, String)> = None;
    for line in rest[..end].lines() {
        if let Some(lang) = line.strip_prefix("```") {
            match block.take() {
                Some(b) => fenced.push(b),
                None => block = Some((lang.to_string(), String::new())),
            }
            continue;
        }
        match (&mut block, line.strip_prefix("    ")) {
            (Some((_, body)), _) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, Some(command)) => commands.push(command.to_string()),
            _ => {}
        }
    }
    let find = |lang: &str, first: &str| {
        (fenced.iter())
            .find(|(l, body)| l == lang && body.starts_with(first))
            .map(|(_, body)| body.clone())
            .unwrap_or_else(|| panic!("a {lang} block starting {first:?}"))
    };
    Section {
        event: find("json", "{"),
        config: find("toml", "# my.toml"),
        policy: find("toml", "# policy.toml"),
        commands,
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A command line of the page, run through bash from `dir` with the built
/// binary for `modstream` and `config` for `my.toml`.
fn paste(line: &str, dir: &Path, config: &Path) -> Output {
    let line = line
        .replacen(
            "modstream ",
            &format!("{} ", support::modstream_binary().display()),
            1,
        )
        .replace(
            "--config my.toml",
            &format!("--config {}", config.display()),
        );
    let mut child = Command::new("bash")
        .args(["-c", &line])
        .current_dir(dir)
        .env("RUST_LOG", "modstream=info")
        // The page's runs serve /metrics on 9464: here, a free port.
        .env("MODSTREAM__TELEMETRY__LISTEN", "127.0.0.1:0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: a run that does not stop by itself is killed and fails.
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.wait_with_output().unwrap()
}

/// Posts in the page's shape: `p-1` to `p-{n}`, account ages 0 to 4 days,
/// keyed by author.
fn posts(example: &str, n: usize) -> Vec<(String, String, Vec<u8>)> {
    let shape: serde_json::Value = serde_json::from_str(example).unwrap();
    let samples = modstream::tools::generator::sample_posts();
    (1..=n)
        .map(|i| {
            let mut post = shape.clone();
            let id = format!("p-{i}");
            post["post"]["id"] = id.clone().into();
            post["post"]["body"] = samples[i % samples.len()].1.into();
            post["author"]["uid"] = format!("u-{}", i % 10).into();
            post["author"]["age_days"] = (i % 5).into();
            let key = format!("u-{}", i % 10);
            (id, key, post.to_string().into_bytes())
        })
        .collect()
}

#[test]
fn the_nested_shape_page_runs_as_shown_from_another_directory() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let page = section();
    assert_eq!(page.commands.len(), 3, "{:?}", page.commands);
    let root = tempfile::tempdir().unwrap();
    let (conf, elsewhere) = (root.path().join("conf"), root.path().join("elsewhere"));
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    let config = conf.join("my.toml");
    std::fs::write(&config, page.config.replace("127.0.0.1:9092", &bootstrap)).unwrap();
    std::fs::write(conf.join("policy.toml"), &page.policy).unwrap();

    // The topics, then again: what exists is said, not created twice.
    let out = paste(&page.commands[0], &elsewhere, &config);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    for line in [
        "created  feed.posts.v2 (input.topics): 4 partitions",
        "created  trust.verdicts (output.topic): 4 partitions",
        "created  trust.dlq (output.dlq_topic): 4 partitions",
    ] {
        assert!(said.contains(line), "{line:?} in {said}");
    }
    let again = paste(&page.commands[0], &elsewhere, &config);
    assert!(
        text(&again).contains("exists   feed.posts.v2 (input.topics): 4 partitions"),
        "{}",
        text(&again)
    );
    let dry = paste(
        &format!("{} --dry-run", page.commands[0]),
        &elsewhere,
        &config,
    );
    assert!(
        text(&dry).contains(&format!(
            "kafka-topics.sh --bootstrap-server {bootstrap} --create --if-not-exists --topic trust.verdicts --partitions 4"
        )),
        "{}",
        text(&dry)
    );

    // The backlog judged once: the run stops by itself, exit 0.
    let posts = posts(&page.event, 200);
    support::produce_to(&bootstrap, "feed.posts.v2", &posts);
    let out = paste(&page.commands[1], &elsewhere, &config);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("caught up: consumed 200, verdicts 200, dead letters 0"),
        "{said}"
    );
    let verdicts = modstream::tools::read::read_topic(
        &bootstrap,
        "trust.verdicts",
        4,
        200,
        Duration::from_secs(30),
    )
    .unwrap();
    let mut rules = std::collections::HashMap::new();
    for v in verdicts.iter().filter_map(|r| r.json()) {
        let id = v["event_id"].as_str().unwrap().to_string();
        rules.insert(
            id,
            v["reason"]["rule"].as_str().unwrap_or_default().to_string(),
        );
    }
    assert_eq!(rules.len(), 200, "one verdict per post");
    for i in 1..=200 {
        // metadata = "/author": the account's age reaches the policy.
        let want = if i % 5 <= 2 {
            "new-accounts"
        } else {
            "default"
        };
        assert_eq!(rules[&format!("p-{i}")], want, "p-{i}");
    }
    // Run again: nothing past the committed offsets, nothing judged twice.
    let out = paste(&page.commands[1], &elsewhere, &config);
    assert!(
        text(&out).contains("caught up: consumed 0, verdicts 0"),
        "{}",
        text(&out)
    );

    // One post explained from the same directory, with the same files.
    let out = paste(&page.commands[2], &elsewhere, &config);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("new-accounts"), "p-1's rule: {said}");

    broker.create_topic("trust.rescored", 4);
    a_model_beside_the_config_is_found_by_rescore(&conf, &elsewhere, &page, &bootstrap);
    a_policy_naming_its_one_model_otherwise_lists_its_name(&conf, &elsewhere, &page);
    a_misspelt_input_topic_says_did_you_mean(&conf, &elsewhere, &page, &bootstrap);
}

/// `rescore` (which judges by `[policy]`'s thresholds) from another
/// directory, with `model_dir = "model"`: the model beside the
/// configuration file, not in the directory the command runs in.
fn a_model_beside_the_config_is_found_by_rescore(
    conf: &Path,
    dir: &Path,
    page: &Section,
    bootstrap: &str,
) {
    let model = conf.join("model");
    std::fs::create_dir_all(&model).unwrap();
    for file in ["manifest.json", "model.onnx"] {
        let shipped = support::repo_root()
            .join("models/profanity-check")
            .join(file);
        std::fs::copy(shipped, model.join(file)).unwrap();
    }
    let rescore = conf.join("rescore.toml");
    std::fs::write(
        &rescore,
        page.config.replace("127.0.0.1:9092", bootstrap).replace(
            "[policy]\nfile = \"policy.toml\"\n",
            "[inference]\nmodel_dir = \"model\"\n",
        ),
    )
    .unwrap();
    let out = paste(
        "modstream rescore --config my.toml --topic feed.posts.v2 --from 0 --output-topic trust.rescored --json",
        dir,
        &rescore,
    );
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {said}"));
    assert_eq!(report["events"], 200, "{said}");
}

/// `models.profanity` where the one model is `default`: the start refuses
/// it naming the model's name and how to write it.
fn a_policy_naming_its_one_model_otherwise_lists_its_name(conf: &Path, dir: &Path, page: &Section) {
    std::fs::write(
        conf.join("wrong-policy.toml"),
        page.policy.replace("models.default.", "models.profanity."),
    )
    .unwrap();
    let wrong = conf.join("wrong.toml");
    std::fs::write(
        &wrong,
        page.config.replace("policy.toml", "wrong-policy.toml"),
    )
    .unwrap();
    let out = paste("modstream run --config my.toml", dir, &wrong);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("models.profanity")
            && said.contains("named \"default\"")
            && said.contains("write models.default.LABEL"),
        "{said}"
    );
}

/// `feed.post.v2` beside an existing `feed.posts.v2`: the log and
/// /readyz say "did you mean feed.posts.v2".
fn a_misspelt_input_topic_says_did_you_mean(
    conf: &Path,
    dir: &Path,
    page: &Section,
    bootstrap: &str,
) {
    let typo = conf.join("typo.toml");
    std::fs::write(
        &typo,
        format!(
            "{}[telemetry]\nlisten = \"127.0.0.1:0\"\n",
            page.config
                .replace("127.0.0.1:9092", bootstrap)
                .replace("\"feed.posts.v2\"", "\"feed.post.v2\"")
                .replace("group_id = \"trust\"", "group_id = \"trust-typo\"")
        ),
    )
    .unwrap();
    let log_path = dir.join("typo.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let child = Command::new(support::modstream_binary())
        .args(["run", "--config"])
        .arg(&typo)
        .current_dir(dir)
        .env("RUST_LOG", "modstream=info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut service = support::Modstream::adopt(child, "typo");
    let deadline = Instant::now() + Duration::from_secs(60);
    let (port, logged) = loop {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        let port = (log.lines())
            .find(|l| l.contains("serving /metrics"))
            .and_then(|l| l.split("127.0.0.1:").nth(1))
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|p| p.parse::<u16>().ok());
        if let (Some(port), true) = (port, log.contains("did you mean feed.posts.v2")) {
            break (port, log);
        }
        assert!(Instant::now() < deadline, "no port or hint in: {log}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        logged.contains("feed.post.v2 (did you mean feed.posts.v2?)"),
        "{logged}"
    );
    let (status, body) = support::http_get(port, "/readyz");
    assert_eq!(status, 503, "{body}");
    let ready: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        ready["input_did_you_mean"]["feed.post.v2"], "did you mean feed.posts.v2",
        "{body}"
    );
    service.kill9();
}
