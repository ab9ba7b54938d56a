import type * as N from '../native'
import { toError } from './errors'
import type { ExpertKind, ExpertManifest } from './types'

/**
 * A PEFT adapter resident on the runtime's device. Load with `runtime.loadExpert(path)`; use
 * by name in `createSession({ experts })` or `generate(input, { experts })`. Never merged into
 * the base weights.
 */
export class Expert {
  readonly #native: N.NativeExpert
  readonly #manifest: ExpertManifest | null

  /** @internal */
  constructor(native: N.NativeExpert) {
    this.#native = native
    const m = native.manifest
    this.#manifest = m == null ? null : (JSON.parse(m) as ExpertManifest)
  }

  /** The name requests select it by (option `name`, else manifest `name`, else the directory name). */
  get name(): string {
    return this.#native.name
  }

  /** The PEFT method (`lora` also covers rsLoRA). */
  get kind(): ExpertKind {
    return this.#native.kind as ExpertKind
  }

  /** LoRA/DoRA/LoKr rank (the largest, with `rank_pattern`); `null` for IA³ and prompt tuning. */
  get rank(): number | null {
    return this.#native.rank ?? null
  }

  /** Module names it adapts (`q_proj`, …); empty for prompt tuning. */
  get targetModules(): string[] {
    return this.#native.targetModules
  }

  /** Memory held by its weights, in bytes (those read in place from the file included). */
  get bytes(): number {
    return this.#native.bytes
  }

  /**
   * Of `bytes`, the matrices read in place from the memory-mapped adapter file
   * (`LoadExpertOptions.mmap`): page cache shared by every runtime that maps the file, never
   * copied. 0 when everything was converted into memory.
   */
  get mappedBytes(): number {
    return this.#native.mappedBytes
  }

  /**
   * Tensors of a multimodal model's vision tower or projector in the adapter file (an adapter
   * trained on Gemma 3's image-text checkpoint with `target_modules: ['q_proj', …]` has them).
   * Images are not an input of the runtime, so they cannot change an output: they are counted
   * here and not loaded. 0 for a text model's adapter.
   */
  get skippedVisionTensors(): number {
    return this.#native.skippedVisionTensors
  }

  /** `manifest.json` beside the adapter, or `null`. */
  get manifest(): ExpertManifest | null {
    return this.#manifest
  }

  /** Prompt tuning: virtual tokens prepended to every sequence (0 for other kinds). */
  get numVirtualTokens(): number {
    return this.#native.numVirtualTokens
  }

  /** Whether it is still loaded. */
  get loaded(): boolean {
    return this.#native.loaded
  }

  /** @internal */
  get id(): number {
    return this.#native.id
  }

  /**
   * Removes it from the runtime. Requests already running keep using it; its memory is freed
   * when the last of them ends. Later use of its name fails with `EXPERT_NOT_FOUND`.
   * Idempotent.
   */
  async unload(): Promise<void> {
    try {
      await this.#native.unload()
    } catch (e) {
      throw toError(e)
    }
  }

  /** Its description as plain data (`JSON.stringify(expert)`). */
  toJSON(): object {
    return { name: this.name, kind: this.kind, rank: this.rank, targetModules: this.targetModules, bytes: this.bytes, mappedBytes: this.mappedBytes, skippedVisionTensors: this.skippedVisionTensors, manifest: this.manifest }
  }
}
