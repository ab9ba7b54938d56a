// The real Gemma 3 270M (base) Q4_K_M GGUF (DESIGN's PyPI asset, fetched by scripts/assets.mjs)
// against llama.cpp, the independent reader of the same file: the prompt's token ids, and the
// greedy answer token for token with each step's logprob
// (__test__/fixtures/gemma3-270m-llamacpp.json, scripts/gen_gemma3_llamacpp_ref.mjs). This checks
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
let modelPath
let skip = false
try {
  modelPath = await ensureGemma3({ quiet: true })
} catch (e) {
  skip = `Gemma 3 270M GGUF unavailable: ${e?.message ?? e}`
}

/**
 * Both engines run the same integer dot products on the same blocks, but llama.cpp takes GELU
 * from an f16 table and, on the CPU, attends in f16 (flash attention); we compute both in f32.
 * Measured: at most 0.057 over the 16 steps.
 */
const LOGPROB_TOL = 0.1

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

  it('tokenizes the prompt as llama.cpp (BOS first)', () => {
    assert.deepEqual(rt.tokenize(ref.prompt), ref.promptIds)
  })

  it(`answers " Paris", and its greedy tokens are llama.cpp's with logprobs within ${LOGPROB_TOL}`, async () => {
    const r = await rt.createSession().complete({ tokens: ref.promptIds }, { temperature: 0, maxTokens: ref.generatedIds.length })
    assert.ok(r.text.startsWith(' Paris'), JSON.stringify(r.text))
    assert.deepEqual(r.tokens, ref.generatedIds)
    const { chunks } = await collectLogprobs(rt, ref.promptIds, ref.generatedIds.length)
    chunks.forEach((c, i) => {
      const d = Math.abs(c.logprob - ref.steps[i].logprob)
      assert.ok(d <= LOGPROB_TOL, `step ${i}: ${c.logprob} vs llama.cpp ${ref.steps[i].logprob} (|d| = ${d})`)
    })
  })
})

async function collectLogprobs(rt, tokens, n) {
  const chunks = []
  for await (const c of rt.createSession().generate({ tokens }, { temperature: 0, maxTokens: n })) chunks.push(c)
  return { chunks }
}
