//! The what-if's search on engines and traces whose answer is known in closed form or by
//! construction.

use std::io;

use super::*;

/// A trace of `n` requests `gap_ms` apart, each `prompt` and `output` tokens, with `extra`
/// keys (JSON, with its leading comma) on every line.
fn lines(n: usize, gap_ms: u64, prompt: u32, output: u32, extra: &str) -> String {
    (0..n as u64)
        .map(|i| {
            format!(
                "{{\"timestamp\": {}, \"input_length\": {prompt}, \"output_length\": {output}{extra}}}\n",
                i * gap_ms
            )
        })
        .collect()
}

fn read(text: &str) -> Result<Trace, TraceError> {
    let path = Path::new("t.jsonl");
    let reader = TraceReader::new(path, io::Cursor::new(text.to_owned()), None);
    Trace::from_reader(path, reader, DEFAULT_BLOCK_TOKENS)
}

fn trace(text: &str) -> Trace {
    read(text).expect("a good trace")
}

/// Prompts cost 0.2 ms a token: a 2,000-token prompt's step is 10 + 0.2 + 400 ms.
const PREFILL_BOUND: Engine = Engine {
    base: 0.010,
    per_seq: 0.0002,
    prefill_per_token: 0.0002,
    context: None,
    memory: Memory {
        kv_cache_tokens: None,
        block_size: 16,
        max_num_seqs: None,
    },
};

/// Steps grow by 1 ms a sequence; prompts cost next to nothing.
const DECODE_BOUND: Engine = Engine {
    base: 0.010,
    per_seq: 0.001,
    prefill_per_token: 0.000_001,
    context: None,
    memory: Memory {
        kv_cache_tokens: None,
        block_size: 16,
        max_num_seqs: None,
    },
};

fn class(name: &str, ttft: Option<f64>, tps: Option<f64>, objective: f64) -> ClassTargets {
    ClassTargets {
        name: name.into(),
        tps_floor: tps,
        ttft,
        objective,
    }
}

fn edge(a: &ClassAnswer) -> f64 {
    match a.multiple {
        Some(Multiple::Edge(m)) => m,
        other => panic!("not an edge: {other:?} in {a:?}"),
    }
}

#[test]
fn a_prompt_bound_class_holds_until_the_prefills_meet() {
    // One request a second, each a 2,000-token prompt and one token: alone, its step is
    // 410.2 ms and the engine is idle again before the next. At m times the rate the gap is
    // 1/m s, so from m = 1 / 0.4102 = 2.44 each request waits for the one before, a little
    // more each time, and the TTFT passes 0.5 s within a few requests.
    let t = trace(&lines(200, 1000, 2000, 1, ""));
    let c = class("chat", Some(0.5), None, 0.9);
    let a = answer(&PREFILL_BOUND, std::slice::from_ref(&c), &t);
    assert_eq!((a.stretch.clone(), a.warm, a.unjudged), (0..200, 20, 0));
    let chat = &a.classes[0];
    assert_eq!(chat.judged, 180);
    assert_eq!((chat.at_one, chat.met_at_one()), (Some(1.0), Some(true)));
    let m = edge(chat);
    let truth = 1.0 / 0.4102;
    assert!((m / truth - 1.0).abs() < 0.025, "{m} against {truth}");
    assert_eq!(chat.binds, Some(Bound::Ttft));
    // The cost of twice the traffic: one engine holds 2.4 times it.
    let multiple = chat.multiple.expect("a multiple");
    assert_eq!(
        (multiple.engines(1.0), multiple.engines(2.0)),
        (Some(1), Some(1))
    );
    assert_eq!(multiple.engines(5.0), Some(3));
}

#[test]
fn a_speed_bound_class_holds_until_the_batch_reaches_its_floor() {
    // 100-token answers one a second; a step of b sequences costs 10 + b ms, so a 50 tokens/s
    // floor holds up to b = 10 (20 ms steps, 2 s a request). Little's law at rate r:
    // b = r x 100 x (0.010 + 0.001 b), so b = 10 at r = 5 a second: m = 5.
    let t = trace(&lines(300, 1000, 10, 100, ""));
    let c = class("agent", None, Some(50.0), 0.9);
    let a = answer(&DECODE_BOUND, std::slice::from_ref(&c), &t);
    let agent = &a.classes[0];
    let m = edge(agent);
    assert!((m / 5.0 - 1.0).abs() < 0.04, "{m}");
    assert_eq!(agent.binds, Some(Bound::TokensPerSecond));
    // The same trace for a class with a first-token target it meets easily and the floor:
    // the floor still binds. One with the target alone holds far more, until the batch's
    // growth (past 10 requests a second the engine cannot keep up) queues the first tokens.
    let both = class("both", Some(1.0), Some(50.0), 0.9);
    let first = class("first", Some(1.0), None, 0.9);
    let a = answer(&DECODE_BOUND, &[both, first], &t);
    assert_eq!(a.classes[0].binds, Some(Bound::TokensPerSecond));
    assert!((edge(&a.classes[0]) / 5.0 - 1.0).abs() < 0.04);
    assert!(edge(&a.classes[1]) > 2.0 * m, "{:?}", a.classes[1]);
    assert_eq!(a.classes[1].binds, Some(Bound::Ttft));
}

#[test]
fn a_class_missed_even_by_a_trickle_is_below_the_smallest_multiple() {
    // A 2,000-token prompt takes 410 ms alone: a 0.3 s target is missed however slow the
    // traffic, and no count of engines is enough.
    let t = trace(&lines(50, 1000, 2000, 1, ""));
    let a = answer(&PREFILL_BOUND, &[class("tight", Some(0.3), None, 0.9)], &t);
    let c = &a.classes[0];
    assert_eq!(c.met_at_one(), Some(false));
    assert_eq!(c.multiple, Some(Multiple::Below(MIN_MULTIPLE)));
    assert_eq!(c.binds, Some(Bound::Ttft));
    assert_eq!(c.multiple.and_then(|m| m.engines(2.0)), None);
}

#[test]
fn blocks_seen_before_are_the_prefix_caches() {
    let mut seen = HashSet::new();
    let mut full = false;
    let mut cached = |ids: &[u64], prompt| cached_tokens(ids, prompt, 512, &mut seen, &mut full);
    // 1,030 tokens in blocks of 512, 512 and 6.
    assert_eq!(cached(&[0, 1, 2], 1030), 0);
    // The same two leading blocks: their 1,024 tokens are served.
    assert_eq!(cached(&[0, 1, 3], 1030), 1024);
    // A block seen only under another prefix is not a prefix here.
    assert_eq!(cached(&[7, 1], 600), 0);
    // The whole prompt seen: all but its last token.
    assert_eq!(cached(&[0, 1, 2], 1030), 1029);
    assert!(!full);
}

#[test]
fn a_trace_whose_every_block_repeats_is_prefilled_once() {
    // Every request the same 2,048-token prompt in four blocks: the first is prefilled whole,
    // every other one its last token only.
    let t = trace(&lines(200, 1000, 2048, 1, ", \"hash_ids\": [0, 1, 2, 3]"));
    assert_eq!(t.with_blocks, 200);
    assert_eq!((t.requests[0].cached, t.requests[1].cached), (0, 2047));
    let share = t.cached_share();
    assert!(
        (share - 199.0 * 2047.0 / (200.0 * 2048.0)).abs() < 1e-9,
        "{share}"
    );
    // Without the blocks the prompts bind at about 2.4x (above); with them a step is 10 ms:
    // the class holds 64 times the traffic and more.
    let c = class("chat", Some(0.5), None, 0.9);
    let a = answer(&PREFILL_BOUND, std::slice::from_ref(&c), &t);
    assert_eq!(a.classes[0].multiple, Some(Multiple::AtLeast(MAX_MULTIPLE)));
    let text = a.text(&fitted(PREFILL_BOUND));
    assert!(
        text.contains("(99% in blocks seen before: served by the prefix cache)"),
        "{text}"
    );
    assert!(text.contains("none within 64x"), "{text}");
}

#[test]
fn memory_binds_where_lifting_it_meets_the_class() {
    // 100-token answers one a second on 11-12 ms steps: a request takes 1.1-1.2 s, so past
    // about 1.7 a second two sequences are not enough and newcomers wait for a slot.
    let t = trace(&lines(200, 1000, 10, 100, ""));
    let c = class("chat", Some(0.5), Some(1.0), 0.9);
    let capped = Engine {
        memory: Memory {
            max_num_seqs: Some(2),
            ..DECODE_BOUND.memory
        },
        ..DECODE_BOUND
    };
    let a = answer(&capped, std::slice::from_ref(&c), &t);
    let m = edge(&a.classes[0]);
    assert!((1.3..2.0).contains(&m), "{m}");
    assert_eq!(a.classes[0].binds, Some(Bound::MaxNumSeqs));
    // A cache of two requests' blocks at their longest (110 tokens, 7 blocks each): the
    // growing answers preempt each other and the cache binds.
    let small = Engine {
        memory: Memory {
            kv_cache_tokens: Some(14 * 16),
            ..DECODE_BOUND.memory
        },
        ..DECODE_BOUND
    };
    let a = answer(&small, std::slice::from_ref(&c), &t);
    assert_eq!(a.classes[0].binds, Some(Bound::KvCache), "{a:?}");
    // Without either, the same class holds far more.
    let free = answer(&DECODE_BOUND, std::slice::from_ref(&c), &t);
    assert!(free.classes[0].multiple.expect("a multiple").value() > 2.0 * m);
}

#[test]
fn each_class_is_judged_on_its_own_requests_where_the_trace_names_them() {
    // Long prompts for `chat`, short ones for `batch`, one in four of no class with targets.
    let mut text = String::new();
    for i in 0..200u64 {
        let (prompt, class) = match i % 4 {
            0 | 1 => (2000, "chat"),
            2 => (10, "batch"),
            _ => (10, "other"),
        };
        text.push_str(&format!(
            "{{\"timestamp\": {}, \"input_length\": {prompt}, \"output_length\": 1, \"class\": \"{class}\"}}\n",
            i * 1000
        ));
    }
    let t = trace(&text);
    assert!(t.by_class);
    let classes = [
        class("batch", Some(0.3), None, 0.9),
        class("chat", Some(0.3), None, 0.9),
    ];
    let a = answer(&PREFILL_BOUND, &classes, &t);
    // 20 warm up; of the other 180, 90 are chat's, 45 batch's, 45 no one's.
    assert_eq!(
        (a.classes[0].judged, a.classes[1].judged, a.unjudged),
        (45, 90, 45)
    );
    // Batch's short prompts meet 0.3 s at 1x; chat's long ones never do.
    assert_eq!(a.classes[0].met_at_one(), Some(true));
    assert_eq!(a.classes[1].multiple, Some(Multiple::Below(MIN_MULTIPLE)));
    let out = a.text(&fitted(PREFILL_BOUND));
    assert!(
        out.contains("judged: each request by its own class"),
        "{out}"
    );
    assert!(
        out.contains("45 replayed requests are in no class with targets here"),
        "{out}"
    );
    assert!(
        out.contains("2x this traffic: a class is missed even at 1/64 of it"),
        "{out}"
    );
    // A class of no request in the trace has no answer, and says so.
    let a = answer(&PREFILL_BOUND, &[class("none", Some(1.0), None, 0.9)], &t);
    assert_eq!((a.classes[0].judged, a.classes[0].multiple), (0, None));
    assert!(a.text(&fitted(PREFILL_BOUND)).contains("no requests"));
}

#[test]
fn a_trace_too_long_for_one_replay_is_replayed_at_its_busiest_stretch() {
    // 40 requests of 100,000 output tokens: 4 million sequence-steps, where a replay runs 1.5
    // million, so 15 at most. Ten seconds apart, but 15 of them a second apart from the 20th.
    let mut at = 0u64;
    let requests: Vec<Recorded> = (0..40u64)
        .map(|i| {
            at += if (21..35).contains(&i) { 1000 } else { 10_000 };
            Recorded {
                at: at as f64 / 1e3,
                prompt: 10,
                cached: 0,
                output: 100_000,
                class: None,
                line: i + 1,
            }
        })
        .collect();
    let r = stretch(&requests, &DECODE_BOUND);
    assert_eq!(r, 20..35);
    // Short answers fit whole.
    let short: Vec<Recorded> = requests
        .iter()
        .map(|r| Recorded {
            output: 10,
            ..r.clone()
        })
        .collect();
    assert_eq!(stretch(&short, &DECODE_BOUND), 0..40);
}

#[test]
fn bad_and_empty_traces_are_errors_naming_the_line() {
    let good = lines(1, 0, 5, 1, "");
    let err = read(&format!(
        "{good}{{\"timestamp\": 5, \"input_length\": 0}}\n"
    ))
    .expect_err("a bad second line");
    assert!(err.to_string().starts_with("t.jsonl: line 2: "), "{err}");
    let err = read("\n\n").expect_err("no requests");
    assert_eq!(err.to_string(), "t.jsonl has no requests");
}

#[test]
fn the_answer_prints_as_a_table_and_as_json() {
    let t = trace(&lines(200, 1000, 2000, 1, ""));
    let c = class("chat", Some(0.5), None, 0.9);
    let a = answer(&PREFILL_BOUND, std::slice::from_ref(&c), &t);
    let f = Fitted {
        gpus_per_engine: Some(2.0),
        ..fitted(PREFILL_BOUND)
    };
    let text = a.text(&f);
    for want in [
        "the engine (fitted): t(b) = 10.000 ms + 0.2000 ms x b, prefill 0.2000 ms per uncached token (wire); KV cache not known (memory never binds); no context term (not exported); 2 GPUs per engine",
        "the trace: t.jsonl, 200 requests over 199.0 s: 1.00 requests/s; mean input 2000 tokens (0% in blocks seen before: no hash_ids, so no prefix cache), output 1",
        "judged: every class on the whole trace (the trace names no class)",
        "replayed: all 200 requests, open loop at the trace's times / m; the first 20 warm the engine",
        "1x this traffic: 1 engine (2 GPUs), the most any class needs",
        "2x this traffic: 1 engine (2 GPUs), the most any class needs",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    let row = text
        .lines()
        .find(|l| l.starts_with("chat "))
        .expect("chat's row");
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells[..7],
        ["chat", "0.900", "0.500", "s", "-", "180", "met"],
        "{row}"
    );
    assert!(row.contains(" ttft "), "{row}");
    let json = a.json(&f);
    let chat = &json["classes"][0];
    assert_eq!(chat["binds"], "ttft");
    assert_eq!(chat["max_multiple_is"], "edge");
    assert_eq!(chat["at_1x"]["met"], true);
    assert_eq!(
        (chat["engines"]["2x"].clone(), chat["gpus"]["2x"].clone()),
        (json!(1), json!(2.0))
    );
    assert_eq!(json["trace"]["judged_by"], "whole_trace");
    assert_eq!(json["replayed"]["warm_up"], 20);
    assert_eq!(json["engine"]["max_num_seqs"], Value::Null);
}

fn fitted(engine: Engine) -> Fitted {
    Fitted {
        engine,
        prefill_source: Some("wire".into()),
        gpus_per_engine: None,
        notes: Vec::new(),
    }
}
