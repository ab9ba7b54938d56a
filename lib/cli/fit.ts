// `inspect <model> --fit`: what a load would take (Runtime.estimate) and the context that fits a
// memory budget, printed as a table or added to --json's output as `fit`.
import { Runtime } from '../runtime'
import type { KvCacheDtype, LoadEstimate, LoadOptions } from '../types'
import { Parsed, stringOption, UsageError } from './args'

export const FIT_USAGE = `  --fit                  also say what a load would take: weights by quantization, KV bytes
                         per token for each kvCache.dtype, recurrent state, and the context
                         that fits the memory budget (no weight is loaded)
  --memory SIZE          the budget for --fit (memoryLimit): bytes, or with K, M, G, T
                         (powers of 1000) or KiB, MiB, GiB, TiB (default: free memory, less a margin)
  --context N|auto       the contextLength --fit plans for (default: the model's)
  --quantize MODE        the quantize option --fit plans for (none, q8_0, q4_0, q4_k)
  --kv-dtype DTYPE       the kvCache.dtype --fit plans for (f32, f16, bf16, q8_0, q4_0)`

export const FIT_VALUES = ['memory', 'context', 'quantize', 'kv-dtype']

const UNITS: Record<string, number> = {
  '': 1, b: 1, k: 1e3, kb: 1e3, m: 1e6, mb: 1e6, g: 1e9, gb: 1e9, t: 1e12, tb: 1e12,
  kib: 2 ** 10, mib: 2 ** 20, gib: 2 ** 30, tib: 2 ** 40,
}

/** `4GB`, `512MiB`, `1.5G`, `1000000`: whole bytes. */
export function parseSize(text: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$/.exec(text)
  const unit = m ? UNITS[m[2].toLowerCase()] : undefined
  if (!m || unit === undefined) throw new UsageError(`--memory: '${text}' is not a size (e.g. 4GB, 512MiB, 1000000)`)
  const n = Math.floor(Number(m[1]) * unit)
  if (!Number.isSafeInteger(n) || n < 1) throw new UsageError(`--memory: '${text}' is out of range`)
  return n
}

/** The load options --fit plans with, from the command line. */
export function fitOptions(p: Parsed): Omit<LoadOptions, 'onProgress' | 'hub' | 'onDownloadProgress'> {
  const memory = stringOption(p, 'memory')
  const context = stringOption(p, 'context')
  const quantize = stringOption(p, 'quantize')
  const kvDtype = stringOption(p, 'kv-dtype')
  let contextLength: number | 'auto' | undefined
  if (context === 'auto') contextLength = 'auto'
  else if (context !== undefined) {
    if (!/^\d+$/.test(context)) throw new UsageError(`--context must be a whole number or 'auto', got '${context}'`)
    contextLength = Number(context)
  }
  return {
    device: 'cpu',
    memoryLimit: memory === undefined ? undefined : parseSize(memory),
    contextLength,
    quantize: quantize === 'none' ? undefined : (quantize as LoadOptions['quantize']),
    kvCache: kvDtype === undefined ? undefined : { dtype: kvDtype as KvCacheDtype },
  }
}

export async function estimate(path: string, p: Parsed): Promise<LoadEstimate> {
  return Runtime.estimate(path, fitOptions(p))
}

function bytes(n: number): string {
  if (n < 1e3) return `${n} B`
  const units = ['KB', 'MB', 'GB', 'TB']
  let i = -1
  while (n >= 1000 && i < units.length - 1) {
    n /= 1000
    i++
  }
  return `${n.toFixed(n < 10 ? 2 : 1)} ${units[i]}`
}

/** The --fit section of the human-readable description. */
export function describeFit(e: LoadEstimate): [string, string][] {
  const perToken = Object.entries(e.kv.bytesPerToken)
    .map(([d, b]) => `${d} ${bytes(b)}${d === e.kv.dtype ? ' (this load)' : ''}`)
    .join(', ')
  const rows: [string, string][] = [
    ['fit: weights', `${bytes(e.weights.bytes)}: ${e.weights.formats.map((f) => `${f.format} ${bytes(f.bytes)}`).join(', ')}` +
      (e.weights.mappedBytes > 0 ? ` (${bytes(e.weights.mappedBytes)} read in place from the file)` : '')],
    ['fit: KV per token', perToken],
  ]
  if (e.state.bytesPerSequence > 0) {
    rows.push(['fit: state', `${bytes(e.state.bytesPerSequence)} per sequence, ${e.state.slots} slots: ${bytes(e.state.bytes)}`])
  }
  rows.push(
    ['fit: other', `RoPE tables ${bytes(e.ropeBytes)}, scratch ${bytes(e.scratchBytes)}, tokenizer ${bytes(e.tokenizerBytes)} (approximations)`],
    ['fit: budget', `${bytes(e.memoryLimit)}${e.memoryLimitIsDefault ? ' (free memory, less a margin)' : ''}`],
    ['fit: context', `${e.contextLength} of the model's ${e.modelContextLength}; ${e.fitContextLength} fit the budget`],
    ['fit: total', `${bytes(e.totalBytes)} (KV of one full context ${bytes(e.kv.bytes)})`],
  )
  if (e.doesNotFit !== null) rows.push(['fit: does not fit', e.doesNotFit])
  return rows
}
