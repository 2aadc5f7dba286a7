use super::*;
use crate::config::Settings;

fn decoder(input: &str) -> Decoder {
    let s = Settings::from_toml(&format!(
        "[kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n[input]\n{input}"
    ))
    .unwrap();
    Decoder::new(&s.input, &s.limits)
}

fn decode(
    d: &Decoder,
    topic: &str,
    payload: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
) -> Result<Event, Rejection> {
    let headers: Vec<(String, Option<Vec<u8>>)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), Some(v.as_bytes().to_vec())))
        .collect();
    d.decode(
        topic,
        RecordParts {
            key: key.map(str::as_bytes),
            payload: Some(payload.as_bytes()),
            headers: &headers,
        },
    )
}

const FEED: &str = r#"
    topics = ["posts", "comments"]
    [input.mapping]
    id = "/post/id"
    text = ["/post/title", "/post/body"]
    text_separator = " | "
    tenant = "/community/name"
    created_at = "/post/created_utc"
    user_id = "key"
    lang = "header:lang"
    [[input.mappings]]
    topics = ["comments"]
    id = "ce:id"
    text = "/body"
    created_at = "ce:time"
"#;

#[test]
fn a_nested_post_is_read_by_its_mapping() {
    let d = decoder(FEED);
    let e = decode(
        &d,
        "posts",
        r#"{"post": {"id": "p1", "title": "Hello", "body": "world", "created_utc": 1796099449.85},
            "community": {"name": "kids"}}"#,
        Some("u7"),
        &[("lang", "en")],
    )
    .unwrap();
    assert_eq!(e.event_id, "p1");
    assert_eq!(e.text, "Hello | world");
    assert_eq!(e.tenant.as_deref(), Some("kids"));
    assert_eq!(e.created_at_ms, Some(1_796_099_449_850));
    assert_eq!(
        (e.user_id.as_deref(), e.lang.as_deref()),
        (Some("u7"), Some("en"))
    );
    assert!(e.warnings.is_empty(), "{:?}", e.warnings);
    // A title alone is enough.
    let e = decode(
        &d,
        "posts",
        r#"{"post": {"id": "p2", "title": "Hi"}}"#,
        None,
        &[],
    )
    .unwrap();
    assert_eq!(e.text, "Hi");
}

#[test]
fn a_missing_or_wrong_typed_required_field_names_its_pointer() {
    let d = decoder(FEED);
    let no_id = decode(&d, "posts", r#"{"post": {"title": "t"}}"#, None, &[]).unwrap_err();
    assert_eq!(no_id.reason, RejectReason::MissingEventId);
    assert!(no_id.message.contains("/post/id"), "{}", no_id.message);
    let bad_body = decode(
        &d,
        "posts",
        r#"{"post": {"id": "p", "body": 5}}"#,
        None,
        &[],
    )
    .unwrap_err();
    assert_eq!(bad_body.reason, RejectReason::WrongType);
    assert!(
        bad_body.message.contains("/post/body"),
        "{}",
        bad_body.message
    );
    let no_text = decode(&d, "posts", r#"{"post": {"id": "p"}}"#, None, &[]).unwrap_err();
    assert_eq!(no_text.reason, RejectReason::MissingText);
    assert!(
        no_text.message.contains("/post/title, /post/body"),
        "{}",
        no_text.message
    );
}

#[test]
fn cloudevents_in_binary_and_structured_mode_map_their_attributes() {
    let d = decoder(FEED);
    let binary = decode(
        &d,
        "comments",
        r#"{"body": "nice"}"#,
        None,
        &[
            ("ce_specversion", "1.0"),
            ("ce_id", "c-1"),
            ("ce_source", "/feed"),
            ("ce_type", "comment.created"),
            ("ce_time", "2026-11-29T10:00:00Z"),
        ],
    )
    .unwrap();
    assert_eq!(
        (binary.event_id.as_str(), binary.text.as_str()),
        ("c-1", "nice")
    );
    assert_eq!(binary.created_at_ms, Some(1_795_946_400_000));
    let structured = decode(
        &d,
        "comments",
        r#"{"specversion": "1.0", "id": "c-2", "source": "/feed", "type": "comment.created",
            "time": "2026-11-29T10:00:00Z", "data": {"body": "hm"}}"#,
        None,
        &[("content-type", "application/cloudevents+json")],
    )
    .unwrap();
    assert_eq!(
        (structured.event_id.as_str(), structured.text.as_str()),
        ("c-2", "hm")
    );
    // Not a CloudEvent: no attributes, so no id.
    let plain = decode(&d, "comments", r#"{"body": "x"}"#, None, &[]).unwrap_err();
    assert_eq!(plain.reason, RejectReason::MissingEventId);
    assert!(plain.message.contains("ce:id"), "{}", plain.message);
}

#[test]
fn a_compiled_pointer_reads_what_serde_json_pointer_reads() {
    let v: Value = serde_json::from_str(
        r#"{"a": {"b/c": [10, {"d~e": "x"}], "": 1, "0": "zero"}, "list": [1, 2, 3]}"#,
    )
    .unwrap();
    for p in [
        "/a",
        "/a/b~1c",
        "/a/b~1c/0",
        "/a/b~1c/1/d~0e",
        "/a/b~1c/01",
        "/a/b~1c/+1",
        "/a/b~1c/-1",
        "/a/b~1c/",
        "/a/",
        "/a/0",
        "/list/2",
        "/list/3",
        "/missing",
        "/a/b~1c/0/deeper",
        "/list/1e0",
    ] {
        let compiled = Source::new(FieldSource::Pointer(p.to_string()));
        assert_eq!(lookup(&v, &compiled.tokens), v.pointer(p), "{p}");
    }
}

/// The same decoder with every value copied out of the tree, none moved.
fn copying(mut d: Decoder) -> Decoder {
    for c in std::iter::once(&mut d.default).chain(d.by_topic.values_mut()) {
        c.sources_mut().for_each(|s| s.exclusive = false);
    }
    d
}

#[test]
fn only_a_pointer_nothing_else_lies_along_is_moved() {
    let d = decoder(
        "topics = [\"posts\"]\n[input.mapping]\nid = \"/id\"\ntext = [\"/a/t\", \"/b\"]\nuser_id = \"/a\"\ntenant = \"/b\"\nlang = \"key\"\nmetadata = \"/m\"",
    );
    let exclusive: Vec<(String, bool)> = (d.default.clone().sources_mut())
        .map(|s| (s.name.clone(), s.exclusive))
        .collect();
    let of = |name: &str| exclusive.iter().filter(|(n, _)| n == name).all(|(_, e)| *e);
    // Moving /a would take /a/t with it; /b is read twice; a key is no pointer.
    assert!(of("/id") && of("/m"), "{exclusive:?}");
    assert!(
        !of("/a") && !of("/a/t") && !of("/b") && !of("key"),
        "{exclusive:?}"
    );
}

fn json() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (0i64..2_000_000_000_000).prop_map(Value::from),
        prop::sample::select(vec!["", "x", "hello", "urgent", "en", "u1"]).prop_map(Value::from),
    ];
    let keys = prop::sample::select(vec!["a", "b", "0", "id", "t", "u", "m"]);
    leaf.prop_recursive(3, 24, 4, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::vec((keys.clone(), inner), 0..5).prop_map(|kv| Value::Object(
                kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
            )),
        ]
    })
}

/// The decoder of a generated mapping of topic "posts": `fields` are the
/// sources of the id, the text (two joined, or the first alone), then the
/// optional fields in order; settings that refuse it reject the case.
fn mapped_by(
    fields: &[&str],
    joined: bool,
) -> Result<Decoder, proptest::test_runner::TestCaseError> {
    let text = match joined {
        true => format!("[\"{}\", \"{}\"]", fields[1], fields[2]),
        false => format!("\"{}\"", fields[1]),
    };
    let names = [
        "user_id",
        "lang",
        "created_at",
        "priority",
        "tenant",
        "metadata",
    ];
    let optional: String = (names.iter().zip(&fields[3..]))
        .map(|(n, f)| format!("{n} = \"{f}\"\n"))
        .collect();
    let input = format!(
        "topics = [\"posts\"]\n[input.mapping]\nid = \"{}\"\ntext = {text}\n{optional}",
        fields[0]
    );
    let s = Settings::from_toml(&format!(
        "[kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n[input]\n{input}"
    ))
    .map_err(|_| proptest::test_runner::TestCaseError::reject("settings refused"))?;
    Ok(Decoder::new(&s.input, &s.limits))
}

proptest::proptest! {
    /// Moving values out decides exactly as copying them, whatever the
    /// mapping's pointers share and whatever the record holds there.
    #[test]
    fn moving_values_out_decodes_as_copying_them(
        fields in proptest::collection::vec(
            proptest::sample::select(vec!["/id", "/a", "/a/t", "/a/0", "/b", "/t", "/u", "/m", "key"]),
            9,
        ),
        joined in proptest::bool::ANY,
        top in proptest::collection::vec(
            (proptest::sample::select(vec!["id", "a", "b", "t", "u", "m"]), json()),
            0..3,
        ),
    ) {
        let moving = mapped_by(&fields, joined)?;
        let copying = copying(moving.clone());
        // Mostly a post that decodes, some of its fields replaced.
        let mut post = serde_json::json!({"id": "e1", "t": "hello", "a": {"t": "x", "0": "y"}, "u": "u1"});
        for (k, v) in top {
            post[k] = v;
        }
        let payload = post.to_string();
        proptest::prop_assert_eq!(
            decode(&moving, "posts", &payload, Some("k1"), &[]),
            decode(&copying, "posts", &payload, Some("k1"), &[])
        );
    }
}

/// The whole-tree decode: the record's value parsed into a `Value` first,
/// every pointer read inside it.
fn decode_whole(d: &Decoder, topic: &str, payload: &str) -> Result<Event, Rejection> {
    let record = RecordParts {
        key: Some(b"k1"),
        payload: Some(payload.as_bytes()),
        headers: &[],
    };
    d.decode_with(topic, record, parse_json)
}

#[test]
fn a_member_no_pointer_reads_is_checked_but_not_kept() {
    let d = Decoder::plain(&Limits::default());
    let depth = 100_000;
    let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    // Skipped without recursion: no overflow, and the event is read.
    let e = decode(
        &d,
        "",
        &format!(r#"{{"event_id":"e","junk":{deep},"text":"t"}}"#),
        None,
        &[],
    )
    .unwrap();
    assert_eq!((e.event_id.as_str(), e.text.as_str()), ("e", "t"));
    // Kept, it is nesting past serde's limit: rejected as before.
    let kept = decode(
        &d,
        "",
        &format!(r#"{{"event_id":"e","text":"t","metadata":{{"a":{deep}}}}}"#),
        None,
        &[],
    );
    assert_eq!(kept.unwrap_err().reason, RejectReason::InvalidJson);
    // A skipped member is still JSON or the record is rejected.
    for bad in [
        r#"{"event_id":"e","junk":[1,,2],"text":"t"}"#,
        r#"{"event_id":"e","junk":"\q","text":"t"}"#,
        r#"{"event_id":"e","junk":{"a" 1},"text":"t"}"#,
        r#"{"event_id":"e","text":"t"} trailing"#,
    ] {
        let got = decode(&d, "", bad, None, &[]);
        assert_eq!(got.unwrap_err().reason, RejectReason::InvalidJson, "{bad}");
    }
}

/// JSON text with duplicate keys where it likes (a `Value` cannot hold
/// them): the records a spammer writes to make a reader see another member.
#[derive(Debug, Clone)]
enum Raw {
    Leaf(Value),
    List(Vec<Raw>),
    Members(Vec<(&'static str, Raw)>),
}

impl Raw {
    fn text(&self) -> String {
        match self {
            Raw::Leaf(v) => v.to_string(),
            Raw::List(items) => {
                let items: Vec<String> = items.iter().map(Raw::text).collect();
                format!("[{}]", items.join(","))
            }
            Raw::Members(members) => {
                let members: Vec<String> = (members.iter())
                    .map(|(k, v)| format!("{}:{}", Value::from(*k), v.text()))
                    .collect();
                format!("{{{}}}", members.join(","))
            }
        }
    }
}

fn raw() -> impl proptest::strategy::Strategy<Value = Raw> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-5i64..2_000_000_000_000).prop_map(Value::from),
        Just(Value::from(1.5)),
        prop::sample::select(vec!["", "x", "hello", "urgent", "en", "u1"]).prop_map(Value::from),
    ]
    .prop_map(Raw::Leaf);
    let keys = prop::sample::select(vec!["a", "b", "0", "id", "t", "u", "m", "x"]);
    leaf.prop_recursive(4, 32, 5, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Raw::List),
            prop::collection::vec((keys.clone(), inner), 0..6).prop_map(Raw::Members),
        ]
    })
}

proptest::proptest! {
    /// Keeping only what the pointers read decides exactly as the whole
    /// tree, whatever the mapping's pointers share and whatever the record
    /// holds there, duplicate keys at any depth included.
    #[test]
    fn only_the_read_parts_decode_as_the_whole_tree(
        fields in proptest::collection::vec(
            proptest::sample::select(vec!["/id", "/a", "/a/t", "/a/0", "/a/t/0", "/b", "/t", "/u", "/m", "/m/a/b", "key"]),
            9,
        ),
        joined in proptest::bool::ANY,
        members in proptest::collection::vec(
            (proptest::sample::select(vec!["id", "a", "b", "t", "u", "m", "x"]), raw()),
            0..4,
        ),
        first in proptest::bool::ANY,
    ) {
        let d = mapped_by(&fields, joined)?;
        // Mostly a post that decodes, the generated members before or
        // after its own (the last of a key wins).
        let post = [
            ("id", Raw::Leaf(Value::from("e1"))),
            ("t", Raw::Leaf(Value::from("hello"))),
            ("a", Raw::Members(vec![("t", Raw::Leaf(Value::from("x"))), ("0", Raw::Leaf(Value::from("y")))])),
            ("u", Raw::Leaf(Value::from("u1"))),
        ];
        let all: Vec<(&'static str, Raw)> = match first {
            true => members.into_iter().chain(post).collect(),
            false => post.into_iter().chain(members).collect(),
        };
        let payload = Raw::Members(all).text();
        proptest::prop_assert_eq!(
            decode(&d, "posts", &payload, Some("k1"), &[]),
            decode_whole(&d, "posts", &payload),
            "{}", payload
        );
    }
}
