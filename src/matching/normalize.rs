//! Normalisation: the one form of a text that list items, waves and hashes
//! are matched on, so that the usual evasions land on the same form.
//!
//! | written | normalised | evasion |
//! |---|---|---|
//! | `Frее Mоney` (Cyrillic е, о) | `fre money` | look-alike letters, case |
//! | `Ｆｒｅｅ ｍｏｎｅｙ` | `fre money` | full-width letters |
//! | `f.u.c.k` | `fuck` | punctuation between letters |
//! | `fr\u{200d}ee money` | `fre money` | zero-width characters |
//! | `free🔥money` | `fre money` | emoji inserted |
//! | `FREEEE money!!!` | `fre money` | repeated letters and punctuation |
//!
//! Steps: zero-width and other format characters and punctuation are
//! removed; whitespace, emoji and other symbols separate words; text that
//! is not plain ASCII is cured of confusables (decancer: look-alike and
//! styled letters to their plain Latin form, zalgo marks removed), keeping
//! the scripts that have no Latin look-alikes (Arabic, Hebrew, Chinese,
//! Japanese, Korean, Thai, Devanagari, Bengali, Tamil) as they are, so that
//! their texts do not all collapse to the same string; then lower case,
//! runs of one letter (and of spaces) become one; digits stay as written. Cyrillic and Greek
//! are read as their Latin look-alikes (that is the evasion); their texts
//! stay distinct from one another.

use unicode_normalization::char::is_combining_mark;

/// Which scripts decancer leaves alone (see the module's docs).
fn cure_options() -> decancer::Options {
    decancer::Options::default()
        .disable_bidi()
        .retain_arabic()
        .retain_hebrew()
        .retain_chinese()
        .retain_japanese()
        .retain_korean()
        .retain_thai()
        .retain_devanagari()
        .retain_bengali()
        .retain_tamil()
}

/// The normalised form of `text` (see the module's docs).
pub fn normalize(text: &str) -> String {
    if text.is_ascii() {
        return normalize_ascii(text.as_bytes());
    }
    normalize_unicode(text)
}

fn normalize_unicode(text: &str) -> String {
    let mut words = String::with_capacity(text.len());
    let mut ascii = true;
    for c in text.chars() {
        if c.is_alphanumeric() || is_combining_mark(c) {
            ascii &= c.is_ascii();
            words.push(c);
        } else if is_invisible(c) || is_punctuation(c) {
            // Removed: "f.u.c.k" and "f\u{200b}uck" are "fuck".
        } else {
            words.push(' ');
        }
    }
    let cured = if ascii {
        words
    } else {
        // Cure fails only on text its bidi step cannot order, which is off.
        decancer::cure(&words, cure_options())
            .map(|c| c.to_string())
            .unwrap_or(words)
    };
    let mut out = String::with_capacity(cured.len());
    let mut last = ' ';
    for c in cured.chars().flat_map(char::to_lowercase) {
        let c = if c.is_alphanumeric() || is_combining_mark(c) {
            c
        } else if c.is_whitespace() {
            ' '
        } else {
            continue;
        };
        // Repeated letters and spaces collapse; digits do not ("555").
        if c != last || c.is_numeric() {
            out.push(c);
        }
        last = c;
    }
    if out.ends_with(' ') {
        out.pop();
    }
    out
}

/// [`normalize`] of ASCII text, in one pass: nothing to cure, and byte
/// tests in place of Unicode tables (most posts are ASCII).
fn normalize_ascii(text: &[u8]) -> String {
    let mut out = Vec::with_capacity(text.len());
    let mut last = b' ';
    for &b in text {
        let c = if b.is_ascii_alphanumeric() {
            b.to_ascii_lowercase()
        } else if b.is_ascii_punctuation() {
            continue;
        } else {
            b' '
        };
        if c != last || c.is_ascii_digit() {
            out.push(c);
        }
        last = c;
    }
    if out.last() == Some(&b' ') {
        out.pop();
    }
    // Only ASCII bytes were pushed.
    String::from_utf8(out).unwrap_or_default()
}

/// The hash of a normalised text: a list item's `hash`, and exact matching.
pub fn text_hash(normalized: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(normalized.as_bytes())
}

/// The words of a normalised text.
pub fn words(normalized: &str) -> impl Iterator<Item = &str> {
    normalized.split(' ').filter(|w| !w.is_empty())
}

/// Zero-width, joiner, direction and other format characters.
fn is_invisible(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{180E}'
        | '\u{200B}'..='\u{200F}'
        | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{206F}'
        | '\u{FE00}'..='\u{FE0F}'
        | '\u{FEFF}'
        | '\u{E0000}'..='\u{E007F}')
}

/// Punctuation (ASCII, Latin-1, general, CJK and full-width).
fn is_punctuation(c: char) -> bool {
    c.is_ascii_punctuation()
        || matches!(c,
            '\u{00A1}' | '\u{00A7}' | '\u{00AB}' | '\u{00B6}' | '\u{00B7}' | '\u{00BB}' | '\u{00BF}'
            | '\u{2010}'..='\u{2027}'
            | '\u{2030}'..='\u{205E}'
            | '\u{3001}'..='\u{3003}'
            | '\u{3008}'..='\u{3011}'
            | '\u{FF01}'..='\u{FF0F}'
            | '\u{FF1A}'..='\u{FF20}'
            | '\u{FF3B}'..='\u{FF40}'
            | '\u{FF5B}'..='\u{FF65}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_evasions_normalise_to_one_form() {
        for written in [
            "Free Money",
            "Frее Mоney",
            "Ｆｒｅｅ ｍｏｎｅｙ",
            "fr\u{200d}ee mo\u{200b}ney",
            "free🔥money",
            "FREEEE money!!!",
            "  free   money ",
            "F.r.e.e m-o-n-e-y",
            "𝐟𝐫𝐞𝐞 𝐦𝐨𝐧𝐞𝐲",
        ] {
            assert_eq!(normalize(written), "fre money", "{written:?}");
        }
        assert_eq!(normalize("f.u.c.k"), "fuck");
        assert_eq!(normalize("ẑ̷͈a̵l̸g̷o"), "zalgo");
    }

    #[test]
    fn scripts_without_latin_look_alikes_stay_as_they_are() {
        assert_eq!(normalize("مرحبا بالعالم"), "مرحبا بالعالم");
        assert_eq!(normalize("你好世界！"), "你好世界");
        assert_eq!(normalize("こんにちは"), "こんにちは");
        assert_eq!(normalize("שלום"), "שלום");
        assert_ne!(normalize("привет мир"), normalize("пока мир"));
        assert!(!normalize("привет мир").is_empty());
    }

    #[test]
    fn ascii_text_takes_the_short_path_to_the_same_form() {
        let mut texts: Vec<&str> = crate::tools::generator::sample_posts()
            .into_iter()
            .map(|(_, t)| t)
            .collect();
        texts.extend(["A\tB\x07C  d--e!!!", "  555-0100 ", "aaa...bbb", ""]);
        for t in texts {
            assert_eq!(normalize_ascii(t.as_bytes()), normalize_unicode(t), "{t:?}");
        }
    }

    #[test]
    fn text_without_letters_is_empty() {
        assert_eq!(normalize("🔥🔥🔥 !!!"), "");
        assert_eq!(normalize(""), "");
    }
}
