use super::report::{self, GroupBy, Inputs, Scope};
use crate::sampling::records::{DropRecord, LabelEntry, LabelRecord, SampleRecord};

/// A sample as the service writes it (the fields the report reads).
fn sample(id: &str, tenant: &str, probability: f64, score: f64, verdict: &str) -> SampleRecord {
    let crossed = if verdict == "allow" {
        serde_json::json!([])
    } else {
        serde_json::json!([{"label": "offensive", "score": score, "threshold": 0.5, "verdict": verdict}])
    };
    serde_json::from_value(serde_json::json!({
        "event_id": id,
        "sampled_at": "2026-12-03T10:00:00.000Z",
        "tenant": tenant,
        "verdict": verdict,
        "reason": {
            "rule": format!("rule-{tenant}"),
            "policy": "v1",
            "human_review": false,
            "models": [{"id": "default", "name": "m", "version": "1", "crossed": crossed,
                        "scores": {"clean": 1.0 - score, "offensive": score}}],
        },
        "sample": {"probability": probability, "score": score, "model": "default"},
        "event": {"event_id": id, "text": "t"},
    }))
    .unwrap()
}

fn label(id: &str, label: &str, at: &str) -> LabelEntry {
    LabelEntry::Label(LabelRecord {
        event_id: id.into(),
        label: label.into(),
        labeller: "alice".into(),
        labelled_at: at.into(),
    })
}

/// A drop record as the service writes it.
fn dropped(id: &str) -> DropRecord {
    serde_json::from_value(serde_json::json!({
        "dropped": true, "event_id": id, "sampled_at": "2026-12-03T10:00:00.000Z",
        "tenant": "t", "rule": "default", "source": {"topic": "posts", "partition": 0, "offset": 1},
        "sample": {"probability": 0.5, "score": 0.9, "model": "default"},
    }))
    .unwrap()
}

const T: &str = "2026-12-03T11:00:00Z";

#[test]
fn samples_join_their_latest_labels_and_nothing_is_dropped_silently() {
    let samples = vec![
        sample("a", "cats", 0.5, 0.9, "block"),
        sample("b", "cats", 0.1, 0.1, "allow"),
        sample("c", "dogs", 0.1, 0.2, "allow"),
        sample("d", "dogs", 0.5, 0.8, "block"),
        // Judged again after a crash: counted once.
        sample("a", "cats", 0.5, 0.9, "block"),
        // Unlabelled: reported.
        sample("e", "dogs", 0.1, 0.1, "allow"),
    ];
    let labels = vec![
        label("a", "offensive", T),
        label("b", "offensive", T),
        // A correction: the later label wins.
        label("b", "none", "2026-12-03T12:00:00Z"),
        label("c", "offensive", T),
        label("d", "none", T),
        label("zz", "offensive", T),
    ];
    let inputs = Inputs {
        samples,
        labels,
        refused_samples: 1,
        ..Inputs::default()
    };
    let scope = Scope {
        by: Some(GroupBy::Tenant),
        negative: vec!["none".into()],
        ..Scope::default()
    };
    let r = report::build(inputs, &scope);
    assert_eq!((r.samples, r.repeated, r.conflicting), (5, 1, 0));
    assert_eq!(
        (r.labelled, r.unlabelled, r.labels_without_sample),
        (4, 1, 1)
    );
    assert_eq!(r.refused_samples, 1);
    let groups: Vec<(&str, &str)> = r
        .rows
        .iter()
        .map(|x| (x.group.as_str(), x.label.as_str()))
        .collect();
    assert_eq!(
        groups,
        [
            ("all", "offensive"),
            ("cats", "offensive"),
            ("dogs", "offensive")
        ]
    );
    // Weighted: a (w 2) and c (w 10) offensive, b (w 10) and d (w 2) not.
    let all = &r.rows[0];
    assert!(
        (all.prevalence.value - 12.0 / 24.0).abs() < 1e-12,
        "{all:?}"
    );
    // Flagged: a (offensive) and d (none): precision 2 / 4; recall 2 / 12.
    let precision = all.precision.unwrap();
    assert!((precision.value - 0.5).abs() < 1e-12);
    assert!((all.recall.unwrap().value - 2.0 / 12.0).abs() < 1e-12);
    let cats = &r.rows[1];
    assert!((cats.prevalence.value - 2.0 / 12.0).abs() < 1e-12);
    let text = r.render();
    assert!(text.contains("unlabelled: 1"), "{text}");
    assert!(
        text.contains("sampled again after a restart or rebalance, counted once (0 of them"),
        "{text}"
    );
    // At other thresholds: at 0.85 only a is flagged (precision 1).
    let at = r.curves[0]
        .points
        .iter()
        .find(|p| (p.0 - 0.8).abs() < 1e-9)
        .unwrap();
    assert!((at.1.unwrap().value - 0.5).abs() < 1e-12, "0.8: a and d");
    let at = r.curves[0]
        .points
        .iter()
        .find(|p| (p.0 - 0.9).abs() < 1e-9)
        .unwrap();
    assert!((at.1.unwrap().value - 1.0).abs() < 1e-12, "0.9: a only");
}

/// Drops are counted once per event, and not at all for an event sampled
/// in another run; a label retracted (a null value after it) stops
/// counting, and one written after the retraction counts again.
#[test]
fn drops_are_counted_once_and_retracted_labels_stop_counting() {
    let inputs = Inputs {
        samples: vec![
            sample("a", "t", 0.5, 0.9, "block"),
            sample("b", "t", 0.5, 0.9, "block"),
            sample("c", "t", 0.5, 0.9, "block"),
        ],
        drops: vec![dropped("x"), dropped("x"), dropped("y"), dropped("a")],
        labels: vec![
            label("a", "offensive", T),
            label("b", "offensive", T),
            LabelEntry::Retracted("a".into()),
            label("c", "offensive", T),
            LabelEntry::Retracted("c".into()),
            label("c", "none", T),
        ],
        ..Inputs::default()
    };
    let r = report::build(
        inputs,
        &Scope {
            negative: vec!["none".into()],
            ..Scope::default()
        },
    );
    assert_eq!(r.dropped, 2, "x and y; a was sampled in another run");
    assert_eq!((r.labelled, r.unlabelled), (2, 1), "a's label retracted");
    let all = &r.rows[0];
    assert!(
        (all.prevalence.value - 0.5).abs() < 1e-12,
        "b offensive, c none: {all:?}"
    );
}

#[test]
fn a_resampled_event_with_another_probability_is_reported() {
    let inputs = Inputs {
        samples: vec![
            sample("a", "t", 0.5, 0.9, "block"),
            sample("a", "t", 0.2, 0.3, "allow"),
        ],
        ..Inputs::default()
    };
    let r = report::build(inputs, &Scope::default());
    assert_eq!((r.samples, r.repeated, r.conflicting), (1, 1, 1));
}

#[test]
fn the_window_keeps_samples_taken_from_from_and_before_to() {
    let mut late = sample("b", "t", 0.5, 0.9, "block");
    late.sampled_at = "2026-12-04T00:00:00Z".into();
    let inputs = Inputs {
        samples: vec![sample("a", "t", 0.5, 0.9, "block"), late],
        labels: vec![label("a", "offensive", T), label("b", "offensive", T)],
        ..Inputs::default()
    };
    let scope = Scope {
        from: Some("2026-12-03T00:00:00Z".parse().unwrap()),
        to: Some("2026-12-04T00:00:00Z".parse().unwrap()),
        ..Scope::default()
    };
    let r = report::build(inputs, &scope);
    assert_eq!((r.samples, r.outside, r.labelled), (1, 1, 1));
}

#[cfg(feature = "charts")]
#[test]
fn the_threshold_chart_is_drawn() {
    let inputs = Inputs {
        samples: vec![
            sample("a", "t", 0.5, 0.9, "block"),
            sample("b", "t", 0.1, 0.2, "allow"),
        ],
        labels: vec![label("a", "offensive", T), label("b", "none", T)],
        ..Inputs::default()
    };
    let r = report::build(
        inputs,
        &Scope {
            negative: vec!["none".into()],
            ..Scope::default()
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.svg");
    super::chart::thresholds(&r, &path).unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(
        svg.contains("offensive precision"),
        "the legend names each line"
    );
}

#[test]
fn more_labels_narrow_the_intervals_and_the_widths_chart_is_drawn() {
    use super::widths::{Plan, render, simulate};
    let rows = simulate(&Plan {
        events: 50_000,
        share: 0.02,
        replicates: 20,
        scales: vec![1.0, 8.0],
    });
    assert!(rows[1].labels > 6.0 * rows[0].labels, "{rows:?}");
    assert!(
        rows[1].prevalence_width < rows[0].prevalence_width / 2.0,
        "{rows:?}"
    );
    assert!(rows[1].recall_width < rows[0].recall_width, "{rows:?}");
    #[cfg(feature = "charts")]
    super::chart::widths(&rows, &tempfile::tempdir().unwrap().path().join("w.svg")).unwrap();
    assert!(render(&rows).lines().count() == 4);
}
