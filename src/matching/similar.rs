//! Near-duplicates: a normalised text's word shingles (each word, and each
//! pair of neighbouring words, as 64-bit hashes), found by an LSH index
//! over MinHash signatures (`gaoya`) and then compared exactly.
//!
//! Two stages: the index proposes candidates whose signatures agree on a
//! whole band (16 bands of 4 of 64 values: a pair of similarity 0.6 is
//! proposed with probability about 0.9, of 0.05 about 1 in 10,000), and
//! each candidate's Jaccard similarity is then computed from the two
//! shingle sets, so the threshold is applied to the true similarity, not
//! to an estimate.
//!
//! The signature is computed here, not by gaoya's `MinHasher32` (64 hash
//! functions per shingle, each with a modulo: 3.7 µs of the hub's time per
//! 12-word post, timed on 20,000 of the bench's posts while building issue
//! 36): one-permutation hashing (Li, Owen and Zhang, 2012) with optimal
//! densification (Shrivastava, 2017). Each shingle's hash falls in one of
//! 64 bins, each bin keeps its least hash, and an empty bin takes the value
//! of a filled bin drawn by its own fixed sequence.

use gaoya::minhash::{MinHashIndex, SmallVecContainer};

/// The index: most bands' buckets hold one id, kept inline.
pub type Index<Id> = MinHashIndex<u32, Id, SmallVecContainer<Id, 2>>;

use super::normalize;

const HASHES: usize = 64;
const BANDS: usize = 16;
const ROWS: usize = HASHES / BANDS;

/// How far below the threshold the index's own (estimated) similarity may
/// be for a candidate to be compared exactly: the estimate's noise (about
/// ±0.06 at 64 values) does not lose true matches, and unlike texts that
/// share a band are dropped before the exact comparison.
const SLACK: f64 = 0.15;

/// A text as matching sees it: its normalised form's hash, its number of
/// words, its shingles (sorted, distinct) and their signature (none for a
/// text without words).
#[derive(Debug, Clone)]
pub struct Fingerprint {
    pub hash: u64,
    pub words: usize,
    pub shingles: Vec<u64>,
    pub signature: Option<Signature>,
}

pub type Signature = Vec<u32>;

/// Computes fingerprints (the same hashes in every process).
#[derive(Default)]
pub struct Fingerprinter;

impl Fingerprinter {
    /// The fingerprint of a text already normalised.
    pub fn of_normalized(&self, normalized: &str) -> Fingerprint {
        let words: Vec<u64> = normalize::words(normalized)
            .map(|w| xxhash_rust::xxh3::xxh3_64(w.as_bytes()))
            .collect();
        // A pair of neighbours: its two words' hashes combined, in order.
        let pairs = words.windows(2).map(|w| mix(w[0].rotate_left(17) ^ w[1]));
        let mut shingles: Vec<u64> = words.iter().copied().chain(pairs).collect();
        shingles.sort_unstable();
        shingles.dedup();
        Fingerprint {
            hash: normalize::text_hash(normalized),
            words: words.len(),
            signature: (!shingles.is_empty()).then(|| signature(&shingles)),
            shingles,
        }
    }
}

/// The one-permutation signature of (at least one) shingle hashes.
fn signature(shingles: &[u64]) -> Signature {
    const EMPTY: u32 = u32::MAX;
    let mut bins = [EMPTY; HASHES];
    for &h in shingles {
        let bin = (h >> 58) as usize;
        bins[bin] = bins[bin].min((h as u32).min(EMPTY - 1));
    }
    // Each empty bin takes the value of the first filled bin its own
    // sequence of draws lands on (the same sequence for every text), so
    // that bins stay independent: two unlike texts agree on a band rarely.
    let filled = bins;
    for (i, bin) in bins.iter_mut().enumerate() {
        if *bin != EMPTY {
            continue;
        }
        // Bounded: at least one bin is filled; past 4,096 draws (odds
        // below 2^-90 with one filled bin) the first filled bin.
        *bin = (0..4096u64)
            .map(|draw| filled[(mix((i as u64) << 16 | draw) >> 58) as usize])
            .find(|v| *v != EMPTY)
            .or_else(|| filled.iter().copied().find(|v| *v != EMPTY))
            .unwrap_or(EMPTY);
    }
    bins.to_vec()
}

/// The Jaccard similarity of two sorted, distinct shingle sets.
pub fn jaccard(a: &[u64], b: &[u64]) -> f64 {
    let (mut i, mut j, mut both) = (0, 0, 0usize);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                both += 1;
                i += 1;
                j += 1;
            }
        }
    }
    let union = a.len() + b.len() - both;
    if union == 0 {
        return 0.0;
    }
    both as f64 / union as f64
}

/// An LSH index of signatures by id, proposing candidates for a
/// similarity `threshold` (see [`SLACK`]); [`best_match`] compares them.
pub fn index<Id: std::hash::Hash + Eq + Clone + Send + Sync>(threshold: f64) -> Index<Id> {
    Index::new_index(BANDS, ROWS, (threshold - SLACK).max(0.0))
}

/// The candidate most similar to `print` at `threshold` or above, by the
/// exact similarity of their shingles (`shingles_of` a candidate's).
pub fn best_match<'a, Id, S>(
    index: &Index<Id>,
    print: &Fingerprint,
    threshold: f64,
    shingles_of: impl Fn(&Id) -> Option<&'a S>,
) -> Option<(Id, f64)>
where
    Id: std::hash::Hash + Eq + Clone + Send + Sync,
    S: AsRef<[u64]> + 'a + ?Sized,
{
    let signature = print.signature.as_ref()?;
    index
        .query_owned(signature)
        .into_iter()
        .filter_map(|id| {
            let similarity = jaccard(&print.shingles, shingles_of(&id)?.as_ref());
            (similarity >= threshold).then_some((id, similarity))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// splitmix64's finaliser.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn print(text: &str) -> Fingerprint {
        Fingerprinter.of_normalized(&normalize::normalize(text))
    }

    #[test]
    fn a_changed_word_keeps_a_text_similar_and_another_text_is_not() {
        let a = print("win a free phone today click the link in my profile now");
        let b = print("win a free phone today click the link in my bio now");
        let c = print("the match last night was the best one this season by far");
        // 12 words and 11 pairs each; 11 words and 9 pairs shared.
        assert_eq!(jaccard(&a.shingles, &b.shingles), 20.0 / 26.0);
        assert!(jaccard(&a.shingles, &c.shingles) < 0.1);
        assert_eq!(a.words, 12);
        assert_ne!(a.hash, b.hash);
    }

    #[test]
    fn the_index_finds_a_near_duplicate_and_not_a_stranger() {
        let mut index = index::<u32>(0.6);
        let a = print("win a free phone today click the link in my profile now");
        index.insert(1, a.signature.clone().unwrap());
        let near = print("WIN a free phone today!! click the link in my profile now ok");
        let far = print("what a lovely morning for a walk along the river with friends");
        let of = |_: &u32| Some(&a.shingles);
        assert_eq!(best_match(&index, &near, 0.6, of).map(|m| m.0), Some(1));
        assert!(best_match(&index, &far, 0.6, of).is_none());
    }

    #[test]
    fn a_text_without_words_has_no_signature() {
        assert!(print("🔥🔥").signature.is_none());
        assert_eq!(print("a bc d").words, 3);
    }
}
