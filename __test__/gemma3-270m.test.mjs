// The real Gemma 3 270M (base) Q4_K_M GGUF (DESIGN's PyPI asset, fetched by scripts/assets.mjs)
// against llama.cpp, the independent reader of the same file: the prompt's token ids, and the
// greedy answer token for token with each step's logprob
// (__test__/fixtures/gemma3-270m-llamacpp*.json, scripts/gen_gemma3_llamacpp_ref.mjs), on a short
// question and on 661 tokens of LICENSE, past the sliding layers' 512-position window. This checks
// what the tiny HF fixture cannot: llama.cpp's tensor names, the norms stored as 1 + w, the layer
// pattern and rotary bases llama.cpp fixes for the file, the SentencePiece vocabulary of 262,144
// tokens, and our K-quant kernels on a real model.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { ensureGemma3 } from '../scripts/assets.mjs'
import { fixtureJson } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')

const ref = fixtureJson('gemma3-270m-llamacpp.json')
const long = fixtureJson('gemma3-270m-llamacpp-long.json')
let modelPath
let skip = false
try {
  modelPath = await ensureGemma3({ quiet: true })
} catch (e) {
  skip = `Gemma 3 270M GGUF unavailable: ${e?.message ?? e}`
}

/**
 * Both engines run the same integer dot products on the same blocks, but llama.cpp takes GELU
 * from an f16 table and, on the CPU, attends in f16 (flash attention) with an f16 KV cache; we
 * compute all three in f32. Activations are quantized to 8 bits before every product, which
 * turns such differences into a few hundredths of a logprob: changing only our GELU's last bit
 * (candle's tanhf, then our own exp) moved the worst step from 0.057 to 0.104 on the short prompt
 * and from 0.18 to 0.26 teacher-forced on the long one, with every greedy token unchanged.
 * The bounds keep twice that margin; a wrong layer, norm or window moves logprobs by whole nats.
 */
const LOGPROB_TOL = 0.2
const LONG_TOL = 0.5

describe('Gemma 3 270M Q4_K_M GGUF, against llama.cpp', { skip }, () => {
  let rt
  before(async () => {
    rt = await Runtime.load(modelPath)
  })
  after(() => rt?.dispose())

  it('reads the file as llama.cpp does: architecture, quantization, the tied output', () => {
    assert.equal(rt.info.architecture, 'gemma3')
    assert.equal(rt.info.numLayers, 18)
    assert.equal(rt.info.hiddenSize, 640)
    assert.equal(rt.info.vocabSize, 262144)
    assert.match(rt.info.quantization, /q4_k/)
  })

  it('tokenizes the prompts as llama.cpp (BOS first)', () => {
    assert.deepEqual(rt.tokenize(ref.prompt), ref.promptIds)
    assert.deepEqual(rt.tokenize(long.prompt), long.promptIds)
  })

  it(`answers " Paris", and its greedy tokens are llama.cpp's with logprobs within ${LOGPROB_TOL}`, async () => {
    const r = await rt.createSession().complete({ tokens: ref.promptIds }, { temperature: 0, maxTokens: ref.generatedIds.length })
    assert.ok(r.text.startsWith(' Paris'), JSON.stringify(r.text))
    assert.deepEqual(r.tokens, ref.generatedIds)
    await assertSteps(ref, LOGPROB_TOL)
  })

  it(`past the window: after ${long.promptIds.length} prompt tokens, teacher-forced on llama.cpp's tokens, logprobs within ${LONG_TOL}`, async () => {
    assert.ok(long.promptIds.length > 600)
    // Each step a fresh session over the prompt and llama.cpp's tokens so far (the prefix cache
    // serves all but the last block): our logprob of llama.cpp's token, and our greedy choice
    // wherever llama.cpp's top two are further apart than the bound.
    for (let i = 0; i < long.generatedIds.length; i++) {
      const tokens = [...long.promptIds, ...long.generatedIds.slice(0, i)]
      let c
      for await (const x of rt.createSession().generate({ tokens }, { temperature: 0, maxTokens: 1, topLogprobs: 5 })) c = x
      const step = long.steps[i]
      const margin = step.top5[0].logprob - step.top5[1].logprob
      if (margin > 2 * LONG_TOL) assert.equal(c.tokenId, step.token, `step ${i} (margin ${margin})`)
      const ours = c.topLogprobs.find((t) => t.tokenId === step.token)
      assert.ok(ours, `step ${i}: llama.cpp's token ${step.token} is not in our top 5`)
      const d = Math.abs(ours.logprob - step.logprob)
      assert.ok(d <= LONG_TOL, `step ${i}: ${ours.logprob} vs llama.cpp ${step.logprob} (|d| = ${d})`)
    }
  })

  async function assertSteps(r, tol) {
    const chunks = []
    for await (const c of rt.createSession().generate({ tokens: r.promptIds }, { temperature: 0, maxTokens: r.generatedIds.length })) chunks.push(c)
    assert.deepEqual(chunks.map((c) => c.tokenId), r.generatedIds)
    chunks.forEach((c, i) => {
      const d = Math.abs(c.logprob - r.steps[i].logprob)
      assert.ok(d <= tol, `step ${i}: ${c.logprob} vs llama.cpp ${r.steps[i].logprob} (|d| = ${d})`)
    })
  }
})
