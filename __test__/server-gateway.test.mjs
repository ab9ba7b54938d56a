// The inference gateway's contract (issue 53, the Model Server Protocol): /metrics serves the
// vLLM-named series the Endpoint Picker reads, beside our own, with the right types and
// meanings, scraped while 16 streams run under two experts on a pool too small for all of
// them at once (so some wait).
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import path from 'node:path'
import { fixture } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')
const { createServer } = require('../dist/server/index.js')
const parsePrometheus = require('parse-prometheus-text-format')

const VLLM = ['vllm:num_requests_waiting', 'vllm:num_requests_running', 'vllm:kv_cache_usage_perc', 'vllm:lora_requests_info', 'vllm:cache_config_info']

/** The vLLM series of one scrape: name → { type, metrics: [{ value, labels }] }. */
async function scrape(base) {
  const res = await fetch(`${base}/metrics`)
  assert.equal(res.status, 200)
  const families = parsePrometheus(await res.text())
  return Object.fromEntries(families.filter((f) => VLLM.includes(f.name)).map((f) => [f.name, f]))
}

describe('gateway metrics (vllm: names)', () => {
  let rt, server, base
  before(async () => {
    // 16 streams of ~40 + 48 positions need ~88 blocks of 16; the pool holds 48: some wait.
    rt = await Runtime.load(fixture('qwen3-tiny'), { kvCache: { maxTokens: 768 } })
    await rt.loadExpert(path.join(fixture('adapters'), 'lora'), { name: 'lora' })
    await rt.loadExpert(path.join(fixture('adapters'), 'dora'), { name: 'dora' })
    server = createServer(rt, { modelName: 'tiny' })
    base = `http://127.0.0.1:${(await server.listen(0, '127.0.0.1')).port}`
  })
  after(async () => {
    await server?.close()
    await rt?.dispose()
  })

  it('every series exists as a gauge with its meaning, during and after 16 streams', async (t) => {
    const idle = await scrape(base)
    for (const name of VLLM) assert.equal(idle[name]?.type, 'GAUGE', `${name}: ${JSON.stringify(idle[name])}`)
    const value = (s, name) => Number(s[name].metrics[0].value)
    assert.equal(value(idle, 'vllm:num_requests_running'), 0)
    assert.equal(value(idle, 'vllm:num_requests_waiting'), 0)
    assert.equal(idle['vllm:num_requests_running'].metrics[0].labels.model_name, 'tiny')
    const stats = rt.stats()
    assert.deepEqual(idle['vllm:cache_config_info'].metrics, [{ value: '1', labels: { block_size: String(stats.kvBlockSize), num_gpu_blocks: String(stats.kvBlocksTotal) } }])
    const idleLora = idle['vllm:lora_requests_info'].metrics
    assert.equal(idleLora.length, 1)
    assert.deepEqual(idleLora[0].labels, { max_lora: '2', running_lora_adapters: '', waiting_lora_adapters: '' })

    const started = Date.now() / 1000
    let done = 0
    const streams = Array.from({ length: 16 }, (_, i) =>
      fetch(`${base}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          model: i % 2 ? 'lora' : 'dora',
          messages: [{ role: 'user', content: `Tell me about the number ${i} at length, please, in detail.` }],
          max_tokens: 48,
          temperature: 0,
          stream: true,
        }),
      }).then(async (r) => {
        assert.equal(r.status, 200)
        await r.text()
        done++
      }),
    )
    const samples = []
    const costs = []
    while (done < 16) {
      const t0 = performance.now()
      const s = await scrape(base)
      costs.push(performance.now() - t0)
      samples.push({ s, stats: rt.stats() })
    }
    await Promise.all(streams)
    t.diagnostic(`${samples.length} scrapes during the streams, median ${costs.sort((a, b) => a - b)[costs.length >> 1].toFixed(3)} ms each (HTTP included)`)

    let sawRunning = false
    let sawWaiting = false
    let sawBoth = false
    for (const { s } of samples) {
      const running = value(s, 'vllm:num_requests_running')
      const waiting = value(s, 'vllm:num_requests_waiting')
      const usage = value(s, 'vllm:kv_cache_usage_perc')
      assert.ok(Number.isInteger(running) && Number.isInteger(waiting) && running + waiting <= 16, `${running} + ${waiting}`)
      assert.ok(usage >= 0 && usage <= 1, `usage ${usage}`)
      if (running > 0) {
        sawRunning = true
        assert.ok(usage > 0, 'running requests hold blocks')
      }
      if (waiting > 0) sawWaiting = true
      const lora = s['vllm:lora_requests_info'].metrics
      assert.equal(lora.length, 1, 'one label set at a time')
      const { max_lora: max, running_lora_adapters: run, waiting_lora_adapters: wait } = lora[0].labels
      assert.equal(max, '2')
      for (const list of [run, wait]) for (const n of list ? list.split(',') : []) assert.ok(['dora', 'lora'].includes(n), list)
      if (run === 'dora,lora') sawBoth = true
      const at = Number(lora[0].value)
      assert.ok(at >= started - 1 && at <= Date.now() / 1000 + 1, `lora info time ${at}`)
    }
    assert.ok(sawRunning, 'a scrape saw requests running')
    assert.ok(sawWaiting, 'a scrape saw requests waiting (the pool holds fewer than 16)')
    assert.ok(sawBoth, 'a scrape saw both experts running')
    // The scrape's counts are the engine's: the same as stats() read right after (or one step on).
    const agree = samples.filter(({ s, stats }) => value(s, 'vllm:num_requests_waiting') === stats.queuedRequests).length
    assert.ok(agree >= samples.length / 2, `${agree} of ${samples.length} scrapes agree with stats()`)

    const end = await scrape(base)
    assert.equal(value(end, 'vllm:num_requests_running'), 0)
    assert.equal(value(end, 'vllm:num_requests_waiting'), 0)
    assert.deepEqual(end['vllm:lora_requests_info'].metrics[0].labels, { max_lora: '2', running_lora_adapters: '', waiting_lora_adapters: '' })
    assert.ok(Number(end['vllm:lora_requests_info'].metrics[0].value) >= started - 1)
  })

  it('maxLoras sets max_lora, and a bad one is refused', async () => {
    const s = createServer(rt, { maxLoras: 8 })
    const b = `http://127.0.0.1:${(await s.listen(0, '127.0.0.1')).port}`
    try {
      assert.equal((await scrape(b))['vllm:lora_requests_info'].metrics[0].labels.max_lora, '8')
    } finally {
      await s.close()
    }
    for (const bad of [0, -1, 1.5, '2', Number.NaN]) assert.throws(() => createServer(rt, { maxLoras: bad }), /maxLoras/)
  })
})
