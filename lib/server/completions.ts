import type { ServerResponse } from 'node:http'
import type { GenerateInput, TokenChunk } from '../types'
import { badRequest } from './errors'
import { expertsHeader, newId, now, runGeneration, startSse, tokenInfo, usage } from './generation'
import type { Context } from './context'
import { samplingOptions } from './params'
import { type ExpertRun, expertRun } from './models'
import { structuredOptions } from './structured'

/** `prompt`: a string, an array of token ids, or a one-element array of either. */
function prompt(v: unknown): GenerateInput {
  if (Array.isArray(v) && v.length === 1 && (typeof v[0] === 'string' || Array.isArray(v[0]))) v = v[0]
  if (typeof v === 'string') return { text: v }
  if (Array.isArray(v) && v.length > 0 && v.every((t) => Number.isInteger(t) && t >= 0 && t <= 2 ** 32 - 1)) return { tokens: v as number[] }
  throw badRequest('prompt must be a string or an array of token ids (one prompt per request)', 'prompt')
}

/** `POST /v1/completions` (raw text or token ids, no chat template). */
export async function completions(ctx: Context, body: Record<string, unknown>, res: ServerResponse, model: string): Promise<void> {
  const input = prompt(body.prompt)
  if (body.echo === true) throw badRequest('echo is not supported', 'echo')
  if (body.suffix != null) throw badRequest('suffix is not supported', 'suffix')
  if (body.best_of != null && body.best_of !== 1) throw badRequest('only best_of = 1 is supported', 'best_of')
  const options = { ...samplingOptions(body, ['max_tokens']), ...structuredOptions(body, false) }
  if (options.maxTokens === undefined) options.maxTokens = 16 // OpenAI's default for completions
  const logprobs = body.logprobs
  if (logprobs !== undefined && logprobs !== null && !(Number.isInteger(logprobs) && (logprobs as number) >= 0 && (logprobs as number) <= 20)) {
    throw badRequest('logprobs must be an integer from 0 to 20', 'logprobs')
  }
  const wantLogprobs = typeof logprobs === 'number'
  if (wantLogprobs) options.topLogprobs = logprobs as number
  options.experts = ctx.select(body.model)
  const stream = body.stream === true
  const so = body.stream_options as { include_usage?: unknown } | undefined | null
  const includeUsage = stream && so != null && typeof so === 'object' && so.include_usage === true

  const id = newId('cmpl')
  const created = now()
  const base = { id, created, model, system_fingerprint: null }
  const lp = { tokens: [] as string[], token_logprobs: [] as number[], top_logprobs: [] as Record<string, number>[], text_offset: [] as number[] }
  let offset = 0
  const record = (c: TokenChunk) => {
    const t = tokenInfo(ctx.rt, c.tokenId).token
    lp.tokens.push(t)
    lp.token_logprobs.push(c.logprob)
    lp.top_logprobs.push(Object.fromEntries((c.topLogprobs ?? []).map((x) => [tokenInfo(ctx.rt, x.tokenId).token, x.logprob])))
    lp.text_offset.push(offset)
    offset += t.length
  }
  if (!stream) {
    const r = await ctx.generate(input, options, res, (c) => wantLogprobs && record(c))
    ctx.json(
      res,
      200,
      {
        ...base,
        object: 'text_completion',
        choices: [{ index: 0, text: r.text, logprobs: wantLogprobs ? lp : null, finish_reason: r.finishReason }],
        usage: usage(r),
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
  const once = (from: Parameters<typeof expertRun>[0]) => {
    if (run) return {}
    run = expertRun(from)
    return { expert_runtime: run }
  }
  const r = await runGeneration(ctx.rt, input, options, res, ctx.metrics, ctx.track, (c) => {
    const one = { tokens: [] as string[], token_logprobs: [] as number[], top_logprobs: [] as Record<string, number>[], text_offset: [] as number[] }
    if (wantLogprobs) {
      record(c)
      for (const k of Object.keys(one) as (keyof typeof one)[]) (one[k] as unknown[]).push(lp[k][lp[k].length - 1])
    }
    send({ ...base, object: 'text_completion', choices: [{ index: 0, text: c.text, logprobs: wantLogprobs ? one : null, finish_reason: null }], ...once(c) })
  })
  send({ ...base, object: 'text_completion', choices: [{ index: 0, text: '', logprobs: null, finish_reason: r.finishReason }], ...once(r) })
  if (includeUsage) send({ ...base, object: 'text_completion', choices: [], usage: usage(r) })
  send('[DONE]')
  res.end()
}
