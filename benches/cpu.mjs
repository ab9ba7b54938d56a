// `npm run bench [-- --quick] [-- --threads N] [-- --repeat N] [-- --wait-idle S]`: CPU speed of
// expert-runtime against node-llama-cpp (llama.cpp) on the same files, same thread count, same run.
//
// Models: SmolLM2-135M-Instruct Q4_1 GGUF, and (unless --quick) the Qwen3-0.6B-shaped random
// model of scripts/make_bench_model.py as f32 safetensors, f16 safetensors and Q8_0 GGUF, and
// Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF (K-quants).
// node-llama-cpp cannot read safetensors, so the safetensors rows (dense, and quantized on
// load with `quantize: 'q8_0' | 'q4_0' | 'q4_k'`) are compared against node-llama-cpp on the
// Q8_0 GGUF of the same weights (marked in the table).
//
// Each (engine, model) measurement runs in a fresh child process (this file with --child), so
// the resident-memory delta is clean: RSS after importing the engine vs after loading the model.
// Per measurement: load (wall ms until ready to generate), a warm-up request on a different
// 64-token prompt, then one request on a fixed 512-token prompt (seeded random ids) that
// generates 65 greedy tokens: prefill tok/s = 512 / time to the first token, decode tok/s =
// 64 / time from the first to the 65th token (both timed in JS, identically for both engines).
// node-llama-cpp keeps going past EOS (yieldEogToken); ours stops at EOS, which is reported.
//
// Both engines spin-wait in their thread pools, so any other load on the machine slows them
// badly (10x and more on a 2-core box): each measurement first waits for an idle second
// (--wait-idle), records how many cores the process kept busy per phase ("busy cores"; well
// under --threads means it was starved), and --repeat N keeps the best of N interleaved runs.
//
// Results: a table on stdout, JSON under <cacheDir>/bench-results/cpu-<date>.json.
import { createRequire } from 'node:module'
import os from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import {
  assertBuilt, benchMain, fmt, gitRev, loadAtStart, loadSummary, machineInfo, machineName, nodeLlamaCppVersion, parseBenchArgs,
  randomTokens, resultsPath, root, runChild, runInfo, waitIdleThenSay, warmPageCache, writeResults,
} from './common.mjs'

const require = createRequire(import.meta.url)

const PROMPT_LEN = 512
const WARMUP_LEN = 64
const DECODE = 64
const CONTEXT = 2048
const BATCH = 512
const TOKEN_RANGE = [1000, 30000] // ordinary (non-special) ids in both vocabularies

function parseArgs(argv) {
  return parseBenchArgs(argv, {
    usage: 'node benches/cpu.mjs [--quick] [--cases KEY,KEY] [--threads N] [--repeat N] [--wait-idle SECONDS] [--out file.json]',
    help: [
      '  --cases K,K      only these rows (keys: smollm2-q4_1, qwen3-q8_0, qwen3-q8_0-kv-f16, qwen3-f32, qwen3-f16, qwen3-f32-q8_0, qwen3-f32-q4_0, qwen3-f32-q4_k, qwen25-q4_k_m, gemma3-q4_k_m)',
      '  --repeat N       run every measurement N times (interleaved) and keep the best of each figure',
      '  --wait-idle S    before each measurement, wait up to S seconds (default 120, 0 = off) for a >= 90% idle second',
    ],
    defaults: { cases: null },
    extra: (k, next, a) => {
      if (k !== '--cases') return false
      a.cases = next().split(',')
      return true
    },
  })
}

/** Deterministic token ids. */
const tokens = (seed, n) => randomTokens(seed, n, TOKEN_RANGE)

const MB = 1024 * 1024
const rss = () => process.memoryUsage().rss
const peakRss = () => process.resourceUsage().maxRSS * 1024

// ------------------------------------------------------------------------------------------
// child: one engine, one model
// ------------------------------------------------------------------------------------------

async function childOurs(spec) {
  const { Runtime } = require(join(root, 'dist', 'index.js'))
  const rss0 = rss()
  const t0 = performance.now()
  const kvCache = spec.kv ? { dtype: spec.kv } : undefined
  const rt = await Runtime.load(spec.path, { threads: spec.threads, dtype: spec.dtype, quantize: spec.quantize, contextLength: CONTEXT, kvCache })
  const loadMs = performance.now() - t0
  const rssLoad = rss()

  const warm = rt.createSession()
  await warm.complete({ tokens: tokens(2, WARMUP_LEN) }, { maxTokens: 4, temperature: 0 })
  warm.dispose()

  const s = rt.createSession()
  const prompt = tokens(1, PROMPT_LEN)
  const times = []
  const cpu = []
  const ids = []
  const cpu1 = process.cpuUsage()
  const t1 = performance.now()
  const stream = s.generate({ tokens: prompt }, { maxTokens: DECODE + 1, temperature: 0 })
  for await (const c of stream) {
    times.push(performance.now())
    cpu.push(process.cpuUsage())
    ids.push(c.tokenId)
  }
  const r = stream.result
  const out = {
    loadMs,
    rssBaseMB: rss0 / MB,
    rssLoadMB: (rssLoad - rss0) / MB,
    rssAfterRunMB: (rss() - rss0) / MB,
    peakRssMB: (peakRss() - rss0) / MB,
    ...rates(t1, times, cpu1, cpu),
    tokens: ids,
    eosAt: r.finishReason === 'stop' ? ids.length - 1 : null,
    engine: { timings: r.timings, usage: r.usage, finishReason: r.finishReason, info: rt.info },
  }
  s.dispose()
  await rt.dispose()
  return out
}

async function childLlama(spec) {
  const { getLlama } = await import('node-llama-cpp')
  const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error', maxThreads: 0 })
  const rss0 = rss()
  const t0 = performance.now()
  const model = await llama.loadModel({ modelPath: spec.path })
  const modelMs = performance.now() - t0
  const ctx = await model.createContext({ contextSize: CONTEXT, batchSize: BATCH, threads: { ideal: spec.threads, min: spec.threads } })
  const seq = ctx.getSequence()
  const loadMs = performance.now() - t0
  const rssLoad = rss()

  let n = 0
  for await (const _ of seq.evaluate(tokens(2, WARMUP_LEN), { temperature: 0, yieldEogToken: true })) {
    if (++n >= 4) break
  }
  await seq.clearHistory()

  const prompt = tokens(1, PROMPT_LEN)
  const times = []
  const cpu = []
  const ids = []
  const cpu1 = process.cpuUsage()
  const t1 = performance.now()
  for await (const tok of seq.evaluate(prompt, { temperature: 0, yieldEogToken: true })) {
    times.push(performance.now())
    cpu.push(process.cpuUsage())
    ids.push(tok)
    if (ids.length >= DECODE + 1) break
  }
  const eos = ids.findIndex((t) => model.isEogToken(t))
  const out = {
    loadMs,
    modelLoadMs: modelMs,
    rssBaseMB: rss0 / MB,
    rssLoadMB: (rssLoad - rss0) / MB,
    rssAfterRunMB: (rss() - rss0) / MB,
    peakRssMB: (peakRss() - rss0) / MB,
    ...rates(t1, times, cpu1, cpu),
    tokens: ids,
    eosAt: eos >= 0 ? eos : null,
    engine: {
      threads: ctx.currentThreads,
      idealThreads: ctx.idealThreads,
      flashAttention: ctx.flashAttention,
      contextSize: ctx.contextSize,
      batchSize: ctx.batchSize,
      llamaCpp: llama.llamaCppRelease,
      systemInfo: llama.systemInfo,
    },
  }
  await ctx.dispose()
  await model.dispose()
  await llama.dispose()
  return out
}

// Busy cores = process CPU time / wall time over a phase: well under the thread count means
// the process was starved (other work on the machine), which skews that phase's rate.
function rates(t1, times, cpu1, cpu) {
  const first = times[0]
  const last = times[times.length - 1]
  const decoded = times.length - 1
  const busy = (a, b, ms) => ((b.user - a.user + b.system - a.system) / 1000) / ms
  return {
    ttftMs: first - t1,
    prefillTps: PROMPT_LEN / ((first - t1) / 1000),
    decodeTps: decoded > 0 ? decoded / ((last - first) / 1000) : null,
    decoded,
    prefillBusyCores: busy(cpu1, cpu[0], first - t1),
    decodeBusyCores: decoded > 0 ? busy(cpu[0], cpu[cpu.length - 1], last - first) : null,
  }
}

// ------------------------------------------------------------------------------------------
// parent
// ------------------------------------------------------------------------------------------

const spawnChild = (spec) => runChild(fileURLToPath(import.meta.url), spec, `${spec.engine} ${spec.path}`)

/** Best of the repeats: fastest load/prefill/decode, smallest memory (each field on its own). */
function best(runs) {
  const pick = (k, f) => {
    const v = runs.map((r) => r[k]).filter((x) => typeof x === 'number')
    return v.length ? f(...v) : null
  }
  return {
    ...runs[0],
    loadMs: pick('loadMs', Math.min),
    rssLoadMB: pick('rssLoadMB', Math.min),
    rssAfterRunMB: pick('rssAfterRunMB', Math.min),
    peakRssMB: pick('peakRssMB', Math.min),
    prefillTps: pick('prefillTps', Math.max),
    decodeTps: pick('decodeTps', Math.max),
    ttftMs: pick('ttftMs', Math.min),
    runs,
  }
}

const ratio = (a, b) => (a == null || b == null || !b ? null : a / b)

function printTable(rows) {
  const head = ['model / format', 'vs llama.cpp on', 'load ms ours', 'llama', 'RSS MB ours', 'llama',
    'prefill t/s ours', 'llama', 'ratio', 'decode t/s ours', 'llama', 'ratio']
  const lines = rows.map((r) => [
    r.label, r.llamaLabel, fmt(r.ours.loadMs, 0), fmt(r.llama.loadMs, 0), fmt(r.ours.rssLoadMB, 0), fmt(r.llama.rssLoadMB, 0),
    fmt(r.ours.prefillTps), fmt(r.llama.prefillTps), fmt(r.prefillRatio, 2),
    fmt(r.ours.decodeTps), fmt(r.llama.decodeTps), fmt(r.decodeRatio, 2),
  ])
  const w = head.map((h, i) => Math.max(h.length, ...lines.map((l) => l[i].length)))
  const row = (cells) => cells.map((c, i) => (i < 2 ? c.padEnd(w[i]) : c.padStart(w[i]))).join('  ')
  console.log(row(head))
  console.log(w.map((n) => '-'.repeat(n)).join('  '))
  for (const l of lines) console.log(row(l))
}

async function parent(args) {
  assertBuilt()
  const { ensureSmolLM2, cacheDir } = await import(join(root, 'scripts', 'assets.mjs'))
  const cases = [] // { key, label, ours: spec, llamaKey, llamaLabel }
  const llamaSpecs = {} // key -> spec
  const smol = ensureSmolLM2()
  llamaSpecs.smol = { engine: 'llama', path: smol }
  cases.push({ key: 'smollm2-q4_1', label: 'SmolLM2-135M Q4_1 GGUF', ours: { engine: 'ours', path: smol }, llamaKey: 'smol', llamaLabel: 'same GGUF' })
  if (!args.quick) {
    const { ensureQwen3Bench } = await import(join(root, 'scripts', 'bench-model.mjs'))
    const q = ensureQwen3Bench()
    llamaSpecs.q8 = { engine: 'llama', path: q.q8_0 }
    cases.push({ key: 'qwen3-q8_0', label: 'Qwen3-0.6B-rand Q8_0 GGUF', ours: { engine: 'ours', path: q.q8_0 }, llamaKey: 'q8', llamaLabel: 'same GGUF' })
    // Our KV pool is f32 on CPU by default (exact); llama.cpp's default cache is f16: this row
    // runs ours with an f16 pool too, the same bytes per position read at each decode step.
    cases.push({ key: 'qwen3-q8_0-kv-f16', label: 'Qwen3-0.6B-rand Q8_0 GGUF, KV f16 as llama.cpp', ours: { engine: 'ours', path: q.q8_0, kv: 'f16' }, llamaKey: 'q8', llamaLabel: 'same GGUF' })
    cases.push({ key: 'qwen3-f32', label: 'Qwen3-0.6B-rand f32 safetensors', ours: { engine: 'ours', path: q.f32, dtype: 'f32' }, llamaKey: 'q8', llamaLabel: 'Q8_0 GGUF (same weights)' })
    cases.push({ key: 'qwen3-f16', label: 'Qwen3-0.6B-rand f16 safetensors (dtype f16)', ours: { engine: 'ours', path: q.f16, dtype: 'f16' }, llamaKey: 'q8', llamaLabel: 'Q8_0 GGUF (same weights)' })
    // Quantized on load from the f32 safetensors: q8_0 makes the GGUF's very blocks.
    for (const quantize of ['q8_0', 'q4_0', 'q4_k']) {
      cases.push({ key: `qwen3-f32-${quantize}`, label: `Qwen3-0.6B-rand f32 safetensors, quantize ${quantize}`, ours: { engine: 'ours', path: q.f32, quantize }, llamaKey: 'q8', llamaLabel: 'Q8_0 GGUF (same weights)' })
    }
    // A real model in K-quants (Q4_K / Q6_K / Q5_0 tensors), fetched only when asked for or in a full run.
    if (!args.cases || args.cases.includes('qwen25-q4_k_m')) {
      const { ensureQwen25Coder } = await import(join(root, 'scripts', 'assets.mjs'))
      const coder = await ensureQwen25Coder()
      llamaSpecs.coder = { engine: 'llama', path: coder }
      cases.push({ key: 'qwen25-q4_k_m', label: 'Qwen2.5-Coder-0.5B Q4_K_M GGUF', ours: { engine: 'ours', path: coder }, llamaKey: 'coder', llamaLabel: 'same GGUF' })
    }
    // Gemma 3 270M (sliding and full layers, a 262k vocabulary), fetched the same way.
    if (!args.cases || args.cases.includes('gemma3-q4_k_m')) {
      const { ensureGemma3 } = await import(join(root, 'scripts', 'assets.mjs'))
      const gemma = await ensureGemma3()
      llamaSpecs.gemma = { engine: 'llama', path: gemma }
      cases.push({ key: 'gemma3-q4_k_m', label: 'Gemma 3 270M Q4_K_M GGUF', ours: { engine: 'ours', path: gemma }, llamaKey: 'gemma', llamaLabel: 'same GGUF' })
    }
  }
  if (args.cases) {
    const unknown = args.cases.filter((k) => !cases.some((c) => c.key === k))
    if (unknown.length) throw new Error(`--cases: unknown ${unknown.join(', ')}`)
    cases.splice(0, cases.length, ...cases.filter((c) => args.cases.includes(c.key)))
  }
  for (const p of new Set([...cases.map((c) => c.ours.path), ...Object.values(llamaSpecs).map((s) => s.path)])) await warmPageCache(p)

  const load0 = loadAtStart()
  const ours = Object.fromEntries(cases.map((c) => [c.key, []]))
  const llama = Object.fromEntries(Object.keys(llamaSpecs).map((k) => [k, []]))
  // Interleave the engines (ours, then llama.cpp on the same file) so drift hits both.
  for (let rep = 0; rep < args.repeat; rep++) {
    const done = new Set()
    for (const c of cases) {
      let idle = await waitIdleThenSay(args, rep, `ours   ${c.label}`)
      ours[c.key].push({ ...spawnChild({ ...c.ours, threads: args.threads }), idleBefore: idle })
      if (!done.has(c.llamaKey)) {
        idle = await waitIdleThenSay(args, rep, `llama  ${llamaSpecs[c.llamaKey].path}`)
        llama[c.llamaKey].push({ ...spawnChild({ ...llamaSpecs[c.llamaKey], threads: args.threads }), idleBefore: idle })
        done.add(c.llamaKey)
      }
    }
  }
  const load1 = os.loadavg()

  const rows = cases.map((c) => {
    const o = best(ours[c.key])
    const l = best(llama[c.llamaKey])
    const sameTokens = c.llamaLabel === 'same GGUF' ? o.tokens.findIndex((t, i) => t !== l.tokens[i]) : undefined
    const notes = []
    if (o.eosAt != null) notes.push(`ours hit EOS after ${o.eosAt} decode tokens (decode rate over ${o.decoded})`)
    if (l.eosAt != null) notes.push(`llama.cpp produced EOS at step ${l.eosAt} (kept generating)`)
    const bd = (runs) => runs.reduce((a, b) => ((b.decodeTps ?? 0) > (a.decodeTps ?? 0) ? b : a))
    const busy = (r) => `${fmt(r.prefillBusyCores, 2)}/${fmt(r.decodeBusyCores, 2)}`
    notes.push(`busy cores prefill/decode: ours ${busy(bd(o.runs))}, llama.cpp ${busy(bd(l.runs))} (of ${args.threads})`)
    if (sameTokens !== undefined) notes.push(sameTokens === -1 ? `greedy tokens identical (${o.tokens.length})` : `greedy tokens diverge at step ${sameTokens}`)
    return {
      key: c.key, label: c.label, llamaLabel: c.llamaLabel, ours: o, llama: l,
      loadSpeedup: ratio(l.loadMs, o.loadMs), prefillRatio: ratio(o.prefillTps, l.prefillTps), decodeRatio: ratio(o.decodeTps, l.decodeTps),
      notes,
    }
  })

  console.log(`\nexpert-runtime ${gitRev() ?? ''} vs node-llama-cpp ${nodeLlamaCppVersion()}` +
    ` (llama.cpp ${rows[0].llama.engine.llamaCpp?.release ?? '?'}), ${args.threads} threads, ${machineName()}` +
    `, best of ${args.repeat}; prompt ${PROMPT_LEN} tokens, decode ${DECODE} greedy tokens, context ${CONTEXT}`)
  console.log('ratio = ours / llama.cpp (>1: we are faster); RSS = resident memory added by loading (fresh process)\n')
  printTable(rows)
  for (const r of rows) for (const n of r.notes) console.log(`  ${r.label}: ${n}`)
  console.log(`  ${loadSummary(load0, load1)}`)

  writeResults(args.out ?? resultsPath(cacheDir, 'cpu'), {
    ...runInfo(args),
    machine: machineInfo(load0, load1),
    nodeLlamaCpp: nodeLlamaCppVersion(),
    setup: { promptLen: PROMPT_LEN, warmupLen: WARMUP_LEN, decode: DECODE, context: CONTEXT, llamaBatch: BATCH, tokenRange: TOKEN_RANGE },
    rows,
  })
}

await benchMain(parseArgs(process.argv.slice(2)), parent, (spec) => (spec.engine === 'ours' ? childOurs(spec) : childLlama(spec)))
