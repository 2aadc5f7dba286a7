//! What tracing costs (`--tracing-ratios` with `--own-runs`): `modstream
//! run` with `[tracing]` on at each sampling ratio, its spans sent to an
//! OTLP/HTTP sink in the bench's process (which answers every export with
//! 200 and counts the bytes): the service's CPU is its own, the sink's is
//! not in it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// An OTLP/HTTP endpoint that takes every export.
pub(super) struct Sink {
    pub(super) port: u16,
    bytes: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Sink {
    pub(super) async fn start() -> anyhow::Result<Sink> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let bytes = Arc::new(AtomicU64::new(0));
        let counted = bytes.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, counted.clone()));
            }
        });
        Ok(Sink { port, bytes, task })
    }

    /// The bytes of the exports taken so far (their bodies).
    pub(super) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// `[tracing]` for `modstream run`, at `ratio`.
    pub(super) fn config(&self, ratio: f64) -> String {
        format!(
            "[tracing]\nendpoint = \"http://127.0.0.1:{}\"\nsampling_ratio = {ratio}\n",
            self.port
        )
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One connection's requests (kept alive), each answered 200 once its
/// body (Content-Length) is read.
async fn serve(stream: tokio::net::TcpStream, bytes: Arc<AtomicU64>) {
    let mut stream = BufReader::new(stream);
    loop {
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            match stream.read_line(&mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length];
        if stream.read_exact(&mut body).await.is_err() {
            return;
        }
        bytes.fetch_add(length as u64, Ordering::Relaxed);
        let answer =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if stream.get_mut().write_all(answer).await.is_err() {
            return;
        }
    }
}
