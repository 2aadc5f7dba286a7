//! Normalisation: the one form of a text that list items, waves and hashes
//! are matched on, so that the usual evasions land on the same form. It is
//! for matching only: no model ever scores it, and no post takes another's
//! scores because their normal forms agree (see [`super::waves`]).
//!
//! | written | normalised | evasion |
//! |---|---|---|
//! | `Frее Mоney` (Cyrillic е, о) | `free money` | look-alike letters, case |
//! | `Ｆｒｅｅ ｍｏｎｅｙ`, `𝐟𝐫𝐞𝐞 𝐦𝐨𝐧𝐞𝐲` | `free money` | full-width and styled letters |
//! | `fr\u{200d}ee mo\u{200b}ney` | `free money` | zero-width characters |
//! | `f.u.c.k`, `F U C K`, `f🔥u🔥c🔥k` | `fuck` | letters apart |
//! | `win.a.free.phone` | `win a free phone` | punctuation between words |
//! | `fr33 m0ney`, `$ex`, `sh!t` | `free money`, `sex`, `shit` | leetspeak |
//! | `m०ney` (Devanagari ०) | `money` | look-alikes of a kept script |
//! | `ceӏebrate`, `ce1ebrate`, `CELEBRATE` | `ceiebrate` | `ӏ Ӏ I l 1 \|` are one letter |
//! | `FREEEE moneyyyy!!!` | `fre money` | letters repeated three times or more |
//! | `[money](http://x.y)` | `money http x y` | a link's word and address |
//!
//! Steps, per word (a run of letters, digits and marks; whitespace,
//! punctuation, emoji and other symbols separate words; zero-width and
//! other format characters, apostrophes and `*` are dropped in place):
//! 1. In a word with a letter, leetspeak is read as letters: `0 1 3 4 5 7`
//!    and `$ @` before a letter, `! |` between two (a word of digits stays
//!    as written: "555", "105").
//! 2. Look-alike letters become the plain letters they imitate (decancer:
//!    Cyrillic and Greek look-alikes, full-width, styled and enclosed
//!    letters). Scripts with no Latin look-alikes (Arabic, Hebrew, Chinese,
//!    Japanese, Korean, Thai, Devanagari, Bengali, Tamil) are kept as they
//!    are, unless a character of theirs sits in a word of Latin letters
//!    (`m०ney`). Latin letters with accents are kept (Vietnamese `má`,
//!    `mà`, `ma` are three words); marks stacked on a letter beyond what
//!    composes into one character (zalgo) are removed with the letter's own.
//! 3. Lower case; then one-letter words apart by punctuation or symbols
//!    (`f.u.c.k`, `f🔥u🔥c🔥k`), and runs of three or more apart by spaces
//!    (`f r e e`), become one word.
//! 4. A letter repeated three times or more is one ("fuuuck" is "fuck");
//!    twice stays twice ("good" is not "god"); digits are never collapsed.
//! 5. The look-alikes `i`, `l` (and, by steps 1 and 2, `I 1 | ! ӏ Ӏ`) are
//!    one letter, written `i`, as Unicode's confusable skeletons treat them.
//!
//! Texts in scripts written without spaces (Chinese, Japanese, Thai, Lao,
//! Khmer, Myanmar) keep their runs of characters as words; their shingles
//! are character pairs ([`super::similar`]).

use unicode_normalization::UnicodeNormalization;
use unicode_normalization::char::{decompose_canonical, is_combining_mark};

/// The version of the normal form: a list item's `hash` is of this one.
pub const VERSION: u32 = 2;

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
    // Words as read, each with whether it was a chunk (between whitespace)
    // of one letter: runs of those are letters spaced apart ("F U C K").
    let mut words: Vec<(String, bool)> = Vec::new();
    let mut chunk: Vec<String> = Vec::new();
    let mut raw: Vec<char> = Vec::new();
    // NFC first: a letter and its accent as one character, so that only
    // marks that compose into nothing (stacked, zalgo) are left over.
    let composed: Box<dyn Iterator<Item = char>> = if text.is_ascii() {
        Box::new(text.chars())
    } else {
        Box::new(text.nfc())
    };
    for c in composed {
        match class_of(c) {
            Class::Word | Class::Leet => raw.push(c),
            Class::Dropped => {}
            Class::Separator => {
                read_word(&raw, &mut chunk);
                raw.clear();
                if c.is_whitespace() {
                    end_chunk(&mut chunk, &mut words);
                }
            }
        }
    }
    read_word(&raw, &mut chunk);
    end_chunk(&mut chunk, &mut words);
    let mut out = String::with_capacity(text.len());
    for word in join_spaced_letters(words) {
        let word = collapse_and_fold(&word);
        if word.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&word);
    }
    out
}

/// Whether a word is one letter.
fn is_letter(w: &str) -> bool {
    let mut chars = w.chars();
    matches!((chars.next(), chars.next()), (Some(c), None) if c.is_alphabetic())
}

/// A chunk's words (between whitespace, apart by punctuation or symbols)
/// go to `words`; runs of two or more one-letter words of a chunk are one
/// word ("f.u.c.k", "f🔥u🔥c🔥k", "U.S.A").
fn end_chunk(chunk: &mut Vec<String>, words: &mut Vec<(String, bool)>) {
    let lone = chunk.len() == 1 && is_letter(&chunk[0]);
    let mut run: Vec<String> = Vec::new();
    for w in chunk.drain(..) {
        if is_letter(&w) {
            run.push(w);
            continue;
        }
        if !run.is_empty() {
            words.push((run.concat(), false));
            run.clear();
        }
        words.push((w, false));
    }
    if !run.is_empty() {
        words.push((run.concat(), lone));
    }
}

/// Runs of three or more chunks of one letter each are one word
/// ("F U C K", "f r e e").
fn join_spaced_letters(words: Vec<(String, bool)>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut run: Vec<String> = Vec::new();
    let flush = |run: &mut Vec<String>, out: &mut Vec<String>| {
        if run.len() >= 3 {
            out.push(run.concat());
        } else {
            out.append(run);
        }
        run.clear();
    };
    for (w, lone) in words {
        if lone {
            run.push(w);
        } else {
            flush(&mut run, &mut out);
            out.push(w);
        }
    }
    flush(&mut run, &mut out);
    out
}

/// What a character is to the tokenizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// A letter, digit or mark.
    Word,
    /// A symbol leetspeak writes letters with (read in [`read_word`]).
    Leet,
    /// Removed in place: the word goes on ("don't", "f*ck", "fr\u{200d}ee").
    Dropped,
    /// Ends a word: whitespace, other punctuation, emoji, symbols.
    Separator,
}

fn class_of(c: char) -> Class {
    if c.is_ascii() {
        return match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' => Class::Word,
            '$' | '@' | '!' | '|' => Class::Leet,
            '\'' | '`' | '*' => Class::Dropped,
            _ => Class::Separator,
        };
    }
    if c.is_alphanumeric() || is_combining_mark(c) {
        Class::Word
    } else if is_invisible(c) || matches!(c, '\u{2019}' | '\u{2018}' | '\u{02BC}' | '\u{00B4}') {
        Class::Dropped
    } else {
        Class::Separator
    }
}

/// One word's characters (letters, digits, marks and leet symbols) read
/// as plain lower-case letters, into `words`: steps 1 and 2 of the
/// module's docs. A leet symbol not read as a letter ends the word there
/// ("wow!!!great" is two words).
fn read_word(raw: &[char], words: &mut Vec<String>) {
    if raw.is_empty() {
        return;
    }
    let has_letter = raw.iter().any(|c| c.is_alphabetic());
    let latin = raw.iter().any(|c| c.is_ascii_alphabetic());
    let word_char = |x: Option<&char>| x.is_some_and(|&x| class_of(x) == Class::Word);
    let mut out = String::with_capacity(raw.len());
    for (i, &c) in raw.iter().enumerate() {
        let before = i.checked_sub(1).and_then(|j| raw.get(j));
        let after = raw.get(i + 1);
        if c.is_ascii() {
            let read = match c {
                '$' | '@' if has_letter && word_char(after) => Some(leet(c)),
                '!' | '|' if has_letter && word_char(before) && word_char(after) => Some(leet(c)),
                '$' | '@' | '!' | '|' => None,
                '0' | '1' | '3' | '4' | '5' | '7' if has_letter => Some(leet(c)),
                _ => Some(c.to_ascii_lowercase()),
            };
            match read {
                Some(r) => out.push(r),
                None if !out.is_empty() => words.push(std::mem::take(&mut out)),
                None => {}
            }
            continue;
        }
        if is_combining_mark(c) {
            // Left over after NFC: stacked marks. On a Latin, Greek or
            // Cyrillic letter they are zalgo: the letter loses its own
            // marks too. In other scripts marks are the writing itself.
            match out.pop() {
                Some(base) if is_alphabet_with_look_alikes(base) => out.push(base_letter(base)),
                Some(base) => {
                    out.push(base);
                    out.push(c);
                }
                None => {}
            }
            continue;
        }
        if is_latin_letter(c) {
            out.extend(c.to_lowercase().map(latin_look_alike));
            continue;
        }
        // A kept script's character inside a Latin word is a look-alike.
        let options = if latin {
            decancer::Options::default().disable_bidi()
        } else {
            cure_options()
        };
        match decancer::cure_char(c, options) {
            decancer::Translation::Character(t) => out.extend(t.to_lowercase()),
            decancer::Translation::String(s) => out.extend(s.chars().flat_map(char::to_lowercase)),
            decancer::Translation::None => {}
        }
    }
    if !out.is_empty() {
        words.push(out);
    }
}

/// Latin letters of the accented blocks that imitate plain ones (the rest
/// are letters of their languages and kept).
fn latin_look_alike(c: char) -> char {
    match c {
        '\u{0131}' | '\u{01C0}' => 'i',
        '\u{017F}' => 's',
        other => other,
    }
}

/// The letter leetspeak writes with `c`; `1 | !` are the `i`/`l` class.
fn leet(c: char) -> char {
    match c {
        '0' => 'o',
        '1' | '!' | '|' => 'i',
        '3' => 'e',
        '4' | '@' => 'a',
        '5' | '$' => 's',
        '7' => 't',
        other => other,
    }
}

/// Steps 4 and 5: letters repeated three times or more collapse to one;
/// `l` is written `i`.
fn collapse_and_fold(word: &str) -> String {
    let chars: Vec<char> = word.chars().collect();
    let mut out = String::with_capacity(word.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let run = chars[i..].iter().take_while(|&&x| x == c).count();
        let kept = if run >= 3 && !c.is_numeric() { 1 } else { run };
        for _ in 0..kept {
            out.push(if c == 'l' { 'i' } else { c });
        }
        i += run;
    }
    out
}

/// Latin letters, accented ones included (kept as written, lower-cased).
fn is_latin_letter(c: char) -> bool {
    c.is_alphabetic()
        && matches!(c,
            '\u{00C0}'..='\u{00D6}' | '\u{00D8}'..='\u{00F6}' | '\u{00F8}'..='\u{024F}'
            | '\u{1E00}'..='\u{1EFF}')
}

/// Alphabets whose letters have Latin look-alikes (and zalgo is written on).
fn is_alphabet_with_look_alikes(c: char) -> bool {
    c.is_ascii_alphabetic()
        || is_latin_letter(c)
        || matches!(c, '\u{0370}'..='\u{03FF}' | '\u{0400}'..='\u{04FF}')
}

/// A letter without its marks (`ẑ` → `z`).
fn base_letter(c: char) -> char {
    let mut base = c;
    let mut first = true;
    decompose_canonical(c, |d| {
        if first {
            base = d;
            first = false;
        }
    });
    base
}

/// Whether a character belongs to a script written without spaces between
/// words (its words are runs of characters; see [`super::similar`]).
pub fn is_unspaced(c: char) -> bool {
    matches!(c,
        '\u{0E00}'..='\u{0EFF}'      // Thai, Lao
        | '\u{1000}'..='\u{109F}'    // Myanmar
        | '\u{1780}'..='\u{17FF}'    // Khmer
        | '\u{3040}'..='\u{30FF}'    // Hiragana, Katakana
        | '\u{31F0}'..='\u{31FF}'
        | '\u{3400}'..='\u{4DBF}'    // Han
        | '\u{4E00}'..='\u{9FFF}'
        | '\u{F900}'..='\u{FAFF}'
        | '\u{FF66}'..='\u{FF9F}'
        | '\u{20000}'..='\u{2FA1F}')
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

#[cfg(test)]
mod tests;
