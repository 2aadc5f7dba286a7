//! Apache Kafka for the tests: one node or a cluster of combined
//! broker+controller nodes (KRaft) on 127.0.0.1, each a `kafka.Kafka` JVM
//! started from the jars that scripts/fetch-kafka.sh collected, on free
//! ports, in an empty temp dir. Optionally secured: a SASL_SSL listener (TLS
//! with a CA made by openssl here, SCRAM-SHA-512 users created at format
//! time) and ACLs (`StandardAuthorizer`). Every JVM is killed when the
//! handle drops, also when a test panics.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::free_port;

const TEMPLATE: &str = include_str!("../kafka/server.properties");

/// The jars' folder (scripts/fetch-kafka.sh prints it; `KAFKA_LIBS` overrides).
pub fn kafka_libs() -> PathBuf {
    if let Some(p) = std::env::var_os("KAFKA_LIBS") {
        return PathBuf::from(p);
    }
    modstream::inference::default_cache_dir().join("kafka-4.4.0/libs")
}

/// Runs a Kafka tool class from the jars; panics with its output on failure.
pub fn kafka_tool(class: &str, args: &[&str]) -> String {
    let out = Command::new("java")
        .args(["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"])
        .arg("-cp")
        .arg(format!("{}/*", kafka_libs().display()))
        .arg(class)
        .args(args)
        .output()
        .expect("java runs (OpenJDK 17+)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{class} {args:?} failed:\n{text}");
    text
}

/// TLS + SCRAM + ACLs on a second listener (SASL_SSL); the PLAINTEXT
/// listener stays for the tests' own admin and verification (its
/// unauthenticated principal is a super user, as the controller's is).
#[derive(Clone, Debug)]
pub struct Security {
    /// (user, password), SCRAM-SHA-512, created at format time.
    pub users: Vec<(String, String)>,
}

/// Certificates made for a secured broker.
pub struct Tls {
    pub ca_pem: PathBuf,
    /// A CA that signed nothing here: clients that trust it must fail.
    pub other_ca_pem: PathBuf,
}

struct Node {
    id: u32,
    port: u16,
    controller_port: u16,
    secure_port: Option<u16>,
    child: Option<Child>,
}

pub struct Broker {
    nodes: Vec<Node>,
    dir: tempfile::TempDir,
    pub tls: Option<Tls>,
    starts: u32,
    /// Properties appended to every node's server.properties (later keys win).
    extra: String,
}

impl Broker {
    /// One node, replication factor 1.
    pub fn start() -> Broker {
        Self::launch(1, None, "")
    }

    /// One node with these server properties on top of the test defaults.
    pub fn start_with(extra: &str) -> Broker {
        Self::launch(1, None, extra)
    }

    /// `n` nodes, each broker and controller; topics get replication factor
    /// 3 (or n) and `min.insync.replicas` 2.
    pub fn cluster(n: usize) -> Broker {
        Self::launch(n, None, "")
    }

    /// One node with a SASL_SSL listener, SCRAM users and the ACL authorizer.
    pub fn secured(security: Security) -> Broker {
        Self::launch(1, Some(security), "")
    }

    fn launch(n: usize, security: Option<Security>, extra: &str) -> Broker {
        let libs = kafka_libs();
        assert!(
            libs.join("kafka_2.13-4.4.0.jar").is_file(),
            "Apache Kafka's jars are not at {} (scripts/test.sh fetches them: scripts/fetch-kafka.sh)",
            libs.display()
        );
        let dir = tempfile::tempdir().unwrap();
        let nodes: Vec<Node> = (1..=n as u32)
            .map(|id| Node {
                id,
                port: free_port(),
                controller_port: free_port(),
                secure_port: security.as_ref().map(|_| free_port()),
                child: None,
            })
            .collect();
        let tls = security.as_ref().map(|_| make_certificates(dir.path()));
        let mut broker = Broker {
            nodes,
            dir,
            tls,
            starts: 0,
            extra: extra.to_string(),
        };
        let cluster_id = kafka_tool("kafka.tools.StorageTool", &["random-uuid"])
            .trim()
            .lines()
            .last()
            .unwrap()
            .to_string();
        for i in 0..broker.nodes.len() {
            let props = broker.write_properties(i, security.is_some());
            let mut args = vec![
                "format".to_string(),
                "-t".to_string(),
                cluster_id.clone(),
                "-c".to_string(),
                props.display().to_string(),
            ];
            for (user, password) in security.iter().flat_map(|s| &s.users) {
                args.push("--add-scram".to_string());
                args.push(format!("SCRAM-SHA-512=[name={user},password={password}]"));
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            kafka_tool("kafka.tools.StorageTool", &args);
        }
        for i in 0..broker.nodes.len() {
            broker.spawn(i);
        }
        broker.wait_for_brokers(broker.nodes.len(), Duration::from_secs(60));
        broker
    }

    fn node_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("node-{}", self.nodes[i].id))
    }

    fn write_properties(&self, i: usize, secured: bool) -> PathBuf {
        let node = &self.nodes[i];
        let voters: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("{}@127.0.0.1:{}", n.id, n.controller_port))
            .collect();
        let mut listeners = format!(
            "PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}",
            node.port, node.controller_port
        );
        let mut advertised = format!("PLAINTEXT://127.0.0.1:{}", node.port);
        if let Some(p) = node.secure_port {
            listeners.push_str(&format!(",SASL_SSL://127.0.0.1:{p}"));
            advertised.push_str(&format!(",SASL_SSL://127.0.0.1:{p}"));
        }
        let replication = self.nodes.len().min(3);
        let min_isr = if replication >= 3 { 2 } else { 1 };
        let dir = self.node_dir(i);
        std::fs::create_dir_all(&dir).unwrap();
        let mut text = TEMPLATE
            .replace("@NODE_ID@", &node.id.to_string())
            .replace("@VOTERS@", &voters.join(","))
            .replace("@LISTENERS@", &listeners)
            .replace("@ADVERTISED@", &advertised)
            .replace("@LOG_DIR@", &dir.join("data").display().to_string())
            .replace("@REPLICATION@", &replication.to_string())
            .replace("@MIN_ISR@", &min_isr.to_string());
        if secured {
            let keystore = self.dir.path().join("tls/broker.pem");
            text.push_str(&format!(
                "\n# Secured listener (tests/support/kafka.rs)\n\
                 sasl.enabled.mechanisms=SCRAM-SHA-512\n\
                 listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;\n\
                 listener.name.sasl_ssl.ssl.keystore.type=PEM\n\
                 listener.name.sasl_ssl.ssl.keystore.location={}\n\
                 authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\n\
                 super.users=User:ANONYMOUS\n\
                 allow.everyone.if.no.acl.found=false\n",
                keystore.display()
            ));
        }
        text.push_str(&self.extra);
        let path = dir.join("server.properties");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn spawn(&mut self, i: usize) {
        self.starts += 1;
        let dir = self.node_dir(i);
        let log = std::fs::File::create(dir.join(format!("broker-{}.log", self.starts))).unwrap();
        let log4j = dir.join("log4j2.properties");
        std::fs::write(
            &log4j,
            "rootLogger.level=WARN\nrootLogger.appenderRef.stdout.ref=STDOUT\n\
             appender.stdout.type=Console\nappender.stdout.name=STDOUT\n\
             appender.stdout.layout.type=PatternLayout\n\
             appender.stdout.layout.pattern=[%d] %p %m (%c)%n\n",
        )
        .unwrap();
        let child = Command::new("java")
            .args([
                "-Xms64m",
                "-Xmx384m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-Djava.awt.headless=true",
            ])
            .arg(format!("-Dlog4j2.configurationFile={}", log4j.display()))
            .arg("-cp")
            .arg(format!("{}/*", kafka_libs().display()))
            .arg("kafka.Kafka")
            .arg(dir.join("server.properties"))
            .current_dir(&dir)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("java runs (OpenJDK 17+)");
        self.nodes[i].child = Some(child);
    }

    /// Waits until the cluster's metadata lists `count` brokers.
    fn wait_for_brokers(&mut self, count: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            for i in 0..self.nodes.len() {
                if let Some(c) = self.nodes[i].child.as_mut()
                    && let Some(status) = c.try_wait().unwrap()
                {
                    panic!(
                        "Kafka node {} exited at start ({status}); log in {}",
                        self.nodes[i].id,
                        self.node_dir(i).display()
                    );
                }
            }
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", self.bootstrap())
                .create()
                .unwrap();
            let listening = self
                .nodes
                .iter()
                .filter(|n| n.child.is_some())
                .all(|n| std::net::TcpStream::connect(("127.0.0.1", n.port)).is_ok());
            if listening
                && let Ok(m) = consumer.fetch_metadata(None, Duration::from_secs(2))
                && m.brokers().len() >= count
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "Kafka did not list {count} brokers within {timeout:?}; logs in {}",
                self.dir.path().display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The PLAINTEXT listeners of the running nodes.
    pub fn bootstrap(&self) -> String {
        let running: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        if running.is_empty() {
            format!("127.0.0.1:{}", self.nodes[0].port)
        } else {
            running.join(",")
        }
    }

    /// Every node's PLAINTEXT listener, running or not (what a client is
    /// configured with).
    pub fn all_bootstrap(&self) -> String {
        let all: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        all.join(",")
    }

    /// The SASL_SSL listener (secured brokers).
    pub fn secure_bootstrap(&self) -> String {
        format!(
            "127.0.0.1:{}",
            self.nodes[0].secure_port.expect("a secured broker")
        )
    }

    pub fn node_ids(&self) -> Vec<u32> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    /// SIGKILL every node.
    pub fn stop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(self.nodes[i].id);
        }
    }

    /// SIGKILL one node.
    pub fn kill(&mut self, id: u32) {
        let node = self.nodes.iter_mut().find(|n| n.id == id).unwrap();
        if let Some(mut c) = node.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start a killed node again on its ports and data.
    pub fn start_node(&mut self, id: u32) {
        let i = self.nodes.iter().position(|n| n.id == id).unwrap();
        if self.nodes[i].child.is_none() {
            self.spawn(i);
        }
    }

    /// Start every stopped node again (same ports, same data) and wait for it.
    pub fn restart(&mut self) {
        self.stop();
        for i in 0..self.nodes.len() {
            self.spawn(i);
        }
        self.wait_for_brokers(self.nodes.len(), Duration::from_secs(60));
    }

    /// Waits until the metadata lists every node again.
    pub fn wait_for_all(&mut self, timeout: Duration) {
        self.wait_for_brokers(self.nodes.len(), timeout);
    }

    /// The leader of a partition as the metadata says now (-1: none).
    pub fn leader(&self, topic: &str, partition: i32) -> i32 {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .create()
            .unwrap();
        let m = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("metadata");
        m.topics()[0]
            .partitions()
            .iter()
            .find(|p| p.id() == partition)
            .map_or(-1, |p| p.leader())
    }

    /// `kafka-acls --add` through the PLAINTEXT (super user) listener: allow
    /// `principal` the `operations` on a resource (`--topic T`, `--group G`,
    /// `--cluster`, ...).
    pub fn allow(&self, principal: &str, operations: &[&str], resource: &[&str]) {
        let bootstrap = self.bootstrap();
        let mut args = vec![
            "--bootstrap-server",
            bootstrap.as_str(),
            "--add",
            "--allow-principal",
            principal,
        ];
        for op in operations {
            args.extend(["--operation", op]);
        }
        args.extend_from_slice(resource);
        kafka_tool("org.apache.kafka.tools.AclCommand", &args);
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A CA, a broker certificate for 127.0.0.1 signed by it (one PEM file with
/// the PKCS#8 key and the chain: Kafka's PEM keystore), and a second CA that
/// signed nothing.
fn make_certificates(dir: &Path) -> Tls {
    let tls = dir.join("tls");
    std::fs::create_dir_all(&tls).unwrap();
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&tls)
            .output()
            .expect("openssl runs");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let days = "2";
    for ca in ["ca", "other-ca"] {
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            days,
            "-subj",
            &format!("/CN=modstream test {ca}"),
            "-keyout",
            &format!("{ca}.key"),
            "-out",
            &format!("{ca}.pem"),
        ]);
    }
    std::fs::write(
        tls.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "broker.key",
        "-out",
        "broker.csr",
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        "broker.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        days,
        "-extfile",
        "san.ext",
        "-out",
        "broker.crt",
    ]);
    openssl(&[
        "pkcs8",
        "-topk8",
        "-nocrypt",
        "-in",
        "broker.key",
        "-out",
        "broker.p8",
    ]);
    let pem = [
        std::fs::read_to_string(tls.join("broker.p8")).unwrap(),
        std::fs::read_to_string(tls.join("broker.crt")).unwrap(),
        std::fs::read_to_string(tls.join("ca.pem")).unwrap(),
    ]
    .concat();
    std::fs::write(tls.join("broker.pem"), pem).unwrap();
    Tls {
        ca_pem: tls.join("ca.pem"),
        other_ca_pem: tls.join("other-ca.pem"),
    }
}

/// Run kcat (installed by scripts/test.sh) with `stdin` fed to it; its
/// standard output. Fails the test if kcat fails.
pub fn kcat(args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new("kcat")
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kcat is installed (scripts/test.sh installs it)");
    if let Some(input) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kcat {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
