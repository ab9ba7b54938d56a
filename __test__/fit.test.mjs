// Fit the machine (issue 52, part 3): Runtime.estimate and `inspect --fit` say what a load
// would take without loading it, and agree with what the load then holds (stats().memory);
// contextLength: 'auto' picks the longest context that fits memoryLimit; a model that cannot
// fit is refused with OUT_OF_MEMORY before any weight is read; bad options are INVALID_ARGUMENT.
import { describe, it } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { fixture, runCli as cli } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')
const QWEN3 = fixture('qwen3-tiny')
// YaRN stretches qwen3-tiny's 512 positions to 4,096, room for 'auto' to choose.
const YARN = { type: 'yarn', factor: 8, originalMaxPositionEmbeddings: 512 }

/** Everything but the KV cache and the state, in bytes. */
const fixed = (e) => e.weights.bytes + e.ropeBytes + e.scratchBytes + e.tokenizerBytes

describe('Runtime.estimate', () => {
  for (const quantize of [undefined, 'q8_0', 'q4_0']) {
    it(`counts the weights the load then holds (quantize ${quantize ?? 'none'})`, async () => {
      const opts = { device: 'cpu', quantize, kvCache: { dtype: quantize ?? 'f32' } }
      const e = await Runtime.estimate(QWEN3, opts)
      const rt = await Runtime.load(QWEN3, opts)
      try {
        assert.equal(e.weights.bytes, rt.info.weightBytes)
        assert.equal(rt.stats().memory.weights, rt.info.weightBytes)
        assert.equal(e.kv.dtype, quantize ?? 'f32')
        assert.equal(e.kv.bytesPerToken[e.kv.dtype], rt.stats().kvBytesPerToken)
        assert.equal(e.contextLength, rt.info.contextLength)
        assert.equal(e.kv.bytes, e.contextLength * e.kv.bytesPerToken[e.kv.dtype])
        assert.equal(e.totalBytes, fixed(e) + e.state.bytes + e.kv.bytes)
        assert.equal(e.doesNotFit, null)
        // The formats add up, and f16 takes half of f32 per position.
        assert.equal(e.weights.formats.reduce((n, f) => n + f.bytes, 0), e.weights.bytes)
        assert.equal(e.kv.bytesPerToken.f16 * 2, e.kv.bytesPerToken.f32)
      } finally {
        await rt.dispose()
      }
    })
  }

  it("contextLength 'auto' loads the longest context memoryLimit holds", async () => {
    const base = { device: 'cpu', ropeScaling: YARN }
    const full = await Runtime.estimate(QWEN3, base)
    assert.equal(full.modelContextLength, 4096)
    assert.equal(full.memoryLimitIsDefault, true)
    const memoryLimit = fixed(full) + 1000 * full.kv.bytesPerToken.f32
    const auto = { ...base, contextLength: 'auto', memoryLimit }
    const e = await Runtime.estimate(QWEN3, auto)
    assert.deepEqual([e.fitContextLength, e.contextLength, e.memoryLimitIsDefault], [992, 992, false])
    assert.ok(e.totalBytes <= memoryLimit)
    const rt = await Runtime.load(QWEN3, auto)
    try {
      assert.equal(rt.info.contextLength, 992)
      // The pool takes what the limit leaves: at least that context.
      const s = rt.stats()
      assert.ok(s.kvBlocksTotal * s.kvBlockSize >= 992, `${s.kvBlocksTotal} blocks`)
      assert.ok(s.kvBlocksTotal * s.kvBlockSize * s.kvBytesPerToken <= memoryLimit - fixed(full))
    } finally {
      await rt.dispose()
    }
  })

  it('a model that cannot fit is described by estimate and refused by load, before reading weights', async () => {
    const tight = { device: 'cpu', ropeScaling: YARN, contextLength: 'auto' }
    const full = await Runtime.estimate(QWEN3, tight)
    const memoryLimit = fixed(full) + 100 * full.kv.bytesPerToken.f32
    const e = await Runtime.estimate(QWEN3, { ...tight, memoryLimit })
    assert.equal(e.fitContextLength, 96)
    assert.match(e.doesNotFit, /96 positions fit/)
    await assert.rejects(Runtime.load(QWEN3, { ...tight, memoryLimit }), { code: 'OUT_OF_MEMORY', message: /96 positions fit/ })
    await assert.rejects(Runtime.load(QWEN3, { device: 'cpu', memoryLimit: 1000 }), { code: 'OUT_OF_MEMORY', message: /memoryLimit 1000 / })
  })

  it('refuses bad options and paths with typed errors', async () => {
    for (const [opts, message] of [
      [{ memoryLimit: -1 }, /memoryLimit/],
      [{ memoryLimit: 2 ** 60 }, /memoryLimit/],
      [{ memoryLimit: NaN }, /memoryLimit/],
      [{ contextLength: 'most' }, /contextLength/],
      [{ contextLength: 0 }, /contextLength/],
      [{ quantize: 'q3' }, /quantize/],
      [{ kvCache: { dtype: 'q2' } }, /kvCache.dtype/],
      [{ onProgress: () => {} }, /onProgress/],
      [{ memoryLimt: 5 }, /memoryLimit/],
    ]) {
      await assert.rejects(Runtime.estimate(QWEN3, opts), { code: 'INVALID_ARGUMENT', message }, JSON.stringify(opts))
    }
    await assert.rejects(Runtime.estimate(fixture('missing')), { code: 'MODEL_NOT_FOUND' })
    await assert.rejects(Runtime.estimate('hf:org/repo'), { code: 'INVALID_ARGUMENT' })
    await assert.rejects(Runtime.estimate(''), { code: 'INVALID_ARGUMENT' })
  })

  it('states of a hybrid model are counted', async () => {
    const e = await Runtime.estimate(fixture('lfm2-tiny'), { device: 'cpu' })
    assert.ok(e.state.bytesPerSequence > 0)
    assert.equal(e.state.bytes, e.state.slots * e.state.bytesPerSequence)
    const rt = await Runtime.load(fixture('lfm2-tiny'), { device: 'cpu' })
    try {
      assert.equal(rt.stats().kvStateBytesPerSequence, e.state.bytesPerSequence)
      assert.equal(e.weights.bytes, rt.info.weightBytes)
    } finally {
      await rt.dispose()
    }
  })
})

describe('stats().memory', () => {
  it('reports weights, KV, state and experts as they change', async () => {
    const rt = await Runtime.load(QWEN3, { device: 'cpu', kvCache: { idleReleaseMs: 0 } })
    try {
      const before = rt.stats().memory
      assert.deepEqual({ ...before, weights: 0 }, { weights: 0, kv: 0, state: 0, experts: 0 })
      const s = rt.createSession()
      await s.complete('Hello there, how are you today?', { maxTokens: 4, temperature: 0 })
      const after = rt.stats()
      assert.ok(after.memory.kv > 0)
      assert.equal(after.memory.kv, after.kvBlocksTouched * after.kvBlockSize * after.kvBytesPerToken)
      const lora = await rt.loadExpert(fixture('adapters', 'lora'), { name: 'lora' })
      assert.equal(rt.stats().memory.experts, lora.bytes)
      await lora.unload()
      assert.equal(rt.stats().memory.experts, 0)
    } finally {
      await rt.dispose()
    }
  })
})

describe('inspect --fit', () => {
  it('prints the estimate, as text and as JSON', async () => {
    const r = await cli(['inspect', QWEN3, '--fit', '--memory', '1GB', '--quantize', 'q8_0', '--kv-dtype', 'q4_0', '--json'])
    assert.equal(r.code, 0, r.stderr)
    const { fit } = JSON.parse(r.stdout)
    const e = await Runtime.estimate(QWEN3, { device: 'cpu', memoryLimit: 1e9, quantize: 'q8_0', kvCache: { dtype: 'q4_0' } })
    assert.deepEqual(fit, e)
    const text = await cli(['inspect', QWEN3, '--fit', '--context', 'auto', '--memory', '512MiB'])
    assert.equal(text.code, 0, text.stderr)
    assert.match(text.stdout, /fit: weights +\d/)
    assert.match(text.stdout, /fit: KV per token +f32 .* \(this load\)/)
    assert.match(text.stdout, /fit: budget +536\.9 MB/)
  })

  it('refuses bad sizes and --fit options without --fit', async () => {
    for (const args of [['--fit', '--memory', '4XB'], ['--fit', '--memory', '-1'], ['--memory', '4GB'], ['--fit', '--context', 'big']]) {
      const r = await cli(['inspect', QWEN3, ...args])
      assert.equal(r.code, 2, `${args.join(' ')}: ${r.stderr}`)
    }
  })
})
