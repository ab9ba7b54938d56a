// Options of `Runtime.load`: device, dtype, quantization, RoPE scaling, the Hugging Face Hub and the KV cache.

/**
 * Where the model runs: `auto` (a GPU when the CUDA build loads and finds one, else the CPU),
 * `cpu`, `cuda` (the first GPU) or `cuda:N` (GPU N).
 */
export type Device = 'auto' | 'cpu' | 'cuda' | `cuda:${number}`
/** The floating-point type dense weights and activations run in; `auto` picks per device (see `LoadOptions.dtype`). */
export type DType = 'auto' | 'f32' | 'f16' | 'bf16'

/** The `quantize` load option. */
export type Quantize = 'none' | 'q8_0' | 'q4_0' | 'q4_k'

/** Options of `Runtime.load`. */
export interface LoadOptions {
  /**
   * `auto` (the default) uses the GPU when the CUDA build loads and finds one, otherwise the
   * CPU. `cuda` fails with `NO_CUDA_DEVICE` when there is no usable GPU. The environment
   * variable `EXPERT_RUNTIME_DEVICE` sets the default.
   */
  device?: Device
  /** `auto`: f32 on CPU (fastest and exact there), bf16 on CUDA. `EXPERT_RUNTIME_DTYPE` sets the default. */
  dtype?: DType
  /**
   * Positions a session may hold. Defaults to the model's maximum (`max_position_embeddings` /
   * GGUF `context_length`), or to the scaled length when `ropeScaling` is given. A length past
   * what the model supports loads, with a note in `info.warnings` (quality degrades there).
   * `'auto'`: the longest context (up to the model's) whose KV cache fits `memoryLimit` next
   * to the weights, state, RoPE tables and scratch, in whole blocks; the pool then takes what
   * the limit leaves. Fewer than 512 positions (or the model's, when shorter) fail the load
   * with `OUT_OF_MEMORY` before any weight is read. `Runtime.estimate` shows the numbers.
   */
  contextLength?: number | 'auto'
  /**
   * Bytes the runtime may take in all: weights, KV cache, recurrent state, RoPE tables and
   * the activations of one prefill chunk (an approximation). A model that cannot fit is
   * refused with `OUT_OF_MEMORY` before any weight is read, and the KV pool is bounded by
   * what the rest leaves. Default: no bound, except for `contextLength: 'auto'`, where it is
   * what the device has free now (the machine's available memory on CPU, less a tenth and
   * 256 MiB; the GPU's free memory, less a tenth).
   */
  memoryLimit?: number
  /**
   * Replaces the model's own RoPE scaling (read from `config.json` / GGUF). `null` turns it
   * off. An unknown `type` is `UNSUPPORTED_ARCHITECTURE`.
   */
  ropeScaling?: RopeScaling | null
  /** CPU threads for the engine. Defaults to one per core; at most 4 per core. */
  threads?: number
  /**
   * Quantize dense weights (f32/f16/bf16 safetensors, or an f16/f32 GGUF) as they are read:
   * `q8_0` (8.5 bits a weight, closest to the dense model), `q4_0` or `q4_k` (4.5 bits; the
   * token embedding and an untied output head are kept at `q6_k`, as llama.cpp's Q4_K_M
   * does). Norms and biases stay dense; a row length that a format's blocks do not divide
   * falls back to the next format that fits (`rt.info.quantization` tells what runs).
   * Already-quantized GGUF weights are not requantized. A non-finite weight fails the load
   * with `INVALID_MODEL`. Default `none`. On CUDA the blocks run through candle's quantized
   * kernels.
   */
  quantize?: Quantize
  /**
   * Read dense safetensors weights in place from the memory-mapped file when the file stores
   * them in the dtype the model runs (f32 on CPU by default, or f16): no copy, so loading is
   * parsing and pages come from the page cache as they are used. Default `true`. A mapped file
   * must not be truncated or rewritten in place while the runtime lives (a read of a lost page
   * ends the process, as with any mmap-based loader); replace files by renaming a new one over
   * them, or pass `false` to copy the weights into memory instead.
   */
  mmap?: boolean
  /**
   * Called as weights are read, with the bytes read so far and the bytes to read in all. An
   * exception it throws rejects the load with that exception.
   */
  onProgress?: (p: LoadProgress) => void
  /** Bounds of the KV cache shared by every session (see `KvCacheOptions`). */
  kvCache?: KvCacheOptions
  /**
   * Where and how an `hf:` path is fetched from the Hugging Face Hub (see `HubOptions`); unused
   * for a local path.
   */
  hub?: HubOptions
  /**
   * Called as an `hf:` path's files are downloaded, before the weights are read (then
   * `onProgress` takes over). Not called when every file is already in the cache. An exception
   * it throws stops the download (the partial file is kept) and rejects the load with it.
   */
  onDownloadProgress?: (p: DownloadProgress) => void
}

/** Progress of reading a model's weights (`LoadOptions.onProgress`). */
export interface LoadProgress {
  /** Bytes of weights read so far. */
  loadedBytes: number
  /** Bytes of weights to read in all. */
  totalBytes: number
}

/**
 * Fetching models from the Hugging Face Hub (`Runtime.load('hf:org/repo')`, `expert-runtime
 * pull`). Every field has an environment variable for its default; docs/models.md describes the
 * cache layout.
 */
export interface HubOptions {
  /**
   * The download cache. Default `$EXPERT_RUNTIME_CACHE/hub`, else `~/.cache/expert-runtime/hub`.
   * Files are kept as `<cacheDir>/<org>/<repo>/snapshots/<commit>/<file>`.
   */
  cacheDir?: string
  /** The Hub's base URL. Default `HF_ENDPOINT`, else `https://huggingface.co`. */
  endpoint?: string
  /**
   * Sent as `Authorization: Bearer` to the endpoint's host only (never to a host a redirect
   * leads to). Default `HF_TOKEN`, else `HUGGING_FACE_HUB_TOKEN`; `''` sends none.
   */
  token?: string
  /**
   * Never touch the network: use the cache or fail with `MODEL_NOT_FOUND`. Default true when
   * `EXPERT_RUNTIME_OFFLINE` or `HF_HUB_OFFLINE` is `1` (or `true`, `yes`, `on`).
   */
  offline?: boolean
  /** How long a connection may stay silent before it counts as cut (ms). Default 30000. */
  timeoutMs?: number
}

/** Progress of a Hub download: bytes of every file this call fetches, and the file now being fetched. */
export interface DownloadProgress {
  loadedBytes: number
  /** Grows when a file's size becomes known only once its download starts. */
  totalBytes: number
  /** The repository-relative name of the file being downloaded. */
  file: string
}

/**
 * How rotary position embeddings are stretched past the context a model was trained for,
 * computed exactly as HF transformers computes each type. Keys may also be given in HF's
 * snake_case spelling.
 */
export type RopeScaling =
  /** Every frequency divided by `factor` (position interpolation). */
  | {
      type: 'linear'
      /** How many times longer the context gets (> 0). */
      factor: number
    }
  /**
   * NTK-aware: the base grows with the sequence once it is longer than the model's
   * `max_position_embeddings`. A sequence past that length does not share its KV cache.
   */
  | {
      type: 'dynamic'
      /** How many times longer the context gets (> 0). */
      factor: number
    }
  /** YaRN. `originalMaxPositionEmbeddings` defaults to the model's `max_position_embeddings`. */
  | {
      type: 'yarn'
      /** How many times longer the context gets (> 0). */
      factor: number
      /** The context length (positions) the model was trained for. */
      originalMaxPositionEmbeddings?: number
      /** Scales cos/sin; default `0.1·ln(factor) + 1` (or from `mscale`/`mscaleAllDim`). */
      attentionFactor?: number
      /** Default 32. */
      betaFast?: number
      /** Default 1. */
      betaSlow?: number
      /** DeepSeek-style attention factor input (HF `mscale`); used only when `attentionFactor` is absent. */
      mscale?: number
      /** DeepSeek-style attention factor input (HF `mscale_all_dim`); used only when `attentionFactor` is absent. */
      mscaleAllDim?: number
      /** Round the correction range to whole dimensions (default true). */
      truncate?: boolean
    }
  /** Llama 3.1+: low frequencies divided by `factor`, high ones kept, a smooth ramp between. */
  | {
      type: 'llama3'
      /** How many times longer the context gets (> 0). */
      factor: number
      /** Default 1. */
      lowFreqFactor?: number
      /** Default 4. */
      highFreqFactor?: number
      /** The context length (positions) the model was trained for. */
      originalMaxPositionEmbeddings?: number
    }

/**
 * The KV cache is one pool of fixed-size blocks shared by all sessions. A session keeps its
 * blocks between turns; when the pool is full, idle sessions lose theirs (least recently used
 * first) and re-read their history on their next turn. A request is started only once it holds
 * every block it can need (`prompt + maxTokens`, capped by the context and the pool), so
 * giving `maxTokens` lets more requests run at once.
 */
export interface KvCacheOptions {
  /** Positions per block. Default 16. */
  blockSize?: number
  /**
   * Positions the pool holds over all sessions (rounded down to whole blocks). Default: a
   * quarter of the machine's memory on CPU (half the GPU memory left after the weights on CUDA)
   * divided by the KV bytes per token, at most 64 full contexts. On CPU, memory is committed
   * only as blocks are first used; on a GPU the pool is allocated at load.
   */
  maxTokens?: number
  /**
   * Bytes the pool may take over all sessions (rounded down to whole blocks); with `maxTokens`
   * the smaller bound wins. What a server chooses to spend on KV cache: `Runtime.stats()`
   * gives `kvBytesPerToken`.
   */
  maxBytes?: number
  /**
   * After this long (ms) with no request running, the pool forgets its cached prefixes and
   * gives the memory of every block no session holds back to the OS (on Linux; elsewhere the
   * blocks are freed for reuse but stay committed). A pool grows with its load and shrinks
   * again when the load is gone. Default 30000; 0 never does.
   */
  idleReleaseMs?: number
  /**
   * Share full blocks between sessions whose prompts start alike (same tokens, same experts).
   * Default true. With quantized weights, a prompt whose prefix comes from the cache can differ
   * in the last digits from the same prompt evaluated cold (the quantized kernels depend on
   * how many rows run together), which may flip a near-tie token; dense weights are unaffected.
   */
  prefixCache?: boolean
  /**
   * What the pool stores keys and values as. Default: the model's dtype (`f32` on CPU).
   * `f16` and `bf16` halve the KV memory; `q8_0` (34 bytes per 32 values) and `q4_0` (18) store
   * 8- or 4-bit values with an f16 scale per block of 32, as llama.cpp's KV types do, and
   * need a head dimension that is a multiple of 32 (else `INVALID_ARGUMENT`). Attention
   * widens or dequantizes rows to f32 as it reads them. `stats().kvBytesPerToken` reports
   * the real figure. On CPU, decode steps read f32 and f16 rows in place, so `f16` (llama.cpp's
   * default cache type) is also the faster choice at long contexts: it reads half the bytes.
   */
  dtype?: KvCacheDtype
  /**
   * Models with recurrent layers (Qwen3.5, LFM2): how many sequences may hold a recurrent state
   * at once (1–4096). Each session keeps its state between turns as it keeps its blocks; a
   * request that finds no free state takes an idle session's, least recently used first, and
   * fails with `KV_CACHE_EXHAUSTED` when every state is held by running requests. States are
   * f32 (`stats().kvStateBytesPerSequence` each) and come out of `maxBytes`. Default 32, fewer
   * when half the default pool budget holds fewer. Ignored for other models.
   */
  maxSequences?: number
  /**
   * A disk tier for the prefix cache: full blocks are also written to files in `dir` (off the
   * engine thread, as soon as they are full, so a quit or a crash keeps them), keyed by chained
   * SHA-256 hashes of their tokens over the model's fingerprint, the pool's layout and the
   * expert set. A runtime started later on the same model files finds them: a long system
   * prompt then costs a disk read, not a prefill. Every file carries its key and a checksum; a
   * torn, foreign or swapped file is skipped, never used. The directory is kept within
   * `maxBytes`, least recently used first; several processes may share it (eviction takes a
   * lock, as the download cache does). Loading reads the model's files once to fingerprint
   * them. Not yet for models with sliding-window or recurrent layers (`INVALID_ARGUMENT`).
   * Blocks computed under experts are kept only where the experts were loaded from files
   * (their fingerprint keys them). `stats().kvDisk` counts what it did.
   */
  disk?: KvDiskOptions
}

/** `kvCache.disk`: where the prefix cache keeps blocks across restarts. */
export interface KvDiskOptions {
  /** A directory (created if missing). */
  dir: string
  /** Bytes of block files the directory may hold (at least one block's file). */
  maxBytes: number
}

/** What the KV pool stores keys and values as (`KvCacheOptions.dtype`). */
export type KvCacheDtype = 'f32' | 'f16' | 'bf16' | 'q8_0' | 'q4_0'

/** `Runtime.estimate`: what a load with the same options would take, from the model's headers. */
export interface LoadEstimate {
  /** The weights as the load would hold them: in all, read in place from a memory map, by format. */
  weights: { bytes: number; mappedBytes: number; formats: { format: string; bytes: number }[] }
  /** The KV cache: the pool's dtype, bytes per position in each `kvCache.dtype`, and positions per block. */
  kv: {
    dtype: KvCacheDtype
    bytesPerToken: Record<KvCacheDtype, number>
    blockSize: number
    /** One sequence's KV at `contextLength`. */
    bytes: number
  }
  /** Recurrent state (zeros for a model without recurrent layers): one sequence's, the slots the pool reserves, their bytes. */
  state: { bytesPerSequence: number; slots: number; bytes: number }
  /** RoPE tables over the model's context. */
  ropeBytes: number
  /** Activations of one prefill chunk (an approximation). */
  scratchBytes: number
  /** The tokenizer and the engine's token tables (an approximation: 640 bytes per vocabulary entry, as measured). */
  tokenizerBytes: number
  /** The budget: `memoryLimit`, or what the device has free less the margin (`memoryLimitIsDefault`). */
  memoryLimit: number
  memoryLimitIsDefault: boolean
  /** The longest context the model supports (with its RoPE scaling). */
  modelContextLength: number
  /** The longest context whose KV fits `memoryLimit` next to everything else (whole blocks, at most the model's). */
  fitContextLength: number
  /** The context the load would use: `contextLength`, `'auto'`'s pick, or the model's. */
  contextLength: number
  /** weights + state + tables + scratch + tokenizer + KV at `contextLength`. */
  totalBytes: number
  /** Why a load with these options would fail with `OUT_OF_MEMORY` (its message); `null` when it fits. */
  doesNotFit: string | null
}
