//! The job format's unit tests: defaults, fields, limits, round trips, refusals.

use super::*;

#[test]
fn edge_cases_of_the_wire_format_are_settled() {
    let id = "6f1c1b5e-2f7a-4b8e-9a43-0c1d2e3f4a5b";
    // Integral numbers are priorities whatever their JSON spelling; fractions are not.
    assert_eq!(parse(&format!(r#"{{"job_id":"{id}","text":"a","priority":5.0}}"#)).unwrap().priority, 5);
    assert!(parse(&format!(r#"{{"job_id":"{id}","text":"a","priority":5.5}}"#)).is_err());
    // A UTF-8 byte-order mark before the JSON is ignored.
    assert!(parse(&format!("\u{feff}{{\"job_id\":\"{id}\",\"text\":\"a\"}}")).is_ok());
    // Nothing to speak: whitespace, NEL, zero-width spaces and BOMs alike.
    for blank in ["\\u0085", "\\u200b\\ufeff", " \\u2060 "] {
        let e = parse(&format!(r#"{{"job_id":"{id}","text":"{blank}"}}"#)).unwrap_err();
        assert_eq!(e.kind, RejectionKind::EmptyText, "{blank}");
    }
    // UUIDs in other spellings are accepted and normalised.
    for spelling in [id.to_uppercase(), format!("{{{id}}}"), format!("urn:uuid:{id}"), id.replace('-', "")] {
        let job = parse(&format!(r#"{{"job_id":"{spelling}","text":"a"}}"#)).unwrap();
        assert_eq!(job.job_id.to_string(), id, "{spelling}");
    }
}

#[test]
fn text_quoted_in_reasons_has_its_control_characters_escaped() {
    let r = truncate("evil\u{1b}[2J\nINFO forged", 64);
    assert!(!r.chars().any(char::is_control), "{r:?}");
    assert!(r.contains("\\u{1b}") && r.contains("\\n"), "{r}");
    assert_eq!(truncate("abcdef", 3), "abc…");
}

const ID: &str = "6f1c1b5e-2f7a-4b8e-9a43-0c1d2e3f4a5b";

fn parse(body: &str) -> Result<Job, Rejection> {
    parse_job(body.as_bytes(), &Limits::default(), true)
}

fn kind(body: &str) -> RejectionKind {
    parse(body).unwrap_err().kind
}

#[test]
fn a_minimal_job_gets_the_documented_defaults() {
    let j = parse(&format!(r#"{{"job_id":"{ID}","text":"Hello"}}"#)).unwrap();
    assert_eq!(j.job_id.to_string(), ID);
    assert_eq!((j.voice.as_str(), j.campaign.as_str(), j.priority), ("default", "default", 0));
    assert!(j.metadata.is_none());
}

#[test]
fn all_fields_are_read() {
    let j = parse(&format!(
        r#"{{"job_id":"{ID}","text":"你好","voice":"narrator","campaign":"book-1","priority":7,"metadata":{{"chapter":3}}}}"#
    ))
    .unwrap();
    assert_eq!(j.text, "你好");
    assert_eq!(j.chars(), 2);
    assert_eq!((j.voice.as_str(), j.campaign.as_str(), j.priority), ("narrator", "book-1", 7));
    assert_eq!(j.metadata.unwrap()["chapter"], 3);
}

#[test]
fn poison_messages_are_rejected_with_their_reason() {
    assert!(matches!(kind("not json"), RejectionKind::NotJson(_)));
    assert_eq!(kind("[1,2]"), RejectionKind::NotObject);
    assert_eq!(kind(r#"{"text":"x"}"#), RejectionKind::MissingJobId);
    assert!(matches!(kind(r#"{"job_id":"nope","text":"x"}"#), RejectionKind::InvalidJobId(_)));
    assert!(matches!(kind(r#"{"job_id":7,"text":"x"}"#), RejectionKind::InvalidJobId(_)));
    assert_eq!(kind(&format!(r#"{{"job_id":"{ID}"}}"#)), RejectionKind::MissingText);
    assert_eq!(kind(&format!(r#"{{"job_id":"{ID}","text":""}}"#)), RejectionKind::EmptyText);
    assert_eq!(kind(&format!(r#"{{"job_id":"{ID}","text":" \n\t "}}"#)), RejectionKind::EmptyText);
    assert_eq!(kind(&format!(r#"{{"job_id":"{ID}","text":42}}"#)), RejectionKind::TextNotString);
    assert_eq!(kind(&format!(r#"{{"job_id":"{ID}","text":"a\u0000b"}}"#)), RejectionKind::NulInText { at: 1 });
    assert!(matches!(kind(&format!(r#"{{"job_id":"{ID}","text":"x","priority":10}}"#)), RejectionKind::InvalidField { field: "priority", .. }));
    assert!(matches!(kind(&format!(r#"{{"job_id":"{ID}","text":"x","campaign":"a/b"}}"#)), RejectionKind::InvalidField { field: "campaign", .. }));
    assert!(matches!(kind(&format!(r#"{{"job_id":"{ID}","text":"x","metadata":[1]}}"#)), RejectionKind::InvalidField { field: "metadata", .. }));
    let r = parse(&format!(r#"{{"job_id":"{ID}","text":""}}"#)).unwrap_err();
    assert_eq!(r.job_id.unwrap().to_string(), ID, "the id is kept for the rejected row");
}

#[test]
fn invalid_utf8_and_oversized_messages_are_rejected_before_parsing() {
    let r = parse_job(b"{\"text\":\"\xff\"}", &Limits::default(), true).unwrap_err();
    assert_eq!(r.kind, RejectionKind::NotUtf8 { at: 9 });
    let limits = Limits { max_text_chars: 5, max_message_bytes: 40, ..Limits::default() };
    let big = format!(r#"{{"job_id":"{ID}","text":"hello"}}"#);
    assert!(matches!(parse_job(big.as_bytes(), &limits, true).unwrap_err().kind, RejectionKind::TooLarge { .. }));
    let limits = Limits { max_text_chars: 5, max_message_bytes: 1000, ..Limits::default() };
    let long = format!(r#"{{"job_id":"{ID}","text":"héllo!"}}"#);
    assert_eq!(
        parse_job(long.as_bytes(), &limits, true).unwrap_err().kind,
        RejectionKind::TextTooLong { chars: 6, limit: 5 }
    );
}

#[test]
fn mode_and_instruction_are_read_and_contradictions_rejected() {
    let j = parse(&format!(r#"{{"job_id":"{ID}","text":"x","mode":"cross_lingual"}}"#)).unwrap();
    assert_eq!((j.mode, j.instruction), (Some(Mode::CrossLingual), None));
    let j = parse(&format!(r#"{{"job_id":"{ID}","text":"x","instruction":"用开心的语气说"}}"#)).unwrap();
    assert_eq!(j.mode, Some(Mode::Instruct), "an instruction alone means instruct");
    let back = parse_job(&j.to_json(), &Limits::default(), true).unwrap();
    assert_eq!(back, j, "the published body keeps both");
    for (body, says) in [
        (r#""mode":"shout""#, "must be"),
        (r#""mode":"instruct""#, "needs an instruction"),
        (r#""mode":"zero_shot","instruction":"slowly""#, "only in mode instruct"),
        (r#""instruction":"  ""#, "is empty"),
        (r#""instruction":7"#, "must be a string"),
    ] {
        let e = parse(&format!(r#"{{"job_id":"{ID}","text":"x",{body}}}"#)).unwrap_err();
        assert!(matches!(e.kind, RejectionKind::InvalidField { .. }) && e.to_string().contains(says), "{body}: {e}");
    }
}

#[test]
fn speed_is_read_within_its_range_and_anything_else_rejected() {
    let j = parse(&format!(r#"{{"job_id":"{ID}","text":"x","speed":1.25}}"#)).unwrap();
    assert_eq!(j.speed, Some(1.25));
    assert_eq!(parse_job(&j.to_json(), &Limits::default(), true).unwrap(), j, "round trip");
    assert_eq!(parse(&format!(r#"{{"job_id":"{ID}","text":"x"}}"#)).unwrap().speed, None);
    assert_eq!(parse(&format!(r#"{{"job_id":"{ID}","text":"x","speed":2}}"#)).unwrap().speed, Some(2.0), "an integer is a number");
    for (body, says) in [(r#""speed":0.49"#, "outside 0.5-2"), (r#""speed":3"#, "outside"), (r#""speed":-1"#, "outside"), (r#""speed":"fast""#, "must be a number")] {
        let e = parse(&format!(r#"{{"job_id":"{ID}","text":"x",{body}}}"#)).unwrap_err();
        assert!(matches!(e.kind, RejectionKind::InvalidField { field: "speed", .. }) && e.to_string().contains(says), "{body}: {e}");
    }
}

#[test]
fn speech_tokens_are_read_and_bad_ones_rejected() {
    let j = parse(&format!(r#"{{"job_id":"{ID}","speech_tokens":[0,5,6560]}}"#)).unwrap();
    assert_eq!(j.speech_tokens.as_deref(), Some(&[0, 5, 6560][..]));
    assert_eq!(j.text, "", "text is optional beside speech tokens");
    let back = parse_job(&j.to_json(), &Limits::default(), true).unwrap();
    assert_eq!(back, j);
    for bad in [r#""1 2""#, "[]", "[1,-1]", "[1.5]", r#"[1,"2"]"#, "[4294967296]"] {
        let k = kind(&format!(r#"{{"job_id":"{ID}","speech_tokens":{bad}}}"#));
        assert!(matches!(k, RejectionKind::InvalidSpeechTokens(_)), "{bad}: {k:?}");
        assert_eq!(k.code(), "invalid_speech_tokens");
    }
    let limits = Limits { max_speech_tokens: 2, ..Limits::default() };
    let body = format!(r#"{{"job_id":"{ID}","speech_tokens":[1,2,3]}}"#);
    assert!(matches!(parse_job(body.as_bytes(), &limits, true).unwrap_err().kind, RejectionKind::InvalidSpeechTokens(_)));
}

#[test]
fn enqueue_generates_missing_ids_and_round_trips() {
    let j = parse_job(br#"{"text":"hi"}"#, &Limits::default(), false).unwrap();
    let back = parse_job(&j.to_json(), &Limits::default(), true).unwrap();
    assert_eq!(j, back);
}
