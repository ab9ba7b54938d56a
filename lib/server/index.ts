import { createServer as createHttpServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import type { Runtime } from '../runtime'
import { Gauge } from 'prom-client'
import { createHandler, type OpenAIHandler, type ServerOptions } from './handler'
import { KvEventPublisher, checkKvEventsOptions } from './kv-events'

export type { OpenAIHandler, ServerOptions } from './handler'
export type { KvEventsOptions } from './kv-events'

/**
 * A `(req, res)` handler serving the OpenAI API (`/v1/chat/completions`, `/v1/completions`,
 * `/v1/embeddings`, `/v1/models`, `/v1/experts`) plus `/metrics` and `/health` for `runtime`,
 * for express (`app.use('/llm', openaiHandler(rt))`) or any node:http server.
 */
export function openaiHandler(runtime: Runtime | Promise<Runtime>, options?: ServerOptions): OpenAIHandler {
  return createHandler(runtime, options)
}

/** An HTTP server (node:http underneath) around {@link openaiHandler}. */
export class OpenAIServer {
  readonly http: Server
  readonly handler: OpenAIHandler
  /** The KV events publisher (`kvEvents`), once `listen` started it. */
  kvEvents: KvEventPublisher | undefined
  readonly #runtime: Runtime | Promise<Runtime>
  readonly #options: ServerOptions
  constructor(runtime: Runtime | Promise<Runtime>, options?: ServerOptions) {
    if (options?.kvEvents !== undefined) checkKvEventsOptions(options.kvEvents)
    this.handler = createHandler(runtime, options)
    this.#runtime = runtime
    this.#options = options ?? {}
    const headersTimeout = options?.headersTimeoutMs ?? 30_000
    const bodyTimeout = options?.bodyTimeoutMs ?? 30_000
    if (!(Number.isSafeInteger(headersTimeout) && headersTimeout >= 0)) throw new TypeError('headersTimeoutMs must be a non-negative integer')
    // Slow clients cannot hold a connection forever before sending their request: node:http
    // answers headers that take too long with 408 and closes the connection. The handler
    // bounds the body itself (bodyTimeoutMs); node's requestTimeout, a little beyond both, is
    // the backstop for a body the handler does not read (a route that needs none). Node checks
    // both every connectionsCheckingInterval, so that is kept well under the headers limit.
    this.http = createHttpServer(
      {
        headersTimeout,
        requestTimeout: headersTimeout > 0 && bodyTimeout > 0 ? headersTimeout + bodyTimeout + 1000 : 0,
        connectionsCheckingInterval: headersTimeout > 0 ? Math.min(30_000, Math.max(50, Math.floor(headersTimeout / 4))) : 30_000,
      },
      this.handler,
    )
  }

  /**
   * The KV events publisher (`kvEvents`) once bound: `listen` starts it as soon as the runtime
   * has loaded (the HTTP side serves `/health` meanwhile); rejects when the socket cannot be
   * bound.
   */
  kvEventsReady: Promise<KvEventPublisher> | undefined

  #startKvEvents(): void {
    const kv = this.#options.kvEvents
    if (!kv || this.kvEventsReady) return
    this.kvEventsReady = (async () => {
      const rt = await this.#runtime
      const publisher = await KvEventPublisher.start(rt, kv, this.#options.modelName ?? 'base')
      if (this.#closed) {
        publisher.close()
        throw new Error('the server closed before the KV events socket was bound')
      }
      this.kvEvents = publisher
      new Gauge({
        name: 'expert_runtime_kv_events_dropped',
        help: 'KV events dropped because the publisher or its subscribers fell behind (since the server started)',
        registers: [this.handler.metrics.registry],
        collect() {
          let engine = 0
          try {
            engine = rt.stats().kvEventsDropped
          } catch {
            /* disposed */
          }
          this.set(engine + publisher.dropped)
        },
      })
      return publisher
    })()
    // Whoever awaits it sees the error; an unobserved failure must not crash the process.
    this.kvEventsReady.catch(() => {})
  }

  #closed = false

  /**
   * Starts listening; resolves with the address (port 0 picks a free one). With `kvEvents`,
   * also starts binding the KV events socket (`kvEventsReady`).
   */
  listen(port = 8080, host = '127.0.0.1'): Promise<AddressInfo> {
    this.#startKvEvents()
    return new Promise((resolve, reject) => {
      this.http.once('error', reject)
      this.http.listen(port, host, () => {
        this.http.off('error', reject)
        resolve(this.http.address() as AddressInfo)
      })
    })
  }

  get address(): AddressInfo | null {
    return (this.http.address() as AddressInfo | null) ?? null
  }

  /**
   * Stops accepting connections, ends running streams (finish_reason `cancelled`, then
   * `[DONE]`), and closes every connection; a client still sending its request body after
   * `graceMs` is cut off.
   */
  async close(graceMs = 5000): Promise<void> {
    const stopped = new Promise<void>((resolve) => this.http.close(() => resolve()))
    this.http.closeIdleConnections()
    // Requests still sending their body after the grace period lose their connection.
    const timer = setTimeout(() => this.http.closeAllConnections(), graceMs)
    try {
      await this.handler.close()
    } finally {
      clearTimeout(timer)
    }
    this.http.closeAllConnections()
    this.#closed = true
    this.kvEvents?.close()
    await stopped
  }
}

/** `createServer(rt, options)`: see {@link OpenAIServer}. */
export function createServer(runtime: Runtime | Promise<Runtime>, options?: ServerOptions): OpenAIServer {
  return new OpenAIServer(runtime, options)
}
