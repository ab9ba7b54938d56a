// A real model: SmolLM2-135M-Instruct, Q4_1 GGUF (llama architecture), through the public API,
// and greedy parity against llama.cpp (node-llama-cpp) on the same file.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { ensureSmolLM2 } from '../scripts/assets.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')

const THREADS = 2
const GREEDY = { temperature: 0 }

let modelPath
let skip = false
try {
  modelPath = ensureSmolLM2({ quiet: true })
} catch (e) {
  skip = `SmolLM2 GGUF unavailable: ${e?.message ?? e}`
}

async function collect(stream) {
  const chunks = []
  for await (const c of stream) chunks.push(c)
  return { chunks, result: stream.result }
}

describe('SmolLM2-135M-Instruct Q4_1 GGUF', { skip }, () => {
  let rt
  before(async () => {
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

  it('first 16 greedy tokens match node-llama-cpp on the same GGUF and prompt ids', async (t) => {
    const text =
      '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' +
      '<|im_start|>user\nWrite a short poem about the sea.<|im_end|>\n<|im_start|>assistant\n'
    const ids = rt.tokenize(text, { addSpecialTokens: false })
    const N = 16

    const { chunks } = await collect(rt.createSession().generate({ tokens: ids }, { ...GREEDY, maxTokens: N, topLogprobs: 5 }))
    const ours = chunks.map((c) => c.tokenId)
    assert.equal(ours.length, N)
    assert.ok(!ours.some((id) => rt.info.eosTokenIds.includes(id)), 'no EOS within the first 16 tokens')

    const { getLlama } = await import('node-llama-cpp')
    const llama = await getLlama({ gpu: false, build: 'never' })
    let theirs
    try {
      const model = await llama.loadModel({ modelPath })
      try {
        assert.deepEqual(Array.from(model.tokenize(text, true)), ids, 'both tokenizers give the same prompt ids')
        const ctx = await model.createContext({ contextSize: 512, threads: THREADS })
        try {
          theirs = []
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

    let d = 0
    while (d < N && ours[d] === theirs[d]) d++
    t.diagnostic(`ours:   ${JSON.stringify(ours)}`)
    t.diagnostic(`llama:  ${JSON.stringify(theirs)}`)
    t.diagnostic(`identical prefix: ${d} of ${N}`)

    // Observed: the first 11 tokens agree. At index 11 ("In the depths of the blue,\nA world of"
    // → " wonder" vs " endless") the two engines pick different tokens of a near-tie: our top-2
    // there is llama.cpp's choice, 0.024 nats below our top-1. Cause: quantization noise (this
    // engine repacks Q4_1 to Q8_0 on CPU; llama.cpp runs Q4_1 x Q8_1), not a model bug. So
    // we assert the observed 11-token prefix, and that any divergence is such a near-tie.
    const OBSERVED_PREFIX = 11
    assert.ok(d >= OBSERVED_PREFIX, `identical prefix ${d} < ${OBSERVED_PREFIX}\nours   ${ours}\nllama  ${theirs}`)
    if (d < N) {
      const top = chunks[d].topLogprobs
      const theirsAt = top.find((x) => x.tokenId === theirs[d])
      assert.ok(theirsAt, `llama.cpp's token ${theirs[d]} at index ${d} is not in our top-5 ${JSON.stringify(top)}`)
      const gap = top[0].logprob - theirsAt.logprob
      assert.ok(gap < 0.1, `index ${d}: llama.cpp's token is ${gap} nats below our top-1 (not a near-tie)`)
    }
  })
})
