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
    /// How long the posts are.
    pub lengths: Lengths,
}

/// The lengths of a stream's posts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lengths {
    /// [`post_text`]: sample posts as they are, a few threads of several.
    #[default]
    Skewed,
    /// [`long_tail_text`]: most posts under 20 tokens, a tail to 512.
    LongTail,
    /// Every post of about this many bytes (cut at a word).
    Bytes(usize),
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            malformed_every: 100,
            abusive_share: 0.2,
            urgent_share: 0.05,
            repeat_share: None,
            lengths: Lengths::Skewed,
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

/// A post of about `bytes` bytes (a WordPiece token is about four in
/// English), the sample posts of one class run together and cut at a word.
fn text_of_bytes(i: usize, abusive: bool, bytes: usize) -> String {
    let mut text = String::with_capacity(bytes + 64);
    let mut k = 0;
    while text.len() < bytes {
        let next = post_text(i.wrapping_mul(7919).wrapping_add(k), abusive);
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(&next);
        k += 1;
    }
    let end = text.floor_char_boundary(bytes);
    let cut = text[..end].rfind(' ').unwrap_or(end);
    text.truncate(cut.max(1));
    text
}

/// A post from a long-tailed mix of lengths, in predicted tokens: 70 %
/// 4–19, 20 % 20–63, 8 % 64–255, 2 % 256–511.
pub fn long_tail_text(i: usize, abusive: bool) -> String {
    let r = spread(i as u64 ^ 0x7A11);
    let within = |lo: u64, hi: u64| (lo + (r >> 8) % (hi - lo)) as usize;
    let tokens = match r % 100 {
        0..70 => within(4, 20),
        70..90 => within(20, 64),
        90..98 => within(64, 256),
        _ => within(256, 512),
    };
    text_of_bytes(i, abusive, tokens * 4)
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
                None => {
                    let abusive = share(i, 0xAB, mix.abusive_share);
                    match mix.lengths {
                        Lengths::Skewed => post_text(i, abusive),
                        Lengths::LongTail => long_tail_text(i, abusive),
                        Lengths::Bytes(n) => text_of_bytes(i, abusive, n),
                    }
                }
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
            lengths: Lengths::Skewed,
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
    fn the_long_tail_mix_is_mostly_short_with_a_tail_to_512_tokens() {
        let mix = Mix {
            malformed_every: 0,
            lengths: Lengths::LongTail,
            ..Default::default()
        };
        let events = generate_mix(5_000, &mix, "t-");
        // Predicted as the hub predicts before it learns: 2 + bytes ÷ 4.
        let tokens: Vec<f64> = (events.iter())
            .map(|e| 2.0 + e.text.as_deref().unwrap().len() as f64 / 4.0)
            .collect();
        let share_under = |t: f64| tokens.iter().filter(|&&n| n < t).count() as f64 / 5_000.0;
        assert!(
            (0.65..0.75).contains(&share_under(22.0)),
            "{}",
            share_under(22.0)
        );
        assert!(share_under(256.0) < 0.99 && share_under(256.0) > 0.97);
        let longest = tokens.iter().copied().fold(0.0, f64::max);
        assert!((480.0..=514.0).contains(&longest), "{longest}");
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
