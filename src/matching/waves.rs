//! Near-duplicate waves: clusters of similar posts across the partitions
//! this instance owns. A post joins the cluster of the most similar post
//! it finds among those the clusters keep (`matching.wave_similarity`), or
//! starts one; a cluster keeps its first post and up to
//! [`MAX_MEMBERS`] − 1 more that differ from those it keeps (so that
//! variants of variants still join). A cluster is a wave from `wave_posts`
//! posts by at least `wave_users` distinct users.
//!
//! Bounds: a cluster is forgotten once no post joined it for
//! `wave_window`, and at most `max_clusters` are kept (the least recently
//! joined is forgotten first, counted in
//! `modstream_wave_clusters_evicted_total`); each keeps at most
//! [`MAX_MEMBERS`] posts' signatures (256 bytes each) and shingles (8 bytes
//! each, about twice the words), counts, and the hashes of at most
//! [`MAX_USERS`] user ids.
//! Nothing here is persisted: after a restart or a rebalance a wave is
//! found again from its next posts (its first `wave_posts` posts on the
//! new owner are not marked, and run the models).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use tokio::time::Instant;

use super::similar::{self, Fingerprint};
use crate::config::MatchingSettings;
use crate::telemetry::metric;
use crate::verdict::{ClusterId, ModelScores, WaveNote};

/// Distinct users counted per cluster (the count stops there).
pub const MAX_USERS: usize = 1000;

/// Posts whose signatures a cluster keeps to be found by.
pub const MAX_MEMBERS: u8 = 4;

/// A post joins without being kept when it is at least this similar to
/// the one it matched (it adds nothing to find the cluster by).
const KEPT_BELOW: f64 = 0.9;

/// One kept post of a cluster: the index's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Member {
    cluster: ClusterId,
    n: u8,
}

pub struct Waves {
    settings: MatchingSettings,
    index: similar::Index<Member>,
    /// The shingles of each kept post (compared exactly with candidates).
    kept: HashMap<Member, Vec<u64>>,
    clusters: HashMap<ClusterId, Cluster>,
    /// Clusters by when a post last joined them, least recent first.
    by_last: BTreeSet<(Instant, ClusterId)>,
    next: u64,
    meters: Meters,
}

struct Cluster {
    first_event: Arc<str>,
    first_seen_ms: i64,
    last: Instant,
    size: u32,
    /// Posts kept in the index.
    members: u8,
    users: HashSet<u64>,
    wave: bool,
    /// When a wave record was last written, and the size it gave.
    reported: Option<(Instant, u32)>,
    /// The scores of its first post judged from a model's run.
    scores: Option<Arc<[ModelScores]>>,
}

/// A post's place in a cluster.
#[derive(Debug, Clone)]
pub struct Joined {
    pub cluster: ClusterId,
    /// The wave, if the cluster is one.
    pub wave: Option<WaveNote>,
    /// A wave record to write: the wave started, or grew since the last
    /// one and `wave_report_interval` passed.
    pub report: Option<WaveReport>,
    /// The scores to reuse (`matching.reuse`, in a wave whose first post
    /// was scored).
    pub reuse: Option<Arc<[ModelScores]>>,
}

/// A wave record's content.
#[derive(Debug, Clone, PartialEq)]
pub struct WaveReport {
    pub wave: WaveNote,
    pub started: bool,
}

struct Meters {
    started: metrics::Counter,
    posts: metrics::Counter,
    evicted: metrics::Counter,
    clusters: metrics::Gauge,
}

impl Waves {
    pub fn new(settings: &MatchingSettings) -> Waves {
        Waves {
            settings: settings.clone(),
            index: similar::index(settings.wave_similarity),
            kept: HashMap::new(),
            clusters: HashMap::new(),
            by_last: BTreeSet::new(),
            next: 1,
            meters: Meters {
                started: metrics::counter!(metric::WAVES_STARTED_TOTAL),
                posts: metrics::counter!(metric::WAVE_POSTS_TOTAL),
                evicted: metrics::counter!(metric::WAVE_CLUSTERS_EVICTED_TOTAL),
                clusters: metrics::gauge!(metric::WAVE_CLUSTERS),
            },
        }
    }

    /// The post joins its cluster (or starts one); None for a text too
    /// short to cluster.
    pub fn join(
        &mut self,
        print: &Fingerprint,
        event_id: &str,
        user: Option<&str>,
        now: Instant,
        now_ms: i64,
    ) -> Option<Joined> {
        self.expire(now);
        if print.words < self.settings.wave_min_words {
            return None;
        }
        let signature = print.signature.as_ref()?;
        let user = user.map(|u| xxhash_rust::xxh3::xxh3_64(u.as_bytes()));
        let similarity = self.settings.wave_similarity;
        let found = similar::best_match(&self.index, print, similarity, |m| self.kept.get(m))
            .map(|(m, s)| (m.cluster, s));
        let Some((id, similarity)) = found else {
            let id = self.start(print, event_id, user, now, now_ms);
            return Some(Joined {
                cluster: id,
                wave: None,
                report: None,
                reuse: None,
            });
        };
        let settings = &self.settings;
        let cluster = self.clusters.get_mut(&id)?;
        self.by_last.remove(&(cluster.last, id));
        self.by_last.insert((now, id));
        cluster.last = now;
        cluster.size = cluster.size.saturating_add(1);
        if similarity < KEPT_BELOW && cluster.members < MAX_MEMBERS {
            let member = Member {
                cluster: id,
                n: cluster.members,
            };
            cluster.members += 1;
            self.index.insert(member, signature.clone());
            self.kept.insert(member, print.shingles.clone());
        }
        if let Some(u) = user
            && cluster.users.len() < MAX_USERS
        {
            cluster.users.insert(u);
        }
        let started = !cluster.wave
            && cluster.size >= settings.wave_posts
            && cluster.users.len() >= settings.wave_users as usize;
        cluster.wave |= started;
        if !cluster.wave {
            return Some(Joined {
                cluster: id,
                wave: None,
                report: None,
                reuse: None,
            });
        }
        let wave = cluster.note();
        let due = cluster.reported.is_none_or(|(at, size)| {
            now.duration_since(at) >= settings.wave_report_interval && cluster.size > size
        });
        if due {
            cluster.reported = Some((now, cluster.size));
        }
        self.meters.posts.increment(1);
        if started {
            self.meters.started.increment(1);
        }
        Some(Joined {
            cluster: id,
            report: due.then(|| WaveReport {
                wave: wave.clone(),
                started,
            }),
            reuse: cluster.scores.clone().filter(|_| settings.reuse),
            wave: Some(wave),
        })
    }

    /// The scores a post of `cluster` was judged by (kept for the first
    /// one only).
    pub fn scored(&mut self, cluster: ClusterId, scores: &[ModelScores]) {
        if let Some(c) = self.clusters.get_mut(&cluster)
            && c.scores.is_none()
            && !scores.is_empty()
        {
            c.scores = Some(scores.into());
        }
    }

    /// The scores kept for a wave's reuse (`matching.reuse`).
    pub fn kept(&self, cluster: ClusterId) -> Option<Arc<[ModelScores]>> {
        let c = self.clusters.get(&cluster)?;
        c.scores.clone().filter(|_| c.wave && self.settings.reuse)
    }

    /// A model changed (hot reload): scores kept so far are of its old
    /// version and are not reused.
    pub fn forget_scores(&mut self) {
        for c in self.clusters.values_mut() {
            c.scores = None;
        }
    }

    pub fn len(&self) -> usize {
        self.clusters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.clusters.is_empty()
    }

    fn start(
        &mut self,
        print: &Fingerprint,
        event_id: &str,
        user: Option<u64>,
        now: Instant,
        now_ms: i64,
    ) -> ClusterId {
        if self.clusters.len() >= self.settings.max_clusters
            && let Some((_, oldest)) = self.by_last.pop_first()
        {
            self.forget(oldest);
            self.meters.evicted.increment(1);
        }
        let id = ClusterId(self.next);
        self.next += 1;
        let first = Member { cluster: id, n: 0 };
        if let Some(signature) = &print.signature {
            self.index.insert(first, signature.clone());
            self.kept.insert(first, print.shingles.clone());
        }
        self.by_last.insert((now, id));
        self.clusters.insert(
            id,
            Cluster {
                first_event: event_id.into(),
                first_seen_ms: now_ms,
                last: now,
                size: 1,
                members: 1,
                users: user.into_iter().collect(),
                wave: false,
                reported: None,
                scores: None,
            },
        );
        self.meters.clusters.set(self.clusters.len() as f64);
        id
    }

    /// Clusters no post joined for `wave_window` are forgotten.
    fn expire(&mut self, now: Instant) {
        while let Some(&(last, id)) = self.by_last.first() {
            if now.duration_since(last) < self.settings.wave_window {
                break;
            }
            self.by_last.pop_first();
            self.forget(id);
        }
    }

    fn forget(&mut self, id: ClusterId) {
        if let Some(c) = self.clusters.remove(&id) {
            for n in 0..c.members {
                self.index.remove(&Member { cluster: id, n });
                self.kept.remove(&Member { cluster: id, n });
            }
        }
        self.meters.clusters.set(self.clusters.len() as f64);
    }
}

impl Cluster {
    fn note(&self) -> WaveNote {
        WaveNote {
            id: self.first_event.clone(),
            size: self.size,
            users: self.users.len() as u32,
            first_seen_ms: self.first_seen_ms,
        }
    }
}

#[cfg(test)]
mod tests;
