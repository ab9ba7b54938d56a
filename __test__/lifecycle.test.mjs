// Request and object lifecycle through the public API: cancellation (break, AbortSignal),
// SESSION_BUSY, concurrent sessions, dispose, argument validation, load progress, model info
// and tokenizer round trips. Tiny fixtures only.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import path from 'node:path'
import v8 from 'node:v8'
import vm from 'node:vm'
import { FIXTURES, fixture, fixtureJson, GREEDY, reference, coded } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime, Session, GenerationStream } = require('../dist/index.js')

const ref = reference('qwen3-tiny')
// No maxTokens: a greedy run on the reference prompt goes on until the 512-token context is
// full (it never samples an EOS), hundreds of steps, so it is still running when we act on it.
const LONG = { tokens: ref.prompt_ids }


describe('cancellation and concurrency (qwen3-tiny)', () => {
  let rt
  before(async () => {
    rt = await Runtime.load(fixture('qwen3-tiny'))
  })
  after(() => rt?.dispose())

  it('break out of for await cancels; the stream summary says cancelled and the session is reusable', async () => {
    const s = rt.createSession()
    const stream = s.generate(LONG, GREEDY)
    assert.ok(stream instanceof GenerationStream)
    let n = 0
    for await (const _ of stream) {
      if (++n === 3) break
    }
    const r = stream.result
    assert.ok(r, 'the summary is available once the loop has exited')
    assert.equal(r.finishReason, 'cancelled')
    assert.ok(r.tokens.length >= 3, `${r.tokens.length} tokens`)
    assert.deepEqual(r.tokens.slice(0, 3), ref.f32.steps.slice(0, 3).map((x) => x.token))

    const again = await s.complete('Hello robot', { ...GREEDY, maxTokens: 4 })
    assert.equal(again.finishReason, 'length')
    assert.equal(again.tokens.length, 4)
  })

  it('aborting the signal mid-stream stops within one step and the session is reusable', async () => {
    const s = rt.createSession()
    const ac = new AbortController()
    const stream = s.generate(LONG, { ...GREEDY, signal: ac.signal })
    let seen = 0
    let afterAbort = 0
    for await (const _ of stream) {
      if (ac.signal.aborted) afterAbort++
      if (++seen === 2) ac.abort()
    }
    assert.ok(afterAbort <= 1, `${afterAbort} chunks after abort`)
    assert.equal(stream.result.finishReason, 'cancelled')

    const again = await s.complete({ tokens: [5, 6, 7] }, { ...GREEDY, maxTokens: 3 })
    assert.equal(again.finishReason, 'length')
    assert.ok(again.usage.cachedTokens > 0, 'the cancelled turn left a usable cache')
  })

  it('GenerationStream.cancel() ends the stream as cancelled', async () => {
    const s = rt.createSession()
    const stream = s.generate(LONG, GREEDY)
    let afterCancel = 0
    let n = 0
    for await (const _ of stream) {
      if (n++ === 1) stream.cancel()
      else if (n > 2) afterCancel++
    }
    assert.equal(afterCancel, 0)
    assert.equal(stream.result.finishReason, 'cancelled')
  })

  it('an already-aborted signal: complete() resolves with finishReason cancelled', async () => {
    const s = rt.createSession()
    const r = await s.complete(LONG, { ...GREEDY, signal: AbortSignal.abort() })
    assert.equal(r.finishReason, 'cancelled')
    const again = await s.complete('Hello robot', { ...GREEDY, maxTokens: 2 })
    assert.equal(again.finishReason, 'length')
  })

  it('a second concurrent generate() on the same session rejects with SESSION_BUSY on first iteration', async () => {
    const s = rt.createSession()
    const first = s.generate(LONG, GREEDY)[Symbol.asyncIterator]()
    const c = await first.next()
    assert.equal(c.done, false)

    const second = s.generate('Hello robot', { ...GREEDY, maxTokens: 2 }) // does not throw synchronously
    await assert.rejects(second[Symbol.asyncIterator]().next(), coded('SESSION_BUSY'))
    assert.throws(() => s.reset(), coded('SESSION_BUSY'))

    await first.return() // cancels and waits for the engine to release the session
    const r = await s.complete('Hello robot', { ...GREEDY, maxTokens: 2 })
    assert.equal(r.tokens.length, 2)
  })

  it('a running stream keeps its session alive when the caller holds no reference to it', async () => {
    // A garbage-collected session is disposed natively, which cancels its request; the stream
    // must keep it reachable. Force full GCs mid-stream to check.
    v8.setFlagsFromString('--expose-gc')
    const gc = vm.runInNewContext('gc')
    const stream = rt.createSession().generate(LONG, GREEDY)
    let n = 0
    for await (const _ of stream) {
      if (++n === 2) {
        gc()
        await new Promise((resolve) => setImmediate(resolve)) // let deferred finalizers run
        gc()
      }
    }
    assert.equal(stream.result.finishReason, 'length')
    assert.equal(n, 512 - ref.prompt_ids.length)
  })

  it('a stream can be iterated only once', async () => {
    const stream = rt.createSession().generate('Hi', { ...GREEDY, maxTokens: 1 })
    for await (const _ of stream) {
      /* drain */
    }
    assert.throws(() => stream[Symbol.asyncIterator](), coded('INVALID_ARGUMENT'))
  })

  it('two sessions run concurrently and give the same results as alone (greedy)', async () => {
    const jobs = [
      [LONG, { ...GREEDY, maxTokens: 24 }],
      ['The robot read the signs.', { ...GREEDY, maxTokens: 20 }],
    ]
    const alone = []
    for (const [input, opts] of jobs) alone.push(await rt.createSession().complete(input, opts))
    const together = await Promise.all(jobs.map(([input, opts]) => rt.createSession().complete(input, opts)))
    for (let i = 0; i < jobs.length; i++) {
      assert.deepEqual(together[i].tokens, alone[i].tokens, `job ${i}`)
      assert.equal(together[i].text, alone[i].text)
      assert.equal(together[i].finishReason, alone[i].finishReason)
    }
    assert.deepEqual(alone[0].tokens.slice(0, 16), ref.f32.steps.map((x) => x.token))
  })

  it('after session.dispose(), generate rejects with DISPOSED', async () => {
    const s = rt.createSession({ system: 'sys' })
    assert.ok(s instanceof Session)
    await s.complete('Hi', { ...GREEDY, maxTokens: 2 })
    s.dispose()
    s.dispose() // idempotent
    await assert.rejects(s.complete('Hi', { ...GREEDY, maxTokens: 2 }), coded('DISPOSED'))
    await assert.rejects(s.generate('Hi')[Symbol.asyncIterator]().next(), coded('DISPOSED'))
    assert.throws(() => s.history, coded('DISPOSED'))
    assert.throws(() => s.reset(), coded('DISPOSED'))
    assert.equal(typeof s[Symbol.dispose], 'function')
    // Other sessions are unaffected.
    const r = await rt.createSession().complete('Hi', { ...GREEDY, maxTokens: 2 })
    assert.equal(r.tokens.length, 2)
  })

  it('disposing a session while it generates ends its stream', { timeout: 30_000 }, async () => {
    const s = rt.createSession()
    const stream = s.generate(LONG, GREEDY)
    let outcome
    try {
      let n = 0
      for await (const _ of stream) {
        if (++n === 2) s.dispose()
      }
      outcome = stream.result?.finishReason
    } catch (e) {
      outcome = e.code
    }
    assert.ok(['cancelled', 'DISPOSED'].includes(outcome), `outcome ${outcome}`)
  })
})

describe('runtime dispose', () => {
  it('ends an in-flight stream, then every call throws DISPOSED', { timeout: 30_000 }, async () => {
    const rt = await Runtime.load(fixture('qwen3-tiny'))
    const s = rt.createSession()
    const stream = s.generate(LONG, GREEDY)
    const it = stream[Symbol.asyncIterator]()
    assert.equal((await it.next()).done, false)

    const disposing = rt.dispose()
    let outcome
    try {
      while (!(await it.next()).done) {
        /* the engine may have produced a few more before it stopped */
      }
      outcome = stream.result?.finishReason ?? 'ended'
    } catch (e) {
      outcome = e.code
    }
    await disposing
    assert.ok(['DISPOSED', 'cancelled', 'length', 'ended'].includes(outcome), `outcome ${outcome}`)

    assert.throws(() => rt.createSession(), coded('DISPOSED'))
    assert.throws(() => rt.tokenize('hi'), coded('DISPOSED'))
    assert.throws(() => rt.detokenize([1]), coded('DISPOSED'))
    await assert.rejects(s.complete('Hi', { maxTokens: 1 }), coded('DISPOSED'))
    await rt.dispose() // idempotent
  })

  it('Symbol.asyncDispose disposes the runtime', async () => {
    const rt = await Runtime.load(fixture('qwen2-tiny'))
    assert.equal(typeof rt[Symbol.asyncDispose], 'function')
    await rt[Symbol.asyncDispose]()
    assert.throws(() => rt.tokenize('hi'), coded('DISPOSED'))
  })
})

describe('context length', () => {
  let rt
  before(async () => {
    rt = await Runtime.load(fixture('qwen3-tiny'), { contextLength: 32 })
  })
  after(() => rt?.dispose())

  it('contextLength is applied', () => {
    assert.equal(rt.info.contextLength, 32)
  })

  it('a longer token prompt fails with CONTEXT_OVERFLOW; the session stays usable', async () => {
    const s = rt.createSession()
    const long = Array.from({ length: 40 }, (_, i) => (i * 37) % 300)
    await assert.rejects(s.complete({ tokens: long }), coded('CONTEXT_OVERFLOW'))
    const r = await s.complete({ tokens: long.slice(0, 8) }, { ...GREEDY, maxTokens: 2 })
    assert.equal(r.tokens.length, 2)
  })

  it('generation stops with length when the context is full', async () => {
    const r = await rt.createSession().complete({ tokens: ref.prompt_ids.concat(ref.prompt_ids) }, { ...GREEDY, maxTokens: 50 })
    assert.equal(r.finishReason, 'length')
    assert.ok(r.usage.promptTokens + r.usage.completionTokens <= 32 + 1)
  })
})

describe('argument validation', () => {
  let rt
  before(async () => {
    rt = await Runtime.load(fixture('qwen3-tiny'))
  })
  after(() => rt?.dispose())

  const bad = [
    ['temperature -1', 'Hi', { temperature: -1 }],
    ['topP 2', 'Hi', { topP: 2 }],
    ['maxTokens 0', 'Hi', { maxTokens: 0 }],
    ['maxTokens 1.5', 'Hi', { maxTokens: 1.5 }],
    ['topK -1', 'Hi', { topK: -1 }],
    ['minP 2', 'Hi', { minP: 2 }],
    ['temperature NaN', 'Hi', { temperature: NaN }],
    ['temperature as string', 'Hi', { temperature: '0.5' }],
    ['seed -1', 'Hi', { seed: -1 }],
    ['stop not an array', 'Hi', { stop: 'x' }],
    ['topLogprobs 50', 'Hi', { topLogprobs: 50 }],
    ['token id out of vocab range', { tokens: [1, 2, 400] }, {}],
    ['negative token id', { tokens: [-1] }, {}],
    ['empty token input', { tokens: [] }, {}],
    ['input is a number', 42, {}],
    ['input is null', null, {}],
    ['input is an unknown object', { prompt: 'Hi' }, {}],
    ['message without content', [{ role: 'user' }], {}],
  ]
  for (const [what, input, options] of bad) {
    it(`${what} → INVALID_ARGUMENT, and the session is still usable`, async () => {
      const s = rt.createSession()
      await assert.rejects(s.complete(input, options), coded('INVALID_ARGUMENT'))
      const r = await s.complete('Hi', { ...GREEDY, maxTokens: 1 })
      assert.equal(r.tokens.length, 1)
    })
  }

  it('bad load options → INVALID_ARGUMENT', async () => {
    for (const o of [{ contextLength: 0 }, { contextLength: 1.5 }, { threads: 0 }, { contextLength: 2 ** 24 + 1 }, { device: 'tpu' }, { dtype: 'f8' }, { onProgress: 5 }]) {
      await assert.rejects(Runtime.load(fixture('qwen3-tiny'), o), coded('INVALID_ARGUMENT'), JSON.stringify(o))
    }
    await assert.rejects(Runtime.load(''), coded('INVALID_ARGUMENT'))
  })

  it('bad tokenize/detokenize/createSession arguments → INVALID_ARGUMENT', () => {
    assert.throws(() => rt.tokenize(5), coded('INVALID_ARGUMENT'))
    assert.throws(() => rt.detokenize([1.5]), coded('INVALID_ARGUMENT'))
    assert.throws(() => rt.detokenize([400]), coded('INVALID_ARGUMENT'))
    assert.throws(() => rt.createSession({ system: 5 }), coded('INVALID_ARGUMENT'))
  })
})

describe('loading', () => {
  const sources = [
    ['safetensors directory', fixture('qwen3-tiny')],
    ['sharded safetensors', fixture('qwen3-untied-mqa')],
    ['GGUF file', fixture('llama-tiny', 'model-q8_0.gguf')],
  ]
  for (const [what, p] of sources) {
    it(`onProgress reports loadedBytes up to totalBytes (${what})`, async () => {
      const calls = []
      const rt = await Runtime.load(p, { onProgress: (x) => calls.push(x) })
      await rt.dispose()
      assert.ok(calls.length > 0)
      const total = calls[0].totalBytes
      assert.ok(total > 0)
      let prev = 0
      for (const c of calls) {
        assert.equal(c.totalBytes, total)
        assert.ok(c.loadedBytes <= c.totalBytes, `${c.loadedBytes} > ${c.totalBytes}`)
        assert.ok(c.loadedBytes >= prev, 'monotone')
        prev = c.loadedBytes
      }
      assert.equal(calls.at(-1).loadedBytes, total)
    })
  }

  const INFO = {
    'qwen3-tiny': { architecture: 'qwen3', numLayers: 3 },
    'qwen3-untied-mqa': { architecture: 'qwen3', numLayers: 3 },
    'qwen2-tiny': { architecture: 'qwen2', numLayers: 2 },
    'llama-tiny': { architecture: 'llama', numLayers: 2 },
  }
  const infoCases = [
    ...Object.keys(INFO).map((m) => [m, fixture(m)]),
    ['qwen3-tiny', fixture('qwen3-tiny', 'model-f32.gguf')],
    ['llama-tiny', fixture('llama-tiny', 'model-q8_0.gguf')],
  ]
  for (const [m, p] of infoCases) {
    it(`rt.info for ${path.relative(FIXTURES, p)}`, async () => {
      const rt = await Runtime.load(p)
      try {
        const info = rt.info
        assert.equal(info.architecture, INFO[m].architecture)
        assert.equal(info.numLayers, INFO[m].numLayers)
        assert.equal(info.hiddenSize, 64)
        assert.equal(info.vocabSize, 400)
        assert.equal(info.contextLength, 512)
        assert.equal(info.device, 'cpu')
        assert.equal(info.dtype, 'f32')
        assert.ok(info.eosTokenIds.includes(397), `eosTokenIds ${info.eosTokenIds}`)
        // A copy: mutating it does not change the runtime.
        info.eosTokenIds.length = 0
        assert.ok(rt.info.eosTokenIds.includes(397))
      } finally {
        await rt.dispose()
      }
    })
  }
})

describe('tokenizer round trip', () => {
  const { encode } = fixtureJson('tokenizer_reference.json')
  for (const p of [fixture('qwen3-tiny'), fixture('llama-tiny', 'model-f32.gguf')]) {
    it(`tokenize/detokenize match the HF reference (${path.relative(FIXTURES, p)})`, async () => {
      const rt = await Runtime.load(p)
      try {
        const control = rt.tokenize('<|im_start|><|im_end|><|endoftext|>', { addSpecialTokens: false, parseSpecialTokens: true })
        assert.equal(control.length, 3)
        for (const e of encode) {
          // HF's encode reads special-token spellings as control tokens: parseSpecialTokens.
          const parsed = { parseSpecialTokens: true }
          assert.deepEqual(rt.tokenize(e.text, parsed), e.ids, JSON.stringify(e.text))
          assert.deepEqual(rt.tokenize(e.text, { ...parsed, addSpecialTokens: false }), e.ids, JSON.stringify(e.text))
          assert.equal(rt.detokenize(e.ids), e.decoded, JSON.stringify(e.text))
          assert.equal(rt.detokenize(rt.tokenize(e.text, parsed)), e.text, 'round trip')
          // By default they are plain text: no control token, and the same text back.
          const plain = rt.tokenize(e.text)
          const hasSpecial = /<\|(im_start|im_end|endoftext)\|>/.test(e.text)
          if (hasSpecial) assert.notDeepEqual(plain, e.ids, JSON.stringify(e.text))
          else assert.deepEqual(plain, e.ids, JSON.stringify(e.text))
          for (const id of control) assert.ok(!plain.includes(id), `${JSON.stringify(e.text)} has control token ${id}`)
          assert.equal(rt.detokenize(plain), e.text, 'plain round trip')
        }
      } finally {
        await rt.dispose()
      }
    })
  }
})
