// Thinking models: the thought arrives apart from the answer (chunk.reasoning,
// result.reasoning), under a budget closed by the template's own marker, and a budget of 0 is
// no thought. The mechanics are shown on the Qwen3 fixture (random weights, its real chat
// template): under a grammar the opening marker is forced, so exactly `budgetTokens` thought
// tokens, then the closing marker's tokens, then the answer the grammar shapes. The behaviour
// is shown on a real model that thinks: SmolLM2 with the "think" expert
// (experts/think-smollm2, trained by scripts/train_think_lora.py), whose manifest declares the
// markers its base's template does not know.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { existsSync } from 'node:fs'
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'
import { collect, coded, fixture } from './helpers.mjs'
import { smolLM2OrSkip } from '../scripts/assets.mjs'

const { Runtime } = createRequire(import.meta.url)('../dist/index.js')
const THINK_EXPERT = fileURLToPath(new URL('../experts/think-smollm2', import.meta.url))

/** Checks that the chunks add up to the summary, part by part. */
function assertChunksAddUp(chunks, result) {
  assert.equal(chunks.map((c) => c.text).join(''), result.text)
  assert.equal(chunks.map((c) => c.reasoning ?? '').join(''), result.reasoning ?? '')
  for (const c of chunks) if (c.reasoning !== undefined) assert.ok(c.reasoning.length > 0, 'a chunk carries reasoning only when it has some')
}

describe('thinking: the mechanics on the Qwen3 fixture', () => {
  let rt
  let open, close, empty
  before(async () => {
    // Room for the tool instructions the template renders (the fixture's own context is 512).
    rt = await Runtime.load(fixture('qwen3-tiny'), { contextLength: 2048 })
    const special = { parseSpecialTokens: true }
    open = rt.tokenize('<think>\n', special)
    close = rt.tokenize('\n</think>\n\n', special)
    empty = rt.tokenize('<think>\n\n</think>\n\n', special)
  })
  after(() => rt?.dispose())

  for (const budget of [1, 5, 12]) {
    it(`a budget of ${budget}: opening forced, ${budget} thought tokens, the closing marker, then the constrained answer`, async () => {
      const s = rt.createSession()
      const format = { type: 'regex', pattern: '[a-z]{3,6}' }
      const { chunks, result } = await collect(
        s.generate('Think, then answer.', { thinking: { budgetTokens: budget }, responseFormat: format, temperature: 0, maxTokens: 64 }),
      )
      const t = result.tokens
      assert.deepEqual(t.slice(0, open.length), open)
      const thought = t.slice(open.length, open.length + budget)
      assert.deepEqual(t.slice(open.length + budget, open.length + budget + close.length), close)
      assert.equal(result.reasoning, rt.detokenize(thought).trim())
      assert.match(result.text, /^[a-z]{3,6}$/)
      assert.equal(result.finishReason, 'stop')
      assert.equal(result.usage.reasoningTokens, open.length + budget + close.length)
      assertChunksAddUp(chunks, result)
      // Every token, forced ones included, carries the model's own finite logprob.
      for (const c of chunks) assert.ok(Number.isFinite(c.logprob) && c.logprob <= 0, `${c.tokenId}: ${c.logprob}`)
      const last = s.history.at(-1)
      assert.equal(last.role, 'assistant')
      assert.equal(last.content, result.text)
      assert.equal(last.reasoning, result.reasoning || undefined)
      s.dispose()
    })
  }

  it('thinking off (false, budget 0 or the enableThinking alias): the prompt ends past an empty thought and nothing is thought', async () => {
    const run = async (options) => {
      const s = rt.createSession()
      const r = await s.complete('Answer at once.', { temperature: 0, maxTokens: 8, ...options })
      s.dispose()
      return r
    }
    const on = await run({ thinking: true })
    const off = await run({ thinking: false })
    assert.equal(off.usage.promptTokens - on.usage.promptTokens, empty.length)
    assert.equal(off.reasoning, '')
    assert.equal(off.usage.reasoningTokens, 0)
    for (const same of [await run({ thinking: { budgetTokens: 0 } }), await run({ enableThinking: false })]) {
      assert.deepEqual(same.tokens, off.tokens)
      assert.equal(same.usage.promptTokens, off.usage.promptTokens)
      assert.equal(same.reasoning, '')
    }
  })

  it('a forced tool call comes after the thought', async () => {
    const s = rt.createSession()
    const tool = {
      type: 'function',
      function: { name: 'lookup', parameters: { type: 'object', properties: { q: { type: 'string', maxLength: 8 } }, required: ['q'], additionalProperties: false } },
    }
    const r = await s.complete('Look it up.', { tools: [tool], toolChoice: 'required', thinking: { budgetTokens: 3 }, temperature: 0, maxTokens: 256 })
    assert.equal(r.finishReason, 'tool_calls')
    assert.equal(r.toolCalls[0].function.name, 'lookup')
    assert.equal(typeof JSON.parse(r.toolCalls[0].function.arguments).q, 'string')
    assert.deepEqual(r.tokens.slice(0, open.length), open)
    assert.deepEqual(r.tokens.slice(open.length + 3, open.length + 3 + close.length), close)
    assert.ok(!r.text.includes('<think>') && !r.text.includes('</think>'))
    s.dispose()
  })

  it('a cancelled thought: the summary and the history keep what was delivered', async () => {
    const s = rt.createSession()
    const stream = s.generate('Think long.', { thinking: { budgetTokens: 40 }, responseFormat: { type: 'regex', pattern: '[a-z]{3}' }, temperature: 0, maxTokens: 64 })
    const seen = []
    for await (const c of stream) {
      seen.push(c)
      if (seen.length === open.length + 4) break
    }
    const r = stream.result
    assert.equal(r.finishReason, 'cancelled')
    assert.equal(r.reasoning, seen.map((c) => c.reasoning ?? '').join(''))
    assert.equal(s.history.at(-1).reasoning, r.reasoning || undefined)
    s.dispose()
  })

  it("history: a turn's thought goes to the template, which decides (Qwen3 drops earlier turns' thoughts)", async () => {
    const prompt = async (reasoning) => {
      const s = rt.createSession()
      const turn = [
        { role: 'user', content: 'q' },
        { role: 'assistant', content: 'a', ...(reasoning ? { reasoning } : {}) },
      ]
      s.setHistory(turn)
      assert.deepEqual(s.history, turn)
      const r = await s.complete('next', { maxTokens: 1, temperature: 0, thinking: false })
      s.dispose()
      return r.usage.promptTokens
    }
    assert.equal(await prompt('a long thought that the template leaves out of earlier turns'), await prompt(undefined))
  })

  it('hostile thinking options are INVALID_ARGUMENT', async () => {
    const s = rt.createSession()
    for (const thinking of ['yes', 1, null, [], { budgetTokens: -1 }, { budgetTokens: 1.5 }, { budgetTokens: NaN }, { budgetTokens: 2 ** 31 }, { budgetTokens: '3' }, { budget: 3 }, {}]) {
      await assert.rejects(collect(s.generate('x', { thinking })), coded('INVALID_ARGUMENT'), JSON.stringify(thinking))
      await assert.rejects(s.complete('x', { thinking }), coded('INVALID_ARGUMENT'), JSON.stringify(thinking))
    }
    await assert.rejects(s.complete('x', { thinking: true, enableThinking: false }), coded('INVALID_ARGUMENT'))
    await assert.rejects(s.complete('x', { thinking: { budgetTokens: 4 }, enableThinking: false }), coded('INVALID_ARGUMENT'))
    assert.throws(() => s.setHistory([{ role: 'assistant', content: 'a', reasoning: 5 }]), coded('INVALID_ARGUMENT'))
    s.dispose()
  })

  it('a model that does not think ignores the option and has no reasoning', async () => {
    // The Gemma 3 fixture's template knows no thoughts.
    const plain = await Runtime.load(fixture('gemma3-tiny'))
    const s = plain.createSession()
    const r = await s.complete('hi', { thinking: { budgetTokens: 2 }, maxTokens: 4, temperature: 0 })
    assert.equal(r.reasoning, undefined)
    await plain.dispose()
  })
})

const smol = smolLM2OrSkip()
describe('thinking: SmolLM2 with the think expert', { skip: smol.skip || (!existsSync(THINK_EXPERT) && 'experts/think-smollm2 is missing') }, () => {
  let rt
  before(async () => {
    rt = await Runtime.load(smol.modelPath)
    await rt.loadExpert(THINK_EXPERT)
  })
  after(() => rt?.dispose())

  const QUESTIONS = ['What is 23 + 48?', 'Tom has 12 apples and buys 7 more. How many apples does he have?', 'Which is larger, 67 or 76?']

  it('thinks, then answers: the thought is separated from the text', async () => {
    for (const q of QUESTIONS) {
      const s = rt.createSession({ experts: ['think'] })
      const { chunks, result } = await collect(s.generate(q, { temperature: 0, maxTokens: 160 }))
      assert.equal(result.finishReason, 'stop', q)
      assert.ok(result.reasoning.length > 10, `${q}: thought ${JSON.stringify(result.reasoning)}`)
      assert.ok(result.text.trim().length > 0, `${q}: answer ${JSON.stringify(result.text)}`)
      for (const part of [result.text, result.reasoning]) assert.ok(!/<\/?think>/.test(part), JSON.stringify(part))
      assertChunksAddUp(chunks, result)
      s.dispose()
    }
  })

  it('the budget holds: at most budgetTokens thought tokens, then the answer', async () => {
    const s = rt.createSession({ experts: ['think'] })
    const budget = 6
    const { chunks, result } = await collect(s.generate(QUESTIONS[1], { thinking: { budgetTokens: budget }, temperature: 0, maxTokens: 120 }))
    const closeAt = result.tokens.findIndex((_, i) => rt.detokenize(result.tokens.slice(0, i + 1)).includes('</think>'))
    assert.ok(closeAt > 0, 'the thought was closed')
    const thoughtTokens = chunks.filter((c) => c.reasoning !== undefined).length
    assert.ok(thoughtTokens <= budget, `${thoughtTokens} thought chunks`)
    assert.ok(result.text.trim().length > 0, `an answer follows: ${JSON.stringify(result.text)}`)
    assert.equal(result.finishReason, 'stop')
    s.dispose()
  })

  it('a budget of 0 (or thinking: false) means no thought', async () => {
    for (const thinking of [false, { budgetTokens: 0 }]) {
      const s = rt.createSession({ experts: ['think'] })
      const r = await s.complete(QUESTIONS[0], { thinking, temperature: 0, maxTokens: 60 })
      assert.equal(r.reasoning, '')
      assert.ok(r.text.trim().length > 0 && !r.text.includes('<think>'), JSON.stringify(r.text))
      s.dispose()
    }
  })

  it('without the expert the base model does not think (no markers declared)', async () => {
    const s = rt.createSession()
    const r = await s.complete(QUESTIONS[0], { temperature: 0, maxTokens: 20 })
    assert.equal(r.reasoning, undefined)
    s.dispose()
  })
})
