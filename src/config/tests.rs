//! Settings: defaults, refused properties, errors that name their key.

use super::*;

const MINIMAL: &str = r#"
    [kafka]
    bootstrap_servers = "127.0.0.1:9092"
    [input]
    topics = ["posts"]
    [output]
"#;

fn with(extra: &str) -> Result<Settings, ConfigError> {
    Settings::from_toml(&format!("{MINIMAL}\n{extra}"))
}

fn invalid_key(r: Result<Settings, ConfigError>) -> String {
    match r {
        Err(ConfigError::Invalid { key, .. }) => key,
        other => panic!("expected an invalid-config error, got {other:?}"),
    }
}

#[test]
fn minimal_config_gets_documented_defaults() {
    let s = with("").unwrap();
    assert_eq!(s.kafka.group_id, "modstream");
    assert_eq!(s.limits.max_payload_bytes, 256 * 1024);
    assert_eq!(s.limits.max_text_bytes, 64 * 1024);
    assert_eq!(s.output.dlq_topic, "moderation.dlq");
    assert_eq!(s.batching.max_batch_size, 64);
}

#[test]
fn the_metrics_listener_binds_loopback_by_default() {
    let s = with("").unwrap();
    assert!(s.telemetry.listen.ip().is_loopback());
    assert_eq!(s.telemetry.listen.port(), 9464);
}

#[test]
fn the_shipped_config_file_is_valid() {
    let text = include_str!("../../config/modstream.toml");
    let s = Settings::from_toml(text).unwrap();
    assert_eq!(s.input.topics, vec!["moderation.events".to_string()]);
    // Its [matching] section shows every default.
    assert_eq!(s.matching, super::MatchingSettings::default());
    assert_eq!(s.sampling, super::SamplingSettings::default());
}

#[test]
fn sampling_settings_are_checked() {
    for (section, key) in [
        ("[sampling]\nmin_rate = 0.0", "sampling.min_rate"),
        (
            "[sampling]\nmin_rate = 0.1\nmax_rate = 0.05",
            "sampling.max_rate",
        ),
        (
            "[sampling]\nmax_per_second = 0.0",
            "sampling.max_per_second",
        ),
        ("[sampling]\nmodel = \"nope\"", "sampling.model"),
    ] {
        assert_eq!(invalid_key(with(section)), key, "{section}");
    }
    assert!(with("[sampling]\nmodel = \"default\"").is_ok());
}

#[test]
fn matching_settings_are_checked() {
    let lists = r#"[matching]
        lists = [{ name = "spam", file = "a" }, { name = "spam", file = "b" }]"#;
    assert_eq!(invalid_key(with(lists)), "matching.lists.name");
    assert_eq!(
        invalid_key(with(
            "[matching]
list_similarity = 0"
        )),
        "matching.list_similarity"
    );
    assert_eq!(
        invalid_key(with(
            "[matching]
waves = true
wave_posts = 1"
        )),
        "matching.wave_posts"
    );
    let s = with(
        "[matching]
list_topic = \"lists\"
waves = true",
    )
    .unwrap();
    assert!(s.matching.enabled());
    assert_eq!(s.matching.list_names(), vec!["lists".to_string()]);
}

#[test]
fn topics_given_as_one_string_become_a_list() {
    let s = Settings::from_toml(&MINIMAL.replace(r#"["posts"]"#, r#""posts, comments""#)).unwrap();
    assert_eq!(
        s.input.topics,
        vec!["posts".to_string(), "comments".to_string()]
    );
}

#[test]
fn properties_that_break_at_least_once_are_refused() {
    let key = invalid_key(with(
        "[kafka.consumer]\n\"enable.auto.offset.store\" = true",
    ));
    assert_eq!(key, "kafka.consumer.enable.auto.offset.store");
    let key = invalid_key(with("[kafka.consumer]\nenable_auto_commit = \"true\""));
    assert_eq!(key, "kafka.consumer.enable.auto.commit");
    let key = invalid_key(with("[kafka.producer]\nacks = 1"));
    assert_eq!(key, "kafka.producer.acks");
    let key = invalid_key(with("[kafka.producer]\n\"enable.idempotence\" = false"));
    assert_eq!(key, "kafka.producer.enable.idempotence");
}

#[test]
fn harmless_properties_pass_through_with_dots() {
    let s = with("[kafka.consumer]\nfetch_wait_max_ms = 10\n\"client.id\" = \"x\"").unwrap();
    assert_eq!(
        s.kafka
            .consumer
            .get("fetch.wait.max.ms")
            .map(String::as_str),
        Some("10")
    );
    assert_eq!(
        s.kafka.consumer.get("client.id").map(String::as_str),
        Some("x")
    );
}

#[test]
fn drain_timeout_must_stay_below_session_timeout() {
    let key = invalid_key(
        with("[kafka.consumer]\n\"session.timeout.ms\" = 6000\n")
            .map(|mut s| {
                s.kafka.drain_timeout = Duration::from_secs(6);
                s
            })
            .and_then(|s| s.validate().map(|_| s)),
    );
    assert_eq!(key, "kafka.drain_timeout");
}

#[test]
fn the_consumer_group_protocol_is_allowed_without_classic_only_keys() {
    let kip848 = "[kafka.consumer]\n\"group.protocol\" = \"consumer\"\n";
    with(kip848).and_then(|s| s.validate().map(|_| s)).unwrap();
    assert_eq!(
        invalid_key(
            with(&format!("{kip848}\"session.timeout.ms\" = 6000\n"))
                .and_then(|s| s.validate().map(|_| s))
        ),
        "kafka.consumer.session.timeout.ms"
    );
    assert_eq!(
        invalid_key(
            with("[kafka.consumer]\n\"group.protocol\" = \"streams\"\n")
                .and_then(|s| s.validate().map(|_| s))
        ),
        "kafka.consumer.group.protocol"
    );
}

#[test]
fn a_latency_target_is_read_and_checked() {
    let s = with("[batching]\ntarget_p99 = \"50ms\"").unwrap();
    assert_eq!(s.batching.target_p99, Some(Duration::from_millis(50)));
    assert_eq!(with("").unwrap().batching.target_p99, None);
    assert_eq!(
        invalid_key(with("[batching]\ntarget_p99 = \"500us\"")),
        "batching.target_p99"
    );
}

#[test]
fn bad_values_name_their_key() {
    assert_eq!(
        invalid_key(with("[batching]\nmax_batch_size = 0")),
        "batching.max_batch_size"
    );
    assert_eq!(
        invalid_key(with("[batching]\nmax_batch_tokens = 8")),
        "batching.max_batch_tokens"
    );
    assert_eq!(
        invalid_key(with("[policy]\nreview_at = 0.9\nblock_at = 0.5")),
        "policy"
    );
    assert_eq!(
        invalid_key(with("[inference]\nexecution_providers = [\"tpu\"]")),
        "inference.execution_providers"
    );
    assert_eq!(
        invalid_key(with("[limits]\nmax_text_bytes = 999999999")),
        "limits.max_text_bytes"
    );
    let same = MINIMAL.replace("[output]", "[output]\ntopic = \"posts\"");
    assert_eq!(invalid_key(Settings::from_toml(&same)), "output.topic");
    assert_eq!(
        invalid_key(with("[inference]\nlength_buckets = [64, 16]")),
        "inference.length_buckets"
    );
    assert_eq!(
        invalid_key(with("[inference]\npad_to = \"max\"")),
        "inference.pad_to"
    );
    assert_eq!(
        invalid_key(with("[inference]\nrequire_gpu = true")),
        "inference.require_gpu",
        "require_gpu needs a GPU provider in the list"
    );
    assert_eq!(
        invalid_key(with(
            "[policy.labels.threat]\nreview_at = 0.6\nblock_at = 0.2"
        )),
        "policy.labels.threat"
    );
    let per_label = with("[policy.labels.threat]\nreview_at = 0.2\nblock_at = 0.5").unwrap();
    assert_eq!(per_label.policy.labels["threat"].block_at, 0.5);
}

#[test]
fn nested_property_tables_are_dotted_names_and_errors_show_no_value() {
    let s = with("[kafka.consumer.sasl]\npassword = \"hunter2\"\nusername = \"svc\"").unwrap();
    assert_eq!(
        s.kafka.consumer.get("sasl.password").map(String::as_str),
        Some("hunter2")
    );
    assert!(!s.redacted_dump().contains("hunter2"));
    let error = with("[kafka.consumer]\n\"sasl.password\" = [\"hunter2\"]")
        .expect_err("a list is not a property value");
    let text = format!("{error} {error:?}");
    assert!(!text.contains("hunter2"), "secret leaked: {text}");
    assert!(text.contains("sasl.password"), "{text}");
}

#[test]
fn secrets_never_show_in_dumps_or_debug_output() {
    let s = with("[kafka.consumer]\n\"sasl.password\" = \"hunter2\"\n\"sasl.username\" = \"svc\"\n[kafka.producer]\n\"ssl.key.password\" = \"pw2\"").unwrap();
    for text in [s.redacted_dump(), format!("{s:?}")] {
        assert!(
            !text.contains("hunter2") && !text.contains("pw2"),
            "secret leaked: {text}"
        );
        assert!(text.contains(REDACTED));
        assert!(text.contains("svc"), "non-secret values stay visible");
    }
    assert_eq!(
        s.kafka.consumer.get("sasl.password").map(String::as_str),
        Some("hunter2"),
        "librdkafka still gets it"
    );
}

#[test]
fn a_typo_in_a_choice_is_refused_with_the_allowed_values() {
    for (extra, want_key, allowed) in [
        (
            "[inference]\nexecution_providers = [\"cpu\", \"tpu\"]",
            "inference.execution_providers",
            "cpu, cuda, tensorrt",
        ),
        (
            "[inference]\npad_to = \"max\"",
            "inference.pad_to",
            "longest, bucket",
        ),
        (
            "[telemetry]\nlog_format = \"xml\"",
            "telemetry.log_format",
            "text, json",
        ),
    ] {
        match with(extra) {
            Err(ConfigError::Invalid { key, reason }) => {
                assert_eq!(key, want_key);
                assert!(reason.contains(allowed), "{key}: {reason}");
            }
            other => panic!("{extra}: expected an invalid-config error, got {other:?}"),
        }
    }
    let s = with("[inference]\nexecution_providers = [\"tensorrt\", \"cpu\"]").unwrap();
    assert_eq!(
        s.inference.execution_providers,
        vec![ExecutionProvider::Tensorrt, ExecutionProvider::Cpu]
    );
    // Dumped as written.
    assert!(s.redacted_dump().contains("\"tensorrt\""));
}

#[test]
fn workers_default_to_auto_and_take_a_number() {
    let s = with("").unwrap();
    assert_eq!(s.inference.workers, Workers::Auto);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(s.inference.worker_count(), cores.clamp(1, 64));
    let s = with("[inference]\nworkers = \"auto\"\nintra_threads = 64").unwrap();
    assert_eq!(s.inference.worker_count(), 1, "at least one");
    let s = with("[inference]\nworkers = 3").unwrap();
    assert_eq!(s.inference.worker_count(), 3);
    let s =
        with("[inference]\nworkers = \"auto\"\nexecution_providers = [\"cuda\", \"cpu\"]").unwrap();
    assert_eq!(s.inference.worker_count(), 1, "one per GPU until measured");
    assert_eq!(
        invalid_key(with("[inference]\nworkers = 0")),
        "inference.workers"
    );
    assert_eq!(
        invalid_key(with("[inference]\nworkers = \"many\"")),
        "inference.workers"
    );
    assert!(
        with("")
            .unwrap()
            .redacted_dump()
            .contains("\"workers\": \"auto\"")
    );
}

#[test]
fn unknown_keys_are_errors_not_ignored() {
    match with("[batching]\nmax_batch_sise = 3") {
        Err(ConfigError::Invalid { key, reason }) => {
            assert!(key.starts_with("batching"), "{key}");
            assert!(reason.contains("max_batch_sise"), "{reason}");
        }
        other => panic!("expected an invalid-config error, got {other:?}"),
    }
}

/// The file as a user writes it: a number in quotes, an unknown key, a
/// missing section each named with the file and the key.
#[test]
fn a_file_is_read_strictly_and_its_errors_name_the_file_and_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("my.toml");
    let load = |text: &str| {
        std::fs::write(&path, format!("{MINIMAL}\n{text}")).unwrap();
        Settings::load(Some(&path)).unwrap_err().to_string()
    };
    let e = load("[policy]\nreview_at = \"0.5\"");
    assert!(
        e.contains("policy.review_at") && e.contains("my.toml") && e.contains("string"),
        "{e}"
    );
    let e = load("[batching]\nmax_batch_sise = 3");
    assert!(e.contains("max_batch_sise") && e.contains("my.toml"), "{e}");
    let e = load("[kafka]\nbootstrap_servers = \"b:9092\"\n[input\n");
    assert!(
        e.contains("invalid configuration file") && e.contains("my.toml"),
        "{e}"
    );
    // No [input]: the key, the file and the environment variable named.
    std::fs::write(&path, "[kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n").unwrap();
    let e = Settings::load(Some(&path)).unwrap_err().to_string();
    assert!(
        e.contains("input.topics: required")
            && e.contains("my.toml")
            && e.contains("MODSTREAM__INPUT__TOPICS"),
        "{e}"
    );
    // A secret's value is not shown in a type error.
    let e = load("[schema_registry]\nurl = \"http://r\"\npassword = 12345");
    assert!(!e.contains("12345"), "{e}");
}

/// MINIMAL with these lines in `[kafka]`, and `extra` at the end.
fn kafka_with(kafka: &str, extra: &str) -> Result<Settings, ConfigError> {
    Settings::from_toml(&format!(
        "{}\n{extra}",
        MINIMAL.replace("[kafka]\n", &format!("[kafka]\n{kafka}\n"))
    ))
}

#[test]
fn exactly_once_refuses_what_would_break_it_and_names_its_transactional_id() {
    let eo = "delivery = \"exactly_once\"\ninstance_id = \"pod-0\"";
    let s = kafka_with(eo, "").unwrap();
    assert!(s.kafka.exactly_once());
    assert_eq!(s.kafka.transactional_id(), "modstream.pod-0");
    assert!(
        !with("").unwrap().kafka.exactly_once(),
        "at-least-once by default"
    );
    let cases = [
        (
            "[kafka.consumer]\n\"isolation.level\" = \"read_uncommitted\"",
            "kafka.consumer.isolation.level",
        ),
        (
            "[kafka.producer]\n\"transactional.id\" = \"x\"",
            "kafka.producer.transactional.id",
        ),
        (
            "[kafka.producer]\n\"message.timeout.ms\" = \"60000\"",
            "kafka.producer.message.timeout.ms",
        ),
    ];
    for (extra, key) in cases {
        assert_eq!(invalid_key(kafka_with(eo, extra)), key, "{extra}");
    }
    let short = format!("{eo}\ntransaction_timeout = \"1s\"\ncommit_interval = \"2s\"");
    assert_eq!(
        invalid_key(kafka_with(&short, "")),
        "kafka.transaction_timeout"
    );
    let bad_id = "delivery = \"exactly_once\"\ninstance_id = \"a b\"";
    assert_eq!(invalid_key(kafka_with(bad_id, "")), "kafka.instance_id");
    // Without exactly-once, a read_uncommitted consumer is the user's choice.
    assert!(with("[kafka.consumer]\n\"isolation.level\" = \"read_uncommitted\"").is_ok());
}

#[test]
fn a_mapping_with_a_bad_source_or_an_unknown_topic_is_refused_with_its_key() {
    let load = |input: &str| {
        Settings::from_toml(&format!(
            "[kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n[input]\ntopics = [\"posts\"]\n{input}"
        ))
    };
    let err = load("[input.mapping]\nid = \"post.id\"")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("input.mapping.id") && err.contains("JSON pointer"),
        "{err}"
    );
    let err = load("[input.mapping]\ntext = []").unwrap_err().to_string();
    assert!(err.contains("input.mapping.text"), "{err}");
    let err = load("[[input.mappings]]\ntopics = [\"other\"]\nid = \"/id\"")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("input.mappings[0].topics") && err.contains("\"other\""),
        "{err}"
    );
    let err = load("[input.mapping]\ncreated_at_unit = \"hours\"").unwrap_err();
    let err = err.to_string();
    assert!(err.contains("created_at_unit"), "{err}");
    assert!(
        load("[input.mapping]\nid = \"header:x-id\"\ntext = [\"/a\", \"/b\"]\nlang = \"\"").is_ok()
    );
}

#[test]
fn session_options_default_as_measured_and_unknown_values_are_refused() {
    let s = with("").unwrap();
    assert_eq!(
        s.inference.session,
        SessionOptions {
            graph_optimization: GraphOptimization::All,
            spinning: false,
            memory_arena: MemoryArena::Auto,
        }
    );
    let s = with("[inference.session]\ngraph_optimization = \"basic\"\nspinning = true\nmemory_arena = \"off\"").unwrap();
    assert_eq!(
        s.inference.session.graph_optimization,
        GraphOptimization::Basic
    );
    assert!(s.inference.session.spinning);
    assert_eq!(s.inference.session.memory_arena, MemoryArena::Off);
    let e = with("[inference.session]\ngraph_optimization = \"max\"").unwrap_err();
    assert!(
        e.to_string().contains("disabled, basic, extended, all"),
        "{e}"
    );
    assert!(with("[inference.session]\nthreads = 2").is_err());
}

/// The shipped file writes out every key that has a default (keys without
/// one are shown commented out), in every section: a key added to the code
/// and not to the file is caught here.
#[test]
fn the_shipped_config_file_sets_every_key_with_a_default() {
    let text = include_str!("../../config/modstream.toml");
    let shipped: toml::Table = toml::from_str(text).unwrap();
    let defaults: toml::Table =
        toml::from_str(&toml::to_string(&Settings::from_toml(text).unwrap()).unwrap()).unwrap();
    fn missing(path: &str, want: &toml::Table, got: &toml::Table, out: &mut Vec<String>) {
        for (k, v) in want {
            let key = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            match (v, got.get(k)) {
                (toml::Value::Table(w), Some(toml::Value::Table(g))) => missing(&key, w, g, out),
                (_, Some(_)) => {}
                // Tables of maps (kafka.consumer, ...) and lists are the user's.
                (toml::Value::Table(w), None) if w.is_empty() => {}
                (toml::Value::Array(a), None) if a.is_empty() => {}
                (_, None) => out.push(key),
            }
        }
    }
    let mut out = Vec::new();
    missing("", &defaults, &shipped, &mut out);
    assert!(
        out.is_empty(),
        "keys with a default not in config/modstream.toml: {out:?}"
    );
}
