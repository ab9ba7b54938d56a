import type { ServerResponse } from 'node:http'
import type { ChatMessage, TokenChunk } from '../types'
import { badRequest } from './errors'
import { expertsHeader, newId, now, runGeneration, startSse, tokenInfo, usage } from './generation'
import type { Context } from './context'
import { samplingOptions } from './params'
import { type ExpertRun, expertRun } from './models'
import { assistantMessage, structuredOptions, toolCalls } from './structured'
import { messageReasoning, thinkingOptions } from './reasoning'

/** OpenAI message content: a string, or text parts. */
function content(v: unknown, i: number): string {
  if (typeof v === 'string') return v
  if (v === null || v === undefined) return ''
  if (Array.isArray(v)) {
    return v
      .map((p, j) => {
        if (p && typeof p === 'object' && (p as { type?: unknown }).type === 'text' && typeof (p as { text?: unknown }).text === 'string') return (p as { text: string }).text
        throw badRequest(`messages[${i}].content[${j}]: only text parts are supported`, `messages[${i}].content`)
      })
      .join('')
  }
  throw badRequest(`messages[${i}].content must be a string or an array of text parts`, `messages[${i}].content`)
}

/** OpenAI `messages` as chat messages (400 naming what is wrong). */
export function chatMessages(v: unknown): ChatMessage[] {
  if (!Array.isArray(v) || v.length === 0) throw badRequest('messages must be a non-empty array', 'messages')
  return v.map((m, i) => {
    if (!m || typeof m !== 'object') throw badRequest(`messages[${i}] must be an object`, `messages[${i}]`)
    const msg = m as { role?: unknown; content?: unknown; tool_calls?: unknown; tool_call_id?: unknown; reasoning_content?: unknown; reasoning?: unknown }
    const role = msg.role
    if (role !== 'system' && role !== 'developer' && role !== 'user' && role !== 'assistant' && role !== 'tool') {
      throw badRequest(`messages[${i}].role must be system, developer, user, assistant or tool`, `messages[${i}].role`)
    }
    const out: ChatMessage = { role: role === 'developer' ? 'system' : role, content: content(msg.content, i) }
    if (role === 'assistant') {
      const calls = toolCalls(msg.tool_calls, i)
      if (calls) out.toolCalls = calls
      const reasoning = messageReasoning(msg, i)
      if (reasoning !== undefined) out.reasoning = reasoning
    }
    if (role === 'tool') {
      if (typeof msg.tool_call_id !== 'string') throw badRequest(`messages[${i}].tool_call_id must be a string`, `messages[${i}].tool_call_id`)
      out.toolCallId = msg.tool_call_id
    }
    return out
  })
}

/** `POST /v1/chat/completions`. */
export async function chatCompletions(ctx: Context, body: Record<string, unknown>, res: ServerResponse, model: string): Promise<void> {
  const msgs = chatMessages(body.messages)
  const options = { ...samplingOptions(body, ['max_tokens', 'max_completion_tokens']), ...structuredOptions(body, true), ...thinkingOptions(body) }
  const logprobs = body.logprobs
  if (logprobs !== undefined && logprobs !== null && typeof logprobs !== 'boolean') throw badRequest('logprobs must be a boolean', 'logprobs')
  const top = body.top_logprobs
  if (top !== undefined && top !== null && !(Number.isInteger(top) && (top as number) >= 0 && (top as number) <= 20)) {
    throw badRequest('top_logprobs must be an integer from 0 to 20', 'top_logprobs')
  }
  if (top != null && logprobs !== true) throw badRequest('top_logprobs needs logprobs: true', 'top_logprobs')
  if (logprobs === true) options.topLogprobs = (top as number | undefined) ?? 0
  const stream = body.stream === true
  const so = body.stream_options as { include_usage?: unknown } | undefined | null
  const includeUsage = stream && so != null && typeof so === 'object' && so.include_usage === true
  options.experts = ctx.select(body.model)

  const id = newId('chatcmpl')
  const created = now()
  const lp = (c: TokenChunk) => ({
    ...tokenInfo(ctx.rt, c.tokenId),
    logprob: c.logprob,
    top_logprobs: (c.topLogprobs ?? []).map((t) => ({ ...tokenInfo(ctx.rt, t.tokenId), logprob: t.logprob })),
  })
  const base = { id, created, model, system_fingerprint: null }
  if (!stream) {
    const content: ReturnType<typeof lp>[] = []
    const r = await ctx.generate(msgs, options, res, (c) => {
      if (logprobs === true) content.push(lp(c))
    })
    ctx.json(
      res,
      200,
      {
        ...base,
        object: 'chat.completion',
        choices: [{ index: 0, message: assistantMessage(r.text, r.toolCalls, r.reasoning), logprobs: logprobs === true ? { content } : null, finish_reason: r.finishReason }],
        usage: usage(r, true),
        expert_runtime: expertRun(r),
      },
      expertsHeader(r.experts),
    )
    return
  }
  // The first chunk says which experts run (the engine routed 'auto' when it admitted the
  // request): the header and the first SSE chunk carry it.
  let run: ExpertRun | null = null
  const send = startSse(res, () => ctx.headers(expertsHeader(run?.experts ?? [])))
  const chunk = (delta: Record<string, unknown>, finish: string | null, extra: Record<string, unknown> = {}, top: Record<string, unknown> = {}) =>
    send({ ...base, object: 'chat.completion.chunk', choices: [{ index: 0, delta, logprobs: null, finish_reason: finish, ...extra }], ...(includeUsage ? { usage: null } : {}), ...top })
  let started = false
  const first = (from: Parameters<typeof expertRun>[0]) => {
    if (started) return
    started = true
    run = expertRun(from)
    chunk({ role: 'assistant', content: '' }, null, {}, { expert_runtime: run })
  }
  const r = await runGeneration(ctx.rt, msgs, options, res, ctx.metrics, ctx.track, (c) => {
    first(c)
    const extra = logprobs === true ? { logprobs: { content: [lp(c)] } } : {}
    const deltas = c.toolCallDeltas ?? (c.toolCallDelta ? [c.toolCallDelta] : [])
    if (c.reasoning !== undefined) {
      // A thought's text, in vLLM's and DeepSeek's field; an answer this token began follows.
      chunk({ reasoning_content: c.reasoning }, null, c.text || deltas.length > 0 ? {} : extra)
      if (!c.text && deltas.length === 0) return
    }
    if (deltas.length > 0) {
      if (c.text) chunk({ content: c.text }, null)
      chunk({ tool_calls: deltas }, null, extra)
    } else {
      chunk({ content: c.text }, null, extra)
    }
  })
  first(r)
  chunk({}, r.finishReason)
  if (includeUsage) send({ ...base, object: 'chat.completion.chunk', choices: [], usage: usage(r, true) })
  send('[DONE]')
  res.end()
}
