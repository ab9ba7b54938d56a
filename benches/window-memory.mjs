// `npm run bench:window-memory [-- --depths 2048,8192]`: what Gemma 3 270M's sliding-window
// layers save in the KV pool. 15 of its 18 layers attend to the last 512 positions only; their
// table groups give the blocks behind the window back to the pool as a sequence advances
// (src/kv/block_table.rs), while the 3 global layers keep every position.
//
// For each depth, one session reads a prompt of that many tokens (the LICENSE text, repeated,
// BOS first) and writes 16 more. Printed per depth, from `Runtime.stats()`:
// - `peak`: the most KV bytes held while the request ran (polled every 20 ms, and after each
//   token), and `idle`: what the session holds once the request ended (its cache for the next
//   turn);
// - `all global`: what the same positions take with every layer keeping them, i.e.
//   `kvBytesPerToken × positions` rounded up to whole blocks (kvBytesPerToken counts every
//   layer's K and V for one position);
// - both ratios. The bound: at most 40% at 8k.
// Results: JSON under <cacheDir>/bench-results/window-memory-<date>.json.
import { createRequire } from 'node:module'
import { readFileSync, writeFileSync, mkdirSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { cacheDir, ensureGemma3 } from '../scripts/assets.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')

const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`)
  return i > 0 ? process.argv[i + 1] : dflt
}
const depths = arg('depths', '2048,8192').split(',').map(Number)
const NEW_TOKENS = 16

const modelPath = await ensureGemma3({ quiet: true })
const text = readFileSync(fileURLToPath(new URL('../LICENSE', import.meta.url)), 'utf8')
const rt = await Runtime.load(modelPath, { contextLength: Math.max(...depths) + 256 })
const bos = rt.tokenize('')[0]
const body = rt.tokenize(text).slice(1)
const results = []
for (const depth of depths) {
  const tokens = [bos]
  while (tokens.length < depth) tokens.push(...body.slice(0, depth - tokens.length))
  const session = rt.createSession()
  let peak = 0
  const poll = () => (peak = Math.max(peak, rt.stats().kvBytes))
  const timer = setInterval(poll, 20)
  const t0 = performance.now()
  for await (const _ of session.generate({ tokens }, { temperature: 0, maxTokens: NEW_TOKENS })) poll()
  clearInterval(timer)
  const seconds = (performance.now() - t0) / 1000
  const s = rt.stats()
  const positions = depth + NEW_TOKENS
  const blocks = Math.ceil(positions / s.kvBlockSize)
  const allGlobal = blocks * s.kvBlockSize * s.kvBytesPerToken
  const row = {
    depth,
    positions,
    peakBytes: peak,
    idleBytes: s.kvBytes,
    allGlobalBytes: allGlobal,
    peakRatio: peak / allGlobal,
    idleRatio: s.kvBytes / allGlobal,
    kvBlocksUsed: s.kvBlocksUsed,
    kvBlocksCached: s.kvBlocksCached,
    seconds,
  }
  results.push(row)
  session.dispose()
}
await rt.dispose()

const mib = (b) => (b / 2 ** 20).toFixed(2)
console.log('depth   peak MiB  idle MiB  all-global MiB  peak/all  idle/all  seconds')
for (const r of results) {
  console.log(
    `${String(r.depth).padEnd(7)} ${mib(r.peakBytes).padStart(8)}  ${mib(r.idleBytes).padStart(8)}  ${mib(r.allGlobalBytes).padStart(14)}  ${(100 * r.peakRatio).toFixed(1).padStart(7)}%  ${(100 * r.idleRatio).toFixed(1).padStart(7)}%  ${r.seconds.toFixed(1).padStart(7)}`,
  )
}
const dir = join(cacheDir, 'bench-results')
mkdirSync(dir, { recursive: true })
const out = join(dir, `window-memory-${new Date().toISOString().slice(0, 10)}.json`)
writeFileSync(out, JSON.stringify({ model: 'gemma-3-270m-q4_k_m', results }, null, 2))
console.log(`results: ${out}`)
