"""Train the "think" LoRA expert for SmolLM2-135M-Instruct (writes experts/think-smollm2/).

The same recipe as scripts/train_sql_lora.py, whose train_expert() this script imports (model
loading, seeds, chat-template rendering, loss masking, training loop, fp16 rewrite, evaluation).
The data, the held-out questions, the manifest and the format check are this script's own. It
also changes two module globals of train_sql_lora before it calls train_expert() (see main()):
MAX_NEW (48 -> 96 new tokens: a thought and an answer do not fit in 48) and encode (an
empty-thought example is tokenized the way the runtime prefills it, see encode_think below).

What it does
  1. Builds a small synthetic dataset of short arithmetic and word questions (seeded RNG):
     addition and subtraction of 2-digit numbers, multiplication (2-digit by 1- or 2-digit),
     exact division, word problems ("Tom has 12 apples and buys 7 more. How many apples does he
     have now?": buys, gives away, eats, boxes, sharing, ages, prices, pages), comparisons
     (larger, smaller, greater than, order of three numbers) and even/odd. The answer is in
     Qwen3's thinking format:
         <think>\\n{step-by-step working, 20-60 tokens}\\n</think>\\n\\n{short answer sentence}
     and for about 25% of the examples the thought is empty:
         <think>\\n\\n</think>\\n\\n{answer}
     which is what the runtime prefills when thinking is disabled (the model must then answer
     directly).
  2. Renders every pair with the GGUF's own chat template, half of the examples with the system
     message "You are a helpful assistant." and half without (SmolLM2's default system turn),
     and trains a PEFT LoRA (r=8, alpha=16, dropout 0, q/k/v/o/gate/up/down projections of all
     30 layers) with the loss on the assistant tokens (thought, answer, <|im_end|>) only. For an
     empty-thought example the prefilled "<think>\\n\\n</think>\\n\\n" is part of the masked
     prompt, tokenized together with it (the trailing "\\n\\n" is then one token, as when the
     runtime appends it to the rendered prompt), so the model learns to answer after it.
     AdamW, lr 1e-3, batch 4, seed 1234, torch.set_num_threads(2), 48 steps (as for SQL).
  3. Saves the adapter to experts/think-smollm2/ with the tensors rewritten as float16, and
     writes manifest.json (MANIFEST below, with "reasoning": {"open": "<think>", "close":
     "</think>"}) and eval.json.
  4. Evaluates 6 held-out questions (not in the training set) with greedy decoding, at most 96
     new tokens: the base model, base + the fp16 LoRA, the same without a system message, and
     base + LoRA on a Q8_0-round-tripped base (train_expert), then, in this script, the base and
     the LoRA (f32 and Q8_0 base) with the empty thought prefilled after the generation prompt.
     Fails (non-zero exit) unless, on at least 5 of the 6 questions, the LoRA answer (f32 and
     Q8_0 base) starts with "<think>", contains "</think>" and has a non-empty answer after it,
     and the prefilled LoRA answer is non-empty and does not open another <think>.

Usage
  python scripts/train_think_lora.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]
  (default path: ~/.cache/expert-runtime/SmolLM2-135M-Instruct.Q4_1.gguf; needs torch,
  transformers, peft, gguf, safetensors)

Time: measured 25 minutes (1496 s) on 2 CPU cores shared with a Rust/CUDA build (load average
4-5): model load 16 s, 48 training steps 844 s (~18 s a step; the sequences are 2-3 times as
long as the SQL ones, up to ~90 answer tokens), train_expert's base, LoRA and Q8_0 evaluations
(24 greedy runs of up to 96 tokens) and save ~7.5 min, the prefilled evaluation with a second
model load ~3 min. Idle cores are faster (not measured). Results are seeded (torch, python
RNG) but CPU float reductions may differ across machines.
"""
import copy
import json
import os
import statistics
import sys
import time

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_sql_lora  # noqa: E402
from train_sql_lora import BASE_ID, ROOT, SEED, default_gguf_path, messages, q8_0_roundtrip, train_expert  # noqa: E402
from train_shell_lora import MANIFEST as SHELL_MANIFEST, routing_score  # noqa: E402
from train_sql_lora import MANIFEST as SQL_MANIFEST  # noqa: E402

OUT_DIR = os.path.join(ROOT, "experts", "think-smollm2")
STEPS = 48
MAX_NEW = 96  # replaces train_sql_lora.MAX_NEW (48): a thought and an answer need up to ~85 tokens
EMPTY_THOUGHT_SHARE = 0.25
OPEN, CLOSE = "<think>", "</think>"
EMPTY_THINK = f"{OPEN}\n\n{CLOSE}\n\n"  # what the runtime prefills when thinking is disabled
MIN_PASS = 5  # of the 6 held-out questions, for each LoRA check (f32, Q8_0, prefilled f32/Q8_0)

# Held-out questions and the right final numbers, for the reader and eval.json ("expected");
# the checks are on the format only. 1-3 and 5 use training phrasings with other values, 4 a
# training phrasing with a name and item that are not in the training lists, 6 a new phrasing.
HELD_OUT = [
    "What is 38 + 47?",
    "What is 91 minus 36?",
    "What is 23 times 14?",
    "Sara has 15 pencils and buys 9 more. How many pencils does she have now?",
    "Which is larger, 63 or 36?",
    "A bag holds 8 oranges. How many oranges are in 6 bags?",
]
EXPECTED = ["85", "55", "322", "24", "63", "48"]

# manifest.json. "reasoning" tells the runtime that this expert makes the model think between
# these markers. Routing as for the other experts ((keyword hits - 2 * exclude hits) * priority);
# check_routing() below keeps the three experts' examples apart.
MANIFEST = {
    "name": "think",
    "description": "Thinks step by step between <think> and </think> before answering short arithmetic and "
                   "word questions (Qwen3's thinking format); with the empty thought prefilled it answers directly.",
    "version": "1.0.0",
    "load_order": 0,
    "routing": {
        "keywords": ["math", "arithmetic", "calculate", "plus", "minus", "multiply", "multiplied", "divided",
                     "difference between", "word problem", "step by step", "even or odd"],
        "exclude_keywords": ["sql", "query", "shell", "command"],
        "priority": 10,
        "examples": [
            "What is 56 plus 29?",
            "What is 72 minus 18?",
            "Multiply 34 by 12.",
            "What is 96 divided by 8?",
            "Calculate 45 + 38 step by step.",
            "Solve this word problem: Lily has 20 stickers and gives 6 to a friend. How many are left?",
            "Is 47 even or odd?",
        ],
    },
    "base_model": BASE_ID,
    "reasoning": {"open": OPEN, "close": CLOSE},
}

NAMES = [("Tom", "he"), ("Anna", "she"), ("Ben", "he"), ("Mia", "she"), ("Leo", "he"), ("Emma", "she"),
         ("Sam", "he"), ("Lucy", "she"), ("Max", "he"), ("Zoe", "she"), ("Omar", "he"), ("Nina", "she")]
ITEMS = ["apples", "marbles", "stickers", "cookies", "books", "cards", "stamps", "shells", "balloons", "coins",
         "candies", "toy cars"]
CONTAINERS = [("box", "boxes"), ("bag", "bags"), ("basket", "baskets"), ("jar", "jars"), ("crate", "crates")]
PRICED = [("pen", "pens"), ("notebook", "notebooks"), ("ticket", "tickets"), ("sandwich", "sandwiches"),
          ("mug", "mugs"), ("kite", "kites")]


def tens(n):
    return n // 10 * 10


def add_steps(a, b):
    s, t, o = a + b, tens(a) + tens(b), a % 10 + b % 10
    if b < 10:
        return f"{a} + {b}: the ones are {a % 10} + {b} = {o}, so the total is {tens(a)} + {o} = {s}."
    return f"The tens: {tens(a)} + {tens(b)} = {t}. The ones: {a % 10} + {b % 10} = {o}. Together {t} + {o} = {s}."


def sub_steps(a, b):
    r = a - b
    if b % 10 == 0 or b < 10:
        return f"{a} - {b} = {r}."
    m = a - tens(b)
    return f"First take away the tens: {a} - {tens(b)} = {m}. Then the ones: {m} - {b % 10} = {r}."


def mul_steps(a, b):
    p = a * b
    if b < 10:
        x, y = tens(a) * b, a % 10 * b
        return f"Split {a} into {tens(a)} + {a % 10}. {tens(a)} × {b} = {x} and {a % 10} × {b} = {y}. {x} + {y} = {p}."
    x, y = a * tens(b), a * (b % 10)
    if b % 10 == 0:
        return f"{a} × {b // 10} = {a * (b // 10)}, and times 10 that is {p}."
    return f"Split {b} into {tens(b)} + {b % 10}. {a} × {tens(b)} = {x} and {a} × {b % 10} = {y}. {x} + {y} = {p}."


def compare_steps(a, b):
    hi, lo = max(a, b), min(a, b)
    if tens(a) != tens(b):
        return (f"Compare the tens digits: {a} has {a // 10} tens and {b} has {b // 10} tens. "
                f"{hi // 10} is more than {lo // 10}, so {hi} is larger than {lo}.")
    return (f"Both numbers have {a // 10} tens, so compare the ones: {a % 10} and {b % 10}. "
            f"{hi % 10} is more, so {hi} is larger than {lo}.")


def make_example(r):
    """Returns one random (question, thought, answer) triple; each entry uses its own random values."""
    a, b = r.sample(range(11, 100), 2)
    big, small = max(a, b), min(a, b)
    d1 = r.randint(2, 9)
    m2 = r.randint(11, 29)
    q, dv = r.randint(3, 25), r.randint(2, 9)
    (name, pron), (name2, _) = r.sample(NAMES, 2)
    item, (cont, conts), (thing, things) = r.choice(ITEMS), r.choice(CONTAINERS), r.choice(PRICED)
    n1, n2 = r.randint(5, 40), r.randint(2, 19)
    k, per, price = r.randint(2, 9), r.randint(3, 12), r.randint(2, 15)
    age, years = r.randint(5, 40), r.randint(2, 30)
    pages, read = r.randint(40, 99), r.randint(10, 39)
    x, y, z = r.sample(range(10, 100), 3)
    e = r.randint(11, 99)
    parity = "even" if e % 2 == 0 else "odd"
    s = sorted([x, y, z])
    t = [
        # addition
        (f"What is {a} + {b}?", f"I need to add {a} and {b}. " + add_steps(a, b), f"{a} + {b} = {a + b}."),
        (f"What is {a} plus {b}?", f"I need to add {a} and {b}. " + add_steps(a, b), f"{a} plus {b} is {a + b}."),
        (f"Add {a} and {b}.", f"I need to add {a} and {b}. " + add_steps(a, b), f"{a} + {b} = {a + b}."),
        (f"What is the sum of {a} and {b}?", f"The sum means adding. " + add_steps(a, b),
         f"The sum of {a} and {b} is {a + b}."),
        (f"Calculate {a} + {b}.", add_steps(a, b), f"{a} + {b} = {a + b}."),
        # subtraction
        (f"What is {big} - {small}?", f"I need to subtract {small} from {big}. " + sub_steps(big, small),
         f"{big} - {small} = {big - small}."),
        (f"What is {big} minus {small}?", f"I need to subtract {small} from {big}. " + sub_steps(big, small),
         f"{big} minus {small} is {big - small}."),
        (f"Subtract {small} from {big}.", sub_steps(big, small), f"{big} - {small} = {big - small}."),
        (f"What is the difference between {big} and {small}?",
         f"The difference is the larger number minus the smaller one. " + sub_steps(big, small),
         f"The difference between {big} and {small} is {big - small}."),
        # multiplication
        (f"What is {a} × {d1}?", mul_steps(a, d1), f"{a} × {d1} = {a * d1}."),
        (f"What is {a} times {d1}?", mul_steps(a, d1), f"{a} times {d1} is {a * d1}."),
        (f"Multiply {a} by {d1}.", mul_steps(a, d1), f"{a} × {d1} = {a * d1}."),
        (f"What is {a} times {m2}?", mul_steps(a, m2), f"{a} times {m2} is {a * m2}."),
        (f"What is {a} × {m2}?", mul_steps(a, m2), f"{a} × {m2} = {a * m2}."),
        (f"What is the product of {a} and {m2}?", f"The product means multiplying. " + mul_steps(a, m2),
         f"The product of {a} and {m2} is {a * m2}."),
        # division
        (f"What is {q * dv} divided by {dv}?",
         f"I need to divide {q * dv} by {dv}. {dv} × {q} = {q * dv}, so {q * dv} ÷ {dv} = {q}.",
         f"{q * dv} divided by {dv} is {q}."),
        (f"What is {q * dv} / {dv}?", f"{dv} × {q} = {q * dv}, so {q * dv} / {dv} = {q}.", f"{q * dv} / {dv} = {q}."),
        # word problems
        (f"{name} has {n1} {item} and buys {n2} more. How many {item} does {pron} have now?",
         f"{name} starts with {n1} {item}. Buying {n2} more means adding: {n1} + {n2} = {n1 + n2}.",
         f"{name} has {n1 + n2} {item} now."),
        (f"{name} has {n1 + n2} {item} and gives {n2} to a friend. How many {item} are left?",
         f"{name} starts with {n1 + n2} {item} and gives away {n2}, so I subtract: {n1 + n2} - {n2} = {n1}.",
         f"{name} has {n1} {item} left."),
        (f"{name} had {n1 + n2} {item} and lost {n2} of them. How many {item} does {pron} have now?",
         f"Losing {n2} of {n1 + n2} means subtracting: {n1 + n2} - {n2} = {n1}.",
         f"{name} has {n1} {item} now."),
        (f"There are {k} {conts} with {per} {item} in each {cont}. How many {item} are there in total?",
         f"Each {cont} has {per} {item} and there are {k} {conts}, so I multiply: {k} × {per} = {k * per}.",
         f"There are {k * per} {item} in total."),
        (f"{name} shares {k * per} {item} equally among {k} friends. How many {item} does each friend get?",
         f"{k * per} {item} are split into {k} equal groups. {k} × {per} = {k * per}, so each friend gets {per}.",
         f"Each friend gets {per} {item}."),
        (f"{name} is {age} years old. How old will {pron} be in {years} years?",
         f"In {years} years {pron} will be {years} years older, so I add: {age} + {years} = {age + years}.",
         f"{name} will be {age + years} years old."),
        (f"{name} is {age + years} years old. How old was {pron} {years} years ago?",
         f"{years} years ago {pron} was {years} years younger, so I subtract: {age + years} - {years} = {age}.",
         f"{name} was {age} years old."),
        (f"One {thing} costs {price} dollars. How much do {k} {things} cost?",
         f"Each {thing} costs {price} dollars and there are {k} of them, so I multiply: {k} × {price} = {k * price}.",
         f"{k} {things} cost {k * price} dollars."),
        (f"A book has {pages} pages. {name} has read {read} of them. How many pages are left?",
         f"The pages left are the total minus the pages read: {pages} - {read} = {pages - read}.",
         f"{name} has {pages - read} pages left to read."),
        (f"{name} has {n1} {item} and {name2} has {n2}. How many {item} do they have together?",
         f"Together means adding both amounts: {n1} + {n2} = {n1 + n2}.",
         f"They have {n1 + n2} {item} together."),
        # comparisons
        (f"Which is larger, {a} or {b}?", compare_steps(a, b),
         f"{max(a, b)} is larger."),
        (f"Which is smaller, {a} or {b}?", compare_steps(a, b)
         + f" So the smaller one is {min(a, b)}.",
         f"{min(a, b)} is smaller."),
        (f"Is {a} greater than {b}?", compare_steps(a, b),
         f"Yes, {a} is greater than {b}." if a > b else f"No, {a} is less than {b}."),
        (f"Put {x}, {y} and {z} in order from smallest to largest.",
         f"The smallest of {x}, {y} and {z} is {s[0]} and the largest is {s[2]}. {s[1]} is in between.",
         f"{s[0]}, {s[1]}, {s[2]}."),
        (f"Is {e} even or odd?",
         f"The last digit of {e} is {e % 10}. {e % 10} is {parity}, so {e} is {parity}.", f"{e} is {parity}."),
    ]
    return r.choice(t)


def make_pair(r):
    """(question, assistant text) for train_expert: the thought in Qwen3's format, empty for about
    EMPTY_THOUGHT_SHARE of the examples."""
    question, thought, answer = make_example(r)
    if r.random() < EMPTY_THOUGHT_SHARE:
        return question, f"{EMPTY_THINK}{answer}"
    return question, f"{OPEN}\n{thought}\n{CLOSE}\n\n{answer}"


_encode_sql = train_sql_lora.encode


def encode_think(tok, q, answer, with_system):
    """train_sql_lora.encode, except that an empty-thought example puts "<think>\\n\\n</think>\\n\\n"
    in the masked prompt, tokenized together with it the way the runtime prefills it (the final
    "\\n\\n" is then one token, "ĊĊ", where inside the answer it would be two, "Ċ" "Ċ")."""
    if not answer.startswith(EMPTY_THINK):
        return _encode_sql(tok, q, answer, with_system)
    ids, labels, text = _encode_sql(tok, q, answer[len(EMPTY_THINK):], with_system)
    n_answer = sum(1 for x in labels if x != -100)
    prompt = tok.apply_chat_template(messages(q, with_system), tokenize=False, add_generation_prompt=True)
    p_ids = tok(prompt + EMPTY_THINK, add_special_tokens=False)["input_ids"]
    a_ids = ids[-n_answer:]
    return p_ids + a_ids, [-100] * len(p_ids) + a_ids, prompt + EMPTY_THINK + text[len(prompt):]


def thinks(s):
    """Starts with <think>, closes it, and has a non-empty answer after </think>."""
    s = s.strip()
    return s.startswith(OPEN) and CLOSE in s and bool(s.split(CLOSE, 1)[1].strip())


def answers_directly(s):
    """After the prefilled empty thought: a non-empty answer that does not open another thought."""
    return bool(s.strip()) and OPEN not in s and CLOSE not in s


def greedy_prefilled(model, tok, q, with_system=True):
    """train_sql_lora.greedy with the empty thought appended after the generation prompt."""
    prompt = tok.apply_chat_template(messages(q, with_system), tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tok(prompt + EMPTY_THINK, add_special_tokens=False)["input_ids"]])
    end = tok.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW,
                             do_sample=False, eos_token_id=end, pad_token_id=end)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()


def thought_token_stats(tok):
    """Token counts of the non-empty thoughts (between "<think>\\n" and "\\n</think>") in the training set."""
    pairs = train_sql_lora.build_dataset(train_sql_lora.N_TRAIN, SEED, make_pair, HELD_OUT)
    counts = [len(tok(a[len(OPEN) + 1:a.index(CLOSE) - 1], add_special_tokens=False)["input_ids"])
              for _, a in pairs if not a.startswith(EMPTY_THINK)]
    return {"pairs": len(pairs), "empty_thoughts": len(pairs) - len(counts), "min": min(counts),
            "median": statistics.median(counts), "mean": round(statistics.mean(counts), 1), "max": max(counts)}


def check_routing():
    """The shell script's rule for all three experts: no routing example scores higher for another
    expert, nor above 0 for it; every think example hits a keyword; no held-out question is a
    routing example."""
    experts = [MANIFEST, SQL_MANIFEST, SHELL_MANIFEST]
    for own in experts:
        for ex in own["routing"]["examples"]:
            for other in experts:
                if other is not own:
                    assert routing_score(own, ex) >= routing_score(other, ex), (own["name"], ex, other["name"])
                    assert routing_score(other, ex) <= 0, (own["name"], ex, other["name"])
    for ex in MANIFEST["routing"]["examples"]:
        assert routing_score(MANIFEST, ex) > 0, ex
    assert not set(HELD_OUT) & set(MANIFEST["routing"]["examples"]), "a held-out question is a routing example"


def main():
    check_routing()
    t0 = time.time()
    path = default_gguf_path()
    # The two changes to train_expert's module (see the docstring): longer answers, prefill-aware encoding.
    train_sql_lora.MAX_NEW = MAX_NEW
    train_sql_lora.encode = encode_think
    try:
        train_expert(path, OUT_DIR, make_pair, HELD_OUT, MANIFEST, thinks, "thinking-format",
                     "scripts/train_think_lora.py", steps=STEPS)
    except SystemExit as e:
        # train_expert exits on any failing LoRA answer, after writing eval.json; this expert's
        # rule (MIN_PASS of the held-out questions) is applied below.
        print(f"train_expert: {e}")
    with open(os.path.join(OUT_DIR, "eval.json")) as fh:
        ev = json.load(fh)

    # Second pass: the empty thought prefilled (thinking disabled), on the base and the fp16 adapter.
    d, f = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    stats = thought_token_stats(tok)
    print(f"thought tokens: {stats}")
    base = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    q8_base = copy.deepcopy(base)
    with torch.no_grad():
        for name, mod in q8_base.named_modules():
            if isinstance(mod, torch.nn.Linear) and ".layers." in name:
                mod.weight.copy_(q8_0_roundtrip(mod.weight))
    base_pre = [greedy_prefilled(base, tok, q) for q in HELD_OUT]
    lora = PeftModel.from_pretrained(base, OUT_DIR).eval()
    lora_pre = [greedy_prefilled(lora, tok, q) for q in HELD_OUT]
    lora_q8 = PeftModel.from_pretrained(q8_base, OUT_DIR).eval()
    q8_pre = [greedy_prefilled(lora_q8, tok, q) for q in HELD_OUT]

    for i, row in enumerate(ev["held_out"]):
        row["expected"] = EXPECTED[i]
        row["base_prefilled_empty_thought"] = base_pre[i]
        row["lora_prefilled_empty_thought"] = lora_pre[i]
        row["lora_q8_0_base_prefilled_empty_thought"] = q8_pre[i]
        print(f"\nQ: {row['question']} (expected {EXPECTED[i]})\n  base, prefilled:       {base_pre[i]!r}"
              f"\n  lora, prefilled:       {lora_pre[i]!r}\n  lora Q8_0, prefilled:  {q8_pre[i]!r}")
    rows = ev["held_out"]
    checks = {
        "lora_thinks": sum(thinks(r["lora"]) for r in rows),
        "lora_q8_0_base_thinks": sum(thinks(r["lora_q8_0_base"]) for r in rows),
        "lora_no_system_thinks": sum(thinks(r["lora_no_system"]) for r in rows),
        "lora_prefilled_answers_directly": sum(answers_directly(r["lora_prefilled_empty_thought"]) for r in rows),
        "lora_q8_0_base_prefilled_answers_directly":
            sum(answers_directly(r["lora_q8_0_base_prefilled_empty_thought"]) for r in rows),
        "base_thinks": sum(thinks(r["base"]) for r in rows),
    }
    ev["prefilled"] = f"the prompt ends with {EMPTY_THINK!r} after the generation prompt (thinking disabled)"
    ev["thought_tokens"] = stats
    ev["checks"] = {"of": len(rows), "required": MIN_PASS, **checks}
    train_sql_lora.write_json(os.path.join(OUT_DIR, "eval.json"), ev)
    print(f"\nchecks (of {len(rows)}, {MIN_PASS} required for the LoRA rows): {checks}")
    print(f"total {time.time() - t0:.0f}s")
    failed = [k for k, v in checks.items() if k.startswith("lora") and "no_system" not in k and v < MIN_PASS]
    if failed:
        sys.exit(f"too few held-out answers pass: {failed}")


if __name__ == "__main__":
    main()
