//! Apicurio Registry 3.3 (scripts/fetch-apicurio.sh; `MODSTREAM_APICURIO`
//! overrides its folder) on free loopback ports, in-memory storage, and
//! the tests' Python client (tests/registry/client.py).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

fn home() -> PathBuf {
    std::env::var_os("MODSTREAM_APICURIO").map_or_else(
        || modstream::inference::default_cache_dir().join("apicurio-3.3.3"),
        PathBuf::from,
    )
}

pub struct Registry {
    child: Child,
    pub port: u16,
}

impl Registry {
    /// Start it and wait until its Confluent-compatible API answers.
    pub fn start() -> Registry {
        let home = home();
        let java = std::fs::read_to_string(home.join("java")).unwrap_or_else(|e| {
            panic!(
                "{}/java: {e}: run scripts/fetch-apicurio.sh",
                home.display()
            )
        });
        let (port, management) = (free_port(), free_port());
        let log = std::fs::File::create(std::env::temp_dir().join(format!("apicurio-{port}.log")))
            .unwrap();
        let child = Command::new(java.trim())
            .args(["-Xmx384m", "-XX:+UseSerialGC"])
            .arg(format!("-Dquarkus.http.port={port}"))
            .arg("-Dquarkus.http.host=127.0.0.1")
            .arg(format!("-Dquarkus.management.port={management}"))
            .arg("-Dquarkus.management.host=127.0.0.1")
            .args(["-jar", "quarkus-run.jar"])
            .current_dir(&home)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("Apicurio Registry starts");
        let registry = Registry { child, port };
        let deadline = Instant::now() + Duration::from_secs(120);
        while !registry.answers() {
            assert!(
                Instant::now() < deadline,
                "Apicurio Registry did not answer within 120 s"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        registry
    }

    /// The Confluent-compatible API.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/apis/ccompat/v7", self.port)
    }

    /// Whether `/subjects` answers 200 (false on any error: it is starting).
    fn answers(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let request = "GET /apis/ccompat/v7/subjects HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        let mut response = String::new();
        stream.write_all(request.as_bytes()).is_ok()
            && stream.read_to_string(&mut response).is_ok()
            && response.starts_with("HTTP/1.1 200")
    }

    /// SIGSTOP (the registry hangs: connections open, no answer) or SIGCONT.
    pub fn signal(&self, signal: &str) {
        let _ = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status();
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.signal("-CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn python() -> PathBuf {
    super::prepared_python("MODSTREAM_REGISTRY_PYTHON", "py-registry")
}

fn client() -> PathBuf {
    super::repo_root().join("tests/registry/client.py")
}

/// Produce `count` events of `format` (ids `<format>-<i>`) with
/// confluent-kafka's serializer.
pub fn produce(
    bootstrap: &str,
    registry: &Registry,
    topic: &str,
    format: &str,
    start: usize,
    count: usize,
) {
    let out = Command::new(python())
        .arg(client())
        .args(["produce", bootstrap, &registry.url(), topic, format])
        .args([start.to_string(), count.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "client.py produce {format}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A producer that registered its schema and waits (see `--hold`).
pub struct HeldProducer {
    child: Child,
    stdin: ChildStdin,
}

impl HeldProducer {
    pub fn start(
        bootstrap: &str,
        registry: &Registry,
        topic: &str,
        format: &str,
        start: usize,
        count: usize,
    ) -> HeldProducer {
        let mut child = Command::new(python())
            .arg(client())
            .args(["produce", bootstrap, &registry.url(), topic, format])
            .args([start.to_string(), count.to_string(), "--hold".into()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "registered", "client.py --hold");
        HeldProducer { child, stdin }
    }

    /// Produce now; wait until every record is acknowledged.
    pub fn go(mut self) {
        writeln!(self.stdin).unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "client.py produce --hold");
    }
}

/// Verdicts read back with confluent-kafka's AvroDeserializer: each
/// `{"value": ..., "headers": {...}}`.
pub fn avro_verdicts(
    bootstrap: &str,
    registry: &Registry,
    topic: &str,
    count: usize,
) -> Vec<serde_json::Value> {
    let out = Command::new(python())
        .arg(client())
        .args([
            "verdicts",
            bootstrap,
            &registry.url(),
            topic,
            &count.to_string(),
            "60",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "client.py verdicts: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
