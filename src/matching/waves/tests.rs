use std::time::Duration;

use super::*;
use crate::matching::normalize::normalize;
use crate::matching::similar::Fingerprinter;

fn settings() -> MatchingSettings {
    MatchingSettings {
        waves: true,
        wave_posts: 20,
        wave_users: 5,
        wave_window: Duration::from_secs(600),
        wave_report_interval: Duration::from_secs(10),
        ..MatchingSettings::default()
    }
}

fn print(text: &str) -> Fingerprint {
    Fingerprinter.of_normalized(&normalize(text))
}

fn source(offset: i64) -> Source {
    Source {
        tp: crate::tp::Tp::new("posts", 0),
        offset,
    }
}

/// `text` posted by `user` as event `e{offset}` at `offset`.
fn post(
    waves: &mut Waves,
    text: &str,
    user: Option<&str>,
    offset: i64,
    now: Instant,
) -> Option<Joined> {
    waves.join(&Post {
        print: &print(text),
        event_id: &format!("e{offset}"),
        text,
        user,
        source: &source(offset),
        now,
        now_ms: 1_000,
    })
}

/// Variant `v` of a spam text: one word and the case changed.
fn variant(v: usize) -> String {
    let words = ["bio", "profile", "page", "link", "account"];
    let text = format!(
        "Win a free phone today, just click the link in my {} now",
        words[v % words.len()]
    );
    if v.is_multiple_of(2) {
        text.to_uppercase()
    } else {
        text
    }
}

fn scores(offensive: f32) -> [ModelScores; 1] {
    let scorer = std::sync::Arc::new(crate::verdict::Scorer::named("m", &manifest()));
    [ModelScores {
        model: crate::policy::ModelId(0),
        scorer,
        probabilities: vec![offensive],
        reused: false,
    }]
}

#[test]
fn a_cluster_becomes_a_wave_at_its_posts_and_users() {
    let mut waves = Waves::new(&settings());
    let t0 = Instant::now();
    let joined: Vec<Joined> = (0..30)
        .map(|i| {
            let user = format!("u{}", i % 6);
            post(&mut waves, &variant(i), Some(&user), i as i64, t0).unwrap()
        })
        .collect();
    let clusters: std::collections::HashSet<ClusterId> = joined.iter().map(|j| j.cluster).collect();
    assert_eq!(
        clusters.len(),
        1,
        "every variant joined the first post's cluster"
    );
    assert!(joined[..19].iter().all(|j| j.wave.is_none()));
    let wave = joined[19].wave.clone().unwrap();
    assert_eq!((wave.size, wave.users, &*wave.id), (20, 6, "e0"));
    assert_eq!(joined[19].report.as_ref().map(|r| r.started), Some(true));
    // Within the report interval: no second record.
    assert!(
        joined[20..]
            .iter()
            .all(|j| j.report.is_none() && j.wave.is_some())
    );
    assert!(
        joined.iter().all(|j| j.reuse.is_none()),
        "nothing scored yet"
    );
    let later = post(
        &mut waves,
        &variant(31),
        Some("u1"),
        31,
        t0 + Duration::from_secs(11),
    );
    assert_eq!(
        later.unwrap().report.map(|r| (r.started, r.wave.size)),
        Some((false, 31)),
        "grown, interval passed"
    );
}

/// Reuse is by identical text: a post of the wave with the text of a
/// scored post takes its scores; any other text of the wave, however
/// similar, does not.
#[test]
fn a_wave_reuses_scores_only_for_the_same_text() {
    let mut waves = Waves::new(&settings());
    let t0 = Instant::now();
    let mut cluster = None;
    for i in 0..25 {
        let user = format!("u{}", i % 6);
        cluster = post(&mut waves, &variant(i), Some(&user), i as i64, t0).map(|j| j.cluster);
    }
    let cluster = cluster.unwrap();
    waves.scored(cluster, &variant(1), &scores(0.9));
    // variant(11) and variant(31) are variant(1)'s text.
    assert_eq!(variant(11), variant(1));
    let same = post(&mut waves, &variant(11), Some("u1"), 100, t0).unwrap();
    assert_eq!(
        same.reuse.as_deref().map(|s| s[0].probabilities.clone()),
        Some(vec![0.9])
    );
    assert_eq!(
        waves
            .kept(cluster, &variant(31))
            .map(|s| s[0].probabilities[0]),
        Some(0.9)
    );
    for other in [
        variant(3),
        variant(6),
        format!("{} ", variant(1)),
        variant(1).to_uppercase(),
    ] {
        let j = post(&mut waves, &other, Some("u2"), 101, t0).unwrap();
        assert_eq!(j.cluster, cluster);
        assert!(j.reuse.is_none(), "{other:?} is not the scored text");
    }
    waves.forget_scores();
    let after = post(&mut waves, &variant(1), Some("u1"), 102, t0).unwrap();
    assert!(
        after.reuse.is_none(),
        "a reloaded model's scores start again"
    );
}

/// The attack of issue 46: eight accounts seed a wave with 40 variants of a
/// benign text, then post variants with one or two words swapped for
/// insults. They join the wave (similar enough) and take nothing from it.
#[test]
fn insults_in_a_benign_wave_never_take_its_scores() {
    let mut waves = Waves::new(&MatchingSettings {
        wave_posts: 20,
        wave_users: 5,
        ..settings()
    });
    let t0 = Instant::now();
    let benign = "hey neighbor you did a great job on the garden this spring it looks lovely";
    let fillers = ["now", "today", "really", "honestly", "friend"];
    let mut cluster = None;
    for i in 0..40 {
        let text = format!("{benign} {}", fillers[i % fillers.len()]);
        let user = format!("acct-{}", i % 8);
        let j = post(&mut waves, &text, Some(&user), i as i64, t0).unwrap();
        // Each text is scored once (the model found them benign).
        waves.scored(j.cluster, &text, &scores(0.016));
        cluster = Some(j.cluster);
    }
    let insults = ["fucking", "shitty", "stupid", "idiotic", "crap"];
    let mut joined_wave = 0;
    for i in 0..60 {
        let mut words: Vec<&str> = benign.split(' ').collect();
        words[5] = insults[i % insults.len()];
        if i % 2 == 1 {
            words[11] = "moron";
        }
        let text = format!("{} {}", words.join(" "), fillers[i % fillers.len()]);
        let j = post(
            &mut waves,
            &text,
            Some(&format!("acct-{}", i % 8)),
            100 + i as i64,
            t0,
        );
        let j = j.unwrap();
        joined_wave += usize::from(Some(j.cluster) == cluster && j.wave.is_some());
        assert!(j.reuse.is_none(), "{text:?} took the benign scores");
    }
    assert!(
        joined_wave >= 20,
        "the insults joined the wave: {joined_wave} of 60"
    );
}

/// The post that carried a wave record, read again (its transaction
/// aborted), carries the same record again; other posts do not.
#[test]
fn the_post_that_carried_a_wave_record_carries_it_again_when_read_again() {
    let mut waves = Waves::new(&settings());
    let t0 = Instant::now();
    let mut reports = Vec::new();
    for i in 0..25 {
        let user = format!("u{}", i % 6);
        let j = post(&mut waves, &variant(i), Some(&user), i as i64, t0).unwrap();
        reports.extend(j.report.map(|r| (i, r)));
    }
    assert_eq!(reports.len(), 1);
    let (starter, report) = reports.remove(0);
    assert!(report.started);
    // The partition is rewound to the starter: it and the posts after it
    // are read again; only the starter brings the record again.
    let again: Vec<Option<WaveReport>> = (starter..25)
        .map(|i| {
            let user = format!("u{}", i % 6);
            post(&mut waves, &variant(i), Some(&user), i as i64, t0)
                .unwrap()
                .report
        })
        .collect();
    assert_eq!(again[0].as_ref(), Some(&report), "the same record, started");
    assert!(again[1..].iter().all(Option::is_none));
}

#[test]
fn one_user_posting_alone_is_no_wave_and_short_texts_join_nothing() {
    let mut waves = Waves::new(&settings());
    let t0 = Instant::now();
    for i in 0..40 {
        let j = post(&mut waves, &variant(i), Some("same"), i as i64, t0).unwrap();
        assert!(j.wave.is_none());
    }
    assert!(post(&mut waves, "thanks so much!", Some("u"), 50, t0).is_none());
    assert!(post(&mut waves, "🔥🔥🔥", Some("u"), 51, t0).is_none());
    let other = post(
        &mut waves,
        "the match last night was the best one this whole season",
        None,
        52,
        t0,
    )
    .unwrap();
    assert_eq!(waves.len(), 2);
    assert_ne!(other.cluster, ClusterId(1));
}

#[test]
fn clusters_are_forgotten_after_the_window_and_beyond_the_bound() {
    let mut s = settings();
    s.max_clusters = 3;
    let mut waves = Waves::new(&s);
    let t0 = Instant::now();
    let texts = [
        "one two three four five six seven eight",
        "alpha beta gamma delta epsilon zeta eta theta",
        "red orange yellow green blue indigo violet white",
        "monday tuesday wednesday thursday friday saturday sunday holiday",
    ];
    let at = |s: u64| t0 + Duration::from_secs(s);
    let first = post(&mut waves, texts[0], None, 0, at(0)).unwrap().cluster;
    post(&mut waves, texts[1], None, 1, at(1));
    post(&mut waves, texts[2], None, 2, at(2));
    // The first is joined again: the second is now the least recent.
    let again = post(&mut waves, texts[0], None, 3, at(3)).unwrap();
    assert_eq!(again.cluster, first);
    post(&mut waves, texts[3], None, 4, at(4));
    assert_eq!(waves.len(), 3);
    let b = post(&mut waves, texts[1], None, 5, at(5)).unwrap();
    assert!(b.cluster.0 > 4, "the evicted cluster started again");
    // Past the window with no post, everything is forgotten.
    let late = at(5) + s.wave_window;
    post(&mut waves, texts[0], None, 6, late);
    assert_eq!(waves.len(), 1);
}

/// 20,000 long unique posts (each its own cluster, about 60 KB of
/// shingles and index apiece): the clusters' bytes stay within the budget,
/// the oldest going first; a budget cut by the lists evicts at once.
#[test]
fn clusters_stay_within_their_byte_budget() {
    let budget = 4 * 1024 * 1024;
    let mut waves = Waves::new(&MatchingSettings {
        max_bytes: budget,
        ..settings()
    });
    let t0 = Instant::now();
    let words: Vec<String> = (0..4000).map(|w| format!("w{w}x")).collect();
    let mut peak = 0;
    for i in 0..2000usize {
        // 600 words drawn by a walk of its own: unlike any other post.
        let text: Vec<&str> = (0..600)
            .map(|k| words[(i * 7919 + k * (i % 97 + 1) * 13) % words.len()].as_str())
            .collect();
        let text = text.join(" ");
        let j = post(
            &mut waves,
            &text,
            Some("u"),
            i as i64,
            t0 + Duration::from_millis(i as u64),
        );
        let j = j.unwrap();
        waves.scored(j.cluster, &text, &scores(0.1));
        peak = peak.max(waves.bytes());
    }
    assert!(peak <= budget, "peak {peak} over {budget}");
    assert!(waves.len() < 2000, "old clusters went");
    assert!(waves.len() > 10, "{} kept", waves.len());
    waves.set_budget(budget / 4);
    assert!(waves.bytes() <= budget / 4);
}

fn manifest() -> crate::inference::manifest::Manifest {
    serde_json::from_value(serde_json::json!({
        "name": "m", "version": "1", "input_kind": "text", "inputs": ["text"],
        "output": "p", "labels": ["offensive"], "score_label": "offensive",
    }))
    .unwrap()
}

/// The synthetic campaign (2,000 posts, 30 % of them 40 variants of 5
/// templates from 200 users): posts marked as in a wave against the
/// generator's truth.
#[test]
fn the_campaigns_waves_are_found_with_their_precision_and_recall() {
    use crate::tools::campaign::{Campaign, generate_campaign};
    let posts = generate_campaign(2000, &Campaign::default(), "c-");
    let mut waves = Waves::new(&settings());
    let t0 = Instant::now();
    let (mut marked_spam, mut marked_normal, mut spam) = (0, 0, 0);
    let mut clusters_of =
        std::collections::HashMap::<usize, std::collections::HashSet<ClusterId>>::new();
    for (i, p) in posts.iter().enumerate() {
        let text = p.event.text.as_deref().unwrap();
        let at = t0 + Duration::from_millis(i as u64 * 50);
        let joined = post(&mut waves, text, Some(&p.event.key), i as i64, at);
        let in_wave = joined.as_ref().is_some_and(|j| j.wave.is_some());
        match p.template {
            Some(t) => {
                spam += 1;
                marked_spam += usize::from(in_wave);
                clusters_of
                    .entry(t)
                    .or_default()
                    .extend(joined.map(|j| j.cluster));
            }
            None => marked_normal += usize::from(in_wave),
        }
    }
    let precision = marked_spam as f64 / (marked_spam + marked_normal).max(1) as f64;
    let recall = marked_spam as f64 / spam as f64;
    // Each template's first `wave_posts` - 1 posts come before its wave.
    let reachable = (spam - 5 * (settings().wave_posts as usize - 1)) as f64 / spam as f64;
    let clusters: Vec<usize> = (0..5).map(|t| clusters_of[&t].len()).collect();
    eprintln!(
        "campaign: {spam} posts, precision {precision:.3}, recall {recall:.3} (at most {reachable:.3}), clusters per template {clusters:?}"
    );
    assert_eq!(marked_normal, 0, "no normal post is in a wave");
    assert_eq!(clusters, vec![1; 5], "one cluster per template");
    assert!(recall >= reachable - 0.01, "recall {recall} of {reachable}");
}
