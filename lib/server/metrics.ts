import { Counter, Gauge, Histogram, Registry } from 'prom-client'
import type { Runtime } from '../runtime'
import type { RuntimeStats } from '../types'

/** What one scrape reads of the runtime. */
export interface ScrapeSnapshot {
  stats: RuntimeStats
  /** Experts loaded. */
  experts: number
}

/** The server's Prometheus metrics (`GET /metrics`), in a registry of its own. */
export class Metrics {
  readonly registry = new Registry()
  readonly requests = new Counter({
    name: 'expert_runtime_http_requests_total',
    help: 'HTTP requests answered, by endpoint, model and status',
    labelNames: ['endpoint', 'model', 'status'] as const,
    registers: [this.registry],
  })
  readonly promptTokens = new Counter({ name: 'expert_runtime_prompt_tokens_total', help: 'Prompt tokens of finished requests', registers: [this.registry] })
  readonly cachedPromptTokens = new Counter({
    name: 'expert_runtime_cached_prompt_tokens_total',
    help: 'Prompt tokens served from the KV cache (not evaluated)',
    registers: [this.registry],
  })
  readonly completionTokens = new Counter({ name: 'expert_runtime_completion_tokens_total', help: 'Generated tokens', registers: [this.registry] })
  readonly ttft = new Histogram({
    name: 'expert_runtime_time_to_first_token_seconds',
    help: 'From the request to its first token',
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
    registers: [this.registry],
  })
  readonly itl = new Histogram({
    name: 'expert_runtime_inter_token_latency_seconds',
    help: 'Between consecutive tokens of a request',
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1],
    registers: [this.registry],
  })
  readonly e2e = new Histogram({
    name: 'expert_runtime_e2e_request_latency_seconds',
    help: 'From the request to its last byte',
    buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120],
    registers: [this.registry],
  })

  #cached: ScrapeSnapshot | undefined

  /**
   * The runtime's counters for the scrape under way: read once (one `stats()` for every
   * series; prom-client collects all of a scrape's series within one task) and forgotten
   * after it. `undefined` while loading or once disposed (the series keep their last values).
   */
  snapshot(): ScrapeSnapshot | undefined {
    if (this.#cached) return this.#cached
    const rt = this.runtime()
    if (!rt) return undefined
    try {
      this.#cached = { stats: rt.stats(), experts: rt.experts.length }
    } catch {
      return undefined
    }
    setImmediate(() => (this.#cached = undefined))
    return this.#cached
  }

  constructor(private readonly runtime: () => Runtime | undefined) {
    const snapshot = () => this.snapshot()
    const stat = (name: string, help: string, read: (s: RuntimeStats, experts: number) => number) =>
      new Gauge({
        name,
        help,
        registers: [this.registry],
        collect() {
          const r = snapshot()
          if (r) this.set(read(r.stats, r.experts))
        },
      })
    stat('expert_runtime_running_requests', 'Requests holding KV blocks and running', (s) => s.activeRequests)
    stat('expert_runtime_queued_requests', 'Requests waiting for KV blocks', (s) => s.queuedRequests)
    stat('expert_runtime_kv_blocks_used', 'KV blocks held by sessions', (s) => s.kvBlocksUsed)
    stat('expert_runtime_kv_blocks_total', 'KV blocks in the pool', (s) => s.kvBlocksTotal)
    stat('expert_runtime_kv_blocks_cached', 'Free KV blocks kept for prefix reuse', (s) => s.kvBlocksCached)
    stat('expert_runtime_kv_blocks_touched', 'KV blocks whose memory is resident (on CPU: committed)', (s) => s.kvBlocksTouched)
    stat('expert_runtime_kv_blocks_released', 'KV blocks whose memory went back to the OS after idle periods (since load)', (s) => s.kvBlocksReleased)
    stat('expert_runtime_kv_blocks_behind_window', 'KV blocks sliding-window layers gave back as their sequences moved past them (since load)', (s) => s.kvBlocksBehindWindow)
    stat('expert_runtime_kv_bytes_per_token', 'KV cache bytes per token of context', (s) => s.kvBytesPerToken)
    stat('expert_runtime_kv_state_slots_used', 'Recurrent-state slots held by sessions (models with recurrent layers)', (s) => s.kvStateSlotsUsed)
    stat('expert_runtime_kv_state_bytes', 'Bytes of recurrent state held by sessions', (s) => s.kvStateBytes)
    stat('expert_runtime_prefix_cache_hit_tokens', 'Prompt tokens served from shared prefix blocks (since load)', (s) => s.prefixCacheHitTokens)
    stat('expert_runtime_evicted_blocks', 'KV blocks taken from idle sessions (since load)', (s) => s.evictedBlocks)
    stat('expert_runtime_loaded_experts', 'Experts resident', (_s, experts) => experts)
  }
}
