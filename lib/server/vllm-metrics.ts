// The metrics the inference gateway's Endpoint Picker (gateway-api-inference-extension, its
// Model Server Protocol) scrapes, under vLLM's names, beside our own on `/metrics`:
//
//   vllm:num_requests_waiting   gauge  requests waiting for KV room
//   vllm:num_requests_running   gauge  requests holding KV blocks and running
//   vllm:kv_cache_usage_perc    gauge  KV blocks in use / blocks in the pool: a 0–1 fraction
//   vllm:lora_requests_info     gauge  value: the Unix time (s) of the last change; labels
//                                      max_lora, running_lora_adapters and
//                                      waiting_lora_adapters (comma lists of expert names)
//   vllm:cache_config_info      gauge  1; labels block_size and num_gpu_blocks (the pool's,
//                                      on a CPU too)
//
// The picker scrapes every 50 ms: a scrape reads the engine's counters once for every series,
// ours included (`Metrics.snapshot`), and never waits for the engine thread.
import { Gauge, type Registry } from 'prom-client'
import type { RuntimeStats } from '../types'
import type { ScrapeSnapshot } from './metrics'

export interface VllmMetricsOptions {
  /** The `model_name` label (the base model's id). */
  modelName: string
  /**
   * `max_lora`: how many experts the server offers to run at once. Every loaded expert can
   * run in one batch, so by default the number loaded (at least 1).
   */
  maxLoras?: number
}

/** Registers the vLLM-named series in `registry`, read from the scrape's `snapshot`. */
export function registerVllmMetrics(registry: Registry, snapshot: () => ScrapeSnapshot | undefined, options: VllmMetricsOptions): void {
  const read = snapshot
  const model = { model_name: options.modelName }
  const gauge = (name: string, help: string, value: (s: RuntimeStats) => number) =>
    new Gauge({
      name,
      help,
      labelNames: ['model_name'] as const,
      registers: [registry],
      collect() {
        const r = read()
        if (r) this.set(model, value(r.stats))
      },
    })
  gauge('vllm:num_requests_waiting', 'Requests waiting for KV cache room', (s) => s.queuedRequests)
  gauge('vllm:num_requests_running', 'Requests holding KV blocks and running', (s) => s.activeRequests - s.queuedRequests)
  gauge('vllm:kv_cache_usage_perc', 'KV cache usage: blocks in use over blocks in the pool (1 = full)', (s) =>
    s.kvBlocksTotal > 0 ? Math.min(1, s.kvBlocksUsed / s.kvBlocksTotal) : 0,
  )

  // The LoRA series has one label set at a time: a change replaces the series, and its value
  // says when that happened.
  let last = ''
  let since = Date.now() / 1000
  new Gauge({
    name: 'vllm:lora_requests_info',
    help: 'Experts (LoRA adapters) of running and waiting requests; the value is the Unix time of the last change',
    labelNames: ['max_lora', 'running_lora_adapters', 'waiting_lora_adapters'] as const,
    registers: [registry],
    collect() {
      const r = read()
      if (!r) return
      const labels = {
        max_lora: String(options.maxLoras ?? Math.max(1, r.experts)),
        running_lora_adapters: r.stats.runningExperts.join(','),
        waiting_lora_adapters: r.stats.waitingExperts.join(','),
      }
      const key = `${labels.max_lora}\n${labels.running_lora_adapters}\n${labels.waiting_lora_adapters}`
      if (key !== last) {
        last = key
        since = Date.now() / 1000
        this.reset()
      }
      this.set(labels, since)
    },
  })
  new Gauge({
    name: 'vllm:cache_config_info',
    help: 'The KV cache: positions per block and blocks in the pool (GPU or CPU memory)',
    labelNames: ['block_size', 'num_gpu_blocks'] as const,
    registers: [registry],
    collect() {
      const r = read()
      if (!r) return
      this.reset()
      this.set({ block_size: String(r.stats.kvBlockSize), num_gpu_blocks: String(r.stats.kvBlocksTotal) }, 1)
    },
  })
}
