import * as native from './native'
import type * as N from '../native'
import { disposedError, invalidArgument, toError } from './errors'
import { Session } from './session'
import type { LoadOptions, RuntimeInfo } from './types'

/** A loaded base model. Everything heavy runs on its own engine thread. */
export class Runtime {
  #native: N.NativeRuntime
  #info: RuntimeInfo
  #disposed = false

  private constructor(n: N.NativeRuntime) {
    this.#native = n
    this.#info = n.info
  }

  /** Loads an HF model directory (config.json + safetensors + tokenizer) or a GGUF file. */
  static async load(path: string, options: LoadOptions = {}): Promise<Runtime> {
    if (typeof path !== 'string' || path.length === 0) throw invalidArgument('path must be a non-empty string')
    const { onProgress, ...rest } = options
    for (const k of ['contextLength', 'threads'] as const) {
      const v = rest[k]
      if (v !== undefined && !(Number.isInteger(v) && v > 0)) throw invalidArgument(`${k} must be a positive integer`)
    }
    if (onProgress !== undefined && typeof onProgress !== 'function') throw invalidArgument('onProgress must be a function')
    try {
      const n = await native.loadRuntime(
        path,
        { device: rest.device, dtype: rest.dtype, contextLength: rest.contextLength, threads: rest.threads },
        onProgress ? (p: N.LoadProgress) => onProgress({ loadedBytes: p.loadedBytes, totalBytes: p.totalBytes }) : undefined,
      )
      return new Runtime(n)
    } catch (e) {
      throw toError(e)
    }
  }

  get info(): RuntimeInfo {
    return { ...this.#info, eosTokenIds: [...this.#info.eosTokenIds] }
  }

  #check(): void {
    if (this.#disposed) throw disposedError('runtime')
  }

  tokenize(text: string, options: { addSpecialTokens?: boolean } = {}): number[] {
    this.#check()
    if (typeof text !== 'string') throw invalidArgument('text must be a string')
    try {
      return this.#native.tokenize(text, options.addSpecialTokens)
    } catch (e) {
      throw toError(e)
    }
  }

  detokenize(ids: number[]): string {
    this.#check()
    if (!Array.isArray(ids) || !ids.every((t) => Number.isInteger(t) && t >= 0)) throw invalidArgument('ids must be non-negative integers')
    try {
      return this.#native.detokenize(ids)
    } catch (e) {
      throw toError(e)
    }
  }

  createSession(options: { system?: string } = {}): Session {
    this.#check()
    if (options.system !== undefined && typeof options.system !== 'string') throw invalidArgument('system must be a string')
    try {
      return new Session(this.#native.createSession(options.system))
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
