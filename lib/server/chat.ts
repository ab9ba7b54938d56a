import type { ServerResponse } from 'node:http'
import type { ChatMessage, TokenChunk } from '../types'
import { badRequest } from './errors'
import { newId, now, runGeneration, startSse, tokenInfo, usage } from './generation'
import type { Context } from './context'
import { refuseUnsupported, samplingOptions } from './params'

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

function messages(v: unknown): ChatMessage[] {
  if (!Array.isArray(v) || v.length === 0) throw badRequest('messages must be a non-empty array', 'messages')
  return v.map((m, i) => {
    if (!m || typeof m !== 'object') throw badRequest(`messages[${i}] must be an object`, `messages[${i}]`)
    const role = (m as { role?: unknown }).role
    if (role === 'tool' || role === 'function') throw badRequest('tool messages are not supported yet (function calling)', `messages[${i}].role`)
    if (role !== 'system' && role !== 'developer' && role !== 'user' && role !== 'assistant') {
      throw badRequest(`messages[${i}].role must be system, developer, user or assistant`, `messages[${i}].role`)
    }
    return { role: role === 'developer' ? 'system' : role, content: content((m as { content?: unknown }).content, i) }
  })
}

/** `POST /v1/chat/completions`. */
export async function chatCompletions(ctx: Context, body: Record<string, unknown>, res: ServerResponse, model: string): Promise<void> {
  refuseUnsupported(body)
  const msgs = messages(body.messages)
  const options = samplingOptions(body, ['max_tokens', 'max_completion_tokens'])
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
    ctx.json(res, 200, {
      ...base,
      object: 'chat.completion',
      choices: [{ index: 0, message: { role: 'assistant', content: r.text, refusal: null }, logprobs: logprobs === true ? { content } : null, finish_reason: r.finishReason }],
      usage: usage(r),
      expert_runtime: { experts: r.experts, routing: r.routing ?? null },
    })
    return
  }
  const send = startSse(res)
  const chunk = (delta: Record<string, unknown>, finish: string | null, extra: Record<string, unknown> = {}) =>
    send({ ...base, object: 'chat.completion.chunk', choices: [{ index: 0, delta, logprobs: null, finish_reason: finish, ...extra }], ...(includeUsage ? { usage: null } : {}) })
  let started = false
  const first = () => {
    if (!started) chunk({ role: 'assistant', content: '' }, null)
    started = true
  }
  const r = await runGeneration(ctx.rt, msgs, options, res, ctx.metrics, ctx.track, (c) => {
    first()
    chunk({ content: c.text }, null, logprobs === true ? { logprobs: { content: [lp(c)] } } : {})
  })
  first()
  chunk({}, r.finishReason)
  if (includeUsage) send({ ...base, object: 'chat.completion.chunk', choices: [], usage: usage(r) })
  send('[DONE]')
  res.end()
}
