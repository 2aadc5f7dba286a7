//! modstream on a secured Apache Kafka: a SASL_SSL listener (TLS with a CA
//! made here by openssl, PEM files; SCRAM-SHA-512 users created at format
//! time) and ACLs (`StandardAuthorizer`, nothing allowed unless granted).
//! The tests' own producer and verifier use the broker's PLAINTEXT listener,
//! whose unauthenticated principal is a super user; modstream only ever
//! talks to the secured one.

mod support;

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use support::{Broker, DLQ, INPUT, Modstream, Security, VERDICTS};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const USER: &str = "modstream";
const PASSWORD: &str = "s3cret-pw";

/// A secured broker with the three topics, `events` produced, and
/// modstream's principal allowed its input, the DLQ, its group, and on the
/// verdict topic `verdict_ops`.
fn secured_broker(group: &str, verdict_ops: &[&str], events: usize) -> (Broker, Vec<String>) {
    let broker = Broker::secured(Security {
        users: vec![(USER.into(), PASSWORD.into())],
    });
    broker.create_topic(INPUT, 2);
    broker.create_topic(VERDICTS, 2);
    broker.create_topic(DLQ, 1);
    let principal = format!("User:{USER}");
    broker.allow(&principal, &["Read", "Describe"], &["--topic", INPUT]);
    broker.allow(&principal, &["Read"], &["--group", group]);
    broker.allow(&principal, &["Write", "Describe"], &["--topic", DLQ]);
    broker.allow(&principal, verdict_ops, &["--topic", VERDICTS]);
    let acked = support::produce(&broker.bootstrap(), &support::events("s-", 0..events));
    (broker, acked)
}

/// The client properties a user sets for this broker (README "Security").
fn client_props<'a>(password: &'a str, ca: &'a Path) -> Vec<(&'static str, String)> {
    vec![
        ("security.protocol", "sasl_ssl".into()),
        ("sasl.mechanisms", "SCRAM-SHA-512".into()),
        ("sasl.username", USER.into()),
        ("sasl.password", password.into()),
        ("ssl.ca.location", ca.display().to_string()),
    ]
}

fn config(
    dir: &Path,
    broker: &Broker,
    group: &str,
    props: &[(&str, String)],
) -> std::path::PathBuf {
    let props: Vec<(&str, &str)> = props.iter().map(|(k, v)| (*k, v.as_str())).collect();
    support::write_config_with(dir, &broker.secure_bootstrap(), group, &props)
}

/// `modstream run` with `password` and the CA file `ca` picks from the
/// broker's certificates, expected to fail at start, at once (well before
/// its 30 s startup timeout), without consuming: its stderr.
fn failed_start(group: &str, password: &str, ca: fn(&support::Tls) -> &Path) -> String {
    failed_start_with(group, password, ca, &["Write", "Describe"])
}

/// [`failed_start`] with these operations allowed on the verdict topic.
fn failed_start_with(
    group: &str,
    password: &str,
    ca: fn(&support::Tls) -> &Path,
    verdict_ops: &[&str],
) -> String {
    let (broker, _) = secured_broker(group, verdict_ops, 10);
    let dir = tempfile::tempdir().unwrap();
    let ca = ca(broker.tls.as_ref().unwrap()).to_path_buf();
    let config = config(dir.path(), &broker, group, &client_props(password, &ca));
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_modstream"))
        .args(["run", "--config"])
        .arg(&config)
        .env("MODSTREAM__KAFKA__STARTUP_TIMEOUT", "30s")
        .output()
        .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    println!("{group}: {} (after {took:?})", stderr.trim());
    assert!(!out.status.success(), "the start must fail");
    assert!(!stderr.contains(password), "the password is never logged");
    assert!(
        took < Duration::from_secs(15),
        "at once, not after the startup timeout: {took:?}"
    );
    assert_eq!(support::committed(&broker.bootstrap(), group, 2), [-1, -1]);
    stderr
}

#[test]
fn tls_and_scram_with_acls_end_to_end() {
    let _serial = serial();
    let group = "g-secure";
    let (broker, acked) = secured_broker(group, &["Write", "Describe"], 500);
    let dir = tempfile::tempdir().unwrap();
    let ca = broker.tls.as_ref().unwrap().ca_pem.clone();
    let config = config(dir.path(), &broker, group, &client_props(PASSWORD, &ca));
    let mut service = Modstream::start(&config, "secure", dir.path());
    let v = support::verify(&broker.bootstrap(), &acked, Duration::from_secs(90));
    v.report("TLS + SCRAM-SHA-512 + ACLs");
    assert!(v.lost.is_empty(), "lost: {}", v.lost.len());
    let deadline = Instant::now() + Duration::from_secs(30);
    let total = || {
        support::committed(&broker.bootstrap(), group, 2)
            .iter()
            .map(|c| (*c).max(0))
            .sum::<i64>()
    };
    while total() < acked.len() as i64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(total(), acked.len() as i64, "committed to the end");
    assert!(service.terminate(Duration::from_secs(20)));
}

#[test]
fn a_wrong_password_fails_the_start_at_once() {
    let _serial = serial();
    let stderr = failed_start("g-wrong-password", "wrong-pw", |tls| &tls.ca_pem);
    assert!(
        stderr.contains("refused this client") && stderr.contains("uthentication"),
        "names the cause: {stderr}"
    );
}

#[test]
fn a_wrong_ca_fails_the_start_naming_certificate_verification() {
    let _serial = serial();
    let stderr = failed_start("g-wrong-ca", PASSWORD, |tls| &tls.other_ca_pem);
    assert!(
        stderr.contains("TLS with Kafka failed") && stderr.contains("certificate verify failed"),
        "names certificate verification: {stderr}"
    );
    assert!(!stderr.contains("cannot reach Kafka"), "{stderr}");
}

/// modstream may read its input and see the verdict topic but not write
/// it: the start fails at once, naming the topic, the key that sets it and
/// the missing ACL, before anything is consumed (runtime refusals are
/// tests/faults_mock.rs's).
#[test]
fn a_denied_write_to_the_verdict_topic_fails_the_start_naming_it() {
    let _serial = serial();
    let stderr = failed_start_with("g-denied", PASSWORD, |tls| &tls.ca_pem, &["Describe"]);
    assert!(
        stderr.contains("output.topic") && stderr.contains(VERDICTS) && stderr.contains("Write"),
        "names the key, the topic and the ACL: {stderr}"
    );
}
