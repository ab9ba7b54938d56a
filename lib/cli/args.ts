// Shared argument parsing for the `expert-runtime` commands: `--key value` options, `--flag`
// switches and positional arguments, with every mistake a usage error (exit code 2).

export class UsageError extends Error {}

export interface Parsed {
  positional: string[]
  options: Map<string, string | true>
}

/**
 * Splits `argv` into positional arguments and options. `flags` name the options that take no
 * value; `optionalValue` those whose value may be left out (`--cors` or `--cors ORIGIN`).
 * Every other option needs a value. Unknown options are usage errors.
 */
export function parseArgs(argv: string[], spec: { values: string[]; flags?: string[]; optionalValue?: string[] }): Parsed {
  const positional: string[] = []
  const options = new Map<string, string | true>()
  const flags = spec.flags ?? []
  const optional = spec.optionalValue ?? []
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
    if (!flags.includes(key) && !optional.includes(key) && !spec.values.includes(key)) throw new UsageError(`unknown option --${key}`)
    if (options.has(key)) throw new UsageError(`--${key} is given twice`)
    if (eq >= 0) {
      if (flags.includes(key)) throw new UsageError(`--${key} takes no value`)
      options.set(key, a.slice(eq + 1))
      continue
    }
    const next = argv[i + 1]
    if (flags.includes(key) || (optional.includes(key) && (next === undefined || next.startsWith('--')))) {
      options.set(key, true)
    } else if (next === undefined || next.startsWith('--')) {
      throw new UsageError(`--${key} needs a value`)
    } else {
      options.set(key, next)
      i++
    }
  }
  return { positional, options }
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
