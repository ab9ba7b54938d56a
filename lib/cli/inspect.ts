// `expert-runtime inspect <model | adapter> [--base MODEL] [--fit …] [--json]`: what a model or
// an adapter is, read from its files without loading weights (lib/inspect.ts); with --base,
// whether the adapter loads onto that base model; with --fit, what a load would take (./fit.ts).
import { ExpertRuntimeError, toError } from '../errors'
import { inspect } from '../inspect'
import { Runtime } from '../runtime'
import type { AdapterInspection, LoadEstimate, ModelInspection, WeightFilesInfo } from '../types'
import { intOption, onePositional, parseArgs, stringOption, UsageError } from './args'
import { describeFit, estimate, FIT_USAGE, FIT_VALUES } from './fit'

export const USAGE = `usage: expert-runtime inspect <model.gguf | model-dir | adapter-dir> [options]

Describes a model (architecture, sizes, tensor formats, tokenizer, special tokens, chat
template) or a PEFT adapter (method, rank, alpha, target modules, tensors, base model) from its
files, without loading weights.

  --base MODEL           adapters: load MODEL and check that the adapter loads onto it
                         (exit code 1 when it does not)
  --json                 print the description as JSON (the full chat template included; --fit's
                         numbers as \`fit\`)
  --threads N            engine threads for --base (default: all cores)
${FIT_USAGE}`

/** How a `--base` check went. */
export interface Compatibility {
  base: string
  compatible: boolean
  /** Why not: the error `loadExpert` gave. */
  error?: { code: string; message: string }
}

const TEMPLATE_LINES = 8

function bytes(n: number): string {
  const units = ['B', 'KB', 'MB', 'GB', 'TB']
  let i = 0
  while (n >= 1000 && i < units.length - 1) {
    n /= 1000
    i++
  }
  return `${i === 0 ? n : n.toFixed(n < 10 ? 2 : 1)} ${units[i]}`
}

function count(n: number): string {
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)} B`
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)} M`
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)} K`
  return String(n)
}

/** `key  value` lines, keys padded to one width. */
function table(rows: [string, string][]): string {
  const width = Math.max(...rows.map(([k]) => k.length))
  return rows.map(([k, v]) => `${k.padEnd(width)}  ${v}`).join('\n')
}

function plural(n: number, what: string): string {
  return `${n} ${what}${n === 1 ? '' : 's'}`
}

function formats(w: WeightFilesInfo): string {
  return w.formats.map((f) => `${f.format} ${bytes(f.bytes)} (${plural(f.tensors, 'tensor')})`).join(', ')
}

function token(t: { id: number; text: string | null }): string {
  return t.text === null ? String(t.id) : `${JSON.stringify(t.text)} (${t.id})`
}

function describeModel(m: ModelInspection, fit: LoadEstimate | undefined): string {
  const w = m.weights
  const t = m.tokenizer
  const rows: [string, string][] = [
    ['model', m.path],
    ['format', `${w.container}, ${plural(w.files, 'file')}, ${bytes(w.fileBytes)}`],
    ['architecture', m.architecture],
    ['family', m.family],
    ['parameters', `${count(w.parameters)} (${w.parameters})`],
    ['layers', String(m.numLayers)],
    ['hidden size', String(m.hiddenSize)],
    ['ffn size', String(m.intermediateSize)],
    ['heads', `${m.numHeads} (kv heads ${m.numKvHeads}, head dim ${m.headDim})`],
    ['vocab size', String(m.vocabSize)],
    ['context length', String(m.contextLength)],
    ['rope', `theta ${m.ropeTheta}${m.ropeScaling ? `, scaling ${JSON.stringify(m.ropeScaling)}` : ''}`],
    ['tied embeddings', m.tieWordEmbeddings ? 'yes' : 'no'],
    ['tensors', `${w.tensors}: ${formats(w)}`],
  ]
  if (m.declaredDtype) rows.push(['declared dtype', m.declaredDtype])
  if (t) {
    rows.push(['tokenizer', `${t.source} ${t.model}${t.pre ? ` (pre ${t.pre})` : ''}, ${t.vocabSize} tokens${t.addsBos ? ', adds BOS' : ''}`])
    const configBos = m.bosTokenId !== null && m.bosTokenId !== t.bos?.id ? ` (config bos_token_id ${m.bosTokenId})` : ''
    rows.push(['bos', `${t.bos ? token(t.bos) : 'none'}${configBos}`])
  } else {
    rows.push(['tokenizer', 'unavailable (see warnings)'])
  }
  rows.push(['eos', m.eosTokens.map(token).join(', ') || 'none'])
  m.plan.forEach((line, i) => rows.push([i === 0 ? 'layer plan' : '', line]))
  const lines = t?.chatTemplate?.split('\n')
  if (lines) {
    rows.push(['chat template', `yes (${lines.length} lines${lines.length > TEMPLATE_LINES ? `, first ${TEMPLATE_LINES} shown; --json prints it all` : ''})`])
  } else {
    rows.push(['chat template', 'none (ChatML is used)'])
  }
  const shown = (lines ?? []).slice(0, TEMPLATE_LINES).map((l) => `  | ${l}`)
  return [table(rows), ...shown, ...(fit ? [table(describeFit(fit))] : []), ...m.warnings.map((x) => `warning: ${x}`)].join('\n')
}

function describeAdapter(a: AdapterInspection, c: Compatibility | undefined): string {
  const w = a.weights
  const rows: [string, string][] = [['adapter', a.path]]
  if (a.name) rows.push(['name', a.name])
  if (a.description) rows.push(['description', a.description])
  rows.push(['kind', a.kind])
  if (a.rank !== null) rows.push(['rank', String(a.rank)])
  if (a.alpha !== null) rows.push(['alpha', String(a.alpha)])
  if (a.numVirtualTokens !== null) rows.push(['virtual tokens', String(a.numVirtualTokens)])
  if (a.targetModules.length > 0) rows.push(['target modules', a.targetModulesRegex ? `regex ${a.targetModules[0]}` : a.targetModules.join(', ')])
  rows.push(['tensors', `${w.tensors}: ${formats(w)}`])
  rows.push(['parameters', `${count(w.parameters)} (${w.parameters})`])
  rows.push(['size', bytes(w.fileBytes)])
  rows.push(['base model', [a.baseModel, a.baseModelClass].filter(Boolean).join(', ') || 'not stated'])
  if (c) rows.push([`fits ${c.base}`, c.compatible ? 'yes' : `no: ${c.error!.code}: ${c.error!.message}`])
  return table(rows)
}

/** Loads `base` and tries the adapter on it. A base that fails to load is an error, not an answer. */
async function checkBase(adapterPath: string, base: string, threads: number | undefined): Promise<Compatibility> {
  const rt = await Runtime.load(base, { threads })
  try {
    await rt.loadExpert(adapterPath)
    return { base, compatible: true }
  } catch (e) {
    const err = toError(e)
    return { base, compatible: false, error: { code: err.code, message: err.message } }
  } finally {
    await rt.dispose()
  }
}

export async function inspectCommand(argv: string[]): Promise<void> {
  const p = parseArgs(argv, { values: ['base', 'threads', ...FIT_VALUES], flags: ['json', 'fit'] })
  const path = onePositional(p, 'inspect needs a model or adapter path')
  const base = stringOption(p, 'base')
  const threads = intOption(p, 'threads', 1)
  const json = p.options.has('json')
  const fitting = p.options.has('fit')
  if (!fitting && FIT_VALUES.some((k) => p.options.has(k))) throw new UsageError(`--${FIT_VALUES.find((k) => p.options.has(k))} applies with --fit`)
  try {
    const info = await inspect(path)
    if (info.type === 'model') {
      if (base !== undefined) throw new UsageError('--base applies to adapters; this is a model')
      const fit = fitting ? await estimate(path, p) : undefined
      process.stdout.write((json ? JSON.stringify(fit ? { ...info, fit } : info, null, 2) : describeModel(info, fit)) + '\n')
      return
    }
    if (fitting) throw new UsageError('--fit applies to models; this is an adapter')
    const compatibility = base === undefined ? undefined : await checkBase(path, base, threads)
    process.stdout.write((json ? JSON.stringify(compatibility ? { ...info, compatibility } : info, null, 2) : describeAdapter(info, compatibility)) + '\n')
    if (compatibility && !compatibility.compatible) process.exitCode = 1
  } catch (e) {
    if (e instanceof UsageError) throw e
    const err = e instanceof ExpertRuntimeError ? e : toError(e)
    process.stderr.write(`expert-runtime inspect: ${err.code}: ${err.message}\n`)
    process.exitCode = 1
  }
}
