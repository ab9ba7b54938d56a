// Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF (qwen2 architecture; Q4_K, Q5_0, Q6_K and Q8_0
// tensors). 491 MB, so `npm test` does not fetch it: run `npm run fetch-assets -- --qwen25`
// first, otherwise these tests are skipped.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { existsSync } from 'node:fs'
import { createRequire } from 'node:module'
import { join } from 'node:path'
import { cacheDir } from '../scripts/assets.mjs'
import { collect } from './helpers.mjs'

const { Runtime } = createRequire(import.meta.url)('../dist/index.js')
const modelPath = join(cacheDir, 'qwen2.5-coder-0.5b-instruct-q4_k_m.gguf')
const skip = existsSync(modelPath) ? false : `${modelPath} absent (npm run fetch-assets -- --qwen25)`

describe('Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF', { skip }, () => {
  let rt
  before(async () => {
    rt = await Runtime.load(modelPath, { contextLength: 2048 })
  })
  after(async () => {
    await rt?.dispose()
  })

  it('reads the qwen2 architecture, its tokenizer and chat template from the GGUF', () => {
    assert.equal(rt.info.architecture, 'qwen2')
    assert.equal(rt.info.numLayers, 24)
    assert.equal(rt.info.hiddenSize, 896)
    assert.ok(rt.info.eosTokenIds.includes(151645), JSON.stringify(rt.info.eosTokenIds))
    assert.deepEqual(rt.tokenize('<|im_start|>user', { addSpecialTokens: false, parseSpecialTokens: true }).slice(0, 1), [151644])
  })

  it('runs every tensor on our own kernels, in the formats of the file', () => {
    // Q5_0 and Q8_0 (Packed32), Q4_K and Q6_K (PackedK): none is converted or left to candle.
    assert.deepEqual(rt.info.quantization.split('+').sort(), ['q4_k', 'q5_0', 'q6_k', 'q8_0'])
  })

  it('bit-identical logprobs alone, inside a 16-session batch and after a prefix-cache hit', async () => {
    // Every row of a Q5_0 / Q8_0 / Q4_K / Q6_K product takes the same integer kernel whatever
    // the number of rows (a prompt of ~200 rows alone, a few rows after the cache hit, a batch).
    const code = 'def area(width, height):\n    return width * height\n\n'.repeat(12)
    const tokens = rt.tokenize(`${code}Add a docstring to each function above.`)
    assert.ok(tokens.length > 150, `the prompt has ${tokens.length} tokens`)
    const opts = { temperature: 0, maxTokens: 10, topLogprobs: 4 }
    const trace = ({ chunks }) => chunks.map((c) => [c.tokenId, c.logprob, c.topLogprobs.map((t) => [t.tokenId, t.logprob])])
    const fresh = await Runtime.load(modelPath, { contextLength: 2048 })
    try {
      const alone = await collect(fresh.createSession().generate({ tokens }, opts))
      const hit = await collect(fresh.createSession().generate({ tokens }, opts))
      assert.ok(hit.result.usage.cachedTokens > 0, 'the second run starts from the prefix cache')
      const others = Array.from({ length: 15 }, (_, i) => `Write a function number ${i} that ${'adds '.repeat(1 + (i % 5))}numbers.`)
      const runs = await Promise.all([
        ...others.slice(0, 7).map((q) => collect(rt.createSession().generate(q, opts))),
        collect(rt.createSession().generate({ tokens }, opts)),
        ...others.slice(7).map((q) => collect(rt.createSession().generate(q, opts))),
      ])
      assert.equal(runs[7].result.usage.cachedTokens, 0)
      assert.deepEqual(trace(hit), trace(alone), 'after a prefix-cache hit')
      assert.deepEqual(trace(runs[7]), trace(alone), 'inside a batch of 16')
    } finally {
      await fresh.dispose()
    }
  })

  it('writes working Python code', async () => {
    const r = await rt.createSession().complete('Write a Python function add(a, b) that returns a + b. Only code.', {
      temperature: 0,
      maxTokens: 48,
    })
    assert.match(r.text, /def add\(a, b\):/)
    assert.match(r.text, /return a \+ b/)
  })
})
