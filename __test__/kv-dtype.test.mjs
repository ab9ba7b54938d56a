// kvCache.dtype through the public API: what info and stats report, that a half-precision
// pool generates, and bad values. The numerics (|Δlogprob| against the f32 pool) are in
// tests/kv_dtype.rs.
import { describe, it } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { collect, fixture, GREEDY, reference } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime, ExpertRuntimeError } = require('../dist/index.js')

const coded = (code) => (e) => {
  assert.ok(e instanceof ExpertRuntimeError, `expected ExpertRuntimeError, got ${e?.name}: ${e?.message}`)
  assert.equal(e.code, code, e.message)
  return true
}

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

  it('bad values are INVALID_ARGUMENT before the model is read', async () => {
    for (const dtype of ['q8_0', 'q4_0', 'f8', '', 5, 'F16']) {
      await assert.rejects(Runtime.load(fixture('qwen3-tiny'), { kvCache: { dtype } }), coded('INVALID_ARGUMENT'), String(dtype))
    }
  })
})
