// `expert-runtime pull <org/repo>[:file] [--revision R] [--cache DIR] [--offline] [--quiet]`:
// downloads a model from the Hugging Face Hub into the cache (lib/hub) and prints its local path
// on stdout; progress goes to stderr (one updating line on a terminal, a line per 10% otherwise).
import { ExpertRuntimeError } from '../errors'
import { fetchModel, parsePullSpec } from '../hub'
import { intOption, onePositional, parseArgs, stringOption, UsageError } from './args'
import { progressPrinter } from './progress'

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
  const spec = onePositional(p, 'pull needs a model (org/repo or org/repo:file)')
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
