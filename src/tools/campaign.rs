//! A synthetic spam campaign mixed into diverse normal traffic, with its
//! truth: the tests' and the bench's stream of near-duplicates.
//!
//! A campaign post is one of [`Campaign::variants`] variants of one of
//! [`TEMPLATES`], posted by one of [`Campaign::users`] accounts: the
//! template with the usual evasions (look-alike Cyrillic letters, emoji
//! between words, upper case and "!!!", repeated letters and zero-width
//! joiners), a code of its own at the end, and in one variant of four one
//! word swapped. A normal post is
//! 6 to 20 words drawn from the sample posts' vocabulary, by one of 5,000
//! users: unique, and unlike any other.

use super::generator::{GeneratedEvent, sample_posts, spread};

/// The campaign's texts: four spam, one harassment (which the profanity
/// model flags).
pub const TEMPLATES: [&str; 5] = [
    "win a free phone today just click the link in my bio and claim it now",
    "earn five hundred dollars a day working from home message me to learn how",
    "cheap followers and likes for your account best price guaranteed dm us today",
    "our crypto signals group made forty percent this week join before the doors close",
    "you are a stupid worthless idiot and everyone here hates you so shut up and leave",
];

const SWAPS: [&str; 8] = [
    "really", "totally", "super", "honestly", "right", "fast", "quick", "easy",
];

/// What the stream holds.
#[derive(Debug, Clone)]
pub struct Campaign {
    /// Share of posts from the campaign.
    pub share: f64,
    /// How many of [`TEMPLATES`] it uses.
    pub templates: usize,
    pub variants: usize,
    pub users: usize,
}

impl Default for Campaign {
    fn default() -> Self {
        Campaign {
            share: 0.3,
            templates: TEMPLATES.len(),
            variants: 40,
            users: 200,
        }
    }
}

/// A generated post and its truth.
#[derive(Debug, Clone)]
pub struct CampaignPost {
    pub event: GeneratedEvent,
    /// The template a campaign post came from; None for a normal post.
    pub template: Option<usize>,
}

/// `count` posts, deterministic.
pub fn generate_campaign(count: usize, campaign: &Campaign, prefix: &str) -> Vec<CampaignPost> {
    let vocabulary = vocabulary();
    (0..count)
        .map(|i| {
            let h = |salt: u64| spread(i as u64 ^ salt.wrapping_mul(0x9E37_79B9));
            let spam = (h(1) % 10_000) < (campaign.share.clamp(0.0, 1.0) * 10_000.0) as u64;
            let (text, user, template) = if spam {
                let t = (h(2) % campaign.templates.clamp(1, TEMPLATES.len()) as u64) as usize;
                let v = (h(3) % campaign.variants.max(1) as u64) as usize;
                let user = format!("spammer-{}", h(4) % campaign.users.max(1) as u64);
                (variant(t, v), user, Some(t))
            } else {
                let words = 6 + (h(5) % 15) as usize;
                let text: Vec<&str> = (0..words)
                    .map(|k| vocabulary[(h(100 + k as u64) % vocabulary.len() as u64) as usize])
                    .collect();
                (text.join(" "), format!("user-{}", h(6) % 5000), None)
            };
            let event_id = format!("{prefix}{i}");
            let payload = serde_json::json!({
                "event_id": event_id, "text": text, "user_id": user, "lang": "en",
            })
            .to_string()
            .into_bytes();
            CampaignPost {
                event: GeneratedEvent {
                    event_id,
                    key: user,
                    payload,
                    text: Some(text),
                    urgent: false,
                },
                template,
            }
        })
        .collect()
}

/// Variant `v` of template `t` (see the module's docs).
pub fn variant(t: usize, v: usize) -> String {
    let mut words: Vec<String> = TEMPLATES[t].split(' ').map(str::to_string).collect();
    // Every variant its own text: a code at the end.
    words.push(format!("{}", 100 + v));
    if v % 4 == 3 {
        let at = 1 + v % (words.len() - 2);
        words[at] = SWAPS[(v / 4) % SWAPS.len()].to_string();
    }
    match v % 5 {
        1 => words
            .iter()
            .map(|w| w.replacen('a', "а", 1).replacen('o', "о", 1))
            .collect::<Vec<_>>()
            .join(" "),
        2 => words.join(if v.is_multiple_of(2) {
            " 🔥 "
        } else {
            " 💰"
        }),
        3 => format!("{}!!!", words.join(" ").to_uppercase()),
        4 => words
            .iter()
            .map(|w| match w.len() {
                0..4 => w.clone(),
                n => format!(
                    "{}\u{200d}{}{}",
                    &w[..2],
                    &w[2..n - 1],
                    w[n - 1..].repeat(3)
                ),
            })
            .collect::<Vec<_>>()
            .join(" "),
        _ => words.join(" "),
    }
}

/// A known-bad list file of `n` (up to 1,000) distinct spam items, none of
/// them a sample post or a campaign template: 10 openings × 5 objects × 20
/// offers, one JSON item per line.
pub fn known_bad_list(n: usize) -> String {
    let opens = [
        "win", "claim", "grab", "get", "score", "collect", "unlock", "redeem", "receive", "take",
    ];
    let whats = ["a free", "your bonus", "the cash", "a gift card", "crypto"];
    let offers = [
        "iphone now",
        "prize today",
        "reward here",
        "voucher fast",
        "payout instantly",
        "airdrop tonight",
        "coupon code",
        "discount deal",
        "jackpot spin",
        "lottery ticket",
        "followers pack",
        "likes bundle",
        "loan approval",
        "credit boost",
        "trading signal",
        "casino bonus",
        "diet pills",
        "watch replica",
        "dating match",
        "investment tip",
    ];
    let mut out = String::new();
    let texts = opens
        .iter()
        .flat_map(|o| whats.iter().map(move |w| (o, w)))
        .flat_map(|(o, w)| {
            offers
                .iter()
                .map(move |f| format!("{o} {w} {f} click the link in my bio dm me"))
        });
    for (i, text) in texts.take(n).enumerate() {
        let item = serde_json::json!({"id": format!("t{i}"), "verdict": "block", "label": "spam", "text": text});
        out.push_str(&item.to_string());
        out.push('\n');
    }
    out
}

/// `n` distinct texts of `words` words each (`words` ≥ 2) for lists and
/// clusters that grow past what [`known_bad_list`]'s phrases make: the
/// first word spells the text's number (so no two are alike), the others
/// come from a vocabulary of 32,768 made-up words, drawn by `seed`.
pub fn distinct_texts(n: usize, words: usize, seed: u64) -> impl Iterator<Item = String> {
    const SYLLABLES: [&str; 32] = [
        "ka", "lo", "mi", "nu", "pe", "ra", "so", "ti", "vu", "wa", "be", "do", "fi", "gu", "ha",
        "je", "ko", "la", "me", "ni", "po", "ru", "se", "ta", "vo", "we", "zi", "ba", "de", "fo",
        "gi", "hu",
    ];
    let spell = |mut v: u64, syllables: usize| {
        let mut word = String::new();
        for _ in 0..syllables {
            word.push_str(SYLLABLES[(v % 32) as usize]);
            v /= 32;
        }
        word
    };
    (0..n as u64).map(move |i| {
        // Five syllables spell up to 32^5 numbers, one word per text.
        let mut text = format!("x{}", spell(i, 5));
        for k in 1..words as u64 {
            let drawn = super::generator::spread(seed ^ (i * 64 + k));
            text.push(' ');
            text.push_str(&spell(drawn % 32_768, 3));
        }
        text
    })
}

/// A known-bad list file of the texts given (ids `d0` … , block, spam).
pub fn list_file(texts: impl Iterator<Item = String>) -> String {
    let mut out = String::new();
    for (i, text) in texts.enumerate() {
        let item = serde_json::json!({"id": format!("d{i}"), "verdict": "block", "label": "spam", "text": text});
        out.push_str(&item.to_string());
        out.push('\n');
    }
    out
}

/// The sample posts' words, lower case, without punctuation.
fn vocabulary() -> Vec<&'static str> {
    let mut words: Vec<&'static str> = sample_posts()
        .into_iter()
        .flat_map(|(_, t)| t.split(|c: char| !c.is_alphanumeric() && c != '\''))
        .filter(|w| w.len() > 1)
        .collect();
    words.sort_unstable();
    words.dedup();
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_has_its_share_of_campaign_posts_from_its_users() {
        let posts = generate_campaign(2000, &Campaign::default(), "c-");
        let spam: Vec<&CampaignPost> = posts.iter().filter(|p| p.template.is_some()).collect();
        let share = spam.len() as f64 / posts.len() as f64;
        assert!((0.27..0.33).contains(&share), "{share}");
        let texts: std::collections::HashSet<&str> = spam
            .iter()
            .map(|p| p.event.text.as_deref().unwrap())
            .collect();
        assert!(
            texts.len() > 150,
            "40 variants of 5 templates: {}",
            texts.len()
        );
        let users: std::collections::HashSet<&str> =
            spam.iter().map(|p| p.event.key.as_str()).collect();
        assert!(users.len() > 150 && users.len() <= 200, "{}", users.len());
        assert_eq!(variant(0, 5), format!("{} 105", TEMPLATES[0]));
        assert!(variant(0, 1).contains('а'), "Cyrillic а");
        assert_ne!(variant(0, 3), variant(0, 7));
    }

    #[test]
    fn distinct_texts_are_distinct_once_normalised() {
        let texts: Vec<String> = distinct_texts(40_000, 8, 1).collect();
        let normal: std::collections::HashSet<String> = texts
            .iter()
            .map(|t| crate::matching::normalize::normalize(t))
            .collect();
        assert_eq!(normal.len(), texts.len());
        // Distinct by their first word alone, whatever the others draw.
        let firsts: std::collections::HashSet<&str> =
            texts.iter().filter_map(|t| t.split(' ').next()).collect();
        assert_eq!(firsts.len(), texts.len());
        assert!(texts.iter().all(|t| t.split(' ').count() == 8));
        assert_ne!(
            distinct_texts(1, 8, 1).next(),
            distinct_texts(1, 8, 2).next()
        );
    }
}
