// `npm run bench:experts [-- --quick] [-- --threads N] [-- --repeat N] [-- --wait-idle S]`: cost of
// run-time PEFT experts (LoRA) in expert-runtime: loading, attaching, detaching, and the decode /
// prefill overhead of active adapters.
//
// Base models: the Qwen3-0.6B-shaped random model of scripts/make_bench_model.py as Q8_0 GGUF
// (what CPU users run), with the adapters read in place from their files (the default),
// copied into memory (`mmap: false`), and stored as f16 (read in place), and unless --quick as
// f32 safetensors.
// Adapters: six random rank-16 LoRAs (alpha 32) on all seven projections (q/k/v/o, gate/up/down)
// of every layer, shapes read from the f32 config.json, written here (no Python) as PEFT
// directories into <cacheDir>/bench-experts/lora-r16-<i>/ once (F32, U(-0.01, 0.01), seeded).
//
// Each base model is measured in a fresh child process (this file with --child). In it:
//   1. load: every adapter is loaded and unloaded once (warm page cache and allocator), then
//      loadExpert is timed per adapter (median of six); file size and `expert.bytes` reported.
//   2. attach: right after loadExpert resolves, a fresh session runs a 16-token prompt with
//      `experts: [name]`, maxTokens 1: "load -> first token" is from loadExpert start to that
//      token; "attach" = that request's time to first token minus the TTFT of the same request
//      without experts run just before loadExpert (base), median of six pairs - what using a
//      just-loaded expert adds on top of the request itself (including the LoRA's compute over
//      16 prompt tokens). A second request with the same expert gives its steady-state TTFT.
//   3. detach: expert.unload() (median of six).
//   4. six together: loadExpert of all six, awaited one by one, then (after unloading them)
//      concurrently with Promise.all; total `bytes`.
//   5. decode: a fresh session per run, 64 seeded random prompt ids in [1000, 30000], greedy,
//      maxTokens 64 (--quick: 32) with 0, 1, 3 and 6 active LoRAs (per-request `experts`);
//      decode tok/s = (n - 1) / (time from first to last token), timed in JS as benches/cpu.mjs;
//      overhead per active LoRA = (t_k / t_0 - 1) / k, t = time per token. Runs go 0,1,3,6 then
//      6,3,1,0 and keep the best of each, so drift hits all alike. Random
//      weights may produce EOS (id in info.eosTokenIds) early; that is reported per run.
//   6. prefill: 512-token prompt, maxTokens 1, with 0 and 1 LoRA: prefill tok/s = 512 / TTFT.
//
// Both engine thread pools spin-wait, so any other load on the machine distorts figures (10x and
// more on a 2-core box): each child first waits for an idle second (--wait-idle), busy cores
// are recorded for decode, and --repeat N keeps the best of N runs of each figure.
//
// Results: a table on stdout, JSON under <cacheDir>/bench-results/experts-<date>.json.
import { existsSync, readFileSync, statSync } from 'node:fs'
import { createRequire } from 'node:module'
import os from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import {
  assertBuilt, benchMain, fmt, gitRev, loadAtStart, loadSummary, machineInfo, machineName, parseBenchArgs, randomTokens, resultsPath,
  root, runChild, runInfo, waitIdleThenSay, warmPageCache, writeLoraDir, writeResults,
} from './common.mjs'

const require = createRequire(import.meta.url)

const N_ADAPTERS = 6
const RANK = 16
const ALPHA = 32
const INIT = 0.01 // A, B ~ U(-INIT, INIT)
const MODULES = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj']
const ATTACH_PROMPT = 16
const DECODE_PROMPT = 64
const PREFILL_PROMPT = 512
const CONTEXT = 2048
const ACTIVE = [0, 1, 3, 6]
const TOKEN_RANGE = [1000, 30000]
// DESIGN §9 (attach, detach, six, overhead) and the stricter ones of the zero-copy experts work
// (loadExpert < 1 ms, unload < 1 ms, six with Promise.all < 6 ms).
const TARGETS = { loadMs: 1, attachMs: 10, attachGoalMs: 1, detachMs: 1, sixMs: 60, sixConcurrentMs: 6, overheadPct: 10 }

function parseArgs(argv) {
  return parseBenchArgs(argv, {
    usage: 'node benches/experts.mjs [--quick] [--threads N] [--repeat N] [--wait-idle SECONDS] [--out file.json]',
    help: [
      '  --quick          Q8_0 base only, 32 decode tokens',
      '  --repeat N       run every base model N times (fresh process each) and keep the best of each figure',
      '  --wait-idle S    before each run, wait up to S seconds (default 120, 0 = off) for a >= 90% idle second',
    ],
  })
}

/** Deterministic token ids. */
const tokens = (seed, n) => randomTokens(seed, n, TOKEN_RANGE)

const MB = 1024 * 1024
const median = (xs) => {
  const v = xs.filter((x) => typeof x === 'number' && Number.isFinite(x)).sort((a, b) => a - b)
  if (!v.length) return null
  const m = v.length >> 1
  return v.length % 2 ? v[m] : (v[m - 1] + v[m]) / 2
}

// ------------------------------------------------------------------------------------------
// adapters
// ------------------------------------------------------------------------------------------

/** Writes the six PEFT adapter directories once; returns their paths. */
function ensureAdapters(cacheDir, configPath, dtype = 'F32') {
  const cfg = JSON.parse(readFileSync(configPath, 'utf8'))
  const dirs = []
  for (let i = 0; i < N_ADAPTERS; i++) {
    const dir = join(cacheDir, 'bench-experts', `lora-r${RANK}${dtype === 'F32' ? '' : `-${dtype.toLowerCase()}`}-${i}`)
    dirs.push(dir)
    if (existsSync(join(dir, 'adapter_config.json')) && existsSync(join(dir, 'adapter_model.safetensors'))) continue
    writeLoraDir(dir, cfg, { rank: RANK, alpha: ALPHA, seed: 0xada0 + i, init: INIT, modules: MODULES, dtype })
    console.error(`wrote ${dir}`)
  }
  return dirs
}

// ------------------------------------------------------------------------------------------
// child: one base model, all figures
// ------------------------------------------------------------------------------------------

/** One request on a fresh session; returns TTFT, decode rate over first->last token, etc. */
async function timedRequest(rt, prompt, opts, tStart) {
  const s = rt.createSession()
  const times = []
  const ids = []
  const cpu1 = process.cpuUsage()
  let cpuFirst = null
  const t1 = performance.now()
  const stream = s.generate({ tokens: prompt }, { temperature: 0, ...opts })
  for await (const c of stream) {
    times.push(performance.now())
    if (!cpuFirst) cpuFirst = process.cpuUsage()
    ids.push(c.tokenId)
  }
  const cpu2 = process.cpuUsage()
  const r = stream.result
  s.dispose()
  const first = times[0]
  const last = times[times.length - 1]
  const decoded = times.length - 1
  const busy = (a, b, ms) => ((b.user - a.user + b.system - a.system) / 1000) / ms
  return {
    startToFirstMs: first - (tStart ?? t1),
    ttftMs: first - t1,
    decoded,
    decodeTps: decoded > 0 ? decoded / ((last - first) / 1000) : null,
    msPerToken: decoded > 0 ? (last - first) / decoded : null,
    decodeBusyCores: decoded > 0 ? busy(cpuFirst, cpu2, last - first) : null,
    prefillBusyCores: busy(cpu1, cpuFirst, first - t1),
    finishReason: r?.finishReason,
    cachedTokens: r?.usage?.cachedTokens,
    tokens: ids,
  }
}

async function child(spec) {
  const { Runtime } = require(join(root, 'dist', 'index.js'))
  const out = { notes: [] }
  const t0 = performance.now()
  const rt = await Runtime.load(spec.path, { threads: spec.threads, dtype: spec.dtype, contextLength: CONTEXT })
  out.baseLoadMs = performance.now() - t0
  out.info = rt.info
  const names = spec.adapters.map((_, i) => `lora${i}`)
  const fileBytes = spec.adapters.map((d) => statSync(join(d, 'adapter_model.safetensors')).size)

  // warm-up: engine threads, allocator, page cache of the adapters
  await timedRequest(rt, tokens(2, DECODE_PROMPT), { maxTokens: 4 })
  for (let i = 0; i < N_ADAPTERS; i++) {
    const e = await rt.loadExpert(spec.adapters[i], { name: names[i], mmap: spec.mmap })
    if (i === 0) out.expert = { kind: e.kind, rank: e.rank, targetModules: e.targetModules, bytes: e.bytes, mappedBytes: e.mappedBytes }
    if (i === 0) await timedRequest(rt, tokens(3, ATTACH_PROMPT), { maxTokens: 2, experts: [names[i]] })
    await e.unload()
  }

  // 1-3: per adapter: the request without experts (paired base TTFT), load, first request,
  // second request, unload
  const per = []
  for (let i = 0; i < N_ADAPTERS; i++) {
    const base = await timedRequest(rt, tokens(100 + i, ATTACH_PROMPT), { maxTokens: 1, experts: [] })
    const ta = performance.now()
    const e = await rt.loadExpert(spec.adapters[i], { name: names[i], mmap: spec.mmap })
    const loadMs = performance.now() - ta
    const first = await timedRequest(rt, tokens(200 + i, ATTACH_PROMPT), { maxTokens: 1, experts: [names[i]] }, ta)
    const second = await timedRequest(rt, tokens(300 + i, ATTACH_PROMPT), { maxTokens: 1, experts: [names[i]] })
    const bytes = e.bytes
    const tu = performance.now()
    await e.unload()
    const unloadMs = performance.now() - tu
    per.push({ baseTtftMs: base.ttftMs, attachMs: first.ttftMs - base.ttftMs, loadMs, loadToFirstTokenMs: first.startToFirstMs, firstTtftMs: first.ttftMs, secondTtftMs: second.ttftMs, unloadMs, bytes, fileBytes: fileBytes[i] })
  }
  out.perAdapter = per
  out.loadMs = median(per.map((p) => p.loadMs))
  out.loadToFirstTokenMs = median(per.map((p) => p.loadToFirstTokenMs))
  out.firstTtftMs = median(per.map((p) => p.firstTtftMs))
  out.secondTtftMs = median(per.map((p) => p.secondTtftMs))
  out.baseTtftMs = median(per.map((p) => p.baseTtftMs))
  out.attachMs = median(per.map((p) => p.attachMs))
  out.unloadMs = median(per.map((p) => p.unloadMs))
  out.bytes = median(per.map((p) => p.bytes))
  out.fileBytes = median(fileBytes)

  // 4: six together, sequential then concurrent (the concurrent set stays loaded for 5 and 6)
  let ts = performance.now()
  let es = []
  for (let i = 0; i < N_ADAPTERS; i++) es.push(await rt.loadExpert(spec.adapters[i], { name: names[i], mmap: spec.mmap }))
  out.sixSequentialMs = performance.now() - ts
  out.sixBytes = es.reduce((a, e) => a + e.bytes, 0)
  ts = performance.now()
  for (const e of es) await e.unload()
  out.sixUnloadMs = performance.now() - ts
  ts = performance.now()
  es = await Promise.all(spec.adapters.map((d, i) => rt.loadExpert(d, { name: names[i], mmap: spec.mmap })))
  out.sixConcurrentMs = performance.now() - ts
  if (rt.experts.length !== N_ADAPTERS) out.notes.push(`rt.experts has ${rt.experts.length} entries after loading six`)

  // 5: decode with 0, 1, 3, 6 active
  const decodeLen = spec.quick ? 32 : 64
  await timedRequest(rt, tokens(4, DECODE_PROMPT), { maxTokens: 4, experts: names })
  const order = [...ACTIVE, ...[...ACTIVE].reverse()]
  const dec = Object.fromEntries(ACTIVE.map((k) => [k, []]))
  for (const k of order) {
    const r = await timedRequest(rt, tokens(1, DECODE_PROMPT), { maxTokens: decodeLen, experts: names.slice(0, k) })
    dec[k].push(r)
  }
  out.decode = {}
  for (const k of ACTIVE) {
    const bestRun = dec[k].reduce((a, b) => ((b.decodeTps ?? 0) > (a.decodeTps ?? 0) ? b : a))
    const eos = dec[k].filter((r) => r.finishReason === 'stop').map((r) => r.decoded + 1)
    if (eos.length) out.notes.push(`decode with ${k} LoRAs: EOS ended generation early after ${eos.join(', ')} tokens (of ${decodeLen})`)
    out.decode[k] = { decodeTps: bestRun.decodeTps, msPerToken: bestRun.msPerToken, decoded: bestRun.decoded, busyCores: bestRun.decodeBusyCores, runs: dec[k].map(({ tokens: _t, ...r }) => r), tokens: bestRun.tokens }
  }
  for (const k of ACTIVE.slice(1)) out.decode[k].overheadPerLoraPct = overheadPct(out.decode[0].msPerToken, out.decode[k].msPerToken, k)

  // 6: prefill with 0 and 1 active
  out.prefill = {}
  for (const k of [0, 1]) {
    const r = await timedRequest(rt, tokens(5, PREFILL_PROMPT), { maxTokens: 1, experts: names.slice(0, k) })
    out.prefill[k] = { prefillTps: PREFILL_PROMPT / (r.ttftMs / 1000), ttftMs: r.ttftMs, busyCores: r.prefillBusyCores, cachedTokens: r.cachedTokens }
  }
  out.prefill.overheadPct = overheadPct(out.prefill[0].ttftMs, out.prefill[1].ttftMs, 1)

  for (const e of es) await e.unload()
  await rt.dispose()
  return out
}

const overheadPct = (t0, tk, k) => (t0 && tk ? ((tk / t0 - 1) / k) * 100 : null)

// ------------------------------------------------------------------------------------------
// parent
// ------------------------------------------------------------------------------------------

const spawnChild = (spec) => runChild(fileURLToPath(import.meta.url), spec, spec.path)

/** Best of the repeats, each figure on its own (fastest time, highest rate); overheads recomputed. */
function best(runs) {
  const pick = (get, f) => {
    const v = runs.map(get).filter((x) => typeof x === 'number' && Number.isFinite(x))
    return v.length ? f(...v) : null
  }
  const min = (get) => pick(get, Math.min)
  const b = {
    ...runs[0],
    baseTtftMs: min((r) => r.baseTtftMs),
    loadMs: min((r) => r.loadMs),
    loadToFirstTokenMs: min((r) => r.loadToFirstTokenMs),
    firstTtftMs: min((r) => r.firstTtftMs),
    secondTtftMs: min((r) => r.secondTtftMs),
    attachMs: min((r) => r.attachMs),
    unloadMs: min((r) => r.unloadMs),
    sixSequentialMs: min((r) => r.sixSequentialMs),
    sixConcurrentMs: min((r) => r.sixConcurrentMs),
    sixUnloadMs: min((r) => r.sixUnloadMs),
    decode: {},
    prefill: {},
    notes: [...new Set(runs.flatMap((r) => r.notes))],
    runs,
  }
  for (const k of ACTIVE) {
    const br = runs.map((r) => r.decode[k]).reduce((a, c) => ((c.decodeTps ?? 0) > (a.decodeTps ?? 0) ? c : a))
    b.decode[k] = { ...br }
  }
  for (const k of ACTIVE.slice(1)) b.decode[k].overheadPerLoraPct = overheadPct(b.decode[0].msPerToken, b.decode[k].msPerToken, k)
  for (const k of [0, 1]) b.prefill[k] = runs.map((r) => r.prefill[k]).reduce((a, c) => (c.prefillTps > a.prefillTps ? c : a))
  b.prefill.overheadPct = overheadPct(b.prefill[0].ttftMs, b.prefill[1].ttftMs, 1)
  return b
}

const verdict = (x, limit) => (x == null || !Number.isFinite(x) ? '' : x < limit ? 'ok' : 'MISS')

function printTable(rows) {
  // figure, unit, value per base, target
  const figures = [
    ['loadExpert (warm cache, median of 6)', 'ms', (r) => `${fmt(r.loadMs, 2)} ${verdict(r.loadMs, TARGETS.loadMs)}`, `< ${TARGETS.loadMs}`],
    ['  adapter file / expert.bytes', 'MB', (r) => `${fmt(r.fileBytes / MB, 1)} / ${fmt(r.bytes / MB, 1)}`, ''],
    ['  of which read in place (mappedBytes)', 'MB', (r) => fmt((r.expert?.mappedBytes ?? 0) / MB, 1), ''],
    ['16-token request TTFT, no expert (base)', 'ms', (r) => fmt(r.baseTtftMs, 2), ''],
    ['loadExpert start -> first token', 'ms', (r) => fmt(r.loadToFirstTokenMs, 2), ''],
    ['  first request TTFT with the new expert', 'ms', (r) => fmt(r.firstTtftMs, 2), ''],
    ['  second request TTFT, same expert', 'ms', (r) => fmt(r.secondTtftMs, 2), ''],
    ['attach = first TTFT - base TTFT (paired)', 'ms', (r) => `${fmt(r.attachMs, 2)} ${verdict(r.attachMs, TARGETS.attachMs)}`, `< ${TARGETS.attachMs} (goal < ${TARGETS.attachGoalMs})`],
    ['detach = unload() (median of 6)', 'ms', (r) => `${fmt(r.unloadMs, 2)} ${verdict(r.unloadMs, TARGETS.detachMs)}`, `< ${TARGETS.detachMs}`],
    ['six experts, loaded one by one', 'ms', (r) => `${fmt(r.sixSequentialMs, 1)} ${verdict(r.sixSequentialMs, TARGETS.sixMs)}`, `< ${TARGETS.sixMs}`],
    ['six experts, Promise.all', 'ms', (r) => `${fmt(r.sixConcurrentMs, 1)} ${verdict(r.sixConcurrentMs, TARGETS.sixConcurrentMs)}`, `< ${TARGETS.sixConcurrentMs}`],
    ['  six: total expert.bytes', 'MB', (r) => fmt(r.sixBytes / MB, 1), ''],
    ['  six: unload all', 'ms', (r) => fmt(r.sixUnloadMs, 2), ''],
    ...ACTIVE.map((k) => [`decode, ${k} active LoRA${k === 1 ? '' : 's'}`, 'tok/s', (r) => fmt(r.decode[k].decodeTps, 2), '']),
    ...ACTIVE.slice(1).map((k) => [`  decode overhead per LoRA (${k} active)`, '%', (r) => `${fmt(r.decode[k].overheadPerLoraPct, 1)} ${verdict(r.decode[k].overheadPerLoraPct, TARGETS.overheadPct)}`, `< ${TARGETS.overheadPct} (goal)`]),
    [`prefill ${PREFILL_PROMPT} tokens, no LoRA`, 'tok/s', (r) => fmt(r.prefill[0].prefillTps, 1), ''],
    [`prefill ${PREFILL_PROMPT} tokens, 1 LoRA`, 'tok/s', (r) => fmt(r.prefill[1].prefillTps, 1), ''],
    ['  prefill overhead (1 LoRA)', '%', (r) => fmt(r.prefill.overheadPct, 1), ''],
  ]
  const head = ['figure', 'unit', ...rows.map((r) => r.label), 'target']
  const lines = figures.map(([name, unit, get, target]) => [name, unit, ...rows.map(get), target])
  const w = head.map((h, i) => Math.max(h.length, ...lines.map((l) => l[i].length)))
  const last = head.length - 1
  const row = (cells) => cells.map((c, i) => (i < 2 || i === last ? c.padEnd(w[i]) : c.padStart(w[i]))).join('  ').trimEnd()
  console.log(row(head))
  console.log(w.map((n) => '-'.repeat(n)).join('  '))
  for (const l of lines) console.log(row(l))
}

async function parent(args) {
  assertBuilt()
  const { cacheDir } = await import(join(root, 'scripts', 'assets.mjs'))
  const { ensureQwen3Bench } = await import(join(root, 'scripts', 'bench-model.mjs'))
  const q = ensureQwen3Bench()
  const adapters = ensureAdapters(cacheDir, join(q.f32, 'config.json'))
  const halfAdapters = ensureAdapters(cacheDir, join(q.f32, 'config.json'), 'F16')
  // Adapters read in place from their files (the default), copied into memory, and the same
  // adapters stored as f16 (read in place, widened by the kernels), same run.
  const cases = [
    { key: 'qwen3-q8_0', label: 'Q8_0 GGUF', path: q.q8_0, mmap: true, adapters },
    { key: 'qwen3-q8_0-copied', label: 'Q8_0, mmap: false', path: q.q8_0, mmap: false, adapters },
    { key: 'qwen3-q8_0-f16', label: 'Q8_0, f16 adapters', path: q.q8_0, mmap: true, adapters: halfAdapters },
  ]
  if (!args.quick) cases.push({ key: 'qwen3-f32', label: 'f32 safetensors', path: q.f32, dtype: 'f32', mmap: true, adapters })
  for (const p of [...cases.map((c) => c.path), ...adapters, ...halfAdapters]) await warmPageCache(p)

  const load0 = loadAtStart()
  const runs = Object.fromEntries(cases.map((c) => [c.key, []]))
  for (let rep = 0; rep < args.repeat; rep++) {
    for (const c of cases) {
      const idle = await waitIdleThenSay(args, rep, c.label)
      const spec = { path: c.path, dtype: c.dtype, threads: args.threads, quick: args.quick, adapters: c.adapters, mmap: c.mmap }
      runs[c.key].push({ ...spawnChild(spec), idleBefore: idle })
    }
  }
  const load1 = os.loadavg()
  const rows = cases.map((c) => ({ key: c.key, label: c.label, ...best(runs[c.key]) }))

  const decodeLen = args.quick ? 32 : 64
  console.log(`\nexpert-runtime ${gitRev() ?? ''}: run-time LoRA experts on Qwen3-0.6B-rand, ${args.threads} threads, ` +
    `${machineName()}, best of ${args.repeat}`)
  console.log(`adapters: ${N_ADAPTERS} x LoRA r${RANK} alpha ${ALPHA} on ${MODULES.join(',')} of all ${rows[0].info?.numLayers ?? '?'} layers, F32 (f16 where the column says); ` +
    `decode: ${DECODE_PROMPT}-token prompt, ${decodeLen} greedy tokens; attach/TTFT: ${ATTACH_PROMPT}-token prompt, 1 token\n`)
  printTable(rows)
  for (const r of rows) {
    const bc = ACTIVE.map((k) => fmt(r.decode[k].busyCores, 2)).join('/')
    console.log(`  ${r.label}: decode busy cores ${ACTIVE.join('/')} LoRAs: ${bc} (of ${args.threads}); base load ${fmt(r.baseLoadMs, 0)} ms`)
    for (const n of r.notes) console.log(`  ${r.label}: ${n}`)
  }
  console.log(`  ${loadSummary(load0, load1)}`)

  writeResults(args.out ?? resultsPath(cacheDir, 'experts'), {
    ...runInfo(args),
    quick: args.quick,
    machine: machineInfo(load0, load1),
    setup: {
      adapters, rank: RANK, alpha: ALPHA, modules: MODULES, init: INIT, attachPrompt: ATTACH_PROMPT, decodePrompt: DECODE_PROMPT,
      decodeTokens: decodeLen, prefillPrompt: PREFILL_PROMPT, context: CONTEXT, active: ACTIVE, tokenRange: TOKEN_RANGE,
    },
    targets: TARGETS,
    rows,
  })
}

await benchMain(parseArgs(process.argv.slice(2)), parent, child)
