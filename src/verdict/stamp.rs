//! Times written in records: RFC 3339 in UTC, to the millisecond
//! (`processed_at`, `decided_at`, a wave's `first_seen`).

use std::cell::Cell;

/// Milliseconds since the epoch as RFC 3339 (UTC, milliseconds).
pub fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The longest text kept inline: `-262143-01-01T00:00:00.000Z`, chrono's
/// earliest, is 27 bytes.
const INLINE: usize = 32;

/// A time's RFC 3339 text, held inline (no allocation per record). The hub
/// writes many verdicts in one millisecond, and the text depends on the
/// millisecond alone: each thread keeps the last one's and formats again
/// only when the millisecond changes.
#[derive(Clone, Copy)]
pub struct Stamp {
    text: [u8; INLINE],
    len: u8,
}

impl Stamp {
    /// `now`, to the millisecond.
    pub fn at(now: chrono::DateTime<chrono::Utc>) -> Stamp {
        thread_local! {
            static LAST: Cell<Option<(i64, Stamp)>> = const { Cell::new(None) };
        }
        let ms = now.timestamp_millis();
        LAST.with(|last| match last.get() {
            Some((at, stamp)) if at == ms => stamp,
            _ => {
                let stamp = Stamp::of(&rfc3339(ms));
                last.set(Some((ms, stamp)));
                stamp
            }
        })
    }

    fn of(text: &str) -> Stamp {
        let mut inline = [0; INLINE];
        let len = text.len().min(INLINE);
        inline[..len].copy_from_slice(&text.as_bytes()[..len]);
        Stamp {
            text: inline,
            len: len as u8,
        }
    }

    pub fn as_str(&self) -> &str {
        // ASCII, whole: `of` copies at most `INLINE` bytes of it.
        std::str::from_utf8(&self.text[..usize::from(self.len)]).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn formatted(ms: i64) -> String {
        chrono::DateTime::from_timestamp_millis(ms)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    }

    /// The same text as formatting every time: within a millisecond, at
    /// its change, back to an earlier one, far from now either way.
    #[test]
    fn a_stamp_is_its_millisecond_formatted() {
        let now = chrono::Utc::now().timestamp_millis();
        let times = [
            now,
            now,
            now + 1,
            now,
            0,
            -1,
            1,
            253_402_300_799_999, // 9999-12-31T23:59:59.999Z
            253_402_300_800_000, // year 10000, written with a sign
            -62_198_755_199_999, // year -1, written with a sign
        ];
        for ms in times {
            let at = chrono::DateTime::from_timestamp_millis(ms).unwrap();
            let nanos = at + chrono::Duration::nanoseconds(999_999);
            assert_eq!(Stamp::at(at).as_str(), formatted(ms), "{ms}");
            assert_eq!(
                Stamp::at(nanos).as_str(),
                formatted(ms),
                "{ms} and a fraction of a millisecond"
            );
            assert_eq!(Stamp::at(at).as_str(), rfc3339(ms));
        }
    }
}
