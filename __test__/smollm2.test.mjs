// A real model: SmolLM2-135M-Instruct, Q4_1 GGUF (llama architecture), through the public API,
// and greedy parity against llama.cpp (node-llama-cpp) on the same file.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { smolLM2OrSkip } from '../scripts/assets.mjs'
import { collect, fixtureJson, GREEDY } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')

const THREADS = 2

const { modelPath, skip } = smolLM2OrSkip()

describe('SmolLM2-135M-Instruct Q4_1 GGUF', { skip }, () => {
  let rt
  before(async () => {
    // The prefix cache stays on: quantized results do not depend on it (see the last test).
    rt = await Runtime.load(modelPath, { threads: THREADS })
  })
  after(() => rt?.dispose())

  it('loads with the expected info', () => {
    const info = rt.info
    assert.equal(info.architecture, 'llama')
    assert.equal(info.numLayers, 30)
    assert.equal(info.hiddenSize, 576)
    assert.equal(info.vocabSize, 49152)
    assert.ok(info.eosTokenIds.includes(2), `eosTokenIds ${info.eosTokenIds}`) // <|im_end|>
  })

  it('greedy chat: "What is the capital of France?" streams, mentions Paris and ends with EOS (stop)', async () => {
    // With the template's default system prompt ("You are a helpful AI assistant named SmolLM,
    // trained by Hugging Face") this Q4_1 file answers with a list of Paris landmarks instead,
    // in llama.cpp too; a plain system prompt gives the direct answer.
    const s = rt.createSession({ system: 'You are a helpful assistant.' })
    const question = 'What is the capital of France?'
    const { chunks, result } = await collect(s.generate(question, { ...GREEDY, maxTokens: 48 }))
    assert.ok(chunks.length > 1)
    assert.equal(result.finishReason, 'stop', `text: ${JSON.stringify(result.text)}`)
    assert.ok(rt.info.eosTokenIds.includes(chunks.at(-1).tokenId), 'the last token is an EOS')
    assert.equal(chunks.at(-1).text, '', 'EOS has no text')
    assert.match(result.text, /Paris/)
    assert.equal(chunks.map((c) => c.text).join(''), result.text)
    assert.deepEqual(s.history, [
      { role: 'system', content: 'You are a helpful assistant.' },
      { role: 'user', content: question },
      { role: 'assistant', content: result.text },
    ])
  })

  it('streamed text never splits a UTF-8 character (no U+FFFD) and concatenates to complete().text', async () => {
    const prompt = 'Write the words "café" and "日本" in a sentence.'
    const opts = { ...GREEDY, maxTokens: 40 }
    const { chunks, result } = await collect(rt.createSession().generate(prompt, opts))
    const joined = chunks.map((c) => c.text).join('')
    chunks.forEach((c, i) => assert.ok(!c.text.includes('\uFFFD'), `chunk ${i} ${JSON.stringify(c.text)}`))
    assert.match(joined, /[^\x00-\x7f]/, `the answer should contain non-ASCII text: ${JSON.stringify(joined)}`)
    assert.ok(joined.includes('日本'), JSON.stringify(joined))
    assert.ok(joined.includes('café'), JSON.stringify(joined))
    assert.equal(joined, result.text)
    const done = await rt.createSession().complete(prompt, opts)
    assert.equal(done.text, joined)
  })

  it('first 16 greedy tokens equal HF transformers and node-llama-cpp on the same GGUF', async () => {
    // The prompt is chosen by scripts/gen_smollm2_reference.py: HF transformers (weights
    // dequantized to f32) has a top-1/top-2 margin of at least 0.15 nats at each of its 16
    // greedy steps, so quantization noise in either engine cannot flip a token. (On prompts
    // with near-ties, e.g. "Write a short poem about the sea." whose first step is a 0.012-nat
    // tie in HF, both quantized engines drift apart from HF and from each other.)
    const ref = fixtureJson('smollm2-reference.json')
    const ids = rt.tokenize(ref.prompt_text, { addSpecialTokens: false, parseSpecialTokens: true })
    assert.deepEqual(ids, ref.prompt_ids, 'our prompt ids equal the HF tokenizer\'s')
    const want = ref.steps.map((s) => s.token)
    const N = want.length

    const { chunks } = await collect(rt.createSession().generate({ tokens: ids }, { ...GREEDY, maxTokens: N }))
    assert.deepEqual(chunks.map((c) => c.tokenId), want, 'ours vs HF')
    // Q4_1 repacked to Q8_0 plus 8-bit activations: logprobs stay within 0.15 nats of HF (the
    // worst step is 0.106; the bound is quantization noise, which any change in summation order
    // upstream of an activation quantization moves by a few hundredths). Exactness of the same
    // path at f32 is checked by tests/parity.rs smollm2_dequantized_matches_hf (2.6e-5).
    for (const [i, c] of chunks.entries()) {
      assert.ok(Math.abs(c.logprob - ref.steps[i].logprob) < 0.15, `step ${i}: ${c.logprob} vs HF ${ref.steps[i].logprob}`)
    }

    const { getLlama } = await import('node-llama-cpp')
    const llama = await getLlama({ gpu: false, build: 'never' })
    const theirs = []
    try {
      const model = await llama.loadModel({ modelPath })
      try {
        assert.deepEqual(Array.from(model.tokenize(ref.prompt_text, true)), ids, 'llama.cpp tokenizes the prompt the same way')
        const ctx = await model.createContext({ contextSize: 512, threads: THREADS })
        try {
          for await (const id of ctx.getSequence().evaluate(ids, { temperature: 0 })) {
            theirs.push(id)
            if (theirs.length >= N) break
          }
        } finally {
          await ctx.dispose()
        }
      } finally {
        await model.dispose()
      }
    } finally {
      await llama.dispose()
    }
    assert.deepEqual(theirs, want, 'node-llama-cpp vs HF (and so vs ours)')
  })

  it('bit-identical logprobs alone, inside a 16-session batch and after a prefix-cache hit', async () => {
    // Every row of a Q8_0 product (Q4_1 runs repacked to Q8_0) takes the same integer kernel
    // whatever the number of rows, and attention sums each (row, head) in one order whatever
    // its tile: a prompt's results cannot depend on what runs beside it or on what was cached.
    // Long enough to be prefilled as one pass of many rows alone, and as a pass of a few rows
    // after the cache hit.
    const text = 'Here are my notes on light and air. ' + 'Sunlight is scattered by the molecules of the air, short wavelengths most of all. '.repeat(8) +
      'Explain in two sentences why the sky is blue, then name three colours of a sunset.'
    const tokens = rt.tokenize(text)
    assert.ok(tokens.length > 150, `the prompt has ${tokens.length} tokens`)
    const opts = { ...GREEDY, maxTokens: 12, topLogprobs: 4 }
    const trace = ({ chunks }) => chunks.map((c) => [c.tokenId, c.logprob, c.topLogprobs.map((t) => [t.tokenId, t.logprob])])
    const fresh = await Runtime.load(modelPath, { threads: THREADS })
    try {
      const alone = await collect(fresh.createSession().generate({ tokens }, opts))
      const hit = await collect(fresh.createSession().generate({ tokens }, opts))
      assert.ok(hit.result.usage.cachedTokens > 0, 'the second run starts from the prefix cache')
      // Fifteen other prompts of other lengths start at the same time as ours on a runtime
      // that has cached none of them.
      const others = Array.from({ length: 15 }, (_, i) => `Question ${i}: ${'how far is the moon '.repeat(1 + (i % 5))}?`)
      const runs = await Promise.all([
        ...others.slice(0, 7).map((q) => collect(rt.createSession().generate(q, opts))),
        collect(rt.createSession().generate({ tokens }, opts)),
        ...others.slice(7).map((q) => collect(rt.createSession().generate(q, opts))),
      ])
      const batched = runs[7]
      assert.equal(batched.result.usage.cachedTokens, 0)
      assert.deepEqual(trace(hit), trace(alone), 'after a prefix-cache hit')
      assert.deepEqual(trace(batched), trace(alone), 'inside a batch of 16')
    } finally {
      await fresh.dispose()
    }
  })
})
