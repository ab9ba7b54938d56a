// RoPE scaling through the engine: `dynamic` scaling decoded greedily with the KV cache past
// the original length equals HF's greedy run (scripts/gen_rope_fixtures.py), also when the
// prompt's blocks are cached; the option, info fields and bad values. The teacher-forced
// parity of every type is in tests/rope.rs.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { collect, fixture, fixtureJson, GREEDY, LOGPROB_TOL, coded } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')


/** The case's base fixture model with its config.json patched as the case says. */
function caseModel(dir, c) {
  const out = path.join(dir, c.base)
  cpSync(fixture(c.base), out, { recursive: true })
  const cfg = JSON.parse(readFileSync(path.join(out, 'config.json'), 'utf8'))
  writeFileSync(path.join(out, 'config.json'), JSON.stringify({ ...cfg, ...c.config }))
  return out
}

describe('dynamic RoPE scaling through the engine (qwen3-tiny, original context 64)', () => {
  const c = fixtureJson('rope', 'qwen3-dynamic.json')
  let dir, rt
  before(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'expert-runtime-rope-'))
    rt = await Runtime.load(caseModel(dir, c), { contextLength: 192, kvCache: { blockSize: 16 } })
  })
  after(async () => {
    await rt?.dispose()
    if (dir) rmSync(dir, { recursive: true, force: true })
  })

  const greedy = async (g) => {
    const s = rt.createSession()
    const { chunks, result } = await collect(s.generate({ tokens: g.prompt_ids }, { ...GREEDY, maxTokens: g.tokens.length }))
    s.dispose()
    assert.deepEqual(result.tokens, g.tokens)
    const worst = Math.max(...chunks.map((ch, i) => Math.abs(ch.logprob - g.logprobs[i])))
    assert.ok(worst <= LOGPROB_TOL, `max |Δlogprob| ${worst}`)
    return result
  }

  it('reports the scaling and no warning inside the scaled length', () => {
    assert.deepEqual(rt.info.ropeScaling, { type: 'dynamic', factor: 4 })
    assert.deepEqual(rt.info.warnings, [])
    assert.equal(rt.info.contextLength, 192)
  })

  // The three prompts begin with the same 40 tokens. A sequence longer than 64 positions
  // rotates every position by its own length (as HF does), so its cache blocks fit no other
  // sequence; blocks of a shorter sequence under position 64 are plain and shared.
  it('prompts of 96, 40, 40 and 80 tokens each equal HF; only the second 40 reuses cached blocks', async () => {
    const [g40, g96, g80] = c.greedy
    const hits = () => rt.stats().prefixCacheHitTokens
    const h0 = hits()
    await greedy(g96)
    await greedy(g40)
    assert.equal(hits(), h0, 'the 96-token sequence shared nothing')
    await greedy(g40)
    assert.ok(hits() - h0 >= 32, 'the 40-token prompt reused the first one\'s blocks')
    const h1 = hits()
    await greedy(g80)
    assert.equal(hits(), h1, 'the 80-token prompt reused nothing')
  })
})

describe('dynamic RoPE scaling without a contextLength', () => {
  it("defaults the context to the original × factor (64 × 4) and runs a prompt past the original as HF does", async () => {
    const c = fixtureJson('rope', 'qwen3-dynamic.json')
    const dir = mkdtempSync(path.join(os.tmpdir(), 'expert-runtime-rope-'))
    const rt = await Runtime.load(caseModel(dir, c))
    try {
      assert.equal(rt.info.contextLength, 256)
      assert.deepEqual(rt.info.warnings, [])
      const g96 = c.greedy.find((g) => g.prompt_ids.length === 96)
      const r = await rt.createSession().complete({ tokens: g96.prompt_ids }, { ...GREEDY, maxTokens: g96.tokens.length })
      assert.deepEqual(r.tokens, g96.tokens)
    } finally {
      await rt.dispose()
      rmSync(dir, { recursive: true, force: true })
    }
  })
})

describe('ropeScaling option and contextLength', () => {
  const model = fixture('qwen3-tiny')

  it('yarn from the option: info shows the resolved parameters', async () => {
    const rt = await Runtime.load(model, { ropeScaling: { type: 'yarn', factor: 4, originalMaxPositionEmbeddings: 128 } })
    try {
      const r = rt.info.ropeScaling
      assert.equal(r.type, 'yarn')
      assert.equal(r.originalMaxPositionEmbeddings, 128)
      assert.ok(Math.abs(r.attentionFactor - (0.1 * Math.log(4) + 1)) < 1e-12)
      assert.equal(rt.info.contextLength, 512)
      // The returned object is a copy.
      r.factor = 99
      assert.equal(rt.info.ropeScaling.factor, 4)
    } finally {
      await rt.dispose()
    }
  })

  it('a contextLength past what the model supports loads with a warning', async () => {
    const rt = await Runtime.load(model, { contextLength: 4096 })
    try {
      assert.equal(rt.info.contextLength, 4096)
      assert.equal(rt.info.ropeScaling, null)
      assert.equal(rt.info.warnings.length, 1)
      assert.match(rt.info.warnings[0], /past what this model supports \(512 positions/)
    } finally {
      await rt.dispose()
    }
  })

  it('bad values are typed errors', async () => {
    const bad = [
      [{ type: 'yarn', factor: 1e300 }, 'INVALID_ARGUMENT'],
      [{ type: 'yarn', factor: 0.5 }, 'INVALID_ARGUMENT'],
      [{ type: 'yarn', factor: NaN }, 'INVALID_ARGUMENT'],
      [{ type: 'yarn', factor: 2, originalMaxPositionEmbeddings: 2 ** 40 }, 'INVALID_ARGUMENT'],
      [{ type: 'llama3', factor: 8, lowFreqFactor: 4, highFreqFactor: 1 }, 'INVALID_ARGUMENT'],
      [{ type: 'linear' }, 'INVALID_ARGUMENT'],
      [{ type: 'linear', factor: 2, extra: 1 }, 'INVALID_ARGUMENT'],
      [{ type: 'linear', factor: { n: 2 } }, 'INVALID_ARGUMENT'],
      [{ type: 'x'.repeat(2 << 20), factor: 2 }, 'INVALID_ARGUMENT'],
      [[1, 2], 'INVALID_ARGUMENT'],
      ['yarn', 'INVALID_ARGUMENT'],
      // The model's own RoPE types come from its config, never an option.
      [{ type: 'longrope', factor: 2 }, 'INVALID_ARGUMENT'],
      [{ type: 'proportional', partialRotaryFactor: 0.25 }, 'INVALID_ARGUMENT'],
      [{ type: 'mrope', factor: 2 }, 'UNSUPPORTED_ARCHITECTURE'],
    ]
    for (const [ropeScaling, code] of bad) {
      await assert.rejects(Runtime.load(model, { ropeScaling }), coded(code), JSON.stringify(ropeScaling).slice(0, 80))
    }
  })
})
