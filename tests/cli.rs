//! The `modstream` binary as a user runs it: failures at start are one clear
//! line and a non-zero exit, before anything is consumed.

mod support;

use std::process::Command;

fn modstream() -> Command {
    Command::new(env!("CARGO_BIN_EXE_modstream"))
}

#[test]
fn a_missing_runtime_library_fails_with_one_line_naming_the_script() {
    let out = modstream()
        .args(["check-model", "hello"])
        .env("ORT_DYLIB_PATH", "/nonexistent/libonnxruntime.so.1.31.1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("scripts/fetch-onnxruntime.sh"), "{stderr}");
}

#[test]
fn invalid_config_names_the_key_and_connects_to_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n[input]\ntopics = [\"posts\"]\n[kafka.consumer]\n\"enable.auto.offset.store\" = true\n",
    )
    .unwrap();
    let out = modstream()
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("kafka.consumer.enable.auto.offset.store"),
        "{stderr}"
    );
}

#[test]
fn a_bad_policy_file_fails_at_start_naming_the_rule_and_rescore_refuses_one() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    std::fs::write(
        &policy,
        "version = \"v1\"\n[[rules]]\nid = \"kids\"\nwhen = { tenant = \"kids\" }\nmodels.default.toxic = { review_at = 0.2, block_at = 0.5 }\n[[rules]]\nid = \"default\"\nmodels.default.offensive = { review_at = 0.5, block_at = 0.85 }\n",
    )
    .unwrap();
    let path = dir.path().join("modstream.toml");
    std::fs::write(
        &path,
        format!("[kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n[input]\ntopics = [\"posts\"]\n[policy]\nfile = {policy:?}\n"),
    )
    .unwrap();
    // The shipped model has no label "toxic": refused before any connection,
    // and before the metrics listener binds (its port is taken here, as by
    // another modstream on the same machine).
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let out = modstream()
        .args(["run", "--config"])
        .arg(&path)
        .env("MODSTREAM__TELEMETRY__LISTEN", format!("127.0.0.1:{port}"))
        .output()
        .unwrap();
    drop(taken);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("cannot listen"), "{stderr}");
    assert!(
        stderr.contains("rules[0] (\"kids\").models.default.toxic"),
        "{stderr}"
    );
    assert!(stderr.contains("has no label \"toxic\""), "{stderr}");
    let out = modstream()
        .args([
            "rescore",
            "--topic",
            "posts",
            "--from",
            "0",
            "--output-topic",
            "again",
            "--config",
        ])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("rescore does not apply yet"));
}

#[test]
fn a_missing_model_fails_at_start_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let out = modstream()
        .args(["check-model", "--model"])
        .arg(dir.path())
        .arg("hello")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("manifest.json"), "{stderr}");
}

#[test]
fn env_vars_override_the_file_and_topics_may_be_one_string() {
    let out = modstream()
        .args(["run", "--config", "config/modstream.toml", "--print-config"])
        .env("MODSTREAM__INPUT__TOPICS", "posts, comments")
        .env("MODSTREAM__BATCHING__MAX_BATCH_SIZE", "7")
        .env("MODSTREAM__KAFKA__CONSUMER__SASL_PASSWORD", "hunter2")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        config["input"]["topics"],
        serde_json::json!(["posts", "comments"])
    );
    assert_eq!(config["batching"]["max_batch_size"], 7);
    assert_eq!(config["kafka"]["consumer"]["sasl.password"], "<redacted>");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("hunter2"));
}

/// A value of the wrong type from the environment names its key (found by
/// its path in the settings, not by reading the configuration library's
/// error text).
#[test]
fn an_env_value_of_the_wrong_type_names_its_key() {
    for (var, value, key) in [
        (
            "MODSTREAM__BATCHING__MAX_BATCH_SIZE",
            "lots",
            "batching.max_batch_size",
        ),
        ("MODSTREAM__KAFKA__DELIVERY", "twice", "kafka.delivery"),
    ] {
        let out = modstream()
            .args(["run", "--config", "config/modstream.toml", "--print-config"])
            .env(var, value)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(
            stderr.contains(&format!("invalid configuration: {key}: ")),
            "{var}={value}: {stderr}"
        );
    }
}

#[test]
fn a_corrupt_model_fails_at_start_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        "models/profanity-check/manifest.json",
        dir.path().join("manifest.json"),
    )
    .unwrap();
    std::fs::write(dir.path().join("model.onnx"), b"this is not an ONNX model").unwrap();
    let out = modstream()
        .args(["check-model", "--model"])
        .arg(dir.path())
        .arg("hello")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("modstream: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains("cannot load model") && errors[0].contains("model.onnx"),
        "{stderr}"
    );
}

#[test]
fn require_gpu_without_a_usable_gpu_fails_with_the_reason() {
    // The test command fetches the CPU build of ONNX Runtime: CUDA cannot
    // register, so the run must stop instead of falling back. On a GPU
    // build with a usable GPU the same command must run on CUDA instead.
    let out = modstream()
        .args([
            "check-model",
            "--providers",
            "cuda,cpu",
            "--require-gpu",
            "hello",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if stdout.contains("provider CUDAExecutionProvider") {
        // A GPU build with a usable GPU: require_gpu is met, and it scores.
        assert!(out.status.success(), "{stdout}");
        assert!(stdout.contains("hello"), "the text is scored: {stdout}");
        return;
    }
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("require_gpu") && stderr.contains("cuda"),
        "{stderr}"
    );
    // Without require_gpu the same command falls back to CPU and scores.
    let out = modstream()
        .args(["check-model", "--providers", "cuda,cpu", "hello"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("provider CPUExecutionProvider"), "{stdout}");
    // And it prints where the model's nodes ran: all on the CPU here.
    assert!(
        stdout.contains("placement (node runs of the warm-up by provider and op type):")
            && stdout.contains("    CPUExecutionProvider: ")
            && !stdout.contains("CUDAExecutionProvider:"),
        "{stdout}"
    );
}

/// Every way of passing a secret (file, env with `_` or nested `__`, a
/// malformed value) works or fails without the value in any output.
#[test]
fn a_secret_never_shows_in_any_output() {
    let dir = tempfile::tempdir().unwrap();
    let base = "[kafka]\nbootstrap_servers = \"127.0.0.1:9\"\n[input]\ntopics = [\"posts\"]";
    let secret = "hunter2-5e5b";
    let run = |file_extra: &str, env: &[(&str, &str)]| {
        let path = dir.path().join("c.toml");
        std::fs::write(&path, format!("{base}\n{file_extra}")).unwrap();
        let mut cmd = modstream();
        cmd.args(["run", "--config"])
            .arg(&path)
            .arg("--print-config");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    // (file lines, environment, whether the configuration is valid)
    type Way<'a> = (String, Vec<(&'a str, &'a str)>, bool);
    let ways: Vec<Way> = vec![
        (
            format!("[kafka.producer]\n\"sasl.password\" = \"{secret}\""),
            vec![],
            true,
        ),
        (
            format!("[kafka.producer.sasl]\npassword = \"{secret}\""),
            vec![],
            true,
        ),
        (
            String::new(),
            vec![("MODSTREAM__KAFKA__CONSUMER__SASL_PASSWORD", secret)],
            true,
        ),
        (
            String::new(),
            vec![("MODSTREAM__KAFKA__CONSUMER__SASL__PASSWORD", secret)],
            true,
        ),
        (
            format!("[kafka.producer]\n\"sasl.password\" = [\"{secret}\"]"),
            vec![],
            false,
        ),
    ];
    for (file_extra, env, valid) in ways {
        let out = run(&file_extra, &env);
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.success(), valid, "{file_extra} {env:?}: {all}");
        assert!(
            !all.contains(secret),
            "secret leaked ({file_extra} {env:?}): {all}"
        );
        if valid {
            let config: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let section = if env.is_empty() {
                "producer"
            } else {
                "consumer"
            };
            assert_eq!(
                config["kafka"][section]["sasl.password"], "<redacted>",
                "{all}"
            );
        } else {
            assert!(all.contains("sasl.password"), "names the key: {all}");
        }
    }
}

/// `modstream demo --rate R --seconds S`: paced, /metrics served while it
/// runs, latency reported after the pipeline joined.
#[test]
fn the_paced_demo_serves_metrics_while_it_runs() {
    let port = support::free_port();
    let child = modstream()
        .args(["demo", "--rate", "300", "--seconds", "6", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut scraped = 0.0;
    while scraped == 0.0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(300));
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            continue;
        }
        let body = support::http_get(port, "/metrics").1;
        scraped = body
            .lines()
            .filter(|l| l.starts_with("modstream_verdicts_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
    }
    assert!(
        scraped > 0.0,
        "/metrics counted verdicts while the demo ran"
    );
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!("http://127.0.0.1:{port}/metrics")),
        "{text}"
    );
    assert!(text.contains("after the pipeline joined"), "{text}");
    let sent = text
        .lines()
        .find_map(|l| l.strip_prefix("sent             "))
        .unwrap();
    assert!(sent.starts_with("1800 events"), "{sent}");
}

/// Ctrl-C on the paced demo (no `--seconds`): the sending stops, the
/// pipeline finishes what was sent, the summary is printed, exit 0.
#[test]
fn ctrl_c_on_the_paced_demo_finishes_what_was_sent_and_exits_0() {
    use std::io::BufRead;
    let port = support::free_port();
    let mut child = modstream()
        .args(["demo", "--rate", "300", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = lines_tx.send(line);
        }
    });
    let mut text = String::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    // Three progress lines after the pipeline joined, then Ctrl-C.
    while text.matches(" sent ").count() < 3 {
        let line = lines
            .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
            .expect("the demo prints its progress");
        text.push_str(&line);
        text.push('\n');
    }
    let pid = child.id().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap()
            .success()
    );
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "exits after Ctrl-C"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    while let Ok(line) = lines.recv_timeout(std::time::Duration::from_secs(2)) {
        text.push_str(&line);
        text.push('\n');
    }
    println!("{text}");
    assert!(status.success(), "exit 0 after Ctrl-C: {status:?}\n{text}");
    assert!(text.contains("Ctrl-C: sending stopped"), "{text}");
    let valid: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("sent             "))
        .and_then(|l| l.split('(').nth(1)?.split(' ').next()?.parse().ok())
        .expect("the summary's sent line");
    let verdicts: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("verdicts         "))
        .and_then(|l| l.split(' ').next()?.parse().ok())
        .expect("the summary's verdicts line");
    assert!(
        valid > 0 && verdicts == valid,
        "every event sent judged: {verdicts} of {valid}"
    );
}

/// `normalize` prints the normal form and the hash a list item may give
/// in its place; a list file naming that hash matches the evaded text, and
/// a wrong list file stops the start naming its line.
#[test]
fn normalize_prints_the_form_and_hash_lists_match_and_a_wrong_list_stops_the_start() {
    let out = modstream()
        .args(["normalize", "Ｆｒｅｅ Mоney!!! 🔥"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0], "normal form  free money",
        "each line says what it is"
    );
    let hash = lines[1].strip_prefix("hash         ").unwrap_or_default();
    assert!(
        hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()),
        "{text}"
    );
    let again = modstream()
        .args(["normalize", "free money"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&again.stdout),
        text,
        "the same form, the same hash"
    );

    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("spam.jsonl");
    std::fs::write(&list, "{\"id\": \"a\", \"verdict\": \"block\", \"label\": \"spam\", \"text\": \"buy now\"}\n{\"id\": \"b\", \"verdict\": \"maybe\", \"label\": \"x\", \"text\": \"t\"}\n").unwrap();
    let config = dir.path().join("m.toml");
    std::fs::write(
        &config,
        format!(
            "[kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n[input]\ntopics = [\"posts\"]\n[inference]\nmodel_dir = {:?}\n[matching]\nlists = [{{ name = \"spam\", file = {:?} }}]\n",
            support::repo_root().join("models/profanity-check"),
            list
        ),
    )
    .unwrap();
    let out = modstream()
        .args(["run", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("line 2") && stderr.contains("verdict \"maybe\""),
        "{stderr}"
    );
}

#[test]
fn a_sampling_label_the_model_lacks_fails_at_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("modstream.toml");
    std::fs::write(
        &path,
        "[kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n[input]\ntopics = [\"posts\"]\n[output]\nsamples_topic = \"samples\"\n[sampling]\nlabel = \"toxic\"\n",
    )
    .unwrap();
    let out = modstream()
        .args(["run", "--config"])
        .arg(&path)
        .env("MODSTREAM__TELEMETRY__LISTEN", "127.0.0.1:0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("sampling.label") && stderr.contains("\"toxic\""),
        "{stderr}"
    );
}

/// `modstream demo` piped to a file or a CI log (stderr not a terminal)
/// prints whole lines: no carriage return rewrites a line there. (400
/// events, 4 of them malformed: 396 verdicts.)
#[test]
fn the_demo_piped_prints_whole_lines() {
    let out = modstream()
        .args(["demo", "--events", "400", "--max-seconds", "120"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains('\r'), "a carriage return in: {stderr:?}");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("verdicts ") && l.contains("/396")),
        "{stderr}"
    );
}

/// docs/configuration.md's example of a value of the wrong type, as a
/// user meets it: the key, the type in words ("a number", not Rust's
/// `f32`) and the file; a fraction where a count goes is "a whole number".
#[test]
fn a_value_of_the_wrong_type_is_said_in_the_users_words() {
    let page = std::fs::read_to_string(support::repo_root().join("docs/configuration.md")).unwrap();
    let example = page
        .split('`')
        .find(|span| span.starts_with("invalid configuration: policy.review_at: invalid type"))
        .expect("the page's example")
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    let required = "[kafka]\nbootstrap_servers = \"127.0.0.1:9\"\n[input]\ntopics = [\"posts\"]\n";
    for (body, said) in [
        ("[policy]\nreview_at = \"0.5\"\n", example.as_str()),
        (
            "[batching]\nmax_batch_size = 1.5\n",
            "invalid configuration: batching.max_batch_size: invalid type: floating point `1.5`, expected a whole number (in my.toml)",
        ),
    ] {
        std::fs::write(dir.path().join("my.toml"), format!("{required}{body}")).unwrap();
        let out = modstream()
            .current_dir(dir.path())
            .args(["run", "--config", "my.toml", "--print-config"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains(said), "{said:?} in {stderr}");
    }
}
