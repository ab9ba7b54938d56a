// `npm run bench:fit [-- --quick] [-- --tokens N] [-- --threads N] [-- --wait-idle S]`: how close
// `Runtime.estimate` (and `inspect --fit`, which prints it) comes to what a load then holds
// (issue 52: within 10%).
//
// Rows: the Qwen3-0.6B-shaped random model (scripts/bench-model.mjs), f32 safetensors, loaded
// with quantize none / q8_0 / q4_0 and a KV pool of the same name (f32 / q8_0 / q4_0); and,
// unless --quick drops the 0.6B rows, SmolLM2-135M Q4_1 with an f32 pool.
//
// Each row in a fresh child process: the estimate for contextLength N (default 2048); then the
// load, and a prompt of N − 32 tokens evaluated, so the weights (mapped ones included) have all
// been read and the KV of one full context is resident. "measured" is the process's resident
// memory (RSS) at that point less its RSS before the load; "estimate" is the estimate's total
// (weights, KV at N, state, RoPE tables, scratch, tokenizer). The ratio is estimate / measured.
//
// Results: a table on stdout, JSON under <cacheDir>/bench-results/fit-<date>.json.
import { createRequire } from 'node:module'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import {
  assertBuilt, benchMain, fmt, gitRev, loadAtStart, loadSummary, machineInfo, machineName, parseBenchArgs, randomTokens, resultsPath,
  root, runChild, runInfo, waitIdleThenSay, warmPageCache, writeResults,
} from './common.mjs'

const require = createRequire(import.meta.url)
const self = fileURLToPath(import.meta.url)
const MB = 1e6

const args = parseBenchArgs(process.argv.slice(2), {
  usage: 'node benches/fit.mjs [--quick] [--tokens N] [--threads N] [--wait-idle S] [--out FILE]',
  defaults: { tokens: 2048, repeat: 1 },
  extra: (k, next, a) => {
    if (k !== '--tokens') return false
    a.tokens = Number(next())
    if (!Number.isInteger(a.tokens) || a.tokens < 128) throw new Error('--tokens: an integer of at least 128')
    return true
  },
})

async function child({ model, quantize, kvDtype, tokens, threads }) {
  const { Runtime } = require(join(root, 'dist', 'index.js'))
  const opts = { threads, contextLength: tokens, quantize, kvCache: { dtype: kvDtype, idleReleaseMs: 0 } }
  const estimate = await Runtime.estimate(model, opts)
  const rss0 = process.memoryUsage().rss
  const rt = await Runtime.load(model, opts)
  const rssLoaded = process.memoryUsage().rss
  const s = rt.createSession()
  for await (const _ of s.generate({ tokens: randomTokens(3, tokens - 32, [1000, 30000]) }, { temperature: 0, maxTokens: 1 })) break
  const rss1 = process.memoryUsage().rss
  const stats = rt.stats()
  await rt.dispose()
  return { estimate, measuredBytes: rss1 - rss0, loadedBytes: rssLoaded - rss0, memory: stats.memory }
}

async function parent() {
  assertBuilt()
  const load0 = loadAtStart()
  const { cacheDir, ensureSmolLM2 } = await import(join(root, 'scripts', 'assets.mjs'))
  const rows = [{ key: 'smollm2', label: 'SmolLM2-135M Q4_1', path: ensureSmolLM2(), quantize: undefined, kvDtype: 'f32' }]
  if (!args.quick) {
    const { ensureQwen3Bench } = await import(join(root, 'scripts', 'bench-model.mjs'))
    const f32 = ensureQwen3Bench().f32
    for (const [quantize, kvDtype] of [[undefined, 'f32'], ['q8_0', 'q8_0'], ['q4_0', 'q4_0']]) {
      rows.push({ key: `qwen3-${kvDtype}`, label: `Qwen3-0.6B-shape ${quantize ?? 'f32'}, KV ${kvDtype}`, path: f32, quantize, kvDtype })
    }
  }
  const results = { ...runInfo(args), tokens: args.tokens, rows: {} }
  for (const r of rows) {
    await warmPageCache(r.path)
    await waitIdleThenSay(args, 0, r.key)
    const spec = { model: r.path, quantize: r.quantize, kvDtype: r.kvDtype, tokens: args.tokens, threads: args.threads }
    results.rows[r.key] = { label: r.label, ...runChild(self, spec, r.key) }
  }
  results.machine = machineInfo(load0, loadAtStart())
  console.log(`\nexpert-runtime ${gitRev() ?? ''}, ${machineName()}, ${args.threads} threads, context ${args.tokens}`)
  console.log('model                           | weights est MB | weights held MB | KV est MB | KV held MB | estimate MB | measured RSS MB | estimate / measured')
  let worst = 0
  for (const r of rows) {
    const { estimate: e, measuredBytes, memory } = results.rows[r.key]
    const ratio = e.totalBytes / measuredBytes
    worst = Math.max(worst, Math.abs(ratio - 1))
    console.log([
      r.label.padEnd(31),
      fmt(e.weights.bytes / MB).padStart(14),
      fmt(memory.weights / MB).padStart(15),
      fmt(e.kv.bytes / MB).padStart(9),
      fmt(memory.kv / MB).padStart(10),
      fmt(e.totalBytes / MB).padStart(11),
      fmt(measuredBytes / MB).padStart(15),
      `${fmt(ratio, 3)}`,
    ].join(' | '))
  }
  console.log(`largest deviation: ${fmt(worst * 100, 1)}% (target: within 10%)`)
  console.log(loadSummary(load0, loadAtStart()))
  writeResults(args.out ?? resultsPath(cacheDir, 'fit'), results)
}

await benchMain(args, parent, child)
