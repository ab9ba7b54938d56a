// `expert-runtime serve <model> [--experts DIR] [--port N] [--host H] [--api-key K] ...`: an
// OpenAI-compatible server for one model (see lib/server).
import { readdirSync, statSync } from 'node:fs'
import { basename, join } from 'node:path'
import { Runtime } from '../runtime'
import { createServer } from '../server'
import { intOption, onePositional, parseArgs, stringOption } from './args'
import { loadProgress } from './progress'

export const USAGE = `usage: expert-runtime serve <model.gguf | model-dir> [options]

  --experts DIR          load every adapter directory under DIR, and allow loading more by name
  --port N               default 8080 (0: any free port)
  --host H               default 127.0.0.1
  --api-key K            require "Authorization: Bearer K" (default: \$EXPERT_RUNTIME_API_KEY, else none)
  --model-name NAME      the base model's id in /v1/models (default: the file or directory name)
  --threads N            engine threads (default: all cores)
  --context-length N     the context length (default: the model's)
  --max-concurrent N     requests at once before 429 (default 256)
  --max-body-bytes N     largest request body (default 4194304)
  --cors [ORIGIN]        send CORS headers (any origin, or ORIGIN)`

function parse(argv: string[]) {
  const p = parseArgs(argv, {
    values: ['experts', 'port', 'host', 'api-key', 'model-name', 'threads', 'context-length', 'max-concurrent', 'max-body-bytes'],
    optionalValue: ['cors'],
  })
  const model = onePositional(p, 'serve needs a model path')
  return {
    model,
    experts: stringOption(p, 'experts'),
    port: intOption(p, 'port', 0) ?? 8080,
    host: stringOption(p, 'host') ?? '127.0.0.1',
    apiKey: stringOption(p, 'api-key') ?? process.env.EXPERT_RUNTIME_API_KEY ?? undefined,
    modelName: stringOption(p, 'model-name') ?? basename(model).replace(/\.gguf$/i, ''),
    threads: intOption(p, 'threads', 1),
    contextLength: intOption(p, 'context-length', 1),
    maxConcurrentRequests: intOption(p, 'max-concurrent', 1),
    maxBodyBytes: intOption(p, 'max-body-bytes', 1),
    cors: p.options.get('cors'),
  }
}

export async function serve(argv: string[]): Promise<void> {
  const a = parse(argv)
  // Listen first (health says 503 while the model loads), then load.
  const { end, ...progress } = loadProgress(a.model)
  const loading = Runtime.load(a.model, { threads: a.threads, contextLength: a.contextLength, ...progress }).finally(end)
  const server = createServer(loading, {
    apiKey: a.apiKey,
    expertsDir: a.experts,
    modelName: a.modelName,
    maxConcurrentRequests: a.maxConcurrentRequests,
    maxBodyBytes: a.maxBodyBytes,
    cors: a.cors,
  })
  const addr = await server.listen(a.port, a.host)
  const url = `http://${addr.family === 'IPv6' ? `[${addr.address}]` : addr.address}:${addr.port}`
  process.stdout.write(`expert-runtime: listening on ${url}/v1 (health: ${url}/health)\n`)

  let stopping = false
  const stop = async (signal: string) => {
    if (stopping) return
    stopping = true
    process.stderr.write(`expert-runtime: ${signal}, shutting down\n`)
    await server.close()
    await (await loading.catch(() => undefined))?.dispose()
    process.exit(0)
  }
  process.on('SIGINT', () => void stop('SIGINT'))
  process.on('SIGTERM', () => void stop('SIGTERM'))

  let rt: Runtime
  try {
    rt = await loading
  } catch (e) {
    process.stderr.write(`expert-runtime: the model failed to load: ${(e as Error).message}\n`)
    await server.close()
    process.exit(1)
  }
  process.stderr.write(`loaded ${a.modelName} (${rt.info.architecture}, ${rt.info.dtype}, ${rt.info.device})\n`)
  if (a.experts) {
    const dirs = readdirSync(a.experts)
      .map((d) => join(a.experts!, d))
      .filter((d) => statSync(d).isDirectory() && statSync(join(d, 'adapter_config.json'), { throwIfNoEntry: false }))
    for (const d of dirs) {
      try {
        const e = await rt.loadExpert(d)
        process.stderr.write(`loaded expert ${e.name} (${e.kind}) from ${d}\n`)
      } catch (err) {
        process.stderr.write(`expert-runtime: skipped ${d}: ${(err as Error).message}\n`)
      }
    }
  }
  process.stdout.write(`expert-runtime: ready (models: ${[a.modelName, ...rt.experts.map((e) => e.name), 'auto'].join(', ')})\n`)
}
