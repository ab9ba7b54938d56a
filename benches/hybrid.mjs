// `npm run bench:hybrid [-- --quick] [-- --threads N] [-- --repeat N] [-- --wait-idle S]`: the hybrid
// Qwen3.5 family (Gated DeltaNet + gated attention) on the CPU, against node-llama-cpp (llama.cpp)
// on the same file, same thread count, same run. Targets: decode >= 1.2x llama.cpp, prefill >= 1.0x.
//
// Model: the Qwen3.5-0.8B-shaped random model of scripts/make_hybrid_bench_model.py (made on
// first use by scripts/bench-model.mjs), as a Q8_0 `qwen35` GGUF and as f32 safetensors.
// Rows:
//   a. ours on the Q8_0 GGUF vs node-llama-cpp on the same GGUF: the protocol of cpu.mjs. Per
//      measurement a fresh child process loads the model (contextLength / contextSize 2048,
//      llama.cpp batchSize 512), runs a warm-up request on a different 64-token prompt, then one
//      request on a fixed 512-token prompt (seeded random ids in [1000, 30000)) generating 65
//      greedy tokens: prefill tok/s = 512 / time to the first token, decode tok/s = 64 / time
//      from the first to the 65th token (timed in JS, identically for both engines). Ours stops
//      at EOS (reported); node-llama-cpp keeps going (yieldEogToken). If llama.cpp refuses the
//      file, the table and JSON say so (with its error) instead of a ratio.
//   b. ours on the f32 safetensors with `quantize: 'q8_0'`, same protocol, against row a's
//      llama.cpp figures (the same weights).
//   c. from rt.stats() after row a: kvStateBytesPerSequence (f32 recurrent state of one sequence
//      over the linear-attention layers: delta-rule state and conv window) and kvBytesPerToken
//      (K and V of one position over the full-attention layers).
//   d. concurrency (ours, Q8_0 GGUF, contextLength 2048): after a warm-up, one session, then 16
//      sessions, each a distinct seeded 64-token prompt, each generating 32 greedy tokens, all
//      generate() iterators started in one tick (Promise.all) and every chunk timestamped.
//      Decode tok/s = (sum over sessions of tokens after the session's first) / (T_end - T_first),
//      T_first = the earliest first token of any session, T_end = the last token of any session
//      (for one session: cpu.mjs's decode rate). scaling = aggregate(16) / decode(1). The JSON
//      also holds common.mjs's `aggregate()` (batch.mjs's window figure) of the same run.
//   e. shared system prompt (ours, Q8_0 GGUF, default load options but --threads): 16 chats run
//      one after another, each on a fresh session, prompt = the same 1024 seeded token ids
//      followed by 32 ids distinct per chat, maxTokens 1; TTFT = generate() call -> first chunk.
//      Reported: chat 1's TTFT, the mean TTFT of chats 2-16, their ratio (first / rest; > 1 when
//      the shared prefix is reused), cachedTokens and stats().prefixCacheHitTokens; then the
//      same in a fresh child with kvCache: { prefixCache: false } as the baseline. A warm-up
//      request on unrelated ids runs first (as batch.mjs's prefix test).
// --quick: 64-token prompt and 8 decode tokens (a, b), 4 sessions of 8 tokens (d), 4 chats on a
// 128-token system prompt (e); a smoke test, not a measurement.
//
// Both engines spin-wait in their thread pools, so other load slows them badly: each measurement
// first waits for an idle second (--wait-idle), records the cores it kept busy per phase, and
// --repeat N keeps the best of N interleaved runs of each figure.
//
// Results: tables on stdout, JSON under <cacheDir>/bench-results/hybrid-<date>.json.
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import os from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import {
  aggregate, assertBuilt, benchMain, concurrent, fmt, gitRev, loadAtStart, loadSummary, machineInfo, machineName, nodeLlamaCppVersion,
  parseBenchArgs, randomTokens, resultsPath, root, runChild, runInfo, waitIdleThenSay, warmPageCache, writeResults,
} from './common.mjs'

const require = createRequire(import.meta.url)

const FULL = { promptLen: 512, decode: 64, sessions: 16, sessionPrompt: 64, sessionDecode: 32, chats: 16, systemLen: 1024, suffixLen: 32 }
const QUICK = { promptLen: 64, decode: 8, sessions: 4, sessionPrompt: 64, sessionDecode: 8, chats: 4, systemLen: 128, suffixLen: 32 }
const WARMUP_LEN = 64
const CONTEXT = 2048
const BATCH = 512
const TOKEN_RANGE = [1000, 30000] // ordinary ids of the Qwen3 tokenizer
const TARGETS = { decode: 1.2, prefill: 1.0 }

function parseArgs(argv) {
  return parseBenchArgs(argv, {
    usage: 'node benches/hybrid.mjs [--quick] [--threads N] [--repeat N] [--wait-idle SECONDS] [--out file.json]',
    help: [
      '  --quick          small sizes (64-token prompt, 8 decode tokens, 4 sessions, 128-token system prompt): a smoke test',
      '  --repeat N       run every measurement N times (interleaved) and keep the best of each figure',
      '  --wait-idle S    before each measurement, wait up to S seconds (default 120, 0 = off) for a >= 90% idle second',
    ],
  })
}

const tokens = (seed, n) => randomTokens(seed, n, TOKEN_RANGE)
const MB = 1024 * 1024
const rss = () => process.memoryUsage().rss
const mean = (xs) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null)
const busy = (a, b, ms) => (a && b && ms > 0 ? ((b.user - a.user + b.system - a.system) / 1000) / ms : null)

// ------------------------------------------------------------------------------------------
// children
// ------------------------------------------------------------------------------------------

/** Prefill and decode rates of one stream's chunk times (cpu.mjs's formulas). */
function rates(sz, t1, times, cpu1, cpu) {
  const first = times[0]
  const last = times[times.length - 1]
  const decoded = times.length - 1
  return {
    ttftMs: first - t1,
    prefillTps: sz.promptLen / ((first - t1) / 1000),
    decodeTps: decoded > 0 ? decoded / ((last - first) / 1000) : null,
    decoded,
    prefillBusyCores: busy(cpu1, cpu[0], first - t1),
    decodeBusyCores: decoded > 0 ? busy(cpu[0], cpu[cpu.length - 1], last - first) : null,
  }
}

const loadOurs = (spec, extra = {}) => {
  const { Runtime } = require(join(root, 'dist', 'index.js'))
  return Runtime.load(spec.path, { threads: spec.threads, quantize: spec.quantize, contextLength: CONTEXT, ...extra })
}

async function childSpeed(spec) {
  const sz = spec.sizes
  require(join(root, 'dist', 'index.js'))
  const rss0 = rss()
  const t0 = performance.now()
  const rt = await loadOurs(spec)
  const loadMs = performance.now() - t0
  const rssLoad = rss()
  const warm = rt.createSession()
  await warm.complete({ tokens: tokens(2, WARMUP_LEN) }, { maxTokens: 4, temperature: 0 })
  warm.dispose()
  const s = rt.createSession()
  const times = []
  const cpu = []
  const ids = []
  const cpu1 = process.cpuUsage()
  const t1 = performance.now()
  const stream = s.generate({ tokens: tokens(1, sz.promptLen) }, { maxTokens: sz.decode + 1, temperature: 0 })
  for await (const c of stream) {
    times.push(performance.now())
    cpu.push(process.cpuUsage())
    ids.push(c.tokenId)
  }
  const r = stream.result
  const st = rt.stats()
  const out = {
    loadMs, rssLoadMB: (rssLoad - rss0) / MB, ...rates(sz, t1, times, cpu1, cpu), tokens: ids,
    eosAt: r.finishReason === 'stop' ? ids.length - 1 : null,
    state: {
      kvStateBytesPerSequence: st.kvStateBytesPerSequence, kvBytesPerToken: st.kvBytesPerToken,
      kvStateSlots: st.kvStateSlots, kvStateSlotsUsed: st.kvStateSlotsUsed, kvStateBytes: st.kvStateBytes,
    },
    engine: { timings: r.timings, usage: r.usage, finishReason: r.finishReason, info: rt.info },
  }
  s.dispose()
  await rt.dispose()
  return out
}

async function childLlama(spec) {
  const sz = spec.sizes
  const { getLlama } = await import('node-llama-cpp')
  const errors = []
  const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error', maxThreads: 0, logger: (_l, m) => errors.push(String(m).trim()) })
  const rss0 = rss()
  const t0 = performance.now()
  let model
  try {
    model = await llama.loadModel({ modelPath: spec.path })
  } catch (e) {
    await llama.dispose()
    return { unsupported: [...errors.filter(Boolean), e.message].join(' | ') }
  }
  const ctx = await model.createContext({ contextSize: CONTEXT, batchSize: BATCH, threads: { ideal: spec.threads, min: spec.threads } })
  const seq = ctx.getSequence()
  const loadMs = performance.now() - t0
  const rssLoad = rss()
  let n = 0
  for await (const _ of seq.evaluate(tokens(2, WARMUP_LEN), { temperature: 0, yieldEogToken: true })) if (++n >= 4) break
  await seq.clearHistory()
  const times = []
  const cpu = []
  const ids = []
  const cpu1 = process.cpuUsage()
  const t1 = performance.now()
  for await (const tok of seq.evaluate(tokens(1, sz.promptLen), { temperature: 0, yieldEogToken: true })) {
    times.push(performance.now())
    cpu.push(process.cpuUsage())
    ids.push(tok)
    if (ids.length >= sz.decode + 1) break
  }
  const eos = ids.findIndex((t) => model.isEogToken(t))
  const out = {
    loadMs, rssLoadMB: (rssLoad - rss0) / MB, ...rates(sz, t1, times, cpu1, cpu), tokens: ids, eosAt: eos >= 0 ? eos : null,
    engine: { threads: ctx.currentThreads, contextSize: ctx.contextSize, batchSize: ctx.batchSize, llamaCpp: llama.llamaCppRelease },
  }
  await ctx.dispose()
  await model.dispose()
  await llama.dispose()
  return out
}

/** n sessions started in one tick, `m` tokens each; decode tok/s as in the header (row d). */
async function sessionsRun(rt, n, promptLen, m, seedBase) {
  const sessions = Array.from({ length: n }, () => rt.createSession())
  let cpuFirst = null
  const run = await concurrent(n, (i) => sessions[i].generate({ tokens: tokens(seedBase + i, promptLen) }, { maxTokens: m, temperature: 0 }), {
    onChunk: () => { if (!cpuFirst) cpuFirst = process.cpuUsage() },
  })
  for (const s of sessions) s.dispose()
  const started = run.times.filter((t) => t.length > 0)
  const tFirst = Math.min(...started.map((t) => t[0]))
  const tEnd = Math.max(...started.map((t) => t[t.length - 1]))
  const after = started.reduce((a, t) => a + t.length - 1, 0)
  const { busyCores, tps: windowTps, method } = aggregate(run)
  return {
    n, tokensPerSession: run.times.map((t) => t.length), decodeTokens: after,
    decodeMs: tEnd - tFirst, tps: tEnd > tFirst ? after / ((tEnd - tFirst) / 1000) : null,
    prefillMs: tFirst - run.tStart, busyCores: busy(cpuFirst, run.cpuEnd, tEnd - tFirst),
    window: { tps: windowTps, method, busyCores },
    ended: run.marks.ends,
  }
}

async function childSessions(spec) {
  const sz = spec.sizes
  const rt = await loadOurs(spec)
  await sessionsRun(rt, 2, sz.sessionPrompt, 4, 0x5e5000) // warm-up
  const single = await sessionsRun(rt, 1, sz.sessionPrompt, sz.sessionDecode, 0x5e5100)
  const many = await sessionsRun(rt, sz.sessions, sz.sessionPrompt, sz.sessionDecode, 0x5e5200)
  await rt.dispose()
  return { single, many, scaling: single.tps && many.tps ? many.tps / single.tps : null }
}

/** Row e: sequential chats on one shared system prompt, each on a fresh session, maxTokens 1. */
async function childPrefix(spec) {
  const sz = spec.sizes
  const { Runtime } = require(join(root, 'dist', 'index.js'))
  const kvCache = spec.prefixCache ? undefined : { prefixCache: false }
  const rt = await Runtime.load(spec.path, { threads: spec.threads, kvCache })
  const warm = rt.createSession()
  await warm.complete({ tokens: tokens(0x77700, WARMUP_LEN) }, { maxTokens: 1, temperature: 0 })
  warm.dispose()
  const system = tokens(0x5a5000, sz.systemLen)
  const hit0 = rt.stats().prefixCacheHitTokens
  const chats = []
  for (let i = 0; i < sz.chats; i++) {
    const s = rt.createSession()
    const t = performance.now()
    const stream = s.generate({ tokens: system.concat(tokens(0x5a5100 + i, sz.suffixLen)) }, { maxTokens: 1, temperature: 0 })
    let first = null
    for await (const _c of stream) if (first == null) first = performance.now()
    const u = stream.result?.usage ?? {}
    chats.push({ ttftMs: first == null ? null : first - t, promptTokens: u.promptTokens, cachedTokens: u.cachedTokens ?? null })
    s.dispose()
  }
  const st = rt.stats()
  const contextLength = rt.info?.contextLength ?? null
  await rt.dispose()
  const firstTtftMs = chats[0].ttftMs
  const restTtftMs = mean(chats.slice(1).map((c) => c.ttftMs).filter((x) => x != null))
  return {
    prefixCache: spec.prefixCache, firstTtftMs, restTtftMs, ratio: firstTtftMs && restTtftMs ? firstTtftMs / restTtftMs : null,
    cachedTokensRest: chats.slice(1).reduce((a, c) => a + (c.cachedTokens ?? 0), 0),
    prefixCacheHitTokens: st.prefixCacheHitTokens - hit0, contextLength, chats,
  }
}

const CHILDREN = { speed: childSpeed, llama: childLlama, sessions: childSessions, prefix: childPrefix }

// ------------------------------------------------------------------------------------------
// parent
// ------------------------------------------------------------------------------------------

const spawnChild = (spec) => runChild(fileURLToPath(import.meta.url), spec, `${spec.kind} ${spec.path}`)

/** Best of the repeats, each field on its own: `max` fields the highest, `min` fields the lowest. */
function best(runs, { max = [], min = [] }) {
  const pick = (k, f) => {
    const v = runs.map((r) => r[k]).filter((x) => typeof x === 'number' && Number.isFinite(x))
    return v.length ? f(...v) : null
  }
  const out = { ...runs[0], runs }
  for (const k of max) out[k] = pick(k, Math.max)
  for (const k of min) out[k] = pick(k, Math.min)
  return out
}

const SPEED = { max: ['prefillTps', 'decodeTps'], min: ['loadMs', 'rssLoadMB', 'ttftMs'] }
const ratio = (a, b) => (a == null || b == null || !b ? null : a / b)

function table(head, lines, left = 1) {
  const w = head.map((h, i) => Math.max(h.length, ...lines.map((l) => l[i].length)))
  const row = (cells) => cells.map((c, i) => (i < left ? c.padEnd(w[i]) : c.padStart(w[i]))).join('  ')
  console.log(row(head))
  console.log(w.map((n) => '-'.repeat(n)).join('  '))
  for (const l of lines) console.log(row(l))
}

async function parent(args) {
  assertBuilt()
  const sz = args.quick ? QUICK : FULL
  const { cacheDir } = await import(join(root, 'scripts', 'assets.mjs'))
  const { ensureQwen35Bench } = await import(join(root, 'scripts', 'bench-model.mjs'))
  const q = ensureQwen35Bench()
  const cfg = JSON.parse(readFileSync(join(q.f32, 'config.json'), 'utf8'))
  const base = { threads: args.threads, sizes: sz }
  const specs = {
    gguf: { ...base, kind: 'speed', path: q.q8_0 },
    f32q8: { ...base, kind: 'speed', path: q.f32, quantize: 'q8_0' },
    llama: { ...base, kind: 'llama', path: q.q8_0 },
    sessions: { ...base, kind: 'sessions', path: q.q8_0 },
    prefixOn: { ...base, kind: 'prefix', path: q.q8_0, prefixCache: true },
    prefixOff: { ...base, kind: 'prefix', path: q.q8_0, prefixCache: false },
  }
  await warmPageCache(q.q8_0)
  await warmPageCache(q.f32)

  const load0 = loadAtStart()
  const runs = Object.fromEntries(Object.keys(specs).map((k) => [k, []]))
  for (let rep = 0; rep < args.repeat; rep++) {
    for (const [k, spec] of Object.entries(specs)) {
      const idle = await waitIdleThenSay(args, rep, `${k.padEnd(9)} ${spec.path}${spec.quantize ? ` quantize ${spec.quantize}` : ''}`)
      runs[k].push({ ...spawnChild(spec), idleBefore: idle })
    }
  }
  const load1 = os.loadavg()

  const llamaRefused = runs.llama.find((r) => r.unsupported)?.unsupported ?? null
  const llama = llamaRefused ? null : best(runs.llama, SPEED)
  const speedRow = (key, label, llamaLabel) => {
    const o = best(runs[key], SPEED)
    const notes = []
    if (o.eosAt != null) notes.push(`ours hit EOS after ${o.eosAt} decode tokens (decode rate over ${o.decoded})`)
    if (llama?.eosAt != null) notes.push(`llama.cpp produced EOS at step ${llama.eosAt} (kept generating)`)
    const bc = (r) => `${fmt(r.prefillBusyCores, 2)}/${fmt(r.decodeBusyCores, 2)}`
    notes.push(`busy cores prefill/decode: ours ${bc(o)}${llama ? `, llama.cpp ${bc(llama)}` : ''} (of ${args.threads})`)
    if (llama && key === 'gguf') {
      const d = o.tokens.findIndex((t, i) => t !== llama.tokens[i])
      notes.push(d === -1 ? `greedy tokens identical (${o.tokens.length})` : `greedy tokens diverge at step ${d} (near-uniform logits of random weights)`)
    }
    return {
      key, label, llamaLabel, ours: o, llama, llamaRefused,
      prefillRatio: llama ? ratio(o.prefillTps, llama.prefillTps) : null, decodeRatio: llama ? ratio(o.decodeTps, llama.decodeTps) : null,
      notes,
    }
  }
  const rows = [
    speedRow('gguf', 'a. Qwen3.5-0.8B-rand Q8_0 GGUF', 'same GGUF'),
    speedRow('f32q8', 'b. f32 safetensors, quantize q8_0', 'Q8_0 GGUF (same weights)'),
  ]
  const stateStats = rows[0].ours.state
  const sess = best(runs.sessions.map((r) => ({ ...r, singleTps: r.single.tps, manyTps: r.many.tps })), { max: ['singleTps', 'manyTps'] })
  sess.scaling = ratio(sess.manyTps, sess.singleTps)
  const prefixBest = (k) => best(runs[k], { min: ['firstTtftMs', 'restTtftMs'] })
  const prefix = { on: prefixBest('prefixOn'), off: prefixBest('prefixOff') }
  for (const p of Object.values(prefix)) p.ratio = ratio(p.firstTtftMs, p.restTtftMs)

  const release = llama?.engine.llamaCpp?.release ?? '?'
  console.log(`\nexpert-runtime ${gitRev() ?? ''} vs node-llama-cpp ${nodeLlamaCppVersion()} (llama.cpp ${release}), ${args.threads} threads, ` +
    `${machineName()}, best of ${args.repeat}${args.quick ? ', --quick (smoke test sizes)' : ''}`)
  console.log(`model: qwen3_5_text, hidden ${cfg.hidden_size}, ${cfg.num_hidden_layers} layers (3 linear : 1 full), vocab ${cfg.vocab_size}, ` +
    `random weights; prompt ${sz.promptLen} tokens, decode ${sz.decode} greedy tokens, context ${CONTEXT}`)
  console.log(`ratio = ours / llama.cpp (>1: we are faster); targets: decode >= ${TARGETS.decode}x, prefill >= ${TARGETS.prefill}x\n`)
  const refused = 'refused'
  table(['row', 'vs llama.cpp on', 'load ms ours', 'llama', 'prefill t/s ours', 'llama', 'ratio', 'decode t/s ours', 'llama', 'ratio'],
    rows.map((r) => [r.label, r.llamaLabel, fmt(r.ours.loadMs, 0), llama ? fmt(llama.loadMs, 0) : refused,
      fmt(r.ours.prefillTps), llama ? fmt(llama.prefillTps) : refused, llama ? fmt(r.prefillRatio, 2) : refused,
      fmt(r.ours.decodeTps), llama ? fmt(llama.decodeTps) : refused, llama ? fmt(r.decodeRatio, 2) : refused]), 2)
  for (const r of rows) for (const n of r.notes) console.log(`  ${r.label}: ${n}`)
  if (llamaRefused) console.log(`  llama.cpp refused the Q8_0 GGUF: ${llamaRefused}`)
  console.log('')
  const bytes = (b) => (b == null ? '—' : `${b} B (${b >= MB ? `${fmt(b / MB, 2)} MiB` : `${fmt(b / 1024, 1)} KiB`})`)
  const ms = (x) => `${fmt(x, 1)} ms`
  table(['row', 'figure', 'value', 'baseline', 'ratio'], [
    ['c. state', 'recurrent state per sequence (f32)', bytes(stateStats.kvStateBytesPerSequence), '', ''],
    ['c. state', 'KV bytes per token (full-attention layers)', bytes(stateStats.kvBytesPerToken), '', ''],
    ['d. sessions', `${sz.sessions} sessions aggregate decode t/s vs 1 session`, fmt(sess.manyTps), fmt(sess.singleTps), fmt(sess.scaling, 2)],
    ['e. prefix on', `TTFT chat 1 vs mean of chats 2-${sz.chats}`, ms(prefix.on.firstTtftMs), ms(prefix.on.restTtftMs), fmt(prefix.on.ratio, 2)],
    ['e. prefix off', `TTFT chat 1 vs mean of chats 2-${sz.chats}`, ms(prefix.off.firstTtftMs), ms(prefix.off.restTtftMs), fmt(prefix.off.ratio, 2)],
  ], 2)
  const short = (r) => r.tokensPerSession.filter((n) => n < sz.sessionDecode).length
  console.log(`  d: ${sz.sessionPrompt}-token prompts, ${sz.sessionDecode} tokens each; busy cores 1 session ${fmt(sess.single.busyCores, 2)}, ` +
    `${sz.sessions} sessions ${fmt(sess.many.busyCores, 2)}; common.mjs window figure ${fmt(sess.many.window.tps)} t/s (${sess.many.window.method})` +
    (short(sess.many) ? `; ${short(sess.many)} sessions ended early (EOS)` : ''))
  for (const [k, p] of Object.entries(prefix)) {
    console.log(`  e (prefix cache ${k}): ${sz.systemLen}-token system prompt + ${sz.suffixLen} distinct tokens, ${sz.chats} sequential chats; ` +
      `cachedTokens per chat ${p.chats.map((c) => c.cachedTokens ?? '—').join(',')}, prefixCacheHitTokens ${p.prefixCacheHitTokens}`)
  }
  console.log(`  ${loadSummary(load0, load1)}`)

  writeResults(args.out ?? resultsPath(cacheDir, 'hybrid'), {
    ...runInfo(args),
    machine: machineInfo(load0, load1),
    nodeLlamaCpp: nodeLlamaCppVersion(),
    model: { dir: q.dir, config: cfg },
    setup: { ...sz, quick: args.quick, warmupLen: WARMUP_LEN, context: CONTEXT, llamaBatch: BATCH, tokenRange: TOKEN_RANGE, targets: TARGETS },
    definitions: {
      prefillTps: 'promptLen / (first chunk - generate() call)',
      decodeTps: '(chunks - 1) / (last chunk - first chunk)',
      aggregateDecodeTps: 'sum over sessions of (chunks - 1) / (last chunk of any session - first chunk of any session); all sessions started in one tick',
      ttftRatio: 'TTFT of chat 1 / mean TTFT of chats 2..N (sequential, fresh session each, same system prompt)',
    },
    rows, llamaRefused, llama: llama ?? runs.llama,
    state: stateStats,
    sessions: sess,
    prefix,
  })
}

await benchMain(parseArgs(process.argv.slice(2)), parent, (spec) => CHILDREN[spec.kind](spec))
