// kvCache.dtype through the public API: what info and stats report, that half-precision and
// block-quantized pools generate, and bad values. The numerics (|Δlogprob| against the f32 pool) are in
// tests/kv_dtype.rs.
import { describe, it } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { collect, fixture, GREEDY, reference, coded } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')


describe('kvCache.dtype (qwen3-tiny)', () => {
  const ref = reference('qwen3-tiny')

  it('f16 and bf16 pools take half the bytes per token and follow the f32 greedy path', async () => {
    const perToken = {}
    for (const dtype of [undefined, 'f32', 'f16', 'bf16']) {
      const rt = await Runtime.load(fixture('qwen3-tiny'), { kvCache: { dtype } })
      try {
        assert.equal(rt.info.kvCacheDtype, dtype ?? 'f32')
        perToken[dtype ?? 'default'] = rt.stats().kvBytesPerToken
        const s = rt.createSession()
        const { result } = await collect(s.generate({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: 8 }))
        // The fixture's greedy path has clear margins for its first steps.
        assert.deepEqual(result.tokens, ref.f32.steps.slice(0, 8).map((x) => x.token), String(dtype))
      } finally {
        await rt.dispose()
      }
    }
    assert.equal(perToken.default, perToken.f32)
    assert.equal(perToken.f16 * 2, perToken.f32)
    assert.equal(perToken.bf16 * 2, perToken.f32)
  })

  it('q8_0 and q4_0 pools: 34 and 18 bytes per 32 values, generation runs, prefix sharing works', async () => {
    const perToken = {}
    for (const dtype of ['f32', 'q8_0', 'q4_0']) {
      const rt = await Runtime.load(fixture('qwen3-tiny'), { kvCache: { dtype } })
      try {
        assert.equal(rt.info.kvCacheDtype, dtype)
        perToken[dtype] = rt.stats().kvBytesPerToken
        const first = await collect(rt.createSession().generate({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: 8 }))
        assert.equal(first.result.tokens.length, 8)
        if (dtype === 'q8_0') assert.deepEqual(first.result.tokens.slice(0, 4), ref.f32.steps.slice(0, 4).map((x) => x.token))
        // A 36-token prompt twice: the second request reuses the first one's two full blocks
        // (quantized as written) and decodes the same tokens.
        const long = [...ref.prompt_ids, ...ref.prompt_ids, ...ref.prompt_ids]
        const a = await collect(rt.createSession().generate({ tokens: long }, { ...GREEDY, maxTokens: 8 }))
        const b = await collect(rt.createSession().generate({ tokens: long }, { ...GREEDY, maxTokens: 8 }))
        assert.equal(b.result.usage.cachedTokens, 32, `${dtype}: prefix reuse`)
        assert.deepEqual(b.result.tokens, a.result.tokens, dtype)
      } finally {
        await rt.dispose()
      }
    }
    assert.equal(perToken.q8_0 * 4 * 32, perToken.f32 * 34)
    assert.equal(perToken.q4_0 * 4 * 32, perToken.f32 * 18)
  })

  it('a quantized pool needs whole blocks per head (qwen2-tiny: head_dim 16)', async () => {
    for (const dtype of ['q8_0', 'q4_0']) {
      await assert.rejects(Runtime.load(fixture('qwen2-tiny'), { kvCache: { dtype } }), (e) => coded('INVALID_ARGUMENT')(e) && /multiple of 32/.test(e.message))
    }
  })

  it('bad values are INVALID_ARGUMENT before the model is read', async () => {
    for (const dtype of ['q5_0', 'Q8_0', 'f8', '', 5, 'F16']) {
      await assert.rejects(Runtime.load(fixture('qwen3-tiny'), { kvCache: { dtype } }), coded('INVALID_ARGUMENT'), String(dtype))
    }
  })
})
