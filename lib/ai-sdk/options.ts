// The AI SDK's call options (LanguageModelV3CallOptions) and `providerOptions['expert-runtime']`
// as one request's GenerateOptions, with a warning for each setting that has no effect.

import type { LanguageModelV3CallOptions, LanguageModelV3FunctionTool, SharedV3Warning } from '@ai-sdk/provider'
import { checkInt, onlyKeys, optionKeys, optionsObject } from '../checks'
import { invalidArgument } from '../errors'
import { EFFORT_BUDGETS } from '../server/reasoning'
import type { GenerateOptions, SpeculativeOptions, ThinkingOptions, Tool, ToolChoice } from '../types'
import type { Selection } from './model-id'

/** The key of this provider's options in the AI SDK's `providerOptions`. */
export const PROVIDER_OPTIONS_KEY = 'expert-runtime'

/**
 * `providerOptions['expert-runtime']` of a `generateText` / `streamText` / `generateObject` /
 * `streamObject` call: what the AI SDK's standard settings do not cover. Each wins over the
 * standard setting of the same name.
 */
export interface ExpertRuntimeLanguageModelOptions {
  /** The experts of this call (names, in order), or `'auto'` (the router picks), instead of the model id's. */
  experts?: string[] | 'auto'
  /** Sample from the K most likely tokens; 0 disables. */
  topK?: number
  /** Drop tokens less likely than `minP` times the most likely one; 0 disables. */
  minP?: number
  /** Seeds the sampler (a non-negative integer): same seed and prompt, same answer. */
  seed?: number
  /** HF repetition penalty over prompt and answer; 1 disables. */
  repetitionPenalty?: number
  /** Allow several tool calls in one answer where the template family does (default true). */
  parallelToolCalls?: boolean
  /** Speculative decoding by prompt lookup (`{ type: 'ngram' }`): the same answer, faster when it repeats its input. */
  speculative?: Extract<SpeculativeOptions, { type: 'ngram' }>
  /**
   * Whether a thinking model (Qwen3, SmolLM3, …) thinks first: `false` answers at once, `true`
   * thinks as long as it wants, `{ budgetTokens }` closes the thought after that many tokens.
   * The thought streams as reasoning parts.
   */
  thinking?: boolean | ThinkingOptions
}

/** The embedding model's `providerOptions['expert-runtime']`. */
export interface ExpertRuntimeEmbeddingModelOptions {
  /** The experts of this call (names, in order), instead of the model id's. */
  experts?: string[]
  /** `mean` (default) over the text's tokens, or the `last` token's state. */
  pooling?: 'mean' | 'last'
  /** Scale each vector to unit length. Default true. */
  normalize?: boolean
}

const WHAT = `providerOptions['${PROVIDER_OPTIONS_KEY}']`
const LANGUAGE_KEYS = optionKeys<ExpertRuntimeLanguageModelOptions>({
  experts: true, topK: true, minP: true, seed: true, repetitionPenalty: true, parallelToolCalls: true, speculative: true, thinking: true,
})
const EMBEDDING_KEYS = optionKeys<ExpertRuntimeEmbeddingModelOptions>({ experts: true, pooling: true, normalize: true })
const NGRAM_KEYS = optionKeys<Extract<SpeculativeOptions, { type: 'ngram' }>>({ type: true, maxDraft: true, ngram: true, minNgram: true })
const THINKING_KEYS = optionKeys<ThinkingOptions>({ budgetTokens: true })

/** This provider's entry of `providerOptions`, its keys checked (`INVALID_ARGUMENT` naming an unknown one). */
function ownOptions<T extends object>(providerOptions: Record<string, unknown> | undefined, keys: readonly string[]): T {
  const o = optionsObject(providerOptions?.[PROVIDER_OPTIONS_KEY] as T | undefined, WHAT)
  onlyKeys(o, keys, WHAT)
  return o
}

function checkExperts(v: unknown, auto: boolean): asserts v is string[] | 'auto' {
  if (auto && v === 'auto') return
  if (!(Array.isArray(v) && v.every((n) => typeof n === 'string'))) {
    throw invalidArgument(`${WHAT}.experts must be an array of expert names${auto ? " or 'auto'" : ''}`)
  }
}

/** The options of the embedding model's call: the experts (`selection` unless overridden), pooling, normalize. */
export function embedOptions(providerOptions: Record<string, unknown> | undefined, selection: string[]) {
  const o = ownOptions<ExpertRuntimeEmbeddingModelOptions>(providerOptions, EMBEDDING_KEYS)
  if (o.experts !== undefined) checkExperts(o.experts, false)
  // pooling and normalize are checked by Runtime.embed.
  return { ...o, experts: o.experts ?? selection }
}

/** One request: the options for `Session.generate` and the warnings of the call. */
export interface PreparedCall {
  options: GenerateOptions
  warnings: SharedV3Warning[]
}

/**
 * The options of one request. Standard settings map one to one (`maxOutputTokens` →
 * `maxTokens`, `stopSequences` → `stop`, `abortSignal` → `signal`, `responseFormat` JSON →
 * `json_schema` / `json_object`, function tools and `toolChoice` → OpenAI-shaped `tools` /
 * `toolChoice`); `headers` are for HTTP providers and not read. Values are checked by the
 * engine, which refuses a bad one with `INVALID_ARGUMENT`.
 */
export function prepareCall(call: LanguageModelV3CallOptions, selection: Selection): PreparedCall {
  const warnings: SharedV3Warning[] = []
  const own = ownOptions<ExpertRuntimeLanguageModelOptions>(call.providerOptions, LANGUAGE_KEYS)
  const o: GenerateOptions = { experts: selection }
  if (call.maxOutputTokens !== undefined) o.maxTokens = call.maxOutputTokens
  if (call.temperature !== undefined) o.temperature = call.temperature
  if (call.topP !== undefined) o.topP = call.topP
  if (call.topK !== undefined) o.topK = call.topK
  if (call.presencePenalty !== undefined) o.presencePenalty = call.presencePenalty
  if (call.frequencyPenalty !== undefined) o.frequencyPenalty = call.frequencyPenalty
  if (call.stopSequences !== undefined && call.stopSequences.length > 0) o.stop = call.stopSequences
  // The engine's seed is unsigned (as the OpenAI server does, a negative seed is folded into its range).
  if (call.seed !== undefined) o.seed = Number.isSafeInteger(call.seed) && call.seed < 0 ? 2 ** 53 + call.seed : call.seed
  if (call.abortSignal !== undefined) o.signal = call.abortSignal
  const format = call.responseFormat
  if (format?.type === 'json') {
    o.responseFormat = format.schema === undefined ? { type: 'json_object' } : { type: 'json_schema', schema: format.schema as Record<string, unknown> }
    if (format.name !== undefined || format.description !== undefined) {
      warnings.push({
        type: 'unsupported',
        feature: 'responseFormat.name / responseFormat.description',
        details: 'the answer is constrained to the JSON schema; its name and description are not shown to the model',
      })
    }
  }
  const tools = toolsOf(call, warnings)
  if (tools.length > 0) {
    o.tools = tools
    if (call.toolChoice !== undefined) o.toolChoice = toolChoiceOf(call.toolChoice)
  }
  applyOwn(o, own, call, warnings)
  return { options: o, warnings }
}

/** Function tools in OpenAI's shape; a provider-defined tool is left out with a warning. */
function toolsOf(call: LanguageModelV3CallOptions, warnings: SharedV3Warning[]): Tool[] {
  const tools: Tool[] = []
  for (const tool of call.tools ?? []) {
    if (tool.type !== 'function') {
      warnings.push({ type: 'unsupported', feature: `provider-defined tool ${tool.id}`, details: 'expert-runtime has no provider-defined tools; it was not offered to the model' })
      continue
    }
    tools.push(functionTool(tool))
    if (tool.inputExamples?.length) {
      warnings.push({
        type: 'unsupported',
        feature: 'tool inputExamples',
        details: `the input examples of tool '${tool.name}' are not shown to the model (the AI SDK's addToolInputExamplesMiddleware puts them in the description)`,
      })
    }
  }
  return tools
}

function functionTool(tool: LanguageModelV3FunctionTool): Tool {
  const fn: Tool['function'] = { name: tool.name, parameters: tool.inputSchema as Record<string, unknown> }
  if (tool.description !== undefined) fn.description = tool.description
  if (tool.strict !== undefined) fn.strict = tool.strict
  return { type: 'function', function: fn }
}

function toolChoiceOf(choice: NonNullable<LanguageModelV3CallOptions['toolChoice']>): ToolChoice {
  return choice.type === 'tool' ? { type: 'function', function: { name: choice.toolName } } : choice.type
}

/**
 * `providerOptions['expert-runtime']` over the standard settings. With the AI SDK 7, which calls
 * v3 models through a v4 adapter that passes its call options on, its `reasoning` setting
 * applies when `thinking` is not given, with the OpenAI server's `reasoning_effort` budgets.
 */
function applyOwn(o: GenerateOptions, own: ExpertRuntimeLanguageModelOptions, call: LanguageModelV3CallOptions, warnings: SharedV3Warning[]): void {
  if (own.experts !== undefined) {
    checkExperts(own.experts, true)
    o.experts = own.experts
  }
  if (own.topK !== undefined) o.topK = own.topK
  if (own.minP !== undefined) o.minP = own.minP
  if (own.seed !== undefined) o.seed = own.seed
  if (own.repetitionPenalty !== undefined) o.repetitionPenalty = own.repetitionPenalty
  if (own.parallelToolCalls !== undefined) o.parallelToolCalls = own.parallelToolCalls
  if (own.speculative !== undefined) o.speculative = ngramOnly(own.speculative)
  if (own.thinking === undefined) {
    const thinking = reasoningSetting((call as { reasoning?: unknown }).reasoning, warnings)
    if (thinking !== undefined) o.thinking = thinking
    return
  }
  if (typeof own.thinking === 'boolean') {
    o.thinking = own.thinking
    return
  }
  const t = optionsObject(own.thinking, `${WHAT}.thinking`)
  onlyKeys(t, THINKING_KEYS, `${WHAT}.thinking`)
  checkInt(`${WHAT}.thinking.budgetTokens`, t.budgetTokens, 0, 2 ** 31 - 1)
  o.thinking = { budgetTokens: t.budgetTokens }
}

/**
 * The AI SDK 7's `reasoning` call setting as `thinking`: `'none'` is no thought, `'minimal'`,
 * `'low'` and `'medium'` are the server's `reasoning_effort` budgets (128, 512, 2048 tokens),
 * `'high'`, `'xhigh'` and `'max'` no limit; `'provider-default'` leaves the template's default.
 */
function reasoningSetting(reasoning: unknown, warnings: SharedV3Warning[]): GenerateOptions['thinking'] {
  if (reasoning === undefined || reasoning === 'provider-default') return undefined
  if (reasoning === 'xhigh' || reasoning === 'max') return true
  if (typeof reasoning === 'string' && Object.hasOwn(EFFORT_BUDGETS, reasoning)) {
    const budget = EFFORT_BUDGETS[reasoning]
    return budget === null ? true : budget === 0 ? false : { budgetTokens: budget }
  }
  warnings.push({ type: 'unsupported', feature: `reasoning ${JSON.stringify(reasoning)}`, details: 'not a reasoning level this provider knows; the template default applies' })
  return undefined
}

/** `speculative` as JSON carries it: prompt lookup only (a draft model is a Runtime object, which JSON cannot hold). */
function ngramOnly(v: unknown): Extract<SpeculativeOptions, { type: 'ngram' }> {
  const s = optionsObject(v as Record<string, unknown>, `${WHAT}.speculative`)
  if (s.type !== 'ngram') throw invalidArgument(`${WHAT}.speculative must be { type: 'ngram', maxDraft?, ngram?, minNgram? }`)
  onlyKeys(s, NGRAM_KEYS, `${WHAT}.speculative`)
  return s as Extract<SpeculativeOptions, { type: 'ngram' }>
}
