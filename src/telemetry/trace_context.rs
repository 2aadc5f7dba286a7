//! W3C trace context (`traceparent`, `tracestate`) read from an input
//! record's headers and written on the records that answer it (the
//! verdict, its routed copies, its decision record; a dead letter copies
//! the input's headers as they were), so that the services downstream
//! continue the post's trace.
//!
//! A header that is not a valid `traceparent` (W3C Trace Context, level 1:
//! `VERSION-TRACE_ID-PARENT_ID-FLAGS` in lower-case hex, neither id all
//! zeros, version `ff` invalid) is not continued: the answer carries none,
//! as the recommendation says for a context that cannot be parsed.

use std::borrow::Cow;

pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";

/// The longest `tracestate` carried on (the recommendation's 32 entries of
/// up to 256 bytes, with their commas).
const MAX_TRACESTATE: usize = 8192;

/// A post's place in its trace, as its producer wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    /// The span that wrote the record (the parent of what modstream does).
    pub span_id: [u8; 8],
    pub flags: u8,
    pub state: Option<String>,
}

impl TraceContext {
    /// From a record's headers (the last `traceparent` if several), if
    /// they carry a valid one.
    pub fn from_headers(headers: &[(String, Option<Vec<u8>>)]) -> Option<TraceContext> {
        let value = |name: &str| {
            (headers.iter().rev())
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .and_then(|(_, v)| v.as_deref())
                .and_then(|v| std::str::from_utf8(v).ok())
        };
        let mut context = TraceContext::parse(value(TRACEPARENT)?)?;
        context.state = value(TRACESTATE)
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.len() <= MAX_TRACESTATE)
            .map(String::from);
        Some(context)
    }

    /// A `traceparent` value.
    pub fn parse(traceparent: &str) -> Option<TraceContext> {
        let mut parts = traceparent.trim().split('-');
        let version = hex::<1>(parts.next()?)?;
        let trace_id = hex::<16>(parts.next()?)?;
        let span_id = hex::<8>(parts.next()?)?;
        let flags = hex::<1>(parts.next()?)?;
        // Version 00 has exactly four fields; a later version may add some.
        let more = parts.next().is_some();
        if version[0] == 0xff || (version[0] == 0 && more) {
            return None;
        }
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceContext {
            trace_id,
            span_id,
            flags: flags[0],
            state: None,
        })
    }

    /// Whether its producer sampled it.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The `traceparent` of a record that continues this trace with
    /// `span_id` as its parent (the producer's own span when modstream
    /// records none), at version 00.
    pub fn traceparent(&self, span_id: [u8; 8]) -> String {
        format!(
            "00-{}-{}-{:02x}",
            to_hex(&self.trace_id),
            to_hex(&span_id),
            self.flags
        )
    }

    /// The headers that continue the trace from `span_id`.
    pub fn headers(&self, span_id: [u8; 8]) -> Vec<(Cow<'static, str>, Option<Vec<u8>>)> {
        let mut headers = vec![(
            Cow::Borrowed(TRACEPARENT),
            Some(self.traceparent(span_id).into_bytes()),
        )];
        if let Some(state) = &self.state {
            headers.push((Cow::Borrowed(TRACESTATE), Some(state.clone().into_bytes())));
        }
        headers
    }
}

/// Exactly `N` bytes of lower-case hex.
fn hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let bytes = text.as_bytes();
    if bytes.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in bytes.chunks(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * bytes.len());
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn headers(pairs: &[(&str, &str)]) -> Vec<(String, Option<Vec<u8>>)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Some(v.as_bytes().to_vec())))
            .collect()
    }

    #[test]
    fn a_valid_traceparent_is_continued_with_its_state() {
        let c = TraceContext::from_headers(&headers(&[
            ("other", "x"),
            ("traceparent", GOOD),
            ("tracestate", "congo=t61rcWkgMzE"),
        ]))
        .unwrap();
        assert!(c.sampled());
        assert_eq!(to_hex(&c.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        // Without a span of its own, the producer's span stays the parent.
        assert_eq!(c.traceparent(c.span_id), GOOD);
        let out = c.headers([1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            out[0].1.as_deref(),
            Some(&b"00-4bf92f3577b34da6a3ce929d0e0e4736-0102030405060708-01"[..])
        );
        assert_eq!(out[1].1.as_deref(), Some(&b"congo=t61rcWkgMzE"[..]));
    }

    #[test]
    fn what_is_not_a_traceparent_is_not_continued() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad:?}");
        }
        // A later version may add fields after the four it shares with 00.
        assert!(TraceContext::parse(&format!("01{}-more", &GOOD[2..])).is_some());
        assert_eq!(
            TraceContext::from_headers(&[("traceparent".into(), None)]),
            None
        );
    }
}
