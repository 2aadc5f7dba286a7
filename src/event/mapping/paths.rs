//! Only the parts of a record's JSON value that its mapping reads, taken
//! while parsing: no tree of the whole record is built.
//!
//! The mapping's pointers make a tree of tokens ([`Paths`]). Parsing walks
//! the record beside it: an object member whose key leads on along a
//! pointer is descended into, one where a pointer ends is kept whole as a
//! `Value`, and every other member is checked as JSON syntax and skipped
//! (serde's `IgnoredAny`: no allocation, no recursion). A value that is not
//! an object where a pointer leads on through it (an array, a scalar) is
//! kept whole too, and the rest of the pointer is read inside it.
//!
//! Why a record cannot make this read anything else than the whole tree
//! would: which members are kept is decided by the mapping alone; for a
//! key met twice, the member's earlier capture is cleared before the later
//! one is taken (the last one wins, as in the tree); and a kept value is
//! the `Value` the tree would hold there, read by the same [`lookup`]. A
//! test compares the two on random mappings and records.

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::{lookup, lookup_mut};
use crate::event::{RejectReason, Rejection, reject};

/// The tree of the mapping's pointers, by token. Node 0 is the record's
/// value itself.
#[derive(Debug, Clone)]
pub(super) struct Paths {
    nodes: Vec<Node>,
}

#[derive(Debug, Clone, Default)]
struct Node {
    /// The tokens that lead on from here, and the node each leads to.
    children: Vec<(String, usize)>,
    /// A pointer ends here: its value is kept whole.
    end: bool,
}

/// A record's value as far as its mapping reads it, a slot per node of
/// its [`Paths`].
#[derive(Debug)]
pub(super) struct Captured {
    slots: Vec<Slot>,
}

#[derive(Debug, Default)]
enum Slot {
    /// Not in the record.
    #[default]
    Absent,
    /// The value here, whole: a pointer ends here, or it is no object.
    Whole(Value),
    /// An object, its members read into the children's slots.
    Opened,
}

impl Paths {
    pub(super) fn new() -> Paths {
        Paths {
            nodes: vec![Node::default()],
        }
    }

    /// Add a pointer by its tokens; the nodes it passes through, the
    /// record's value first, one per token after it.
    pub(super) fn add(&mut self, tokens: &[String]) -> Vec<usize> {
        let mut path = vec![0];
        let mut at = 0;
        for token in tokens {
            let next = self.nodes[at].children.iter().find(|(t, _)| t == token);
            at = match next {
                Some((_, child)) => *child,
                None => {
                    self.nodes.push(Node::default());
                    let child = self.nodes.len() - 1;
                    self.nodes[at].children.push((token.clone(), child));
                    child
                }
            };
            path.push(at);
        }
        self.nodes[at].end = true;
        path
    }

    /// Parse a record's JSON text, keeping what the pointers read. serde
    /// stops at 128 levels of nesting in what it keeps, and skips the rest
    /// without recursion, so hostile nesting cannot overflow the stack.
    pub(super) fn parse(&self, text: &str) -> Result<Captured, Rejection> {
        let mut slots = Vec::with_capacity(self.nodes.len());
        slots.resize_with(self.nodes.len(), Slot::default);
        let mut parser = serde_json::Deserializer::from_str(text);
        let taken = Take {
            paths: self,
            node: 0,
            slots: &mut slots,
        }
        .deserialize(&mut parser)
        .and_then(|()| parser.end());
        taken.map_err(|e| {
            reject(
                RejectReason::InvalidJson,
                format!("payload is not JSON: {e}"),
            )
        })?;
        Ok(Captured { slots })
    }

    /// Empty the slots of a node and all below it.
    fn clear(&self, node: usize, slots: &mut [Slot]) {
        slots[node] = Slot::Absent;
        for (_, child) in &self.nodes[node].children {
            self.clear(*child, slots);
        }
    }
}

impl Captured {
    /// A value decoded whole (by a schema codec, or out of an envelope):
    /// every pointer is read inside it.
    pub(super) fn whole(value: Value) -> Captured {
        Captured {
            slots: vec![Slot::Whole(value)],
        }
    }

    /// The record's value when it is no object (for the rejection).
    pub(super) fn not_an_object(&self) -> Option<&Value> {
        match &self.slots[0] {
            Slot::Whole(v) if !v.is_object() => Some(v),
            Slot::Absent => Some(&Value::Null),
            _ => None,
        }
    }

    /// The value a pointer leads to, by the nodes it passes through and
    /// its tokens.
    pub(super) fn get(&self, path: &[usize], tokens: &[String]) -> Option<&Value> {
        for (depth, node) in path.iter().enumerate() {
            match self.slots.get(*node)? {
                Slot::Absent => return None,
                Slot::Whole(v) => return lookup(v, &tokens[depth..]),
                Slot::Opened => {}
            }
        }
        None
    }

    /// [`Captured::get`], to move the value out.
    pub(super) fn get_mut(&mut self, path: &[usize], tokens: &[String]) -> Option<&mut Value> {
        for (depth, node) in path.iter().enumerate() {
            match self.slots.get(*node)? {
                Slot::Absent => return None,
                Slot::Opened => continue,
                Slot::Whole(_) => {}
            }
            let Some(Slot::Whole(v)) = self.slots.get_mut(*node) else {
                return None;
            };
            return lookup_mut(v, &tokens[depth..]);
        }
        None
    }
}

/// Parsing one node's value into its slot (and its children's).
struct Take<'a> {
    paths: &'a Paths,
    node: usize,
    slots: &'a mut [Slot],
}

impl Take<'_> {
    fn whole(self, value: Value) {
        self.slots[self.node] = Slot::Whole(value);
    }
}

impl<'de> DeserializeSeed<'de> for Take<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        // A key met again: the last member wins, the earlier one's parts go.
        self.paths.clear(self.node, self.slots);
        if self.paths.nodes[self.node].end {
            let value = serde::Deserialize::deserialize(d)?;
            self.whole(value);
            return Ok(());
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Take<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Take { paths, node, slots } = self;
        slots[node] = Slot::Opened;
        let children = &paths.nodes[node].children;
        while let Some(child) = map.next_key_seed(Member(children))? {
            match child {
                Some(child) => map.next_value_seed(Take {
                    paths,
                    node: child,
                    slots: &mut *slots,
                })?,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        let value = serde::Deserialize::deserialize(de::value::SeqAccessDeserializer::new(seq))?;
        self.whole(value);
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.whole(Value::Bool(v));
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.whole(Value::from(v));
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.whole(Value::from(v));
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.whole(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number));
        Ok(())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.whole(Value::String(v.to_owned()));
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.whole(Value::Null);
        Ok(())
    }
}

/// An object member's key: the child node it leads to, if any (read
/// without copying the key).
struct Member<'a>(&'a [(String, usize)]);

impl<'de> DeserializeSeed<'de> for Member<'_> {
    type Value = Option<usize>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Member<'_> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Option<usize>, E> {
        Ok(self.0.iter().find(|(t, _)| t == key).map(|(_, c)| *c))
    }
}
