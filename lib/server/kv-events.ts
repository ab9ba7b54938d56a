// KV events over ZeroMQ, as vLLM publishes them for prefix-aware routing (llm-d's KV cache
// indexer; vLLM's `kv_events_subscriber.py` is the reference subscriber):
//
//   a PUB socket bound at `endpoint` (`tcp://HOST:PORT`); each message is three frames:
//   the topic, an 8-byte big-endian sequence number, and a msgpack `EventBatch`:
//   [ts, [event, ...]] with events as tagged arrays:
//     ["BlockStored", [block_hash], parent_block_hash | nil, [token_ids], block_size, lora_id | nil, medium]
//     ["BlockRemoved", [block_hash], medium]
//     ["AllBlocksCleared"]
//
// One topic per server (default `kv@<host>@<model>`). The first batch is AllBlocksCleared:
// whatever an earlier process said on this topic is void. The engine hands events over through a
// bounded queue (`Runtime.startKvEvents`); this publisher drains it every `intervalMs` and
// sends one batch at a time. ZeroMQ's PUB socket drops messages for a subscriber that does not
// keep up (its high-water mark), and a batch that finds the previous send still in flight is
// dropped and counted: neither a slow nor an absent subscriber can stall generation.
import type { Runtime } from '../runtime'
import type { KvEvent } from '../types'

export interface KvEventsOptions {
  /** Where to bind the PUB socket: `tcp://HOST:PORT` (`tcp://*:5557` on every interface). */
  endpoint: string
  /** The topic of every message. Default `kv@<hostname>@<modelName>`. */
  topic?: string
  /** How often the engine's events are drained and sent (ms). Default 20. */
  intervalMs?: number
}

/** Checks `o` (a server option); throws a TypeError naming what is wrong. */
export function checkKvEventsOptions(o: unknown): asserts o is KvEventsOptions {
  if (!o || typeof o !== 'object' || Array.isArray(o)) throw new TypeError('kvEvents must be an object { endpoint, topic?, intervalMs? }')
  const { endpoint, topic, intervalMs } = o as Record<string, unknown>
  if (typeof endpoint !== 'string' || !/^tcp:\/\/[^\s/]+:(\d{1,5}|\*)$/.test(endpoint)) throw new TypeError('kvEvents.endpoint must be tcp://HOST:PORT (PORT * picks a free one)')
  const port = endpoint.slice(endpoint.lastIndexOf(':') + 1)
  if (port !== '*' && !(Number(port) >= 1 && Number(port) <= 65535)) throw new TypeError('kvEvents.endpoint: the port must be 1-65535 or *')
  if (topic !== undefined && (typeof topic !== 'string' || topic.length > 1024)) throw new TypeError('kvEvents.topic must be a string of at most 1024 characters')
  if (intervalMs !== undefined && !(Number.isInteger(intervalMs) && (intervalMs as number) >= 1 && (intervalMs as number) <= 60_000)) {
    throw new TypeError('kvEvents.intervalMs must be an integer from 1 to 60000')
  }
}

type Encoded = [string, ...unknown[]]

function encodeEvent(e: KvEvent): Encoded {
  if (e.type === 'BlockStored') return ['BlockStored', [e.blockHash], e.parentBlockHash, e.tokenIds, e.blockSize, e.loraId, null]
  return ['BlockRemoved', [e.blockHash], null]
}

/** The PUB socket, as used here (zeromq's types are optional at compile time). */
interface PubSocket {
  send(frames: unknown[]): Promise<void>
  close(): void
  readonly lastEndpoint?: string | null
}

/** Publishes a runtime's KV events; `close()` stops it. */
export class KvEventPublisher {
  /** Batches sent, and events dropped here (a send still in flight) besides the engine's own. */
  sent = 0
  dropped = 0
  readonly topic: string
  #socket: PubSocket | undefined
  #timer: NodeJS.Timeout | undefined
  #seq = 0n
  #sending = false
  #encode: ((v: unknown) => Uint8Array) | undefined

  private constructor(
    private readonly rt: Runtime,
    readonly endpoint: string,
    topic: string,
    private readonly intervalMs: number,
  ) {
    this.topic = topic
  }

  /** Binds the socket and starts publishing. Needs the optional packages `zeromq` and `@msgpack/msgpack`. */
  static async start(rt: Runtime, options: KvEventsOptions, modelName: string): Promise<KvEventPublisher> {
    checkKvEventsOptions(options)
    const { hostname } = await import('node:os')
    const topic = options.topic ?? `kv@${hostname()}@${modelName}`
    const p = new KvEventPublisher(rt, options.endpoint, topic, options.intervalMs ?? 20)
    let zmq: typeof import('zeromq')
    let msgpack: typeof import('@msgpack/msgpack')
    try {
      zmq = await import('zeromq')
      msgpack = await import('@msgpack/msgpack')
    } catch (e) {
      throw new Error(`kvEvents needs the optional packages zeromq and @msgpack/msgpack (npm install zeromq @msgpack/msgpack): ${(e as Error).message}`)
    }
    const socket = new zmq.Publisher({ linger: 0, sendHighWaterMark: 1000 })
    await socket.bind(options.endpoint)
    p.#socket = socket as unknown as PubSocket
    p.#encode = (v) => msgpack.encode(v)
    rt.startKvEvents()
    p.#publish([['AllBlocksCleared']])
    p.#timer = setInterval(() => p.#tick(), p.intervalMs)
    p.#timer.unref()
    return p
  }

  /** The bound endpoint (the port chosen, where `:0` was asked). */
  get boundEndpoint(): string {
    return this.#socket?.lastEndpoint ?? this.endpoint
  }

  #tick(): void {
    if (this.rt.disposed) return
    let events: KvEvent[]
    try {
      events = this.rt.takeKvEvents(4096)
    } catch {
      return
    }
    if (events.length > 0) this.#publish(events.map(encodeEvent))
  }

  #publish(events: Encoded[]): void {
    if (!this.#socket || !this.#encode) return
    if (this.#sending) {
      this.dropped += events.length
      return
    }
    const seq = Buffer.alloc(8)
    seq.writeBigUInt64BE(this.#seq++)
    const payload = this.#encode([Date.now() / 1000, events])
    this.#sending = true
    this.#socket
      .send([this.topic, seq, payload])
      .then(() => this.sent++)
      .catch(() => (this.dropped += events.length))
      .finally(() => (this.#sending = false))
  }

  /** Stops publishing and closes the socket. */
  close(): void {
    clearInterval(this.#timer)
    this.#socket?.close()
    this.#socket = undefined
  }
}
