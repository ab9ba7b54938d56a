// Generation through the public API on the tiny random fixtures (__test__/fixtures/README.md):
// streaming, HF greedy parity end to end through the binding, sampling options, stop strings,
// multi-turn chat with KV reuse, raw continuation and the Qwen3 thinking switch.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import path from 'node:path'
import { collect, fixture, fixtureJson, GREEDY, LOGPROB_TOL, reference } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')

const MODELS = ['qwen3-tiny', 'qwen3-untied-mqa', 'qwen2-tiny', 'llama-tiny', 'gemma3-tiny', 'mistral-tiny', 'ministral-tiny', 'smollm3-tiny', 'granite-tiny']

function assertSteps(chunks, steps, { logprobs = true } = {}) {
  assert.deepEqual(
    chunks.map((c) => c.tokenId),
    steps.map((s) => s.token),
  )
  if (!logprobs) return
  chunks.forEach((c, i) => {
    const d = Math.abs(c.logprob - steps[i].logprob)
    assert.ok(d <= LOGPROB_TOL, `step ${i}: logprob ${c.logprob} vs reference ${steps[i].logprob} (|d| = ${d})`)
  })
}

// ---------------------------------------------------------------------------------------------
// HF parity: the reference prompt as raw token ids, greedy, 16 steps.
// ---------------------------------------------------------------------------------------------

for (const name of MODELS) {
  describe(`greedy parity with HF transformers: ${name}`, () => {
    const ref = reference(name)
    const n = ref.f32.steps.length
    let rt
    before(async () => {
      rt = await Runtime.load(fixture(name))
    })
    after(() => rt?.dispose())

    it('reproduces reference.f32 tokens exactly and logprobs within 1e-4', async () => {
      const s = rt.createSession()
      const { chunks, result } = await collect(s.generate({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: n }))
      assertSteps(chunks, ref.f32.steps)
      for (const c of chunks) assert.equal(c.topLogprobs, undefined, 'no topLogprobs unless asked for')
      assert.deepEqual(result.tokens, ref.f32.steps.map((s) => s.token))
      assert.equal(result.finishReason, 'length')
      assert.deepEqual(result.usage, { promptTokens: ref.prompt_ids.length, completionTokens: n, cachedTokens: 0, draftTokens: 0, acceptedDraftTokens: 0, reasoningTokens: 0 })
    })

    it('topLogprobs: 5 returns the reference top-5 ids in order', async () => {
      const s = rt.createSession()
      const { chunks } = await collect(s.generate({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: n, topLogprobs: 5 }))
      assert.equal(chunks.length, n)
      chunks.forEach((c, i) => {
        const want = ref.f32.steps[i].top5
        assert.equal(c.topLogprobs.length, 5, `step ${i}`)
        assert.deepEqual(
          c.topLogprobs.map((t) => t.tokenId),
          want.map(([id]) => id),
          `step ${i}: top-5 ids`,
        )
        c.topLogprobs.forEach((t, k) => {
          assert.ok(Math.abs(t.logprob - want[k][1]) <= LOGPROB_TOL, `step ${i} rank ${k}: ${t.logprob} vs ${want[k][1]}`)
        })
        // The sampled (greedy) token is the top-1 entry with the same logprob.
        assert.equal(c.topLogprobs[0].tokenId, c.tokenId)
        assert.equal(c.topLogprobs[0].logprob, c.logprob)
      })
    })
  })
}

for (const name of ['qwen3-tiny', 'llama-tiny']) {
  describe(`greedy parity from GGUF: ${name}`, () => {
    const ref = reference(name)
    const n = ref.f32.steps.length

    it('model-f32.gguf reproduces reference.f32 (tokens exact, logprobs within 1e-4)', async () => {
      const rt = await Runtime.load(path.join(fixture(name), 'model-f32.gguf'))
      try {
        const { chunks } = await collect(rt.createSession().generate({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: n }))
        assertSteps(chunks, ref.f32.steps)
      } finally {
        await rt.dispose()
      }
    })

    it('model-q8_0.gguf reproduces the reference.q8_0_dequant tokens', async () => {
      // Tokens only: the engine runs Q8_0 kernels (activations quantized too), not the exact
      // f32-of-dequantized-weights computation of the reference, so logprobs differ by ~0.1.
      const rt = await Runtime.load(path.join(fixture(name), 'model-q8_0.gguf'))
      try {
        const { chunks } = await collect(rt.createSession().generate({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: n }))
        assertSteps(chunks, ref.q8_0_dequant.steps, { logprobs: false })
      } finally {
        await rt.dispose()
      }
    })
  })
}

// ---------------------------------------------------------------------------------------------
// API behaviour on one model.
// ---------------------------------------------------------------------------------------------

describe('generation (qwen3-tiny)', () => {
  const ref = reference('qwen3-tiny')
  let rt
  before(async () => {
    rt = await Runtime.load(fixture('qwen3-tiny'))
  })
  after(() => rt?.dispose())

  it('streams one chunk per token with tokenId, text and logprob', async () => {
    const s = rt.createSession()
    const { chunks, result } = await collect(s.generate('Hello robot', { ...GREEDY, maxTokens: 12 }))
    assert.ok(chunks.length > 0)
    assert.equal(chunks.length, result.tokens.length)
    assert.equal(chunks.length, result.usage.completionTokens)
    chunks.forEach((c, i) => {
      assert.equal(c.tokenId, result.tokens[i])
      assert.ok(Number.isInteger(c.tokenId) && c.tokenId >= 0 && c.tokenId < 400)
      assert.equal(typeof c.text, 'string')
      assert.equal(typeof c.logprob, 'number')
      assert.ok(Number.isFinite(c.logprob) && c.logprob <= 0, `logprob ${c.logprob}`)
    })
    assert.equal(chunks.map((c) => c.text).join(''), result.text)
  })

  it('complete() returns text, tokens, finishReason length and usage', async () => {
    const s = rt.createSession()
    const r = await s.complete({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: 7 })
    assert.equal(r.finishReason, 'length')
    assert.deepEqual(r.tokens, ref.f32.steps.slice(0, 7).map((x) => x.token))
    assert.equal(typeof r.text, 'string')
    assert.equal(r.text, rt.detokenize(r.tokens))
    assert.deepEqual(r.usage, { promptTokens: ref.prompt_ids.length, completionTokens: 7, cachedTokens: 0, draftTokens: 0, acceptedDraftTokens: 0, reasoningTokens: 0 })
    for (const k of ['ttftMs', 'tokensPerSecond', 'prefillTokensPerSecond']) {
      assert.equal(typeof r.timings[k], 'number', k)
      assert.ok(r.timings[k] >= 0, k)
    }
  })

  it('concatenated chunk texts equal complete().text for a chat input', async () => {
    const input = [{ role: 'user', content: 'The robot read 日本 signs. What did it read?' }]
    const opts = { ...GREEDY, maxTokens: 40 }
    const { chunks, result } = await collect(rt.createSession().generate(input, opts))
    const done = await rt.createSession().complete(input, opts)
    assert.equal(chunks.map((c) => c.text).join(''), done.text)
    assert.equal(result.text, done.text)
    assert.deepEqual(result.tokens, done.tokens)
    assert.deepEqual(
      chunks.map((c) => c.tokenId),
      done.tokens,
    )
  })

  it('the same seed gives the same tokens at temperature 1; different seeds differ', async () => {
    const run = (seed) => rt.createSession().complete({ tokens: ref.prompt_ids }, { temperature: 1, seed, maxTokens: 30 })
    const a = await run(1234)
    const b = await run(1234)
    const c = await run(98765)
    assert.equal(a.tokens.length, 30)
    assert.deepEqual(a.tokens, b.tokens)
    assert.equal(a.text, b.text)
    assert.notDeepEqual(a.tokens, c.tokens)
  })

  it('a stop string ends generation with finishReason stop and is not emitted', async () => {
    const greedy = await rt.createSession().complete({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: 16 })
    const text = greedy.text
    // A printable-ASCII substring from the middle of the known greedy text, at its first occurrence.
    let at = -1
    let stop
    for (let i = Math.floor(text.length / 3); i + 2 <= text.length; i++) {
      const cand = text.slice(i, i + 2)
      if (/^[\x21-\x7e]{2}$/.test(cand) && text.indexOf(cand) === i) {
        at = i
        stop = cand
        break
      }
    }
    assert.ok(at > 0, `no usable stop string in ${JSON.stringify(text)}`)

    const { chunks, result } = await collect(
      rt.createSession().generate({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: 16, stop: [stop] }),
    )
    assert.equal(result.finishReason, 'stop')
    assert.equal(result.text, text.slice(0, at))
    assert.equal(chunks.map((c) => c.text).join(''), result.text)
    for (const c of chunks) assert.ok(!c.text.includes(stop), `chunk ${JSON.stringify(c.text)} contains the stop string`)
    // It stopped at the token that completed the stop string: a strict prefix of the greedy run.
    assert.ok(result.tokens.length < greedy.tokens.length)
    assert.deepEqual(result.tokens, greedy.tokens.slice(0, result.tokens.length))
  })

  it('multi-turn chat reuses the cache and matches a fresh session given the full history', async () => {
    const system = 'You are terse.'
    const s = rt.createSession({ system })
    const opts = { ...GREEDY, maxTokens: 8 }
    const first = await s.complete('Hello robot', opts)
    // Only the chat template's opening can come from other sessions' blocks.
    assert.ok(first.usage.cachedTokens < first.usage.promptTokens)
    const second = await s.complete('Read the signs', opts)
    assert.ok(second.usage.cachedTokens > 0, `cachedTokens ${second.usage.cachedTokens}`)
    assert.ok(second.usage.cachedTokens >= first.usage.promptTokens, 'at least the first prompt is reused')
    assert.ok(second.usage.promptTokens > first.usage.promptTokens)

    assert.deepEqual(s.history, [
      { role: 'system', content: system },
      { role: 'user', content: 'Hello robot' },
      { role: 'assistant', content: first.text },
      { role: 'user', content: 'Read the signs' },
      { role: 'assistant', content: second.text },
    ])

    // A new session given the same history: its prompt is found in the shared prefix cache.
    const fresh = rt.createSession()
    const again = await fresh.complete(s.history.slice(0, 4), opts)
    assert.ok(again.usage.cachedTokens > 0 && again.usage.cachedTokens < again.usage.promptTokens)
    assert.equal(again.usage.promptTokens, second.usage.promptTokens)
    assert.deepEqual(again.tokens, second.tokens)
    assert.equal(again.text, second.text)
  })

  it('reset() clears the conversation back to the system prompt and drops the cache', async () => {
    const s = rt.createSession({ system: 'Be brief.' })
    const opts = { ...GREEDY, maxTokens: 4 }
    const before = await s.complete('Hello robot', opts)
    s.reset()
    assert.deepEqual(s.history, [{ role: 'system', content: 'Be brief.' }])
    const after = await s.complete('Hello robot', opts)
    // The session's own cache is gone; what it reuses comes from the shared prefix cache.
    assert.ok(after.usage.cachedTokens < after.usage.promptTokens)
    assert.deepEqual(after.tokens, before.tokens)
    const plain = rt.createSession()
    await plain.complete('x', opts)
    plain.reset()
    assert.deepEqual(plain.history, [])
  })

  it('raw { text } input continues the session cache', async () => {
    const s = rt.createSession()
    const a = await s.complete({ text: 'The robot read' }, { ...GREEDY, maxTokens: 4 })
    assert.equal(a.usage.promptTokens, rt.tokenize('The robot read').length)
    const b = await s.complete({ text: ' the signs' }, { ...GREEDY, maxTokens: 4 })
    assert.ok(b.usage.cachedTokens >= a.usage.promptTokens, `cachedTokens ${b.usage.cachedTokens}`)
    assert.ok(b.usage.promptTokens > a.usage.promptTokens + rt.tokenize(' the signs', { addSpecialTokens: false }).length - 1)
    assert.deepEqual(s.history, [], 'raw input does not enter the chat history')
  })

  it(
    'raw continuation includes the last generated token',
    async () => {
      const s = rt.createSession()
      const a = await s.complete({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: 4 })
      const b = await s.complete({ tokens: [50] }, { ...GREEDY, maxTokens: 4 })
      assert.equal(b.usage.promptTokens, ref.prompt_ids.length + 4 + 1)
      const fresh = await rt.createSession().complete({ tokens: [...ref.prompt_ids, ...a.tokens, 50] }, { ...GREEDY, maxTokens: 4 })
      assert.deepEqual(b.tokens, fresh.tokens)
    },
  )

  it('chat input renders like transformers\' chat template (tokenizer_reference.json)', async () => {
    const refs = fixtureJson('tokenizer_reference.json').chat
    const cases = refs.filter((c) => c.add_generation_prompt)
    assert.ok(cases.length >= 2)
    for (const c of cases) {
      const opts = { ...GREEDY, maxTokens: 8, enableThinking: c.enable_thinking }
      const viaChat = await rt.createSession().complete(c.messages, opts)
      const viaIds = await rt.createSession().complete({ tokens: c.ids }, opts)
      assert.equal(viaChat.usage.promptTokens, c.ids.length, JSON.stringify(c.text))
      assert.deepEqual(viaChat.tokens, viaIds.tokens, JSON.stringify(c.text))
    }
  })

  it('enableThinking: false appends the empty think block of the Qwen3 template', async () => {
    const opts = { ...GREEDY, maxTokens: 2 }
    const on = await rt.createSession().complete('Hi', { ...opts, enableThinking: true })
    const off = await rt.createSession().complete('Hi', { ...opts, enableThinking: false })
    const dflt = await rt.createSession().complete('Hi', opts)
    assert.ok(off.usage.promptTokens > on.usage.promptTokens, `${off.usage.promptTokens} vs ${on.usage.promptTokens}`)
    assert.equal(dflt.usage.promptTokens, on.usage.promptTokens)
    const base = '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n'
    const count = (t) => rt.tokenize(t, { addSpecialTokens: false, parseSpecialTokens: true }).length
    assert.equal(on.usage.promptTokens, count(base))
    assert.equal(off.usage.promptTokens, count(base + '<think>\n\n</think>\n\n'))
  })
})
