//! The event generator: a deterministic stream of posts of realistic,
//! skewed length from the sample posts (benign and abusive), with urgent and
//! malformed records mixed in. Used by `produce`, `demo`, `bench` and the
//! tests.

const SAMPLE_POSTS: &str = include_str!("../../data/sample_posts.txt");

/// (is_abusive, text) for every sample post.
pub fn sample_posts() -> Vec<(bool, &'static str)> {
    SAMPLE_POSTS
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('|'))
        .map(|(label, text)| (label == "abusive", text))
        .collect()
}

/// One generated input record.
#[derive(Debug, Clone)]
pub struct GeneratedEvent {
    pub event_id: String,
    pub key: String,
    pub payload: Vec<u8>,
    /// The text when the payload is a valid event; None for malformed ones.
    pub text: Option<String>,
    /// Marked `"priority": "urgent"`.
    pub urgent: bool,
}

/// What a generated stream holds.
#[derive(Debug, Clone)]
pub struct Mix {
    /// Every n-th record is malformed (0 = none).
    pub malformed_every: usize,
    /// Fraction of valid posts written from the abusive samples.
    pub abusive_share: f64,
    /// Fraction of valid posts marked `"priority": "urgent"`.
    pub urgent_share: f64,
    /// `None`: texts built from the sample posts as they are (almost every
    /// text repeats). `Some(share)`: every text unique except this share of
    /// posts, which copy an earlier post's text exactly (reposts, spam waves).
    pub repeat_share: Option<f64>,
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            malformed_every: 100,
            abusive_share: 0.2,
            urgent_share: 0.05,
            repeat_share: None,
        }
    }
}

/// [`generate_mix`] with the default shares and `malformed_every`.
pub fn generate(count: usize, malformed_every: usize, prefix: &str) -> Vec<GeneratedEvent> {
    let mix = Mix {
        malformed_every,
        ..Default::default()
    };
    generate_mix(count, &mix, prefix)
}

/// A cheap deterministic hash (splitmix64), so that streams repeat exactly.
pub fn spread(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A post of realistic, skewed length built from the sample posts of one
/// class: a quarter are short replies (a few words), most are one post, some
/// two to four, one in fifty a long thread (eight posts, ~150+ tokens).
pub fn post_text(i: usize, abusive: bool) -> String {
    let posts = sample_posts();
    let pool: Vec<&str> = posts
        .iter()
        .filter(|(a, _)| *a == abusive)
        .map(|(_, t)| *t)
        .collect();
    let pick = |k: u64| pool[(spread(i as u64 * 31 + k) % pool.len() as u64) as usize];
    let joined = |n: u64| (1..=n).map(pick).collect::<Vec<_>>().join(" ");
    match spread(i as u64) % 100 {
        0..25 => {
            let words = 2 + (spread(i as u64 + 7) % 4) as usize;
            pick(1)
                .split_whitespace()
                .take(words)
                .collect::<Vec<_>>()
                .join(" ")
        }
        25..80 => pick(1).to_string(),
        80..92 => joined(2),
        92..98 => joined(3 + spread(i as u64 + 3) % 2),
        _ => joined(8),
    }
}

/// A deterministic stream: every `malformed_every`-th record is malformed,
/// posts of skewed length with the given abusive and urgent shares, keys
/// over 500 users.
pub fn generate_mix(count: usize, mix: &Mix, prefix: &str) -> Vec<GeneratedEvent> {
    let malformed_every = mix.malformed_every;
    let malformed: [&[u8]; 5] = [
        b"this is not json",
        br#"{"event_id":"x"}"#,
        b"[1,2,3]",
        b"{\"event_id\":\"bad-utf8\",\"text\":\"\xff\xfe\"}",
        br#"{"event_id":"","text":"empty id"}"#,
    ];
    let share = |i: usize, salt: u64, fraction: f64| {
        (spread(i as u64 ^ salt) % 10_000) < (fraction.clamp(0.0, 1.0) * 10_000.0) as u64
    };
    (0..count)
        .map(|i| {
            let event_id = format!("{prefix}{i}");
            let key = format!("user-{}", i % 500);
            if malformed_every > 0 && i % malformed_every == malformed_every - 1 {
                let payload = malformed[(i / malformed_every) % malformed.len()].to_vec();
                return GeneratedEvent {
                    event_id,
                    key,
                    payload,
                    text: None,
                    urgent: false,
                };
            }
            let text = match mix.repeat_share {
                None => post_text(i, share(i, 0xAB, mix.abusive_share)),
                Some(repeats) => {
                    let unique = |j: usize| {
                        format!("{} #{j:x}", post_text(j, share(j, 0xAB, mix.abusive_share)))
                    };
                    let is_repeat = |j: usize| j > 0 && share(j, 0x5E, repeats);
                    // A repeat copies an earlier post that was itself an original.
                    let original = (0..32)
                        .map(|k| (spread((i as u64) << 5 | k) % i.max(1) as u64) as usize)
                        .find(|j| !is_repeat(*j));
                    match original {
                        Some(j) if is_repeat(i) => unique(j),
                        _ => unique(i),
                    }
                }
            };
            let urgent = share(i, 0x0E, mix.urgent_share);
            let priority = if urgent { "urgent" } else { "normal" };
            let payload = serde_json::json!({
                "event_id": event_id,
                "text": text,
                "user_id": key,
                "lang": "en",
                "created_at": chrono::Utc::now().timestamp_millis(),
                "priority": priority,
            })
            .to_string()
            .into_bytes();
            GeneratedEvent {
                event_id,
                key,
                payload,
                text: Some(text.to_string()),
                urgent,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_streams_honour_the_shares_and_have_a_long_tail() {
        let mix = Mix {
            malformed_every: 50,
            abusive_share: 0.3,
            urgent_share: 0.1,
            repeat_share: None,
        };
        let events = generate_mix(10_000, &mix, "x-");
        let valid: Vec<&GeneratedEvent> = events.iter().filter(|e| e.text.is_some()).collect();
        assert_eq!(events.len() - valid.len(), 200);
        let abusive: std::collections::HashSet<&str> = sample_posts()
            .into_iter()
            .filter(|(a, _)| *a)
            .map(|(_, t)| t)
            .collect();
        let share = |f: &dyn Fn(&GeneratedEvent) -> bool| {
            valid.iter().filter(|e| f(e)).count() as f64 / valid.len() as f64
        };
        let abusive_share = share(&|e| {
            let t = e.text.as_deref().unwrap();
            abusive.iter().any(|a| a.starts_with(t) || t.starts_with(a))
        });
        let urgent_share = share(&|e| {
            let v: serde_json::Value = serde_json::from_slice(&e.payload).unwrap();
            v["priority"] == "urgent"
        });
        assert!((0.27..0.33).contains(&abusive_share), "{abusive_share}");
        assert!((0.08..0.12).contains(&urgent_share), "{urgent_share}");
        let words: Vec<f64> = valid
            .iter()
            .map(|e| e.text.as_deref().unwrap().split_whitespace().count() as f64)
            .collect();
        let median = crate::tools::stats::median(&words).unwrap();
        let p99 = crate::tools::stats::percentile(&words, 0.99).unwrap();
        assert!(p99 > 5.0 * median, "median {median} words, p99 {p99}");
        // Deterministic: the same stream every time.
        assert_eq!(
            generate_mix(100, &mix, "x-")[7].payload.len(),
            events[7].payload.len()
        );
    }

    #[test]
    fn the_repeat_share_is_the_share_of_texts_seen_before() {
        for target in [0.0, 0.3, 0.7] {
            let mix = Mix {
                malformed_every: 0,
                repeat_share: Some(target),
                ..Default::default()
            };
            let events = generate_mix(10_000, &mix, "r-");
            let mut seen = std::collections::HashSet::new();
            let repeats = events
                .iter()
                .filter(|e| !seen.insert(e.text.clone().unwrap()))
                .count();
            let share = repeats as f64 / events.len() as f64;
            assert!((share - target).abs() < 0.03, "asked {target}, got {share}");
        }
    }
}
