//! Near-duplicates: a MinHash signature of a normalised text's word
//! shingles (each word, and each pair of neighbouring words), and LSH
//! indexes over signatures (`gaoya`). Two texts' signatures agree in about
//! the share of hashes that equals the Jaccard similarity of their shingle
//! sets; the index finds candidates by bands of the signature and keeps
//! those whose estimate reaches its threshold.

use gaoya::minhash::{MinHashIndex, MinHasher, MinHasher32};

use super::normalize;

/// Hashes per signature, and their bands: 16 bands of 4 find a pair of
/// similarity 0.6 with probability 0.89, of 0.7 with 0.99, of 0.3 with 0.12.
const HASHES: usize = 64;
const BANDS: usize = 16;
const ROWS: usize = HASHES / BANDS;

/// A text as matching sees it: its normalised form's hash, its number of
/// words, and its signature (none for a text without words).
#[derive(Debug, Clone)]
pub struct Fingerprint {
    pub hash: u64,
    pub words: usize,
    pub signature: Option<Signature>,
}

pub type Signature = Vec<u32>;

/// Computes fingerprints (the same hash functions for every text).
pub struct Fingerprinter {
    hasher: MinHasher32<fnv_like::Build>,
}

impl Default for Fingerprinter {
    fn default() -> Self {
        Fingerprinter {
            hasher: MinHasher32::new_with_hasher(HASHES, fnv_like::Build),
        }
    }
}

impl Fingerprinter {
    /// The fingerprint of a text already normalised.
    pub fn of_normalized(&self, normalized: &str) -> Fingerprint {
        let spans = word_spans(normalized);
        let signature = (!spans.is_empty()).then(|| {
            let singles = spans.iter().map(|&(a, b)| &normalized[a..b]);
            let pairs = spans.windows(2).map(|w| &normalized[w[0].0..w[1].1]);
            self.hasher.create_signature(singles.chain(pairs))
        });
        Fingerprint {
            hash: normalize::text_hash(normalized),
            words: spans.len(),
            signature,
        }
    }
}

/// Byte ranges of the words of a normalised text (one space between words).
fn word_spans(normalized: &str) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut start = 0;
    for (i, c) in normalized.char_indices() {
        if c == ' ' {
            if i > start {
                spans.push((start, i));
            }
            start = i + 1;
        }
    }
    if normalized.len() > start {
        spans.push((start, normalized.len()));
    }
    spans
}

/// An LSH index of signatures by id, finding those of similarity at least
/// `threshold`.
pub fn index<Id: std::hash::Hash + Eq + Clone + Send + Sync>(
    threshold: f64,
) -> MinHashIndex<u32, Id> {
    MinHashIndex::new(BANDS, ROWS, threshold)
}

/// The estimated similarity of two signatures.
pub fn similarity(a: &[u32], b: &[u32]) -> f64 {
    gaoya::minhash::compute_minhash_similarity(a, b)
}

/// The shingles' hash: FNV-1a, deterministic across processes and runs
/// (so a signature means the same in every instance).
mod fnv_like {
    #[derive(Clone, Copy, Default)]
    pub struct Build;

    pub struct Fnv(u64);

    impl std::hash::BuildHasher for Build {
        type Hasher = Fnv;
        fn build_hasher(&self) -> Fnv {
            Fnv(0xcbf2_9ce4_8422_2325)
        }
    }

    impl std::hash::Hasher for Fnv {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for b in bytes {
                self.0 ^= u64::from(*b);
                self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn print(text: &str) -> Fingerprint {
        Fingerprinter::default().of_normalized(&normalize::normalize(text))
    }

    #[test]
    fn a_changed_word_keeps_a_text_similar_and_another_text_is_not() {
        let a = print("win a free phone today click the link in my profile now");
        let b = print("win a free phone today click the link in my bio now");
        let c = print("the match last night was the best one this season by far");
        let (sa, sb, sc) = (
            a.signature.unwrap(),
            b.signature.unwrap(),
            c.signature.unwrap(),
        );
        assert!(similarity(&sa, &sb) > 0.6, "{}", similarity(&sa, &sb));
        assert!(similarity(&sa, &sc) < 0.3, "{}", similarity(&sa, &sc));
        assert_eq!(a.words, 12);
        assert_ne!(a.hash, b.hash);
    }

    #[test]
    fn the_index_finds_a_near_duplicate_and_not_a_stranger() {
        let mut index = index::<u32>(0.6);
        let a = print("win a free phone today click the link in my profile now");
        index.insert(1, a.signature.unwrap());
        let near = print("WIN a free phone t0day!! click the link in my profile now");
        let far = print("what a lovely morning for a walk along the river with friends");
        assert_eq!(
            index
                .query_one(near.signature.as_ref().unwrap())
                .map(|m| *m.0),
            Some(1)
        );
        assert!(index.query_one(far.signature.as_ref().unwrap()).is_none());
    }

    #[test]
    fn a_text_without_words_has_no_signature() {
        assert!(print("🔥🔥").signature.is_none());
        assert_eq!(word_spans("a bc d"), vec![(0, 1), (2, 4), (5, 6)]);
    }
}
