//! A user's first hour with the binary: their own model given a manifest
//! by `init-model`, the commands run from another directory, and the
//! failures of a first configuration (a broker that cannot be reached, a
//! port in use) each said once, with its cause and the key to change.

mod support;

use std::path::Path;
use std::process::{Command, Output};

fn modstream(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_modstream"));
    command.current_dir(dir);
    command
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// my.toml in `dir`: the brokers, `kafka` lines more, the topics, `extra`.
fn config(dir: &Path, bootstrap: &str, kafka: &str, extra: &str) {
    std::fs::write(
        dir.join("my.toml"),
        format!("[kafka]\nbootstrap_servers = \"{bootstrap}\"\n{kafka}[input]\ntopics = [\"posts\"]\n{extra}"),
    )
    .unwrap();
}

/// A Hugging Face classifier's folder (the MiniLM model the tests build,
/// without its manifest): `init-model` writes a manifest that loads, with
/// the defaults it took said, and `check-model` scores texts with it as
/// with the project's own manifest.
#[test]
fn init_model_writes_a_manifest_that_check_model_loads() {
    let root = support::repo_root();
    let built = root.join("models/minilm-l6");
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("my-model");
    std::fs::create_dir(&model).unwrap();
    std::os::unix::fs::symlink(built.join("model.onnx"), model.join("model.onnx")).unwrap();
    for f in ["tokenizer.json", "config.json"] {
        std::fs::copy(built.join(f), model.join(f)).unwrap();
    }
    let out = modstream(dir.path())
        .args(["check-model", "--model", "my-model", "hello"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out).contains("init-model"),
        "the error says how to write one: {}",
        text(&out)
    );

    let out = modstream(dir.path())
        .args(["init-model", "my-model"])
        .output()
        .unwrap();
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("default taken: max_length 128")
            && said.contains("default taken: score_label \"offensive\"")
            && said.contains("wrote my-model/manifest.json"),
        "{said}"
    );
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("manifest.json")).unwrap())
            .unwrap();
    let shipped: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(built.join("manifest.json")).unwrap())
            .unwrap();
    // The project's manifest leaves the labels to config.json, as a user may.
    assert_eq!(written["labels"], serde_json::json!(["clean", "offensive"]));
    for key in [
        "input_kind",
        "inputs",
        "output",
        "score_label",
        "max_length",
    ] {
        assert_eq!(written[key], shipped[key], "{key}: {written}");
    }
    // Not written over without --force.
    let again = modstream(dir.path())
        .args(["init-model", "my-model"])
        .output()
        .unwrap();
    assert!(
        text(&again).contains("exists; not written"),
        "{}",
        text(&again)
    );

    let texts = ["you are all wonderful", "shut up you stupid idiot"];
    let score = |dir: &Path, model: &Path| {
        let out = modstream(dir)
            .args(["check-model", "--model"])
            .arg(model)
            .args(texts)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| texts.iter().any(|t| l.contains(t)))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let mine = score(dir.path(), Path::new("my-model"));
    assert_eq!(mine.len(), 2, "{mine:?}");
    assert_eq!(
        mine,
        score(&root, &built),
        "the same scores as the project's manifest"
    );
}

/// The defaults that are paths in the repository work from any directory:
/// `check-model` finds the shipped model, `plan` the shipped report and
/// says it is the project's, not the user's.
#[test]
fn check_model_and_plan_work_outside_the_repository() {
    let dir = tempfile::tempdir().unwrap();
    let out = modstream(dir.path())
        .args(["check-model", "free money"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let out = modstream(dir.path())
        .args(["plan", "--rate", "1000"])
        .output()
        .unwrap();
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.starts_with("From the shipped bench report ") && said.contains("not yours"),
        "{said}"
    );
}

/// A broker that cannot be reached: the start gives up after
/// kafka.startup_timeout naming the cause (not "all brokers are down"),
/// and librdkafka's line for each attempt, from each client, through
/// both its callbacks, is logged once.
#[test]
fn an_unreachable_broker_is_said_once_with_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    let closed = format!("127.0.0.1:{}", support::free_port());
    config(
        dir.path(),
        &closed,
        "startup_timeout = \"4s\"\n",
        "[telemetry]\nlisten = \"127.0.0.1:0\"\n",
    );
    let out = modstream(dir.path())
        .args(["run", "--config", "my.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = text(&out);
    let last = said.trim().lines().last().unwrap_or_default();
    assert!(
        last.contains("cannot reach Kafka")
            && last.contains("kafka.startup_timeout")
            && last.contains("Connection refused"),
        "{said}"
    );
    // One attempt every ~0.5 s for 4 s, from two clients, through two
    // callbacks: dozens of lines without the gate; one, and the error.
    let refused = said
        .lines()
        .filter(|l| l.contains("Connection refused"))
        .count();
    assert!(refused <= 3, "{refused} lines say it:\n{said}");
}

/// A port in use names the key that sets it.
#[test]
fn a_busy_metrics_port_names_telemetry_listen() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    config(
        dir.path(),
        "127.0.0.1:1",
        "",
        &format!("[telemetry]\nlisten = \"{addr}\"\n"),
    );
    let out = modstream(dir.path())
        .args(["run", "--config", "my.toml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = text(&out);
    assert!(
        said.contains(&format!("cannot listen on {addr}")) && said.contains("telemetry.listen"),
        "{said}"
    );
}

/// `modstream bench --help` names the command a user types.
#[test]
fn bench_help_names_modstream_bench() {
    let out = Command::new(env!("CARGO_BIN_EXE_modstream"))
        .args(["bench", "-h"])
        .output()
        .unwrap();
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("Usage: modstream bench"), "{said}");
    // Every option says what it is: beside it, or on the next line.
    let lines: Vec<&str> = said.lines().collect();
    let bare: Vec<&str> = (0..lines.len())
        .filter(|&i| {
            let option = lines[i].trim();
            let next = lines.get(i + 1).map_or("", |l| l.trim());
            option.starts_with("--")
                && !option.contains("  ")
                && (next.is_empty() || next.starts_with('-'))
        })
        .map(|i| lines[i])
        .collect();
    assert!(bare.is_empty(), "options without a description: {bare:?}");
}
