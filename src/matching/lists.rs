//! Known-bad lists: items matched on the normalised text's hash (exact) or
//! on its word shingles' similarity (near), from a file or the list topic.
//!
//! An item is one JSON object, one per line of a list file (blank lines
//! and lines starting with `#` are skipped) or the value of a list topic's
//! record (keyed by its id):
//!
//! ```text
//! {"id": "spam-17", "verdict": "block", "label": "spam", "text": "win a free phone today"}
//! {"id": "doxx-3", "verdict": "review", "label": "doxxing", "hash": "9f2c1e0b7a3d5e61"}
//! ```
//!
//! `text` is normalised as events are; `hash` is the 16 hex digits of the
//! normalised text's xxh3-64 (`modstream normalize TEXT` prints both), for
//! an item whose text is not to be stored (matched exactly only). A file
//! with any wrong line is refused whole (the list in force stays).
//!
//! A text may match several items (the same normal form, or near several
//! items): it takes the strictest verdict among them, and the nearest item
//! of that verdict. Items of one normal form are kept apart by id, so
//! that removing one leaves the others in force.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::normalize::normalize;
use super::similar::{self, Fingerprint, Fingerprinter};
use crate::config::ListMode;
use crate::policy::Verdict;

/// Texts of fewer words are matched exactly only: a near match of a
/// two-word text is mostly chance.
pub const NEAR_MIN_WORDS: usize = 3;

#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error("cannot read list file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("list file {path}, line {line}: {problem}")]
    Line {
        path: String,
        line: usize,
        problem: ItemError,
    },
    #[error(
        "the lists hold {bytes} bytes with list {list:?}, more than matching.max_bytes ({max_bytes}): raise it or shorten the list"
    )]
    Budget {
        list: String,
        bytes: usize,
        max_bytes: usize,
    },
}

/// Why an item is refused.
#[derive(Debug, thiserror::Error)]
pub enum ItemError {
    #[error("not an item: {0}")]
    Json(#[from] serde_json::Error),
    #[error("no id")]
    NoId,
    #[error("verdict {0:?}: block or review")]
    Verdict(String),
    #[error("give one of text or hash")]
    TextOrHash,
    #[error("hash {0:?}: 16 hex digits")]
    Hash(String),
    #[error("the text has no words once normalised")]
    Empty,
    #[error("same normalised text as item {0:?}")]
    Duplicate(String),
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ItemSpec {
    #[serde(default)]
    id: Option<String>,
    verdict: String,
    label: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    hash: Option<String>,
}

/// One list item, checked.
#[derive(Debug, Clone)]
pub struct Item {
    pub id: Arc<str>,
    pub verdict: Verdict,
    pub label: Arc<str>,
    hash: u64,
    /// For near matches (texts of [`NEAR_MIN_WORDS`] words or more).
    near: Option<Near>,
}

#[derive(Debug, Clone)]
struct Near {
    /// Moved to the list's index when the item is inserted.
    signature: similar::Signature,
    shingles: Vec<u64>,
}

impl Item {
    /// An item from its JSON; `key`: the list topic record's key, which is
    /// its id.
    pub fn parse(
        json: &[u8],
        key: Option<&str>,
        prints: &Fingerprinter,
    ) -> Result<Item, ItemError> {
        let spec: ItemSpec = serde_json::from_slice(json)?;
        let id = key
            .map(str::to_string)
            .or(spec.id)
            .filter(|i| !i.is_empty())
            .ok_or(ItemError::NoId)?;
        let verdict = match Verdict::parse(&spec.verdict) {
            Some(v @ (Verdict::Block | Verdict::Review)) => v,
            _ => return Err(ItemError::Verdict(spec.verdict)),
        };
        let (hash, near) = match (spec.text, spec.hash) {
            (Some(text), None) => {
                let normalized = normalize(&text);
                if normalized.is_empty() {
                    return Err(ItemError::Empty);
                }
                let print = prints.of_normalized(&normalized);
                let near = (print.words >= NEAR_MIN_WORDS)
                    .then_some(())
                    .and_then(|()| {
                        Some(Near {
                            signature: print.signature?,
                            shingles: print.shingles,
                        })
                    });
                (print.hash, near)
            }
            (None, Some(hex)) => match u64::from_str_radix(&hex, 16) {
                Ok(h) if hex.len() == 16 => (h, None),
                _ => return Err(ItemError::Hash(hex)),
            },
            _ => return Err(ItemError::TextOrHash),
        };
        Ok(Item {
            id: id.into(),
            verdict,
            label: spec.label.into(),
            hash,
            near,
        })
    }
}

/// A list's item that a text matched, and how far it is (0: the same
/// normalised text).
#[derive(Debug, Clone)]
pub struct Found {
    pub item: Arc<Item>,
    pub distance: f32,
}

/// Bytes charged per item beyond its id, label and near-match data (the
/// struct and its map entries).
const ITEM_BYTES: usize = 160;

impl Item {
    /// Bytes it holds in a list (see [`List::bytes`]).
    pub fn bytes(&self) -> usize {
        let near = self.near.as_ref().map_or(0, |n| {
            n.shingles.len() * 8 + similar::Index::<Arc<str>>::bytes_per_id()
        });
        ITEM_BYTES + self.id.len() + self.label.len() + near
    }
}

/// One list: its items, by id, by hash, and by signature.
pub struct List {
    pub name: Arc<str>,
    pub mode: ListMode,
    items: HashMap<Arc<str>, Arc<Item>>,
    /// Items by the hash of their normal form (several may share one).
    exact: HashMap<u64, Vec<Arc<str>>>,
    near: similar::Index<Arc<str>>,
    similarity: f64,
    bytes: usize,
}

impl List {
    pub fn new(name: &str, mode: ListMode, similarity: f64) -> List {
        List {
            name: name.into(),
            mode,
            items: HashMap::new(),
            exact: HashMap::new(),
            near: similar::Index::new(similarity),
            similarity,
            bytes: 0,
        }
    }

    /// A list file, every line checked (any wrong line refuses the file).
    pub fn load(
        name: &str,
        path: &Path,
        mode: ListMode,
        similarity: f64,
        prints: &Fingerprinter,
    ) -> Result<List, ListError> {
        let at = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ListError::Read {
            path: at.clone(),
            source,
        })?;
        let mut list = List::new(name, mode, similarity);
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let refused = |problem| ListError::Line {
                path: at.clone(),
                line: i + 1,
                problem,
            };
            let item = Item::parse(line.as_bytes(), None, prints).map_err(refused)?;
            if let Some(other) = list.exact.get(&item.hash).and_then(|ids| ids.first()) {
                return Err(refused(ItemError::Duplicate(other.to_string())));
            }
            list.insert(item);
        }
        Ok(list)
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Bytes its items hold (counted against `matching.max_bytes`).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes it would hold with `item` in place of the one of its id.
    pub fn bytes_with(&self, item: &Item) -> usize {
        let replaced = self.items.get(&item.id).map_or(0, |i| i.bytes());
        self.bytes - replaced + item.bytes()
    }

    /// Adds an item, or replaces the one of the same id.
    pub fn insert(&mut self, mut item: Item) {
        self.remove(&item.id);
        let id = item.id.clone();
        self.exact.entry(item.hash).or_default().push(id.clone());
        // The index keeps the signature; the item keeps none (one copy,
        // as `Item::bytes` charges).
        if let Some(near) = &mut item.near
            && !near.signature.is_empty()
        {
            self.near
                .insert(id.clone(), std::mem::take(&mut near.signature));
        }
        self.bytes += item.bytes();
        self.items.insert(id, Arc::new(item));
    }

    pub fn remove(&mut self, id: &str) -> bool {
        let Some(item) = self.items.remove(id) else {
            return false;
        };
        if let Some(ids) = self.exact.get_mut(&item.hash) {
            ids.retain(|i| *i != item.id);
            if ids.is_empty() {
                self.exact.remove(&item.hash);
            }
        }
        if item.near.is_some() {
            self.near.remove(&item.id);
        }
        self.bytes -= item.bytes();
        true
    }

    /// The item a text matches: of the items of the same normalised text
    /// and those at or above the list's similarity, the strictest verdict,
    /// and of those the nearest.
    pub fn find(&self, print: &Fingerprint) -> Option<Found> {
        let exact = (self.exact.get(&print.hash).into_iter().flatten())
            .filter_map(|id| self.items.get(id))
            .map(|item| Found {
                item: item.clone(),
                distance: 0.0,
            });
        let shingles_of = |id: &Arc<str>| Some(&self.items.get(id)?.near.as_ref()?.shingles);
        let near = if print.words >= NEAR_MIN_WORDS && !self.near.is_empty() {
            self.near.query(print, self.similarity, shingles_of).matches
        } else {
            Vec::new()
        };
        let near = near.into_iter().filter_map(|(id, similarity)| {
            Some(Found {
                item: self.items.get(&id)?.clone(),
                distance: (1.0 - similarity) as f32,
            })
        });
        exact.chain(near).min_by(|a, b| {
            (b.item.verdict.cmp(&a.item.verdict))
                .then(a.distance.total_cmp(&b.distance))
                .then(a.item.id.cmp(&b.item.id))
        })
    }

    /// Candidates its index left out since last asked (see [`similar`]).
    pub fn take_cut(&self) -> u64 {
        self.near.take_cut()
    }
}

#[cfg(test)]
mod tests;
