//! Near-duplicates: a normalised text's shingles (each token, and each pair
//! of neighbouring tokens, as 64-bit hashes), found by an LSH index over
//! MinHash signatures and then compared exactly.
//!
//! A token is a word (its repeated letters written once: see
//! [`singled`]); in a script written without spaces (Chinese,
//! Japanese, Thai: [`normalize::is_unspaced`]) a word is a run of
//! characters, and its tokens are its character pairs, so that lists and
//! waves work there too.
//!
//! Two stages: the index proposes candidates whose signatures agree on a
//! whole band (16 bands of 4 of 64 values: a pair of similarity 0.6 is
//! proposed with probability about 0.9, of 0.05 about 1 in 10,000), and
//! each candidate's Jaccard similarity is then computed from the two
//! shingle sets, so the threshold is applied to the true similarity, not
//! to an estimate.
//!
//! Bounded against a flood of texts built to share bands: a band's bucket
//! of an index that anyone's posts fill ([`Index::capped`]) keeps its
//! [`BUCKET_CAP`] latest ids, and a query compares at most
//! [`MAX_COMPARED`] candidates, those sharing the most bands first; what
//! either bound leaves out is counted ([`Index::take_cut`]). (gaoya's index has
//! neither bound, which is why this one is written here.)
//!
//! The signature is one-permutation hashing (Li, Owen and Zhang, 2012)
//! with optimal densification (Shrivastava, 2017): each shingle's hash
//! falls in one of 64 bins, each bin keeps its least hash, and an empty bin
//! takes the value of a filled bin drawn by its own fixed sequence.

use std::collections::HashMap;

use smallvec::SmallVec;
use std::hash::Hash;

use super::normalize;

const HASHES: usize = 64;
const BANDS: usize = 16;
const ROWS: usize = HASHES / BANDS;

/// How far below the threshold the signatures' own (estimated) similarity
/// may be for a candidate to be compared exactly: the estimate's noise
/// (about ±0.06 at 64 values) does not lose true matches, and unlike texts
/// that share a band are dropped before the exact comparison.
const SLACK: f64 = 0.15;

/// Ids a band's bucket keeps in a capped index: a pair of similarity 0.6
/// shares about 2 of 16 bands, so a true match is still proposed while
/// each of its buckets holds a few recent others.
pub const BUCKET_CAP: usize = 32;

/// Candidates a query compares at most (by shared bands, most first).
pub const MAX_COMPARED: usize = 64;

/// Bytes an index holds per id beyond its signature: a bucket (or a slot
/// of one) in each band's map, and its signature's entry (what
/// [`Index::bytes_per_id`] charges).
const INDEX_OVERHEAD: usize = BANDS * 48 + 96;

/// A text as matching sees it: its normalised form's hash, its number of
/// tokens, its shingles (sorted, distinct) and their signature (none for a
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
        let mut tokens: Vec<u64> = Vec::new();
        let mut single = String::new();
        for word in normalize::words(normalized) {
            if word.chars().any(normalize::is_unspaced) {
                character_pairs(word, &mut tokens);
            } else {
                tokens.push(xxhash_rust::xxh3::xxh3_64(
                    singled(word, &mut single).as_bytes(),
                ));
            }
        }
        // A pair of neighbours: its two tokens' hashes combined, in order.
        let pairs = tokens.windows(2).map(|w| mix(w[0].rotate_left(17) ^ w[1]));
        let mut shingles: Vec<u64> = tokens.iter().copied().chain(pairs).collect();
        shingles.sort_unstable();
        shingles.dedup();
        Fingerprint {
            hash: normalize::text_hash(normalized),
            words: tokens.len(),
            signature: (!shingles.is_empty()).then(|| signature(&shingles)),
            shingles,
        }
    }
}

/// A word with every run of one letter written once, for its token: the
/// normal form keeps doubles ("good" is not "god", exactly), but a word
/// whose double letter was elongated ("worthlessss" reads "worthles") is
/// still the same token as its plain form ("worthless") for similarity.
fn singled<'a>(word: &'a str, buf: &'a mut String) -> &'a str {
    let bytes = word.as_bytes();
    if !bytes.windows(2).any(|w| w[0] == w[1]) {
        return word;
    }
    buf.clear();
    let mut last = None;
    for c in word.chars() {
        if Some(c) != last || c.is_numeric() {
            buf.push(c);
        }
        last = Some(c);
    }
    buf
}

/// An unspaced word's tokens: its character pairs (one character alone).
fn character_pairs(word: &str, tokens: &mut Vec<u64>) {
    let chars: Vec<char> = word.chars().collect();
    let mut buf = [0u8; 8];
    if chars.len() == 1 {
        tokens.push(xxhash_rust::xxh3::xxh3_64(
            chars[0].encode_utf8(&mut buf).as_bytes(),
        ));
        return;
    }
    for pair in chars.windows(2) {
        let (a, b) = (pair[0].len_utf8(), pair[1].len_utf8());
        pair[0].encode_utf8(&mut buf[..a]);
        pair[1].encode_utf8(&mut buf[a..a + b]);
        tokens.push(xxhash_rust::xxh3::xxh3_64(&buf[..a + b]));
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

/// The share of equal values of two signatures (MinHash's estimate).
fn estimated(a: &[u32], b: &[u32]) -> f64 {
    let same = a.iter().zip(b).filter(|(x, y)| x == y).count();
    same as f64 / HASHES as f64
}

/// The key of band `band` of a signature.
fn band_key(signature: &[u32], band: usize) -> u64 {
    let rows = &signature[band * ROWS..(band + 1) * ROWS];
    let mut bytes = [0u8; ROWS * 4];
    for (i, v) in rows.iter().enumerate() {
        bytes[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
    }
    xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, band as u64)
}

/// An LSH index of signatures by id (see the module's docs).
pub struct Index<Id> {
    /// Per band, the ids by band key (most buckets hold one, inline).
    bands: Vec<HashMap<u64, SmallVec<[Id; 1]>>>,
    signatures: HashMap<Id, Signature>,
    /// The least estimated similarity a candidate is compared at.
    floor: f64,
    /// Whether buckets keep only their latest [`BUCKET_CAP`] ids.
    capped: bool,
    cut: std::cell::Cell<u64>,
}

/// What a query found: the best candidate at or above the threshold, and
/// every one at or above it (for a caller that chooses among them).
pub struct Found<Id> {
    pub matches: Vec<(Id, f64)>,
}

impl<Id> Found<Id> {
    /// The most similar.
    pub fn best(self) -> Option<(Id, f64)> {
        self.matches.into_iter().max_by(|a, b| a.1.total_cmp(&b.1))
    }
}

impl<Id: Hash + Eq + Clone> Index<Id> {
    /// An index for a similarity `threshold` whose buckets keep every id
    /// (its ids are put there by the operator: list items).
    pub fn new(threshold: f64) -> Index<Id> {
        Index {
            bands: (0..BANDS).map(|_| HashMap::new()).collect(),
            signatures: HashMap::new(),
            floor: (threshold - SLACK).max(0.0),
            capped: false,
            cut: std::cell::Cell::new(0),
        }
    }

    /// An index whose buckets keep their latest [`BUCKET_CAP`] ids (its
    /// ids come from posts: wave clusters).
    pub fn capped(threshold: f64) -> Index<Id> {
        Index {
            capped: true,
            ..Index::new(threshold)
        }
    }

    /// Bytes an id's entry holds (its signature and its bucket slots).
    pub fn bytes_per_id() -> usize {
        HASHES * 4 + INDEX_OVERHEAD
    }

    pub fn len(&self) -> usize {
        self.signatures.len()
    }

    pub fn is_empty(&self) -> bool {
        self.signatures.is_empty()
    }

    /// Candidates left out so far (a full bucket's oldest, and those past
    /// [`MAX_COMPARED`] in a query); read and reset.
    pub fn take_cut(&self) -> u64 {
        self.cut.take()
    }

    pub fn insert(&mut self, id: Id, signature: Signature) {
        self.remove(&id);
        for (band, map) in self.bands.iter_mut().enumerate() {
            let bucket = map.entry(band_key(&signature, band)).or_default();
            bucket.push(id.clone());
            if self.capped && bucket.len() > BUCKET_CAP {
                bucket.remove(0);
                self.cut.set(self.cut.get() + 1);
            }
        }
        self.signatures.insert(id, signature);
    }

    pub fn remove(&mut self, id: &Id) {
        let Some(signature) = self.signatures.remove(id) else {
            return;
        };
        for (band, map) in self.bands.iter_mut().enumerate() {
            let key = band_key(&signature, band);
            if let Some(bucket) = map.get_mut(&key) {
                bucket.retain(|x| x != id);
                if bucket.is_empty() {
                    map.remove(&key);
                }
            }
        }
    }

    /// The candidates at or above `threshold` by the exact similarity of
    /// their shingles (`shingles_of` a candidate's), of at most
    /// [`MAX_COMPARED`] proposed.
    pub fn query<'a, S>(
        &self,
        print: &Fingerprint,
        threshold: f64,
        shingles_of: impl Fn(&Id) -> Option<&'a S>,
    ) -> Found<Id>
    where
        S: AsRef<[u64]> + 'a + ?Sized,
    {
        let Some(signature) = print.signature.as_ref() else {
            return Found { matches: vec![] };
        };
        let mut shared: HashMap<&Id, u32> = HashMap::new();
        for (band, map) in self.bands.iter().enumerate() {
            if let Some(bucket) = map.get(&band_key(signature, band)) {
                for id in bucket {
                    *shared.entry(id).or_default() += 1;
                }
            }
        }
        let mut candidates: Vec<(&Id, u32)> = shared.into_iter().collect();
        if candidates.len() > MAX_COMPARED {
            candidates.sort_unstable_by_key(|c| std::cmp::Reverse(c.1));
            let cut = (candidates.len() - MAX_COMPARED) as u64;
            self.cut.set(self.cut.get() + cut);
            candidates.truncate(MAX_COMPARED);
        }
        let matches = candidates
            .into_iter()
            .filter(|(id, _)| {
                self.signatures
                    .get(*id)
                    .is_some_and(|s| estimated(s, signature) >= self.floor)
            })
            .filter_map(|(id, _)| {
                let similarity = jaccard(&print.shingles, shingles_of(id)?.as_ref());
                (similarity >= threshold).then(|| (id.clone(), similarity))
            })
            .collect();
        Found { matches }
    }
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
        let mut index = Index::<u32>::new(0.6);
        let a = print("win a free phone today click the link in my profile now");
        index.insert(1, a.signature.clone().unwrap());
        let near = print("WIN a free phone today!! click the link in my profile now ok");
        let far = print("what a lovely morning for a walk along the river with friends");
        let of = |_: &u32| Some(&a.shingles);
        assert_eq!(index.query(&near, 0.6, of).best().map(|m| m.0), Some(1));
        assert!(index.query(&far, 0.6, of).best().is_none());
        index.remove(&1);
        assert!(index.query(&near, 0.6, of).best().is_none());
        assert!(index.bands.iter().all(HashMap::is_empty));
    }

    /// Unspaced scripts: a changed character keeps a text near, another
    /// text is far.
    #[test]
    fn chinese_japanese_and_thai_texts_have_character_pair_shingles() {
        for (a, b, c) in [
            (
                "今天免费领取手机请点击我的主页链接",
                "今天免费领取手机请点击我的个人链接",
                "昨晚的比赛是本赛季最精彩的一场",
            ),
            (
                "今日は無料でスマホがもらえますプロフィールのリンクをクリック",
                "今日は無料でスマホがもらえますプロフィールのリンクを押して",
                "昨日の試合は今シーズン最高の試合でした",
            ),
            (
                "รับโทรศัพท์ฟรีวันนี้คลิกลิงก์ในโปรไฟล์ของฉัน",
                "รับโทรศัพท์ฟรีวันนี้คลิกลิงก์ในหน้าของฉัน",
                "การแข่งขันเมื่อคืนดีที่สุดของฤดูกาลนี้",
            ),
        ] {
            let (a, b, c) = (print(a), print(b), print(c));
            assert!(a.words > 10, "{}", a.words);
            let near = jaccard(&a.shingles, &b.shingles);
            assert!(near >= 0.6, "{near}");
            assert!(jaccard(&a.shingles, &c.shingles) < 0.1);
        }
    }

    /// A flood of posts that share bands: a capped index's buckets and a
    /// query's comparisons stay bounded, and what is cut is counted.
    #[test]
    fn a_capped_index_bounds_its_buckets_and_its_comparisons() {
        let mut index = Index::<u32>::capped(0.6);
        let base = "cheap pills online best price fast shipping order now from our trusted shop";
        let mut prints = Vec::new();
        for i in 0..2000u32 {
            let p = print(&format!("{base} {i} {} {}", i * 7, i * 13));
            index.insert(i, p.signature.clone().unwrap());
            prints.push(p);
        }
        let largest = index
            .bands
            .iter()
            .flat_map(|m| m.values())
            .map(|b| b.len())
            .max();
        assert!(largest <= Some(BUCKET_CAP), "{largest:?}");
        assert!(index.take_cut() > 0, "full buckets dropped their oldest");
        let q = print(&format!("{base} 5000 35000 65000"));
        let found = index.query(&q, 0.6, |i: &u32| {
            prints.get(*i as usize).map(|p| &p.shingles)
        });
        assert!(!found.matches.is_empty());
        assert!(found.matches.len() <= MAX_COMPARED);
    }
}
