// `node benches/gpu.mjs --model DIR [--hf HF.json] [--loras D1,D2,..] [--out OUT.json] [--quick]
//                      [--device cuda] [--dtype bf16] [--sessions 64]`
// `node benches/gpu.mjs --model DIR --write-loras DIR [--lora-count 4]` writes the LoRAs first.
// Our side of the GPU figures that scripts/gpu-check.sh puts next to HF transformers
// (scripts/gpu_reference.py writes HF.json from the same model directory, the same LoRA
// directories and the same workload, in the same run):
//   load_s                 Runtime.load() until ready (weights on the device, KV pool allocated)
//   decode_tok_s_batch1    one session, a 16-token random prompt, greedy: (tokens − 1) / (last − first chunk),
//                          the median of 3 runs
//   prefill_tok_s          a 512-token random prompt (--quick 128), maxTokens 1: prompt / TTFT (median of 3)
//   sessions_tok_s         N sessions (--sessions, default 64; --quick 8), distinct 16-token prompts,
//                          all started in one tick; aggregate decode tok/s as in batch.mjs (common.mjs
//                          `aggregate`: tokens in (all started, first finished] / that time)
//   sessions_mixed_tok_s   the same with the LoRAs: session r runs the base when r % (k+1) == 0, else
//                          LoRA (r % (k+1)) − 1, the assignment gpu_reference.py gives PEFT
//   lora_load_s            loading the LoRAs one after another (HF: PeftModel.from_pretrained + load_adapter)
//   expert_attach_ms       loadExpert of one LoRA whose files are in the page cache, and unload: medians of 5
//   device memory          deviceMemoryTotal − deviceMemoryFree after load and at the peak of the
//                          session runs, and the KV bytes on the device then; the KV pool holds
//                          what the sessions need (16 + decode tokens + 16 positions each)
// Decode lengths: 128 tokens (--quick 32), as in gpu_reference.py.
import { readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { Runtime } from '../dist/index.js'
import { aggregate, concurrent, deviceMemoryUsed, parseBenchArgs, randomTokens, writeLoraDir } from './common.mjs'

const args = parseBenchArgs(process.argv.slice(2), {
  usage: 'node benches/gpu.mjs --model DIR [--hf HF.json] [--loras D1,D2] [--out OUT.json] [--quick] [--device cuda] [--dtype bf16] [--sessions N]',
  defaults: { device: 'cuda', dtype: 'bf16' },
  extra: (k, next, a) => {
    const key = k.replace(/^--/, '')
    if (['model', 'hf', 'loras', 'device', 'dtype', 'write-loras'].includes(key)) a[key] = next()
    else if (key === 'sessions' || key === 'lora-count') a[key] = Number(next())
    else return false
    return true
  },
})
if (!args.model) throw new Error('--model DIR is required')
const config = JSON.parse(readFileSync(join(args.model, 'config.json'), 'utf8'))

// `--write-loras DIR --lora-count K`: write K random rank-16 LoRAs on all seven projections for
// this model's shapes (PEFT directories, F32; read by PEFT and by us), print their paths, exit.
if (args['write-loras']) {
  const dirs = Array.from({ length: args['lora-count'] ?? 4 }, (_, i) => join(args['write-loras'], `lora-r16-${i}`))
  dirs.forEach((d, i) => writeLoraDir(d, config, { rank: 16, alpha: 32, seed: 100 + i }))
  console.log(dirs.join(','))
  process.exit(0)
}
const decodeTokens = args.quick ? 32 : 128
const prefillTokens = args.quick ? 128 : 512
const sessions = args.sessions ?? (args.quick ? 8 : 64)
const range = [0, Math.min(config.vocab_size, 150000)]


async function timedChunks(session, input, opts) {
  const stamps = []
  for await (const _ of session.generate(input, opts)) stamps.push(performance.now())
  return stamps
}

/** N sessions at once; `experts(r)` gives session r's set. Returns tok/s and the peaks seen. */
async function sessionsRun(rt, n, experts) {
  const ss = Array.from({ length: n }, () => rt.createSession())
  let peakMem = 0
  let peakKv = 0
  const run = await concurrent(n, (r) => ss[r].generate({ tokens: randomTokens(1000 + r, 16, range) },
    { maxTokens: decodeTokens, temperature: 0, experts: experts(r) }), {
    onChunk: () => {
      peakMem = Math.max(peakMem, deviceMemoryUsed(rt) ?? 0)
      peakKv = Math.max(peakKv, rt.stats().kvDeviceBytes)
    },
  })
  for (const s of ss) s.dispose()
  const a = aggregate(run)
  return { tokS: a.tps, method: a.method, peakMem, peakKv }
}

const t = performance.now()
// The pool holds what the workload needs, as HF's cache does: every session's 16-token prompt and
// its decode tokens, a 16-position block of slack each (the prefill runs need less).
const poolTokens = Math.max(sessions, 8) * (16 + decodeTokens + 16)
const rt = await Runtime.load(args.model, { device: args.device, dtype: args.dtype, kvCache: { maxTokens: poolTokens } })
const loadS = (performance.now() - t) / 1000
const info = rt.info
const afterLoad = deviceMemoryUsed(rt)
console.error(`loaded in ${loadS.toFixed(2)} s on ${info.deviceName} (${info.device}, ${info.dtype}, ${info.binary} build)`)

// Warm-up: kernels load and cuBLAS picks its algorithms on the first calls.
await timedChunks(rt.createSession(), { tokens: randomTokens(7, 16, range) }, { maxTokens: 8, temperature: 0 })

// Batch-1 decode: the median of 3 runs (a step is bound by the host's work, which varies).
const decodes = []
let single
for (let i = 0; i < 3; i++) {
  single = await timedChunks(rt.createSession(), { tokens: randomTokens(11 + i, 16, range) }, { maxTokens: decodeTokens, temperature: 0 })
  decodes.push((single.length - 1) / ((single.at(-1) - single[0]) / 1000))
}
const decode = decodes.sort((a, b) => a - b)[1]

const prefills = []
for (let i = 0; i < 3; i++) {
  const r = await rt.createSession().complete({ tokens: randomTokens(100 + i, prefillTokens, range) }, { maxTokens: 1, temperature: 0 })
  prefills.push(prefillTokens / (r.timings.ttftMs / 1000))
}
const prefill = prefills.sort((a, b) => a - b)[1]

const many = await sessionsRun(rt, sessions, () => [])
const loras = args.loras ? args.loras.split(',').filter(Boolean) : []
// Attaching and detaching one LoRA (files in the page cache): the median of 5 cycles.
const attach = []
const detach = []
for (let i = 0; loras.length && i < 5; i++) {
  let t0 = performance.now()
  const e = await rt.loadExpert(loras[0], { name: `probe${i}` })
  attach.push(performance.now() - t0)
  t0 = performance.now()
  await e.unload()
  detach.push(performance.now() - t0)
}
const median = (xs) => (xs.length ? xs.sort((a, b) => a - b)[xs.length >> 1] : null)
const names = []
const tLoras = performance.now()
for (const [i, dir] of loras.entries()) names.push((await rt.loadExpert(dir, { name: `e${i}` })).name)
const loraLoadS = loras.length ? (performance.now() - tLoras) / 1000 : null
const mixed = names.length ? await sessionsRun(rt, sessions, (r) => (r % (names.length + 1) === 0 ? [] : [names[(r % (names.length + 1)) - 1]])) : null

const ours = {
  device_name: info.deviceName, device: info.device, dtype: info.dtype, binary: info.binary,
  load_s: loadS, decode_tok_s_batch1: decode, decode_tokens: single.length, prefill_tok_s: prefill, prefill_tokens: prefillTokens,
  sessions, sessions_tok_s: many.tokS, sessions_mixed_tok_s: mixed?.tokS ?? null, sessions_method: many.method, loras: names.length,
  lora_load_s: loraLoadS, expert_attach_ms: median(attach), expert_detach_ms: median(detach),
  scaling_sessions_over_batch1: many.tokS / decode, scaling_mixed_over_batch1: mixed ? mixed.tokS / decode : null,
  device_memory_total: info.deviceMemoryTotal, device_memory_after_load: afterLoad,
  device_memory_peak: Math.max(many.peakMem, mixed?.peakMem ?? 0) || null, kv_device_bytes_peak: Math.max(many.peakKv, mixed?.peakKv ?? 0),
  kv_pool_tokens: poolTokens, memory_account: rt.stats().memory,
}
await rt.dispose()

const hf = args.hf ? JSON.parse(readFileSync(args.hf, 'utf8')) : null
const rows = [
  ['load (s)', ours.load_s, hf?.load_s, 'lower'],
  ['decode batch 1 (tok/s)', ours.decode_tok_s_batch1, hf?.decode_tok_s_batch1],
  [`prefill ${prefillTokens} (tok/s)`, ours.prefill_tok_s, hf?.prefill_tok_s],
  [`${sessions} sessions (tok/s)`, ours.sessions_tok_s, hf?.sessions_tok_s],
  [`${sessions} sessions, ${names.length} LoRAs mixed (tok/s)`, ours.sessions_mixed_tok_s, hf?.sessions_mixed_tok_s],
  [`load ${names.length} LoRAs (s)`, ours.lora_load_s, hf?.lora_load_s, 'lower'],
  ['device memory at peak (GB)', ours.device_memory_peak && ours.device_memory_peak / 1e9, hf?.device_memory_bytes && hf.device_memory_bytes / 1e9, 'lower'],
]
const f = (x) => (x === null || x === undefined ? '—' : x >= 100 ? x.toFixed(0) : x.toFixed(2))
console.log(`| figure | expert-runtime | HF transformers | ratio |\n|---|---:|---:|---:|`)
for (const [name, a, b, better] of rows) {
  const ratio = a && b ? (better === 'lower' ? b / a : a / b) : null
  console.log(`| ${name} | ${f(a)} | ${f(b)} | ${ratio ? `${ratio.toFixed(2)}×` : '—'} |`)
}
console.log(`attach one rank-16 LoRA: ${f(ours.expert_attach_ms)} ms, detach: ${f(ours.expert_detach_ms)} ms (median of 5)`)
const gb = (x) => f(x == null ? null : x / 1e9)
console.log(`device memory: after load ${gb(ours.device_memory_after_load)} GB, at peak ${gb(ours.device_memory_peak)} GB ` +
  `(engine account ${JSON.stringify(ours.memory_account)}, KV pool ${poolTokens} positions); HF: max allocated ` +
  `${gb(hf?.device_memory_bytes)} GB, held on the device ${gb(hf?.device_used_after)} GB of which ${gb(hf?.device_used_before_load)} GB before the load`)
console.log(`${sessions}-session scaling over batch 1: ${f(ours.scaling_sessions_over_batch1)}× (mixed experts: ${f(ours.scaling_mixed_over_batch1)}×)`)
if (args.out) writeFileSync(args.out, JSON.stringify({ ours, hf }, null, 2) + '\n')
