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

#[test]
fn a_cluster_becomes_a_wave_at_its_posts_and_users_and_reuses_kept_scores() {
    let mut waves = Waves::new(&settings());
    let t0 = Instant::now();
    let mut joined = Vec::new();
    for i in 0..30 {
        let user = format!("u{}", i % 6);
        let j = waves
            .join(
                &print(&variant(i)),
                &format!("e{i}"),
                Some(&user),
                t0,
                1_000,
            )
            .unwrap();
        joined.push(j);
    }
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

    let scorer = std::sync::Arc::new(crate::verdict::Scorer::named("m", &manifest()));
    let scores = [ModelScores {
        model: crate::policy::ModelId(0),
        scorer,
        probabilities: vec![0.9],
        reused: false,
    }];
    waves.scored(joined[0].cluster, &scores);
    let later = waves
        .join(
            &print(&variant(31)),
            "e31",
            Some("u1"),
            t0 + Duration::from_secs(11),
            0,
        )
        .unwrap();
    assert_eq!(
        later.reuse.as_deref().map(|s| s[0].probabilities.clone()),
        Some(vec![0.9])
    );
    assert_eq!(
        later.report.map(|r| (r.started, r.wave.size)),
        Some((false, 31)),
        "grown, interval passed"
    );
    waves.forget_scores();
    let after = waves
        .join(
            &print(&variant(32)),
            "e32",
            Some("u1"),
            t0 + Duration::from_secs(12),
            0,
        )
        .unwrap();
    assert!(after.reuse.is_none());
}

#[test]
fn one_user_posting_alone_is_no_wave_and_short_texts_join_nothing() {
    let mut waves = Waves::new(&settings());
    let t0 = Instant::now();
    for i in 0..40 {
        let j = waves
            .join(&print(&variant(i)), "e", Some("same"), t0, 0)
            .unwrap();
        assert!(j.wave.is_none());
    }
    assert!(
        waves
            .join(&print("thanks so much!"), "e", Some("u"), t0, 0)
            .is_none()
    );
    assert!(
        waves
            .join(&print("🔥🔥🔥"), "e", Some("u"), t0, 0)
            .is_none()
    );
    let other = waves
        .join(
            &print("the match last night was the best one this whole season"),
            "e",
            None,
            t0,
            0,
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
    let first = waves
        .join(&print(texts[0]), "a", None, t0, 0)
        .unwrap()
        .cluster;
    waves.join(&print(texts[1]), "b", None, t0 + Duration::from_secs(1), 0);
    waves.join(&print(texts[2]), "c", None, t0 + Duration::from_secs(2), 0);
    // The first is joined again: the second is now the least recent.
    let again = waves
        .join(&print(texts[0]), "a2", None, t0 + Duration::from_secs(3), 0)
        .unwrap();
    assert_eq!(again.cluster, first);
    waves.join(&print(texts[3]), "d", None, t0 + Duration::from_secs(4), 0);
    assert_eq!(waves.len(), 3);
    let b = waves
        .join(&print(texts[1]), "b2", None, t0 + Duration::from_secs(5), 0)
        .unwrap();
    assert!(b.cluster.0 > 4, "the evicted cluster started again");
    // Past the window with no post, everything is forgotten.
    let late = t0 + Duration::from_secs(5) + s.wave_window;
    waves.join(&print(texts[0]), "z", None, late, 0);
    assert_eq!(waves.len(), 1);
}

fn manifest() -> crate::manifest::Manifest {
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
    let prints = Fingerprinter;
    let t0 = Instant::now();
    let (mut marked_spam, mut marked_normal, mut spam) = (0, 0, 0);
    let mut clusters_of =
        std::collections::HashMap::<usize, std::collections::HashSet<ClusterId>>::new();
    for (i, p) in posts.iter().enumerate() {
        let text = p.event.text.as_deref().unwrap();
        let at = t0 + Duration::from_millis(i as u64 * 50);
        let joined = waves.join(
            &prints.of_normalized(&normalize(text)),
            &p.event.event_id,
            Some(&p.event.key),
            at,
            0,
        );
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
