use super::*;
use config::FileFormat;

const M0: ModelId = ModelId(0);
const M1: ModelId = ModelId(1);

fn models() -> Vec<ModelLabels> {
    vec![
        ModelLabels {
            name: "profanity".into(),
            labels: vec!["is_offensive".into()],
            score_label: 0,
        },
        ModelLabels {
            name: "minilm".into(),
            labels: vec!["Toxic".into(), "clean".into()],
            score_label: 0,
        },
    ]
}

const THREE: &str = r#"
version = "v1"

[[rules]]
id = "kids"
when = { tenant = ["kids", "kids-es"] }
models.profanity.is_offensive = { review_at = 0.2, block_at = 0.5 }
models.minilm.Toxic = { review_at = 0.3, block_at = 0.6 }
routes = [{ verdicts = ["review"], topic = "kids-review", priority = "high" }]

[[rules]]
id = "debate"
when = { "metadata.community" = "debate", lang = "en" }
human_review = true
models.profanity.is_offensive = { review_at = 0.9, block_at = 0.99 }

[[rules]]
id = "default"
models.profanity.is_offensive = { review_at = 0.5, block_at = 0.85 }
"#;

fn event(json: serde_json::Value) -> Event {
    crate::event::validate(Some(json.to_string().as_bytes()), &Default::default()).unwrap()
}

#[test]
fn the_first_matching_rule_decides_and_only_its_models_run() {
    let rules = Ruleset::parse(THREE, FileFormat::Toml, &models()).unwrap();
    assert_eq!(rules.version, "v1");
    let kids = event(serde_json::json!({"event_id": "1", "text": "t", "tenant": "kids-es"}));
    let debate = event(
        serde_json::json!({"event_id": "2", "text": "t", "lang": "en",
        "metadata": {"community": "debate"}}),
    );
    let debate_fr = event(
        serde_json::json!({"event_id": "3", "text": "t", "lang": "fr",
        "metadata": {"community": "debate"}}),
    );
    let other = event(serde_json::json!({"event_id": "4", "text": "t"}));
    let ids: Vec<&str> = [&kids, &debate, &debate_fr, &other]
        .iter()
        .map(|e| rules.rules[rules.rule_for("posts", e).0].id.as_str())
        .collect();
    assert_eq!(ids, ["kids", "debate", "default", "default"]);
    let kids_rule = &rules.rules[0];
    assert!(kids_rule.runs(M0) && kids_rule.runs(M1));
    assert!(rules.rules[1].runs(M0) && !rules.rules[1].runs(M1));

    // Profanity 0.3 crosses kids' review_at 0.2; MiniLM Toxic 0.7 its block_at 0.6.
    let p = [0.3f32];
    let m = [0.7f32, 0.3];
    let (pl, ml) = (
        ["is_offensive".to_string()],
        ["Toxic".to_string(), "clean".to_string()],
    );
    let decision = kids_rule.judge(|i| match i {
        M0 => Some((&pl[..], &p[..])),
        M1 => Some((&ml[..], &m[..])),
        _ => None,
    });
    assert_eq!(decision.verdict, Verdict::Block);
    assert_eq!(
        decision.crossings,
        vec![
            Crossing {
                model: M0,
                label: "is_offensive".into(),
                score: 0.3,
                threshold: 0.2,
                verdict: Verdict::Review
            },
            Crossing {
                model: M1,
                label: "Toxic".into(),
                score: 0.7,
                threshold: 0.6,
                verdict: Verdict::Block
            },
        ]
    );
    assert_eq!(kids_rule.routes_for(Verdict::Review).count(), 1);
    assert_eq!(kids_rule.routes_for(Verdict::Block).count(), 0);
    // human_review raises an allow to review, and says so.
    let low = [0.1f32];
    let d = rules.rules[1].judge(|_| Some((&pl[..], &low[..])));
    assert_eq!(
        (d.verdict, d.by_score, d.human_review),
        (Verdict::Review, Verdict::Allow, true)
    );
    assert!(d.crossings.is_empty());
}

#[test]
fn yaml_reads_the_same_rules() {
    let yaml = r#"
version: v1
rules:
  - id: kids
    when: { tenant: [kids, kids-es] }
    models:
      profanity: { is_offensive: { review_at: 0.2, block_at: 0.5 } }
      minilm: { Toxic: { review_at: 0.3, block_at: 0.6 } }
    routes: [{ verdicts: [review], topic: kids-review, priority: high }]
  - id: debate
    when: { metadata.community: debate, lang: en }
    human_review: true
    models:
      profanity: { is_offensive: { review_at: 0.9, block_at: 0.99 } }
  - id: default
    models:
      profanity: { is_offensive: { review_at: 0.5, block_at: 0.85 } }
"#;
    let from_yaml = Ruleset::parse(yaml, FileFormat::Yaml, &models()).unwrap();
    let from_toml = Ruleset::parse(THREE, FileFormat::Toml, &models()).unwrap();
    assert_eq!(from_yaml, from_toml);
}

#[test]
fn a_wrong_rule_refuses_the_whole_file_and_says_where() {
    let cases = [
        (
            "models.minilm.toxic = { review_at = 0.3, block_at = 0.6 }",
            "models.minilm.toxic",
            "no label",
        ),
        (
            "models.bert.x = { review_at = 0.3, block_at = 0.6 }",
            "models.bert",
            "no such model",
        ),
        (
            "models.profanity.is_offensive = { review_at = 0.7, block_at = 0.6 }",
            "is_offensive",
            "review_at <= block_at",
        ),
        (
            "models.profanity.is_offensive = { review_at = 0.3, block_at = 1.6 }",
            "is_offensive",
            "0..=1",
        ),
        (
            "when = { colour = \"red\" }\nmodels.profanity.is_offensive = { review_at = 0.3, block_at = 0.6 }",
            "when.colour",
            "not a field",
        ),
        (
            "when = { priority = \"high\" }\nmodels.profanity.is_offensive = { review_at = 0.3, block_at = 0.6 }",
            "when.priority",
            "normal",
        ),
        ("models = {}", "models", "at least one model"),
        (
            "routes = [{ verdicts = [\"later\"], topic = \"q\" }]\nmodels.profanity.is_offensive = { review_at = 0.3, block_at = 0.6 }",
            "routes[0]",
            "not allow",
        ),
    ];
    for (body, at, why) in cases {
        let text = format!(
            "version = \"v2\"\n[[rules]]\nid = \"r\"\nwhen = {{ tenant = \"t\" }}\n{body}\n[[rules]]\nid = \"default\"\nmodels.profanity.is_offensive = {{ review_at = 0.5, block_at = 0.85 }}\n"
        )
        .replacen("when = { tenant = \"t\" }\nwhen", "when", 1);
        let e = Ruleset::parse(&text, FileFormat::Toml, &models()).expect_err(body);
        let shown = e.to_string();
        assert!(shown.contains(at) && shown.contains(why), "{body}: {shown}");
    }
    let default_first = "version = \"v\"\n[[rules]]\nid = \"a\"\nmodels.profanity.is_offensive = { review_at = 0.5, block_at = 0.8 }\n[[rules]]\nid = \"b\"\nwhen = { tenant = \"t\" }\nmodels.profanity.is_offensive = { review_at = 0.5, block_at = 0.8 }\n";
    let e = Ruleset::parse(default_first, FileFormat::Toml, &models()).unwrap_err();
    assert!(
        e.to_string()
            .contains("only the last rule may leave out `when`"),
        "{e}"
    );
    let no_default = "version = \"v\"\n[[rules]]\nid = \"a\"\nwhen = { tenant = \"t\" }\nmodels.profanity.is_offensive = { review_at = 0.5, block_at = 0.8 }\n";
    let e = Ruleset::parse(no_default, FileFormat::Toml, &models()).unwrap_err();
    assert!(
        e.to_string().contains("the last rule is the default"),
        "{e}"
    );
    let twice = "version = \"v\"\n[[rules]]\nid = \"a\"\nwhen = { tenant = \"t\" }\nmodels.profanity.is_offensive = { review_at = 0.5, block_at = 0.8 }\n[[rules]]\nid = \"a\"\nmodels.profanity.is_offensive = { review_at = 0.5, block_at = 0.8 }\n";
    assert!(
        Ruleset::parse(twice, FileFormat::Toml, &models())
            .unwrap_err()
            .to_string()
            .contains("once")
    );
    let bad_id = THREE.replace("id = \"kids\"", "id = \"kids community\"");
    assert!(Ruleset::parse(&bad_id, FileFormat::Toml, &models()).is_err());
    let no_version = THREE.replace("version = \"v1\"", "version = \" \"");
    assert!(Ruleset::parse(&no_version, FileFormat::Toml, &models()).is_err());
}

#[test]
fn without_a_file_the_configuration_thresholds_make_the_default_rule() {
    let mut policy = crate::config::Policy::default();
    let rules = Ruleset::from_config(&policy, &models()).unwrap();
    assert_eq!(rules.rules.len(), 1);
    let rule = &rules.rules[0];
    assert_eq!(
        (rule.id.as_str(), rules.version.as_str()),
        ("default", "config")
    );
    assert!(rule.runs(M0) && rule.runs(M1));
    let p = [0.9f32];
    let m = [0.1f32, 0.9];
    let (pl, ml) = (
        ["is_offensive".to_string()],
        ["Toxic".to_string(), "clean".to_string()],
    );
    let d = rule.judge(|i| {
        Some(if i == M0 {
            (&pl[..], &p[..])
        } else {
            (&ml[..], &m[..])
        })
    });
    assert_eq!(d.verdict, Verdict::Block);
    assert_eq!(d.crossings.len(), 1, "MiniLM's score_label (Toxic) is 0.1");
    policy.labels.insert(
        "nope".into(),
        Thresholds {
            review_at: 0.1,
            block_at: 0.2,
        },
    );
    let e = Ruleset::from_config(&policy, &models()).unwrap_err();
    assert!(e.to_string().contains("policy.labels.nope"), "{e}");
    // A new model version must have every label the rules judge.
    let rules = Ruleset::parse(THREE, FileFormat::Toml, &models()).unwrap();
    assert_eq!(rules.missing_labels(M1, &["toxic".into()]), vec!["Toxic"]);
    assert!(
        rules
            .missing_labels(M1, &["clean".into(), "Toxic".into()])
            .is_empty()
    );
}

#[test]
fn a_missing_or_strange_file_is_refused_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let e = Ruleset::load(&dir.path().join("policy.toml"), &models()).unwrap_err();
    assert!(
        e.to_string().contains("policy.toml") && e.to_string().contains("cannot read"),
        "{e}"
    );
    let e = Ruleset::load(&dir.path().join("policy.json"), &models()).unwrap_err();
    assert!(e.to_string().contains(".toml, .yaml"), "{e}");
    let path = dir.path().join("p.toml");
    std::fs::write(&path, "version = \"v1\"\nrules = 3\n").unwrap();
    let e = Ruleset::load(&path, &models()).unwrap_err();
    assert!(e.to_string().contains("p.toml"), "{e}");
}

const CASCADE: &str = r#"
version = "c1"

[[rules]]
id = "default"
models.profanity.is_offensive = { review_at = 0.5, block_at = 0.85 }
models.minilm.Toxic = { review_at = 0.6, block_at = 0.9 }
cascade.minilm = { after = "profanity", label = "is_offensive", band = [0.2, 0.8] }
"#;

#[test]
fn a_cascaded_model_runs_only_where_the_first_is_unsure_and_then_decides() {
    let rules = Ruleset::parse(CASCADE, FileFormat::Toml, &models()).unwrap();
    let rule = &rules.rules[0];
    let pl = ["is_offensive".to_string()];
    let ml = ["Toxic".to_string(), "clean".to_string()];
    let runs = |p: f32| {
        let probs = [p];
        rule.runs_after(M1, |m| (m == M0).then_some((&pl[..], &probs[..])))
    };
    assert!(!runs(0.1) && runs(0.2) && runs(0.5) && !runs(0.8) && !runs(0.95));
    let whole = Cascade {
        from: 0.0,
        to: 1.0,
        ..rule.cascade[0].clone()
    };
    assert!(
        whole.contains(0.0) && whole.contains(1.0),
        "a band up to 1 includes 1"
    );
    assert!(
        !rule.runs_after(M1, |_| None),
        "not before the first model scored"
    );
    assert!(rule.runs_after(M0, |_| None), "the first model always runs");
    // Unsure (0.7 would be a review by profanity's thresholds); MiniLM says
    // allow, and decides.
    let p = [0.7f32];
    let m = [0.1f32, 0.9];
    let d = rule.judge(|i| match i {
        M0 => Some((&pl[..], &p[..])),
        M1 => Some((&ml[..], &m[..])),
        _ => None,
    });
    assert_eq!((d.verdict, d.deferred.clone()), (Verdict::Allow, vec![M0]));
    assert!(d.crossings.is_empty());
    // Sure: MiniLM did not run, profanity's thresholds apply.
    let p = [0.9f32];
    let d = rule.judge(|i| (i == M0).then_some((&pl[..], &p[..])));
    assert_eq!((d.verdict, d.deferred.len()), (Verdict::Block, 0));
}

#[test]
fn a_cascade_without_a_band_gets_the_default_one() {
    let text = CASCADE.replace(", band = [0.2, 0.8]", "");
    assert_ne!(text, CASCADE);
    let rules = Ruleset::parse(&text, FileFormat::Toml, &models()).unwrap();
    let c = &rules.rules[0].cascade[0];
    assert_eq!([c.from, c.to], DEFAULT_BAND);
}

#[test]
fn a_wrong_cascade_is_refused_with_its_key() {
    let cases = [
        (
            "band = [0.2, 0.8]",
            "band = [0.8, 0.2]",
            "cascade.minilm.band",
        ),
        (
            "after = \"profanity\"",
            "after = \"minilm\"",
            "cascade.minilm.after",
        ),
        (
            "label = \"is_offensive\"",
            "label = \"Toxic\"",
            "cascade.minilm.label",
        ),
        ("cascade.minilm", "cascade.bert", "cascade.bert"),
    ];
    for (from, to, at) in cases {
        let text = CASCADE.replace(from, to);
        let e = Ruleset::parse(&text, FileFormat::Toml, &models()).expect_err(to);
        assert!(e.to_string().contains(at), "{to}: {e}");
    }
    // The earlier model must come first in [[inference.models]].
    let swapped = CASCADE
        .replace("after = \"profanity\"", "after = \"minilm\"")
        .replace("cascade.minilm", "cascade.profanity")
        .replace("label = \"is_offensive\"", "label = \"Toxic\"");
    let e = Ruleset::parse(&swapped, FileFormat::Toml, &models()).unwrap_err();
    assert!(e.to_string().contains("must run before profanity"), "{e}");
}

mod index {
    use super::*;
    use proptest::prelude::*;

    fn rule(i: usize, when: Match) -> Rule {
        Rule {
            id: format!("r{i}"),
            when,
            judges: Vec::new(),
            human_review: false,
            routes: Vec::new(),
            cascade: Vec::new(),
            lists: None,
        }
    }

    fn event(tenant: Option<u8>, lang: Option<u8>) -> Event {
        Event {
            event_id: "e".into(),
            text: "t".into(),
            user_id: None,
            lang: lang.map(|l| format!("l{l}")),
            created_at_ms: None,
            priority: Priority::Normal,
            metadata: None,
            tenant: tenant.map(|t| format!("t{t}")),
            warnings: Vec::new(),
        }
    }

    /// A condition on up to two of tenant (one or two values, maybe twice)
    /// and lang, over a few values so that rules overlap.
    fn condition() -> impl Strategy<Value = Match> {
        let values = proptest::collection::vec(0u8..6, 1..3);
        let field = prop_oneof![Just(Field::Tenant), Just(Field::Lang)];
        proptest::collection::vec((field, values), 0..3).prop_map(|fields| Match {
            fields: (fields.into_iter())
                .map(|(f, vs)| {
                    let prefix = if f == Field::Tenant { "t" } else { "l" };
                    (f, vs.iter().map(|v| format!("{prefix}{v}")).collect())
                })
                .collect(),
        })
    }

    proptest! {
        /// The index decides as trying every rule in order would.
        #[test]
        fn the_tenant_index_picks_the_rule_a_scan_of_every_rule_picks(
            whens in proptest::collection::vec(condition(), 0..12),
            events in proptest::collection::vec(
                (proptest::option::of(0u8..7), proptest::option::of(0u8..7)), 1..40),
        ) {
            let mut rules: Vec<Rule> = whens.into_iter().enumerate().map(|(i, w)| rule(i, w)).collect();
            rules.push(rule(rules.len(), Match::default()));
            let set = Ruleset::new("v".into(), rules.clone());
            for (tenant, lang) in events {
                let e = event(tenant, lang);
                let scanned = rules.iter().position(|r| r.when.matches("posts", &e)).unwrap();
                prop_assert_eq!(set.rule_for("posts", &e), RuleId(scanned), "{:?}", e.tenant);
            }
        }
    }

    #[test]
    fn a_thousand_tenants_each_find_their_own_rule() {
        let mut rules: Vec<Rule> = (0..1000)
            .map(|i| {
                let when = Match {
                    fields: vec![(Field::Tenant, vec![format!("t{i}")])],
                };
                rule(i, when)
            })
            .collect();
        rules.push(rule(1000, Match::default()));
        let set = Ruleset::new("v".into(), rules);
        let of = |tenant: &str| {
            let mut e = event(None, None);
            e.tenant = Some(tenant.to_string());
            set.rule_for("posts", &e)
        };
        assert_eq!(of("t0"), RuleId(0));
        assert_eq!(of("t999"), RuleId(999));
        assert_eq!(of("someone-else"), RuleId(1000));
        assert_eq!(set.rule_for("posts", &event(None, None)), RuleId(1000));
    }
}

#[test]
fn state_rules_are_read_and_a_wrong_one_refuses_the_file() {
    let base = "version = \"v\"\n[[rules]]\nid = \"default\"\nmodels.profanity.is_offensive = { review_at = 0.5, block_at = 0.9 }\n";
    let good = format!(
        "{base}[[state_rules]]\nid = \"fast\"\nwhen = {{ tenant = \"kids\" }}\nif = \"user.posts_1m > 5 and user.blocks_24h >= 1\"\nraise = \"block\"\nlabel = \"velocity\"\n"
    );
    let rules = Ruleset::parse(&good, FileFormat::Toml, &models()).unwrap();
    let rule = &rules.state_rules()[0];
    assert_eq!(
        (rule.id.as_str(), rule.raise, rule.conditions.len()),
        ("fast", Verdict::Block, 2)
    );
    assert_eq!(rule.label.as_deref(), Some("velocity"));
    for (bad, at) in [
        (
            "if = \"user.posts_1m > 5\"\nraise = \"allow\"",
            "state_rules[0] (\"x\").raise",
        ),
        (
            "if = \"user.likes_1m > 5\"\nraise = \"review\"",
            "state_rules[0] (\"x\").if",
        ),
        (
            "if = \"user.posts_1m > 5\"\nraise = \"review\"\nwhen = { colour = \"red\" }",
            "state_rules[0] (\"x\").when.colour",
        ),
        // A label no model has would never count: refused, not silent.
        (
            "if = \"user.offensive_over_0.8_1h > 2\"\nraise = \"review\"",
            "state_rules[0] (\"x\").if",
        ),
    ] {
        let text = format!("{base}[[state_rules]]\nid = \"x\"\n{bad}\n");
        let e = Ruleset::parse(&text, FileFormat::Toml, &models()).unwrap_err();
        assert_eq!(e.at, at, "{e}");
    }
    // A label of either model counts.
    let scored = format!(
        "{base}[[state_rules]]\nid = \"toxic\"\nif = \"user.Toxic_over_0.7_1h >= 2 and user.is_offensive_over_0.9_10m >= 1\"\nraise = \"review\"\n"
    );
    let rules = Ruleset::parse(&scored, FileFormat::Toml, &models()).unwrap();
    assert_eq!(rules.state_tracked().scores.len(), 2);
}
