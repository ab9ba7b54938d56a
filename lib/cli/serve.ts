// `expert-runtime serve <model> [--experts DIR] [--port N] [--host H] [--api-key K] ...`: an
// OpenAI-compatible server for one model (see lib/server).
import { readdirSync, statSync } from 'node:fs'
import { basename, join } from 'node:path'
import { Runtime } from '../runtime'
import { createServer } from '../server'
import { intOption, onePositional, parseArgs, stringOption } from './args'
import { launchedByNpm, watchParent } from './parent'
import { loadProgress } from './progress'

export const USAGE = `usage: expert-runtime serve <model.gguf | model-dir> [options]

  --experts DIR          load every adapter directory under DIR, and allow loading more by name
  --port N               default 8080 (0: any free port)
  --host H               default 127.0.0.1
  --api-key K            require "Authorization: Bearer K" (default: \$EXPERT_RUNTIME_API_KEY, else none)
  --model-name NAME      the base model's id in /v1/models (default: the file or directory name)
  --threads N            engine threads (default: all cores)
  --context-length N     the context length (default: the model's)
  --kv-max-tokens N      positions the KV cache holds over all requests (kvCache.maxTokens)
  --kv-max-bytes N       bytes the KV cache may take (kvCache.maxBytes; with --kv-max-tokens the
                         smaller wins; default: a quarter of RAM, at most 64 full contexts)
  --kv-idle-release-ms N idle that long, the KV cache gives its unused memory back to the OS
                         (kvCache.idleReleaseMs; default 30000; 0: never)
  --max-concurrent N     requests at once before 429 (default 256)
  --max-body-bytes N     largest request body (default 4194304)
  --body-timeout-ms N    a request body must arrive within N ms, else 408 (default 30000; 0: no limit)
  --headers-timeout-ms N request headers must arrive within N ms, else 408 (default 30000; 0: no limit)
  --exit-with-parent     shut down when the launching process exits (on by default under npx / npm)
  --cors [ORIGIN]        send CORS headers (any origin, or ORIGIN)
  --kv-events ENDPOINT   publish the KV cache's events (blocks stored and removed) as vLLM does,
                         on a ZeroMQ PUB socket bound at ENDPOINT (tcp://HOST:PORT), for
                         prefix-aware routers such as llm-d (needs npm zeromq, @msgpack/msgpack)
  --kv-events-topic T    their topic (default kv@<hostname>@<model name>)
  --max-loras N          max_lora in vllm:lora_requests_info (default: the experts loaded)

SIGINT and SIGTERM shut it down gracefully: running requests end (finish_reason "cancelled"),
the model is unloaded, exit code 0.`

function parse(argv: string[]) {
  const p = parseArgs(argv, {
    values: ['experts', 'port', 'host', 'api-key', 'model-name', 'threads', 'context-length', 'kv-max-tokens', 'kv-max-bytes', 'kv-idle-release-ms', 'max-concurrent', 'max-body-bytes', 'body-timeout-ms', 'headers-timeout-ms', 'kv-events', 'kv-events-topic', 'max-loras'],
    flags: ['exit-with-parent'],
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
    kvCache: {
      maxTokens: intOption(p, 'kv-max-tokens', 1),
      maxBytes: intOption(p, 'kv-max-bytes', 1),
      idleReleaseMs: intOption(p, 'kv-idle-release-ms', 0),
    },
    maxConcurrentRequests: intOption(p, 'max-concurrent', 1),
    maxBodyBytes: intOption(p, 'max-body-bytes', 1),
    bodyTimeoutMs: intOption(p, 'body-timeout-ms', 0),
    headersTimeoutMs: intOption(p, 'headers-timeout-ms', 0),
    exitWithParent: p.options.get('exit-with-parent') === true,
    cors: p.options.get('cors'),
    kvEvents: stringOption(p, 'kv-events'),
    kvEventsTopic: stringOption(p, 'kv-events-topic'),
    maxLoras: intOption(p, 'max-loras', 1),
  }
}

export async function serve(argv: string[]): Promise<void> {
  const a = parse(argv)
  // The launcher may be gone with the other ends of our stdout and stderr: a failed write must
  // not turn the shutdown into a crash.
  for (const stream of [process.stdout, process.stderr]) stream.on('error', () => {})
  // Listen first (health says 503 while the model loads), then load.
  const { end, ...progress } = loadProgress(a.model)
  const kvCache = Object.fromEntries(Object.entries(a.kvCache).filter(([, v]) => v !== undefined))
  const loading = Runtime.load(a.model, { threads: a.threads, contextLength: a.contextLength, kvCache, ...progress }).finally(end)
  const server = createServer(loading, {
    apiKey: a.apiKey,
    expertsDir: a.experts,
    modelName: a.modelName,
    maxConcurrentRequests: a.maxConcurrentRequests,
    maxBodyBytes: a.maxBodyBytes,
    bodyTimeoutMs: a.bodyTimeoutMs,
    headersTimeoutMs: a.headersTimeoutMs,
    cors: a.cors,
    maxLoras: a.maxLoras,
    kvEvents: a.kvEvents ? { endpoint: a.kvEvents, topic: a.kvEventsTopic } : undefined,
  })

  // One shutdown, whatever asks for it first (a signal, the launcher's exit, a failed load):
  // stop accepting, end running requests, wait for the load to settle, unload, exit.
  let stopping = false
  const stop = async (why: string, code = 0): Promise<void> => {
    if (stopping) return
    stopping = true
    process.stderr.write(`expert-runtime: ${why}, shutting down\n`)
    try {
      await server.close()
      await (await loading.catch(() => undefined))?.dispose()
    } catch (e) {
      process.stderr.write(`expert-runtime: shutdown: ${(e as Error).message}\n`)
      code = 1
    }
    process.exit(code)
  }
  process.on('SIGINT', () => void stop('SIGINT'))
  process.on('SIGTERM', () => void stop('SIGTERM'))
  // Under npx, npm runs us through `sh -c` and a SIGTERM to npm kills only that shell: see parent.ts.
  if (a.exitWithParent || launchedByNpm()) watchParent((what) => void stop(what))

  const addr = await server.listen(a.port, a.host)
  const url = `http://${addr.family === 'IPv6' ? `[${addr.address}]` : addr.address}:${addr.port}`
  process.stdout.write(`expert-runtime: listening on ${url}/v1 (health: ${url}/health)\n`)

  let rt: Runtime
  try {
    rt = await loading
  } catch (e) {
    return stop(`the model failed to load: ${(e as Error).message}`, 1)
  }
  if (stopping) return
  process.stderr.write(`loaded ${a.modelName} (${rt.info.architecture}, ${rt.info.dtype}, ${rt.info.device})\n`)
  if (server.kvEventsReady) {
    try {
      const p = await server.kvEventsReady
      process.stderr.write(`publishing KV events on ${p.boundEndpoint} (topic ${p.topic})\n`)
    } catch (e) {
      return stop(`KV events: ${(e as Error).message}`, 1)
    }
  }
  if (a.experts) {
    const dirs = readdirSync(a.experts)
      .map((d) => join(a.experts!, d))
      .filter((d) => statSync(d).isDirectory() && statSync(join(d, 'adapter_config.json'), { throwIfNoEntry: false }))
    for (const d of dirs) {
      if (stopping) return
      try {
        const e = await rt.loadExpert(d)
        process.stderr.write(`loaded expert ${e.name} (${e.kind}) from ${d}\n`)
      } catch (err) {
        if (stopping) return
        process.stderr.write(`expert-runtime: skipped ${d}: ${(err as Error).message}\n`)
      }
    }
  }
  if (stopping) return
  process.stdout.write(`expert-runtime: ready (models: ${[a.modelName, ...rt.experts.map((e) => e.name), 'auto'].join(', ')})\n`)
}
