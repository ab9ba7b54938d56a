import type { GenerateOptions } from '../types'
import { badRequest } from './errors'

/**
 * The thought budget (tokens) of each `reasoning_effort`: `none` is no thought, `high` no
 * limit. Documented in README › Server › Thinking models.
 */
export const EFFORT_BUDGETS: Readonly<Record<string, number | null>> = { none: 0, minimal: 128, low: 512, medium: 2048, high: null }

/**
 * A chat request's thinking options: `chat_template_kwargs.enable_thinking` (vLLM's and
 * llama.cpp's switch; the only template argument the server forwards, any other is refused),
 * `reasoning_effort` (OpenAI's, mapped to [`EFFORT_BUDGETS`]) and `thinking_budget` (an
 * extension: the budget in tokens). Contradicting settings are a 400.
 */
export function thinkingOptions(body: Record<string, unknown>): Pick<GenerateOptions, 'thinking'> {
  let on: boolean | undefined
  const kw = body.chat_template_kwargs
  if (kw !== undefined && kw !== null) {
    if (typeof kw !== 'object' || Array.isArray(kw)) throw badRequest('chat_template_kwargs must be an object', 'chat_template_kwargs')
    for (const [k, v] of Object.entries(kw)) {
      if (k !== 'enable_thinking') throw badRequest(`chat_template_kwargs.${k} is not supported (only enable_thinking is)`, 'chat_template_kwargs')
      if (v !== null && typeof v !== 'boolean') throw badRequest('chat_template_kwargs.enable_thinking must be a boolean', 'chat_template_kwargs')
      if (typeof v === 'boolean') on = v
    }
  }
  let budget: number | null | undefined
  const effort = body.reasoning_effort
  if (effort !== undefined && effort !== null) {
    if (typeof effort !== 'string' || !Object.hasOwn(EFFORT_BUDGETS, effort)) {
      throw badRequest(`reasoning_effort must be one of ${Object.keys(EFFORT_BUDGETS).join(', ')}`, 'reasoning_effort')
    }
    budget = EFFORT_BUDGETS[effort]
  }
  const tb = body.thinking_budget
  if (tb !== undefined && tb !== null) {
    if (!Number.isInteger(tb) || (tb as number) < 0 || (tb as number) > 2 ** 31 - 1) {
      throw badRequest('thinking_budget must be an integer from 0 to 2147483647', 'thinking_budget')
    }
    if (budget !== undefined) throw badRequest('give reasoning_effort or thinking_budget, not both', 'thinking_budget')
    budget = tb as number
  }
  if (budget === undefined) return on === undefined ? {} : { thinking: on }
  if (on === false && budget !== 0) throw badRequest('enable_thinking is false but a thinking budget was asked for', 'chat_template_kwargs')
  return { thinking: budget === null ? true : { budgetTokens: budget } }
}

/** An assistant message's thought as clients send it back (`reasoning_content`, or `reasoning`). */
export function messageReasoning(m: { reasoning_content?: unknown; reasoning?: unknown }, i: number): string | undefined {
  for (const k of ['reasoning_content', 'reasoning'] as const) {
    const v = m[k]
    if (v === undefined || v === null) continue
    if (typeof v !== 'string') throw badRequest(`messages[${i}].${k} must be a string`, `messages[${i}].${k}`)
    return v
  }
  return undefined
}
