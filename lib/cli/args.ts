// Shared argument parsing for the `expert-runtime` commands: `--key value` options, `--flag`
// switches and positional arguments, with every mistake a usage error (exit code 2).

export class UsageError extends Error {}

export interface Parsed {
  positional: string[]
  options: Map<string, string | true>
  /** The values of each `repeatable` option, in order. */
  lists: Map<string, string[]>
}

/**
 * Splits `argv` into positional arguments and options. `flags` name the options that take no
 * value; `optionalValue` those whose value may be left out (`--cors` or `--cors ORIGIN`);
 * `repeatable` those that may be given more than once (`--expert A --expert B`). Every other
 * option needs a value and may be given once. Unknown options are usage errors.
 */
export function parseArgs(
  argv: string[],
  spec: { values: string[]; flags?: string[]; optionalValue?: string[]; repeatable?: string[] },
): Parsed {
  const positional: string[] = []
  const options = new Map<string, string | true>()
  const lists = new Map<string, string[]>()
  const flags = spec.flags ?? []
  const optional = spec.optionalValue ?? []
  const repeatable = spec.repeatable ?? []
  const set = (key: string, value: string | true) => {
    if (repeatable.includes(key)) lists.set(key, [...(lists.get(key) ?? []), value as string])
    else options.set(key, value)
  }
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    if (a === '--') {
      positional.push(...argv.slice(i + 1))
      break
    }
    if (!a.startsWith('--')) {
      positional.push(a)
      continue
    }
    const eq = a.indexOf('=')
    const key = a.slice(2, eq < 0 ? undefined : eq)
    if (![flags, optional, spec.values, repeatable].some((known) => known.includes(key))) throw new UsageError(`unknown option --${key}`)
    if (options.has(key)) throw new UsageError(`--${key} is given twice`)
    if (eq >= 0) {
      if (flags.includes(key)) throw new UsageError(`--${key} takes no value`)
      set(key, a.slice(eq + 1))
      continue
    }
    const next = argv[i + 1]
    if (flags.includes(key) || (optional.includes(key) && (next === undefined || next.startsWith('--')))) {
      set(key, true)
    } else if (next === undefined || next.startsWith('--')) {
      throw new UsageError(`--${key} needs a value`)
    } else {
      set(key, next)
      i++
    }
  }
  return { positional, options, lists }
}

/** The one positional argument a command takes; `missing` is the usage error without it. */
export function onePositional(p: Parsed, missing: string): string {
  const [first, ...extra] = p.positional
  if (!first) throw new UsageError(missing)
  if (extra.length > 0) throw new UsageError(`unexpected argument '${extra[0]}'`)
  return first
}

/** An integer option ≥ `min`, or undefined when absent. */
export function intOption(p: Parsed, key: string, min: number): number | undefined {
  const v = p.options.get(key)
  if (v === undefined) return undefined
  const n = Number(v)
  if (v === true || !Number.isSafeInteger(n) || n < min) throw new UsageError(`--${key} must be an integer >= ${min}`)
  return n
}

/** A string option, or undefined when absent. */
export function stringOption(p: Parsed, key: string): string | undefined {
  const v = p.options.get(key)
  return v === true ? undefined : v
}
