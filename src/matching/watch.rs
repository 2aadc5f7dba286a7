//! List files reloaded: the reload task asks [`ListWatch::check`] on its
//! interval (`inference.reload_interval`) and on SIGHUP; a file whose size
//! or modification time changed (every file, on SIGHUP) is read again and
//! checked whole on a blocking thread. A good one reaches the hub as
//! [`Update::File`]; a wrong one is refused (logged,
//! `modstream_list_reloads_total{outcome="refused"}`) and the list in
//! force stays.

use std::time::SystemTime;

use tokio::sync::mpsc;

use super::{Fingerprinter, List, Update};
use crate::config::{ListFile, MatchingSettings};
use crate::telemetry::metric::{self, ReloadOutcome};

type Stamp = Option<(u64, Option<SystemTime>)>;

pub struct ListWatch {
    files: Vec<ListFile>,
    similarity: f64,
    stamps: Vec<Stamp>,
    updates: mpsc::Sender<Update>,
}

fn stamp(file: &ListFile) -> Stamp {
    let meta = std::fs::metadata(&file.file).ok()?;
    Some((meta.len(), meta.modified().ok()))
}

impl ListWatch {
    /// The files as they are now (the matcher loaded them at start).
    pub fn new(settings: &MatchingSettings, updates: mpsc::Sender<Update>) -> ListWatch {
        ListWatch {
            files: settings.lists.clone(),
            similarity: settings.list_similarity,
            stamps: settings.lists.iter().map(stamp).collect(),
            updates,
        }
    }

    /// Reads again each file that changed (each file when `all`).
    pub async fn check(&mut self, all: bool) {
        for (i, file) in self.files.iter().enumerate() {
            let now = stamp(file);
            if !all && now == self.stamps[i] {
                continue;
            }
            self.stamps[i] = now;
            let f = file.clone();
            let similarity = self.similarity;
            let loaded = tokio::task::spawn_blocking(move || {
                List::load(&f.name, &f.file, f.mode, similarity, &Fingerprinter)
            })
            .await;
            let outcome = match loaded {
                Ok(Ok(list)) => {
                    let _ = self.updates.send(Update::File(list)).await;
                    ReloadOutcome::Loaded
                }
                Ok(Err(error)) => {
                    tracing::error!(%error, list = %file.name, "list file refused; the list in force stays");
                    ReloadOutcome::Refused
                }
                Err(error) => {
                    tracing::error!(%error, list = %file.name, "list file load failed; the list in force stays");
                    ReloadOutcome::Refused
                }
            };
            metrics::counter!(metric::LIST_RELOADS_TOTAL, "list" => file.name.clone(), "outcome" => outcome.as_str())
                .increment(1);
        }
    }
}
