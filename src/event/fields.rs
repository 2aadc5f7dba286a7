//! Optional fields: a value that is missing, of another type or out of
//! range never keeps an event from being moderated. Each is read by a
//! stated rule; what cannot be read is left out and named in a
//! [`FieldWarning`] (in the verdict, and counted by field).
//!
//! Rules:
//! - `user_id`, `tenant`: a string, or a whole number written in decimal.
//! - `lang`: a string.
//! - `created_at`: an RFC 3339 string; or epoch seconds or milliseconds as
//!   a number (whole or not) or a numeric string, told apart by magnitude
//!   (`created_at_unit = "auto"`: below 10^11 it is seconds) or fixed by
//!   `created_at_unit`. Kept when between 1970 and 9999.
//! - `priority`: `"normal"` or `"urgent"`, in any case; otherwise normal.
//! - `metadata`: an object.

use serde_json::{Map, Value};

use super::{Priority, kind};
use crate::config::TimeUnit;

/// An optional field of the event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OptionalField {
    UserId,
    Lang,
    CreatedAt,
    Priority,
    Tenant,
    Metadata,
}

impl OptionalField {
    pub const ALL: [OptionalField; 6] = [
        OptionalField::UserId,
        OptionalField::Lang,
        OptionalField::CreatedAt,
        OptionalField::Priority,
        OptionalField::Tenant,
        OptionalField::Metadata,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OptionalField::UserId => "user_id",
            OptionalField::Lang => "lang",
            OptionalField::CreatedAt => "created_at",
            OptionalField::Priority => "priority",
            OptionalField::Tenant => "tenant",
            OptionalField::Metadata => "metadata",
        }
    }
}

/// An optional field left out: which, and why (with where it was read).
#[derive(Debug, Clone, PartialEq)]
pub struct FieldWarning {
    pub field: OptionalField,
    pub message: String,
}

impl std::fmt::Display for FieldWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field.as_str(), self.message)
    }
}

/// Reads optional fields, collecting the warnings.
#[derive(Default)]
pub struct Optional {
    pub warnings: Vec<FieldWarning>,
}

/// Year 9999 in milliseconds since the epoch.
const MAX_MS: f64 = 253_402_300_799_999.0;
/// At or above this a number is milliseconds (`created_at_unit = "auto"`).
const MS_FROM: f64 = 1e11;

impl Optional {
    fn warn(&mut self, field: OptionalField, message: String) {
        self.warnings.push(FieldWarning { field, message });
    }

    /// A string, or a whole number in decimal (ids, tenants).
    pub fn id_like(&mut self, field: OptionalField, at: &str, v: Option<Value>) -> Option<String> {
        match v? {
            Value::Null => None,
            Value::String(s) => Some(s),
            Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
            other => {
                self.ignored(field, at, "a string or a whole number", &other);
                None
            }
        }
    }

    pub fn string(&mut self, field: OptionalField, at: &str, v: Option<Value>) -> Option<String> {
        match v? {
            Value::Null => None,
            Value::String(s) => Some(s),
            other => {
                self.ignored(field, at, "a string", &other);
                None
            }
        }
    }

    pub fn object(
        &mut self,
        field: OptionalField,
        at: &str,
        v: Option<Value>,
    ) -> Option<Map<String, Value>> {
        match v? {
            Value::Null => None,
            Value::Object(m) => Some(m),
            other => {
                self.ignored(field, at, "an object", &other);
                None
            }
        }
    }

    pub fn priority(&mut self, at: &str, v: Option<Value>) -> Priority {
        match v {
            None | Some(Value::Null) => Priority::Normal,
            Some(Value::String(s)) if s.eq_ignore_ascii_case("normal") => Priority::Normal,
            Some(Value::String(s)) if s.eq_ignore_ascii_case("urgent") => Priority::Urgent,
            Some(Value::String(s)) => {
                self.warn(
                    OptionalField::Priority,
                    format!("{at}: {s:?} is neither \"normal\" nor \"urgent\"; read as normal"),
                );
                Priority::Normal
            }
            Some(other) => {
                self.ignored(OptionalField::Priority, at, "a string", &other);
                Priority::Normal
            }
        }
    }

    /// Milliseconds since the epoch.
    pub fn created_at(&mut self, at: &str, v: Option<Value>, unit: TimeUnit) -> Option<i64> {
        let field = OptionalField::CreatedAt;
        let number = match v? {
            Value::Null => return None,
            Value::Number(n) => n.as_f64(),
            Value::String(s) => match chrono::DateTime::parse_from_rfc3339(s.trim()) {
                Ok(t) => return Some(t.timestamp_millis()),
                Err(e) => match s.trim().parse::<f64>() {
                    Ok(n) => Some(n),
                    Err(_) => {
                        self.warn(
                            field,
                            format!("{at}: {s:?} is neither RFC 3339 ({e}) nor an epoch number; left out"),
                        );
                        return None;
                    }
                },
            },
            other => {
                self.ignored(field, at, "an RFC 3339 string or an epoch number", &other);
                return None;
            }
        };
        let n = number.filter(|n| n.is_finite())?;
        let seconds = match unit {
            TimeUnit::Seconds => true,
            TimeUnit::Milliseconds => false,
            TimeUnit::Auto => n.abs() < MS_FROM,
        };
        let ms = if seconds { n * 1000.0 } else { n };
        if !(0.0..=MAX_MS).contains(&ms) {
            self.warn(
                field,
                format!(
                    "{at}: {n} is out of range as epoch {} (1970 to 9999); left out",
                    if seconds { "seconds" } else { "milliseconds" }
                ),
            );
            return None;
        }
        Some(ms.round() as i64)
    }

    fn ignored(&mut self, field: OptionalField, at: &str, expected: &str, got: &Value) {
        self.warn(
            field,
            format!("{at} must be {expected}, got {}; left out", kind(got)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn created(v: Value, unit: TimeUnit) -> (Option<i64>, usize) {
        let mut o = Optional::default();
        let t = o.created_at("/created_at", Some(v), unit);
        (t, o.warnings.len())
    }

    #[test]
    fn epoch_seconds_and_milliseconds_are_told_apart_by_magnitude() {
        // What Python's time.time() gives.
        assert_eq!(
            created(json!(1796099449.85), TimeUnit::Auto),
            (Some(1_796_099_449_850), 0)
        );
        assert_eq!(
            created(json!(1796099449), TimeUnit::Auto),
            (Some(1_796_099_449_000), 0)
        );
        assert_eq!(
            created(json!(1796099449850i64), TimeUnit::Auto),
            (Some(1_796_099_449_850), 0)
        );
        assert_eq!(
            created(json!("1796099449.85"), TimeUnit::Auto),
            (Some(1_796_099_449_850), 0)
        );
        assert_eq!(
            created(json!("2026-11-29T10:00:00Z"), TimeUnit::Auto),
            (Some(1_795_946_400_000), 0)
        );
        // Fixed by the mapping: a small number read as milliseconds.
        assert_eq!(
            created(json!(1500), TimeUnit::Milliseconds),
            (Some(1500), 0)
        );
        assert_eq!(
            created(json!(1_796_099_449_850i64), TimeUnit::Seconds),
            (None, 1),
            "seconds past 9999"
        );
    }

    #[test]
    fn a_bad_optional_field_is_left_out_with_a_warning() {
        assert_eq!(created(json!(-5), TimeUnit::Auto), (None, 1));
        assert_eq!(created(json!("yesterday"), TimeUnit::Auto), (None, 1));
        assert_eq!(created(json!([1]), TimeUnit::Auto), (None, 1));
        let mut o = Optional::default();
        assert_eq!(o.priority("/p", Some(json!("asap"))), Priority::Normal);
        assert_eq!(o.priority("/p", Some(json!("URGENT"))), Priority::Urgent);
        assert_eq!(o.priority("/p", Some(json!(3))), Priority::Normal);
        assert_eq!(
            o.id_like(OptionalField::UserId, "/u", Some(json!(42))),
            Some("42".into())
        );
        assert_eq!(
            o.id_like(OptionalField::UserId, "/u", Some(json!(4.2))),
            None
        );
        assert_eq!(o.string(OptionalField::Lang, "/l", Some(json!({}))), None);
        assert_eq!(
            o.object(OptionalField::Metadata, "/m", Some(json!("x"))),
            None
        );
        let fields: Vec<&str> = o.warnings.iter().map(|w| w.field.as_str()).collect();
        assert_eq!(
            fields,
            ["priority", "priority", "user_id", "lang", "metadata"]
        );
        assert!(
            o.warnings[2].to_string().starts_with("user_id: /u must be"),
            "{}",
            o.warnings[2]
        );
    }
}
