// `npm run bench:structured [-- --quick] [-- --threads N] [-- --repeat N] [-- --wait-idle S]`:
// what grammar-constrained decoding costs (issue: structured output and function calling).
//
// Models: SmolLM2-135M-Instruct Q4_1 GGUF (49k vocabulary) and, unless --quick, the
// Qwen3-0.6B-shaped random model's Q8_0 GGUF (152k vocabulary, scripts/make_bench_model.py).
//
// Each measurement runs in a fresh child process (this file with --child), after an idle second:
//   1. decode tok/s at batch 1: one session, a fixed 64-token prompt (seeded random ids), 129
//      greedy tokens, tok/s from the first to the last token; free vs constrained by SCHEMA (an
//      object holding an array of at least 500 strings, so it cannot end within the run). The
//      overhead is 1 − constrained/free: what the masks cost a decode step (they are computed on
//      a worker while the forward pass runs). Also at batch 1: WATCHED, the same array with
//      `uniqueItems: true` (each item checked against the earlier ones).
//   2. aggregate decode tok/s at batch 16: 16 sessions (different prompts), 65 tokens each, free
//      vs all constrained (window method of benches/common.mjs `aggregate`).
//   3. compile time: `timings.formatMs` of 1-token requests (median over the 12 schemas of
//      COMPILE_SCHEMAS, each new to the runtime), and of the first constrained request after load
//      separately (it also builds the token trie once).
//   4. the peer: node-llama-cpp on the same GGUF, same prompt and threads, batch 1, free vs
//      constrained by its JSON-schema grammar (GBNF) of the same SCHEMA.
//
// Results: a table on stdout, JSON under <cacheDir>/bench-results/structured-<date>.json.
import { createRequire } from 'node:module'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import {
  aggregate, assertBuilt, benchMain, concurrent, fmt, gitRev, loadAtStart, loadSummary, machineInfo, machineName, nodeLlamaCppVersion,
  parseBenchArgs, randomTokens, resultsPath, root, runChild, runInfo, waitIdleThenSay, warmPageCache, writeResults,
} from './common.mjs'

const require = createRequire(import.meta.url)
const PROMPT_LEN = 64
const DECODE = 128
const BATCH = 16
const BATCH_DECODE = 64
const CONTEXT = 1024
const TOKEN_RANGE = [1000, 30000]

const SCHEMA = {
  type: 'object',
  properties: { items: { type: 'array', items: { type: 'string' }, minItems: 500 } },
  required: ['items'],
  additionalProperties: false,
}

/**
 * The same array with `uniqueItems: true`: every item is checked against the earlier ones (the
 * JSON watch), and each boundary between two items looks ahead one mask.
 */
const WATCHED = {
  type: 'object',
  properties: {
    items: { type: 'array', items: { type: 'string' }, minItems: 500, uniqueItems: true },
  },
  required: ['items'],
  additionalProperties: false,
}

/** Twelve small, distinct schemas (compile time). */
const COMPILE_SCHEMAS = Array.from({ length: 12 }, (_, i) => ({
  type: 'object',
  properties: {
    [`id${i}`]: { type: 'integer', minimum: i, maximum: 1000 + i },
    name: { type: 'string', maxLength: 10 + i },
    tags: { type: 'array', items: { enum: ['a', 'b', `c${i}`] }, maxItems: 3 },
    when: { type: 'string', format: 'date' },
    ...(i % 2 ? { nested: { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'] } } : {}),
  },
  required: [`id${i}`, 'name'],
  additionalProperties: false,
}))

const tokens = (seed, n) => randomTokens(seed, n, TOKEN_RANGE)
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]

function parseArgs(argv) {
  return parseBenchArgs(argv, { usage: 'node benches/structured.mjs [--quick] [--threads N] [--repeat N] [--wait-idle S] [--out FILE]' })
}

// ------------------------------------------------------------------------------------------
// children
// ------------------------------------------------------------------------------------------

/** tok/s from the first to the last of `times`. */
const tps = (times) => (times.length > 1 ? (times.length - 1) / ((times[times.length - 1] - times[0]) / 1000) : null)

async function childOurs(spec) {
  const { Runtime } = require(join(root, 'dist', 'index.js'))
  const rt = await Runtime.load(spec.path, { threads: spec.threads, contextLength: CONTEXT })
  const format = { responseFormat: { type: 'json_schema', schema: SCHEMA } }
  const out = {}
  // 3. compile time (first, so the first constrained request is the first of the process).
  const formatMs = async (opts, seed) => (await rt.createSession().complete({ tokens: tokens(seed, 16) }, { temperature: 0, maxTokens: 1, ...opts })).timings.formatMs
  out.firstConstrainedMs = await formatMs(format, 200)
  const compiled = []
  for (const [i, schema] of COMPILE_SCHEMAS.entries()) compiled.push(await formatMs({ responseFormat: { type: 'json_schema', schema } }, 300 + i))
  out.compileMs = median(compiled)
  out.compileMsAll = compiled

  // 1. batch 1, free and constrained.
  const watched = { responseFormat: { type: 'json_schema', schema: WATCHED } }
  for (const [key, opts] of [['free', {}], ['constrained', format], ['watched', watched]]) {
    const s = rt.createSession()
    const times = []
    const stream = s.generate({ tokens: tokens(1, PROMPT_LEN) }, { temperature: 0, maxTokens: DECODE + 1, ...opts })
    for await (const _ of stream) times.push(performance.now())
    out[`${key}1`] = { tps: tps(times), tokens: times.length, finish: stream.result?.finishReason }
    s.dispose()
  }
  // 2. batch 16.
  for (const [key, opts] of [['free', {}], ['constrained', format]]) {
    const sessions = Array.from({ length: BATCH }, () => rt.createSession())
    const run = await concurrent(BATCH, (i) => sessions[i].generate({ tokens: tokens(10 + i, PROMPT_LEN) }, { temperature: 0, maxTokens: BATCH_DECODE, ...opts }))
    out[`${key}${BATCH}`] = aggregate(run)
    for (const s of sessions) s.dispose()
  }
  await rt.dispose()
  return out
}

async function childLlama(spec) {
  const { getLlama, LlamaGrammarEvaluationState } = await import('node-llama-cpp')
  const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error', maxThreads: 0 })
  const model = await llama.loadModel({ modelPath: spec.path })
  const ctx = await model.createContext({ contextSize: CONTEXT, batchSize: 512, threads: { ideal: spec.threads, min: spec.threads } })
  const seq = ctx.getSequence()
  const grammar = await llama.createGrammarForJsonSchema(SCHEMA)
  const out = {}
  for (const key of ['free', 'constrained']) {
    const times = []
    const opts = { temperature: 0, yieldEogToken: true }
    if (key === 'constrained') opts.grammarEvaluationState = new LlamaGrammarEvaluationState({ model, grammar })
    for await (const _ of seq.evaluate(tokens(1, PROMPT_LEN), opts)) {
      times.push(performance.now())
      if (times.length >= DECODE + 1) break
    }
    await seq.clearHistory()
    out[`${key}1`] = { tps: tps(times), tokens: times.length }
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

async function parent(args) {
  assertBuilt()
  const load0 = loadAtStart()
  const { cacheDir, ensureSmolLM2 } = await import(join(root, 'scripts', 'assets.mjs'))
  const models = [{ key: 'smollm2', label: 'SmolLM2-135M Q4_1 (49k vocab)', path: ensureSmolLM2() }]
  if (!args.quick) {
    const { ensureQwen3Bench } = await import(join(root, 'scripts', 'bench-model.mjs'))
    models.push({ key: 'qwen3', label: 'Qwen3-0.6B-rand Q8_0 (152k vocab)', path: ensureQwen3Bench().q8_0 })
  }
  const results = { ...runInfo(args), models: {} }
  for (const m of models) {
    await warmPageCache(m.path)
    const ours = []
    const peer = []
    for (let rep = 0; rep < args.repeat; rep++) {
      await waitIdleThenSay(args, rep, `expert-runtime ${m.key}`)
      ours.push(spawnChild({ engine: 'ours', path: m.path, threads: args.threads }))
      await waitIdleThenSay(args, rep, `node-llama-cpp ${m.key}`)
      peer.push(spawnChild({ engine: 'llama', path: m.path, threads: args.threads }))
    }
    results.models[m.key] = { label: m.label, ours, peer }
  }
  const load1 = loadAtStart()
  results.machine = machineInfo(load0, load1)

  const best = (runs, f) => Math.max(...runs.map(f).filter((x) => x != null))
  const least = (runs, f) => Math.min(...runs.map(f).filter((x) => x != null))
  console.log(`\nexpert-runtime ${gitRev() ?? ''} vs node-llama-cpp ${nodeLlamaCppVersion()}, ${machineName()}, ${args.threads} threads, best of ${args.repeat}`)
  console.log('model                               | batch | free tok/s | constrained | mask overhead | llama.cpp free | llama.cpp grammar | ours/llama (constrained)')
  for (const m of models) {
    const { ours, peer } = results.models[m.key]
    const f1 = best(ours, (r) => r.free1.tps)
    const c1 = best(ours, (r) => r.constrained1.tps)
    const lf = best(peer, (r) => r.free1.tps)
    const lc = best(peer, (r) => r.constrained1.tps)
    const f16 = best(ours, (r) => r.free16.tps)
    const c16 = best(ours, (r) => r.constrained16.tps)
    const pct = (a, b) => `${fmt((1 - b / a) * 100, 1)}%`
    console.log(`${m.label.padEnd(35)} | 1     | ${fmt(f1).padStart(10)} | ${fmt(c1).padStart(11)} | ${pct(f1, c1).padStart(13)} | ${fmt(lf).padStart(14)} | ${fmt(lc).padStart(17)} | ${fmt(c1 / lc, 2)}x`)
    const w1 = best(ours, (r) => r.watched1?.tps)
    console.log(`${''.padEnd(35)} | 1     | unique items ${fmt(w1)} tok/s: overhead ${pct(f1, w1)} over free`)
    console.log(`${''.padEnd(35)} | ${BATCH}    | ${fmt(f16).padStart(10)} | ${fmt(c16).padStart(11)} | ${pct(f16, c16).padStart(13)} |`)
    console.log(`${''.padEnd(35)}   schema compile ${fmt(least(ours, (r) => r.compileMs), 2)} ms (median of ${COMPILE_SCHEMAS.length}); first constrained request after load ${fmt(least(ours, (r) => r.firstConstrainedMs), 1)} ms (with the token trie)`)
  }
  console.log(loadSummary(load0, load1))
  writeResults(args.out ?? resultsPath(cacheDir, 'structured'), results)
}

await benchMain(parseArgs(process.argv.slice(2)), parent, (spec) => (spec.engine === 'ours' ? childOurs(spec) : childLlama(spec)))
