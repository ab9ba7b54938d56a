// `npm run bench:speculative [-- --quick] [-- --threads N] [-- --repeat N] [-- --wait-idle S]`:
// what speculative decoding by prompt lookup (`speculative: { type: 'ngram' }`) gains, and what it
// costs where it cannot help.
//
// Model: Qwen2.5-Coder-0.5B-Instruct Q4_K_M (qwen2 family; DESIGN.md §5), or with --quick
// SmolLM2-135M-Instruct Q4_1. Tasks, each a ChatML prompt tokenized once (parse special tokens)
// and given to both engines as the same token ids, greedy:
//   1. code edit: rewrite a given 323-token JavaScript function with one change (rename an
//      option everywhere), up to 400 tokens;
//   2. chat: six free-form questions whose answers do not copy the prompt, 128 tokens each.
// For each task: decode tok/s (first to last token, summed over the task's prompts) with plain
// decoding and with `speculative: { type: 'ngram' }` (defaults: up to 8 drafts, 3- to 2-token
// matches), in the same child process, and whether both runs gave the same tokens. The peer:
// node-llama-cpp on the same GGUF and token ids, plain and with its InputLookupTokenPredictor
// (prompt lookup, 8 tokens at most), same threads.
//
// Results: a table on stdout, JSON under <cacheDir>/bench-results/speculative-<date>.json.
import { createRequire } from 'node:module'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import {
  assertBuilt, benchMain, fmt, gitRev, loadAtStart, loadSummary, machineInfo, machineName, nodeLlamaCppVersion, parseBenchArgs, resultsPath, root,
  runChild, runInfo, waitIdleThenSay, warmPageCache, writeResults,
} from './common.mjs'

const require = createRequire(import.meta.url)
const CONTEXT = 4096
const MAX_DRAFT = 8

const FUNCTION = `export function summarizeOrders(orders, options = {}) {
  const { currency = 'EUR', taxRate = 0.2, minQuantity = 1, includeRefunds = false } = options
  const totals = new Map()
  let grandTotal = 0
  let skipped = 0
  for (const order of orders) {
    if (!order || !Array.isArray(order.lines)) {
      skipped += 1
      continue
    }
    if (order.status === 'refunded' && !includeRefunds) continue
    let orderTotal = 0
    for (const line of order.lines) {
      if (line.quantity < minQuantity) continue
      const price = Number(line.unitPrice)
      if (!Number.isFinite(price)) throw new Error(\`bad price in order \${order.id}\`)
      orderTotal += price * line.quantity
    }
    const tax = orderTotal * taxRate
    const customer = order.customerId ?? 'anonymous'
    totals.set(customer, (totals.get(customer) ?? 0) + orderTotal + tax)
    grandTotal += orderTotal + tax
  }
  const customers = [...totals.entries()]
    .map(([id, total]) => ({ id, total: Math.round(total * 100) / 100 }))
    .sort((a, b) => b.total - a.total)
  return {
    currency,
    customers,
    grandTotal: Math.round(grandTotal * 100) / 100,
    skipped,
  }
}
`

const TASKS = [
  {
    key: 'code-edit',
    label: 'code edit (323-token function)',
    maxTokens: 400,
    prompts: [
      `Rewrite the following JavaScript function so that the option taxRate is renamed to vatRate everywhere. Keep everything else exactly the same. Output only the code.\n\n${FUNCTION}`,
    ],
  },
  {
    key: 'chat',
    label: 'chat (6 free-form questions)',
    maxTokens: 128,
    prompts: [
      'What are three good habits for writing maintainable code?',
      'Explain the difference between a process and a thread.',
      'Suggest a name for a coffee shop run by robots, and say why.',
      'Why do hash tables have average constant-time lookups?',
      'Give me a packing list for a weekend hiking trip.',
      'How does public-key cryptography let two strangers share a secret?',
    ],
  },
]

const chatml = (user) => `<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n${user}<|im_end|>\n<|im_start|>assistant\n`

function parseArgs(argv) {
  return parseBenchArgs(argv, { usage: 'node benches/speculative.mjs [--quick] [--threads N] [--repeat N] [--wait-idle S] [--out FILE]' })
}

// ------------------------------------------------------------------------------------------
// children: each returns, per task, per mode, the tokens and decode seconds of every prompt
// ------------------------------------------------------------------------------------------

const span = (times) => (times.length > 1 ? (times[times.length - 1] - times[0]) / 1000 : 0)

async function childOurs(spec) {
  const { Runtime } = require(join(root, 'dist', 'index.js'))
  const rt = await Runtime.load(spec.path, { threads: spec.threads, contextLength: CONTEXT })
  const out = { prompts: {}, runs: {} }
  // Warm-up: one short request.
  await rt.createSession().complete('Hi', { temperature: 0, maxTokens: 4 })
  for (const task of TASKS) {
    const ids = task.prompts.map((p) => rt.tokenize(chatml(p), { addSpecialTokens: false, parseSpecialTokens: true }))
    out.prompts[task.key] = ids
    for (const [mode, speculative] of [['plain', undefined], ['ngram', { type: 'ngram', maxDraft: MAX_DRAFT }]]) {
      const runs = []
      for (const tokens of ids) {
        const s = rt.createSession()
        const times = []
        const got = []
        const stream = s.generate({ tokens }, { temperature: 0, maxTokens: task.maxTokens, speculative })
        for await (const c of stream) {
          times.push(performance.now())
          got.push(c.tokenId)
        }
        runs.push({ tokens: got, seconds: span(times), draft: stream.result.usage.draftTokens, accepted: stream.result.usage.acceptedDraftTokens })
        s.dispose()
      }
      out.runs[`${task.key}/${mode}`] = runs
    }
  }
  await rt.dispose()
  return out
}

async function childLlama(spec) {
  const { getLlama, InputLookupTokenPredictor } = await import('node-llama-cpp')
  const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error', maxThreads: 0 })
  const model = await llama.loadModel({ modelPath: spec.path })
  const ctx = await model.createContext({ contextSize: CONTEXT, sequences: 2, batchSize: 512, threads: { ideal: spec.threads, min: spec.threads } })
  const seqs = {
    plain: ctx.getSequence(),
    ngram: ctx.getSequence({ tokenPredictor: new InputLookupTokenPredictor({ predictionLength: { max: MAX_DRAFT } }) }),
  }
  const out = { runs: {} }
  for (const task of TASKS) {
    for (const mode of ['plain', 'ngram']) {
      const seq = seqs[mode]
      const runs = []
      for (const tokens of spec.prompts[task.key]) {
        const times = []
        const got = []
        for await (const t of seq.evaluate(tokens, { temperature: 0, yieldEogToken: true })) {
          times.push(performance.now())
          got.push(t)
          if (model.isEogToken(t) || got.length >= task.maxTokens) break
        }
        await seq.clearHistory()
        runs.push({ tokens: got, seconds: span(times) })
      }
      out.runs[`${task.key}/${mode}`] = runs
    }
  }
  await ctx.dispose()
  await model.dispose()
  await llama.dispose()
  return out
}

// ------------------------------------------------------------------------------------------
// parent
// ------------------------------------------------------------------------------------------

const spawnChild = (spec) => runChild(fileURLToPath(import.meta.url), spec, `${spec.engine} ${spec.path}`)

/** Decode tok/s over a task's prompts: tokens after each first one over the summed spans. */
function rate(runs) {
  const n = runs.reduce((a, r) => a + Math.max(0, r.tokens.length - 1), 0)
  const s = runs.reduce((a, r) => a + r.seconds, 0)
  return s > 0 ? n / s : null
}

async function parent(args) {
  assertBuilt()
  const load0 = loadAtStart()
  const assets = await import(join(root, 'scripts', 'assets.mjs'))
  const model = args.quick
    ? { key: 'smollm2', label: 'SmolLM2-135M-Instruct Q4_1', path: assets.ensureSmolLM2() }
    : { key: 'qwen25-coder', label: 'Qwen2.5-Coder-0.5B-Instruct Q4_K_M', path: await assets.ensureQwen25Coder() }
  await warmPageCache(model.path)
  const ours = []
  const peer = []
  let prompts = null
  for (let rep = 0; rep < args.repeat; rep++) {
    await waitIdleThenSay(args, rep, 'expert-runtime')
    const o = spawnChild({ engine: 'ours', path: model.path, threads: args.threads })
    prompts ??= o.prompts
    ours.push(o)
    await waitIdleThenSay(args, rep, 'node-llama-cpp')
    peer.push(spawnChild({ engine: 'llama', path: model.path, threads: args.threads, prompts }))
  }
  const load1 = loadAtStart()
  const results = { ...runInfo(args), model, maxDraft: MAX_DRAFT, ours, peer, machine: machineInfo(load0, load1) }

  const best = (runs, key) => Math.max(...runs.map((r) => rate(r.runs[key])).filter((x) => x != null))
  console.log(`\nexpert-runtime ${gitRev() ?? ''} vs node-llama-cpp ${nodeLlamaCppVersion()}, ${model.label}, ${machineName()}, ${args.threads} threads, best of ${args.repeat}`)
  console.log('task                            | ours plain | ours ngram | speed-up | same tokens | accepted/drafted | llama plain | llama lookup | llama speed-up | ours/llama (lookup)')
  for (const task of TASKS) {
    const op = best(ours, `${task.key}/plain`)
    const on = best(ours, `${task.key}/ngram`)
    const lp = best(peer, `${task.key}/plain`)
    const ln = best(peer, `${task.key}/ngram`)
    const same = ours.every((r) => r.runs[`${task.key}/plain`].every((p, i) => JSON.stringify(p.tokens) === JSON.stringify(r.runs[`${task.key}/ngram`][i].tokens)))
    const spec = ours[0].runs[`${task.key}/ngram`]
    const acc = spec.reduce((a, r) => a + r.accepted, 0)
    const dr = spec.reduce((a, r) => a + r.draft, 0)
    const n = spec.reduce((a, r) => a + r.tokens.length, 0)
    results[task.key] = { oursPlain: op, oursNgram: on, llamaPlain: lp, llamaLookup: ln, sameTokens: same, accepted: acc, drafted: dr, tokens: n }
    console.log(
      `${task.label.padEnd(31)} | ${fmt(op).padStart(10)} | ${fmt(on).padStart(10)} | ${(fmt(on / op, 2) + 'x').padStart(8)} | ${String(same).padStart(11)} | ${`${acc}/${dr} (${n} tok)`.padStart(16)} | ${fmt(lp).padStart(11)} | ${fmt(ln).padStart(12)} | ${(fmt(ln / lp, 2) + 'x').padStart(14)} | ${fmt(on / ln, 2)}x`,
    )
  }
  console.log(loadSummary(load0, load1))
  writeResults(args.out ?? resultsPath(assets.cacheDir, 'speculative'), results)
}

await benchMain(parseArgs(process.argv.slice(2)), parent, (spec) => (spec.engine === 'ours' ? childOurs(spec) : childLlama(spec)))
