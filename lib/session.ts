// `Symbol.dispose` is typed by TypeScript's own `esnext.disposable` library, which the emitted
// .d.ts names (`preserve`), so a project compiles it without @types/node (as with TypeScript
// 7's default `"types": []`).
/// <reference lib="esnext.disposable" preserve="true" />
import type * as N from '../native'
import { checkInt, isAbortSignal, onlyKeys, optionKeys, optionsObject } from './checks'
import { ExpertRuntimeError, disposedError, invalidArgument, toError } from './errors'
import { runtimeHandles } from './handles'
import type {
  ChatMessage,
  CompletionResult,
  FinishReason,
  GenerateInput,
  GenerateOptions,
  ResponseFormat,
  RouteDecision,
  SpeculativeOptions,
  ThinkingOptions,
  TokenChunk,
  Tool,
  ToolCall,
  ToolChoice,
} from './types'

// The keys of the options objects of `generate` / `complete` (checked complete against their
// types). Chat messages and JSON schemas are the caller's data and are not checked.
const GENERATE_KEYS = optionKeys<GenerateOptions>({
  maxTokens: true, temperature: true, topK: true, topP: true, minP: true, repetitionPenalty: true, frequencyPenalty: true,
  presencePenalty: true, seed: true, stop: true, topLogprobs: true, signal: true, thinking: true, enableThinking: true, experts: true,
  parseSpecialTokens: true, responseFormat: true, tools: true, toolChoice: true, parallelToolCalls: true, speculative: true,
})
/** Either kind's keys: which go with which `type` is the engine's to say (as the Python binding does). */
const SPECULATIVE_KEYS = [
  ...new Set([
    ...optionKeys<Extract<SpeculativeOptions, { type: 'ngram' }>>({ type: true, maxDraft: true, ngram: true, minNgram: true }),
    ...optionKeys<Extract<SpeculativeOptions, { type: 'draft' }>>({ type: true, model: true, maxDraft: true }),
  ]),
]
/** Per `responseFormat.type`: a field of another type would be ignored, so it is refused. */
const FORMAT_KEYS: { [T in ResponseFormat['type']]: readonly string[] } = {
  text: optionKeys<Extract<ResponseFormat, { type: 'text' }>>({ type: true }),
  json_object: optionKeys<Extract<ResponseFormat, { type: 'json_object' }>>({ type: true }),
  json_schema: optionKeys<Extract<ResponseFormat, { type: 'json_schema' }>>({ type: true, schema: true, name: true, strict: true }),
  regex: optionKeys<Extract<ResponseFormat, { type: 'regex' }>>({ type: true, pattern: true }),
  grammar: optionKeys<Extract<ResponseFormat, { type: 'grammar' }>>({ type: true, grammar: true }),
}
const THINKING_KEYS = optionKeys<ThinkingOptions>({ budgetTokens: true })
const TOOL_KEYS = optionKeys<Tool>({ type: true, function: true })
const TOOL_FUNCTION_KEYS = optionKeys<Tool['function']>({ name: true, description: true, parameters: true, strict: true })
type NamedToolChoice = Extract<ToolChoice, object>
const TOOL_CHOICE_KEYS = optionKeys<NamedToolChoice>({ type: true, function: true })
const TOOL_CHOICE_FUNCTION_KEYS = optionKeys<NamedToolChoice['function']>({ name: true })

/** @internal */
export function toNativeInput(input: GenerateInput): N.NativeInput {
  if (typeof input === 'string') return { messages: [{ role: 'user', content: input }] }
  if (Array.isArray(input)) return { messages: toNativeMessages(input) }
  if (input && typeof input === 'object') {
    if ('text' in input && typeof input.text === 'string') return { text: input.text }
    if ('tokens' in input && Array.isArray(input.tokens)) {
      // An index loop, not `every`: a sparse array's holes are not token ids either.
      for (let i = 0; i < input.tokens.length; i++) checkInt(`tokens[${i}]`, input.tokens[i], 0)
      return { tokens: input.tokens }
    }
  }
  throw invalidArgument('input must be a string, a ChatMessage[], { text } or { tokens }')
}

export function toNativeMessages(messages: ChatMessage[]): N.JsChatMessage[] {
  for (const m of messages) {
    if (!m || typeof m.role !== 'string' || typeof m.content !== 'string') {
      throw invalidArgument('each ChatMessage needs a string role and content')
    }
  }
  return messages.map(toNativeMessage)
}

function toNativeMessage(m: ChatMessage): N.JsChatMessage {
  const out: N.JsChatMessage = { role: m.role, content: m.content }
  if (m.toolCallId !== undefined) {
    if (typeof m.toolCallId !== 'string') throw invalidArgument('toolCallId must be a string')
    out.toolCallId = m.toolCallId
  }
  if (m.reasoning !== undefined) {
    if (typeof m.reasoning !== 'string') throw invalidArgument('reasoning must be a string')
    out.reasoning = m.reasoning
  }
  if (m.toolCalls !== undefined) {
    if (!Array.isArray(m.toolCalls)) throw invalidArgument('toolCalls must be an array of tool calls')
    out.toolCalls = m.toolCalls.map((c) => {
      const f = c?.function
      if (!c || typeof c.id !== 'string' || !f || typeof f.name !== 'string' || typeof f.arguments !== 'string') {
        throw invalidArgument("each tool call needs a string id and function { name, arguments } (arguments: JSON text)")
      }
      return { id: c.id, type: 'function', function: { name: f.name, arguments: f.arguments } }
    })
  }
  return out
}

/** JSON text of a schema given by the caller (cycles, BigInts and the like are refused). */
function schemaText(what: string, schema: unknown): string {
  if (!(schema === true || schema === false || (schema !== null && typeof schema === 'object' && !Array.isArray(schema)))) {
    throw invalidArgument(`${what} must be a JSON schema object`)
  }
  try {
    return JSON.stringify(schema)
  } catch (e) {
    throw invalidArgument(`${what} cannot be written as JSON: ${(e as Error)?.message ?? e}`)
  }
}

function toNativeFormat(f: unknown): N.NativeResponseFormat {
  if (!f || typeof f !== 'object') throw invalidArgument('responseFormat must be an object with a type')
  const r = f as Record<string, unknown>
  if (typeof r.type !== 'string') throw invalidArgument('responseFormat.type must be a string')
  // An unknown type is the engine's to refuse, naming the types there are.
  if (Object.hasOwn(FORMAT_KEYS, r.type)) onlyKeys(r, FORMAT_KEYS[r.type as ResponseFormat['type']], 'responseFormat', 'field')
  const out: N.NativeResponseFormat = { type: r.type }
  if (r.type === 'json_schema') {
    out.schema = schemaText('responseFormat.schema', r.schema)
    if (r.strict !== undefined) {
      if (typeof r.strict !== 'boolean') throw invalidArgument('responseFormat.strict must be a boolean')
      out.strict = r.strict
    }
  }
  if (r.type === 'regex') {
    if (typeof r.pattern !== 'string') throw invalidArgument('responseFormat.pattern must be a string')
    out.pattern = r.pattern
  }
  if (r.type === 'grammar') {
    if (typeof r.grammar !== 'string') throw invalidArgument('responseFormat.grammar must be a string')
    out.grammar = r.grammar
  }
  return out
}

function toNativeTools(tools: unknown): N.NativeTool[] {
  if (!Array.isArray(tools)) throw invalidArgument('tools must be an array')
  return tools.map((t, i) => {
    const f = t?.function
    if (!t || t.type !== 'function' || !f || typeof f !== 'object' || typeof f.name !== 'string') {
      throw invalidArgument("each tool must be { type: 'function', function: { name, description?, parameters? } }")
    }
    onlyKeys(t, TOOL_KEYS, `tools[${i}]`, 'field')
    onlyKeys(f, TOOL_FUNCTION_KEYS, `tools[${i}].function`, 'field')
    if (f.description !== undefined && typeof f.description !== 'string') throw invalidArgument('a tool description must be a string')
    const out: N.NativeTool = { name: f.name }
    if (f.description !== undefined) out.description = f.description
    if (f.parameters !== undefined) out.parameters = schemaText(`the parameters of tool ${JSON.stringify(f.name)}`, f.parameters)
    if (f.strict !== undefined) {
      if (typeof f.strict !== 'boolean') throw invalidArgument('a tool\'s strict must be a boolean')
      out.strict = f.strict
    }
    return out
  })
}

function toolChoiceFields(c: unknown): Pick<N.NativeGenerateOptions, 'toolChoice' | 'toolChoiceName'> {
  if (c === undefined) return {}
  if (typeof c === 'string') return { toolChoice: c }
  const f = (c as { function?: unknown })?.function
  const name = (f as { name?: unknown } | undefined)?.name
  if (c && typeof c === 'object' && (c as { type?: unknown }).type === 'function' && f && typeof f === 'object' && typeof name === 'string') {
    onlyKeys(c, TOOL_CHOICE_KEYS, 'toolChoice', 'field')
    onlyKeys(f, TOOL_CHOICE_FUNCTION_KEYS, 'toolChoice.function', 'field')
    return { toolChoiceName: name }
  }
  throw invalidArgument("toolChoice must be 'auto', 'none', 'required' or { type: 'function', function: { name } }")
}

/** Checks one option's value; throws INVALID_ARGUMENT naming the option. */
type Check = (name: string, v: unknown) => void
const shaped =
  (test: (v: unknown) => boolean, what: string): Check =>
  (name, v) => {
    if (!test(v)) throw invalidArgument(`${name} must be ${what}`)
  }
/** An integer from `min`, at most `max` (a `u32` by default), in checkInt's one wording. */
const integer =
  (min: 0 | 1, max?: number): Check =>
  (name, v) =>
    void checkInt(name, v, min, max)
const finiteNumber = shaped((v) => typeof v === 'number' && Number.isFinite(v), 'a finite number')
const boolean = shaped((v) => typeof v === 'boolean', 'a boolean')
const text = shaped((v) => typeof v === 'string', 'a string')

/**
 * The type of every option the engine reads, declared once: the mapped type makes a field the
 * native binding gains without an entry here a compile error. Integers are bounded here (a
 * native `u32` would wrap); ranges are checked in the engine (`SamplingParams::validate`).
 */
const OPTION_TYPES: { [K in keyof N.NativeGenerateOptions]-?: Check } = {
  maxTokens: integer(1),
  temperature: finiteNumber,
  topK: integer(0),
  topP: finiteNumber,
  minP: finiteNumber,
  repetitionPenalty: finiteNumber,
  frequencyPenalty: finiteNumber,
  presencePenalty: finiteNumber,
  seed: integer(0, Number.MAX_SAFE_INTEGER),
  stop: shaped((v) => Array.isArray(v) && v.every((s) => typeof s === 'string'), 'an array of strings'),
  topLogprobs: integer(0),
  enableThinking: boolean,
  // Converted by thinkingFields before the checks.
  thinkingBudget: integer(0, 2 ** 31 - 1),
  experts: shaped((v) => Array.isArray(v) && v.every((n) => typeof n === 'string'), "an array of expert names or 'auto'"),
  expertsAuto: boolean,
  parseSpecialTokens: boolean,
  // Converted by toNativeFormat / toNativeTools / toolChoiceFields / toNativeSpeculative before the checks.
  responseFormat: shaped((v) => typeof v === 'object' && v !== null, 'an object'),
  tools: shaped(Array.isArray, 'an array'),
  toolChoice: text,
  toolChoiceName: text,
  parallelToolCalls: boolean,
  speculative: shaped((v) => typeof v === 'object' && v !== null, 'an object'),
}

/**
 * `thinking` and its alias `enableThinking` as the engine takes them: whether to think, and
 * the budget (`{ budgetTokens: 0 }` is no thought).
 */
function thinkingFields(o: GenerateOptions): Pick<N.NativeGenerateOptions, 'enableThinking' | 'thinkingBudget'> {
  const t: unknown = o.thinking
  let on: unknown = o.enableThinking
  let budget: unknown
  if (typeof t === 'boolean') {
    if (on !== undefined && on !== t) throw invalidArgument('thinking and enableThinking disagree; give one of them')
    on = t
  } else if (t !== undefined) {
    if (typeof t !== 'object' || t === null || Array.isArray(t)) throw invalidArgument('thinking must be a boolean or { budgetTokens }')
    onlyKeys(t, THINKING_KEYS, 'thinking', 'field')
    budget = (t as { budgetTokens?: unknown }).budgetTokens
    checkInt('thinking.budgetTokens', budget, 0, 2 ** 31 - 1)
    if (on === false && (budget as number) > 0) throw invalidArgument('thinking.budgetTokens was given with enableThinking: false')
    on = (budget as number) > 0
  }
  return { enableThinking: on as boolean | undefined, thinkingBudget: budget as number | undefined }
}

/** The native handle of `speculative.model` (a draft model's Runtime), when one is given. */
function draftHandle(spec: unknown): N.NativeRuntime | undefined {
  const model = typeof spec === 'object' && spec !== null ? (spec as { model?: unknown }).model : undefined
  if (model === undefined) return undefined
  const h = typeof model === 'object' && model !== null ? runtimeHandles.get(model) : undefined
  if (!h) throw invalidArgument('speculative.model must be a Runtime (from Runtime.load)')
  return h
}

/** `speculative` as the engine takes it: without `model`, which travels beside it (see draftHandle). */
function toNativeSpeculative(v: unknown): Record<string, unknown> {
  if (typeof v !== 'object' || v === null || Array.isArray(v) || typeof (v as { type?: unknown }).type !== 'string') {
    throw invalidArgument("speculative must be { type: 'ngram', maxDraft?, ngram?, minNgram? } or { type: 'draft', model, maxDraft? }")
  }
  onlyKeys(v, SPECULATIVE_KEYS, 'speculative')
  const { model: _model, ...rest } = v as Record<string, unknown>
  for (const k of ['maxDraft', 'ngram', 'minNgram']) if (rest[k] !== undefined) checkInt(`speculative.${k}`, rest[k], 1)
  return rest
}

/** The options for the engine, checked; `what` names the method in messages. */
function toNativeOptions(o: GenerateOptions, what: string): N.NativeGenerateOptions {
  onlyKeys(o, GENERATE_KEYS, what)
  const out: Record<string, unknown> = {}
  const given: Record<string, unknown> = o.experts === 'auto' ? { ...o, experts: undefined, expertsAuto: true } : { ...o, expertsAuto: undefined }
  given.toolChoiceName = undefined
  if (o.responseFormat !== undefined) given.responseFormat = toNativeFormat(o.responseFormat)
  if (o.tools !== undefined) given.tools = toNativeTools(o.tools)
  if (o.speculative !== undefined) given.speculative = toNativeSpeculative(o.speculative)
  delete given.thinking
  Object.assign(given, thinkingFields(o))
  Object.assign(given, { toolChoice: undefined }, toolChoiceFields(o.toolChoice))
  for (const [k, check] of Object.entries(OPTION_TYPES) as [keyof N.NativeGenerateOptions, Check][]) {
    const v = given[k]
    if (v === undefined) continue
    check(k, v)
    out[k] = v
  }
  return out as N.NativeGenerateOptions
}

/** @internal */
export function toDecision(d: N.JsRouteDecision): RouteDecision {
  return { ...d, genericSimilarity: d.genericSimilarity ?? null, scores: d.scores.map((s) => ({ ...s, similarity: s.similarity ?? null })) }
}

/** @internal */
export function checkNames(names: unknown): asserts names is string[] {
  if (!(Array.isArray(names) && names.every((n) => typeof n === 'string'))) throw invalidArgument('experts must be an array of expert names')
}

/** What a stream shares with its finalizer: the native stream and how many chunks were delivered. */
interface StreamState {
  native: N.TokenStream
  delivered: number
}

/** Reads a native stream to its end (after cancelling it: until the engine has stopped it). */
async function drain(native: N.TokenStream): Promise<void> {
  const it = native[Symbol.asyncIterator]()
  try {
    while (!(await it.next()).done) {
      /* discard */
    }
  } catch {
    /* the error, if any, was already surfaced or is moot after cancellation */
  }
}

// A stream abandoned mid-way (never iterated to the end, never cancelled) and collected would
// otherwise run to `maxTokens` unseen and leave its answer in the history: cancel it then, and
// read it to its end so the history keeps only what was delivered.
const abandoned = new FinalizationRegistry<StreamState>((state) => {
  state.native.cancel(state.delivered)
  void drain(state.native)
})

/**
 * One request's tokens as an async iterable. Iterate it once. Leaving the loop early
 * (`break`, `return`, a thrown error) or aborting the signal cancels the request; the loop
 * exit resolves once the engine has stopped it, so the session is immediately reusable.
 * A cancelled request's `result`, `usage` and the session's history hold exactly the chunks
 * this iterator delivered. A stream dropped without being finished is cancelled when it is
 * garbage-collected.
 */
export class GenerationStream implements AsyncIterable<TokenChunk> {
  #state?: StreamState
  #error?: ExpertRuntimeError
  #signal?: AbortSignal
  #started = false
  #cancelled = false
  // Keeps the session reachable while the stream is: a session that is garbage-collected
  // mid-request (`rt.createSession().generate(...)`) is disposed natively, which cancels it.
  readonly #session: Session

  /** @internal */
  constructor(native: N.TokenStream | undefined, error: ExpertRuntimeError | undefined, signal: AbortSignal | undefined, session: Session) {
    if (native) {
      this.#state = { native, delivered: 0 }
      abandoned.register(this, this.#state, this)
    }
    this.#error = error
    this.#signal = signal
    this.#session = session
  }

  /** Cancels the request (same as aborting its signal). */
  cancel(): void {
    this.#cancelled = true
    this.#state?.native.cancel(this.#state.delivered)
  }

  /** The summary, once the stream has ended (undefined before, or after an error). */
  get result(): CompletionResult | undefined {
    const s = this.#state?.native.summary()
    if (!s) return undefined
    const { routing, toolCalls, reasoning, ...rest } = s
    return {
      ...rest,
      ...(reasoning != null ? { reasoning } : {}),
      finishReason: s.finishReason as FinishReason,
      ...(routing ? { routing: toDecision(routing) } : {}),
      ...(toolCalls ? { toolCalls: toolCalls as ToolCall[] } : {}),
    }
  }

  /** The chunks, one per generated token (`for await (const chunk of stream)`). Iterable once. */
  [Symbol.asyncIterator](): AsyncIterator<TokenChunk> {
    if (this.#started) throw invalidArgument('a generation stream can be iterated only once')
    this.#started = true
    const gen = this.#iterate()
    let running = false
    // An async generator closed before its first `next()` never runs its body (nor its
    // `finally`), so `return()` then would leave the request running: stop it here instead.
    return {
      next: (...args: [] | [undefined]) => {
        running = true
        return gen.next(...args)
      },
      return: async (value?: unknown) => {
        if (!running) await this.#stopNative()
        return gen.return(value as undefined)
      },
      throw: async (e?: unknown) => {
        if (!running) await this.#stopNative()
        return gen.throw(e)
      },
      [Symbol.asyncIterator]() {
        return this
      },
    } as AsyncIterableIterator<TokenChunk>
  }

  /** Cancels the request and waits until the engine has ended it (the session is free). */
  async #stopNative(): Promise<void> {
    const state = this.#state
    if (!state) return
    this.cancel()
    abandoned.unregister(this)
    await drain(state.native)
  }

  async *#iterate(): AsyncGenerator<TokenChunk, void, undefined> {
    if (this.#error) throw this.#error
    const state = this.#state!
    const it = state.native[Symbol.asyncIterator]()
    const signal = this.#signal
    const onAbort = () => this.cancel()
    if (signal?.aborted) this.cancel()
    signal?.addEventListener('abort', onAbort, { once: true })
    try {
      for (;;) {
        let r: IteratorResult<N.JsTokenChunk>
        try {
          r = await it.next()
        } catch (e) {
          throw toError(e)
        }
        // Once cancelled, chunks the engine produced before it saw the flag are dropped:
        // nothing is yielded after `abort()` / `cancel()` returns.
        if (r.done || this.#cancelled) return
        state.delivered++
        yield r.value as TokenChunk
      }
    } finally {
      signal?.removeEventListener('abort', onAbort)
      abandoned.unregister(this)
      state.native.cancel(state.delivered)
      // Drain to the end so the engine has released the session when we return.
      await drain(state.native)
    }
  }
}

/** A conversation with its own KV cache. Create with `runtime.createSession()`. */
export class Session {
  #native: N.NativeSession
  #disposed = false

  /** @internal */
  constructor(native: N.NativeSession) {
    this.#native = native
  }

  #check(): void {
    if (this.#disposed) throw disposedError('session')
  }

  /**
   * Streams one answer. A string or ChatMessage[] goes through the model's chat template and
   * into `history`; `{ text }` and `{ tokens }` continue the session's token stream raw. Earlier
   * turns' KV cache is reused (`usage.cachedTokens`). A second concurrent call on the same
   * session fails with `SESSION_BUSY` (on the first iteration).
   */
  generate(input: GenerateInput, options?: GenerateOptions): GenerationStream {
    return this.#generate(input, options, 'generate')
  }

  /** `generate`, with `what` (the public method) naming the options in messages. */
  #generate(input: GenerateInput, options: GenerateOptions | undefined, what: string): GenerationStream {
    let native: N.TokenStream | undefined
    let error: ExpertRuntimeError | undefined
    let signal: AbortSignal | undefined
    try {
      this.#check()
      const o = optionsObject(options)
      if (o.signal !== undefined && !isAbortSignal(o.signal)) throw invalidArgument('signal must be an AbortSignal')
      signal = o.signal
      native = this.#native.generate(toNativeInput(input), toNativeOptions(o, what), draftHandle(o.speculative))
    } catch (e) {
      error = toError(e)
    }
    return new GenerationStream(native, error, signal, this)
  }

  /** Runs `generate` to the end and returns the whole answer. An aborted signal resolves with `finishReason: 'cancelled'`. */
  async complete(input: GenerateInput, options?: GenerateOptions): Promise<CompletionResult> {
    const stream = this.#generate(input, options, 'complete')
    for await (const _ of stream) {
      /* the summary carries the text */
    }
    const r = stream.result
    if (!r) throw new ExpertRuntimeError('INTERNAL', 'the stream ended without a summary')
    return r
  }

  /** The chat so far (system prompt first, if any). */
  get history(): ChatMessage[] {
    this.#check()
    return this.#native.history.map(({ toolCalls, toolCallId, reasoning, ...m }) => ({
      ...m,
      ...(reasoning != null ? { reasoning } : {}),
      ...(toolCalls ? { toolCalls: toolCalls as ToolCall[] } : {}),
      ...(toolCallId != null ? { toolCallId } : {}),
    }))
  }

  /** The session's default experts (names), or `'auto'` when each request is routed. */
  get experts(): string[] | 'auto' {
    this.#check()
    return this.#native.expertsAuto ? 'auto' : this.#native.experts
  }

  /**
   * Replaces the session's default experts (`'auto'`: route each request). Fails with
   * `SESSION_BUSY` while the session is generating and `EXPERT_NOT_FOUND` for a name not
   * loaded. The next turn re-evaluates the conversation under the new set (its
   * `usage.cachedTokens` is 0).
   */
  setExperts(names: string[] | 'auto'): void {
    this.#check()
    if (names !== 'auto') checkNames(names)
    try {
      this.#native.setExperts(names === 'auto' ? [] : names, names === 'auto')
    } catch (e) {
      throw toError(e)
    }
  }

  /**
   * Replaces the conversation with `messages` without generating: restores a saved chat
   * (`session.history` from an earlier session, say). Include the system message if there
   * should be one; `reset()` still goes back to the `system` the session was created with.
   * The next turn evaluates the restored conversation once, reusing whatever of it the prefix
   * cache holds. Fails with `SESSION_BUSY` while the session is generating.
   */
  setHistory(messages: ChatMessage[]): void {
    this.#check()
    if (!Array.isArray(messages)) throw invalidArgument('messages must be a ChatMessage[]')
    const native = toNativeMessages(messages)
    try {
      this.#native.setHistory(native)
    } catch (e) {
      throw toError(e)
    }
  }

  /**
   * Writes the session to `path`: its history, the cache of its conversation (in the pool's
   * own format) and any recurrent state, with the model's fingerprint, checksummed and
   * atomically (a crash mid-save leaves the old file or the new one). `rt.restoreSession(path)`
   * brings it back, in this process or a later one, with no prefill. Off the JS thread.
   * A cache computed under experts is saved with each expert's name and fingerprint (a
   * SHA-256 over its files and scale, read the first time). Errors: `SESSION_BUSY` while
   * generating, `INVALID_ARGUMENT` (the file cannot be written, a cache computed under an
   * expert since unloaded, a model with sliding-window layers).
   */
  async save(path: string): Promise<void> {
    this.#check()
    if (typeof path !== 'string' || path.length === 0) throw invalidArgument('path must be a non-empty string')
    try {
      await this.#native.save(path)
    } catch (e) {
      throw toError(e)
    }
  }

  /** Forgets the conversation (keeps the system prompt) and its cache. */
  reset(): void {
    this.#check()
    try {
      this.#native.reset()
    } catch (e) {
      throw toError(e)
    }
  }

  /** Frees the session's cache. Later calls fail with `DISPOSED`. Idempotent. */
  dispose(): void {
    if (this.#disposed) return
    this.#disposed = true
    this.#native.dispose()
  }

  /** `using s = rt.createSession()`: `dispose()` at the end of the scope. */
  [Symbol.dispose](): void {
    this.dispose()
  }
}
