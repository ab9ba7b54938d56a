import type { GenerateOptions } from '../types'
import { badRequest } from './errors'

type Body = Record<string, unknown>

const isNum = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v)

/** `body[key]` as a number; a wrong type is a 400 naming `name` (the field as the client sent it). */
function num(body: Body, key: string, name = key): number | undefined {
  const v = body[key]
  if (v === undefined || v === null) return undefined
  if (!isNum(v)) throw badRequest(`${name} must be a number`, name.split('.')[0])
  return v
}

function int(body: Body, key: string, min: number, max = Number.MAX_SAFE_INTEGER, name = key): number | undefined {
  const v = num(body, key, name)
  if (v === undefined) return undefined
  if (!Number.isInteger(v) || v < min || v > max) throw badRequest(`${name} must be an integer from ${min} to ${max}`, name.split('.')[0])
  return v
}

/**
 * The sampling options of a chat or text completion request, as `GenerateOptions`: OpenAI's
 * fields, plus `top_k`, `min_p` and `repetition_penalty` as extensions (as vLLM accepts them),
 * and `speculative` (prompt-lookup decoding).
 * Types are checked here (400 naming the field); ranges by the engine.
 */
export function samplingOptions(body: Body, maxTokensKeys: string[]): GenerateOptions {
  const o: GenerateOptions = {}
  for (const k of maxTokensKeys) {
    const v = int(body, k, 1, 2 ** 32 - 1)
    if (v !== undefined) o.maxTokens = v
  }
  o.temperature = num(body, 'temperature')
  o.topP = num(body, 'top_p')
  o.topK = int(body, 'top_k', 0, 2 ** 32 - 1)
  o.minP = num(body, 'min_p')
  o.repetitionPenalty = num(body, 'repetition_penalty')
  o.frequencyPenalty = num(body, 'frequency_penalty')
  o.presencePenalty = num(body, 'presence_penalty')
  const seed = body.seed
  if (seed !== undefined && seed !== null) {
    // OpenAI's seed may be negative: fold it into the engine's unsigned range.
    if (!Number.isSafeInteger(seed)) throw badRequest('seed must be an integer', 'seed')
    o.seed = (seed as number) < 0 ? 2 ** 53 + (seed as number) : (seed as number)
  }
  const stop = body.stop
  if (stop !== undefined && stop !== null) {
    const list = typeof stop === 'string' ? [stop] : stop
    if (!Array.isArray(list) || !list.every((s) => typeof s === 'string')) throw badRequest('stop must be a string or an array of strings', 'stop')
    if (list.length > 16) throw badRequest('stop takes at most 16 strings', 'stop')
    o.stop = list
  }
  const spec = body.speculative
  if (spec !== undefined && spec !== null) {
    // Extension: speculative decoding, `{ "type": "ngram", "max_draft"?, "ngram"?, "min_ngram"? }`.
    const shape = 'speculative must be { "type": "ngram", "max_draft"?: int, "ngram"?: int, "min_ngram"?: int }'
    if (typeof spec !== 'object' || Array.isArray(spec)) throw badRequest(shape, 'speculative')
    const sp = spec as Body
    if (Object.keys(sp).some((k) => !['type', 'max_draft', 'ngram', 'min_ngram'].includes(k)) || typeof sp.type !== 'string') throw badRequest(shape, 'speculative')
    const field = (k: string) => int(sp, k, 0, 2 ** 32 - 1, `speculative.${k}`)
    // Unset fields stay undefined: the engine fills its defaults.
    o.speculative = { type: sp.type as 'ngram', maxDraft: field('max_draft'), ngram: field('ngram'), minNgram: field('min_ngram') }
  }
  const n = body.n
  if (n !== undefined && n !== null && n !== 1) throw badRequest('only n = 1 is supported', 'n')
  for (const [k, v] of Object.entries(o)) if (v === undefined) delete (o as Record<string, unknown>)[k]
  return o
}
