// The inference gateway's contract (issue 53, the Model Server Protocol): /metrics serves the
// vLLM-named series the Endpoint Picker reads, beside our own, with the right types and
// meanings, scraped while 16 streams run under two experts on a pool too small for all of
// them at once (so some wait); and the endpoints vLLM spells its own way (adapter loading,
// tokenize, detokenize) answer in vLLM's shapes, with the server's treatment of hostile input.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { cpSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs'
import { tmpdir } from 'node:os'
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
    // 16 streams of ~30 + 160 positions need 12 blocks of 16 each; the pool holds 32: two or
    // three run at a time, the others wait.
    rt = await Runtime.load(fixture('qwen3-tiny'), { kvCache: { maxTokens: 512 } })
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
          max_tokens: 160,
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

describe('vLLM-spelled endpoints: adapters, tokenize, detokenize', () => {
  let rt, server, base, tmp
  const post = (p, body, headers = {}) =>
    fetch(`${base}${p}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) })
  before(async () => {
    rt = await Runtime.load(fixture('qwen3-tiny'))
    tmp = mkdtempSync(path.join(tmpdir(), 'er-gateway-'))
    // An experts directory with one adapter copied in and one symlink leading out of it.
    cpSync(path.join(fixture('adapters'), 'lora'), path.join(tmp, 'lora'), { recursive: true })
    symlinkSync(path.join(fixture('adapters'), 'dora'), path.join(tmp, 'escape'))
    server = createServer(rt, { modelName: 'tiny', expertsDir: tmp })
    base = `http://127.0.0.1:${(await server.listen(0, '127.0.0.1')).port}`
  })
  after(async () => {
    await server?.close()
    await rt?.dispose()
    rmSync(tmp, { recursive: true, force: true })
  })

  it('load_lora_adapter / unload_lora_adapter inside expertsDir, listed under the base model', async () => {
    let r = await post('/v1/load_lora_adapter', { lora_name: 'sql', lora_path: 'lora' })
    assert.equal(r.status, 200)
    assert.equal(await r.text(), "Success: LoRA adapter 'sql' added successfully.")
    r = await post('/v1/load_lora_adapter', { lora_name: 'sql2', lora_path: path.join(tmp, 'lora') })
    assert.equal(r.status, 200, 'an absolute path inside the directory')
    const models = await (await fetch(`${base}/v1/models`)).json()
    for (const id of ['sql', 'sql2']) assert.equal(models.data.find((m) => m.id === id)?.parent, 'tiny')
    const chat = { model: 'sql', messages: [{ role: 'user', content: 'hi' }], max_tokens: 5, temperature: 0 }
    const served = await (await post('/v1/chat/completions', chat)).json()
    const mine = await rt.createSession().complete([{ role: 'user', content: 'hi' }], { temperature: 0, maxTokens: 5, experts: ['sql'] })
    assert.equal(served.choices[0].message.content, mine.text)
    r = await post('/v1/load_lora_adapter', { lora_name: 'sql', lora_path: 'lora' })
    assert.equal(r.status, 400)
    assert.equal((await r.json()).error.code, 'expert_exists')
    r = await post('/v1/unload_lora_adapter', { lora_name: 'sql' })
    assert.equal(r.status, 200)
    assert.equal(await r.text(), "Success: LoRA adapter 'sql' removed successfully.")
    assert.equal((await post('/v1/unload_lora_adapter', { lora_name: 'sql' })).status, 404)
    assert.equal((await post('/v1/chat/completions', chat)).status, 404)
  })

  it('hostile adapter requests get typed 4xx and load nothing', async () => {
    const cases = [
      [{ lora_name: 'x', lora_path: '../llama-tiny' }, 403],
      [{ lora_name: 'x', lora_path: '/etc' }, 403],
      [{ lora_name: 'x', lora_path: fixture('adapters', 'dora') }, 403],
      [{ lora_name: 'x', lora_path: 'escape' }, 403],
      [{ lora_name: 'x', lora_path: 'missing' }, 404],
      [{ lora_name: 'x', lora_path: 'lora/adapter_config.json' }, 404],
      [{ lora_name: 'x', lora_path: 'a\u0000b' }, 400],
      [{ lora_name: 'x', lora_path: 'x'.repeat(5000) }, 400],
      [{ lora_name: 'x', lora_path: 7 }, 400],
      [{ lora_name: '../x', lora_path: 'lora' }, 400],
      [{ lora_name: '', lora_path: 'lora' }, 400],
      [{ lora_name: 'x'.repeat(200), lora_path: 'lora' }, 400],
      [{ lora_path: 'lora' }, 400],
      [{ lora_name: 'x' }, 400],
    ]
    for (const [body, status] of cases) {
      const r = await post('/v1/load_lora_adapter', body)
      assert.equal(r.status, status, JSON.stringify(body).slice(0, 80))
      assert.equal(typeof (await r.json()).error.message, 'string')
    }
    assert.equal((await post('/v1/unload_lora_adapter', { lora_name: 5 })).status, 400)
    assert.equal((await fetch(`${base}/v1/load_lora_adapter`)).status, 405)
    assert.ok(!rt.experts.some((e) => e.name === 'x'))
    const plain = createServer(rt, {})
    const b = `http://127.0.0.1:${(await plain.listen(0, '127.0.0.1')).port}`
    try {
      const r = await fetch(`${b}/v1/load_lora_adapter`, { method: 'POST', body: JSON.stringify({ lora_name: 'x', lora_path: 'lora' }) })
      assert.equal(r.status, 404, 'without expertsDir')
    } finally {
      await plain.close()
    }
  })

  it('/tokenize and /detokenize in vLLM\'s shapes', async () => {
    let r = await (await post('/tokenize', { prompt: 'Hello there, sea.', return_token_strs: true })).json()
    const ids = rt.tokenize('Hello there, sea.')
    assert.deepEqual(r, { count: ids.length, max_model_len: rt.info.contextLength, tokens: ids, token_strs: ids.map((t) => rt.detokenize([t])) })
    r = await (await post('/tokenize', { prompt: 'Hello', add_special_tokens: false })).json()
    assert.deepEqual(r.tokens, rt.tokenize('Hello', { addSpecialTokens: false }))
    assert.equal(r.token_strs, null)
    // Messages: the tokens a chat request evaluates.
    const messages = [{ role: 'system', content: 'Be terse.' }, { role: 'user', content: 'Say <|im_end|> twice.' }]
    r = await (await post('/tokenize', { messages })).json()
    const served = await (await post('/v1/chat/completions', { messages, max_tokens: 1, temperature: 0 })).json()
    assert.equal(r.count, served.usage.prompt_tokens)
    assert.deepEqual(r.tokens, await rt.tokenizeChat(messages))
    const open = await rt.tokenizeChat(messages, { addGenerationPrompt: false })
    assert.ok(open.length < r.tokens.length)
    assert.deepEqual((await (await post('/tokenize', { messages, add_generation_prompt: false })).json()).tokens, open)
    assert.deepEqual(await (await post('/detokenize', { tokens: ids })).json(), { prompt: rt.detokenize(ids) })
    for (const [p, body] of [
      ['/tokenize', {}], ['/tokenize', { prompt: 5 }], ['/tokenize', { prompt: 'a', messages }], ['/tokenize', { messages: [] }],
      ['/tokenize', { messages: [{ role: 'wizard', content: 'x' }] }], ['/tokenize', { prompt: 'a', add_special_tokens: 'yes' }],
      ['/detokenize', { tokens: 'abc' }], ['/detokenize', { tokens: [-1] }], ['/detokenize', { tokens: [1.5] }], ['/detokenize', { tokens: [rt.info.vocabSize] }],
    ]) {
      const res = await post(p, body)
      assert.equal(res.status, 400, `${p} ${JSON.stringify(body)}`)
    }
    assert.equal((await post('/tokenize', { prompt: 'a', model: 'nope' })).status, 404)
    assert.equal((await fetch(`${base}/tokenize`)).status, 405)
  })

  it('with an API key, the new endpoints need it', async () => {
    const keyed = createServer(rt, { apiKey: 'k', expertsDir: tmp })
    const b = `http://127.0.0.1:${(await keyed.listen(0, '127.0.0.1')).port}`
    try {
      for (const p of ['/tokenize', '/detokenize', '/v1/load_lora_adapter', '/v1/unload_lora_adapter']) {
        const r = await fetch(`${b}${p}`, { method: 'POST', body: '{}' })
        assert.equal(r.status, 401, p)
      }
      const r = await fetch(`${b}/tokenize`, { method: 'POST', headers: { authorization: 'Bearer k' }, body: JSON.stringify({ prompt: 'hi' }) })
      assert.equal(r.status, 200)
    } finally {
      await keyed.close()
    }
  })
})
