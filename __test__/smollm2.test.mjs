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
    // Parity with HF and llama.cpp is about cold prompts: with quantized weights, a prompt whose
    // prefix comes from the prefix cache differs in the last digits (the quantized kernels
    // depend on how many rows run together), so these runs keep the prefix cache off.
    rt = await Runtime.load(modelPath, { threads: THREADS, kvCache: { prefixCache: false } })
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

})
