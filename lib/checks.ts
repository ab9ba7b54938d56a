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

/** Refuses keys an options object does not know (a misspelt option would be ignored silently). */
export function onlyKeys(o: object, known: readonly string[], what: string): void {
  for (const k of Object.keys(o)) {
    if (!known.includes(k)) throw invalidArgument(`${what}: unknown option '${k}' (known: ${known.join(', ')})`)
  }
}
