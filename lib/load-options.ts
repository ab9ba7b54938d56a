// The options of `Runtime.load` and `Runtime.estimate`: checked (unknown keys, types and
// ranges) and converted to the binding's form. The engine checks what depends on the model.

import type * as N from '../native'
import { checkInt, onlyKeys, optionKeys } from './checks'
import { invalidArgument } from './errors'
import type { KvCacheOptions, KvDiskOptions, LoadOptions, RopeScaling } from './types'

// The keys each options object takes (checked complete against its type): any other key is
// refused with INVALID_ARGUMENT naming the nearest of them.
export const LOAD_KEYS = optionKeys<LoadOptions>({
  device: true, dtype: true, contextLength: true, ropeScaling: true, threads: true, quantize: true, mmap: true,
  onProgress: true, kvCache: true, hub: true, onDownloadProgress: true, memoryLimit: true,
})
const KV_CACHE_KEYS = optionKeys<KvCacheOptions>({ blockSize: true, maxTokens: true, maxBytes: true, idleReleaseMs: true, prefixCache: true, dtype: true, maxSequences: true, disk: true })
const KV_DISK_KEYS = optionKeys<KvDiskOptions>({ dir: true, maxBytes: true })
/** Every member's keys of a union type. */
type KeysOfUnion<T> = T extends unknown ? keyof T : never
/**
 * `ropeScaling`'s keys as the types spell them, then HF's snake_case spellings, which the engine
 * also reads (src/model/rope.rs, OPTION_KEYS), with `rope_type` / `ropeType` for `type`.
 */
const ROPE_KEYS = [
  ...optionKeys<{ [K in KeysOfUnion<RopeScaling>]: unknown }>({
    type: true, factor: true, originalMaxPositionEmbeddings: true, attentionFactor: true, betaFast: true, betaSlow: true,
    mscale: true, mscaleAllDim: true, truncate: true, lowFreqFactor: true, highFreqFactor: true,
  }),
  'rope_type', 'ropeType', 'original_max_position_embeddings', 'attention_factor', 'beta_fast', 'beta_slow',
  'mscale_all_dim', 'low_freq_factor', 'high_freq_factor',
]

/** The load options the engine reads (those of the JS layer, such as `onProgress` and `hub`, taken out). */
export type EngineLoadOptions = Omit<LoadOptions, 'onProgress' | 'hub' | 'onDownloadProgress'>

/** Checks `o` and converts it; `device` with its default (`EXPERT_RUNTIME_DEVICE`, else `auto`) applied. */
export function nativeLoadOptions(o: EngineLoadOptions): { device: NonNullable<LoadOptions['device']>; native: N.NativeLoadOptions } {
  const auto = o.contextLength === 'auto'
  if (o.contextLength !== undefined && !auto) {
    if (typeof o.contextLength === 'string') throw invalidArgument(`contextLength must be a whole number or 'auto', got '${o.contextLength}'`)
    checkInt('contextLength', o.contextLength, 1)
  }
  if (o.threads !== undefined) checkInt('threads', o.threads, 1)
  if (o.memoryLimit !== undefined) checkInt('memoryLimit', o.memoryLimit, 1, Number.MAX_SAFE_INTEGER)
  if (o.quantize !== undefined && typeof o.quantize !== 'string') throw invalidArgument('quantize must be a string')
  if (o.mmap !== undefined && typeof o.mmap !== 'boolean') throw invalidArgument('mmap must be a boolean')
  const kv = o.kvCache
  if (kv !== undefined) {
    if (kv === null || typeof kv !== 'object' || Array.isArray(kv)) throw invalidArgument('kvCache must be an object')
    onlyKeys(kv, KV_CACHE_KEYS, 'kvCache')
    if (kv.blockSize !== undefined) checkInt('kvCache.blockSize', kv.blockSize, 1)
    if (kv.maxTokens !== undefined) checkInt('kvCache.maxTokens', kv.maxTokens, 1, Number.MAX_SAFE_INTEGER)
    if (kv.maxBytes !== undefined) checkInt('kvCache.maxBytes', kv.maxBytes, 1, Number.MAX_SAFE_INTEGER)
    if (kv.idleReleaseMs !== undefined) checkInt('kvCache.idleReleaseMs', kv.idleReleaseMs, 0, Number.MAX_SAFE_INTEGER)
    if (kv.prefixCache !== undefined && typeof kv.prefixCache !== 'boolean') throw invalidArgument('kvCache.prefixCache must be a boolean')
    if (kv.dtype !== undefined && typeof kv.dtype !== 'string') throw invalidArgument('kvCache.dtype must be a string')
    if (kv.maxSequences !== undefined) checkInt('kvCache.maxSequences', kv.maxSequences, 1, 4096)
    if (kv.disk !== undefined) {
      const d = kv.disk
      if (d === null || typeof d !== 'object' || Array.isArray(d)) throw invalidArgument('kvCache.disk must be an object { dir, maxBytes }')
      onlyKeys(d, KV_DISK_KEYS, 'kvCache.disk')
      if (typeof d.dir !== 'string' || d.dir.length === 0 || d.dir.includes('\0')) throw invalidArgument('kvCache.disk.dir must be a non-empty path')
      checkInt('kvCache.disk.maxBytes', d.maxBytes, 1, Number.MAX_SAFE_INTEGER)
    }
  }
  const ropeScaling = ropeScalingJson(o.ropeScaling)
  const device = o.device ?? (process.env.EXPERT_RUNTIME_DEVICE as LoadOptions['device']) ?? 'auto'
  const dtype = o.dtype ?? (process.env.EXPERT_RUNTIME_DTYPE as LoadOptions['dtype'])
  if (typeof device !== 'string' || !/^(auto|cpu|cuda(:\d+)?)$/.test(device)) {
    throw invalidArgument(`unknown device '${String(device)}' (auto, cpu, cuda, cuda:N)`)
  }
  const native: N.NativeLoadOptions = {
    device,
    dtype,
    contextLength: auto ? undefined : (o.contextLength as number | undefined),
    contextLengthAuto: auto || undefined,
    memoryLimit: o.memoryLimit,
    ropeScaling,
    threads: o.threads,
    quantize: o.quantize,
    mmap: o.mmap,
    kvCache: kv ? { blockSize: kv.blockSize, maxTokens: kv.maxTokens, maxBytes: kv.maxBytes, idleReleaseMs: kv.idleReleaseMs, prefixCache: kv.prefixCache, dtype: kv.dtype, maxSequences: kv.maxSequences, disk: kv.disk ? { dir: kv.disk.dir, maxBytes: kv.disk.maxBytes } : undefined } : undefined,
  }
  return { device, native }
}

/**
 * The `ropeScaling` option as JSON text for the engine (which checks the keys and values):
 * a plain object of strings, booleans and finite numbers, or `null` (scaling off).
 */
function ropeScalingJson(v: unknown): string | undefined {
  if (v === undefined) return undefined
  if (v === null) return 'null'
  if (typeof v !== 'object' || Array.isArray(v)) throw invalidArgument('ropeScaling must be an object or null')
  onlyKeys(v, ROPE_KEYS, 'ropeScaling')
  for (const [k, x] of Object.entries(v)) {
    const ok = typeof x === 'string' || typeof x === 'boolean' || (typeof x === 'number' && Number.isFinite(x))
    if (!ok) throw invalidArgument(`ropeScaling.${k} must be a string, a boolean or a finite number`)
  }
  return JSON.stringify(v)
}
