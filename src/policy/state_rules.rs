//! State rules: conditions on what an entity (a user, by default) did
//! before, read from its state ([`crate::state`]), that raise a verdict.
//!
//! ```toml
//! [[state_rules]]
//! id = "fast-poster"
//! when = { tenant = ["kids"] }          # optional, as a rule's `when`
//! if = "user.posts_1m > 5"              # conditions joined by "and"
//! raise = "review"                      # "review" or "block"
//! label = "velocity"                    # optional: in the verdict's reason
//! ```
//!
//! A condition is `ENTITY.COUNTER OP NUMBER`: `ENTITY` is `state.entity_name`,
//! `OP` one of `> >= < <= ==`, `NUMBER` a whole number, and `COUNTER` one of
//! - `posts_W`: its events in the window `W` (`1m` to `24h`, or `1d`), this
//!   one included;
//! - `allows_W`, `reviews_W`, `blocks_W`: the verdicts of its earlier events
//!   in the window;
//! - `allows_lastN`, `reviews_lastN`, `blocks_lastN`: among the verdicts of
//!   its last `N` earlier events (`N` up to `state.history`);
//! - `LABEL_over_T_W`: its events in the window, this one included, whose
//!   score for `LABEL` (the highest of the models that scored it) is above
//!   `T` (`offensive_over_0.8_1h`);
//! - `distinct_FIELD_W`: the distinct values of an event field (`user_id`,
//!   `lang`, `tenant` or `metadata.KEY`) among its events in the window,
//!   this one included, counted up to [`DISTINCT_CAP`] (so `NUMBER` is below
//!   it): `distinct_metadata.url_1h`.
//!
//! Or `FIELD OP NUMBER` on a number the event carries (`metadata.KEY`, a
//! JSON number or a string of one): `metadata.account_age_s < 1d`. `NUMBER`
//! may be any number, or a duration (`45s`, `30m`, `12h`, `1d`) that
//! compares with the field read as seconds. An event without the field (or
//! with one that is not a number) does not meet the condition. A rule has at
//! least one counter: the first names it in the reason.
//!
//! The verdicts counted are those of the models and lists, before any state
//! rule raised them: a raise never feeds a counter (else a user blocked for
//! two blocks in three posts would stay blocked by its own raised blocks).
//!
//! Windows are whole minutes of the events' own time (the record's
//! timestamp), so a replay judges as the first run did. Every state rule
//! whose conditions hold fires; the verdict is raised to the highest
//! `raise` among them (never lowered), and the reason names the first
//! rule that gave it.
//!
//! Scores and distinct values are counted for the counters the rules in
//! force name ([`Tracked`]): a counter a reloaded policy adds starts from the
//! events after the reload.

use std::borrow::Cow;

use super::{Field, Match, Verdict};
use crate::event::Event;

/// The longest window a counter may have, in minutes (24 h): what an
/// entity's state keeps.
pub const MAX_WINDOW_MINUTES: u32 = 24 * 60;

/// The distinct values of a field an entity's state keeps (the most
/// recently seen): a `distinct_*` counter counts up to it.
pub const DISTINCT_CAP: usize = 64;

/// What a window counter counts per minute.
#[derive(Debug, Clone, PartialEq)]
pub enum Tally {
    Posts,
    Verdicts(Verdict),
    /// Events whose score for the label is above the threshold.
    Over(ScoreOver),
}

/// Events whose score for `label` is above `over`.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreOver {
    pub label: String,
    pub over: f32,
    /// Its name in an entity's state (`offensive>0.8`).
    pub key: String,
}

impl ScoreOver {
    pub fn new(label: &str, over: f32) -> ScoreOver {
        ScoreOver {
            label: label.to_string(),
            over,
            key: format!("{label}>{over}"),
        }
    }
}

/// A field whose distinct values are counted.
#[derive(Debug, Clone, PartialEq)]
pub struct DistinctOf {
    /// As written (`metadata.url`): its name in an entity's state.
    pub name: String,
    pub field: Field,
}

/// A counter of an entity's state.
#[derive(Debug, Clone, PartialEq)]
pub enum Counter {
    /// Over the last `minutes` of event time, the event's own minute included.
    Window { tally: Tally, minutes: u32 },
    /// Among the verdicts of its last `n` earlier events.
    Last { verdict: Verdict, n: u32 },
    /// The distinct values of a field over the last `minutes`.
    Distinct { of: DistinctOf, minutes: u32 },
}

impl Counter {
    /// `posts_1m`, `blocks_24h`, `reviews_last10`, `offensive_over_0.8_1h`,
    /// `distinct_metadata.url_1h`.
    pub fn parse(name: &str) -> Result<Counter, String> {
        let (kind, span) = name.rsplit_once('_').ok_or_else(|| {
            format!("{name:?}: a counter is KIND_WINDOW, KIND_lastN, LABEL_over_T_WINDOW or distinct_FIELD_WINDOW")
        })?;
        if let Some(field) = kind.strip_prefix("distinct_") {
            let of = DistinctOf {
                name: field.to_string(),
                field: Field::parse(field).ok_or_else(|| {
                    format!("{field:?}: a field is user_id, lang, tenant, topic, priority or metadata.KEY")
                })?,
            };
            let minutes = window_minutes(span)?;
            return Ok(Counter::Distinct { of, minutes });
        }
        if let Some((label, over)) = kind.rsplit_once("_over_") {
            let over: f32 = over
                .parse()
                .ok()
                .filter(|t: &f32| (0.0..1.0).contains(t))
                .ok_or_else(|| format!("{over:?}: a score threshold from 0 to below 1"))?;
            if label.is_empty() {
                return Err(format!("{name:?}: LABEL_over_T_WINDOW names a label"));
            }
            let tally = Tally::Over(ScoreOver::new(label, over));
            let minutes = window_minutes(span)?;
            return Ok(Counter::Window { tally, minutes });
        }
        let tally = match kind {
            "posts" => Tally::Posts,
            "allows" => Tally::Verdicts(Verdict::Allow),
            "reviews" => Tally::Verdicts(Verdict::Review),
            "blocks" => Tally::Verdicts(Verdict::Block),
            _ => {
                return Err(format!(
                    "{kind:?}: a counter counts posts, allows, reviews, blocks, LABEL_over_T or distinct_FIELD"
                ));
            }
        };
        if let Some(n) = span.strip_prefix("last") {
            let Tally::Verdicts(verdict) = tally else {
                return Err("posts_lastN would always be N: count verdicts of the last N".into());
            };
            let n: u32 = n
                .parse()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| format!("{span:?}: lastN with N a whole number from 1"))?;
            return Ok(Counter::Last { verdict, n });
        }
        let minutes = window_minutes(span)?;
        Ok(Counter::Window { tally, minutes })
    }
}

/// `30m`, `1h`, `24h`, `1d` in minutes (1 to [`MAX_WINDOW_MINUTES`]).
fn window_minutes(span: &str) -> Result<u32, String> {
    let unit_at = span
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(span.len());
    let (n, unit) = span.split_at(unit_at);
    let n: u32 = n
        .parse()
        .map_err(|_| format!("{span:?}: a window is Nm, Nh or Nd"))?;
    let minutes = match unit {
        "m" => n,
        "h" => n.saturating_mul(60),
        "d" => n.saturating_mul(24 * 60),
        _ => return Err(format!("{span:?}: a window is Nm, Nh or Nd")),
    };
    if !(1..=MAX_WINDOW_MINUTES).contains(&minutes) {
        return Err(format!("{span:?}: a window is 1m to 24h"));
    }
    Ok(minutes)
}

/// How a condition compares a value with its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Above,
    AtLeast,
    Below,
    AtMost,
    Equal,
}

impl Op {
    fn parse(op: &str) -> Option<Op> {
        Some(match op {
            ">" => Op::Above,
            ">=" => Op::AtLeast,
            "<" => Op::Below,
            "<=" => Op::AtMost,
            "==" => Op::Equal,
            _ => return None,
        })
    }

    pub fn holds(self, value: f64, than: f64) -> bool {
        match self {
            Op::Above => value > than,
            Op::AtLeast => value >= than,
            Op::Below => value < than,
            Op::AtMost => value <= than,
            Op::Equal => value == than,
        }
    }
}

/// What a condition reads.
#[derive(Debug, Clone, PartialEq)]
pub enum Subject {
    /// `user.posts_1m`: a counter of the entity's state.
    Counter {
        /// The entity's name as written (`user`): `state.entity_name`.
        entity: String,
        /// The counter's name as written (`posts_1m`), for the reason.
        name: String,
        counter: Counter,
    },
    /// `metadata.account_age_s`: a number the event carries.
    Event { name: String, field: Field },
}

/// `user.posts_1m > 5`, or `metadata.account_age_s < 1d`.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub subject: Subject,
    pub op: Op,
    pub than: f64,
}

impl Condition {
    pub fn parse(text: &str) -> Result<Condition, String> {
        let parts: Vec<&str> = text.split_whitespace().collect();
        let [subject, op, than] = parts[..] else {
            return Err(format!(
                "{text:?}: a condition is ENTITY.COUNTER OP NUMBER or metadata.KEY OP NUMBER"
            ));
        };
        let op = Op::parse(op).ok_or_else(|| format!("{op:?}: one of > >= < <= =="))?;
        if subject.starts_with("metadata.") {
            let field = Field::parse(subject)
                .ok_or_else(|| format!("{subject:?}: metadata.KEY names a key"))?;
            return Ok(Condition {
                subject: Subject::Event {
                    name: subject.to_string(),
                    field,
                },
                op,
                than: event_number(than)?,
            });
        }
        let (entity, name) = subject
            .split_once('.')
            .ok_or_else(|| format!("{subject:?}: ENTITY.COUNTER, as user.posts_1m"))?;
        let counter = Counter::parse(name)?;
        let than: u32 = than
            .parse()
            .map_err(|_| format!("{than:?}: a whole number from 0"))?;
        if matches!(counter, Counter::Distinct { .. }) && than as usize >= DISTINCT_CAP {
            return Err(format!(
                "{than}: a distinct counter counts up to {DISTINCT_CAP}, so it compares with a number below it"
            ));
        }
        Ok(Condition {
            subject: Subject::Counter {
                entity: entity.to_string(),
                name: name.to_string(),
                counter,
            },
            op,
            than: f64::from(than),
        })
    }
}

/// A number, or a duration (`45s`, `30m`, `12h`, `1d`) in seconds.
fn event_number(text: &str) -> Result<f64, String> {
    let scale = match text.chars().last() {
        Some('s') => Some(1.0),
        Some('m') => Some(60.0),
        Some('h') => Some(3600.0),
        Some('d') => Some(86_400.0),
        _ => None,
    };
    let (number, scale) = match scale {
        Some(scale) => (&text[..text.len() - 1], scale),
        None => (text, 1.0),
    };
    number
        .parse::<f64>()
        .ok()
        .filter(|n| n.is_finite())
        .map(|n| n * scale)
        .ok_or_else(|| format!("{text:?}: a number, or a duration as 45s, 30m, 12h or 1d"))
}

/// The number an event carries in `field` (a JSON number, or a string of
/// one), if it does.
pub fn event_value(field: &Field, topic: &str, event: &Event) -> Option<f64> {
    let text: Cow<'_, str> = field.value(topic, event)?;
    text.trim().parse::<f64>().ok().filter(|n| n.is_finite())
}

/// The scores and distinct values the state rules in force count: each
/// once, however many counters and rules name it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tracked {
    pub scores: Vec<ScoreOver>,
    pub distinct: Vec<DistinctOf>,
}

impl Tracked {
    /// What `conditions` count.
    pub fn of<'c>(conditions: impl IntoIterator<Item = &'c Condition>) -> Tracked {
        let mut tracked = Tracked::default();
        let counters = conditions.into_iter().filter_map(|c| match &c.subject {
            Subject::Counter { counter, .. } => Some(counter),
            Subject::Event { .. } => None,
        });
        for counter in counters {
            match counter {
                Counter::Window {
                    tally: Tally::Over(score),
                    ..
                } if !tracked.scores.contains(score) => tracked.scores.push(score.clone()),
                Counter::Distinct { of, .. } if !tracked.distinct.contains(of) => {
                    tracked.distinct.push(of.clone())
                }
                _ => {}
            }
        }
        tracked
    }
}

/// One state rule (see the module's docs).
#[derive(Debug, Clone, PartialEq)]
pub struct StateRule {
    pub id: String,
    pub when: Match,
    /// All must hold.
    pub conditions: Vec<Condition>,
    /// `Review` or `Block`.
    pub raise: Verdict,
    pub label: Option<String>,
}

impl StateRule {
    /// The conditions of `if`, joined by "and".
    pub fn parse_conditions(text: &str) -> Result<Vec<Condition>, String> {
        let conditions = text
            .split(" and ")
            .map(|c| Condition::parse(c.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        if !conditions
            .iter()
            .any(|c| matches!(c.subject, Subject::Counter { .. }))
        {
            return Err(
                "at least one condition on a counter (ENTITY.COUNTER): it names the rule in the reason"
                    .into(),
            );
        }
        Ok(conditions)
    }
}

impl super::Ruleset {
    /// Whether the state rules can read the state `[state]` keeps: it is
    /// kept (`state.changelog_topic`) and each condition names its entity.
    pub fn check_state(
        &self,
        state: &crate::config::StateSettings,
    ) -> Result<(), super::PolicyError> {
        for rule in self.state_rules() {
            let at = format!("state_rules.{}", rule.id);
            if !state.enabled() {
                return Err(super::PolicyError::new(
                    at,
                    "state rules need state.changelog_topic (state is kept only with a changelog)",
                ));
            }
            for c in &rule.conditions {
                let Subject::Counter { entity, name, .. } = &c.subject else {
                    continue;
                };
                if *entity != state.entity_name {
                    return Err(super::PolicyError::new(
                        format!("{at}.if"),
                        format!(
                            "\"{entity}.{name}\" names entity {entity:?}; state.entity_name is {:?}",
                            state.entity_name
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A state rule that fired on an event: which, the counter that decided
/// it (its first condition) and that counter's value, for the reason.
#[derive(Debug, Clone, PartialEq)]
pub struct Fired {
    pub rule: String,
    /// `user:u-9`.
    pub entity: String,
    pub counter: String,
    pub value: u64,
    pub raise: Verdict,
    pub label: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_parse_by_kind_and_window() {
        let posts = Tally::Posts;
        let blocks = Tally::Verdicts(Verdict::Block);
        for (name, want) in [
            (
                "posts_1m",
                Counter::Window {
                    tally: posts,
                    minutes: 1,
                },
            ),
            (
                "blocks_24h",
                Counter::Window {
                    tally: blocks.clone(),
                    minutes: 1440,
                },
            ),
            (
                "blocks_1d",
                Counter::Window {
                    tally: blocks,
                    minutes: 1440,
                },
            ),
            (
                "reviews_last10",
                Counter::Last {
                    verdict: Verdict::Review,
                    n: 10,
                },
            ),
            (
                "severe_toxic_over_0.80_1h",
                Counter::Window {
                    tally: Tally::Over(ScoreOver::new("severe_toxic", 0.8)),
                    minutes: 60,
                },
            ),
            (
                "distinct_metadata.url_10m",
                Counter::Distinct {
                    of: DistinctOf {
                        name: "metadata.url".into(),
                        field: Field::Metadata("url".into()),
                    },
                    minutes: 10,
                },
            ),
        ] {
            assert_eq!(Counter::parse(name), Ok(want), "{name}");
        }
        for bad in [
            "posts",
            "likes_1m",
            "posts_25h",
            "posts_0m",
            "posts_last3",
            "blocks_last0",
            "posts_1w",
            "offensive_over_1_1h",
            "offensive_over_-0.1_1h",
            "offensive_over_x_1h",
            "_over_0.5_1h",
            "offensive_over_0.5_last3",
            "distinct_url_1h",
            "distinct_user_id_last3",
        ] {
            assert!(Counter::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn each_score_and_field_is_counted_once_however_many_counters_name_it() {
        let conditions = StateRule::parse_conditions(
            "user.offensive_over_0.8_1h > 2 and user.offensive_over_0.80_10m > 1 and user.distinct_metadata.url_1h > 3 and user.distinct_metadata.url_5m > 1 and user.offensive_over_0.5_1h > 0",
        )
        .unwrap();
        let tracked = Tracked::of(&conditions);
        let keys: Vec<&str> = tracked.scores.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(keys, ["offensive>0.8", "offensive>0.5"]);
        assert_eq!(tracked.distinct.len(), 1);
    }

    #[test]
    fn state_rules_need_the_state_they_read() {
        let rule = StateRule {
            id: "fast".into(),
            when: Match::default(),
            conditions: StateRule::parse_conditions("user.posts_1m > 5").unwrap(),
            raise: Verdict::Review,
            label: None,
        };
        let rules = super::super::Ruleset::new("v".into(), Vec::new()).with_state_rules(vec![rule]);
        let mut state = crate::config::StateSettings::default();
        let off = rules.check_state(&state).unwrap_err();
        assert!(off.message.contains("state.changelog_topic"), "{off}");
        state.changelog_topic = Some("state".into());
        assert_eq!(rules.check_state(&state), Ok(()));
        state.entity_name = "device".into();
        let other = rules.check_state(&state).unwrap_err();
        assert_eq!(other.at, "state_rules.fast.if");
    }

    #[test]
    fn conditions_parse_and_hold() {
        let c = StateRule::parse_conditions("user.posts_1m > 5 and user.blocks_24h >= 3").unwrap();
        assert_eq!(c.len(), 2);
        let Subject::Counter { entity, name, .. } = &c[0].subject else {
            panic!("{:?}", c[0]);
        };
        assert_eq!(
            (entity.as_str(), name.as_str(), c[0].than),
            ("user", "posts_1m", 5.0)
        );
        assert!(c[0].op.holds(6.0, 5.0) && !c[0].op.holds(5.0, 5.0));
        assert!(c[1].op.holds(3.0, 3.0));
        let e = StateRule::parse_conditions("metadata.account_age_s < 1d and user.posts_1m > 5")
            .unwrap();
        assert_eq!(
            e[0].subject,
            Subject::Event {
                name: "metadata.account_age_s".into(),
                field: Field::Metadata("account_age_s".into()),
            }
        );
        assert_eq!(e[0].than, 86_400.0);
        for (text, than) in [
            ("-2.5", -2.5),
            ("45s", 45.0),
            ("30m", 1800.0),
            ("12h", 43_200.0),
        ] {
            let c = Condition::parse(&format!("metadata.x >= {text}")).unwrap();
            assert_eq!(c.than, than, "{text}");
        }
        for bad in [
            "user.posts_1m >5",
            "posts_1m > 5",
            "user.posts_1m => 5",
            "user.posts_1m > -1",
            "user.posts_1m > 1.5",
            // A rule names a counter in its reason.
            "metadata.account_age_s < 1d",
            "metadata.account_age_s < 1w",
            "metadata.account_age_s < NaN",
            "metadata. < 1",
            // Counted up to DISTINCT_CAP: a number at it could never be told apart.
            "user.distinct_metadata.url_1h >= 64",
        ] {
            assert!(StateRule::parse_conditions(bad).is_err(), "{bad}");
        }
    }
}
