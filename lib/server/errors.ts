import { ExpertRuntimeError } from '../errors'

/** An error with the HTTP status and OpenAI error fields it is answered with. */
export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type: string,
    readonly param: string | null = null,
    readonly code: string | null = null,
  ) {
    super(message)
  }
}

export const badRequest = (message: string, param: string | null = null, code: string | null = null) =>
  new HttpError(400, message, 'invalid_request_error', param, code)

export const notFound = (message: string, code = 'not_found') => new HttpError(404, message, 'invalid_request_error', null, code)

/** camelCase option names in engine messages → the request field a client sent. */
const PARAMS: Record<string, string> = {
  maxTokens: 'max_tokens',
  temperature: 'temperature',
  topP: 'top_p',
  topK: 'top_k',
  minP: 'min_p',
  repetitionPenalty: 'repetition_penalty',
  frequencyPenalty: 'frequency_penalty',
  presencePenalty: 'presence_penalty',
  seed: 'seed',
  stop: 'stop',
  topLogprobs: 'top_logprobs',
  speculative: 'speculative',
}

/** The HTTP answer for anything thrown while serving a request. */
export function toHttpError(e: unknown): HttpError {
  if (e instanceof HttpError) return e
  if (e instanceof ExpertRuntimeError) {
    const param = Object.entries(PARAMS).find(([k]) => e.message.includes(k))?.[1] ?? null
    switch (e.code) {
      case 'INVALID_ARGUMENT':
        return badRequest(e.message, param, e.code)
      case 'CONTEXT_OVERFLOW':
        return badRequest(e.message, 'messages', 'context_length_exceeded')
      case 'EXPERT_NOT_FOUND':
        return notFound(e.message, 'model_not_found')
      case 'SESSION_BUSY':
        return new HttpError(409, e.message, 'invalid_request_error', null, e.code)
      case 'KV_CACHE_EXHAUSTED':
      case 'OUT_OF_MEMORY':
        return new HttpError(503, e.message, 'server_error', null, e.code)
      case 'DISPOSED':
        return new HttpError(503, 'the server is shutting down', 'server_error', null, e.code)
      case 'INVALID_ADAPTER':
      case 'UNSUPPORTED_ADAPTER':
        return badRequest(e.message, 'name', e.code)
      default:
        return new HttpError(500, e.message, 'server_error', null, e.code)
    }
  }
  return new HttpError(500, 'internal error', 'server_error')
}

/** OpenAI's error body. */
export const errorBody = (e: HttpError) => ({ error: { message: e.message, type: e.type, param: e.param, code: e.code } })
