import { createHash, timingSafeEqual } from 'node:crypto'
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Runtime } from '../runtime'
import type { GenerationStream } from '../session'
import { readJson } from './body'
import { chatCompletions } from './chat'
import { completions } from './completions'
import type { Context } from './context'
import { embeddings } from './embeddings'
import { HttpError, badRequest, errorBody, notFound, toHttpError } from './errors'
import { loadExpert, unloadExpert } from './experts'
import { runGeneration } from './generation'
import { Metrics } from './metrics'
import { registerVllmMetrics } from './vllm-metrics'
import { detokenize, loadLoraAdapter, tokenize, unloadLoraAdapter } from './vllm'
import { listModels, selectModel } from './models'

export interface ServerOptions {
  /** Clients must send `Authorization: Bearer <apiKey>` for `/v1/*` (compared in constant time). */
  apiKey?: string
  /** Larger request bodies get 413. Default 4 MiB. */
  maxBodyBytes?: number
  /**
   * Generation and embedding requests running at once; more get 429. Default 256. A request
   * takes its slot once its body has arrived: one still sending its body holds none.
   */
  maxConcurrentRequests?: number
  /**
   * A request body (after the headers) must arrive in full within this many milliseconds, or
   * the request gets 408 and its connection is closed. `0`: no limit. Default 30000. The
   * handler enforces it itself, wherever it is mounted.
   */
  bodyTimeoutMs?: number
  /**
   * `OpenAIServer` only (a server you mount the handler in keeps its own): a client must send
   * the request's headers within this many milliseconds, or gets 408 and its connection is
   * closed (node:http's `headersTimeout`). `0`: no limit. Default 30000.
   */
  headersTimeoutMs?: number
  /** Enables `POST /v1/experts {name}` (loads `expertsDir/name`) and `DELETE /v1/experts/:name`. */
  expertsDir?: string
  /** CORS: `true` allows any origin, a string that origin. Default: no CORS headers. */
  cors?: boolean | string
  /** The base model's id in `/v1/models` and `model`. Default `'base'`. */
  modelName?: string
  /**
   * `max_lora` of the `vllm:lora_requests_info` series (the inference gateway's LoRA
   * affinity reads it): how many experts the server offers to run at once. Default: the
   * number loaded (every loaded expert can run in one batch).
   */
  maxLoras?: number
  /**
   * `OpenAIServer` only: publishes the KV cache's events (blocks stored and removed) over
   * ZeroMQ as vLLM does, for prefix-aware routers (llm-d): `{ endpoint: 'tcp://HOST:PORT',
   * topic?, intervalMs? }`. Needs the optional packages `zeromq` and `@msgpack/msgpack`.
   */
  kvEvents?: import('./kv-events').KvEventsOptions
}

/** A `(req, res)` handler serving the OpenAI API for one runtime, with its metrics and shutdown. */
export interface OpenAIHandler {
  (req: IncomingMessage, res: ServerResponse, next?: (err?: unknown) => void): void
  readonly metrics: Metrics
  /** Refuses new requests (503), cancels running ones and waits until every one has ended. */
  close(): Promise<void>
}

const ENDPOINTS = new Set(['/v1/chat/completions', '/v1/completions', '/v1/embeddings', '/v1/models', '/v1/experts', '/metrics', '/health', '/v1/load_lora_adapter', '/v1/unload_lora_adapter', '/tokenize', '/detokenize'])

/** Builds the handler; `runtime` may still be loading (requests get 503 until it resolves). */
export function createHandler(runtime: Runtime | Promise<Runtime>, options: ServerOptions = {}): OpenAIHandler {
  const maxBody = options.maxBodyBytes ?? 4 << 20
  const maxConcurrent = options.maxConcurrentRequests ?? 256
  const bodyTimeout = options.bodyTimeoutMs ?? 30_000
  if (!(Number.isSafeInteger(maxBody) && maxBody > 0)) throw new TypeError('maxBodyBytes must be a positive integer')
  if (!(Number.isSafeInteger(bodyTimeout) && bodyTimeout >= 0)) throw new TypeError('bodyTimeoutMs must be a non-negative integer')
  if (!(Number.isSafeInteger(maxConcurrent) && maxConcurrent > 0)) throw new TypeError('maxConcurrentRequests must be a positive integer')
  if (options.maxLoras !== undefined && !(Number.isSafeInteger(options.maxLoras) && options.maxLoras > 0)) throw new TypeError('maxLoras must be a positive integer')
  if (options.apiKey !== undefined && (typeof options.apiKey !== 'string' || options.apiKey.length === 0)) throw new TypeError('apiKey must be a non-empty string')
  const keyHash = options.apiKey === undefined ? null : createHash('sha256').update(options.apiKey).digest()
  const baseId = options.modelName ?? 'base'
  const created = Math.floor(Date.now() / 1000)

  let rt: Runtime | undefined
  let loadError: unknown
  if (runtime instanceof Promise) runtime.then((r) => (rt = r), (e) => (loadError = e))
  else rt = runtime
  const metrics = new Metrics(() => rt)
  registerVllmMetrics(metrics.registry, () => metrics.snapshot(), { modelName: baseId, maxLoras: options.maxLoras })
  const streams = new Set<GenerationStream>()
  const inFlight = new Set<Promise<void>>()
  let running = 0
  let closing = false

  const cors = options.cors === true ? '*' : typeof options.cors === 'string' ? options.cors : null
  const headers = (extra: Record<string, string> = {}) => ({
    ...(cors
      ? {
          'access-control-allow-origin': cors,
          'access-control-allow-headers': 'authorization, content-type',
          'access-control-allow-methods': 'GET, POST, DELETE, OPTIONS',
          // A browser shows a script only the headers listed here (besides the standard few).
          'access-control-expose-headers': 'x-expert-runtime-experts',
        }
      : {}),
    ...extra,
  })
  const json = (res: ServerResponse, status: number, body: unknown, extra: Record<string, string> = {}) => {
    if (res.headersSent) return
    const text = JSON.stringify(body)
    res.writeHead(status, headers({ 'content-type': 'application/json; charset=utf-8', 'content-length': String(Buffer.byteLength(text)), ...extra }))
    res.end(text)
  }
  const authorized = (req: IncomingMessage) => {
    if (!keyHash) return true
    const h = req.headers.authorization
    const m = typeof h === 'string' ? /^Bearer (.+)$/i.exec(h) : null
    return !!m && timingSafeEqual(createHash('sha256').update(m[1]).digest(), keyHash)
  }

  const track = (s: GenerationStream) => {
    streams.add(s)
    if (closing) s.cancel()
    return () => void streams.delete(s)
  }

  /** A request's `model` as a metrics label: only names the server serves (bounded cardinality). */
  const modelLabel = (model: unknown): string => {
    if (model === undefined || model === null) return baseId
    if (typeof model !== 'string' || model.length > 128) return 'other'
    try {
      selectModel(rt!, baseId, model)
      return model
    } catch {
      return 'other'
    }
  }

  /** Serves one request; sets `label.model` once the request's model is known. */
  async function serve(req: IncomingMessage, res: ServerResponse, path: string, label: { model: string }): Promise<void> {
    const method = req.method ?? 'GET'
    if (method === 'OPTIONS' && cors) {
      res.writeHead(204, headers())
      res.end()
      return
    }
    if (path === '/health') {
      const ok = rt && !closing && !rt.disposed
      json(res, ok ? 200 : 503, { status: ok ? 'ok' : loadError ? 'failed' : closing ? 'closing' : 'loading' })
      return
    }
    if (closing) throw shuttingDown()
    if (!rt) throw new HttpError(503, loadError ? `the model failed to load: ${(loadError as Error).message}` : 'the model is still loading', 'server_error')
    if (path === '/metrics') {
      if (method !== 'GET') throw methodNotAllowed(method, path)
      const text = await metrics.registry.metrics()
      res.writeHead(200, headers({ 'content-type': metrics.registry.contentType }))
      res.end(text)
      return
    }
    const vllmRoot = path === '/tokenize' || path === '/detokenize'
    if (!path.startsWith('/v1/') && !vllmRoot) throw notFound(`no route ${method} ${path}`)
    if (!authorized(req)) throw new HttpError(401, 'Incorrect or missing API key (Authorization: Bearer <key>)', 'invalid_request_error', null, 'invalid_api_key')
    const ctx: Context = {
      rt,
      baseId,
      metrics,
      select: (m) => selectModel(rt!, baseId, m),
      track,
      json,
      headers,
      generate: (input, opts, r, onChunk) => runGeneration(rt!, input, opts, r, metrics, track, onChunk),
    }
    if (path === '/v1/models') {
      if (method !== 'GET') throw methodNotAllowed(method, path)
      json(res, 200, listModels(rt, baseId, created))
      return
    }
    if (vllmRoot || path === '/v1/load_lora_adapter' || path === '/v1/unload_lora_adapter') {
      if (method !== 'POST') throw methodNotAllowed(method, path)
      if (path.includes('lora') && !options.expertsDir) throw notFound('expert management is off (the server has no expertsDir)')
      const body = await readJson(req, maxBody, bodyTimeout)
      if (path === '/tokenize') await tokenize(ctx, body, res)
      else if (path === '/detokenize') await detokenize(ctx, body, res)
      else if (path === '/v1/load_lora_adapter') await loadLoraAdapter(ctx, options.expertsDir!, body, res)
      else await unloadLoraAdapter(ctx, body, res)
      return
    }
    if (path.startsWith('/v1/experts')) {
      if (!options.expertsDir) throw notFound('expert management is off (the server has no expertsDir)')
      if (path === '/v1/experts' && method === 'POST') await loadExpert(ctx, options.expertsDir, await readJson(req, maxBody, bodyTimeout), res)
      else if (path.startsWith('/v1/experts/') && method === 'DELETE') await unloadExpert(ctx, decodeSegment(path.slice('/v1/experts/'.length)), res)
      else if (path === '/v1/experts' && method === 'GET') json(res, 200, { object: 'list', data: rt.experts.map((e) => ({ id: e.name, object: 'expert', kind: e.kind })) })
      else throw methodNotAllowed(method, path)
      return
    }
    const run = path === '/v1/chat/completions' ? chatCompletions : path === '/v1/completions' ? completions : path === '/v1/embeddings' ? embeddings : null
    if (!run) throw notFound(`no route ${method} ${path}`)
    if (method !== 'POST') throw methodNotAllowed(method, path)
    // Full already: answered without reading the body. Otherwise the body is read first and
    // holds no slot meanwhile (bodyTimeoutMs bounds it), so clients that stall their bodies
    // cannot starve the others; the slot is taken once the request can run.
    if (running >= maxConcurrent) throw tooMany(maxConcurrent)
    const body = await readJson(req, maxBody, bodyTimeout)
    label.model = modelLabel(body.model)
    if (closing) throw shuttingDown()
    if (running >= maxConcurrent) throw tooMany(maxConcurrent)
    running++
    try {
      await run(ctx, body, res, typeof body.model === 'string' ? body.model : baseId)
    } finally {
      running--
    }
  }

  const handler = ((req: IncomingMessage, res: ServerResponse) => {
    const started = performance.now()
    let path = '/'
    try {
      path = new URL(req.url ?? '/', 'http://x').pathname.replace(/\/+$/, '') || '/'
    } catch {
      /* a malformed URL: 404 below */
    }
    // Failed requests are counted under the endpoint they hit too (and their model, once read).
    const label = { endpoint: path.startsWith('/v1/experts/') ? '/v1/experts/:name' : ENDPOINTS.has(path) ? path : 'other', model: '' }
    const done = (async () => {
      try {
        await serve(req, res, path, label)
      } catch (e) {
        const err = toHttpError(e)
        // A body too large or too slow is not read to its end: the connection closes after the answer.
        if ((err.status === 413 || err.status === 408) && !res.headersSent) res.setHeader('connection', 'close')
        if (!res.headersSent) json(res, err.status, errorBody(err))
        else if (!res.writableEnded) {
          // Mid-stream: the error as a last event, then the end of the stream.
          res.write(`data: ${JSON.stringify(errorBody(err))}\n\n`)
          res.end()
        }
      } finally {
        metrics.requests.inc({ endpoint: label.endpoint, model: label.model, status: String(res.statusCode) })
        metrics.e2e.observe((performance.now() - started) / 1e3)
      }
    })()
    inFlight.add(done)
    void done.finally(() => inFlight.delete(done))
  }) as OpenAIHandler
  Object.defineProperty(handler, 'metrics', { value: metrics })
  Object.defineProperty(handler, 'close', {
    value: async () => {
      closing = true
      for (const s of streams) s.cancel()
      await Promise.allSettled([...inFlight])
    },
  })
  return handler
}

const tooMany = (max: number) => new HttpError(429, `too many requests at once (maxConcurrentRequests ${max})`, 'rate_limit_exceeded', null, 'rate_limit_exceeded')

const shuttingDown = () => new HttpError(503, 'the server is shutting down', 'server_error')

/** A percent-encoded path segment, decoded; malformed encoding (`%ZZ`, a cut UTF-8 sequence) is a 400. */
function decodeSegment(segment: string): string {
  try {
    return decodeURIComponent(segment)
  } catch {
    const shown = segment.length > 80 ? `${segment.slice(0, 80)}…` : segment
    throw badRequest(`the path segment '${shown}' is not valid percent-encoding`)
  }
}

const methodNotAllowed = (method: string, path: string) => new HttpError(405, `${method} is not allowed on ${path}`, 'invalid_request_error', null, 'method_not_allowed')
