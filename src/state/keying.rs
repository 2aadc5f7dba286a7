//! Whether the input is keyed by the entity: state per partition is exact
//! only when every event of an entity is in one partition. Judged from the
//! first [`SAMPLE`] events that name an entity: a record whose key is not
//! the entity's id is counted, and once the sample is full a warning says
//! how many were (once per run).

/// Events looked at.
pub const SAMPLE: u32 = 1000;

#[derive(Debug, Default)]
pub struct KeyingSample {
    seen: u32,
    other_keys: u32,
}

/// What the sample found, once it is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keying {
    pub seen: u32,
    pub other_keys: u32,
}

impl KeyingSample {
    /// One event's record key and entity id; the sample's finding when
    /// this event fills it.
    pub fn saw(&mut self, key: Option<&[u8]>, id: &str) -> Option<Keying> {
        if self.seen >= SAMPLE {
            return None;
        }
        self.seen += 1;
        if key != Some(id.as_bytes()) {
            self.other_keys += 1;
        }
        (self.seen == SAMPLE).then_some(Keying {
            seen: self.seen,
            other_keys: self.other_keys,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_reports_once_when_full() {
        let mut sample = KeyingSample::default();
        for i in 0..SAMPLE - 1 {
            let key = if i % 10 == 0 {
                b"other".as_slice()
            } else {
                b"u-1".as_slice()
            };
            assert_eq!(sample.saw(Some(key), "u-1"), None);
        }
        assert_eq!(
            sample.saw(None, "u-1"),
            Some(Keying {
                seen: SAMPLE,
                other_keys: 101
            })
        );
        assert_eq!(sample.saw(None, "u-1"), None);
    }
}
