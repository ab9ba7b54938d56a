// Generates __test__/fixtures/smollm2-tokenizer.json: reference tokenizations of the SmolLM2
// GGUF produced by llama.cpp (through node-llama-cpp), used by the Rust tokenizer tests
// (src/tokenizer/mod.rs, `smollm2_matches_llama_cpp`) to check that our GGUF tokenizer gives
// identical ids.
//
// Usage: node scripts/gen_tokenizer_refs.mjs [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]
// The model path defaults to $EXPERT_RUNTIME_SMOLLM2, then
// $HOME/.cache/expert-runtime/SmolLM2-135M-Instruct.Q4_1.gguf.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import { Template } from "@huggingface/jinja";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const modelPath =
    process.argv[2] ??
    process.env.EXPERT_RUNTIME_SMOLLM2 ??
    path.join(os.homedir(), ".cache", "expert-runtime", "SmolLM2-135M-Instruct.Q4_1.gguf");
if (!fs.existsSync(modelPath)) {
    console.error(`model not found: ${modelPath}`);
    process.exit(1);
}

const texts = [
    "Hello, world! This is a simple English sentence.",
    "fn main() {\n    let x = vec![1, 2, 3];\n    println!(\"{:?}\", x);\n}\n",
    "def add(a, b):\n\treturn a + b  # sum\n",
    "Numbers: 12345 3.14 -0.001 1,000,000 and 2024-06-01",
    "multiple   spaces\tand\n\nnewlines\n\n\n  indented\r\nwindows",
    "café naïve 日本 🎉",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "I'm sure they'll say it's fine; we've done it, don't worry. YOU'RE RIGHT",
    "   leading and trailing spaces   ",
    "Ünïcödé façade — “quotes” … ½ ² Ω мир",
    "<|endoftext|>text after special<|im_end|>",
    "",
    " ",
    "\n",
    "a\n b\n\n  c",
];

const chats = [
    {
        messages: [
            { role: "system", content: "You are a helpful assistant." },
            { role: "user", content: "Hello! How are you?" },
        ],
        add_generation_prompt: true,
    },
    {
        messages: [
            { role: "user", content: "Write a haiku." },
            { role: "assistant", content: "Leaves fall softly\nWhispers of the autumn wind\nSilence in the trees" },
            { role: "user", content: "Another one, about 日本 🎉" },
        ],
        add_generation_prompt: true,
    },
    {
        messages: [{ role: "user", content: "No generation prompt here." }],
        add_generation_prompt: false,
    },
];

const llama = await getLlama({ gpu: false, logLevel: LlamaLogLevel.error, build: "never" });
const model = await llama.loadModel({ modelPath, vocabOnly: true, gpuLayers: 0 });
const md = model.fileInfo.metadata;
const template = md.tokenizer?.chat_template;
const tokenText = (id) => (id == null ? null : model.detokenize([id], true));

const out = {
    generated_by: "scripts/gen_tokenizer_refs.mjs",
    node_llama_cpp: JSON.parse(fs.readFileSync(path.join(root, "node_modules/node-llama-cpp/package.json"), "utf8")).version,
    model: path.basename(modelPath),
    tokenizer_pre: md.tokenizer?.ggml?.pre ?? null,
    bos_token_id: model.tokens.bos,
    eos_token_id: model.tokens.eos,
    bos_token: tokenText(model.tokens.bos),
    eos_token: tokenText(model.tokens.eos),
    texts: [],
    chats: [],
};

for (const text of texts) {
    const ids = Array.from(model.tokenize(text, true));
    out.texts.push({
        text,
        ids,
        ids_no_special: Array.from(model.tokenize(text, false)),
        detok: model.detokenize(ids, false),
        detok_special: model.detokenize(ids, true),
    });
}

if (template) {
    for (const chat of chats) {
        const rendered = new Template(template).render({
            messages: chat.messages,
            add_generation_prompt: chat.add_generation_prompt,
            bos_token: out.bos_token,
            eos_token: out.eos_token,
        });
        out.chats.push({ ...chat, rendered, ids: Array.from(model.tokenize(rendered, true)) });
    }
}

await model.dispose();
await llama.dispose();

const dest = path.join(root, "__test__", "fixtures", "smollm2-tokenizer.json");
fs.mkdirSync(path.dirname(dest), { recursive: true });
// Keep id arrays on one line so the fixture stays readable.
const json = JSON.stringify(out, null, 2).replace(/\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]/g, (_, body) => `[${body.split(/,\s*/).join(", ")}]`);
fs.writeFileSync(dest, json + "\n");
console.log(`wrote ${dest} (${out.texts.length} texts, ${out.chats.length} chats)`);
