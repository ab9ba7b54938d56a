// `npm run bench:batch [-- --quick] [-- --threads N] [-- --repeat N] [-- --wait-idle S] [-- --models smollm2,qwen3]`:
// continuous batching in expert-runtime (all concurrent sessions' requests share one forward pass
// per engine step), compared with node-llama-cpp (CPU) batching sequences of one context.
//
// Models: SmolLM2-135M-Instruct Q4_1 GGUF (scripts/assets.mjs) and the Qwen3-0.6B-shaped random
// model of scripts/make_bench_model.py as Q8_0 GGUF (scripts/bench-model.mjs).
// Adapters: per model, 64 random rank-8 LoRAs (alpha 16) on q/k/v/o/gate/up/down of every layer,
// F32, U(-0.01, 0.01), seeded, written here (no Python) as PEFT directories into
// <cacheDir>/bench-batch-experts/<model-tag>/lora-r8-<i>/ once (shapes: the f32 config.json of
// the Qwen3 model; hard-coded llama shapes for SmolLM2).
//
// Each model runs in a fresh child process for expert-runtime and in another for the peer
// (this file with --child), so the two engines never share a process. In the expert-runtime child:
//   1. aggregate decode: N = 1, 4, 16, 64 sessions, each a distinct seeded random prompt of 32
//      token ids in [1000, 30000], greedy, maxTokens M = 32 (--quick 16). All N generate()
//      iterators start in the same tick and are consumed concurrently; every chunk is timestamped
//      (performance.now()). T0 = when every session has its first token, T1 = when the first
//      session gets its last token; aggregate tok/s = tokens of all sessions stamped in (T0, T1]
//      / (T1 - T0). With fewer than 2N tokens in that window (EOS from random weights), the
//      fallback is (all tokens after each session's first) / (last token - T0), marked `*`.
//      scaling = aggregate(N) / aggregate(1). Run without experts, then "with LoRAs": session i
//      uses its own adapter i (N adapters loaded before, untimed, unloaded after).
//   2. TTFT under load: 16 sessions decode (maxTokens 64, --quick 32); once each has its first
//      token and about 3 more steps have run, a new session sends a 128-token random prompt
//      (maxTokens 4): its TTFT (generate() call -> first chunk) vs the TTFT of a same-length
//      request on the idle engine measured before (different random ids, so the prefix cache
//      cannot serve one from the other), and the 16 sessions' aggregate decode tok/s before vs
//      during that prefill.
//   3. KV: rt.stats().kvBytesPerToken, and kvBytes / (kvBlocksUsed * kvBlockSize) with the
//      kvBlocksUsed / kvBytes snapshot taken while the 64 sessions decode (at T0).
//   4. prefix cache: a shared ~200-token system prompt (numbered rules; its token count is
//      printed), 16 sessions run one after another, each asking a different short question
//      (chat string), maxTokens 8, on a runtime with kvCache.prefixCache true and then on a fresh
//      one with false: prompt tokens, cachedTokens, stats().prefixCacheHitTokens, wall time, mean
//      TTFT and the TTFT ratio without / with.
// In the peer child (node-llama-cpp, gpu: false, same GGUF, same threads): for N = 1, 4, 16 (64
// for SmolLM2, and for every model without --quick) one context with N sequences
// (contextSize N * (32 + M + 8), batchSize 512), the same prompts, seq.evaluate(ids,
// { temperature: 0 }) consumed concurrently and stopped after M tokens or an end-of-generation
// token; the same aggregate formula. A peer failure is recorded and reported, not fatal.
//
// Both engines' thread pools spin-wait, so other load distorts figures: each child first waits for
// an idle second (--wait-idle), busy cores (process CPU time / wall time) are recorded for each
// decode window, and --repeat N keeps the best of N runs of each figure.
//
// Results: a markdown table per model on stdout, JSON under <cacheDir>/bench-results/batch-<date>.json.
import { existsSync, readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import os from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import {
  aggregate, assertBuilt, benchMain, concurrent, fmt, gitRev, loadAtStart, loadSummary, machineInfo, machineName, nodeLlamaCppVersion,
  parseBenchArgs, randomTokens, resultsPath, root, runChild, runInfo, waitIdleThenSay, warmPageCache, writeLoraDir, writeResults,
} from './common.mjs'

const require = createRequire(import.meta.url)

const NS = [1, 4, 16, 64]
const N_MAX = 64
const PROMPT = 32
const RANK = 8
const ALPHA = 16
const INIT = 0.01
const MODULES = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj']
const TOKEN_RANGE = [1000, 30000]
const CONTEXT = 2048
const LOAD_SESSIONS = 16
const TTFT_PROMPT = 128
const PREFIX_SESSIONS = 16
const PREFIX_MIN_TOKENS = 190
const PREFIX_MAX_TOKENS = 8

// SmolLM2-135M (llama): the shapes its GGUF holds.
const SMOLLM2_CONFIG = {
  hidden_size: 576, num_attention_heads: 9, num_key_value_heads: 3, head_dim: 64,
  intermediate_size: 1536, num_hidden_layers: 30, vocab_size: 49152,
}

const QUESTIONS = [
  'What is the capital of France?', 'How many legs does a spider have?', 'Name a prime number above 50.',
  'Why is the sky blue?', 'What does a compiler do?', 'Who wrote Hamlet?', 'What is 12 times 12?',
  'How do plants make food?', 'What is a linked list?', 'Which planet is the largest?',
  'What language is spoken in Brazil?', 'How far is the Moon?', 'What is the boiling point of water?',
  'Define the word entropy.', 'What is a haiku?', 'How does a bicycle stay upright?',
]

const RULES = [
  'Answer the question that was asked, and nothing else.',
  'Keep every answer short, clear and polite.',
  'If you do not know the answer, say so plainly instead of guessing.',
  'Use simple words that a young student can follow.',
  'Never invent facts, names, numbers or sources.',
  'Prefer one concrete example over a long abstract explanation.',
  'When a question is ambiguous, state the reading you chose.',
  'Write numbers as digits and give units where they apply.',
  'Do not repeat the question back to the user.',
  'Check your arithmetic twice before you answer.',
  'Avoid jokes unless the user asks for one.',
  'End the answer as soon as the question is answered.',
]

function parseArgs(argv) {
  const a = parseBenchArgs(argv, {
    usage: 'node benches/batch.mjs [--quick] [--threads N] [--repeat N] [--wait-idle SECONDS] [--models smollm2,qwen3] [--out file.json]',
    help: [
      `  --quick          ${16} tokens per session instead of 32 (N = 1, 4, 16, 64 still); peer N = 64 only for SmolLM2`,
      '  --repeat N       run every child N times (fresh process each) and keep the best of each figure',
      '  --wait-idle S    before each child, wait up to S seconds (default 120, 0 = off) for a >= 90% idle second',
      '  --models LIST    comma-separated subset of smollm2,qwen3',
    ],
    defaults: { models: ['smollm2', 'qwen3'], modelPath: null, tag: null, config: null, ns: null, m: null, noPeer: false },
    extra: (k, next, a) => {
      if (k === '--models') a.models = next().split(',').map((s) => s.trim()).filter(Boolean)
      // hidden, for smoke tests: another GGUF (+ its config.json dir), other N list / M, no peer
      else if (k === '--model-path') a.modelPath = next()
      else if (k === '--tag') a.tag = next()
      else if (k === '--config') a.config = next()
      else if (k === '--ns') a.ns = next().split(',').map(Number)
      else if (k === '--m') a.m = Number(next())
      else if (k === '--no-peer') a.noPeer = true
      else return false
      return true
    },
  })
  for (const m of a.models) if (!['smollm2', 'qwen3'].includes(m)) throw new Error(`unknown model ${m} (smollm2, qwen3)`)
  if (a.ns && !a.ns.every((n) => Number.isInteger(n) && n > 0 && n <= N_MAX)) throw new Error(`--ns: integers in 1..${N_MAX}`)
  return a
}

const tokens = randomTokens

/** The prompt of session i in the N-session run: the same for both engines. */
const batchPrompt = (spec, n, i) => tokens(0xba7c000 + n * 1000 + i, PROMPT, spec.tokenRange)

const mean = (xs) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null)

// The measurement core shared by both engines (concurrent, aggregate) is in common.mjs.

// ------------------------------------------------------------------------------------------
// child: expert-runtime
// ------------------------------------------------------------------------------------------

/** One N-session run; experts(i) gives session i's experts (or null for none). */
async function oursBatch(rt, spec, n, m, experts, seedN = n) {
  const sessions = Array.from({ length: n }, () => rt.createSession())
  const streams = []
  let snapshot = null
  const run = await concurrent(n, (i) => {
    const s = sessions[i].generate({ tokens: batchPrompt(spec, seedN, i) }, { maxTokens: m, temperature: 0, experts: experts ? experts(i) : [] })
    streams.push(s)
    return s
  }, {
    onChunk: (_i, _t, times) => {
      if (!snapshot && times.every((t) => t.length > 0)) snapshot = rt.stats()
    },
  })
  const res = aggregate(run)
  const finish = {}
  for (const r of run.marks.ends) finish[r] = (finish[r] ?? 0) + 1
  res.finishReasons = finish
  res.cachedTokens = streams.reduce((a, s) => a + (s.result?.usage?.cachedTokens ?? 0), 0)
  res.statsAtT0 = snapshot
  res.eosEarly = run.times.filter((t) => t.length < m).map((t) => t.length)
  for (const s of sessions) s.dispose()
  return res
}

/** One request on a fresh session: TTFT (generate() call -> first chunk) and usage. */
async function oursTtft(rt, prompt, maxTokens) {
  const s = rt.createSession()
  const t = performance.now()
  const stream = s.generate({ tokens: prompt }, { maxTokens, temperature: 0, experts: [] })
  let first = null
  for await (const _c of stream) if (first == null) first = performance.now()
  const r = stream.result
  s.dispose()
  return { ttftMs: first == null ? null : first - t, cachedTokens: r?.usage?.cachedTokens ?? null, startedAt: t, firstAt: first }
}

async function ttftUnderLoad(rt, spec) {
  const out = {}
  const big = (seed) => tokens(seed, TTFT_PROMPT, spec.tokenRange)
  await oursTtft(rt, big(0x77770), 4) // warm-up of the 128-token path
  const idle = await oursTtft(rt, big(0x77771), 4)
  out.idleTtftMs = idle.ttftMs
  out.idleCachedTokens = idle.cachedTokens
  const mLoad = spec.quick ? 32 : 64
  const sessions = Array.from({ length: LOAD_SESSIONS }, () => rt.createSession())
  let newReq = null
  let anyEnded = false
  const run = await concurrent(LOAD_SESSIONS, (i) => {
    const s = sessions[i].generate({ tokens: tokens(0x66600 + i, PROMPT, spec.tokenRange) }, { maxTokens: mLoad, temperature: 0, experts: [] })
    const it = s[Symbol.asyncIterator]()
    // note when any of the 16 ends, so the new request never waits on a step count that cannot come
    return { [Symbol.asyncIterator]: () => ({ next: async () => { const r = await it.next(); if (r.done) anyEnded = true; return r } }), get result() { return s.result } }
  }, {
    onChunk: (_i, t, times) => {
      if (newReq || !times.every((x) => x.length > 0)) return
      const T0 = Math.max(...times.map((x) => x[0]))
      const after = times.reduce((a, x) => a + x.filter((y) => y > T0).length, 0)
      if (after >= 3 * LOAD_SESSIONS || anyEnded) {
        out.loadT0 = T0
        newReq = oursTtft(rt, big(0x77772), 4)
      }
    },
  })
  if (!newReq) { out.note = 'the 16 sessions ended before the new request could start'; newReq = oursTtft(rt, big(0x77772), 4) }
  const nr = await newReq
  for (const s of sessions) s.dispose()
  out.loadedTtftMs = nr.ttftMs
  out.loadedCachedTokens = nr.cachedTokens
  out.ttftRatio = nr.ttftMs && idle.ttftMs ? nr.ttftMs / idle.ttftMs : null
  if (out.loadT0 != null && nr.firstAt != null) {
    const count = (a, b) => run.times.reduce((s, x) => s + x.filter((y) => y > a && y <= b).length, 0)
    const before = count(out.loadT0, nr.startedAt)
    const during = count(nr.startedAt, nr.firstAt)
    out.beforeTps = nr.startedAt > out.loadT0 ? before / ((nr.startedAt - out.loadT0) / 1000) : null
    out.duringTps = nr.firstAt > nr.startedAt ? during / ((nr.firstAt - nr.startedAt) / 1000) : null
    out.beforeTokens = before
    out.duringTokens = during
    const ended = run.times.filter((x) => x.length && x[x.length - 1] < nr.firstAt).length
    if (ended) out.note = `${ended} of the 16 sessions ended before the new request's first token`
  }
  out.loadMaxTokens = mLoad
  return out
}

/** A deterministic numbered list of rules, grown until it is >= PREFIX_MIN_TOKENS tokens. */
function systemPrompt(rt) {
  let text = 'You are a helpful assistant for a school library. Follow these rules in every answer:\n'
  for (let i = 0; i < 200; i++) {
    if (rt.tokenize(text).length >= PREFIX_MIN_TOKENS + 10) break
    text += `${i + 1}. ${RULES[i % RULES.length]}\n`
  }
  return text
}

/** 16 sequential chat requests sharing `system`, each on its own session. */
async function prefixRun(rt, system, mode) {
  const per = []
  const t0 = performance.now()
  const hit0 = rt.stats().prefixCacheHitTokens
  for (let i = 0; i < PREFIX_SESSIONS; i++) {
    const q = QUESTIONS[i % QUESTIONS.length]
    const s = mode === 'chat' ? rt.createSession({ system }) : rt.createSession()
    const input = mode === 'chat' ? q : { tokens: rt.tokenize(`${system}\nQuestion: ${q}\nAnswer:`) }
    const t = performance.now()
    const stream = s.generate(input, { maxTokens: PREFIX_MAX_TOKENS, temperature: 0, experts: [] })
    let first = null
    for await (const _c of stream) if (first == null) first = performance.now()
    const u = stream.result?.usage ?? {}
    per.push({ ttftMs: first == null ? null : first - t, promptTokens: u.promptTokens, cachedTokens: u.cachedTokens, completionTokens: u.completionTokens })
    s.dispose()
  }
  const wallMs = performance.now() - t0
  return {
    promptTokens: per.reduce((a, p) => a + (p.promptTokens ?? 0), 0),
    cachedTokens: per.reduce((a, p) => a + (p.cachedTokens ?? 0), 0),
    prefixCacheHitTokens: rt.stats().prefixCacheHitTokens - hit0,
    wallMs,
    meanTtftMs: mean(per.map((p) => p.ttftMs).filter((x) => x != null)),
    per,
  }
}

async function prefixSavings(Runtime, spec, out) {
  const res = {}
  let system = null
  let mode = 'chat'
  for (const prefixCache of [true, false]) {
    const rt = await Runtime.load(spec.path, { threads: spec.threads, contextLength: spec.context ?? CONTEXT, kvCache: { prefixCache } })
    try {
      if (system == null) {
        system = systemPrompt(rt)
        res.systemTokens = rt.tokenize(system).length
        console.error(`[${spec.tag}] system prompt: ${res.systemTokens} tokens`)
        if (res.systemTokens < PREFIX_MIN_TOKENS) out.notes.push(`system prompt only ${res.systemTokens} tokens`)
      }
      // warm-up (threads, allocator) on an unrelated prompt; a chat failure switches to raw tokens
      try {
        const s = rt.createSession({ system: 'Be brief.' })
        await s.complete('Hello?', { maxTokens: 2, temperature: 0 })
        s.dispose()
      } catch (e) {
        if (mode === 'chat') out.notes.push(`chat input failed (${e.message}); prefix test uses raw tokens of system + question`)
        mode = 'tokens'
        await oursTtft(rt, tokens(0x55500, 16, spec.tokenRange), 2)
      }
      res[prefixCache ? 'on' : 'off'] = await prefixRun(rt, system, mode)
    } finally {
      await rt.dispose()
    }
  }
  res.mode = mode
  res.ttftRatio = res.on?.meanTtftMs && res.off?.meanTtftMs ? res.off.meanTtftMs / res.on.meanTtftMs : null
  res.wallRatio = res.on?.wallMs && res.off?.wallMs ? res.off.wallMs / res.on.wallMs : null
  return res
}

async function oursChild(spec) {
  const { Runtime } = require(join(root, 'dist', 'index.js'))
  const out = { engine: 'expert-runtime', notes: [], batch: {} }
  const tl = performance.now()
  const rt = await Runtime.load(spec.path, { threads: spec.threads, contextLength: spec.context ?? CONTEXT })
  out.loadMs = performance.now() - tl
  out.info = rt.info
  const step = async (name, f) => {
    const t = performance.now()
    try {
      return await f()
    } catch (e) {
      out.notes.push(`${name} failed: ${e.stack || e}`)
      return null
    } finally {
      console.error(`[${spec.tag}] ${name}: ${((performance.now() - t) / 1000).toFixed(1)} s`)
    }
  }
  await step('warm-up', () => oursBatch(rt, spec, 2, 4, null, 2))
  for (const n of spec.ns) {
    out.batch[n] = {}
    out.batch[n].none = await step(`N=${n}`, () => oursBatch(rt, spec, n, spec.m, null))
    out.batch[n].lora = await step(`N=${n} with LoRAs`, async () => {
      if (spec.adapters.length < n) throw new Error(`only ${spec.adapters.length} adapters`)
      const es = []
      try {
        for (let i = 0; i < n; i++) es.push(await rt.loadExpert(spec.adapters[i], { name: `b${i}` }))
        return await oursBatch(rt, spec, n, spec.m, (i) => [`b${i}`])
      } finally {
        for (const e of es) await e.unload()
      }
    })
  }
  out.ttft = await step('TTFT under load', () => ttftUnderLoad(rt, spec))
  const st = rt.stats()
  const nMax = Math.max(...spec.ns)
  const snap = out.batch[nMax]?.none?.statsAtT0
  out.kv = {
    kvBytesPerToken: st.kvBytesPerToken,
    kvBlockSize: st.kvBlockSize,
    kvBlocksTotal: st.kvBlocksTotal,
    statsIdle: st,
    busyN: nMax,
    statsBusy: snap ?? null,
    bytesPerUsedPosition: snap && snap.kvBlocksUsed ? snap.kvBytes / (snap.kvBlocksUsed * snap.kvBlockSize) : null,
  }
  await rt.dispose()
  out.prefix = await step('prefix cache', () => prefixSavings(Runtime, spec, out))
  return out
}

// ------------------------------------------------------------------------------------------
// child: node-llama-cpp
// ------------------------------------------------------------------------------------------

async function peerChild(spec) {
  const out = { engine: 'node-llama-cpp', notes: [], batch: {} }
  try {
    const { getLlama } = await import('node-llama-cpp')
    try { out.version = nodeLlamaCppVersion() } catch { /* version unknown */ }
    const llama = await getLlama({ gpu: false, build: 'never' })
    const tl = performance.now()
    const model = await llama.loadModel({ modelPath: spec.path })
    out.loadMs = performance.now() - tl
    const isEnd = (tok) => (typeof model.isEogToken === 'function' ? model.isEogToken(tok) : model.tokens?.eos === tok)
    const runN = async (n, m, seedN) => {
      const ctx = await model.createContext({ contextSize: n * (PROMPT + m + 8), sequences: n, threads: spec.threads, batchSize: 512 })
      try {
        const seqs = Array.from({ length: n }, () => ctx.getSequence())
        const run = await concurrent(n, (i) => seqs[i].evaluate(batchPrompt(spec, seedN, i), { temperature: 0 }), { isEnd, limit: m })
        const res = aggregate(run)
        res.eosEarly = run.times.filter((t) => t.length < m).map((t) => t.length)
        return res
      } finally {
        await ctx.dispose()
      }
    }
    await runN(2, 4, 2) // warm-up
    for (const n of spec.ns) {
      const t = performance.now()
      try {
        out.batch[n] = await runN(n, spec.m, n)
      } catch (e) {
        out.batch[n] = { error: String(e?.message ?? e) }
        out.notes.push(`N=${n} failed: ${e?.message ?? e}`)
      }
      console.error(`[${spec.tag}] peer N=${n}: ${((performance.now() - t) / 1000).toFixed(1)} s`)
    }
    await model.dispose()
    await llama.dispose?.()
  } catch (e) {
    out.error = String(e?.stack ?? e)
  }
  return out
}

// ------------------------------------------------------------------------------------------
// parent
// ------------------------------------------------------------------------------------------

/** The adapter directories of one model, written once. */
function ensureAdapters(cacheDir, tag, cfg, count) {
  const dirs = []
  for (let i = 0; i < count; i++) {
    const dir = join(cacheDir, 'bench-batch-experts', tag, `lora-r${RANK}-${i}`)
    dirs.push(dir)
    if (existsSync(join(dir, 'adapter_config.json')) && existsSync(join(dir, 'adapter_model.safetensors'))) continue
    writeLoraDir(dir, cfg, { rank: RANK, alpha: ALPHA, seed: 0xb0a0 + i, init: INIT, modules: MODULES })
    if (i === 0 || i === count - 1) console.error(`wrote ${dir}`)
  }
  return dirs
}

const tpsCell = (r) => (r?.error ? 'error' : r ? `${fmt(r.tps, 1)}${r.method === 'fallback' ? '*' : ''}` : '—')

/** Best of the repeats: highest tok/s per N and engine mode, lowest TTFT; the rest from run 1. */
function bestOurs(runs) {
  const ok = runs.filter(Boolean)
  if (!ok.length) return null
  const b = { ...ok[0], batch: {}, notes: [...new Set(ok.flatMap((r) => r.notes ?? []))], runs: ok }
  for (const n of Object.keys(ok[0].batch ?? {})) {
    b.batch[n] = {}
    for (const k of ['none', 'lora']) {
      const c = ok.map((r) => r.batch?.[n]?.[k]).filter((x) => x && x.tps != null)
      b.batch[n][k] = c.length ? c.reduce((a, x) => (x.tps > a.tps ? x : a)) : ok[0].batch?.[n]?.[k] ?? null
    }
  }
  const t = ok.map((r) => r.ttft).filter((x) => x && x.loadedTtftMs != null)
  if (t.length) b.ttft = t.reduce((a, x) => (x.loadedTtftMs < a.loadedTtftMs ? x : a))
  return b
}

function bestPeer(runs) {
  const ok = runs.filter((r) => r && !r.error)
  if (!ok.length) return runs[0] ?? null
  const b = { ...ok[0], batch: {}, notes: [...new Set(ok.flatMap((r) => r.notes ?? []))], runs }
  for (const n of Object.keys(ok[0].batch ?? {})) {
    const c = ok.map((r) => r.batch?.[n]).filter((x) => x && x.tps != null)
    b.batch[n] = c.length ? c.reduce((a, x) => (x.tps > a.tps ? x : a)) : ok[0].batch[n]
  }
  return b
}

function printModel(c, ours, peer, ns) {
  console.log(`\n### ${c.label} (${ours?.info?.architecture ?? '?'}, ${c.threads} threads, ${PROMPT}-token prompts, ${c.m} greedy tokens per session)\n`)
  if (!ours) console.log(`expert-runtime child failed: ${c.oursError}`)
  const b1 = ours?.batch?.[1]
  const p1 = peer?.batch?.[1]
  console.log('| N | ours tok/s | scaling | ours + LoRAs tok/s | scaling | peer tok/s | peer scaling | ours / peer |')
  console.log('|---:|---:|---:|---:|---:|---:|---:|---:|')
  for (const n of ns) {
    const o = ours?.batch?.[n]?.none
    const l = ours?.batch?.[n]?.lora
    const p = peer?.batch?.[n]
    const sc = (x, base) => (x?.tps && base?.tps ? `${fmt(x.tps / base.tps, 2)}x` : '—')
    const ratio = o?.tps && p?.tps ? `${fmt(o.tps / p.tps, 2)}x` : '—'
    console.log(`| ${n} | ${tpsCell(o)} | ${sc(o, b1?.none)} | ${tpsCell(l)} | ${sc(l, b1?.lora)} | ${peer?.error ? 'error' : tpsCell(p)} | ${sc(p, p1)} | ${ratio} |`)
  }
  console.log('\n`*` = fewer than 2N tokens between T0 and T1 (EOS from random weights): (all tokens after each first) / (last token - T0)')
  if (ours) {
    const bc = ns.map((n) => `${fmt(ours.batch?.[n]?.none?.busyCores, 2)}/${fmt(ours.batch?.[n]?.lora?.busyCores, 2)}`).join(', ')
    console.log(`busy cores in the window (no experts/LoRAs) for N=${ns.join(',')}: ${bc}; window tokens: ${ns.map((n) => ours.batch?.[n]?.none?.windowTokens ?? '—').join(', ')}`)
    const t = ours.ttft
    if (t) {
      console.log(`TTFT of a ${TTFT_PROMPT}-token prompt: idle ${fmt(t.idleTtftMs, 1)} ms, while ${LOAD_SESSIONS} sessions decode ${fmt(t.loadedTtftMs, 1)} ms (${fmt(t.ttftRatio, 2)}x); ` +
        `the ${LOAD_SESSIONS}' aggregate decode before ${fmt(t.beforeTps, 1)} tok/s (${t.beforeTokens ?? '—'} tokens), during its prefill ${fmt(t.duringTps, 1)} tok/s (${t.duringTokens ?? '—'} tokens)${t.note ? `; ${t.note}` : ''}`)
    }
    const k = ours.kv
    if (k) {
      console.log(`KV: ${k.kvBytesPerToken} bytes/token (stats), ${fmt(k.bytesPerUsedPosition, 1)} bytes per used block position while ${k.busyN} sessions decode ` +
        `(kvBlocksUsed ${k.statsBusy?.kvBlocksUsed ?? '—'} of ${k.kvBlocksTotal}, kvBytes ${k.statsBusy ? fmt(k.statsBusy.kvBytes / 2 ** 20, 1) + ' MiB' : '—'}, block ${k.kvBlockSize})`)
    }
    const p = ours.prefix
    if (p) {
      const line = (x) => (x ? `prompt ${x.promptTokens} tok, cached ${x.cachedTokens}, prefixCacheHitTokens ${x.prefixCacheHitTokens}, wall ${fmt(x.wallMs, 0)} ms, mean TTFT ${fmt(x.meanTtftMs, 1)} ms` : '—')
      console.log(`prefix cache (${p.systemTokens}-token system prompt, ${PREFIX_SESSIONS} sequential sessions, ${p.mode}): on: ${line(p.on)}; off: ${line(p.off)}; ` +
        `mean TTFT off/on ${fmt(p.ttftRatio, 2)}x, wall off/on ${fmt(p.wallRatio, 2)}x`)
    }
    for (const n of ours.notes ?? []) console.log(`note (ours): ${n.split('\n')[0]}`)
  }
  if (peer?.error) console.log(`peer failed: ${peer.error.split('\n')[0]}`)
  for (const n of peer?.notes ?? []) console.log(`note (peer): ${n}`)
}

async function parent(args) {
  assertBuilt()
  const { cacheDir, ensureSmolLM2 } = await import(join(root, 'scripts', 'assets.mjs'))
  const m = args.m ?? (args.quick ? 16 : 32)
  const ns = args.ns ?? NS
  const cases = []
  if (args.modelPath) {
    const cfgPath = args.config ?? join(dirname(args.modelPath), 'config.json')
    const cfg = JSON.parse(readFileSync(cfgPath, 'utf8'))
    const v = cfg.vocab_size
    cases.push({ tag: args.tag ?? 'custom', label: args.tag ?? args.modelPath, path: args.modelPath, cfg, tokenRange: v > TOKEN_RANGE[1] ? TOKEN_RANGE : [Math.min(10, v - 1), v - 10], peerNs: ns })
  } else {
    for (const name of args.models) {
      if (name === 'smollm2') {
        cases.push({ tag: 'smollm2-q4_1', label: 'SmolLM2-135M-Instruct Q4_1 GGUF', path: ensureSmolLM2(), cfg: SMOLLM2_CONFIG, tokenRange: TOKEN_RANGE, peerNs: ns })
      } else {
        const { ensureQwen3Bench } = await import(join(root, 'scripts', 'bench-model.mjs'))
        const q = ensureQwen3Bench()
        const cfg = JSON.parse(readFileSync(join(q.f32, 'config.json'), 'utf8'))
        cases.push({ tag: 'qwen3-0.6b-rand-q8_0', label: 'Qwen3-0.6B-rand Q8_0 GGUF', path: q.q8_0, cfg, tokenRange: TOKEN_RANGE, peerNs: args.quick ? ns.filter((n) => n <= 16) : ns })
      }
    }
  }
  for (const c of cases) {
    c.m = m
    c.threads = args.threads
    c.adapters = ensureAdapters(cacheDir, c.tag, c.cfg, Math.min(N_MAX, Math.max(...ns)))
    await warmPageCache(c.path)
  }

  const load0 = loadAtStart()
  const script = fileURLToPath(import.meta.url)
  const results = []
  for (const c of cases) {
    const oursRuns = []
    const peerRuns = []
    for (let rep = 0; rep < args.repeat; rep++) {
      const base = { tag: c.tag, path: c.path, threads: c.threads, quick: args.quick, m: c.m, tokenRange: c.tokenRange, context: Math.min(CONTEXT, c.cfg.max_position_embeddings ?? CONTEXT) }
      let idle = await waitIdleThenSay(args, rep, `${c.label}: expert-runtime`)
      try {
        oursRuns.push({ ...runChild(script, { ...base, kind: 'ours', ns, adapters: c.adapters }, `${c.tag} ours`), idleBefore: idle })
      } catch (e) {
        c.oursError = String(e.message).slice(0, 4000)
        console.error(c.oursError)
      }
      if (args.noPeer) continue
      idle = await waitIdleThenSay(args, rep, `${c.label}: node-llama-cpp`)
      try {
        peerRuns.push({ ...runChild(script, { ...base, kind: 'peer', ns: c.peerNs }, `${c.tag} peer`), idleBefore: idle })
      } catch (e) {
        peerRuns.push({ error: String(e.message).slice(0, 4000) })
      }
    }
    results.push({ tag: c.tag, label: c.label, path: c.path, m: c.m, ours: bestOurs(oursRuns), peer: args.noPeer ? null : bestPeer(peerRuns), oursError: c.oursError })
  }
  const load1 = os.loadavg()

  console.log(`\nexpert-runtime ${gitRev() ?? ''}: continuous batching, ${args.threads} threads, ${machineName()}, best of ${args.repeat}`)
  console.log(`aggregate decode tok/s = tokens in (T0 = all sessions have a first token, T1 = first session done] / (T1 - T0); ` +
    `LoRAs: session i uses its own rank-${RANK} LoRA on ${MODULES.length} modules; peer: node-llama-cpp (CPU), one context, N sequences`)
  for (let i = 0; i < cases.length; i++) printModel(cases[i], results[i].ours, results[i].peer, ns)
  console.log(`\n${loadSummary(load0, load1)}`)

  writeResults(args.out ?? resultsPath(cacheDir, 'batch'), {
    ...runInfo(args),
    quick: args.quick,
    machine: machineInfo(load0, load1),
    setup: {
      ns, prompt: PROMPT, maxTokens: m, tokenRange: TOKEN_RANGE, rank: RANK, alpha: ALPHA, modules: MODULES, init: INIT, context: CONTEXT,
      loadSessions: LOAD_SESSIONS, ttftPrompt: TTFT_PROMPT, prefixSessions: PREFIX_SESSIONS, prefixMaxTokens: PREFIX_MAX_TOKENS,
    },
    models: results,
  })
}

await benchMain(parseArgs(process.argv.slice(2)), parent, (spec) => (spec.kind === 'peer' ? peerChild(spec) : oursChild(spec)))
