use super::*;
use crate::config::ListFile;
use crate::policy::Verdict;
use crate::tp::{Source, Tp};

fn list_file(dir: &std::path::Path, name: &str, items: &[(&str, &str, &str)]) -> ListFile {
    let path = dir.join(format!("{name}.jsonl"));
    let lines: Vec<String> = items
        .iter()
        .map(|(id, verdict, text)| {
            serde_json::json!({"id": id, "verdict": verdict, "label": "spam", "text": text})
                .to_string()
        })
        .collect();
    std::fs::write(&path, lines.join("\n")).unwrap();
    ListFile {
        name: name.into(),
        file: path,
        mode: ListMode::Decide,
    }
}

fn inspect(m: &mut Matcher, text: &str) -> Option<ListMatch> {
    let source = Source {
        tp: Tp::new("posts", 0),
        offset: 0,
    };
    let post = Post {
        event_id: "e",
        text,
        user: None,
        source: &source,
        rule_lists: None,
    };
    m.inspect(&post, Instant::now())
        .marks
        .and_then(|m| m.matched)
}

/// An annotating list that matches first does not stop a deciding list
/// from deciding; two deciding lists give the stricter verdict.
#[test]
fn a_deciding_list_is_consulted_whatever_annotates_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let text = "win a free phone today click the link in my bio";
    let mut notes = list_file(dir.path(), "notes", &[("n1", "block", text)]);
    notes.mode = ListMode::Annotate;
    let review = list_file(dir.path(), "review", &[("r1", "review", text)]);
    let block = list_file(dir.path(), "block", &[("b1", "block", text)]);
    let mut m = Matcher::new(&MatchingSettings {
        lists: vec![notes.clone(), review.clone()],
        ..MatchingSettings::default()
    })
    .unwrap();
    let found = inspect(&mut m, text).unwrap();
    assert_eq!(
        (&*found.list, found.decides, found.verdict),
        ("review", true, Verdict::Review)
    );
    let mut m = Matcher::new(&MatchingSettings {
        lists: vec![notes.clone(), review, block],
        ..MatchingSettings::default()
    })
    .unwrap();
    assert_eq!(
        &*inspect(&mut m, text).unwrap().id,
        "b1",
        "the stricter deciding list"
    );
    // Only annotating lists: the match marks the reason and decides nothing.
    let mut m = Matcher::new(&MatchingSettings {
        lists: vec![notes],
        ..MatchingSettings::default()
    })
    .unwrap();
    assert!(!inspect(&mut m, text).unwrap().decides);
}

/// The lists are charged against `matching.max_bytes`: a file past it
/// fails the start naming the key, a topic item past it is refused and the
/// lists in force stay.
#[test]
fn lists_past_the_byte_budget_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let items: Vec<(String, String)> = (0..3000)
        .map(|i| {
            (
                format!("i{i}"),
                format!("buy cheap item number {i} at our shop today"),
            )
        })
        .collect();
    let refs: Vec<(&str, &str, &str)> = items
        .iter()
        .map(|(id, t)| (id.as_str(), "block", t.as_str()))
        .collect();
    let big = list_file(dir.path(), "big", &refs);
    let budget = 1024 * 1024;
    let e = Matcher::new(&MatchingSettings {
        lists: vec![big],
        max_bytes: budget,
        ..MatchingSettings::default()
    })
    .err()
    .expect("3,000 near items pass 1 MiB");
    assert!(e.to_string().contains("matching.max_bytes"), "{e}");
    let mut m = Matcher::new(&MatchingSettings {
        list_topic: Some("lists".into()),
        max_bytes: budget,
        ..MatchingSettings::default()
    })
    .unwrap();
    let mut refused = 0;
    for (id, text) in &items {
        let json =
            serde_json::json!({"verdict": "block", "label": "spam", "text": text}).to_string();
        let item = Item::parse(json.as_bytes(), Some(id), &Fingerprinter).unwrap();
        let before = m.bytes();
        m.apply(Update::TopicItem(item));
        refused += usize::from(m.bytes() == before);
        assert!(m.bytes() <= budget);
    }
    assert!(refused > 0 && refused < items.len(), "{refused} refused");
    assert!(
        inspect(&mut m, &items[0].1).is_some(),
        "the first items stay in force"
    );
}
