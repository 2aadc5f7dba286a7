//! The hub's per-event metric handles, resolved once: a `counter!` with
//! labels builds its key and looks the series up in the registry on every
//! call, which per verdict cost more than the increment itself.

use std::sync::Arc;

use metrics::{Counter, Histogram};

use crate::policy::{RuleId, Ruleset, Verdict};
use crate::telemetry::metric;

/// One counter per verdict, in [`Verdict::ALL`] order.
type ByVerdict = [Counter; 3];

fn by_verdict(mut counter: impl FnMut(Verdict) -> Counter) -> ByVerdict {
    Verdict::ALL.map(&mut counter)
}

fn index(v: Verdict) -> usize {
    match v {
        Verdict::Allow => 0,
        Verdict::Review => 1,
        Verdict::Block => 2,
    }
}

pub(super) struct Meters {
    pub(super) end_to_end: Histogram,
    verdicts: ByVerdict,
    /// The policy whose rules `by_rule` counts (indexed as its rules).
    policy: Arc<Ruleset>,
    by_rule: Vec<ByVerdict>,
}

impl Meters {
    pub(super) fn new(rules: &Arc<Ruleset>) -> Meters {
        Meters {
            end_to_end: metrics::histogram!(metric::END_TO_END_SECONDS),
            verdicts: by_verdict(
                |v| metrics::counter!(metric::VERDICTS_TOTAL, "verdict" => v.as_str()),
            ),
            policy: rules.clone(),
            by_rule: rule_counters(rules),
        }
    }

    /// A new policy in force: its rules' counters (each series at 0).
    pub(super) fn policy_loaded(&mut self, rules: &Arc<Ruleset>) {
        self.policy = rules.clone();
        self.by_rule = rule_counters(rules);
    }

    /// A verdict delivered, decided by rule `rule` of `rules`.
    pub(super) fn verdict(&self, verdict: Verdict, rules: &Arc<Ruleset>, rule: RuleId) {
        self.verdicts[index(verdict)].increment(1);
        if Arc::ptr_eq(rules, &self.policy) {
            if let Some(counters) = self.by_rule.get(rule.0) {
                counters[index(verdict)].increment(1);
            }
        } else if let Some(r) = rules.rule(rule) {
            // An event accepted under an earlier policy, delivered after a
            // new one took over: looked up by name, as rare as it is.
            metrics::counter!(metric::POLICY_VERDICTS_TOTAL, "rule" => r.id.clone(), "verdict" => verdict.as_str())
                .increment(1);
        }
    }
}

fn rule_counters(rules: &Ruleset) -> Vec<ByVerdict> {
    rules
        .rule_ids()
        .map(|rule| {
            by_verdict(|v| {
                let c = metrics::counter!(metric::POLICY_VERDICTS_TOTAL, "rule" => rule.to_string(), "verdict" => v.as_str());
                c.increment(0);
                c
            })
        })
        .collect()
}
