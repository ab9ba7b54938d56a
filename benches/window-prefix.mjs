// `npm run bench:window-prefix [-- --prefix 1024 --sessions 6]`: a shared prompt prefix longer
// than Gemma 3 270M's 512-position window, reused by later sessions through the prefix cache.
//
// Two unrelated sessions run first (their window layers give blocks back to the pool that no
// prompt asks for again, as in a server's mixed traffic). Then `--sessions` sessions each read
// the same prefix (BOS and the LICENSE text) plus a suffix of their own, and write 16 tokens.
// Printed per session: the prompt tokens served from the cache (`usage.cachedTokens`) and the
// time to first token; then the cold session's time to first token over the mean of the
// others'. A later session reads the global layers' blocks from the idle sessions' tables,
// and the window layers' last blocks before the prefix's end from the pool's cache.
// Results: JSON under <cacheDir>/bench-results/window-prefix-<date>.json.
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
const PREFIX = Number(arg('prefix', '1024'))
const SESSIONS = Number(arg('sessions', '6'))

const modelPath = await ensureGemma3({ quiet: true })
const text = readFileSync(fileURLToPath(new URL('../LICENSE', import.meta.url)), 'utf8')
const rt = await Runtime.load(modelPath, { contextLength: PREFIX + 256 })
const bos = rt.tokenize('')[0]
const body = rt.tokenize(text).slice(1)
const fill = (n, offset) => {
  const out = [bos]
  for (let i = offset; out.length < n; i++) out.push(body[i % body.length])
  return out
}
const opts = { temperature: 0, maxTokens: 16 }
const keep = []
for (const offset of [101, 557]) {
  const s = rt.createSession()
  keep.push(s)
  await s.complete({ tokens: fill(PREFIX, offset) }, opts)
}
const prefix = fill(PREFIX, 0)
const rows = []
for (let i = 0; i < SESSIONS; i++) {
  const s = rt.createSession()
  keep.push(s)
  const suffix = rt.tokenize(`\nQuestion ${i + 1}: what does clause ${i + 2} say?\nAnswer:`).slice(1)
  const r = await s.complete({ tokens: [...prefix, ...suffix] }, opts)
  rows.push({ session: i + 1, promptTokens: r.usage.promptTokens, cachedTokens: r.usage.cachedTokens, ttftMs: r.timings.ttftMs })
  console.log(`session ${i + 1}: ${r.usage.promptTokens} prompt tokens, ${r.usage.cachedTokens} from the cache, first token in ${r.timings.ttftMs.toFixed(1)} ms`)
}
const warm = rows.slice(1)
const meanWarm = warm.reduce((a, r) => a + r.ttftMs, 0) / warm.length
const result = {
  model: 'gemma-3-270m Q4_K_M',
  prefix: prefix.length,
  sessions: rows,
  warmHits: warm.filter((r) => r.cachedTokens >= Math.floor(prefix.length / 16) * 16).length,
  coldOverWarmTtft: rows[0].ttftMs / meanWarm,
  date: new Date().toISOString(),
}
console.log(`later sessions served the whole prefix from the cache: ${result.warmHits} of ${warm.length}; time to first token, cold / warm mean: ${result.coldOverWarmTtft.toFixed(2)}x`)
const dir = join(cacheDir, 'bench-results')
mkdirSync(dir, { recursive: true })
writeFileSync(join(dir, `window-prefix-${result.date.slice(0, 10)}.json`), JSON.stringify(result, null, 2))
await rt.dispose()
