// `npm run bench:routing [-- --quick] [-- --threads N] [-- --repeat N] [-- --wait-idle S]`:
// what routing costs (issue: the runtime picks the experts for each request).
//
// Each measurement runs in a fresh child process (this file with --child):
//   1. keyword-only routing: the tiny qwen3-tiny fixture with 100 experts loaded, each a copy
//      of __test__/fixtures/adapters/lora with its own manifest (6 keywords and 2 exclude
//      keywords drawn, seeded, from a 400-word vocabulary of three-syllable words; no
//      examples, so no embedding):
//      `rt.route(q)` latency over 2,000 calls (--quick 500) cycling through 20 queries of ~12
//      words, median and p99 from performance.now() around each awaited call (the whole JS →
//      engine → JS round trip; target median < 0.1 ms).
//   2. embedding routing on SmolLM2-135M-Instruct Q4_1 with experts/sql-smollm2 and
//      experts/shell-smollm2 (both carry routing examples, so every route embeds its query):
//      `rt.route(q)` for a query of 20 tokens, (a) on the idle engine and (b) while 8 sessions
//      decode (greedy, maxTokens 160, --quick 96), back to back for the middle of their run;
//      and the 8 sessions' aggregate decode tok/s in a window without routing vs a window of
//      the same length with it (the ratio is the routing's cost to running decodes).
import { cpSync, existsSync, mkdirSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import {
  assertBuilt, benchMain, fmt, gitRev, loadAtStart, loadSummary, machineInfo, machineName, mulberry32, parseBenchArgs, resultsPath,
  root, runChild, runInfo, waitIdleThenSay, writeResults,
} from './common.mjs'

const N_MANIFESTS = 100
const ROUTED_SESSIONS = 8

function parseArgs(argv) {
  return parseBenchArgs(argv, { usage: 'node benches/routing.mjs [--quick] [--threads N] [--repeat N] [--wait-idle S] [--out FILE]' })
}

// Keyword-like words built from syllables (varied first and last letters, as real keywords have).
const SYLLABLES = ['ka', 'lo', 'mi', 'net', 'ros', 'ta', 'ven', 'qu', 'dar', 'pel', 'sor', 'bi', 'gan', 'te', 'ul', 'ix']
const VOCAB = Array.from({ length: 400 }, (_, i) => SYLLABLES[i % 16] + SYLLABLES[Math.floor(i / 16) % 16] + SYLLABLES[(i * 7 + 3) % 16])

/** 100 expert directories: the fixture LoRA with generated manifests. */
function ensureManifests(dir) {
  const r = mulberry32(7)
  const pick = (n) => Array.from({ length: n }, () => VOCAB[Math.floor(r() * VOCAB.length)])
  const src = join(root, '__test__', 'fixtures', 'adapters', 'lora')
  const dirs = []
  for (let i = 0; i < N_MANIFESTS; i++) {
    const d = join(dir, `expert-${i}`)
    if (!existsSync(d)) {
      mkdirSync(d, { recursive: true })
      cpSync(join(src, 'adapter_config.json'), join(d, 'adapter_config.json'))
      cpSync(join(src, 'adapter_model.safetensors'), join(d, 'adapter_model.safetensors'))
    }
    const manifest = { name: `e${i}`, routing: { keywords: pick(6), exclude_keywords: pick(2), priority: 1 + (i % 3) } }
    writeFileSync(join(d, 'manifest.json'), JSON.stringify(manifest))
    dirs.push(d)
  }
  const queries = Array.from({ length: 20 }, () => [...pick(3), 'and', 'some', 'other', 'words', 'in', 'a', 'question', 'here'].sort(() => r() - 0.5).join(' '))
  return { dirs, queries }
}

const quantile = (xs, q) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor(q * s.length))]
}

async function keywordChild(spec) {
  const { Runtime } = await import(join(root, 'dist', 'index.js'))
  const rt = await Runtime.load(join(root, '__test__', 'fixtures', 'qwen3-tiny'), { threads: spec.threads })
  for (const d of spec.dirs) await rt.loadExpert(d)
  const times = []
  let chosen = 0
  for (let i = 0; i < 200; i++) await rt.route(spec.queries[i % spec.queries.length]) // warm-up
  for (let i = 0; i < spec.calls; i++) {
    const t0 = performance.now()
    const d = await rt.route(spec.queries[i % spec.queries.length])
    times.push(performance.now() - t0)
    chosen += d.experts.length
  }
  await rt.dispose()
  return { experts: spec.dirs.length, calls: spec.calls, medianMs: quantile(times, 0.5), p99Ms: quantile(times, 0.99), meanChosen: chosen / spec.calls }
}

async function embeddingChild(spec) {
  const { Runtime } = await import(join(root, 'dist', 'index.js'))
  const rt = await Runtime.load(spec.model, { threads: spec.threads })
  await rt.loadExpert(join(root, 'experts', 'sql-smollm2'))
  await rt.loadExpert(join(root, 'experts', 'shell-smollm2'))
  const query = 'How many orders were shipped to customers in Berlin during the last two weeks of March?'
  const queryTokens = rt.tokenize(query).length
  const route = async () => {
    const t0 = performance.now()
    const d = await rt.route(query)
    if (d.genericSimilarity == null) throw new Error('the route did not embed its query')
    return performance.now() - t0
  }
  for (let i = 0; i < 5; i++) await route()
  const idle = []
  for (let i = 0; i < spec.idleCalls; i++) idle.push(await route())

  // 8 sessions decode; stamp every token.
  const stamps = []
  const prompts = ['Write a long story about a lighthouse keeper.', 'Describe the water cycle in detail.', 'Explain how a bicycle works, step by step.',
    'Tell me about the history of tea.', 'Write a letter to a friend about a trip to the mountains.', 'Describe a busy market in the morning.',
    'Explain why the seasons change.', 'Write a long poem about the sea.']
  const runs = prompts.slice(0, ROUTED_SESSIONS).map(async (p) => {
    const s = rt.createSession()
    for await (const _ of s.generate(p, { temperature: 0, maxTokens: spec.maxTokens })) stamps.push(performance.now())
    s.dispose()
  })
  // Wait until every session decodes, then a window without routing, then one with it.
  while (stamps.length < ROUTED_SESSIONS * 8) await new Promise((r) => setTimeout(r, 5))
  const w0 = performance.now()
  await new Promise((r) => setTimeout(r, spec.windowMs))
  const w1 = performance.now()
  const busy = []
  while (performance.now() - w1 < spec.windowMs) busy.push(await route())
  const w2 = performance.now()
  await Promise.all(runs)
  const count = (a, b) => stamps.filter((t) => t > a && t <= b).length
  const before = count(w0, w1) / ((w1 - w0) / 1e3)
  const during = count(w1, w2) / ((w2 - w1) / 1e3)
  await rt.dispose()
  return {
    queryTokens,
    idleMedianMs: quantile(idle, 0.5),
    busyMedianMs: quantile(busy, 0.5),
    busyP90Ms: quantile(busy, 0.9),
    routesDuringWindow: busy.length,
    decodeTokPerSecBefore: before,
    decodeTokPerSecDuring: during,
    windowMs: spec.windowMs,
    totalTokens: stamps.length,
  }
}

async function child(spec) {
  return spec.kind === 'keywords' ? keywordChild(spec) : embeddingChild(spec)
}

async function parent(args) {
  assertBuilt()
  const { cacheDir, ensureSmolLM2 } = await import(join(root, 'scripts', 'assets.mjs'))
  const { dirs, queries } = ensureManifests(join(cacheDir, 'bench-routing-experts'))
  const model = ensureSmolLM2()
  const me = fileURLToPath(import.meta.url)
  const load0 = loadAtStart()
  const kw = []
  const emb = []
  for (let rep = 0; rep < args.repeat; rep++) {
    await waitIdleThenSay(args, rep, `keyword routing, ${N_MANIFESTS} manifests`)
    kw.push(runChild(me, { kind: 'keywords', threads: args.threads, dirs, queries, calls: args.quick ? 500 : 2000 }, 'keywords'))
    await waitIdleThenSay(args, rep, `embedding routing beside ${ROUTED_SESSIONS} decoding sessions`)
    emb.push(runChild(me, { kind: 'embedding', threads: args.threads, model, idleCalls: args.quick ? 10 : 30, maxTokens: args.quick ? 96 : 160, windowMs: args.quick ? 1500 : 3000 }, 'embedding'))
  }
  const load1 = os.loadavg()
  const k = kw.sort((a, b) => a.medianMs - b.medianMs)[0]
  const e = emb.sort((a, b) => a.busyMedianMs - b.busyMedianMs)[0]
  console.log(`\nexpert-runtime ${gitRev() ?? ''}: routing, ${args.threads} threads, ${machineName()}, best of ${args.repeat}`)
  console.log(`keyword-only routing, ${k.experts} manifests loaded: rt.route() median ${fmt(k.medianMs, 3)} ms, p99 ${fmt(k.p99Ms, 3)} ms ` +
    `over ${k.calls} calls (target median < 0.1 ms); ${fmt(k.meanChosen, 2)} experts chosen per query`)
  console.log(`embedding routing on SmolLM2 (sql + shell experts with examples), ${e.queryTokens}-token query:`)
  console.log(`  idle engine: median ${fmt(e.idleMedianMs, 1)} ms`)
  console.log(`  while ${ROUTED_SESSIONS} sessions decode: median ${fmt(e.busyMedianMs, 1)} ms, p90 ${fmt(e.busyP90Ms, 1)} ms (${e.routesDuringWindow} routes in ${e.windowMs} ms)`)
  console.log(`  their aggregate decode: ${fmt(e.decodeTokPerSecBefore, 1)} tok/s without routing, ${fmt(e.decodeTokPerSecDuring, 1)} tok/s with back-to-back routing ` +
    `(ratio ${fmt(e.decodeTokPerSecDuring / e.decodeTokPerSecBefore, 2)}): each route costs them ` +
    `${fmt(((e.decodeTokPerSecBefore - e.decodeTokPerSecDuring) * e.windowMs) / 1e3 / e.routesDuringWindow, 1)} tokens in all ` +
    `(one decode step of all ${ROUTED_SESSIONS} is ${ROUTED_SESSIONS} tokens)`)
  console.log(`  ${loadSummary(load0, load1)}`)
  writeResults(args.out ?? resultsPath(cacheDir, 'routing'), { ...runInfo(args), machine: machineInfo(load0, load1), keywords: kw, embedding: emb })
}

await benchMain(parseArgs(process.argv.slice(2)), parent, child)
