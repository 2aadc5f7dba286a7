use super::*;
use crate::policy::Verdict;

fn item(json: &str) -> Item {
    Item::parse(json.as_bytes(), None, &Fingerprinter).unwrap()
}

fn list_of(items: &[&str]) -> List {
    let mut list = List::new("spam", ListMode::Decide, 0.7);
    for json in items {
        list.insert(item(json));
    }
    list
}

fn find(list: &List, text: &str) -> Option<Found> {
    list.find(&Fingerprinter.of_normalized(&normalize(text)))
}

/// Each evasion of a list entry matches it; benign near-misses do not.
#[test]
fn evasions_match_their_item_and_near_misses_do_not() {
    let list = list_of(&[
        r#"{"id": "s1", "verdict": "block", "label": "spam", "text": "win a free iphone now click the link in my bio"}"#,
        r#"{"id": "p1", "verdict": "review", "label": "profanity", "text": "fuck you"}"#,
    ]);
    let evasions = [
        ("win а free iphone now click the link in my bio", "s1"), // Cyrillic а
        (
            "ｗｉｎ ａ ｆｒｅｅ ｉｐｈｏｎｅ now click the link in my bio",
            "s1",
        ),
        (
            "win a fr\u{200d}ee iph\u{200b}one now click the link in my bio",
            "s1",
        ),
        ("WIN A FREE IPHONE NOW click the link in my bio", "s1"),
        (
            "win a free 🔥iphone🔥 now click the link in my bio 💰💰",
            "s1",
        ),
        (
            "win a freeeee iphoneee now!!! click the link in my bio",
            "s1",
        ),
        ("win a free iphone now click the link in my profile", "s1"), // one word changed: near
        ("f.u.c.k you", "p1"),
        ("F U C K you", "p1"),
        ("fuuuuck yoooou", "p1"),
    ];
    let mut missed = Vec::new();
    for (text, id) in evasions {
        match find(&list, text) {
            Some(f) if &*f.item.id == id => {}
            other => missed.push((text, other.map(|f| f.item.id.to_string()))),
        }
    }
    assert!(missed.is_empty(), "missed: {missed:?}");
    for benign in [
        "you are free to click the link if you like",
        "I won a free coffee today",
        "fun duck",
        "win a free iphone",
    ] {
        assert!(find(&list, benign).is_none(), "{benign:?} matched");
    }
    let exact = find(&list, "Win a free iPhone now, click the link in my bio!").unwrap();
    assert_eq!(exact.distance, 0.0);
    let near = find(&list, "win a free iphone now click the link in my profile").unwrap();
    assert!(
        near.distance > 0.0 && near.distance <= 0.3,
        "{}",
        near.distance
    );
}

#[test]
fn an_item_by_hash_matches_exactly_and_items_come_and_go() {
    let hash = format!(
        "{:016x}",
        super::super::normalize::text_hash(&normalize("Call me at 555 0100"))
    );
    let mut list = list_of(&[&format!(
        r#"{{"id": "d1", "verdict": "review", "label": "doxxing", "hash": "{hash}"}}"#
    )]);
    assert_eq!(&*find(&list, "CALL me at 555 0100!").unwrap().item.id, "d1");
    assert!(find(&list, "call me at 555 0101").is_none());
    list.insert(item(
        r#"{"id": "x", "verdict": "block", "label": "l", "text": "buy followers cheap today"}"#,
    ));
    assert_eq!(list.len(), 2);
    assert!(find(&list, "buy followers cheap today").is_some());
    assert!(list.remove("x"));
    assert!(find(&list, "buy followers cheap today").is_none());
    assert!(!list.remove("x"));
}

/// A text near two items of different verdicts takes the stricter; one
/// whose normal form two items share takes the stricter of those.
#[test]
fn a_text_matching_several_items_takes_the_strictest() {
    let list = list_of(&[
        r#"{"id": "r1", "verdict": "review", "label": "spam", "text": "win a free phone today click the link in my bio now"}"#,
        r#"{"id": "b1", "verdict": "block", "label": "spam", "text": "win a free phone today click the link in my profile now"}"#,
    ]);
    // Nearer to r1 (its exact text), near b1 too: block.
    let found = find(&list, "win a free phone today click the link in my bio now").unwrap();
    assert_eq!(
        (&*found.item.id, found.item.verdict),
        ("b1", Verdict::Block)
    );
    let list = list_of(&[
        r#"{"id": "r2", "verdict": "review", "label": "spam", "text": "buy cheap followers"}"#,
        r#"{"id": "b2", "verdict": "block", "label": "spam", "text": "BUY CHEAP FOLLOWERS!"}"#,
    ]);
    assert_eq!(&*find(&list, "buy cheap followers").unwrap().item.id, "b2");
}

/// Items of one normal form (the list topic allows them) are kept apart:
/// removing one leaves the other in force, in either order.
#[test]
fn items_of_one_normal_form_do_not_hide_each_other() {
    for removed in ["a", "b"] {
        let mut list = list_of(&[
            r#"{"id": "a", "verdict": "block", "label": "spam", "text": "buy cheap followers today"}"#,
            r#"{"id": "b", "verdict": "block", "label": "spam", "text": "Buy CHEAP followers today!!"}"#,
        ]);
        assert!(list.remove(removed));
        let kept = if removed == "a" { "b" } else { "a" };
        let found = find(&list, "buy cheap followers today").map(|f| f.item.id.to_string());
        assert_eq!(found.as_deref(), Some(kept), "removed {removed}");
        assert!(list.remove(kept));
        assert!(find(&list, "buy cheap followers today").is_none());
        assert_eq!(list.bytes(), 0, "every byte given back");
    }
}

#[test]
fn a_wrong_line_refuses_the_whole_file_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.jsonl");
    let good = r#"{"id": "a", "verdict": "block", "label": "spam", "text": "buy now"}"#;
    for (bad, says) in [
        (
            r#"{"id": "b", "verdict": "allow", "label": "x", "text": "t"}"#,
            "verdict \"allow\"",
        ),
        (
            r#"{"id": "b", "verdict": "block", "label": "x"}"#,
            "one of text or hash",
        ),
        (
            r#"{"id": "b", "verdict": "block", "label": "x", "hash": "12"}"#,
            "16 hex digits",
        ),
        (
            r#"{"id": "b", "verdict": "block", "label": "x", "text": "BUY NOW!"}"#,
            "same normalised text as item \"a\"",
        ),
        (
            r#"{"id": "b", "verdict": "block", "label": "x", "text": "🔥"}"#,
            "no words",
        ),
        (
            r#"{"verdict": "block", "label": "x", "text": "t"}"#,
            "no id",
        ),
        ("not json", "not an item"),
    ] {
        std::fs::write(&path, format!("# a comment\n{good}\n\n{bad}\n")).unwrap();
        let prints = Fingerprinter;
        let e = List::load("l", &path, ListMode::Decide, 0.8, &prints)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("line 4") && e.contains(says), "{e}");
    }
    std::fs::write(&path, format!("{good}\n")).unwrap();
    let list = List::load("l", &path, ListMode::Decide, 0.8, &Fingerprinter).unwrap();
    assert_eq!(list.len(), 1);
}

/// The false-match rate: the sample posts (and generated normal posts)
/// against a list of 1,000 spam items (none of them a sample post).
#[test]
fn sample_posts_do_not_match_a_list_of_a_thousand_items() {
    let list = thousand_items();
    assert_eq!(list.len(), 1000);
    let posts = crate::tools::generator::sample_posts();
    let matched: Vec<&str> = posts
        .iter()
        .map(|(_, t)| *t)
        .filter(|t| find(&list, t).is_some())
        .collect();
    assert!(
        matched.is_empty(),
        "{} of {} posts matched: {matched:?}",
        matched.len(),
        posts.len()
    );
    // And 20,000 posts of the generator's normal traffic (words of the
    // sample posts, 6 to 20 each).
    let campaign = crate::tools::campaign::Campaign {
        share: 0.0,
        ..Default::default()
    };
    let normal = crate::tools::campaign::generate_campaign(20_000, &campaign, "n-");
    let false_matches = normal
        .iter()
        .filter(|p| find(&list, p.event.text.as_deref().unwrap()).is_some())
        .count();
    eprintln!(
        "false matches: 0 of {} sample posts, {false_matches} of 20000 generated posts",
        posts.len()
    );
    assert_eq!(false_matches, 0);
}

/// The bench's list of 1,000 distinct spam items.
fn thousand_items() -> List {
    let mut list = List::new("spam", ListMode::Decide, 0.7);
    for line in crate::tools::campaign::known_bad_list(1000).lines() {
        list.insert(item(line));
    }
    list
}
