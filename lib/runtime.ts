import { bindingFor, type Variant } from './binding'
import type * as N from '../native'
import { isPositiveU32, isU32, optionsObject } from './checks'
import { disposedError, invalidArgument, toError } from './errors'
import { Expert } from './expert'
import { Session, checkNames } from './session'
import type { LoadExpertOptions, LoadOptions, RuntimeInfo, RuntimeStats, SessionOptions } from './types'

/** A loaded base model. Everything heavy runs on its own engine thread. */
export class Runtime {
  #native: N.NativeRuntime
  #info: RuntimeInfo
  #disposed = false

  private constructor(n: N.NativeRuntime, binary: Variant) {
    this.#native = n
    const i = n.info
    this.#info = { ...i, device: i.device as RuntimeInfo['device'], deviceMemoryTotal: i.deviceMemoryTotal ?? null, binary }
  }

  /** Loads an HF model directory (config.json + safetensors + tokenizer) or a GGUF file. */
  static async load(path: string, options?: LoadOptions): Promise<Runtime> {
    if (typeof path !== 'string' || path.length === 0) throw invalidArgument('path must be a non-empty string')
    const { onProgress, ...rest } = optionsObject(options)
    for (const k of ['contextLength', 'threads'] as const) {
      const v = rest[k]
      if (v !== undefined && !isPositiveU32(v)) throw invalidArgument(`${k} must be a positive integer below 2^32`)
    }
    if (onProgress !== undefined && typeof onProgress !== 'function') throw invalidArgument('onProgress must be a function')
    const kv = rest.kvCache
    if (kv !== undefined) {
      if (kv === null || typeof kv !== 'object' || Array.isArray(kv)) throw invalidArgument('kvCache must be an object')
      if (kv.blockSize !== undefined && !isPositiveU32(kv.blockSize)) throw invalidArgument('kvCache.blockSize must be a positive integer')
      if (kv.maxTokens !== undefined && !(Number.isSafeInteger(kv.maxTokens) && kv.maxTokens > 0)) {
        throw invalidArgument('kvCache.maxTokens must be a positive integer')
      }
      if (kv.prefixCache !== undefined && typeof kv.prefixCache !== 'boolean') throw invalidArgument('kvCache.prefixCache must be a boolean')
    }
    const device = rest.device ?? (process.env.EXPERT_RUNTIME_DEVICE as LoadOptions['device']) ?? 'auto'
    const dtype = rest.dtype ?? (process.env.EXPERT_RUNTIME_DTYPE as LoadOptions['dtype'])
    if (typeof device !== 'string' || !/^(auto|cpu|cuda(:\d+)?)$/.test(device)) {
      throw invalidArgument(`unknown device '${String(device)}' (auto, cpu, cuda, cuda:N)`)
    }
    const { binding, variant } = bindingFor(device)
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
        path,
        {
          device,
          dtype,
          contextLength: rest.contextLength,
          threads: rest.threads,
          kvCache: kv ? { blockSize: kv.blockSize, maxTokens: kv.maxTokens, prefixCache: kv.prefixCache } : undefined,
        },
        progress,
      )
    } catch (e) {
      throw toError(e)
    }
    if (progressError) {
      await n.dispose()
      throw progressError.error
    }
    return new Runtime(n, variant)
  }

  get info(): RuntimeInfo {
    return { ...this.#info, eosTokenIds: [...this.#info.eosTokenIds] }
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
    const { addSpecialTokens, parseSpecialTokens } = optionsObject(options)
    if (addSpecialTokens !== undefined && typeof addSpecialTokens !== 'boolean') throw invalidArgument('addSpecialTokens must be a boolean')
    if (parseSpecialTokens !== undefined && typeof parseSpecialTokens !== 'boolean') throw invalidArgument('parseSpecialTokens must be a boolean')
    try {
      return this.#native.tokenize(text, addSpecialTokens, parseSpecialTokens)
    } catch (e) {
      throw toError(e)
    }
  }

  detokenize(ids: number[]): string {
    this.#check()
    if (!Array.isArray(ids) || !ids.every(isU32)) throw invalidArgument('ids must be non-negative integers below 2^32')
    try {
      return this.#native.detokenize(ids)
    } catch (e) {
      throw toError(e)
    }
  }

  /** A new conversation. `experts` sets its default experts (each must be loaded). */
  createSession(sessionOptions?: SessionOptions): Session {
    this.#check()
    const options = optionsObject(sessionOptions)
    if (options.system !== undefined && typeof options.system !== 'string') throw invalidArgument('system must be a string')
    if (options.experts !== undefined) checkNames(options.experts)
    try {
      return new Session(this.#native.createSession(options.system, options.experts))
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
   */
  async loadExpert(path: string, expertOptions?: LoadExpertOptions): Promise<Expert> {
    this.#check()
    const options = optionsObject(expertOptions)
    if (typeof path !== 'string' || path.length === 0) throw invalidArgument('path must be a non-empty string')
    if (options.name !== undefined && (typeof options.name !== 'string' || options.name.length === 0)) {
      throw invalidArgument('name must be a non-empty string')
    }
    if (options.scale !== undefined && !(typeof options.scale === 'number' && Number.isFinite(options.scale))) {
      throw invalidArgument('scale must be a finite number')
    }
    try {
      const n = await this.#native.loadExpert(path, { name: options.name, scale: options.scale })
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
      return { ...s, deviceMemoryFree: s.deviceMemoryFree ?? null, deviceMemoryTotal: s.deviceMemoryTotal ?? null }
    } catch (e) {
      throw toError(e)
    }
  }

  /** Cancels running requests and frees the model. Later calls fail with `DISPOSED`. */
  async dispose(): Promise<void> {
    if (this.#disposed) return
    this.#disposed = true
    await this.#native.dispose()
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.dispose()
  }
}
