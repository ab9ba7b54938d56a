// `npm run bench:long-context [-- --depths 1024,4096,8192] [-- --dtypes f32,f16,bf16,q8_0,q4_0] [-- --model qwen3-0.6b|tiny] [-- --threads N] [-- --wait-idle S]`:
// long prompts on the Qwen3-0.6B-shaped random model (f32 safetensors, scripts/bench-model.mjs)
// with each KV pool dtype.
//
// `--model tiny` runs the same measurement on the qwen3-tiny test fixture (3 layers, 4 query
// and 2 KV heads of 32): its attention costs 1/149 of the 0.6B shape's per (query, key)
// pair, so 32k- and 128k-token prompts finish on a small CPU. Its speeds say nothing of the
// 0.6B model; its peak RSS shows what a prefill adds at those depths, where materialised
// `heads × seq × seq` scores would be 16 GiB (32k) and 256 GiB (128k).
//
// For every (dtype, depth) a fresh child process loads the model with contextLength depth + 64
// and kvCache { dtype, maxTokens: depth + 64 }, sends a seeded random prompt of `depth` token
// ids (greedy, maxTokens 32) and records: prefill tok/s (timings.prefillTokensPerSecond: prompt
// tokens / time to first token), decode tok/s at that depth (timings.tokensPerSecond),
// stats().kvBytesPerToken, and the peak RSS of the request over the RSS before it (after a
// 16-token warm-up request has paged the weights in and the peak mark has been reset: VmHWM −
// VmRSS, from /proc/self/status) — with the tiled attention kernels (never heads × seq × seq)
// this stays near the KV bytes written plus the activations of one 256-row step.
//
// Printed: a table per dtype and depth, decode and prefill ratios of each dtype against f32 at
// the same depth, and the KV bytes per token of the Qwen3-0.6B shape (28 layers, 8 KV heads,
// head_dim 128) per dtype with what a 131,072-token context needs (q8_0 / q4_0 block sizes as
// llama.cpp's: 34 and 18 bytes per 32 values, as the pool stores them).
// Results: JSON under <cacheDir>/bench-results/long-context-<date>.json.
import { createRequire } from 'node:module'
import { readFileSync, writeFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { cacheDir } from '../scripts/assets.mjs'
import { ensureQwen3Bench } from '../scripts/bench-model.mjs'
import {
  assertBuilt, benchMain, fmt, loadAtStart, loadSummary, machineInfo, machineName, parseBenchArgs, randomTokens, resultsPath, root,
  runChild, runInfo, waitIdleThenSay, warmPageCache, writeResults,
} from './common.mjs'

const require = createRequire(import.meta.url)
const self = fileURLToPath(import.meta.url)
const MAX_NEW = 32

const args = parseBenchArgs(process.argv.slice(2), {
  usage: 'node benches/long-context.mjs [--depths 1024,4096] [--dtypes f32,f16,bf16,q8_0,q4_0] [--threads N] [--wait-idle S] [--out FILE]',
  defaults: { depths: [1024, 4096], dtypes: ['f32', 'f16', 'bf16', 'q8_0', 'q4_0'], model: 'qwen3-0.6b' },
  extra: (k, next, a) => {
    if (k === '--depths') a.depths = next().split(',').map(Number)
    else if (k === '--dtypes') a.dtypes = next().split(',')
    else if (k === '--model') {
      a.model = next()
      if (!['qwen3-0.6b', 'tiny'].includes(a.model)) throw new Error(`--model: qwen3-0.6b or tiny, not ${a.model}`)
    }
    else return false
    return true
  },
})

/** kB fields of /proc/self/status, in bytes. */
function status() {
  const s = readFileSync('/proc/self/status', 'utf8')
  const kb = (k) => Number(s.match(new RegExp(`^${k}:\\s+(\\d+) kB`, 'm'))?.[1] ?? NaN) * 1024
  return { rss: kb('VmRSS'), hwm: kb('VmHWM') }
}

async function child({ model, dtype, depth, threads }) {
  const { Runtime } = require(`${root}/dist/index.js`)
  const rt = await Runtime.load(model, { contextLength: depth + 64, threads, kvCache: { dtype, maxTokens: depth + 64 } })
  const ids = [Math.min(1000, rt.info.vocabSize >> 2), Math.min(100000, rt.info.vocabSize)]
  // Page the mapped weights in with a short request first, then reset the peak-RSS mark
  // (Linux: clear_refs 5), so the request's peak counts only what it adds: KV blocks and
  // activations.
  await rt.createSession().complete({ tokens: randomTokens(7, 16, ids) }, { temperature: 0, maxTokens: 2 })
  writeFileSync('/proc/self/clear_refs', '5')
  const before = status()
  const s = rt.createSession()
  const prompt = randomTokens(depth, depth, ids)
  const r = await s.complete({ tokens: prompt }, { temperature: 0, maxTokens: MAX_NEW })
  const after = status()
  const out = {
    dtype,
    depth,
    kvCacheDtype: rt.info.kvCacheDtype,
    kvBytesPerToken: rt.stats().kvBytesPerToken,
    prefillTokS: r.timings.prefillTokensPerSecond,
    decodeTokS: r.timings.tokensPerSecond,
    completionTokens: r.usage.completionTokens,
    rssAfterLoadMB: before.rss / 2 ** 20,
    requestPeakMB: (after.hwm - before.rss) / 2 ** 20,
    kvWrittenMB: ((depth + MAX_NEW) * rt.stats().kvBytesPerToken) / 2 ** 20,
  }
  await rt.dispose()
  return out
}

/** KV bytes per token of the Qwen3-0.6B shape per pool dtype. */
function qwen3KvBytes() {
  const values = 28 * 2 * 8 * 128
  return { f32: values * 4, f16: values * 2, bf16: values * 2, q8_0: (values / 32) * 34, q4_0: (values / 32) * 18 }
}

async function parent(a) {
  assertBuilt()
  const tiny = a.model === 'tiny'
  const model = tiny ? `${root}/__test__/fixtures/qwen3-tiny` : ensureQwen3Bench().f32
  await warmPageCache(model)
  const load0 = loadAtStart()
  const rows = []
  for (const depth of a.depths) {
    for (const dtype of a.dtypes) {
      await waitIdleThenSay(a, 0, `${dtype} KV, ${depth}-token prompt`)
      rows.push(runChild(self, { model, dtype, depth, threads: a.threads }, `${dtype}@${depth}`))
    }
  }
  const load1 = loadAtStart()
  const title = tiny ? 'qwen3-tiny fixture (memory only; speeds are not the 0.6B model\'s)' : 'Qwen3-0.6B-shaped f32'
  console.log(`\n## Long context: ${title}, ${machineName()}, ${a.threads} threads\n`)
  console.log('| KV dtype | prompt | prefill tok/s | decode tok/s | vs f32 (prefill / decode) | KV B/token | request peak RSS growth | of which KV |')
  console.log('|---|---|---|---|---|---|---|---|')
  for (const r of rows) {
    const base = rows.find((x) => x.depth === r.depth && x.dtype === 'f32')
    const ratio = base ? `${fmt(r.prefillTokS / base.prefillTokS, 2)}× / ${fmt(r.decodeTokS / base.decodeTokS, 2)}×` : '—'
    console.log(`| ${r.dtype} | ${r.depth} | ${fmt(r.prefillTokS)} | ${fmt(r.decodeTokS)} | ${ratio} | ${r.kvBytesPerToken} | ${fmt(r.requestPeakMB, 0)} MB | ${fmt(r.kvWrittenMB, 0)} MB |`)
  }
  const kv = qwen3KvBytes()
  console.log('\n| KV dtype | bytes/token (Qwen3-0.6B shape) | 131,072 tokens |')
  console.log('|---|---|---|')
  for (const [d, b] of Object.entries(kv)) console.log(`| ${d} | ${b} | ${fmt((b * 131072) / 2 ** 30, 2)} GiB |`)
  console.log(`\n${loadSummary(load0, load1)}`)
  const name = tiny ? 'long-context-tiny' : 'long-context'
  writeResults(a.out ?? resultsPath(cacheDir, name), { ...runInfo(a), model: a.model, machine: machineInfo(load0, load1), rows, qwen3KvBytes: kv })
}

await benchMain(args, parent, child)
