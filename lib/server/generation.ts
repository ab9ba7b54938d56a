import { randomBytes } from 'node:crypto'
import type { ServerResponse } from 'node:http'
import type { Runtime } from '../runtime'
import type { GenerationStream } from '../session'
import type { CompletionResult, GenerateInput, GenerateOptions, TokenChunk } from '../types'
import type { Metrics } from './metrics'

export const newId = (prefix: string) => `${prefix}-${randomBytes(12).toString('hex')}`
export const now = () => Math.floor(Date.now() / 1000)

/**
 * Runs one stateless request: a fresh session (the prefix cache still shares repeated
 * prefixes between requests), cancelled when the client goes away or the server closes.
 * `onChunk` sees every chunk; returns the summary.
 */
export async function runGeneration(
  rt: Runtime,
  input: GenerateInput,
  options: GenerateOptions,
  res: ServerResponse,
  metrics: Metrics,
  track: (stream: GenerationStream) => () => void,
  onChunk: (c: TokenChunk) => void,
): Promise<CompletionResult> {
  const session = rt.createSession()
  const started = performance.now()
  let last = 0
  const stream = session.generate(input, options)
  const untrack = track(stream)
  // The client went away before the answer was complete: stop within one engine step.
  const onClose = () => {
    if (!res.writableFinished) stream.cancel()
  }
  res.on('close', onClose)
  try {
    for await (const c of stream) {
      const t = performance.now()
      if (last === 0) metrics.ttft.observe((t - started) / 1e3)
      else metrics.itl.observe((t - last) / 1e3)
      last = t
      onChunk(c)
    }
    const r = stream.result
    if (!r) throw new Error('the stream ended without a summary')
    metrics.promptTokens.inc(r.usage.promptTokens)
    metrics.cachedPromptTokens.inc(r.usage.cachedTokens)
    metrics.completionTokens.inc(r.usage.completionTokens)
    return r
  } finally {
    res.off('close', onClose)
    untrack()
    session.dispose()
  }
}

/** OpenAI's usage block; `chat`: with `completion_tokens_details.reasoning_tokens`. */
export const usage = (r: CompletionResult, chat = false) => ({
  prompt_tokens: r.usage.promptTokens,
  completion_tokens: r.usage.completionTokens,
  total_tokens: r.usage.promptTokens + r.usage.completionTokens,
  prompt_tokens_details: { cached_tokens: r.usage.cachedTokens },
  ...(chat ? { completion_tokens_details: { reasoning_tokens: r.usage.reasoningTokens } } : {}),
})

/**
 * Server-sent events: one JSON object per `data:` line, then `data: [DONE]`. The headers go out
 * with the first event, so a request that fails before producing anything (a prompt beyond the
 * context) still gets its JSON error status.
 */
export function startSse(res: ServerResponse, headers: () => Record<string, string> = () => ({})): (data: unknown) => void {
  return (data) => {
    if (res.writableEnded || res.destroyed) return
    if (!res.headersSent) {
      res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', connection: 'keep-alive', 'x-accel-buffering': 'no', ...headers() })
    }
    res.write(`data: ${typeof data === 'string' ? data : JSON.stringify(data)}\n\n`)
  }
}

/**
 * The response header naming the experts that run (`x-expert-runtime-experts`): their names in
 * application order, each percent-encoded (a name may hold any character), comma-separated;
 * empty for the base model.
 */
export const expertsHeader = (experts: string[]) => ({ 'x-expert-runtime-experts': experts.map(encodeURIComponent).join(',') })

/** A token's text and bytes, for logprobs. */
export function tokenInfo(rt: Runtime, id: number) {
  const token = rt.detokenize([id])
  return { token, bytes: [...Buffer.from(token, 'utf8')] }
}
