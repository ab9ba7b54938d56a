// `expert-runtime pull <org/repo>[:file] [--revision R] [--cache DIR] [--offline] [--quiet]`:
// downloads a model from the Hugging Face Hub into the cache (lib/hub) and prints its local path
// on stdout; progress goes to stderr (one updating line on a terminal, a line per 10% otherwise).
import { ExpertRuntimeError } from '../errors'
import { fetchModel, parsePullSpec } from '../hub'
import type { DownloadProgress } from '../types'
import { intOption, parseArgs, stringOption, UsageError } from './args'

export const USAGE = `usage: expert-runtime pull <org/repo>[:file] [options]

Downloads a model from the Hugging Face Hub into the cache and prints its local path.

  org/repo               a model: config.json, tokenizer and safetensors (or the repo's only GGUF file)
  org/repo:FILE          one file, e.g. org/repo:model-Q4_K_M.gguf (also org/repo/FILE, hf:org/repo/FILE)
  org/repo@REV[:FILE]    at a branch, tag or commit

  --revision R           the branch, tag or commit (default main)
  --cache DIR            the download cache (default \$EXPERT_RUNTIME_CACHE/hub, else ~/.cache/expert-runtime/hub)
  --offline              use only the cache (as EXPERT_RUNTIME_OFFLINE=1 or HF_HUB_OFFLINE=1)
  --timeout-ms N         cut a connection silent this long (default 30000)
  --quiet                no progress on stderr

Environment: HF_TOKEN (private and gated repositories), HF_ENDPOINT (a mirror; default
https://huggingface.co). See docs/models.md.`

function parse(argv: string[]) {
  const p = parseArgs(argv, { values: ['revision', 'cache', 'timeout-ms'], flags: ['offline', 'quiet'] })
  const [spec, ...extra] = p.positional
  if (!spec) throw new UsageError('pull needs a model (org/repo or org/repo:file)')
  if (extra.length > 0) throw new UsageError(`unexpected argument '${extra[0]}'`)
  let ref
  try {
    ref = parsePullSpec(spec, stringOption(p, 'revision'))
  } catch (e) {
    throw new UsageError((e as Error).message)
  }
  return {
    ref,
    cacheDir: stringOption(p, 'cache'),
    offline: p.options.has('offline') ? true : undefined,
    timeoutMs: intOption(p, 'timeout-ms', 1),
    quiet: p.options.has('quiet'),
  }
}

const MB = 1024 * 1024
const mb = (n: number) => (n / MB).toFixed(1)

/** Progress on stderr: redrawn in place (at most ~10 times a second) on a terminal, every 10% otherwise. */
export function progressPrinter(label: string) {
  const tty = process.stderr.isTTY === true
  let lastDraw = 0
  let lastTenth = -1
  let drawn = false
  const started = Date.now()
  const update = ({ loadedBytes, totalBytes, file }: DownloadProgress) => {
    const fraction = totalBytes > 0 ? Math.min(1, loadedBytes / totalBytes) : 0
    const pct = Math.floor(fraction * 100)
    if (tty) {
      const now = Date.now()
      if (now - lastDraw < 100 && loadedBytes < totalBytes) return
      lastDraw = now
      const width = 24
      const filled = Math.round(fraction * width)
      const seconds = Math.max((now - started) / 1000, 0.001)
      const bar = `[${'#'.repeat(filled)}${'.'.repeat(width - filled)}]`
      process.stderr.write(`\r${bar} ${String(pct).padStart(3)}% ${mb(loadedBytes)}/${mb(totalBytes)} MB ${mb(loadedBytes / seconds)} MB/s ${file}\x1b[K`)
      drawn = true
    } else {
      const tenth = Math.floor(pct / 10)
      if (tenth === lastTenth) return
      lastTenth = tenth
      process.stderr.write(`pull ${label}: ${pct}% (${mb(loadedBytes)} of ${mb(totalBytes)} MB)\n`)
    }
  }
  const end = () => {
    if (drawn) process.stderr.write('\n')
    drawn = false
  }
  return { update, end }
}

export async function pull(argv: string[]): Promise<void> {
  const a = parse(argv)
  const label = `${a.ref.repo}${a.ref.file ? `:${a.ref.file}` : ''}`
  const progress = a.quiet ? undefined : progressPrinter(label)
  try {
    const path = await fetchModel(a.ref, { cacheDir: a.cacheDir, offline: a.offline, timeoutMs: a.timeoutMs }, progress?.update)
    progress?.end()
    process.stdout.write(path + '\n')
  } catch (e) {
    progress?.end()
    if (!(e instanceof ExpertRuntimeError)) throw e
    process.stderr.write(`expert-runtime pull: ${e.message} (${e.code})\n`)
    process.exitCode = 1
  }
}
