import { invalidArgument } from './errors'

/** Largest value a native `u32` argument holds: larger numbers would wrap, so they are refused. */
export const U32_MAX = 0xffff_ffff

/** A non-negative integer that fits a `u32`. */
export function isU32(v: unknown): v is number {
  return Number.isInteger(v) && (v as number) >= 0 && (v as number) <= U32_MAX
}

/** A positive integer that fits a `u32`. */
export function isPositiveU32(v: unknown): v is number {
  return isU32(v) && v > 0
}

/** A value as a message shows it: numbers and short strings as written, anything else by its kind. */
export function shown(v: unknown): string {
  if (typeof v === 'number' || typeof v === 'boolean' || typeof v === 'bigint') return String(v)
  if (typeof v === 'string') return JSON.stringify(v.length > 40 ? `${v.slice(0, 40)}…` : v)
  if (v === null || v === undefined) return String(v)
  if (Array.isArray(v)) return 'an array'
  return typeof v === 'object' ? 'an object' : `a ${typeof v}`
}

/**
 * `v` when it is an integer from `min` (0 or 1) to `max`, else `INVALID_ARGUMENT` saying so in
 * one wording for every integer option: "maxTokens must be a positive integer (1 or more),
 * got -1", "topK must be a non-negative integer (0 or more), got 1.5", or "(at most N)" when
 * it is too large.
 */
export function checkInt(name: string, v: unknown, min: 0 | 1, max: number = U32_MAX): number {
  const kind = min === 1 ? 'a positive integer' : 'a non-negative integer'
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min) throw invalidArgument(`${name} must be ${kind} (${min} or more), got ${shown(v)}`)
  if (v > max) throw invalidArgument(`${name} must be ${kind} (at most ${max}), got ${shown(v)}`)
  return v
}

/**
 * An options argument: `undefined` means none; anything but a plain object (`null`, a
 * string, an array) is `INVALID_ARGUMENT` rather than a `TypeError` deep inside.
 */
export function optionsObject<T extends object>(v: T | undefined | null, name = 'options'): T {
  if (v === undefined) return {} as T
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw invalidArgument(`${name} must be an object`)
  return v
}

/** Whether `v` behaves as an `AbortSignal` (also one from another realm or a polyfill). */
export function isAbortSignal(v: unknown): v is AbortSignal {
  if (v instanceof AbortSignal) return true
  const s = v as { aborted?: unknown; addEventListener?: unknown; removeEventListener?: unknown } | null
  return !!s && typeof s === 'object' && typeof s.aborted === 'boolean' && typeof s.addEventListener === 'function' && typeof s.removeEventListener === 'function'
}

/**
 * The keys of an options type, kept complete by the compiler: `optionKeys<LoadOptions>({ device:
 * true, … })` fails to compile when the type gains a key the list lacks, or the list names one
 * the type does not have. One list per public options type, so `onlyKeys` can never refuse an
 * option the types allow.
 */
export function optionKeys<T extends object>(keys: { [K in keyof Required<T>]: true }): readonly (keyof T & string)[] {
  return Object.keys(keys) as (keyof T & string)[]
}

/** Edit distance (optimal string alignment: insertions, deletions, substitutions, swaps of neighbours). */
export function editDistance(a: string, b: string): number {
  let prev2: number[] = []
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j)
  for (let i = 1; i <= a.length; i++) {
    const cur = [i]
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1
      let d = Math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) d = Math.min(d, prev2[j - 2] + 1)
      cur.push(d)
    }
    prev2 = prev
    prev = cur
  }
  return prev[b.length]
}

/** A key compared loosely: case, `_` and `-` do not count (`max_tokens` is `maxTokens`). */
const loose = (k: string) => k.toLowerCase().replace(/[_-]/g, '')

/**
 * The known key `key` was most likely meant as, or undefined when none is close: at most one
 * edit per three characters (at most 3), comparing loosely (`max_tokens`, `MaxTokens` and
 * `maxToken` all find `maxTokens`). Ties go to the key listed first.
 */
export function nearestKey(key: string, known: readonly string[]): string | undefined {
  const k = loose(key)
  const limit = Math.min(3, Math.max(1, Math.floor(k.length / 3)))
  let best: string | undefined
  let bestDistance = limit + 1
  for (const c of known) {
    const d = editDistance(k, loose(c))
    if (d < bestDistance) {
      best = c
      bestDistance = d
    }
  }
  return best
}

/**
 * Refuses keys an options object does not know (a misspelt option would otherwise be ignored
 * silently): `INVALID_ARGUMENT` naming the key and the known key nearest to it, "complete:
 * unknown option 'maxToken' (did you mean 'maxTokens'?)", or every known key when none is
 * close. Only for option objects: user data (chat messages, JSON schemas, manifests) may carry
 * any keys. `noun` names what the keys are ('field' for the parts of a tool, say).
 */
export function onlyKeys(o: object, known: readonly string[], what: string, noun = 'option'): void {
  for (const k of Object.keys(o)) {
    if (known.includes(k)) continue
    const name = k.length > 64 ? `${k.slice(0, 64)}…` : k
    const near = nearestKey(k, known)
    const hint = near !== undefined ? `did you mean '${near}'?` : `known ${noun}s: ${known.join(', ')}`
    throw invalidArgument(`${what}: unknown ${noun} '${name}' (${hint})`)
  }
}
