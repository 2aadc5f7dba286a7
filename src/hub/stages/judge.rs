//! Judge: a scored event's decision by its rule (its deciding list match,
//! or its models' scores against the rule's thresholds), then the state
//! rules' step, which may raise it. A step between the models and the
//! verdict (another kind of rule) is one more line here.

use super::state::StateRules;
use crate::hub::partition::Pending;
use crate::policy::Decision;
use crate::state::Step;

/// An event's decision and the state step that went with it.
pub(crate) struct Judgement {
    /// Raised by the state rule that fired, if one did.
    pub decision: Decision,
    pub step: Step,
}

/// The decision of a scored event (not failed: a failed one is dead-lettered).
pub(crate) fn judge(pending: &Pending, state: &mut StateRules) -> Judgement {
    let rule = &pending.rules.rules()[pending.rule.0];
    let mut decision = match pending.matching.marks.as_ref().and_then(|m| m.deciding()) {
        Some(item) => rule.decided_by(item.verdict),
        None => rule.judge(|m| pending.scores_of(m)),
    };
    let step = state.step(pending, decision.verdict);
    if let Some(fired) = &step.fired {
        decision.verdict = decision.verdict.max(fired.raise);
    }
    Judgement { decision, step }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::partition::tests::{pending, tp};
    use crate::policy::{ModelId, Verdict};
    use crate::tp::Generation;

    fn scored(offensive: f32) -> Pending {
        let mut p = pending(&tp(0), Generation(0), 0);
        let manifest: crate::inference::manifest::Manifest =
            serde_json::from_value(serde_json::json!({
                "name": "m", "version": "1", "input_kind": "text", "inputs": ["text"],
                "output": "p", "labels": ["offensive"], "score_label": "offensive",
            }))
            .unwrap();
        p.scores.push(crate::verdict::ModelScores {
            model: ModelId(0),
            scorer: std::sync::Arc::new(crate::verdict::Scorer::named("default", &manifest)),
            probabilities: vec![offensive],
            reused: false,
        });
        p
    }

    #[test]
    fn the_rule_judges_by_the_models_scores_and_absent_state_raises_nothing() {
        let mut state = StateRules::off();
        let low = judge(&scored(0.01), &mut state);
        assert_eq!(low.decision.verdict, Verdict::Allow);
        assert!(low.step.fired.is_none() && low.step.changelog.is_empty());
        let high = judge(&scored(0.99), &mut state);
        assert_eq!(high.decision.verdict, Verdict::Block);
    }
}
