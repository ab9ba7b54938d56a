// Soaks: long repetitive runs that show leaks and memory creep as RSS growth.
//
//   node scripts/soak.mjs stream-cancel [--cycles 1000]   SmolLM2, bounded KV pool: start a
//        stream, read a few chunks, leave it (break / abort / cancel / abandon in turn).
//        The pool (1,024 positions) is small enough to be fully in use before cycle 100, so
//        RSS measures everything else. Pass: RSS growth between cycle 100 and the last < 5%.
//   node scripts/soak.mjs load-cycle [--cycles 1000]      tiny fixture: load, generate, dispose.
//        Pass: RSS growth between cycle 100 and the last < 5 MB.
//   node scripts/soak.mjs reload-keep-session [--cycles 30]  SmolLM2: load, generate, dispose,
//        keeping every runtime's session and expert objects alive. Pass: RSS after the last
//        cycle within 5% of RSS after cycle 5 (a disposed runtime frees its model whatever JS
//        still holds).
//
// Prints one JSON line per sample and a summary line; exits 1 when the budget is exceeded.
// Run on a quiet machine only for timing; the figures here are memory, not time.
import { createRequire } from 'node:module'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'
import { ensureSmolLM2 } from './assets.mjs'
import { ensureBuilt } from './setup.mjs'

ensureBuilt()
const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')
setFlagsFromString('--expose-gc')
const gc = runInNewContext('gc')
const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const TINY = path.join(ROOT, '__test__', 'fixtures', 'qwen3-tiny')

const mode = process.argv[2]
const cyclesArg = process.argv.indexOf('--cycles')
const MB = 1024 * 1024

async function rss() {
  for (let i = 0; i < 3; i++) {
    gc()
    await new Promise((r) => setImmediate(r))
  }
  return process.memoryUsage().rss
}

function sample(cycle, bytes, extra = {}) {
  console.log(JSON.stringify({ mode, cycle, rssMB: +(bytes / MB).toFixed(1), ...extra }))
}

/** Bytes of the KV blocks ever used: the pool's resident part on CPU. */
function kvTouched(rt) {
  const s = rt.stats()
  return s.kvBlocksTouched * s.kvBlockSize * s.kvBytesPerToken
}

async function streamCancel(cycles) {
  const rt = await Runtime.load(ensureSmolLM2(), { kvCache: { maxTokens: 1024 } })
  const prompts = ['Tell me about the sea.', 'What is a prime number?', 'Write a haiku about rain.', 'Name three colours.']
  let at100 = 0
  for (let i = 1; i <= cycles; i++) {
    const s = rt.createSession()
    const ac = new AbortController()
    const stream = s.generate(prompts[i % prompts.length], { maxTokens: 64, seed: i, signal: ac.signal })
    const n = 1 + (i % 5)
    let seen = 0
    if (i % 4 === 3) {
      // Abandoned: read a chunk with a bare iterator and drop it (cancelled on collection).
      await stream[Symbol.asyncIterator]().next()
    } else {
      for await (const _ of stream) {
        if (++seen < n) continue
        if (i % 4 === 1) ac.abort()
        else if (i % 4 === 2) stream.cancel()
        else break
      }
    }
    if (i % 2 === 0) s.dispose()
    if (i === 100 || i % 100 === 0 || i === cycles) {
      const b = await rss()
      if (i === 100) at100 = b
      sample(i, b, { kvTouchedMB: +(kvTouched(rt) / MB).toFixed(1) })
    }
  }
  const end = await rss()
  await rt.dispose()
  const growth = (end - at100) / at100
  return { growthPercent: +(growth * 100).toFixed(2), pass: growth < 0.05 }
}

async function loadCycle(cycles) {
  let at100 = 0
  for (let i = 1; i <= cycles; i++) {
    const rt = await Runtime.load(TINY, { kvCache: { maxTokens: 1024 } })
    const s = rt.createSession()
    await s.complete('Hello there', { temperature: 0, maxTokens: 8 })
    await rt.dispose()
    if (i === 100 || i % 100 === 0 || i === cycles) {
      const b = await rss()
      if (i === 100) at100 = b
      sample(i, b)
    }
  }
  const end = await rss()
  const growth = end - at100
  return { growthMB: +(growth / MB).toFixed(2), pass: growth < 5 * MB }
}

async function reloadKeepSession(cycles) {
  const kept = []
  let at5 = 0
  for (let i = 1; i <= cycles; i++) {
    const rt = await Runtime.load(ensureSmolLM2(), { kvCache: { maxTokens: 4096 } })
    const s = rt.createSession({ system: 'You are terse.' })
    await s.complete('Say hi.', { temperature: 0, maxTokens: 8 })
    const stream = s.generate('And again.', { temperature: 0, maxTokens: 4 })
    kept.push({ rt, s, stream })
    await rt.dispose()
    const b = await rss()
    if (i === 5) at5 = b
    sample(i, b)
  }
  const end = await rss()
  const growth = (end - at5) / at5
  return { keptObjects: kept.length, growthPercent: +(growth * 100).toFixed(2), pass: growth < 0.05 }
}

const modes = { 'stream-cancel': [streamCancel, 1000], 'load-cycle': [loadCycle, 1000], 'reload-keep-session': [reloadKeepSession, 30] }
if (!modes[mode]) {
  console.error(`usage: node scripts/soak.mjs ${Object.keys(modes).join('|')} [--cycles N]`)
  process.exit(2)
}
const [run, dflt] = modes[mode]
const cycles = cyclesArg > 0 ? Number(process.argv[cyclesArg + 1]) : dflt
const t0 = Date.now()
const r = await run(cycles)
console.log(JSON.stringify({ mode, cycles, seconds: +((Date.now() - t0) / 1000).toFixed(1), ...r }))
process.exit(r.pass ? 0 : 1)
