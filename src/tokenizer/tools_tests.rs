use super::*;

fn tools() -> Vec<ToolSpec> {
    ["get_weather", "search"]
        .iter()
        .map(|n| ToolSpec {
            name: n.to_string(),
            description: None,
            parameters: serde_json::json!({ "type": "object" }),
            strict: None,
        })
        .collect()
}

/// Feeds `text` in pieces of `step` characters; returns the released text, the deltas merged
/// per call (id, name, arguments) and the outcome.
fn stream(syntax: &'static ToolSyntax, text: &str, step: usize) -> (String, Vec<(String, String, String)>, ToolOutcome) {
    stream_to(syntax, text, step, false)
}

/// [`stream`], the answer ending at `maxTokens` when `cut_off`.
fn stream_to(
    syntax: &'static ToolSyntax,
    text: &str,
    step: usize,
    cut_off: bool,
) -> (String, Vec<(String, String, String)>, ToolOutcome) {
    let mut s = ToolStream::new(syntax, &tools());
    let mut out = String::new();
    let mut calls: Vec<(String, String, String)> = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    for piece in chars.chunks(step) {
        let piece: String = piece.iter().collect();
        let (t, deltas) = s.push(&piece);
        out.push_str(&t);
        for d in deltas {
            if d.index == calls.len() {
                calls.push((d.id.clone().expect("first piece has the id"), d.name.clone().expect("and the name"), String::new()));
            }
            assert!(d.index < calls.len(), "a delta for a call never announced");
            calls[d.index].2.push_str(&d.arguments);
        }
    }
    let (t, outcome) = s.finish(cut_off);
    out.push_str(&t);
    (out, calls, outcome)
}

#[test]
fn hermes_calls_stream_their_arguments_at_every_split() {
    let text = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris \\\"}\", \"days\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call>";
    for step in [1, 2, 3, 7, 1000] {
        let (out, calls, outcome) = stream(&HERMES, text, step);
        assert_eq!(out, "Let me look.\n", "step {step}");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].1, "get_weather");
        assert_eq!(calls[0].2, "{\"city\": \"Paris \\\"}\", \"days\": [1, 2]}");
        assert_eq!(calls[1].2, "{}");
        let ToolOutcome::Calls(c) = outcome else { panic!("{outcome:?}") };
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].id, calls[0].0);
        assert_eq!(c[0].arguments, calls[0].2);
        let args: Value = serde_json::from_str(&c[0].arguments).unwrap();
        assert_eq!(args["city"], "Paris \"}");
    }
}

#[test]
fn text_that_only_looks_like_a_marker_is_released() {
    let (out, calls, outcome) = stream(&HERMES, "a <tool or <b> and <tool_cal", 1);
    assert_eq!(out, "a <tool or <b> and <tool_cal");
    assert!(calls.is_empty());
    assert_eq!(outcome, ToolOutcome::Text);
}

#[test]
fn malformed_or_unknown_calls_fall_back_to_text() {
    for text in [
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>",
        "<tool_call>\n{\"name\": \"launch_rockets\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>\nnot json at all\n</tool_call> tail",
    ] {
        let (out, _, outcome) = stream(&HERMES, text, 3);
        assert_eq!(outcome, ToolOutcome::Malformed, "{text}");
        assert_eq!(out, text, "all of the text comes back");
    }
}

#[test]
fn a_call_cut_off_is_dropped_and_the_complete_ones_are_kept() {
    let first = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    for step in [1, 3, 1000] {
        // Alone: no text (its markup never becomes text), no call.
        let (out, _, outcome) = stream(&HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa", step);
        assert_eq!((out.as_str(), outcome), ("", ToolOutcome::Malformed), "step {step}");
        let (out, _, _) = stream(&HERMES, "Sure. <tool_call>\n{\"na", step);
        assert_eq!(out, "Sure. ");
        let (out, _, outcome) = stream_to(&HERMES, "Sure. <tool_c", step, true);
        assert_eq!((out.as_str(), outcome), ("Sure. ", ToolOutcome::Text));
        let (out, _, _) = stream_to(&HERMES, "1 <", step, true);
        assert_eq!(out, "1 <", "a lone '<' is text");
        let (out, _, outcome) = stream_to(&HERMES, &format!("{first}\n<tool"), step, true);
        assert_eq!(out, "", "after a call, a cut-off marker start");
        assert!(matches!(outcome, ToolOutcome::Calls(ref c) if c.len() == 1));
        let (out, _, _) = stream_to(&HERMES, "Sure. <tool_c", step, false);
        assert_eq!(out, "Sure. <tool_c", "an answer that ended by itself keeps its text");
        // After a complete call: that call is the outcome.
        let text = format!("{first}\n<tool_call>\n{{\"name\": \"search\", \"arguments\": {{\"q\": \"ru");
        let (out, calls, outcome) = stream(&HERMES, &text, step);
        assert_eq!(out, "", "step {step}");
        assert_eq!(calls.len(), 1, "the cut call's deltas were held back");
        let ToolOutcome::Calls(c) = outcome else { panic!("{outcome:?}") };
        assert_eq!((c.len(), c[0].name.as_str(), c[0].arguments.as_str()), (1, "get_weather", "{\"city\": \"Paris\"}"));
    }
    // Bare JSON never announced as a call may be an answer that is JSON: released.
    let (out, _, _) = stream(&LLAMA3_JSON, "{\"answer\": 4", 2);
    assert_eq!(out, "{\"answer\": 4");
}

#[test]
fn a_repeated_call_is_a_loop_and_is_never_streamed() {
    let call = |args: &str| format!("<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {args}}}\n</tool_call>\n");
    for step in [1, 4, 1000] {
        let mut s = ToolStream::new(&HERMES, &tools());
        let mut streamed = Vec::new();
        for (i, args) in ["{\"city\": \"Paris\"}", "{\"city\": \"Rome\"}", "{ \"city\":\"Paris\" }"].iter().enumerate() {
            let text = call(args);
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(step) {
                let (t, d) = s.push(&piece.iter().collect::<String>());
                assert_eq!(t, "");
                streamed.extend(d);
            }
            assert_eq!(s.looped(), i == 2, "step {step}, call {i}");
        }
        assert!(streamed.iter().all(|d| d.index < 2), "the repeat was never streamed: {streamed:?}");
        let (_, outcome) = s.finish(false);
        let ToolOutcome::Calls(c) = outcome else { panic!("{outcome:?}") };
        assert_eq!(c.iter().map(|c| c.arguments.as_str()).collect::<Vec<_>>(), ["{\"city\": \"Paris\"}", "{\"city\": \"Rome\"}"]);
    }
}

#[test]
fn name_after_arguments_is_announced_at_the_end() {
    let text = "<tool_call>\n{\"arguments\": {\"q\": 1}, \"name\": \"search\"}\n</tool_call>";
    let (out, calls, outcome) = stream(&HERMES, text, 4);
    assert_eq!(out, "");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].1, "search");
    assert_eq!(calls[0].2, "{\"q\":1}");
    assert!(matches!(outcome, ToolOutcome::Calls(_)));
}

#[test]
fn llama3_bare_json_call_and_plain_answers() {
    let (out, calls, outcome) = stream(&LLAMA3_JSON, "  {\"name\": \"search\", \"parameters\": {\"q\": \"rust\"}}", 2);
    assert_eq!(out, "");
    assert_eq!(calls[0].2, "{\"q\": \"rust\"}");
    assert!(matches!(outcome, ToolOutcome::Calls(ref c) if c[0].name == "search"));
    let (out, calls, outcome) = stream(&LLAMA3_JSON, " The answer is 4.", 2);
    assert_eq!(out, " The answer is 4.");
    assert!(calls.is_empty());
    assert_eq!(outcome, ToolOutcome::Text);
}

#[test]
fn families_are_detected_from_the_template() {
    let qwen = "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools> <tool_call>{% endif %}";
    assert_eq!(ToolFormat::detect(Some(qwen)), ToolFormat { syntax: &HERMES, native: true });
    let llama = "{% if tools %}{\"name\": function name, \"parameters\": dictionary}{% endif %}<|python_tag|>";
    assert_eq!(ToolFormat::detect(Some(llama)), ToolFormat { syntax: &LLAMA3_JSON, native: true });
    let plain = "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}";
    assert_eq!(ToolFormat::detect(Some(plain)), ToolFormat { syntax: &HERMES, native: false });
    assert_eq!(ToolFormat::detect(None), ToolFormat { syntax: &HERMES, native: false });
}

#[test]
fn call_ids_are_distinct() {
    let a = new_call_id();
    assert!(a.starts_with("call_") && a.len() == 29);
    assert_ne!(a, new_call_id());
}
