//! `modstream run` as a process a test starts, configures by file, signals
//! and reads the log of.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{DLQ, INPUT, VERDICTS};

/// A `modstream run` process configured by file.
pub struct Modstream {
    child: Option<Child>,
    pub name: String,
    /// How the process ended, once it was seen to end by itself.
    exited: Option<std::process::ExitStatus>,
}

pub fn write_config(dir: &Path, bootstrap: &str, group: &str) -> PathBuf {
    write_config_with(dir, bootstrap, group, &[])
}

/// [`write_config`] with librdkafka properties for both clients (security).
pub fn write_config_with(
    dir: &Path,
    bootstrap: &str,
    group: &str,
    client_props: &[(&str, &str)],
) -> PathBuf {
    let props: String = client_props
        .iter()
        .map(|(k, v)| format!("\"{k}\" = \"{v}\"\n"))
        .collect();
    let model = super::repo_root().join("models/profanity-check");
    let path = dir.join(format!("{group}.toml"));
    std::fs::write(
        &path,
        format!(
            r#"
[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "{group}"
drain_timeout = "3s"
commit_interval = "500ms"
[kafka.consumer]
"session.timeout.ms" = 6000
"heartbeat.interval.ms" = 500
"max.poll.interval.ms" = 20000
"group.protocol" = "classic"
{props}[kafka.producer]
"linger.ms" = 2
{props}
[input]
topics = ["{INPUT}"]
[output]
topic = "{VERDICTS}"
dlq_topic = "{DLQ}"
[batching]
max_batch_size = 32
max_batch_delay = "10ms"
[inference]
model_dir = "{}"
[telemetry]
# Several services run at once: each takes a free port.
listen = "127.0.0.1:0"
"#,
            model.display()
        ),
    )
    .unwrap();
    path
}

impl Modstream {
    pub fn start(config: &Path, name: &str, log_dir: &Path) -> Modstream {
        // MODSTREAM_TEST_LOGDIR keeps the service logs after the test.
        let kept = std::env::var_os("MODSTREAM_TEST_LOGDIR").map(PathBuf::from);
        let log_dir = kept.as_deref().unwrap_or(log_dir);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_dir.join(format!("{name}.log")))
            .unwrap();
        let child = Command::new(super::modstream_binary())
            .args(["run", "--config"])
            .arg(config)
            .env(
                "RUST_LOG",
                std::env::var("MODSTREAM_TEST_LOG").unwrap_or_else(|_| "modstream=info".into()),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("modstream starts");
        Modstream {
            child: Some(child),
            name: name.to_string(),
            exited: None,
        }
    }

    /// Take over a process started elsewhere (killed on drop).
    pub fn adopt(child: Child, name: &str) -> Modstream {
        Modstream {
            child: Some(child),
            name: name.to_string(),
            exited: None,
        }
    }

    /// SIGKILL: no drain, no commit.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then wait for a clean exit; returns whether it exited 0.
    pub fn terminate(&mut self, timeout: Duration) -> bool {
        let Some(mut c) = self.child.take() else {
            return false;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = c.try_wait().unwrap() {
                if !status.success() {
                    println!("{}: exited with {status} after SIGTERM", self.name);
                }
                return status.success();
            }
            if Instant::now() > deadline {
                println!(
                    "{}: still running {timeout:?} after SIGTERM; killed",
                    self.name
                );
                let _ = c.kill();
                let _ = c.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Freeze (SIGSTOP) or thaw (SIGCONT) the process.
    pub fn signal(&self, signal: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args([signal, &c.id().to_string()])
                .status();
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&mut self) -> bool {
        let Some(child) = self.child.as_mut() else {
            return false;
        };
        match child.try_wait().unwrap() {
            None => true,
            Some(status) => {
                self.exited = Some(status);
                self.child = None;
                false
            }
        }
    }

    /// The exit code of a process that ended by itself (seen by
    /// [`Modstream::is_running`]); None while it runs or if it was killed.
    pub fn exit_code(&mut self) -> Option<i32> {
        self.is_running();
        self.exited.and_then(|s| s.code())
    }
}

impl Drop for Modstream {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The log a [`Modstream`] named `name` wrote under `dir` (or under
/// MODSTREAM_TEST_LOGDIR when set); empty if there is none.
pub fn log_of(dir: &Path, name: &str) -> String {
    let dir =
        std::env::var_os("MODSTREAM_TEST_LOGDIR").map_or_else(|| dir.to_path_buf(), Into::into);
    std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
}

/// The partition counts of each "partitions assigned" line in a member's
/// log, in order (the eager protocol logs a member's whole share each time).
pub fn assignments(log: &str) -> Vec<usize> {
    log.lines()
        .filter(|l| l.contains("partitions assigned"))
        .filter_map(|l| {
            l.split("partitions=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect()
}
