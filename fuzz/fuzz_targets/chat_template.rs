//! A chat template and a conversation (`ChatTemplate::new`, `render`, `check_bounded`): it must
//! always return, ok or error, within its fuel and output cap.
//!
//! Input layout: one flags byte, the template source, a 0 byte, the messages as JSON
//! (`[{"role": .., "content": ..}]`; missing or invalid: a system and a user message).
//! Flags: bit 0 add_generation_prompt, bits 1-2 enable_thinking (none / false / true),
//! bit 3 a bos_token, bit 4 an eos_token, bit 5 also run check_bounded.

#![no_main]

mod common;

use expert_runtime::tokenizer::template::{ChatTemplate, RenderArgs};
use expert_runtime::tokenizer::ChatMessage;
use libfuzzer_sys::fuzz_target;

fuzz_target!(init: common::report_panics_once(), |data: &[u8]| common::on_untrusted_stack(|| run(data)));

fn run(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else { return };
    let (source, messages) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let Some(source) = common::text(source) else { return };
    let messages: Vec<ChatMessage> = messages.and_then(|m| serde_json::from_slice(m).ok()).unwrap_or_else(|| {
        vec![ChatMessage::new("system", "You are helpful."), ChatMessage::new("user", "Hello")]
    });
    let template = ChatTemplate::new(source, "fuzz input");
    common::show("compile", &template);
    let Ok(template) = template else { return };
    let args = RenderArgs {
        add_generation_prompt: flags & 1 != 0,
        enable_thinking: match (flags >> 1) & 3 {
            0 => None,
            1 => Some(false),
            _ => Some(true),
        },
        bos_token: (flags & 8 != 0).then_some("<s>"),
        eos_token: (flags & 16 != 0).then_some("</s>"),
        tools: None,
    };
    common::show("render", &template.render(&messages, &args));
    if flags & 32 != 0 {
        common::show("check_bounded", &template.check_bounded(&args));
    }
}
