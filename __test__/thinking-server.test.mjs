// Thinking models through the OpenAI-compatible server: `message.reasoning_content`,
// `delta.reasoning_content`, `usage.completion_tokens_details.reasoning_tokens`,
// `chat_template_kwargs.enable_thinking`, `reasoning_effort` and `thinking_budget`, each equal
// to what the in-process API gives for the same request; hostile values are 400s. On the Qwen3
// fixture (the mechanics) and on SmolLM2 with the think expert (a model that thinks).
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { existsSync } from 'node:fs'
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'
import { fixture } from './helpers.mjs'
import { smolLM2OrSkip } from '../scripts/assets.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')
const { createServer } = require('../dist/server/index.js')
const THINK_EXPERT = fileURLToPath(new URL('../experts/think-smollm2', import.meta.url))

async function start(rt) {
  const server = createServer(rt, { modelName: 'base' })
  const { port } = await server.listen(0, '127.0.0.1')
  const post = (body) => fetch(`http://127.0.0.1:${port}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })
  return { server, post }
}

/** The `data:` payloads of an SSE response, parsed (without `[DONE]`). */
async function events(res) {
  const text = await res.text()
  assert.ok(text.endsWith('data: [DONE]\n\n'))
  return text.split('\n\n').filter(Boolean).map((e) => e.slice(6)).filter((e) => e !== '[DONE]').map((e) => JSON.parse(e))
}

describe('server: thinking on the Qwen3 fixture', () => {
  let rt, srv
  const REGEX = { type: 'regex', pattern: '[a-z]{3,6}' }
  const MESSAGES = [{ role: 'user', content: 'Think, then answer.' }]
  before(async () => {
    rt = await Runtime.load(fixture('qwen3-tiny'))
    srv = await start(rt)
  })
  after(async () => {
    await srv?.server.close()
    await rt?.dispose()
  })

  const direct = (options) => rt.createSession().complete(MESSAGES, { temperature: 0, maxTokens: 48, responseFormat: REGEX, ...options })

  it('thinking_budget: the message, the streamed deltas and the usage equal the in-process answer', async () => {
    const mine = await direct({ thinking: { budgetTokens: 4 } })
    assert.ok(mine.usage.reasoningTokens > 4)
    const body = { model: 'base', messages: MESSAGES, temperature: 0, max_tokens: 48, response_format: REGEX, thinking_budget: 4 }
    const r = await (await srv.post(body)).json()
    const m = r.choices[0].message
    assert.equal(m.reasoning_content, mine.reasoning || null)
    assert.equal(m.content, mine.text)
    assert.equal(r.usage.completion_tokens_details.reasoning_tokens, mine.usage.reasoningTokens)
    const chunks = await events(await srv.post({ ...body, stream: true, stream_options: { include_usage: true } }))
    const deltas = chunks.flatMap((c) => c.choices.map((x) => x.delta))
    assert.equal(deltas.map((d) => d.reasoning_content ?? '').join(''), mine.reasoning)
    assert.equal(deltas.map((d) => d.content ?? '').join(''), mine.text)
    assert.ok(deltas.every((d) => !(d.reasoning_content && d.content)), 'a delta is thought or answer')
    assert.equal(chunks.at(-1).usage.completion_tokens_details.reasoning_tokens, mine.usage.reasoningTokens)
  })

  it('enable_thinking false and reasoning_effort none: no thought, the prompt the in-process option renders', async () => {
    const mine = await direct({ thinking: false })
    for (const extra of [{ chat_template_kwargs: { enable_thinking: false } }, { reasoning_effort: 'none' }, { thinking_budget: 0 }]) {
      const r = await (await srv.post({ model: 'base', messages: MESSAGES, temperature: 0, max_tokens: 48, response_format: REGEX, ...extra })).json()
      assert.equal(r.choices[0].message.reasoning_content, null, JSON.stringify(extra))
      assert.equal(r.choices[0].message.content, mine.text)
      assert.equal(r.usage.prompt_tokens, mine.usage.promptTokens)
      assert.equal(r.usage.completion_tokens_details.reasoning_tokens, 0)
    }
  })

  it('reasoning_effort maps to its documented budget', async () => {
    const { EFFORT_BUDGETS } = require('../dist/server/reasoning.js')
    assert.deepEqual(EFFORT_BUDGETS, { none: 0, minimal: 128, low: 512, medium: 2048, high: null })
    const mine = await direct({ thinking: { budgetTokens: 128 }, maxTokens: 24 })
    const r = await (await srv.post({ model: 'base', messages: MESSAGES, temperature: 0, max_tokens: 24, response_format: REGEX, reasoning_effort: 'minimal' })).json()
    assert.equal(r.choices[0].message.reasoning_content, mine.reasoning)
  })

  it("an assistant message's reasoning_content goes back into the conversation", async () => {
    const history = [...MESSAGES, { role: 'assistant', content: 'abc', reasoning_content: 'hmm' }, { role: 'tool', tool_call_id: 'x', content: 'ok' }]
    const mine = await rt.createSession().complete([...MESSAGES, { role: 'assistant', content: 'abc', reasoning: 'hmm' }, { role: 'tool', toolCallId: 'x', content: 'ok' }], { temperature: 0, maxTokens: 4, thinking: false })
    const without = await rt.createSession().complete([...MESSAGES, { role: 'assistant', content: 'abc' }, { role: 'tool', toolCallId: 'x', content: 'ok' }], { temperature: 0, maxTokens: 4, thinking: false })
    // Qwen3's template keeps the thought of the turn after the last user message.
    assert.ok(mine.usage.promptTokens > without.usage.promptTokens)
    const r = await (await srv.post({ model: 'base', messages: history, temperature: 0, max_tokens: 4, chat_template_kwargs: { enable_thinking: false } })).json()
    assert.equal(r.usage.prompt_tokens, mine.usage.promptTokens)
  })

  it('hostile thinking fields are 400s naming the field', async () => {
    const cases = [
      [{ chat_template_kwargs: 5 }, 'chat_template_kwargs'],
      [{ chat_template_kwargs: [] }, 'chat_template_kwargs'],
      [{ chat_template_kwargs: { enable_thinking: 'yes' } }, 'chat_template_kwargs'],
      [{ chat_template_kwargs: { custom_flag: true } }, 'chat_template_kwargs'],
      [{ reasoning_effort: 'extreme' }, 'reasoning_effort'],
      [{ reasoning_effort: 3 }, 'reasoning_effort'],
      [{ thinking_budget: -1 }, 'thinking_budget'],
      [{ thinking_budget: 1.5 }, 'thinking_budget'],
      [{ thinking_budget: 2 ** 31 }, 'thinking_budget'],
      [{ thinking_budget: '8' }, 'thinking_budget'],
      [{ reasoning_effort: 'low', thinking_budget: 8 }, 'thinking_budget'],
      [{ chat_template_kwargs: { enable_thinking: false }, reasoning_effort: 'low' }, 'chat_template_kwargs'],
      [{ messages: [{ role: 'assistant', content: 'a', reasoning_content: 5 }, { role: 'user', content: 'b' }] }, 'messages[0].reasoning_content'],
    ]
    for (const [extra, param] of cases) {
      const res = await srv.post({ model: 'base', messages: MESSAGES, max_tokens: 2, ...extra })
      assert.equal(res.status, 400, JSON.stringify(extra))
      assert.equal((await res.json()).error.param, param, JSON.stringify(extra))
    }
  })
})

const smol = smolLM2OrSkip()
describe('server: SmolLM2 with the think expert', { skip: smol.skip || (!existsSync(THINK_EXPERT) && 'experts/think-smollm2 is missing') }, () => {
  let rt, srv
  before(async () => {
    rt = await Runtime.load(smol.modelPath)
    await rt.loadExpert(THINK_EXPERT)
    srv = await start(rt)
  })
  after(async () => {
    await srv?.server.close()
    await rt?.dispose()
  })

  it('the model named by the expert thinks: reasoning_content apart from content; reasoning_effort none answers at once', async () => {
    const messages = [{ role: 'user', content: 'What is 34 + 58?' }]
    const r = await (await srv.post({ model: 'think', messages, temperature: 0, max_tokens: 160 })).json()
    const m = r.choices[0].message
    assert.ok(m.reasoning_content && m.reasoning_content.length > 10, JSON.stringify(m))
    assert.ok(m.content.trim().length > 0 && !m.content.includes('<think>'), JSON.stringify(m))
    assert.equal(r.choices[0].finish_reason, 'stop')
    const quick = await (await srv.post({ model: 'think', messages, temperature: 0, max_tokens: 60, reasoning_effort: 'none' })).json()
    assert.equal(quick.choices[0].message.reasoning_content, null)
    assert.ok(quick.choices[0].message.content.trim().length > 0)
  })
})
