// `Symbol.asyncDispose` is typed by TypeScript's own `esnext.disposable` library, which the
// emitted .d.ts names (`preserve`), so a project compiles it without @types/node (as with
// TypeScript 7's default `"types": []`).
/// <reference lib="esnext.disposable" preserve="true" />
import { bindingFor, type Variant } from './binding'
import type * as N from '../native'
import { checkInt, onlyKeys, optionKeys, optionsObject } from './checks'
import { LOAD_KEYS, nativeLoadOptions, type EngineLoadOptions } from './load-options'
import { disposedError, invalidArgument, toError } from './errors'
import { Expert } from './expert'
import { runtimeHandles } from './handles'
import { fetchModel, parseHfRef } from './hub'
import { checkHubOptions } from './hub/settings'
import { Session, checkNames, toDecision, toNativeInput, toNativeMessages } from './session'
import type {
  ChatMessage,
  EmbedOptions,
  HubOptions,
  KvCacheOptions,
  LoadExpertOptions,
  KvCacheDtype,
  LoadEstimate,
  LoadOptions,
  RouteDecision,
  RouteOptions,
  RopeScaling,
  RopeScalingInfo,
  RouterSettings,
  RuntimeInfo,
  KvEvent,
  RuntimeStats,
  SessionOptions,
} from './types'

// The keys each options object of the API takes (checked complete against its type): any other
// key is refused with INVALID_ARGUMENT naming the nearest of them.
const ESTIMATE_KEYS = LOAD_KEYS.filter((k) => k !== 'onProgress' && k !== 'hub' && k !== 'onDownloadProgress')
const TOKENIZE_KEYS = optionKeys<NonNullable<Parameters<Runtime['tokenize']>[1]>>({ addSpecialTokens: true, parseSpecialTokens: true })
const SESSION_KEYS = optionKeys<SessionOptions>({ system: true, experts: true, contextShift: true })
const LOAD_EXPERT_KEYS = optionKeys<LoadExpertOptions>({ name: true, hub: true, onDownloadProgress: true, scale: true, mmap: true })
const EMBED_KEYS = optionKeys<EmbedOptions>({ pooling: true, normalize: true, experts: true })
const ROUTE_KEYS = optionKeys<RouteOptions>({ historyTurns: true })
const ROUTER_KEYS = optionKeys<RouterSettings>({
  threshold: true, maxExperts: true, genericPatterns: true, weights: true, historyTurns: true, genericMinKeywordHits: true,
})
const ROUTER_WEIGHT_KEYS = optionKeys<RouterSettings['weights']>({ keywords: true, similarity: true })
/** A loaded base model. Everything heavy runs on its own engine thread. */
export class Runtime {
  #native: N.NativeRuntime
  #info: RuntimeInfo
  #disposed = false
  /** The `hub` options the runtime was loaded with: `loadExpert('hf:…')`'s default. */
  #hub: HubOptions | undefined

  private constructor(n: N.NativeRuntime, binary: Variant, hub: HubOptions | undefined) {
    this.#native = n
    this.#hub = hub
    runtimeHandles.set(this, n)
    const i = n.info
    this.#info = {
      ...i,
      dtype: i.dtype as RuntimeInfo['dtype'],
      device: i.device as RuntimeInfo['device'],
      deviceMemoryTotal: i.deviceMemoryTotal ?? null,
      binary,
      kvCacheDtype: i.kvCacheDtype as RuntimeInfo['kvCacheDtype'],
      ropeScaling: i.ropeScaling ? (JSON.parse(i.ropeScaling) as RopeScalingInfo) : null,
    }
  }

  /**
   * Loads an HF model directory (config.json + safetensors + tokenizer) or a GGUF file. A path
   * `hf:org/repo[@revision][/file.gguf]` is fetched from the Hugging Face Hub into the cache
   * first (`hub`, `onDownloadProgress`; docs/models.md).
   */
  static async load(path: string, options?: LoadOptions): Promise<Runtime> {
    if (typeof path !== 'string' || path.length === 0) throw invalidArgument('path must be a non-empty string')
    const o = optionsObject(options)
    onlyKeys(o, LOAD_KEYS, 'Runtime.load')
    const { onProgress, onDownloadProgress, hub, ...rest } = o
    // Checked whatever the path: a misspelt hub option is refused before a local load too.
    if (hub !== undefined) checkHubOptions(hub)
    if (onProgress !== undefined && typeof onProgress !== 'function') throw invalidArgument('onProgress must be a function')
    const { device, native } = nativeLoadOptions(rest)
    const { binding, variant } = bindingFor(device)
    const modelPath = path.startsWith('hf:') ? await fetchModel(path.slice(3), hub, onDownloadProgress) : path
    // A throwing onProgress must not reach the native callback (an exception there would end
    // the process): the first one is kept and the load rejects with it once the engine is freed.
    let progressError: { error: unknown } | undefined
    const progress = onProgress
      ? (p: N.LoadProgress) => {
          if (progressError) return
          try {
            onProgress({ loadedBytes: p.loadedBytes, totalBytes: p.totalBytes })
          } catch (error) {
            progressError = { error }
          }
        }
      : undefined
    let n: N.NativeRuntime
    try {
      n = await binding.loadRuntime(
        modelPath,
        native,
        progress,
      )
    } catch (e) {
      throw toError(e)
    }
    if (progressError) {
      await n.dispose()
      throw progressError.error
    }
    return new Runtime(n, variant, hub)
  }

  /**
   * What `Runtime.load(path, options)` would take, read from the model's headers: no weight is
   * loaded. The weights by format, KV bytes per position in each `kvCache.dtype`, recurrent
   * state, RoPE tables and scratch; the budget (`memoryLimit`, default: what the device has
   * free less a margin) and the longest context that fits it. The options are `load`'s and
   * are checked as a load checks them; a load that would not fit the budget is described
   * (`doesNotFit`: what the load's `OUT_OF_MEMORY` would say), not refused. Runs off the JS
   * thread. `expert-runtime inspect <model> --fit`
   * prints the same numbers.
   */
  static async estimate(path: string, options?: EngineLoadOptions): Promise<LoadEstimate> {
    if (typeof path !== 'string' || path.length === 0) throw invalidArgument('path must be a non-empty string')
    if (path.startsWith('hf:')) throw invalidArgument('Runtime.estimate reads local files: fetch the model first (expert-runtime pull)')
    const o = optionsObject(options)
    onlyKeys(o, ESTIMATE_KEYS, 'Runtime.estimate')
    const { device, native } = nativeLoadOptions(o)
    const { binding } = bindingFor(device)
    let e: N.JsEstimate
    try {
      e = await binding.estimateModel(path, native)
    } catch (err) {
      throw toError(err)
    }
    const byFormat = (l: N.JsFormatBytes[]) => l.map((f) => ({ format: f.format, bytes: f.bytes }))
    return {
      weights: { bytes: e.weightBytes, mappedBytes: e.weightMappedBytes, formats: byFormat(e.weightFormats) },
      kv: {
        dtype: e.kvDtype as KvCacheDtype,
        bytesPerToken: Object.fromEntries(e.kvBytesPerToken.map((f) => [f.format, f.bytes])) as LoadEstimate['kv']['bytesPerToken'],
        blockSize: e.kvBlockSize,
        bytes: e.kvBytes,
      },
      state: { bytesPerSequence: e.stateBytesPerSequence, slots: e.stateSlots, bytes: e.stateBytes },
      ropeBytes: e.ropeBytes,
      scratchBytes: e.scratchBytes,
      tokenizerBytes: e.tokenizerBytes,
      memoryLimit: e.memoryLimit,
      memoryLimitIsDefault: e.memoryLimitIsDefault,
      modelContextLength: e.modelContextLength,
      fitContextLength: e.fitContextLength,
      contextLength: e.contextLength,
      totalBytes: e.totalBytes,
      doesNotFit: e.doesNotFit ?? null,
    }
  }

  /** What was loaded and how it runs (a fresh copy each time). */
  get info(): RuntimeInfo {
    const i = this.#info
    const ropeScaling = i.ropeScaling && (JSON.parse(JSON.stringify(i.ropeScaling)) as RopeScalingInfo)
    return { ...i, eosTokenIds: [...i.eosTokenIds], warnings: [...i.warnings], ropeScaling }
  }

  #check(): void {
    if (this.#disposed) throw disposedError('runtime')
  }

  /**
   * Token ids of `text`. `addSpecialTokens` (default true) adds what the tokenizer puts around
   * a sequence (BOS for most models). `parseSpecialTokens` (default false) reads special-token
   * spellings such as `<|im_end|>` as those control tokens; otherwise they are plain text, as
   * untrusted input should be.
   */
  tokenize(text: string, options?: { addSpecialTokens?: boolean; parseSpecialTokens?: boolean }): number[] {
    this.#check()
    if (typeof text !== 'string') throw invalidArgument('text must be a string')
    const o = optionsObject(options)
    onlyKeys(o, TOKENIZE_KEYS, 'tokenize')
    const { addSpecialTokens, parseSpecialTokens } = o
    if (addSpecialTokens !== undefined && typeof addSpecialTokens !== 'boolean') throw invalidArgument('addSpecialTokens must be a boolean')
    if (parseSpecialTokens !== undefined && typeof parseSpecialTokens !== 'boolean') throw invalidArgument('parseSpecialTokens must be a boolean')
    try {
      return this.#native.tokenize(text, addSpecialTokens, parseSpecialTokens)
    } catch (e) {
      throw toError(e)
    }
  }

  /**
   * Token ids of a conversation as a request would evaluate them: rendered with the model's
   * chat template (`addGenerationPrompt`, default true: the assistant's turn opened after
   * it), the template's markup as control tokens and the messages' text as plain text. Off
   * the JS thread. Errors: `INVALID_ARGUMENT` (malformed messages, or beyond the limits of a
   * request's input), `CONTEXT_OVERFLOW`.
   */
  async tokenizeChat(messages: ChatMessage[], options?: { addGenerationPrompt?: boolean }): Promise<number[]> {
    this.#check()
    if (!Array.isArray(messages)) throw invalidArgument('messages must be an array of ChatMessage')
    const o = optionsObject(options)
    onlyKeys(o, ['addGenerationPrompt'], 'tokenizeChat')
    if (o.addGenerationPrompt !== undefined && typeof o.addGenerationPrompt !== 'boolean') throw invalidArgument('addGenerationPrompt must be a boolean')
    try {
      return await this.#native.tokenizeChat(toNativeMessages(messages), o.addGenerationPrompt ?? true)
    } catch (e) {
      throw toError(e)
    }
  }

  /**
   * Starts recording KV events: each block the prefix cache stores (full, shareable) or
   * removes, as vLLM publishes them for prefix-aware routers. Take them with `takeKvEvents`;
   * at most 65,536 wait, beyond which new ones are dropped (`stats().kvEventsDropped`), so a
   * publisher that falls behind never slows generation. The server's `kvEvents` option
   * publishes them over ZeroMQ.
   */
  startKvEvents(): void {
    this.#check()
    try {
      this.#native.startKvEvents()
    } catch (e) {
      throw toError(e)
    }
  }

  /** Up to `max` (default 4096) recorded KV events, oldest first (see `startKvEvents`). */
  takeKvEvents(max = 4096): KvEvent[] {
    this.#check()
    checkInt('max', max, 1, 1 << 20)
    try {
      return this.#native.takeKvEvents(max).map((e) =>
        e.kind === 'stored'
          ? { type: 'BlockStored', blockHash: e.blockHash, parentBlockHash: e.parentBlockHash ?? null, tokenIds: e.tokenIds, blockSize: e.blockSize, loraId: e.loraId ?? null }
          : { type: 'BlockRemoved', blockHash: e.blockHash },
      )
    } catch (e) {
      throw toError(e)
    }
  }

  /** The text of token ids (special tokens included as their spellings). */
  detokenize(ids: number[]): string {
    this.#check()
    if (!Array.isArray(ids)) throw invalidArgument('ids must be an array of token ids')
    // An index loop, not `every`: a sparse array's holes are not token ids either.
    for (let i = 0; i < ids.length; i++) checkInt(`ids[${i}]`, ids[i], 0)
    try {
      return this.#native.detokenize(ids)
    } catch (e) {
      throw toError(e)
    }
  }

  /**
   * A new conversation. `experts` sets its default experts (each must be loaded);
   * `contextShift: 'drop-oldest'` keeps a long chat going past the context length.
   */
  createSession(sessionOptions?: SessionOptions): Session {
    this.#check()
    const options = optionsObject(sessionOptions)
    onlyKeys(options, SESSION_KEYS, 'createSession')
    if (options.system !== undefined && typeof options.system !== 'string') throw invalidArgument('system must be a string')
    const auto = options.experts === 'auto'
    if (options.experts !== undefined && !auto) checkNames(options.experts)
    // Its value is the engine's to check (INVALID_ARGUMENT for anything but 'none' / 'drop-oldest').
    if (options.contextShift != null && typeof options.contextShift !== 'string') throw invalidArgument('contextShift must be a string')
    try {
      return new Session(this.#native.createSession(options.system, auto ? undefined : (options.experts as string[] | undefined), auto, options.contextShift))
    } catch (e) {
      throw toError(e)
    }
  }

  /**
   * A session from a file `session.save(path)` wrote with this model (the same model files,
   * loaded with the same dtype, quantization, RoPE and `kvCache` options): its history is
   * back, and its next turn continues from the saved cache without evaluating the
   * conversation again (`usage.cachedTokens` counts it). `contextShift` as for
   * `createSession`. A cache computed under experts needs them loaded here under the same
   * names from the same files with the same scale (their fingerprints are in the file); the
   * restored session's default experts are those. Errors: `INVALID_ARGUMENT` (not a session
   * file, a damaged or truncated one, one from another model or KV cache format, an expert
   * loaded here that is another adapter than the saved one), `EXPERT_NOT_FOUND` (an expert
   * of the saved cache is not loaded), `KV_CACHE_EXHAUSTED` (running requests hold the
   * blocks it needs), `CONTEXT_OVERFLOW`.
   */
  async restoreSession(path: string, sessionOptions?: Pick<SessionOptions, 'contextShift'>): Promise<Session> {
    this.#check()
    if (typeof path !== 'string' || path.length === 0) throw invalidArgument('path must be a non-empty string')
    const options = optionsObject(sessionOptions)
    onlyKeys(options, ['contextShift'], 'restoreSession')
    if (options.contextShift != null && typeof options.contextShift !== 'string') throw invalidArgument('contextShift must be a string')
    try {
      return new Session(await this.#native.restoreSession(path, options.contextShift))
    } catch (e) {
      throw toError(e)
    }
  }

  /**
   * Loads a PEFT adapter directory (`adapter_config.json` + `adapter_model.safetensors`, as
   * `save_pretrained` writes it, plus an optional `manifest.json`): LoRA, rsLoRA, DoRA, IA³,
   * LoKr or prompt tuning. It is validated against this base model and made resident, off the
   * JS thread and without pausing running requests. Errors: `EXPERT_NOT_FOUND` (no such
   * path), `INVALID_ADAPTER` (bad or mismatched files), `UNSUPPORTED_ADAPTER` (another PEFT
   * type or feature), `INVALID_ARGUMENT` (a name already loaded).
   *
   * A path `hf:org/repo[@revision]` is an adapter repository on the Hugging Face Hub, fetched
   * into the cache first like `Runtime.load`'s (`hub`, default the runtime's own `hub` options;
   * `onDownloadProgress`; the Hub's errors, docs/models.md). Its name defaults to the
   * manifest's, else the repository's (`repo`).
   */
  async loadExpert(path: string, expertOptions?: LoadExpertOptions): Promise<Expert> {
    this.#check()
    const options = optionsObject(expertOptions)
    if (typeof path !== 'string' || path.length === 0) throw invalidArgument('path must be a non-empty string')
    onlyKeys(options, LOAD_EXPERT_KEYS, 'loadExpert')
    if (options.hub !== undefined) checkHubOptions(options.hub)
    if (options.name !== undefined && (typeof options.name !== 'string' || options.name.length === 0)) {
      throw invalidArgument('name must be a non-empty string')
    }
    if (options.scale !== undefined && !(typeof options.scale === 'number' && Number.isFinite(options.scale))) {
      throw invalidArgument('scale must be a finite number')
    }
    if (options.mmap !== undefined && typeof options.mmap !== 'boolean') throw invalidArgument('mmap must be a boolean')
    let dir = path
    let defaultName: string | undefined
    if (path.startsWith('hf:')) {
      const ref = parseHfRef(path.slice(3))
      dir = await fetchModel(ref, options.hub ?? this.#hub, options.onDownloadProgress, 'adapter')
      // The snapshot directory is named by its commit: the repository's name reads better.
      defaultName = ref.repo.slice(ref.repo.indexOf('/') + 1)
      this.#check()
    }
    try {
      const n = await this.#native.loadExpert(dir, { name: options.name, defaultName, scale: options.scale, mmap: options.mmap })
      return this.#wrap(n)
    } catch (e) {
      throw toError(e)
    }
  }

  #experts = new Map<number, Expert>()

  /** One `Expert` object per load. */
  #wrap(n: N.NativeExpert): Expert {
    let e = this.#experts.get(n.id)
    if (!e) {
      e = new Expert(n)
      this.#experts.set(n.id, e)
    }
    return e
  }

  /** The loaded experts, in load order. */
  get experts(): Expert[] {
    this.#check()
    const list = this.#native.experts().map((n) => this.#wrap(n))
    const live = new Set(list.map((e) => e.id))
    for (const id of this.#experts.keys()) if (!live.has(id)) this.#experts.delete(id)
    return list
  }

  /** KV pool and scheduler counters, as of the engine's last step (synchronous, cheap). */
  stats(): RuntimeStats {
    this.#check()
    try {
      const s = this.#native.stats()
      return { ...s, deviceMemoryFree: s.deviceMemoryFree ?? null, deviceMemoryTotal: s.deviceMemoryTotal ?? null, memory: { ...s.memory }, kvDisk: s.kvDisk ? { ...s.kvDisk } : null, runningExperts: [...s.runningExperts], waitingExperts: [...s.waitingExperts], kvEventsDropped: s.kvEventsDropped }
    } catch (e) {
      throw toError(e)
    }
  }

  /**
   * One vector per text (`hiddenSize` long): the model's final hidden state, after its final
   * norm, pooled over the text's tokens (`mean`, default) or taken at the `last` one, unit
   * length unless `normalize: false`. Texts are tokenized with the tokenizer's default
   * special tokens (special-token spellings in them are plain text) and evaluated as rows of
   * the engine's passes, so running decodes keep their pace. `experts` gives the embedding
   * under those adapters. Errors: `INVALID_ARGUMENT` (an empty text, bad options),
   * `CONTEXT_OVERFLOW` (a text longer than the context), `EXPERT_NOT_FOUND`.
   */
  async embed(texts: string[], embedOptions?: EmbedOptions): Promise<Float32Array[]> {
    this.#check()
    if (!Array.isArray(texts)) throw invalidArgument('texts must be an array of strings')
    // An index loop, not `every`: a sparse array's holes are not strings either.
    for (let i = 0; i < texts.length; i++) if (typeof texts[i] !== 'string') throw invalidArgument(`texts[${i}] must be a string`)
    const o = optionsObject(embedOptions)
    onlyKeys(o, EMBED_KEYS, 'embed')
    if (o.pooling !== undefined && o.pooling !== 'mean' && o.pooling !== 'last') throw invalidArgument("pooling must be 'mean' or 'last'")
    if (o.normalize !== undefined && typeof o.normalize !== 'boolean') throw invalidArgument('normalize must be a boolean')
    if (o.experts !== undefined) checkNames(o.experts)
    try {
      return await this.#native.embed(texts, { pooling: o.pooling, normalize: o.normalize, experts: o.experts })
    } catch (e) {
      throw toError(e)
    }
  }

  /**
   * Which experts the router picks for `input` (a string, or a conversation: its last user
   * message, plus `historyTurns` earlier user turns), with every routable expert's score and
   * a one-line reason. Nothing is generated. Scoring: see the README ("Routing").
   */
  async route(input: string | ChatMessage[], routeOptions?: RouteOptions): Promise<RouteDecision> {
    this.#check()
    if (typeof input !== 'string' && !Array.isArray(input)) throw invalidArgument('input must be a string or a ChatMessage[]')
    const o = optionsObject(routeOptions)
    onlyKeys(o, ROUTE_KEYS, 'route')
    if (o.historyTurns !== undefined) checkInt('historyTurns', o.historyTurns, 0)
    const native = typeof input === 'string' ? { text: input } : toNativeInput(input)
    try {
      // Keywords only (no expert has examples): decided at once, without a trip to the engine.
      const now = this.#native.routeNow(native, o.historyTurns)
      return toDecision(now ?? (await this.#native.route(native, o.historyTurns)))
    } catch (e) {
      throw toError(e)
    }
  }

  /** Tunes the router; fields left out keep their current values. */
  setRouter(settings: Partial<RouterSettings>): void {
    this.#check()
    const o = optionsObject(settings, 'settings')
    onlyKeys(o, ROUTER_KEYS, 'setRouter')
    const cur = this.#native.router
    const num = (k: string, v: unknown): number => {
      if (typeof v !== 'number' || !Number.isFinite(v)) throw invalidArgument(`${k} must be a finite number`)
      return v
    }
    const int = (k: string, v: unknown): number => checkInt(k, v, 0)
    const w = o.weights === undefined ? cur.weights : optionsObject(o.weights, 'weights')
    onlyKeys(w, ROUTER_WEIGHT_KEYS, 'weights')
    if (o.genericPatterns !== undefined && !(Array.isArray(o.genericPatterns) && o.genericPatterns.every((p) => typeof p === 'string'))) {
      throw invalidArgument('genericPatterns must be an array of strings')
    }
    const next: N.JsRouterSettings = {
      threshold: o.threshold === undefined ? cur.threshold : num('threshold', o.threshold),
      maxExperts: o.maxExperts === undefined ? cur.maxExperts : int('maxExperts', o.maxExperts),
      genericPatterns: o.genericPatterns ?? cur.genericPatterns,
      weights: {
        keywords: w.keywords === undefined ? cur.weights.keywords : num('weights.keywords', w.keywords),
        similarity: w.similarity === undefined ? cur.weights.similarity : num('weights.similarity', w.similarity),
      },
      historyTurns: o.historyTurns === undefined ? cur.historyTurns : int('historyTurns', o.historyTurns),
      genericMinKeywordHits: o.genericMinKeywordHits === undefined ? cur.genericMinKeywordHits : int('genericMinKeywordHits', o.genericMinKeywordHits),
    }
    try {
      this.#native.setRouter(next)
    } catch (e) {
      throw toError(e)
    }
  }

  /** The router's current settings. */
  get router(): RouterSettings {
    this.#check()
    const r = this.#native.router
    return { ...r, genericPatterns: [...r.genericPatterns], weights: { ...r.weights } }
  }

  /** Whether `dispose()` was called. */
  get disposed(): boolean {
    return this.#disposed
  }

  /** Cancels running requests and frees the model. Later calls fail with `DISPOSED`. */
  async dispose(): Promise<void> {
    if (this.#disposed) return
    this.#disposed = true
    await this.#native.dispose()
  }

  /** `await using rt = await Runtime.load(…)`: `dispose()` at the end of the scope. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.dispose()
  }
}
