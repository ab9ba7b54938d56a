//! Tests of [`super`]: the bounds on untrusted templates (fuel, output, memory, padding,
//! `tojson`'s indent), HF's whitespace settings and globals, `tojson` against Python's
//! `json.dumps`, the `strftime` subset and the ChatML fallback.

use super::globals::strftime_utc;
use super::tojson::py_float_repr;
use super::*;

fn render(src: &str, ctx: Value) -> String {
    let t = ChatTemplate::new(src, "test").unwrap();
    t.env.get_template(TEMPLATE_NAME).unwrap().render(ctx).unwrap()
}

#[test]
fn endless_and_exploding_templates_fail_instead_of_hanging() {
    let user = [ChatMessage::new("user", "hi")];
    let args = RenderArgs { add_generation_prompt: true, enable_thinking: None, bos_token: None, eos_token: None, tools: None };
    // Nested loops over large ranges: far more instructions than the fuel allows.
    let endless = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    let e = ChatTemplate::new(endless, "test").unwrap().render(&user, &args).unwrap_err();
    assert!(e.contains("fuel"), "{e}");
    // Output past the cap: 90,000 iterations of 1,000 bytes (90 MB).
    let big = format!("{{% for i in range(90000) %}}{}{{% endfor %}}", "x".repeat(1000));
    let e = ChatTemplate::new(&big, "test").unwrap().render(&user, &args).unwrap_err();
    assert!(e.contains(&format!("exceeds {} bytes", max_output("userhi".len()))), "{e}");
    // A normal template is unaffected.
    let ok = ChatTemplate::new("{% for m in messages %}{{ m.role }}: {{ m.content }}{% endfor %}", "test").unwrap();
    assert_eq!(ok.render(&user, &args).unwrap(), "user: hi");
}

#[test]
fn growing_values_are_stopped_and_the_template_retired() {
    let user = [ChatMessage::new("user", "hi")];
    let args = RenderArgs { add_generation_prompt: true, enable_thinking: None, bos_token: None, eos_token: None, tools: None };
    let doubling = [
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
        "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}",
        // No namespace: a macro that calls itself with its argument doubled.
        "{% macro f(s, n) %}{% if n > 0 %}{{ f(s ~ s, n - 1) }}{% else %}{{ s | length }}{% endif %}{% endmacro %}{{ f('x', 64) }}",
        // A string squared by `replace`.
        "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s | replace('x', ns.s) %}{% endfor %}{{ ns.s }}",
    ];
    for src in doubling {
        let t = ChatTemplate::new(src, "test").unwrap();
        let e = t.check_bounded(&args).unwrap_err();
        assert!(e.contains("stopped") && e.contains("MiB of memory"), "{src}: {e}");
        // Retired: refused at once from then on, with the same message.
        let t0 = std::time::Instant::now();
        assert_eq!(t.render(&user, &args).unwrap_err(), e);
        assert!(t0.elapsed() < std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_long_conversation_renders_within_its_memory_budget() {
    // Each message's content copied a few times over (a string built up, then printed):
    // what real templates do, at 8 MB of input.
    let src = "{% set ns = namespace(all='') %}{% for m in messages %}{% set ns.all = ns.all ~ m.content %}\
               <{{ m.role }}>{{ m.content | trim }}{% endfor %}{{ ns.all | length }}";
    let t = ChatTemplate::new(src, "test").unwrap();
    let msgs: Vec<_> = (0..8).map(|i| ChatMessage::new("user", format!("{i}").repeat(1 << 20))).collect();
    let args = RenderArgs { add_generation_prompt: true, enable_thinking: None, bos_token: None, eos_token: None, tools: None };
    let out = t.render(&msgs, &args).unwrap();
    assert!(out.ends_with(&(8usize << 20).to_string()), "{}", &out[out.len() - 20..]);
    assert!(render_memory(8 << 20) > 64 << 20);
}

#[test]
fn tojson_matches_python_json_dumps() {
    let v = Value::from_pairs([
        ("name", Value::from("get_weather")),
        ("args", Value::from_iter([Value::from(1), Value::from(2.5), Value::from(true)])),
        ("text", Value::from("a\"b\\c\n<tag> & 'q' café 日本")),
        ("none", Value::from(())),
        ("empty", Value::from_iter(Vec::<Value>::new())),
    ]);
    let out = render("{{ x | tojson }}", Value::from_pairs([("x", v.clone())]));
    assert_eq!(
        out,
        r#"{"name": "get_weather", "args": [1, 2.5, true], "text": "a\"b\\c\n<tag> & 'q' café 日本", "none": null, "empty": []}"#
    );
    let out = render(
        "{{ x | tojson(indent=2) }}",
        Value::from_pairs([("x", Value::from_pairs([("a", Value::from_iter([Value::from(1)]))]))]),
    );
    assert_eq!(out, "{\n  \"a\": [\n    1\n  ]\n}");
    let out = render("{{ x | tojson(sort_keys=true) }}", Value::from_pairs([("x", Value::from_pairs([("b", 1), ("a", 2)]))]));
    assert_eq!(out, r#"{"a": 2, "b": 1}"#);
    assert_eq!(py_float_repr(1e16), "1e+16");
    assert_eq!(py_float_repr(1.5e-7), "1.5e-07");
    assert_eq!(py_float_repr(3.0), "3.0");
    assert_eq!(py_float_repr(0.1), "0.1");
}

#[test]
fn hf_whitespace_and_helpers() {
    // trim_blocks + lstrip_blocks, trailing newline dropped, python methods, loop controls.
    let src = "{% for m in messages %}\n    {% if m.role == 'skip' %}{% continue %}{% endif %}\n{{ m.content.strip().upper() }}|{{ m.content.startswith(' h') }}\n{% endfor %}\n";
    let ctx = Value::from_pairs([(
        "messages",
        Value::from_iter([
            Value::from_pairs([("role", "user"), ("content", " hi ")]),
            Value::from_pairs([("role", "skip"), ("content", "x")]),
        ]),
    )]);
    assert_eq!(render(src, ctx), "HI|True\n"); // Python-style bool printing, as jinja2
    let t = ChatTemplate::new("{{ raise_exception('bad role') }}", "test").unwrap();
    let err = t
        .render(
            &[],
            &RenderArgs { add_generation_prompt: false, enable_thinking: None, bos_token: None, eos_token: None, tools: None },
        )
        .unwrap_err();
    assert!(err.contains("bad role"), "{err}");
    assert_eq!(strip_generation_tags("a{%- generation -%}b{% endgeneration %}c{% if x %}"), "abc{% if x %}");
}

#[test]
fn overlapping_block_delimiters_do_not_panic() {
    // Found by fuzzing (fuzz/corpus/chat_template/regress-overlapping-tag): `{%}` used to
    // slice `tag[2..1]`.
    assert_eq!(strip_generation_tags("{%}"), "{%}");
    assert_eq!(strip_generation_tags("{%}%}a{% generation %}b"), "{%}%}ab");
    assert_eq!(strip_generation_tags("a{%}{% endgeneration %}"), "a{%}{% endgeneration %}");
    assert!(ChatTemplate::new("{%}", "test").is_err());
}

#[test]
fn tojson_indent_is_bounded() {
    // Found with the chat_template fuzz target (fuzz/corpus/chat_template/regress-tojson-indent):
    // `indent=3000000000` allocated 3 GB for the indent string.
    let args = RenderArgs { add_generation_prompt: false, enable_thinking: None, bos_token: None, eos_token: None, tools: None };
    let render = |src: &str| ChatTemplate::new(src, "test").unwrap().render(&[], &args);
    let e = render("{{ [1] | tojson(indent=3000000000) }}").unwrap_err();
    assert!(e.contains("indent 3000000000 is too large"), "{e}");
    // A wide indent times the nesting depth passes the cap before it is written.
    let e = render("{{ [[[[[[1]]]]]] | tojson(indent=2000000) }}").unwrap_err();
    assert!(e.contains("exceeds"), "{e}");
    assert_eq!(render("{{ [[1]] | tojson(indent=1) }}").unwrap(), "[\n [\n  1\n ]\n]");
}

#[test]
fn strftime_subset() {
    // 2024-02-29 13:05:09 UTC was a Thursday.
    let t = 1_709_211_909;
    assert_eq!(
        strftime_utc("%Y-%m-%d %H:%M:%S %A %a %B %b %j %I%p %%", t),
        "2024-02-29 13:05:09 Thursday Thu February Feb 060 01PM %"
    );
    assert_eq!(strftime_utc("%d %b %Y", 0), "01 Jan 1970");
}

#[test]
fn chatml_fallback() {
    let msgs = [ChatMessage::new("user", "hi")];
    assert_eq!(render_chatml(&msgs, true), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}
