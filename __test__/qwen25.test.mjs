// Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF (qwen2 architecture; Q4_K, Q5_0, Q6_K and Q8_0
// tensors). 491 MB, so `npm test` does not fetch it: run `npm run fetch-assets -- --qwen25`
// first, otherwise these tests are skipped.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { existsSync } from 'node:fs'
import { createRequire } from 'node:module'
import { join } from 'node:path'
import { cacheDir } from '../scripts/assets.mjs'

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

  it('writes working Python code', async () => {
    const r = await rt.createSession().complete('Write a Python function add(a, b) that returns a + b. Only code.', {
      temperature: 0,
      maxTokens: 48,
    })
    assert.match(r.text, /def add\(a, b\):/)
    assert.match(r.text, /return a \+ b/)
  })
})
