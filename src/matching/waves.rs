//! Near-duplicate waves: clusters of similar posts across the partitions
//! this instance owns. A post joins the cluster of the most similar post
//! it finds among those the clusters keep (`matching.wave_similarity`), or
//! starts one; a cluster keeps its first post and up to
//! [`MAX_MEMBERS`] − 1 more that differ from those it keeps (so that
//! variants of variants still join). A cluster is a wave from `wave_posts`
//! posts by at least `wave_users` distinct users.
//!
//! **Reuse is by identical text only.** A post of a wave takes the scores
//! of an earlier post of its wave only if its text is the same, byte for
//! byte ([`Cluster::scored`]): a model given the same text gives the same
//! scores, so a reused verdict is the verdict the models would give that
//! post. Similarity (of shingles or of normal forms) never lends scores:
//! a swapped word, a look-alike letter or an emoji may read differently to
//! a model, which is what a spammer who seeds a benign wave and then posts
//! insults in it relies on. Waves only say which posts belong together.
//!
//! Bounds: a cluster is forgotten once no post joined it for
//! `wave_window`, and at most `max_clusters` are kept; all of them
//! together hold at most the byte budget the matcher gives them
//! ([`Waves::set_budget`]: `matching.max_bytes` less the lists). The least
//! recently joined cluster is forgotten first, counted in
//! `modstream_wave_clusters_evicted_total`. A cluster keeps at most
//! [`MAX_MEMBERS`] posts' signatures and shingles, [`MAX_USERS`] user
//! hashes and [`MAX_TEXTS`] scored texts; each is charged by its size.
//!
//! A wave record goes with the verdict of the post that started or grew
//! it; that post, read again (an aborted transaction, a revoke whose drain
//! gave up), carries the same record again, so an abort does not lose it.
//! Nothing here is persisted: after a restart or a rebalance a wave is
//! found again from its next posts (its first `wave_posts` posts on the
//! new owner are not marked, and run the models).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use tokio::time::Instant;

use super::similar::{self, Fingerprint};
use crate::config::MatchingSettings;
use crate::telemetry::metric;
use crate::tp::Source;
use crate::verdict::{ClusterId, ModelScores, WaveNote};

/// Distinct users counted per cluster (the count stops there).
pub const MAX_USERS: usize = 1000;

/// Posts whose signatures a cluster keeps to be found by.
pub const MAX_MEMBERS: u8 = 4;

/// Distinct texts whose scores a cluster keeps for reuse.
pub const MAX_TEXTS: usize = 256;

/// A post joins without being kept when it is at least this similar to
/// the one it matched (it adds nothing to find the cluster by).
const KEPT_BELOW: f64 = 0.9;

/// Bytes charged per cluster beyond what it holds (the struct, its map
/// entries and its place in the recency order), per user hash, and per
/// kept text beyond its bytes and scores.
const CLUSTER_BYTES: usize = 320;
const USER_BYTES: usize = 16;
const TEXT_BYTES: usize = 96;

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
    /// Bytes the clusters hold, and the most they may.
    bytes: usize,
    budget: usize,
    /// Clusters forgotten to make room, and candidates cut, since the start.
    evicted: u64,
    cut: u64,
    meters: Meters,
}

/// What the clusters hold and what their bounds cost so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WavesStats {
    pub clusters: usize,
    pub bytes: usize,
    pub evicted: u64,
    pub cut: u64,
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
    /// The last wave record: when, the size it gave, and the post it went
    /// with (which carries it again if read again).
    reported: Option<Reported>,
    /// The scores its posts' texts were judged by from a model's run, by
    /// text (the first of each).
    scored: HashMap<Box<str>, Arc<[ModelScores]>>,
    /// Bytes it is charged (see [`Waves`]).
    bytes: usize,
}

struct Reported {
    at: Instant,
    size: u32,
    by: Source,
    report: WaveReport,
}

/// A post as waves see it.
pub struct Post<'a> {
    pub print: &'a Fingerprint,
    pub event_id: &'a str,
    /// Its text as the models read it (what reuse compares).
    pub text: &'a str,
    pub user: Option<&'a str>,
    /// Its input partition and offset.
    pub source: &'a Source,
    pub now: Instant,
    pub now_ms: i64,
}

/// A post's place in a cluster.
#[derive(Debug, Clone)]
pub struct Joined {
    pub cluster: ClusterId,
    /// The wave, if the cluster is one.
    pub wave: Option<WaveNote>,
    /// A wave record to write: the wave started, or grew since the last
    /// one and `wave_report_interval` passed (or this post carried it and
    /// is read again).
    pub report: Option<WaveReport>,
    /// The scores to reuse (`matching.reuse`, in a wave, kept for this
    /// very text).
    pub reuse: Option<Arc<[ModelScores]>>,
}

impl Joined {
    fn not_in_a_wave(cluster: ClusterId) -> Joined {
        Joined {
            cluster,
            wave: None,
            report: None,
            reuse: None,
        }
    }
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
    bytes: metrics::Gauge,
    cut: metrics::Counter,
}

impl Waves {
    pub fn new(settings: &MatchingSettings) -> Waves {
        Waves {
            settings: settings.clone(),
            index: similar::Index::capped(settings.wave_similarity),
            kept: HashMap::new(),
            clusters: HashMap::new(),
            by_last: BTreeSet::new(),
            next: 1,
            bytes: 0,
            budget: settings.max_bytes,
            evicted: 0,
            cut: 0,
            meters: Meters {
                started: metrics::counter!(metric::WAVES_STARTED_TOTAL),
                posts: metrics::counter!(metric::WAVE_POSTS_TOTAL),
                evicted: metrics::counter!(metric::WAVE_CLUSTERS_EVICTED_TOTAL),
                clusters: metrics::gauge!(metric::WAVE_CLUSTERS),
                bytes: metrics::gauge!(metric::MATCHING_BYTES, "part" => "waves"),
                cut: metrics::counter!(metric::MATCHING_CANDIDATES_CUT_TOTAL, "part" => "waves"),
            },
        }
    }

    /// The bytes the clusters may hold (the lists took the rest); past it
    /// the least recently joined go.
    pub fn set_budget(&mut self, bytes: usize) {
        self.budget = bytes;
        self.evict_over_budget(None);
    }

    /// Bytes the clusters hold now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn stats(&self) -> WavesStats {
        WavesStats {
            clusters: self.clusters.len(),
            bytes: self.bytes,
            evicted: self.evicted,
            cut: self.cut,
        }
    }

    /// The post joins its cluster (or starts one); None for a text too
    /// short to cluster.
    pub fn join(&mut self, post: &Post<'_>) -> Option<Joined> {
        self.expire(post.now);
        let print = post.print;
        if print.words < self.settings.wave_min_words {
            return None;
        }
        let signature = print.signature.as_ref()?;
        let user = post.user.map(|u| xxhash_rust::xxh3::xxh3_64(u.as_bytes()));
        let similarity = self.settings.wave_similarity;
        let found = self
            .index
            .query(print, similarity, |m| self.kept.get(m))
            .best()
            .map(|(m, s)| (m.cluster, s));
        let cut = self.index.take_cut();
        self.cut += cut;
        self.meters.cut.increment(cut);
        let Some((id, similarity)) = found else {
            let id = self.start(post, user);
            return Some(Joined::not_in_a_wave(id));
        };
        let settings = &self.settings;
        let cluster = self.clusters.get_mut(&id)?;
        self.by_last.remove(&(cluster.last, id));
        self.by_last.insert((post.now, id));
        cluster.last = post.now;
        // The post that carried the last record, read again: the same
        // record again (its first delivery was rolled back or never made).
        if let Some(r) = cluster.reported.as_ref().filter(|r| r.by == *post.source) {
            return Some(Joined {
                cluster: id,
                wave: Some(r.report.wave.clone()),
                report: Some(r.report.clone()),
                reuse: cluster.reuse_for(post.text, settings),
            });
        }
        cluster.size = cluster.size.saturating_add(1);
        let mut added = 0;
        if similarity < KEPT_BELOW && cluster.members < MAX_MEMBERS {
            let member = Member {
                cluster: id,
                n: cluster.members,
            };
            cluster.members += 1;
            self.index.insert(member, signature.clone());
            self.kept.insert(member, print.shingles.clone());
            added += member_bytes(print);
        }
        if let Some(u) = user
            && cluster.users.len() < MAX_USERS
            && cluster.users.insert(u)
        {
            added += USER_BYTES;
        }
        cluster.bytes += added;
        self.bytes += added;
        let joined = cluster.joined(id, post, settings, &self.meters);
        self.evict_over_budget(Some(id));
        Some(joined)
    }

    /// The scores a post of `cluster` was judged by from its models' runs,
    /// kept for later posts of the same text (the first of each text).
    pub fn scored(&mut self, cluster: ClusterId, text: &str, scores: &[ModelScores]) {
        let Some(c) = self.clusters.get_mut(&cluster) else {
            return;
        };
        if scores.is_empty() || c.scored.len() >= MAX_TEXTS || c.scored.contains_key(text) {
            return;
        }
        let charged = text.len() + TEXT_BYTES + scores_bytes(scores);
        c.scored.insert(text.into(), scores.into());
        c.bytes += charged;
        self.bytes += charged;
        self.evict_over_budget(Some(cluster));
        // Alone over the budget: the text is not kept.
        if self.bytes > self.budget
            && let Some(c) = self.clusters.get_mut(&cluster)
            && c.scored.remove(text).is_some()
        {
            c.bytes -= charged;
            self.bytes -= charged;
        }
        self.meters.bytes.set(self.bytes as f64);
    }

    /// The scores kept for this text in `cluster`'s wave (`matching.reuse`).
    pub fn kept(&self, cluster: ClusterId, text: &str) -> Option<Arc<[ModelScores]>> {
        self.clusters.get(&cluster)?.reuse_for(text, &self.settings)
    }

    /// A model changed (hot reload): scores kept so far are of its old
    /// version and are not reused.
    pub fn forget_scores(&mut self) {
        for c in self.clusters.values_mut() {
            let freed: usize = (c.scored.iter())
                .map(|(t, s)| t.len() + TEXT_BYTES + scores_bytes(s))
                .sum();
            c.scored.clear();
            c.bytes -= freed;
            self.bytes -= freed;
        }
        self.meters.bytes.set(self.bytes as f64);
    }

    pub fn len(&self) -> usize {
        self.clusters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.clusters.is_empty()
    }

    fn start(&mut self, post: &Post<'_>, user: Option<u64>) -> ClusterId {
        if self.clusters.len() >= self.settings.max_clusters
            && let Some((_, oldest)) = self.by_last.pop_first()
        {
            self.forget(oldest);
            self.evicted += 1;
            self.meters.evicted.increment(1);
        }
        let id = ClusterId(self.next);
        self.next += 1;
        let first = Member { cluster: id, n: 0 };
        let mut bytes = CLUSTER_BYTES + post.event_id.len();
        if let Some(signature) = &post.print.signature {
            self.index.insert(first, signature.clone());
            self.kept.insert(first, post.print.shingles.clone());
            bytes += member_bytes(post.print);
        }
        bytes += user.map_or(0, |_| USER_BYTES);
        self.by_last.insert((post.now, id));
        self.clusters.insert(
            id,
            Cluster {
                first_event: post.event_id.into(),
                first_seen_ms: post.now_ms,
                last: post.now,
                size: 1,
                members: 1,
                users: user.into_iter().collect(),
                wave: false,
                reported: None,
                scored: HashMap::new(),
                bytes,
            },
        );
        self.bytes += bytes;
        self.evict_over_budget(Some(id));
        self.meters.clusters.set(self.clusters.len() as f64);
        id
    }

    /// Past the budget, the least recently joined clusters go (but `keep`,
    /// the one a post just joined).
    fn evict_over_budget(&mut self, keep: Option<ClusterId>) {
        while self.bytes > self.budget {
            let Some(&(at, oldest)) = self.by_last.iter().find(|(_, c)| Some(*c) != keep) else {
                break;
            };
            self.by_last.remove(&(at, oldest));
            self.forget(oldest);
            self.evicted += 1;
            self.meters.evicted.increment(1);
        }
        self.meters.bytes.set(self.bytes as f64);
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
            self.bytes -= c.bytes;
        }
        self.meters.clusters.set(self.clusters.len() as f64);
        self.meters.bytes.set(self.bytes as f64);
    }
}

impl Cluster {
    /// A post just counted in: whether that makes it a wave, the record
    /// to write if one is due, and the scores its text may reuse.
    fn joined(
        &mut self,
        id: ClusterId,
        post: &Post<'_>,
        settings: &MatchingSettings,
        meters: &Meters,
    ) -> Joined {
        let started = !self.wave
            && self.size >= settings.wave_posts
            && self.users.len() >= settings.wave_users as usize;
        self.wave |= started;
        if !self.wave {
            return Joined::not_in_a_wave(id);
        }
        let wave = self.note();
        let due = self.reported.as_ref().is_none_or(|r| {
            post.now.duration_since(r.at) >= settings.wave_report_interval && self.size > r.size
        });
        let report = due.then(|| WaveReport {
            wave: wave.clone(),
            started,
        });
        if let Some(report) = &report {
            self.reported = Some(Reported {
                at: post.now,
                size: self.size,
                by: post.source.clone(),
                report: report.clone(),
            });
        }
        meters.posts.increment(1);
        if started {
            meters.started.increment(1);
        }
        Joined {
            cluster: id,
            report,
            reuse: self.reuse_for(post.text, settings),
            wave: Some(wave),
        }
    }

    fn note(&self) -> WaveNote {
        WaveNote {
            id: self.first_event.clone(),
            size: self.size,
            users: self.users.len() as u32,
            first_seen_ms: self.first_seen_ms,
        }
    }

    /// The scores kept for exactly this text, while the cluster is a wave.
    fn reuse_for(&self, text: &str, settings: &MatchingSettings) -> Option<Arc<[ModelScores]>> {
        if !(self.wave && settings.reuse) {
            return None;
        }
        self.scored.get(text).cloned()
    }
}

/// Bytes a kept post holds: its signature and index entry, its shingles.
fn member_bytes(print: &Fingerprint) -> usize {
    similar::Index::<Member>::bytes_per_id() + print.shingles.len() * 8 + 48
}

/// Bytes of kept scores (their probabilities and handles).
fn scores_bytes(scores: &[ModelScores]) -> usize {
    scores.iter().map(|s| 64 + s.probabilities.len() * 4).sum()
}

#[cfg(test)]
mod tests;
