//! A chat template is a program from a file we do not trust. minijinja bounds how deep its
//! parser and its calls recurse; these tests run the deepest templates those bounds let
//! through and check that compiling and rendering them fits a quarter of the stack every thread
//! that does it has ([`crate::stack::UNTRUSTED_STACK`]). A render past the bounds fails with
//! an error, never a crash.

use super::*;
use crate::stack::{peak_use, UNTRUSTED_STACK};

/// Compiles `src` and renders it for one user message, on a thread of its own whose stack use
/// is measured; returns the outcome and the bytes of stack used.
fn compile_and_render(src: String) -> (Result<String, String>, usize) {
    peak_use(UNTRUSTED_STACK, move || {
        let t = ChatTemplate::new(&src, "test")?;
        let user = [ChatMessage::new("user", "hi")];
        let args =
            RenderArgs { add_generation_prompt: true, enable_thinking: None, bos_token: None, eos_token: None, tools: None };
        render_on(&t.env, context(&user, &args), 1 << 20).map_err(|e| e.message)
    })
}

#[test]
fn the_deepest_templates_fit_the_stack_and_deeper_ones_fail() {
    let cases = [
        // Calls: a macro calling itself until minijinja's recursion limit stops it.
        ("macro recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}".to_string()),
        ("macro recursion through a filter", "{% macro f(n) %}{{ f(n + 1) | upper }}{% endmacro %}{{ f(0) }}".into()),
        // A recursive loop over data that nests as deep as it goes: a list holding itself is
        // not possible, so the loop recurses on a fresh list each time.
        ("recursive loop", "{% for x in [[1]] recursive %}{{ loop([x]) }}{% endfor %}".into()),
        // The parser: nested expressions, blocks and calls, 20,000 deep.
        ("nested parentheses", format!("{{{{ {}1{} }}}}", "(".repeat(20_000), ")".repeat(20_000))),
        ("nested lists", format!("{{{{ {}1{} }}}}", "[".repeat(20_000), "]".repeat(20_000))),
        ("nested ifs", format!("{}x{}", "{% if true %}".repeat(20_000), "{% endif %}".repeat(20_000))),
        ("nested fors", format!("{}x{}", "{% for i in [1] %}".repeat(20_000), "{% endfor %}".repeat(20_000))),
        ("unary minus chain", format!("{{{{ {}1 }}}}", "-".repeat(20_000))),
        ("not chain", format!("{{{{ {}true }}}}", "not ".repeat(20_000))),
        ("filter chain", format!("{{{{ 'a'{} }}}}", "|upper".repeat(20_000))),
        ("attribute chain", format!("{{{{ messages{} }}}}", ".x".repeat(20_000))),
    ];
    for (what, src) in cases {
        let (out, used) = compile_and_render(src);
        assert!(used < UNTRUSTED_STACK / 4, "{what}: {used} bytes of stack");
        // Each is either refused (too deep) or renders; none of them crashed.
        if let Err(e) = out {
            assert!(!e.is_empty(), "{what}");
        }
    }
}
