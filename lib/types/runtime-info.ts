// What a loaded runtime reports (`Runtime.info`, `Runtime.stats()`) and the options of `Runtime.embed`.

import type { DType, KvCacheDtype } from './load'

/**
 * The RoPE scaling a runtime runs with, parameters resolved (`info.ropeScaling`).
 * `frequency_factors`: a GGUF's `rope_freqs` tensor (how Llama 3 scaling reaches GGUF).
 */
export type RopeScalingInfo =
  | {
      type: 'linear' | 'dynamic'
      /** How many times longer the context gets. */
      factor: number
    }
  | {
      type: 'yarn'
      /** How many times longer the context gets. */
      factor: number
      /** The context length (positions) the model was trained for. */
      originalMaxPositionEmbeddings: number
      /** What cos/sin are scaled by. */
      attentionFactor: number
      /** HF `beta_fast`: dimensions that rotate more often than this over the original context are extrapolated (kept). */
      betaFast: number
      /** HF `beta_slow`: dimensions that rotate less often than this are interpolated (divided by `factor`). */
      betaSlow: number
      /** Whether the correction range is rounded to whole dimensions. */
      truncate: boolean
    }
  | {
      type: 'llama3'
      /** How many times longer the context gets. */
      factor: number
      /** Wavelengths longer than `originalMaxPositionEmbeddings / lowFreqFactor` are divided by `factor`. */
      lowFreqFactor: number
      /** Wavelengths shorter than `originalMaxPositionEmbeddings / highFreqFactor` are kept. */
      highFreqFactor: number
      /** The context length (positions) the model was trained for. */
      originalMaxPositionEmbeddings: number
    }
  | {
      type: 'frequency_factors'
      /** One divisor per rotary frequency (head_dim / 2 of them), from the GGUF's `rope_freqs`. */
      factors: number[]
    }
  | {
      /** Gemma 4's full layers: from the model's config, never an option. */
      type: 'proportional'
      /** The share of each head's frequency pairs that turn (the rest do not). */
      partialRotaryFactor: number
      /** Every frequency is divided by it. */
      factor: number
    }
  | {
      /** Phi-3.5 / Phi-4-mini: from the model's config (or a GGUF's `rope_factors_*` tensors), never an option. */
      type: 'longrope'
      /** The context length (positions) the model was trained for: a longer sequence turns by `longFactor`. */
      originalMaxPositionEmbeddings: number
      /** What cos/sin are scaled by (at every position). */
      attentionFactor: number
      /** One divisor per rotated pair while a sequence is within the original length. */
      shortFactor: number[]
      /** One divisor per rotated pair once it is longer. */
      longFactor: number[]
    }

/** `Runtime.stats()`: the KV pool and the scheduler, as of the engine's last step. */
export interface RuntimeStats {
  /** Blocks in the pool. */
  kvBlocksTotal: number
  /** Blocks held by sessions or running requests. */
  kvBlocksUsed: number
  /** Unreferenced blocks that still hold a reusable prefix (recycled first when needed). */
  kvBlocksCached: number
  /**
   * Blocks ever used. On CPU the pool's memory is committed only as blocks are first used, so
   * `kvBlocksTouched * kvBlockSize * kvBytesPerToken` is the KV cache's resident size.
   */
  kvBlocksTouched: number
  /** Positions per block. */
  kvBlockSize: number
  /** Bytes of the used blocks. */
  kvBytes: number
  /** Bytes of K and V for one position over all layers that keep positions (as if every one kept them all). */
  kvBytesPerToken: number
  /** Open sessions. */
  sessions: number
  /** Requests running or queued for KV blocks. */
  activeRequests: number
  /** Requests waiting for KV blocks. */
  queuedRequests: number
  /** Prompt positions taken from the prefix cache instead of being evaluated, since load. */
  prefixCacheHitTokens: number
  /** Blocks taken from idle sessions to make room, since load. */
  evictedBlocks: number
  /** Requests that waited for KV room (blocks, or a recurrent-state slot) at least once, since load. */
  waitedRequests: number
  /** Recurrent-state slots (`kvCache.maxSequences`; 0 for a model without recurrent layers). */
  kvStateSlots: number
  /** Slots held by sessions. */
  kvStateSlotsUsed: number
  /** Bytes of recurrent state held by sessions. */
  kvStateBytes: number
  /** Bytes of one sequence's recurrent state over all recurrent layers (f32). */
  kvStateBytesPerSequence: number
  /** Blocks whose memory the pool gave back to the OS after idle periods, in all (`kvCache.idleReleaseMs`). */
  kvBlocksReleased: number
  /**
   * Blocks that sliding-window layers gave back to the pool as their sequences moved past them,
   * since load (0 for a model without sliding-window layers). Those layers keep only the blocks
   * their window still sees, so `kvBytes` grows with the global layers alone past the window.
   */
  kvBlocksBehindWindow: number
  /** Bytes of the used blocks that live in GPU memory (0 on CPU). */
  kvDeviceBytes: number
  /** The GPU's free memory in bytes as of the engine's last step or command (read from the driver at most every 100 ms); `null` on CPU. */
  deviceMemoryFree: number | null
  /** The GPU's total memory in bytes; `null` on CPU. */
  deviceMemoryTotal: number | null
  /**
   * Resident bytes by kind: the weights (those read in place from a memory map included), the
   * KV pool's resident part (on CPU the blocks ever used and not given back; on a GPU the whole
   * pool), the recurrent state sequences hold, and the resident experts.
   */
  memory: { weights: number; kv: number; state: number; experts: number }
  /** The prefix cache's disk tier (`kvCache.disk`) since load; `null` without one. */
  kvDisk: KvDiskStats | null
  /** The experts that running requests use, by name, sorted (as of the engine's last step). */
  runningExperts: string[]
  /** The experts that requests waiting for KV room will use, by name, sorted. */
  waitingExperts: string[]
  /** KV events dropped because their consumer fell behind (`startKvEvents`), since it started. */
  kvEventsDropped: number
}

/**
 * A KV event (`Runtime.takeKvEvents`): a block of the prefix cache stored or removed, as vLLM
 * publishes them. Hashes are the cache's own ids for blocks (unique within the runtime; a
 * stored block names the block before it, `null` at a sequence's start); `loraId` names the
 * expert set it was computed under (`null`: the base model).
 */
export type KvEvent =
  | { type: 'BlockStored'; blockHash: number; parentBlockHash: number | null; tokenIds: number[]; blockSize: number; loraId: number | null }
  | { type: 'BlockRemoved'; blockHash: number }

/** What the prefix cache's disk tier did since load (`stats().kvDisk`), in blocks. */
export interface KvDiskStats {
  /** Blocks written to files. */
  writtenBlocks: number
  /** Blocks not written because the writer was behind (the engine never waits for the disk). */
  droppedBlocks: number
  /** Writes that failed: a full disk, a read-only directory. Generation goes on. */
  failedBlocks: number
  /** Blocks read back into the cache instead of being computed. */
  readBlocks: number
  /** Files skipped (and removed): the wrong size, key or checksum. */
  rejectedBlocks: number
  /** Files removed to stay within `maxBytes`, least recently used first. */
  evictedBlocks: number
  /** Bytes of block files in the directory (other processes' included), as last counted. */
  bytes: number
}

/** `Runtime.info`: what was loaded and how it runs. */
export interface RuntimeInfo {
  /** The network the engine runs: `llama`, `qwen2`, `qwen3` or `gemma3`. */
  architecture: string
  /**
   * The family as the checkpoint names it (`config.json`'s `model_type`, a GGUF's
   * `general.architecture`): `mistral`, `ministral`, `smollm3`, `granite`, `gemma3_text`,
   * `gemma3` (a multimodal checkpoint's text model), … where `architecture` is the network
   * they share.
   */
  family: string
  /** What dense weights and activations run in (`LoadOptions.dtype` resolved: never `auto`). */
  dtype: Exclude<DType, 'auto'>
  /** Where the model runs. */
  device: 'cpu' | 'cuda'
  /** `cpu`, or the GPU's name (`NVIDIA H100 80GB HBM3`). */
  deviceName: string
  /** The GPU's memory in bytes; `null` on CPU. */
  deviceMemoryTotal: number | null
  /** Which build of the addon runs it: `cuda` also runs on CPU when there is no GPU. */
  binary: 'cpu' | 'cuda'
  /** Tokens in the vocabulary (the output head's width). */
  vocabSize: number
  /** Positions a session may hold (`LoadOptions.contextLength` or the model's maximum). */
  contextLength: number
  /** Decoder layers. */
  numLayers: number
  /** Width of the hidden state (the length of `Runtime.embed` vectors). */
  hiddenSize: number
  /** Token ids that end an answer (`finishReason: 'stop'`). */
  eosTokenIds: number[]
  /** What the KV pool stores keys and values as (`kvCache.dtype`). */
  kvCacheDtype: KvCacheDtype
  /** The RoPE scaling the model runs with (`null` when none). */
  ropeScaling: RopeScalingInfo | null
  /**
   * What the linear weights run as: `none` when all are dense (in `dtype`), otherwise their
   * block formats joined by `+`, most bytes first (`q4_0+q6_k`, or `q8_0` for a GGUF whose
   * Q4_1 / Q5_0 tensors were repacked to Q8_0), with `dense` among them when some stay dense.
   */
  quantization: string
  /** Bytes of the weights. Weights read in place from a memory-mapped file count the file bytes they use. */
  weightBytes: number
  /** What you should know about how the model runs, e.g. a `contextLength` past what it supports. */
  warnings: string[]
}

/** How `Runtime.embed` pools and scales its vectors. */
export interface EmbedOptions {
  /** `mean` (default) over the text's tokens, or the `last` token's state. */
  pooling?: 'mean' | 'last'
  /** Scale each vector to unit length. Default true. */
  normalize?: boolean
  /** The embedding under these experts (names). Default: the base model. */
  experts?: string[]
}
