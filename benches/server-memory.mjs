// `npm run bench:server-memory [-- --quick] [-- --threads N] [-- --wait-idle S]`: the OpenAI
// server's memory under a sustained load, with the default KV pool and with a pool bound the
// server chooses (`--kv-max-bytes`, i.e. `kvCache.maxBytes`), and after the load is gone (the
// pool gives its unused blocks back after `kvCache.idleReleaseMs`, here 2 s).
//
// SmolLM2-135M-Instruct Q4_1 (f32 KV cache: 46 KB per token). The load: 16 streaming chat
// requests at once, 480 in all (--quick 160), each a ~700-token prompt: a shared 120-token system
// prompt and one of 240 distinct documents, every document asked about twice (so the prefix cache
// is hit and keeps what it caches, as a real server's does), greedy, 8 tokens. Each run is a fresh
// child process hosting createServer(rt) on 127.0.0.1; its RSS is sampled every 100 ms.
// Reported per run: RSS after load (idle server), peak RSS under load, RSS at the end of the load,
// RSS after the idle give-back, the KV pool's touched and released blocks, errors.
import os from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import {
  assertBuilt, benchMain, pool, fmt, gitRev, loadAtStart, loadSummary, machineInfo, machineName, mulberry32, parseBenchArgs, resultsPath, root, runChild, runInfo,
  waitIdleThenSay, warmPageCache, writeResults,
} from './common.mjs'

const CONCURRENCY = 16
const IDLE_RELEASE_MS = 2000
const WORDS = 'the a of to in is on for with as by at from that this it be are was were data server memory cache block token model request answer river mountain city garden engine window planet music'.split(' ')
const SYSTEM = Array.from({ length: 60 }, (_, i) => WORDS[(i * 7) % WORDS.length]).join(' ')

/** Document `i`: ~580 tokens of seeded words. */
function doc(i) {
  const r = mulberry32(1000 + i)
  return Array.from({ length: 520 }, () => WORDS[Math.floor(r() * WORDS.length)]).join(' ')
}

async function child(spec) {
  const { Runtime } = await import(join(root, 'dist', 'index.js'))
  const { createServer } = await import(join(root, 'dist', 'server', 'index.js'))
  const kvCache = { idleReleaseMs: IDLE_RELEASE_MS, ...(spec.kvMaxBytes ? { maxBytes: spec.kvMaxBytes } : {}) }
  const rt = await Runtime.load(spec.model, { threads: spec.threads, kvCache })
  const server = createServer(rt, { modelName: 'smollm2' })
  const { port } = await server.listen(0, '127.0.0.1')
  const url = `http://127.0.0.1:${port}/v1/chat/completions`
  const rss = () => process.memoryUsage().rss / 2 ** 20
  const rssIdle = rss()
  let peak = rssIdle
  const sampler = setInterval(() => (peak = Math.max(peak, rss())), 100)
  const docs = spec.requests / 2
  const items = Array.from({ length: spec.requests }, (_, k) => (k * 7) % docs)
  let errors = 0
  const t0 = performance.now()
  await pool(items, CONCURRENCY, async (i) => {
    try {
      const res = await fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'smollm2', messages: [{ role: 'system', content: SYSTEM }, { role: 'user', content: `${doc(i)}\nSummarize this in one line.` }], max_tokens: 8, temperature: 0, stream: true }),
      })
      if (res.status !== 200) throw new Error(`status ${res.status}`)
      if (!(await res.text()).endsWith('data: [DONE]\n\n')) errors++
    } catch {
      errors++
    }
  })
  const wallS = (performance.now() - t0) / 1e3
  const rssLoaded = rss()
  const loaded = rt.stats()
  // Idle: the pool gives back what no request holds.
  const deadline = Date.now() + IDLE_RELEASE_MS + 10_000
  while (rt.stats().kvBlocksReleased === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100))
  await new Promise((r) => setTimeout(r, 200))
  clearInterval(sampler)
  const after = rt.stats()
  const rssReleased = rss()
  await server.close()
  await rt.dispose()
  return {
    label: spec.label, kvMaxBytes: spec.kvMaxBytes ?? null, errors, wallS,
    rssIdleMB: rssIdle, rssPeakMB: peak, rssLoadedMB: rssLoaded, rssReleasedMB: rssReleased,
    kvBytesPerToken: loaded.kvBytesPerToken, kvPoolMB: (loaded.kvBlocksTotal * loaded.kvBlockSize * loaded.kvBytesPerToken) / 2 ** 20,
    kvTouchedMB: (loaded.kvBlocksTouched * loaded.kvBlockSize * loaded.kvBytesPerToken) / 2 ** 20,
    kvTouchedAfterMB: (after.kvBlocksTouched * after.kvBlockSize * after.kvBytesPerToken) / 2 ** 20,
    kvBlocksReleased: after.kvBlocksReleased, prefixCacheHitTokens: loaded.prefixCacheHitTokens,
  }
}

async function parent(args) {
  assertBuilt()
  const { cacheDir, ensureSmolLM2 } = await import(join(root, 'scripts', 'assets.mjs'))
  const model = ensureSmolLM2()
  await warmPageCache(model)
  const me = fileURLToPath(import.meta.url)
  const requests = args.quick ? 160 : 480
  const load0 = loadAtStart()
  const runs = []
  for (const [label, kvMaxBytes] of [['default pool', null], ['kvCache.maxBytes 256 MiB', 256 * 2 ** 20]]) {
    await waitIdleThenSay(args, 0, `${label}: ${requests} requests, ${CONCURRENCY} at once`)
    runs.push(runChild(me, { label, model, threads: args.threads, requests, kvMaxBytes }, label))
  }
  const load1 = os.loadavg()
  console.log(`\nexpert-runtime ${gitRev() ?? ''}: OpenAI server memory under load, SmolLM2-135M Q4_1, ${args.threads} threads, ${machineName()}`)
  console.log(`${requests} streaming chat requests of ~700 tokens, ${CONCURRENCY} at once, each document twice; idle release after ${IDLE_RELEASE_MS / 1000} s\n`)
  for (const r of runs) {
    console.log(`${r.label.padEnd(26)} pool ${fmt(r.kvPoolMB, 0)} MB (touched ${fmt(r.kvTouchedMB, 0)} MB); RSS idle ${fmt(r.rssIdleMB, 0)} MB, peak ${fmt(r.rssPeakMB, 0)} MB, ` +
      `after the load ${fmt(r.rssLoadedMB, 0)} MB, after the idle give-back ${fmt(r.rssReleasedMB, 0)} MB (touched ${fmt(r.kvTouchedAfterMB, 0)} MB, ${r.kvBlocksReleased} blocks released); ` +
      `${fmt(r.wallS, 1)} s, errors ${r.errors}`)
  }
  console.log(`  ${loadSummary(load0, load1)}`)
  writeResults(args.out ?? resultsPath(cacheDir, 'server-memory'), { ...runInfo(args), machine: machineInfo(load0, load1), requests, concurrency: CONCURRENCY, runs })
}

await benchMain(parseBenchArgs(process.argv.slice(2), { usage: 'node benches/server-memory.mjs [--quick] [--threads N] [--wait-idle S] [--out FILE]' }), parent, child)
