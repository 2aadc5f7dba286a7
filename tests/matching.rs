//! Matching through the whole pipeline on the mock cluster, with the
//! shipped profanity model: a synthetic campaign's waves found against the
//! generator's truth, with reused verdicts equal to the model's own; a
//! spammer's insults posted into a benign wave, each judged by the model;
//! instances joining and leaving mid-wave without a verdict lost or an
//! offset left behind. (Lists: tests/lists.rs.)

mod support;

use std::collections::HashMap;
use std::time::Duration;

use modstream::config::Settings;
use modstream::shutdown::Shutdown;
use modstream::tools::campaign::{Campaign, CampaignPost, generate_campaign};
use modstream::verdict::Verdict;
use support::VERDICTS;
use support::matching::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaigns_waves_are_found_and_reuse_the_verdicts_the_model_gives() {
    support::init_logs();
    let broker = broker(2);
    let bootstrap = broker.bootstrap_servers().to_string();
    let posts = generate_campaign(2000, &Campaign::default(), "c-");
    let events = triples(&posts);
    let b = bootstrap.clone();
    let acked = tokio::task::spawn_blocking(move || support::produce(&b, &events))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(
        dir.path(),
        &bootstrap,
        "g-campaign",
        "waves = true\nreuse = true",
    );
    let shutdown = Shutdown::new();
    let pipeline = tokio::spawn(modstream::pipeline::run(settings.clone(), shutdown.clone()));
    support::read_records(&bootstrap, VERDICTS, 2, posts.len()).await;
    let committed = committed_sum(&bootstrap, "g-campaign", 2, posts.len() as i64).await;
    shutdown.stop.cancel();
    let summary = pipeline.await.unwrap().unwrap();
    assert_eq!((summary.verdicts, summary.dlq), (posts.len() as u64, 0));
    assert_eq!(committed, posts.len() as i64, "committed == end");
    let b = bootstrap.clone();
    let verification =
        tokio::task::spawn_blocking(move || support::verify(&b, &acked, Duration::from_secs(30)))
            .await
            .unwrap();
    assert!(verification.lost.is_empty() && verification.duplicates == 0);
    let verdicts = by_id(&support::read_to_end(&bootstrap, VERDICTS).await);

    // Waves against the generator's truth.
    let in_wave = |p: &CampaignPost| verdicts[&p.event.event_id]["reason"].get("wave").is_some();
    let spam = posts.iter().filter(|p| p.template.is_some()).count();
    let marked_spam = posts
        .iter()
        .filter(|p| p.template.is_some() && in_wave(p))
        .count();
    let marked_normal = posts
        .iter()
        .filter(|p| p.template.is_none() && in_wave(p))
        .count();
    let precision = marked_spam as f64 / (marked_spam + marked_normal).max(1) as f64;
    let recall = marked_spam as f64 / spam as f64;

    // Reused verdicts against the model's own verdict of each post's text:
    // reuse is by identical text, so they agree, evasions included.
    let reused: Vec<&CampaignPost> = posts
        .iter()
        .filter(|p| verdicts[&p.event.event_id]["reason"]["reused"] == true)
        .collect();
    let raw: Vec<String> = reused
        .iter()
        .map(|p| p.event.text.clone().unwrap())
        .collect();
    let own = model_verdicts(&settings, &raw);
    let verdict_of = |p: &CampaignPost| {
        verdicts[&p.event.event_id]["verdict"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let disagreeing: Vec<(&str, String, Verdict)> = reused
        .iter()
        .zip(&own)
        .filter(|(p, v)| verdict_of(p) != v.as_str())
        .map(|(p, v)| (p.event.event_id.as_str(), verdict_of(p), *v))
        .collect();
    let mut own_kinds: Vec<&str> = own.iter().map(|v| v.as_str()).collect();
    own_kinds.sort();
    own_kinds.dedup();
    let waves = support::read_to_end(&bootstrap, WAVES).await;
    let started = waves
        .iter()
        .filter(|r| r.json().unwrap()["started"] == true)
        .count();
    eprintln!(
        "campaign: {spam} campaign posts of {}; in a wave: {marked_spam} campaign, {marked_normal} normal (precision {precision:.3}, recall {recall:.3}); reused {} ({} disagreeing with the model's verdict of the text; the model's verdicts of them {own_kinds:?}); wave records {} ({started} started)",
        posts.len(),
        reused.len(),
        disagreeing.len(),
        waves.len()
    );
    assert!(precision >= 0.99, "precision {precision}");
    assert!(recall >= 0.75, "recall {recall}");
    assert!(
        reused.len() * 2 >= marked_spam,
        "most posts of a wave reuse: {}",
        reused.len()
    );
    assert!(
        disagreeing.is_empty(),
        "reused verdicts unlike the model's: {disagreeing:?}"
    );
    assert!(
        own_kinds.len() >= 2,
        "the reused verdicts are not all one kind: {own_kinds:?}"
    );
    assert_eq!(started, 5, "one wave per template");
    assert!(reused.iter().all(|p| p.template.is_some()));
}

/// Instances join and leave while waves are forming: their clusters are
/// lost with their partitions (found again on the next owner), no verdict
/// is lost and every offset is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_joining_and_leaving_mid_wave_lose_nothing() {
    support::init_logs();
    let broker = broker(4);
    let bootstrap = broker.bootstrap_servers().to_string();
    let posts = generate_campaign(3000, &Campaign::default(), "r-");
    let producing =
        support::produce_paced(bootstrap.clone(), triples(&posts), Duration::from_secs(6));
    let dir = tempfile::tempdir().unwrap();
    let group = "g-mid-wave";
    let settings = settings(dir.path(), &bootstrap, group, "waves = true\nreuse = true");
    let start = |s: &Settings| {
        let shutdown = Shutdown::new();
        let run = tokio::spawn(modstream::pipeline::run(s.clone(), shutdown.clone()));
        (shutdown, run)
    };
    let (stop_a, a) = start(&settings);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (stop_b, b) = start(&settings);
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_a.stop.cancel();
    a.await.unwrap().unwrap();
    let (stop_c, c) = start(&settings);
    let last_move = chrono::Utc::now();
    let acked = tokio::task::spawn_blocking(move || producing.join().unwrap())
        .await
        .unwrap();
    let b2 = bootstrap.clone();
    let verification =
        tokio::task::spawn_blocking(move || support::verify(&b2, &acked, Duration::from_secs(60)))
            .await
            .unwrap();
    let committed = committed_sum(&bootstrap, group, 4, posts.len() as i64).await;
    stop_b.stop.cancel();
    stop_c.stop.cancel();
    b.await.unwrap().unwrap();
    c.await.unwrap().unwrap();
    verification.report("mid-wave");
    assert!(
        verification.lost.is_empty(),
        "lost {:?}",
        &verification.lost[..verification.lost.len().min(10)]
    );
    assert_eq!(committed, posts.len() as i64, "committed == end");
    let verdicts = support::read_to_end(&bootstrap, VERDICTS).await;
    let template: HashMap<&str, Option<usize>> = posts
        .iter()
        .map(|p| (p.event.event_id.as_str(), p.template))
        .collect();
    // After the last move (c joined, a left), each template's wave is found
    // again by the partitions' new owners; no normal post is in one.
    let mut found_after = std::collections::BTreeSet::new();
    let mut normal_in_wave = 0;
    for r in &verdicts {
        let v = r.json().unwrap();
        if v["reason"].get("wave").is_none() {
            continue;
        }
        let judged: chrono::DateTime<chrono::Utc> =
            v["processed_at"].as_str().unwrap().parse().unwrap();
        match template[v["event_id"].as_str().unwrap()] {
            Some(t) if judged > last_move => {
                found_after.insert(t);
            }
            Some(_) => {}
            None => normal_in_wave += 1,
        }
    }
    eprintln!(
        "mid-wave: {} verdicts, templates in a wave after the last move {found_after:?}, {} duplicates",
        verdicts.len(),
        verification.duplicates
    );
    assert_eq!(normal_in_wave, 0, "no normal post in a wave");
    assert_eq!(
        found_after.len(),
        5,
        "every template's wave found again after the moves"
    );
}

/// Issue 46's attack with the shipped profanity model: eight accounts post
/// 40 variants of a benign text until it is a wave (reuse on) and their
/// verdicts are out; then 20 more benign repeats, 60 variants with one or
/// two words swapped for insults, and posts whose look-alike letters fool
/// the model followed by the plain text. Every verdict is the model's own
/// verdict of that post's text: no post takes a less strict verdict from
/// the wave, while every benign repeat after the wave was scored reuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spammer_cannot_make_insults_reuse_a_benign_waves_scores() {
    // The benign posts that make the wave, then its benign repeats; the
    // attack follows them.
    const WAVE: usize = 40;
    const REPEATS: usize = 20;
    support::init_logs();
    let broker = broker(2);
    let bootstrap = broker.bootstrap_servers().to_string();
    let benign = [
        "hey neighbor you did a great job on the garden this spring it looks lovely now",
        "hey neighbor you did a great job on the garden this spring it looks lovely today",
        "hey neighbor you did a great job on the garden this spring it looks really lovely",
        "hey neighbor you did a wonderful job on the garden this spring it looks lovely",
    ];
    let insults = ["fucking", "shitty", "crappy", "stupid", "damn"];
    let mut texts: Vec<String> = (0..WAVE + REPEATS)
        .map(|i| benign[i % benign.len()].to_string())
        .collect();
    for i in 0..60 {
        let mut words: Vec<&str> = benign[i % benign.len()].split(' ').collect();
        words[5] = insults[i % insults.len()];
        if i % 3 == 0 {
            words[1] = "idiot";
        }
        texts.push(words.join(" "));
    }
    // A look-alike evasion first (Cyrillic і, о), then the plain text.
    for _ in 0..10 {
        texts.push(
            "hey neighbоr you did a fuсking jоb on the garden this spring it looks lovely".into(),
        );
        texts.push(
            "hey neighbor you did a fucking job on the garden this spring it looks lovely".into(),
        );
    }
    let events: Vec<(String, String, Vec<u8>)> = texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let id = format!("a-{i}");
            let user = format!("acct-{}", i % 8);
            let payload = serde_json::json!({"event_id": id, "text": text, "user_id": user});
            (id, user, payload.to_string().into_bytes())
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let matching = "waves = true\nreuse = true\nwave_posts = 20\nwave_users = 5";
    let settings = settings(dir.path(), &bootstrap, "g-attack", matching);
    let shutdown = Shutdown::new();
    let pipeline = tokio::spawn(modstream::pipeline::run(settings.clone(), shutdown.clone()));
    // The wave's verdicts first: its scores are then kept, whatever the
    // batches were, so every repeat after it has scores to reuse.
    let (first, rest) = events.split_at(WAVE);
    let (b, first) = (bootstrap.clone(), first.to_vec());
    tokio::task::spawn_blocking(move || support::produce(&b, &first))
        .await
        .unwrap();
    support::read_records(&bootstrap, VERDICTS, 2, WAVE).await;
    let (b, rest) = (bootstrap.clone(), rest.to_vec());
    tokio::task::spawn_blocking(move || support::produce(&b, &rest))
        .await
        .unwrap();
    let verdicts = by_id(&support::read_records(&bootstrap, VERDICTS, 2, texts.len()).await);
    shutdown.stop.cancel();
    pipeline.await.unwrap().unwrap();
    let own = model_verdicts(&settings, &texts);
    let mut served_less_strict = Vec::new();
    let (mut repeats_reused, mut in_wave, mut flagged) = (0, 0, 0);
    let attack = WAVE + REPEATS;
    for (i, want) in own.iter().enumerate() {
        let v = &verdicts[&format!("a-{i}")];
        let got = Verdict::parse(v["verdict"].as_str().unwrap()).unwrap();
        if got < *want {
            served_less_strict.push((i, texts[i].clone(), got, *want));
        }
        let reused = v["reason"]["reused"] == true;
        repeats_reused += usize::from((WAVE..attack).contains(&i) && reused);
        in_wave += usize::from(i >= attack && v["reason"].get("wave").is_some());
        flagged += usize::from(i >= attack && *want > Verdict::Allow);
    }
    eprintln!(
        "attack: {} posts, {repeats_reused} of {REPEATS} benign repeats reused, {in_wave} of the 80 attack posts in the wave, {flagged} of them flagged by the model",
        texts.len()
    );
    assert!(
        served_less_strict.is_empty(),
        "bypasses: {served_less_strict:?}"
    );
    assert!(in_wave >= 30, "the insults joined the wave: {in_wave}");
    assert!(flagged > 40, "the model flags the insults: {flagged}");
    assert_eq!(
        repeats_reused, REPEATS,
        "every benign repeat reuses the wave's scores"
    );
}
