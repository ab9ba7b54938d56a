// `node benches/gpu-prefill.mjs --model DIR [--hf HF.json] [--lengths 512,2048,8192] [--out OUT.json]
//                              [--device cuda] [--dtype bf16]`
// Prefill on a GPU, on the CUDA prefill path (src/model/cuda_decode/prefill.rs) and on the generic
// candle path (a second runtime loaded with EXPERT_RUNTIME_CUDA_PREFILL=0), in one process; HF
// transformers' figures for the same model and lengths come from HF.json
// (scripts/gpu_reference.py bench --prefill-lengths, sdpa and eager attention, the same run):
//   prefill_tok_s[L]      a random L-token prompt, maxTokens 1: L / TTFT, the median of 3 after a
//                         warm-up (every prompt distinct, so the prefix cache serves none of it;
//                         the engine reads up to 2,048 prompt rows a pass); on the prefill path as
//                         shipped, with its attention's key split forced to 1 and to 2 warps per
//                         row group (EXPERT_RUNTIME_CUDA_PREFILL_SPLIT), and on the generic path
//   check                 one 512-token prompt on both paths: the first token's greedy pick on
//                         each, and the largest |Δlogprob| over the generic path's top 5 (bf16 on
//                         both: they round at different points)
//   memory                deviceMemoryTotal − deviceMemoryFree after the load, and the engine's
//                         own account (`stats().memory`), on the prefill path's runtime
// scripts/gpu-check.sh runs it with --bench; the figures go to BENCHMARKS.md › GPU.
import { readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { Runtime } from '../dist/index.js'
import { deviceMemoryUsed, parseBenchArgs, randomTokens } from './common.mjs'

const args = parseBenchArgs(process.argv.slice(2), {
  usage: 'node benches/gpu-prefill.mjs --model DIR [--hf HF.json] [--lengths 512,2048,8192] [--out OUT.json]',
  defaults: { device: 'cuda', dtype: 'bf16', lengths: '512,2048,8192' },
  extra: (k, next, a) => {
    const key = k.replace(/^--/, '')
    if (!['model', 'hf', 'device', 'dtype', 'lengths'].includes(key)) return false
    a[key] = next()
    return true
  },
})
if (!args.model) throw new Error('--model DIR is required')
const lengths = args.lengths.split(',').map(Number)
if (!lengths.every((n) => Number.isInteger(n) && n > 0)) throw new Error('--lengths: positive integers')
const config = JSON.parse(readFileSync(join(args.model, 'config.json'), 'utf8'))
const range = [0, Math.min(config.vocab_size, 150000)]
const longest = Math.max(...lengths, 512)

/** One runtime's figures, with `env` set while it runs (the engine reads the switches at its
 *  first pass). */
async function measure(label, env) {
  const saved = { ...process.env }
  Object.assign(process.env, env)
  const rt = await Runtime.load(args.model, { device: args.device, dtype: args.dtype, kvCache: { maxTokens: 2 * longest + 1024 } })
  try {
    const afterLoad = deviceMemoryUsed(rt)
    const memory = rt.stats().memory
    // Warm-up: kernels load, cuBLAS picks its algorithms, the prefill buffers are allocated.
    await rt.createSession().complete({ tokens: randomTokens(5, 2048, range) }, { maxTokens: 1, temperature: 0 })
    const tokS = {}
    for (const n of lengths) {
      const runs = []
      for (let i = 0; i < 3; i++) {
        const r = await rt.createSession().complete({ tokens: randomTokens(1000 * n + i, n, range) }, { maxTokens: 1, temperature: 0 })
        runs.push(n / (r.timings.ttftMs / 1000))
      }
      tokS[n] = runs.sort((a, b) => a - b)[1]
      console.error(`${label}: prefill ${n} tokens ${tokS[n].toFixed(0)} tok/s`)
    }
    let first
    for await (const c of rt.createSession().generate({ tokens: randomTokens(77, 512, range) }, { maxTokens: 1, temperature: 0, topLogprobs: 20 })) first = c
    return { tokS, first, afterLoad, memory }
  } finally {
    await rt.dispose()
    for (const k of Object.keys(env)) if (saved[k] === undefined) delete process.env[k]
  }
}

const fast = await measure('prefill path', {})
const split1 = await measure('prefill path, key split 1', { EXPERT_RUNTIME_CUDA_PREFILL_SPLIT: '1' })
const split2 = await measure('prefill path, key split 2', { EXPERT_RUNTIME_CUDA_PREFILL_SPLIT: '2' })
const generic = await measure('generic path', { EXPERT_RUNTIME_CUDA_PREFILL: '0' })
let worst = 0
for (const t of generic.first.topLogprobs.slice(0, 5)) {
  const ours = fast.first.topLogprobs.find((x) => x.tokenId === t.tokenId)
  worst = Math.max(worst, ours ? Math.abs(ours.logprob - t.logprob) : Infinity)
}
const check = { same_greedy: fast.first.tokenId === generic.first.tokenId, max_abs_dlogprob_top5: worst }
const hf = args.hf ? JSON.parse(readFileSync(args.hf, 'utf8')) : null
const hfAt = (impl, n) => hf?.prefill_by_len?.[`${impl}:${n}`] ?? null
const f = (x) => (x === null || x === undefined ? '—' : x.toFixed(0))
const r = (a, b) => (a && b ? `${(a / b).toFixed(2)}×` : '—')
console.log('| prompt tokens | prefill path (tok/s) | key split 1 | key split 2 | generic path | HF sdpa | HF eager | ours / generic | ours / HF sdpa | ours / HF eager |')
console.log('|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|')
for (const n of lengths) {
  const [a, g, s, e] = [fast.tokS[n], generic.tokS[n], hfAt('sdpa', n), hfAt('eager', n)]
  console.log(`| ${n} | ${f(a)} | ${f(split1.tokS[n])} | ${f(split2.tokS[n])} | ${f(g)} | ${f(s)} | ${f(e)} | ${r(a, g)} | ${r(a, s)} | ${r(a, e)} |`)
}
console.log(`512-token prompt, first token: same greedy pick on both paths: ${check.same_greedy}; max |Δlogprob| over the top 5: ${worst.toFixed(4)}`)
console.log(`device memory after load: ${((fast.afterLoad ?? 0) / 1e9).toFixed(2)} GB; engine account: ${JSON.stringify(fast.memory)}`)
if (args.out) writeFileSync(args.out, JSON.stringify({ ours: { prefill: fast.tokS, split1: split1.tokS, split2: split2.tokS, generic: generic.tokS, check, memory: fast.memory, after_load: fast.afterLoad }, hf }, null, 2) + '\n')
