"""Train the example "sql" LoRA expert for SmolLM2-135M-Instruct (writes experts/sql-smollm2/).

What it does
  1. Builds a small synthetic text-to-SQL dataset from templates (seeded RNG) over three tables:
     users(id, name, age, city, created_at), orders(id, user_id, total, status, created_at) and
     products(id, name, price, category, stock). Question types: select, filter, order, limit,
     count, group by, join, avg, max/min, sum. The answer is only the SQL statement
     ("SELECT name FROM users WHERE age > 30 ORDER BY name;"): no prose, no code fences.
  2. Renders every pair with the GGUF's own chat template (tokenizer.chat_template, the one the
     runtime renders with add_generation_prompt=True), half of the examples with the explicit
     system message "You are a helpful assistant." and half with no system message (SmolLM2's
     template then inserts its default "You are a helpful AI assistant named SmolLM..." system
     turn), and trains a PEFT LoRA (r=8, alpha=16, dropout 0, q/k/v/o/gate/up/down projections
     of all 30 layers) with the loss on the answer tokens (SQL + <|im_end|>) only; the prompt is
     masked with -100. Plain torch loop, AdamW.
  3. Saves the adapter with save_pretrained to experts/sql-smollm2/, rewrites
     adapter_model.safetensors with the same keys in float16 (small committed file) and sets
     base_model_name_or_path to "HuggingFaceTB/SmolLM2-135M-Instruct".
  4. Writes experts/sql-smollm2/manifest.json (MANIFEST below: routing keywords, exclude keywords,
     examples, schema) and eval.json.
  5. Evaluates 5 held-out questions (not in the training set) with greedy decoding (48 new
     tokens): the base model, base + LoRA (the fp16 adapter loaded back with PEFT), and base +
     LoRA where the base's linear weights were first round-tripped through Q8_0 (blocks of 32,
     scale absmax/127, int8; what the runtime uses on CPU). Fails if a LoRA answer does not start
     with SELECT and contain FROM.

The base model is the GGUF file SmolLM2-135M-Instruct.Q4_1.gguf, loaded by transformers with its
weights dequantized to f32 (transformers un-permutes the GGUF q/k rows, so training happens in
HF space; the runtime handles the GGUF permutation when it applies the adapter).

The training and evaluation live in train_expert(), which scripts/train_shell_lora.py imports to
train the shell expert the same way.

Usage
  python scripts/train_sql_lora.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]
  (default path: ~/.cache/expert-runtime/SmolLM2-135M-Instruct.Q4_1.gguf; needs torch,
  transformers, peft, gguf, safetensors)

Time: about 8 minutes on 2 busy CPU cores (model load ~25 s, base eval ~1 min, 48 training steps
~4.5 min, save + eval ~1.5 min); 2-20 s per step depending on what else runs on the cores.
Results are seeded (torch, python RNG) but CPU float reductions may differ across machines.
"""
import copy
import json
import os
import random
import sys
import time

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

SEED = 1234
SYSTEM = "You are a helpful assistant."
BASE_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
N_TRAIN = 240
BATCH = 4
STEPS = 48
LR = 1e-3
WARMUP = 4
MAX_NEW = 48
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
OUT_DIR = os.path.join(ROOT, "experts", "sql-smollm2")

SCHEMA = (
    "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT, age INTEGER, city TEXT, created_at DATE);\n"
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, user_id INTEGER REFERENCES users(id), total REAL, "
    "status TEXT, created_at DATE);\n"
    "CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT, price REAL, category TEXT, stock INTEGER);"
)

HELD_OUT = [
    "List the names of users who live in Paris.",
    "How many orders have status 'shipped'?",
    "What is the average price of products in the 'books' category?",
    "Show the 3 most expensive products.",
    "What is the total amount of all orders placed by the user named 'Alice'?",
]

# manifest.json, as committed in experts/sql-smollm2/. Routing: case-insensitive whole-word or
# whole-phrase matches, +1 per keyword, -2 per exclude keyword, times priority; examples are
# typical requests (none of them held out) for a router that compares requests with them.
MANIFEST = {
    "name": "sql",
    "description": "Answers questions about a users/orders/products database with a single SQL query.",
    "version": "1.0.0",
    "load_order": 0,
    "routing": {
        "keywords": ["sql", "query", "queries", "database", "table", "tables", "select", "rows", "column", "columns", "join", "group by", "order by", "records", "sqlite", "postgres", "mysql", "users", "orders", "products", "customers"],
        "exclude_keywords": ["dinner", "furniture", "kitchen", "periodic table", "table tennis", "times table"],
        "priority": 10,
        "examples": [
            "Which users are from Berlin?",
            "Show the 5 oldest users.",
            "How many products are out of stock?",
            "Count the orders for each status.",
            "What is the average age of users in Tokyo?",
            "List the orders placed by users from London.",
            "Which products cost less than 50?",
            "Write an SQL query that lists the products in the 'toys' category.",
        ],
    },
    "base_model": BASE_ID,
    "schema": SCHEMA,
}

CITIES = ["Paris", "London", "Berlin", "Tokyo", "Madrid", "Rome", "Boston", "Sydney", "Toronto", "Oslo"]
STATUSES = ["shipped", "pending", "cancelled", "delivered", "refunded"]
CATEGORIES = ["books", "electronics", "toys", "clothing", "garden", "sports", "food"]
NAMES = ["Alice", "Bob", "Carol", "Dave", "Eve", "Frank", "Grace", "Heidi", "Ivan", "Judy"]
DATES = ["2023-01-01", "2023-06-01", "2024-01-01", "2024-03-15", "2022-12-31"]
USER_COLS = ["name", "age", "city", "created_at"]
PRODUCT_COLS = ["name", "price", "category", "stock"]


def templates(r):
    """Returns one random (question, sql) pair; each lambda picks its own random values."""
    city, status, cat = r.choice(CITIES), r.choice(STATUSES), r.choice(CATEGORIES)
    name, date = r.choice(NAMES), r.choice(DATES)
    age, n = r.randint(18, 70), r.randint(2, 10)
    price, stock, total = r.choice([10, 20, 25, 50, 100, 200, 500]), r.randint(0, 50), r.choice([50, 100, 250, 500, 1000])
    ucol, pcol = r.choice(USER_COLS), r.choice(PRODUCT_COLS)
    t = [
        # select / filter
        (f"List the names of users who live in {city}.", f"SELECT name FROM users WHERE city = '{city}';"),
        (f"Which users are from {city}?", f"SELECT name FROM users WHERE city = '{city}';"),
        (f"Show all users older than {age}.", f"SELECT * FROM users WHERE age > {age};"),
        (f"Find the names of users younger than {age}.", f"SELECT name FROM users WHERE age < {age};"),
        (f"Show the {ucol} of every user.", f"SELECT {ucol} FROM users;"),
        (f"List the {pcol} of all products.", f"SELECT {pcol} FROM products;"),
        (f"Show all orders with status '{status}'.", f"SELECT * FROM orders WHERE status = '{status}';"),
        (f"List the orders whose total is greater than {total}.", f"SELECT * FROM orders WHERE total > {total};"),
        (f"Which products cost less than {price}?", f"SELECT name FROM products WHERE price < {price};"),
        (f"List products in the '{cat}' category.", f"SELECT name FROM products WHERE category = '{cat}';"),
        (f"Which products have fewer than {stock} items in stock?", f"SELECT name FROM products WHERE stock < {stock};"),
        (f"Show users who signed up after {date}.", f"SELECT name FROM users WHERE created_at > '{date}';"),
        (f"List orders placed before {date}.", f"SELECT * FROM orders WHERE created_at < '{date}';"),
        (f"Find users from {city} older than {age}.", f"SELECT name FROM users WHERE city = '{city}' AND age > {age};"),
        (f"Which products in '{cat}' cost more than {price}?",
         f"SELECT name FROM products WHERE category = '{cat}' AND price > {price};"),
        # order / limit
        (f"List users sorted by age.", "SELECT name, age FROM users ORDER BY age;"),
        (f"Show the {n} oldest users.", f"SELECT name FROM users ORDER BY age DESC LIMIT {n};"),
        (f"Show the {n} youngest users.", f"SELECT name FROM users ORDER BY age ASC LIMIT {n};"),
        (f"Show the {n} cheapest products.", f"SELECT name, price FROM products ORDER BY price ASC LIMIT {n};"),
        (f"List the {n} largest orders.", f"SELECT * FROM orders ORDER BY total DESC LIMIT {n};"),
        (f"Show the {n} most recent orders.", f"SELECT * FROM orders ORDER BY created_at DESC LIMIT {n};"),
        (f"List products ordered by price from highest to lowest.", "SELECT name, price FROM products ORDER BY price DESC;"),
        (f"List the names of users in {city} in alphabetical order.",
         f"SELECT name FROM users WHERE city = '{city}' ORDER BY name;"),
        # count
        ("How many users are there?", "SELECT COUNT(*) FROM users;"),
        (f"How many users live in {city}?", f"SELECT COUNT(*) FROM users WHERE city = '{city}';"),
        (f"Count the orders with status '{status}'.", f"SELECT COUNT(*) FROM orders WHERE status = '{status}';"),
        (f"How many products are in the '{cat}' category?", f"SELECT COUNT(*) FROM products WHERE category = '{cat}';"),
        (f"How many users are older than {age}?", f"SELECT COUNT(*) FROM users WHERE age > {age};"),
        (f"How many products are out of stock?", "SELECT COUNT(*) FROM products WHERE stock = 0;"),
        # group by
        ("How many users are there in each city?", "SELECT city, COUNT(*) FROM users GROUP BY city;"),
        ("Count the orders for each status.", "SELECT status, COUNT(*) FROM orders GROUP BY status;"),
        ("How many products are in each category?", "SELECT category, COUNT(*) FROM products GROUP BY category;"),
        ("What is the average product price per category?", "SELECT category, AVG(price) FROM products GROUP BY category;"),
        ("What is the total order amount for each user?", "SELECT user_id, SUM(total) FROM orders GROUP BY user_id;"),
        ("What is the average age of users in each city?", "SELECT city, AVG(age) FROM users GROUP BY city;"),
        # avg / max / min / sum
        ("What is the average age of users?", "SELECT AVG(age) FROM users;"),
        (f"What is the average age of users in {city}?", f"SELECT AVG(age) FROM users WHERE city = '{city}';"),
        (f"What is the average total of orders with status '{status}'?",
         f"SELECT AVG(total) FROM orders WHERE status = '{status}';"),
        (f"What is the average stock of products in the '{cat}' category?",
         f"SELECT AVG(stock) FROM products WHERE category = '{cat}';"),
        (f"What is the highest price in the '{cat}' category?", f"SELECT MAX(price) FROM products WHERE category = '{cat}';"),
        ("What is the largest order total?", "SELECT MAX(total) FROM orders;"),
        ("Who is the oldest user?", "SELECT name FROM users ORDER BY age DESC LIMIT 1;"),
        ("What is the lowest product price?", "SELECT MIN(price) FROM products;"),
        (f"What is the sum of all orders with status '{status}'?", f"SELECT SUM(total) FROM orders WHERE status = '{status}';"),
        ("What is the total stock of all products?", "SELECT SUM(stock) FROM products;"),
        # join
        (f"List the orders placed by users from {city}.",
         f"SELECT orders.* FROM orders JOIN users ON orders.user_id = users.id WHERE users.city = '{city}';"),
        (f"Show the order totals of the user named '{name}'.",
         f"SELECT orders.total FROM orders JOIN users ON orders.user_id = users.id WHERE users.name = '{name}';"),
        (f"How many orders has the user named '{name}' placed?",
         f"SELECT COUNT(*) FROM orders JOIN users ON orders.user_id = users.id WHERE users.name = '{name}';"),
        ("List each user's name with the total of their orders.",
         "SELECT users.name, SUM(orders.total) FROM users JOIN orders ON orders.user_id = users.id GROUP BY users.name;"),
        (f"Which users have an order with status '{status}'?",
         f"SELECT DISTINCT users.name FROM users JOIN orders ON orders.user_id = users.id WHERE orders.status = '{status}';"),
        (f"What is the total amount spent by users from {city}?",
         f"SELECT SUM(orders.total) FROM orders JOIN users ON orders.user_id = users.id WHERE users.city = '{city}';"),
    ]
    return r.choice(t)


def build_dataset(n, seed, make_pair=None, held_out=None):
    """n distinct (question, answer) pairs drawn with make_pair(rng) (default: the SQL templates),
    skipping the held-out questions."""
    make_pair = make_pair or templates
    r = random.Random(seed)
    held = set(HELD_OUT if held_out is None else held_out)
    pairs, seen = [], set()
    tries = 0
    while len(pairs) < n and tries < 100 * n:
        tries += 1
        q, sql = make_pair(r)
        if q in held or q in seen:
            continue
        seen.add(q)
        pairs.append((q, sql))
    return pairs


def messages(q, with_system):
    m = [{"role": "system", "content": SYSTEM}] if with_system else []
    return m + [{"role": "user", "content": q}]


def encode(tok, q, sql, with_system):
    prompt = tok.apply_chat_template(messages(q, with_system), tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template(messages(q, with_system) + [{"role": "assistant", "content": sql}], tokenize=False)
    assert full.startswith(prompt), (prompt, full)
    # Train on the SQL and its closing <|im_end|>; drop the template's trailing "\n" after it.
    answer = full[len(prompt):]
    end = answer.index("<|im_end|>") + len("<|im_end|>")
    answer = answer[:end]
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    a_ids = tok(answer, add_special_tokens=False)["input_ids"]
    return p_ids + a_ids, [-100] * len(p_ids) + a_ids, prompt + answer


def greedy(model, tok, q, with_system=True):
    prompt = tok.apply_chat_template(messages(q, with_system), tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW,
                             do_sample=False, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                             pad_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()


def q8_0_roundtrip(w):
    """llama.cpp Q8_0 along each row: blocks of 32, d = absmax/127 (stored f16), q = round(x/d) int8."""
    rows, cols = w.shape
    assert cols % 32 == 0
    b = w.reshape(rows, cols // 32, 32).float()
    d = (b.abs().amax(-1, keepdim=True) / 127.0).half().float()
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(b * inv).clamp(-127, 127)
    return (q * d).reshape(rows, cols).to(w.dtype)


def is_sql(s):
    return s.upper().startswith("SELECT") and " FROM " in f" {s.upper()} "


def default_gguf_path():
    return sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser(
        "~/.cache/expert-runtime/SmolLM2-135M-Instruct.Q4_1.gguf")


def write_json(path, obj):
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=2)
        fh.write("\n")


def train_expert(path, out_dir, make_pair, held_out, manifest, looks_right, kind, generated_by, steps=STEPS):
    """Trains and evaluates one LoRA expert; the SQL expert's main() and other training scripts
    (scripts/train_shell_lora.py) share it.

    path: the base GGUF; out_dir: where the adapter, manifest.json and eval.json go;
    make_pair(rng) -> (question, answer); held_out: questions kept out of training and evaluated;
    manifest: the dict written as manifest.json; looks_right(answer) -> bool: the format check
    that every LoRA answer (f32 and Q8_0 base) must pass, else the script exits non-zero;
    kind: what looks_right accepts, for messages ("SQL"); generated_by: eval.json's
    generated_by."""
    t0 = time.time()
    random.seed(SEED)
    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    d, f = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    base = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    print(f"loaded {path} in {time.time() - t0:.1f}s")

    # Base answers, before PEFT wraps the model in place.
    base_answers = [greedy(base, tok, q) for q in held_out]
    q8_base = copy.deepcopy(base)
    with torch.no_grad():
        for name, mod in q8_base.named_modules():
            if isinstance(mod, torch.nn.Linear) and ".layers." in name:
                mod.weight.copy_(q8_0_roundtrip(mod.weight))
    clean_base = copy.deepcopy(base)

    pairs = build_dataset(N_TRAIN, SEED, make_pair, held_out)
    data = [encode(tok, q, a, i % 2 == 0) for i, (q, a) in enumerate(pairs)]
    print(f"{len(pairs)} training pairs; example rendered text:\n{data[0][2]!r}\n{data[1][2]!r}")

    cfg = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM", bias="none",
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = get_peft_model(base, cfg)
    model.print_trainable_parameters()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / WARMUP) * max(0.05, 1.0 - s / steps))
    pad = tok.convert_tokens_to_ids("<|im_end|>")
    order, pos = [], 0
    rng = random.Random(SEED + 1)
    t_train = time.time()
    model.train()
    losses = []
    for step in range(steps):
        batch = []
        for _ in range(BATCH):
            if pos >= len(order):
                order, pos = list(range(len(data))), 0
                rng.shuffle(order)
            batch.append(data[order[pos]])
            pos += 1
        L = max(len(b[0]) for b in batch)
        ids = torch.tensor([b[0] + [pad] * (L - len(b[0])) for b in batch])
        labels = torch.tensor([b[1] + [-100] * (L - len(b[1])) for b in batch])
        mask = torch.tensor([[1] * len(b[0]) + [0] * (L - len(b[0])) for b in batch])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
        if step % 4 == 0 or step == steps - 1:
            print(f"step {step:4d} loss {loss.item():.4f} ({time.time() - t_train:.0f}s)", flush=True)
    train_s = time.time() - t_train
    final_loss = sum(losses[-10:]) / 10
    print(f"trained {steps} steps x {BATCH} in {train_s:.0f}s; mean loss of the last 10 steps {final_loss:.4f}")

    # Save, then rewrite the adapter tensors as float16 (same keys) and fix the config.
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    card = os.path.join(out_dir, "README.md")  # PEFT's boilerplate model card; experts/README.md documents this
    if os.path.exists(card):
        os.remove(card)
    st = os.path.join(out_dir, "adapter_model.safetensors")
    tensors = {k: v.to(torch.float16).contiguous() for k, v in load_file(st).items()}
    save_file(tensors, st, metadata={"format": "pt"})
    cfg_path = os.path.join(out_dir, "adapter_config.json")
    with open(cfg_path) as fh:
        acfg = json.load(fh)
    acfg["base_model_name_or_path"] = BASE_ID
    acfg["target_modules"] = sorted(acfg["target_modules"])  # PEFT writes a set in hash order
    with open(cfg_path, "w") as fh:
        json.dump(acfg, fh, indent=2, sort_keys=True)
        fh.write("\n")
    write_json(os.path.join(out_dir, "manifest.json"), manifest)

    # Evaluate the fp16 adapter as saved, on the f32 base and on the Q8_0-round-tripped base.
    lora = PeftModel.from_pretrained(clean_base, out_dir).eval()
    lora_answers = [greedy(lora, tok, q) for q in held_out]
    lora_nosys = [greedy(lora, tok, q, with_system=False) for q in held_out]
    lora_q8 = PeftModel.from_pretrained(q8_base, out_dir).eval()
    q8_answers = [greedy(lora_q8, tok, q) for q in held_out]
    rows = []
    for i, q in enumerate(held_out):
        rows.append({"question": q, "base": base_answers[i], "lora": lora_answers[i],
                     "lora_no_system": lora_nosys[i], "lora_q8_0_base": q8_answers[i]})
        print(f"\nQ: {q}\n  base:             {base_answers[i]!r}\n  lora (f32 base):  {lora_answers[i]!r}"
              f"\n  lora (no system): {lora_nosys[i]!r}\n  lora (Q8_0 base): {q8_answers[i]!r}")
    ev = {
        "generated_by": generated_by,
        "base_model": BASE_ID,
        "base_weights": "SmolLM2-135M-Instruct.Q4_1.gguf dequantized to f32 (transformers)",
        "system": SYSTEM,
        "decoding": f"greedy, max {MAX_NEW} new tokens, chat template with add_generation_prompt=True",
        "train": {"pairs": len(pairs), "steps": steps, "batch": BATCH, "lr": LR, "seed": SEED,
                  "final_loss": round(final_loss, 4), "train_seconds": round(train_s)},
        "held_out": rows,
    }
    write_json(os.path.join(out_dir, "eval.json"), ev)
    for n in sorted(os.listdir(out_dir)):
        print(f"{n}: {os.path.getsize(os.path.join(out_dir, n))} bytes")
    print(f"total {time.time() - t0:.0f}s")
    bad = [r["question"] for r in rows if not (looks_right(r["lora"]) and looks_right(r["lora_q8_0_base"]))]
    if bad:
        sys.exit(f"LoRA answers are not {kind} for: {bad}")
    if sum(looks_right(a) for a in base_answers) > 0:
        print(f"warning: some base answers are {kind}-shaped", [a for a in base_answers if looks_right(a)])
    return ev


def main():
    train_expert(default_gguf_path(), OUT_DIR, templates, HELD_OUT, MANIFEST, is_sql, "SQL",
                 "scripts/train_sql_lora.py")

if __name__ == "__main__":
    main()
