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
//! `OP` one of `> >= < <= ==`, and `COUNTER` one of
//! - `posts_W`: its events in the window `W` (`1m` to `24h`, or `1d`), this
//!   one included;
//! - `allows_W`, `reviews_W`, `blocks_W`: the verdicts of its earlier events
//!   in the window;
//! - `allows_lastN`, `reviews_lastN`, `blocks_lastN`: among the verdicts of
//!   its last `N` earlier events (`N` up to `state.history`).
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

use super::{Match, Verdict};

/// The longest window a counter may have, in minutes (24 h): what an
/// entity's state keeps.
pub const MAX_WINDOW_MINUTES: u32 = 24 * 60;

/// What a counter counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tally {
    Posts,
    Verdicts(Verdict),
}

/// A counter of an entity's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Counter {
    /// Over the last `minutes` of event time, the event's own minute included.
    Window { tally: Tally, minutes: u32 },
    /// Among the verdicts of its last `n` earlier events.
    Last { verdict: Verdict, n: u32 },
}

impl Counter {
    /// `posts_1m`, `blocks_24h`, `reviews_last10`, ...
    pub fn parse(name: &str) -> Result<Counter, String> {
        let (kind, span) = name
            .split_once('_')
            .ok_or_else(|| format!("{name:?}: a counter is KIND_WINDOW or KIND_lastN"))?;
        let tally = match kind {
            "posts" => Tally::Posts,
            "allows" => Tally::Verdicts(Verdict::Allow),
            "reviews" => Tally::Verdicts(Verdict::Review),
            "blocks" => Tally::Verdicts(Verdict::Block),
            _ => {
                return Err(format!(
                    "{kind:?}: a counter counts posts, allows, reviews or blocks"
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

/// How a condition compares a counter with its number.
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

    pub fn holds(self, value: u64, than: u64) -> bool {
        match self {
            Op::Above => value > than,
            Op::AtLeast => value >= than,
            Op::Below => value < than,
            Op::AtMost => value <= than,
            Op::Equal => value == than,
        }
    }
}

/// `user.posts_1m > 5`.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    /// The entity's name as written (`user`): `state.entity_name`.
    pub entity: String,
    /// The counter's name as written (`posts_1m`), for the reason.
    pub name: String,
    pub counter: Counter,
    pub op: Op,
    pub than: u64,
}

impl Condition {
    pub fn parse(text: &str) -> Result<Condition, String> {
        let parts: Vec<&str> = text.split_whitespace().collect();
        let [subject, op, than] = parts[..] else {
            return Err(format!("{text:?}: a condition is ENTITY.COUNTER OP NUMBER"));
        };
        let (entity, name) = subject
            .split_once('.')
            .ok_or_else(|| format!("{subject:?}: ENTITY.COUNTER, as user.posts_1m"))?;
        let op = Op::parse(op).ok_or_else(|| format!("{op:?}: one of > >= < <= =="))?;
        let than = than
            .parse()
            .map_err(|_| format!("{than:?}: a whole number from 0"))?;
        Ok(Condition {
            entity: entity.to_string(),
            name: name.to_string(),
            counter: Counter::parse(name)?,
            op,
            than,
        })
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
        if conditions.is_empty() {
            return Err("at least one condition".into());
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
            if let Some(c) = rule
                .conditions
                .iter()
                .find(|c| c.entity != state.entity_name)
            {
                return Err(super::PolicyError::new(
                    format!("{at}.if"),
                    format!(
                        "{:?} names entity {:?}; state.entity_name is {:?}",
                        format!("{}.{}", c.entity, c.name),
                        c.entity,
                        state.entity_name
                    ),
                ));
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
                    tally: blocks,
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
        ] {
            assert!(Counter::parse(bad).is_err(), "{bad}");
        }
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
        assert_eq!(
            (c[0].entity.as_str(), c[0].name.as_str(), c[0].than),
            ("user", "posts_1m", 5)
        );
        assert!(c[0].op.holds(6, 5) && !c[0].op.holds(5, 5));
        assert!(c[1].op.holds(3, 3));
        for bad in [
            "user.posts_1m >5",
            "posts_1m > 5",
            "user.posts_1m => 5",
            "user.posts_1m > -1",
        ] {
            assert!(StateRule::parse_conditions(bad).is_err(), "{bad}");
        }
    }
}
