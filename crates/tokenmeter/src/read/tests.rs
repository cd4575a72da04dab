use super::*;

#[test]
fn framing_follows_content_type_then_path() {
    let f = |path, ct, pin| select(path, ct, pin).0;
    assert_eq!(
        f("/x", "text/event-stream; charset=utf-8", None),
        Framing::Sse
    );
    assert_eq!(f("/x", "Text/Event-Stream", None), Framing::Sse);
    assert_eq!(
        f("/api/chat", "application/x-ndjson", None),
        Framing::Ndjson
    );
    assert_eq!(
        f("/v1/chat/completions", "application/json", None),
        Framing::Json
    );
    // Plain JSON of an endpoint that is not inference is not buffered.
    assert_eq!(
        f("/v1/embeddings", "application/json", None),
        Framing::Opaque
    );
    assert_eq!(
        f("/v1/embeddings", "application/json", Some(Api::OpenAi)),
        Framing::Json
    );
    // No usable content type: the path's format decides how to read it, else nothing.
    assert_eq!(f("/api/generate", "", None), Framing::Ndjson);
    assert_eq!(f("/v1/messages", "text/plain", None), Framing::Sse);
    assert_eq!(f("/x", "text/plain", None), Framing::Opaque);
    assert_eq!(f("/x", "", Some(Api::Triton)), Framing::Sse);
}

#[test]
fn content_framing_ignores_case_and_parameters() {
    let cases = [
        ("text/event-stream", Some(Framing::Sse)),
        ("TEXT/EVENT-STREAM", Some(Framing::Sse)),
        (" text/event-stream ; charset=utf-8", Some(Framing::Sse)),
        ("text/event-streams", None),
        ("application/X-NDJSON", Some(Framing::Ndjson)),
        ("application/jsonl", Some(Framing::Ndjson)),
        ("application/json; charset=utf-8", Some(Framing::Json)),
        ("application/problem+JSON", Some(Framing::Json)),
        ("+json", Some(Framing::Json)),
        ("json", None),
        ("text/plain", None),
        ("", None),
    ];
    for (ct, want) in cases {
        assert_eq!(content_framing(ct), want, "{ct:?}");
    }
}

#[test]
fn pin_skips_detection() {
    let (_, x) = select(
        "/v1/chat/completions",
        "text/event-stream",
        Some(Api::Anthropic),
    );
    assert_eq!(x.api(), Api::Anthropic);
    let (_, x) = select("/v1/chat/completions", "text/event-stream", None);
    assert_eq!(
        x.api(),
        Api::OpenAi,
        "auto reports the path's format before any message"
    );
    let (_, x) = select("/x", "text/event-stream", None);
    assert_eq!(x.api(), Api::Unknown);
}

const CHUNK: &str = "data: {\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n";

/// Feeds `body` in the given pieces; returns the tokens of every event, the piece index at which
/// `ended` first held, and the finish's document tokens.
fn read(r: &mut Reader, pieces: &[&[u8]]) -> (Vec<u32>, Option<usize>, u32) {
    let mut tokens = Vec::new();
    let mut ended = None;
    for (i, p) in pieces.iter().enumerate() {
        let c = r.feed(p);
        tokens.extend(c.events.iter().map(|e| e.tokens));
        if c.ended && ended.is_none() {
            ended = Some(i);
        }
    }
    let c = r.finish(true);
    tokens.extend(c.events.iter().map(|e| e.tokens));
    (tokens, ended, c.document)
}

#[test]
fn a_chunk_lists_the_events_it_completed_whatever_the_split() {
    let body = format!("{CHUNK}{CHUNK}: keep-alive\n\ndata: [DONE]\n\n");
    for i in 0..=body.len() {
        let (a, b) = body.as_bytes().split_at(i);
        let mut r = Reader::new("/v1/chat/completions", "text/event-stream", None, 1 << 20);
        let (tokens, ended, document) = read(&mut r, &[a, b]);
        assert_eq!(tokens, [1, 1], "split at {i}");
        // `[DONE]` is whole only in the second piece unless the split is after it.
        let want = if i == body.len() { 0 } else { 1 };
        assert_eq!(ended, Some(want), "split at {i}");
        assert_eq!(document, 0);
        assert_eq!(r.counted(), 2);
        assert_eq!(r.api(), Api::OpenAi);
        assert_eq!(r.output(), (2, TokenSource::Counted));
    }
}

#[test]
fn one_piece_may_complete_several_events() {
    let mut r = Reader::new("/v1/chat/completions", "text/event-stream", None, 1 << 20);
    let three = CHUNK.repeat(3);
    let c = r.feed(three.as_bytes());
    assert_eq!(
        c.events,
        [Event {
            tokens: 1,
            kinds: Kinds::CONTENT
        }; 3]
    );
    assert!(!c.ended);
    // The list is of the latest piece only.
    assert_eq!(r.feed(b"data: [DONE]\n\n").events, []);
}

#[test]
fn a_json_document_is_read_once_at_the_end_and_has_no_events() {
    let json = r#"{"model":"m","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":9,"completion_tokens":3}}"#;
    let mut r = Reader::new("/v1/chat/completions", "application/json", None, 1 << 20);
    let (a, b) = json.as_bytes().split_at(10);
    assert_eq!(r.feed(a).events, []);
    assert_eq!(r.feed(b).events, []);
    let c = r.finish(true);
    assert_eq!((c.events, c.document), (&[][..], 3));
    assert_eq!(r.output(), (3, TokenSource::Usage));
    assert_eq!(r.summary().input_tokens, Some(9));

    // Cut short: not parsed, and not an error.
    let mut r = Reader::new("/v1/chat/completions", "application/json", None, 1 << 20);
    r.feed(a);
    assert_eq!(r.finish(false).document, 0);
    assert_eq!((r.summary().malformed, r.errors().line_too_long), (0, 0));

    // Over the limit: dropped and counted once.
    let mut r = Reader::new("/v1/chat/completions", "application/json", None, 16);
    r.feed(a);
    r.feed(b);
    assert_eq!(r.finish(true).document, 0);
    assert_eq!(r.errors().line_too_long, 1);
}

#[test]
fn a_body_cut_mid_line_leaves_no_event_and_no_error() {
    let mut r = Reader::new("/api/chat", "application/x-ndjson", None, 1 << 20);
    let line = r#"{"model":"m","message":{"content":"a"},"done":false}"#;
    assert_eq!(r.feed(format!("{line}\n").as_bytes()).events.len(), 1);
    r.feed(&line.as_bytes()[..20]);
    assert_eq!(r.finish(false).events, []);
    assert_eq!(r.summary().malformed, 0);

    // The same last line, complete but without its newline, is an event at the finish.
    let mut r = Reader::new("/api/chat", "application/x-ndjson", None, 1 << 20);
    r.feed(line.as_bytes());
    assert_eq!(
        r.finish(true).events,
        [Event {
            tokens: 1,
            kinds: Kinds::CONTENT
        }]
    );
}

#[test]
fn an_opaque_reader_reports_nothing() {
    let mut r = Reader::opaque();
    let c = r.feed(CHUNK.as_bytes());
    assert_eq!((c.events, c.ended), (&[][..], false));
    assert_eq!(r.api(), Api::Unknown);
    let mut r = Reader::new("/x", "text/plain", None, 1 << 20);
    assert_eq!(r.feed(CHUNK.as_bytes()).events, []);
    assert_eq!(r.api(), Api::Unknown);
}
