// `npm run bench:server [-- --quick] [-- --threads N] [-- --repeat N] [-- --wait-idle S]`: the
// OpenAI-compatible server under load, against the same load through the in-process API.
//
// SmolLM2-135M-Instruct Q4_1 with experts/sql-smollm2 and experts/shell-smollm2. The load: 256
// chat requests (--quick 64), at most 64 at once, each a short question, greedy, max 32 tokens,
// cycling through the base model, `sql` and `shell` (one third each). Each side runs in a fresh
// child process (this file with --child):
//   - in-process: 64 workers take requests from the queue and run them with
//     rt.createSession().generate(messages, { experts }) (a fresh session per request, as the
//     server makes one);
//   - HTTP: the same process also hosts createServer(rt) on 127.0.0.1, and 64 fetch() workers
//     send the same requests as streaming chat completions and read the SSE to `data: [DONE]`.
// Reported: errors, streams that ended without [DONE], completion tokens, wall time, aggregate
// tok/s, and for HTTP the process RSS before and after the load; the ratio HTTP / in-process
// (target ≥ 0.9). During the HTTP load, /metrics is scraped every 50 ms (the inference
// gateway's interval): the cost of building the text (prom-client's registry, our series and
// the vllm: ones; CPU time on the event loop) and the round trip a scraper on 127.0.0.1 sees
// (which includes waiting behind the 64 streams' work on the same loop), median and p99.
import os from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import {
  assertBuilt, benchMain, pool, fmt, gitRev, loadAtStart, loadSummary, machineInfo, machineName, parseBenchArgs, resultsPath, root, runChild, runInfo,
  waitIdleThenSay, warmPageCache, writeResults,
} from './common.mjs'

const CONCURRENCY = 64
const MAX_TOKENS = 32
const QUESTIONS = [
  'How many orders were shipped last week?', 'List the users who live in Paris.', 'Show the disk usage of my home directory.', 'Find all .log files under /var.',
  'What is the capital of France?', 'Write a haiku about autumn.', 'Which products cost less than 20?', 'Compress the folder photos into photos.tar.gz.',
]
const MODELS = ['smollm2', 'sql', 'shell']

const requests = (n) => Array.from({ length: n }, (_, i) => ({ model: MODELS[i % 3], question: QUESTIONS[i % QUESTIONS.length] }))

async function child(spec) {
  const { Runtime } = await import(join(root, 'dist', 'index.js'))
  const rt = await Runtime.load(spec.model, { threads: spec.threads })
  await rt.loadExpert(join(root, 'experts', 'sql-smollm2'))
  await rt.loadExpert(join(root, 'experts', 'shell-smollm2'))
  const items = requests(spec.requests)
  // Warm-up (untimed): one request of each kind.
  for (const m of MODELS) await rt.createSession().complete(QUESTIONS[0], { temperature: 0, maxTokens: 4, experts: m === 'smollm2' ? [] : [m] })
  let tokens = 0
  let errors = 0
  let undone = 0
  if (spec.kind === 'in-process') {
    const t0 = performance.now()
    await pool(items, CONCURRENCY, async ({ model, question }) => {
      try {
        const s = rt.createSession()
        const stream = s.generate([{ role: 'user', content: question }], { temperature: 0, maxTokens: MAX_TOKENS, experts: model === 'smollm2' ? [] : [model] })
        for await (const _ of stream) tokens++
        s.dispose()
      } catch {
        errors++
      }
    })
    const wallS = (performance.now() - t0) / 1e3
    await rt.dispose()
    return { kind: spec.kind, tokens, errors, undone, wallS, tokPerS: tokens / wallS }
  }
  const { createServer } = await import(join(root, 'dist', 'server', 'index.js'))
  const server = createServer(rt, { modelName: 'smollm2' })
  const { port } = await server.listen(0, '127.0.0.1')
  const url = `http://127.0.0.1:${port}/v1/chat/completions`
  const rssBefore = process.memoryUsage().rss
  const t0 = performance.now()
  // The gateway's scraper: every 50 ms while the load runs.
  const build = []
  const roundTrip = []
  let loading = true
  const scraper = (async () => {
    const metricsUrl = `http://127.0.0.1:${port}/metrics`
    while (loading) {
      const b0 = performance.now()
      await server.handler.metrics.registry.metrics()
      build.push(performance.now() - b0)
      const r0 = performance.now()
      const res = await fetch(metricsUrl)
      await res.text()
      roundTrip.push(performance.now() - r0)
      await new Promise((r) => setTimeout(r, 50))
    }
  })()
  await pool(items, CONCURRENCY, async ({ model, question }) => {
    try {
      const res = await fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model, messages: [{ role: 'user', content: question }], max_tokens: MAX_TOKENS, temperature: 0, stream: true, stream_options: { include_usage: true } }),
      })
      if (res.status !== 200) throw new Error(`status ${res.status}`)
      const text = await res.text()
      if (!text.endsWith('data: [DONE]\n\n')) undone++
      const usage = text.split('\n\n').filter((e) => e.startsWith('data: {')).map((e) => JSON.parse(e.slice(6))).find((o) => o.usage)?.usage
      tokens += usage.completion_tokens
    } catch {
      errors++
    }
  })
  const wallS = (performance.now() - t0) / 1e3
  loading = false
  await scraper
  const rssAfter = process.memoryUsage().rss
  await server.close()
  const q = (v, p) => v.sort((a, b) => a - b)[Math.min(v.length - 1, Math.floor(v.length * p))]
  const scrape = { n: build.length, buildMedianMs: q(build, 0.5), buildP99Ms: q(build, 0.99), roundTripMedianMs: q(roundTrip, 0.5), roundTripP99Ms: q(roundTrip, 0.99) }
  await rt.dispose()
  return { kind: spec.kind, tokens, errors, undone, wallS, tokPerS: tokens / wallS, rssBeforeMB: rssBefore / 2 ** 20, rssAfterMB: rssAfter / 2 ** 20, scrape }
}

async function parent(args) {
  assertBuilt()
  const { cacheDir, ensureSmolLM2 } = await import(join(root, 'scripts', 'assets.mjs'))
  const model = ensureSmolLM2()
  await warmPageCache(model)
  const me = fileURLToPath(import.meta.url)
  const n = args.quick ? 64 : 256
  const load0 = loadAtStart()
  const runs = { 'in-process': [], http: [] }
  for (let rep = 0; rep < args.repeat; rep++) {
    for (const kind of ['in-process', 'http']) {
      await waitIdleThenSay(args, rep, `${kind}: ${n} requests, ${CONCURRENCY} at once`)
      runs[kind].push(runChild(me, { kind, model, threads: args.threads, requests: n }, kind))
    }
  }
  const load1 = os.loadavg()
  const best = (k) => runs[k].sort((a, b) => b.tokPerS - a.tokPerS)[0]
  const inp = best('in-process')
  const http = best('http')
  console.log(`\nexpert-runtime ${gitRev() ?? ''}: OpenAI server under load, SmolLM2-135M Q4_1 + sql + shell experts, ${args.threads} threads, ${machineName()}, best of ${args.repeat}`)
  console.log(`${n} chat requests, ${CONCURRENCY} at once, greedy, max ${MAX_TOKENS} tokens, models cycling base / sql / shell\n`)
  for (const r of [inp, http]) {
    console.log(`${r.kind.padEnd(10)}  ${String(r.tokens).padStart(6)} tokens in ${fmt(r.wallS, 2)} s = ${fmt(r.tokPerS, 1)} tok/s; errors ${r.errors}` +
      (r.kind === 'http' ? `; streams without [DONE] ${r.undone}; RSS ${fmt(r.rssBeforeMB, 0)} → ${fmt(r.rssAfterMB, 0)} MB` : ''))
  }
  console.log(`HTTP / in-process: ${fmt(http.tokPerS / inp.tokPerS, 2)}× (target ≥ 0.9×)`)
  const sc = http.scrape
  console.log(`/metrics every 50 ms during the HTTP load (${sc.n} scrapes): building the text ${fmt(sc.buildMedianMs, 3)} ms median, ${fmt(sc.buildP99Ms, 3)} ms p99` +
    ` (${fmt(sc.buildMedianMs / 50 * 100, 2)}% of the 50 ms interval); round trip ${fmt(sc.roundTripMedianMs, 2)} ms median, ${fmt(sc.roundTripP99Ms, 2)} ms p99 (the picker's staleness limit: 200 ms)`)
  console.log(`  ${loadSummary(load0, load1)}`)
  writeResults(args.out ?? resultsPath(cacheDir, 'server'), { ...runInfo(args), machine: machineInfo(load0, load1), requests: n, concurrency: CONCURRENCY, maxTokens: MAX_TOKENS, runs })
}

await benchMain(parseBenchArgs(process.argv.slice(2), { usage: 'node benches/server.mjs [--quick] [--threads N] [--repeat N] [--wait-idle S] [--out FILE]' }), parent, child)
