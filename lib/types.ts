export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | 'tool' | (string & {})
  content: string
  /** The calls an assistant turn made (in `session.history` after a `'tool_calls'` answer). */
  toolCalls?: ToolCall[]
  /** For a `role: 'tool'` message: the `id` of the call this is the result of. */
  toolCallId?: string
}

/** A JSON schema (a plain JSON object; `$ref`/`$defs`, `anyOf`, formats… as llguidance reads them). */
export type JsonSchema = { [key: string]: unknown } | boolean

/**
 * What the answer must look like. The constraint masks the tokens the format does not allow
 * before temperature, top-k and top-p; `logprob` stays the model's own.
 */
export type ResponseFormat =
  | { type: 'text' }
  | { type: 'json_object' }
  | { type: 'json_schema'; schema: JsonSchema; name?: string; strict?: boolean }
  | { type: 'regex'; pattern: string }
  /** Lark syntax, as llguidance reads it (`%json { … }` and `@name` sub-grammars included). */
  | { type: 'grammar'; grammar: string }

/** A function the model may call. */
export interface Tool {
  type: 'function'
  function: { name: string; description?: string; parameters?: JsonSchema; strict?: boolean }
}

export type ToolChoice = 'auto' | 'none' | 'required' | { type: 'function'; function: { name: string } }

/** A call the model made; `arguments` is JSON text valid against the tool's `parameters`. */
export interface ToolCall {
  id: string
  type: 'function'
  function: { name: string; arguments: string }
}

/** A piece of a tool call as it streams (OpenAI's delta shape): the first piece of a call carries `id`, `type` and `function.name`. */
export interface ToolCallDelta {
  index: number
  id?: string
  type?: 'function'
  function: { name?: string; arguments: string }
}

export type Device = 'auto' | 'cpu' | 'cuda' | `cuda:${number}`
export type DType = 'auto' | 'f32' | 'f16' | 'bf16'

/** The `quantize` load option. */
export type Quantize = 'none' | 'q8_0' | 'q4_0' | 'q4_k'

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
   */
  contextLength?: number
  /**
   * Replaces the model's own RoPE scaling (read from `config.json` / GGUF). `null` turns it
   * off. An unknown `type` is `UNSUPPORTED_ARCHITECTURE`.
   */
  ropeScaling?: RopeScaling | null
  /** CPU threads for the engine. Defaults to one per core. */
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
  /** Called as weights are read. */
  onProgress?: (p: { loadedBytes: number; totalBytes: number }) => void
  /** Bounds of the KV cache shared by every session (see `KvCacheOptions`). */
  kvCache?: KvCacheOptions
}

/**
 * The KV cache is one pool of fixed-size blocks shared by all sessions. A session keeps its
 * blocks between turns; when the pool is full, idle sessions lose theirs (least recently used
 * first) and re-read their history on their next turn. A request is started only once it holds
 * every block it can need (`prompt + maxTokens`, capped by the context and the pool), so
 * giving `maxTokens` lets more requests run at once.
 */
/**
 * How rotary position embeddings are stretched past the context a model was trained for,
 * computed exactly as HF transformers computes each type. Keys may also be given in HF's
 * snake_case spelling.
 */
export type RopeScaling =
  /** Every frequency divided by `factor` (position interpolation). */
  | { type: 'linear'; factor: number }
  /**
   * NTK-aware: the base grows with the sequence once it is longer than the model's
   * `max_position_embeddings`. A sequence past that length does not share its KV cache.
   */
  | { type: 'dynamic'; factor: number }
  /** YaRN. `originalMaxPositionEmbeddings` defaults to the model's `max_position_embeddings`. */
  | {
      type: 'yarn'
      factor: number
      originalMaxPositionEmbeddings?: number
      /** Scales cos/sin; default `0.1·ln(factor) + 1` (or from `mscale`/`mscaleAllDim`). */
      attentionFactor?: number
      /** Default 32. */
      betaFast?: number
      /** Default 1. */
      betaSlow?: number
      mscale?: number
      mscaleAllDim?: number
      /** Round the correction range to whole dimensions (default true). */
      truncate?: boolean
    }
  /** Llama 3.1+. */
  | { type: 'llama3'; factor: number; lowFreqFactor?: number; highFreqFactor?: number; originalMaxPositionEmbeddings?: number }

/**
 * The RoPE scaling a runtime runs with, parameters resolved (`info.ropeScaling`).
 * `frequency_factors`: a GGUF's `rope_freqs` tensor (how Llama 3 scaling reaches GGUF).
 */
export type RopeScalingInfo =
  | { type: 'linear' | 'dynamic'; factor: number }
  | {
      type: 'yarn'
      factor: number
      originalMaxPositionEmbeddings: number
      attentionFactor: number
      betaFast: number
      betaSlow: number
      truncate: boolean
    }
  | { type: 'llama3'; factor: number; lowFreqFactor: number; highFreqFactor: number; originalMaxPositionEmbeddings: number }
  | { type: 'frequency_factors'; factors: number[] }

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
   * the real figure.
   */
  dtype?: KvCacheDtype
}

export type KvCacheDtype = 'f32' | 'f16' | 'bf16' | 'q8_0' | 'q4_0'

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
  /** K and V bytes of one position over all layers. */
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
  /** Bytes of the used blocks that live in GPU memory (0 on CPU). */
  kvDeviceBytes: number
  /** The GPU's free memory in bytes as of the engine's last step or command (read from the driver at most every 100 ms); `null` on CPU. */
  deviceMemoryFree: number | null
  /** The GPU's total memory in bytes; `null` on CPU. */
  deviceMemoryTotal: number | null
}

export interface RuntimeInfo {
  architecture: string
  dtype: string
  /** Where the model runs. */
  device: 'cpu' | 'cuda'
  /** `cpu`, or the GPU's name (`NVIDIA H100 80GB HBM3`). */
  deviceName: string
  /** The GPU's memory in bytes; `null` on CPU. */
  deviceMemoryTotal: number | null
  /** Which build of the addon runs it: `cuda` also runs on CPU when there is no GPU. */
  binary: 'cpu' | 'cuda'
  vocabSize: number
  contextLength: number
  numLayers: number
  hiddenSize: number
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

export type GenerateInput = string | ChatMessage[] | { text: string } | { tokens: number[] }

export interface GenerateOptions {
  /** Defaults to the rest of the context. */
  maxTokens?: number
  /** 0 = greedy. Default: generation_config.json, else 0.8. */
  temperature?: number
  /** 0 disables. Default: generation_config.json, else 40. */
  topK?: number
  /** 1 disables. Default: generation_config.json, else 0.95. */
  topP?: number
  /** 0 disables. Default 0.05. */
  minP?: number
  /** HF semantics over prompt and output; 1 disables. */
  repetitionPenalty?: number
  /** OpenAI semantics over the output; 0 disables. */
  frequencyPenalty?: number
  presencePenalty?: number
  /** Same seed and input, same output. */
  seed?: number
  /** Generation ends before any of these strings; they are not emitted. */
  stop?: string[]
  /** Return the N most likely tokens' logprobs with each chunk (0–20). */
  topLogprobs?: number
  /** Stops generation within one step; the stream ends with finishReason 'cancelled'. */
  signal?: AbortSignal
  /** Passed to the chat template (Qwen3 thinking mode). */
  enableThinking?: boolean
  /**
   * Experts (by name) for this request, overriding the session's set; `[]` runs the base
   * model; `'auto'` lets the router choose (`Runtime.route`). The request keeps its set until
   * it ends, whatever is unloaded meanwhile.
   */
  experts?: string[] | 'auto'
  /**
   * Raw `{ text }` input only: read special-token spellings (`<|im_end|>`) in the text as
   * those control tokens. Default false: they are plain text. Chat messages' content is
   * always plain text; only the chat template's own markup becomes control tokens, so a
   * message cannot close its turn or forge a system or assistant turn.
   */
  parseSpecialTokens?: boolean
  /**
   * Constrain the answer: JSON (any object, or valid against a schema), a regex or a Lark
   * grammar. A format the engine cannot use fails with `INVALID_ARGUMENT` and the reason. An
   * answer cut by `maxTokens` ends with `finishReason: 'length'` (and may be incomplete).
   */
  responseFormat?: ResponseFormat
  /** Functions the model may call, rendered through the model's chat template. */
  tools?: Tool[]
  /**
   * `'auto'` (default): the model decides, and a malformed call comes back as text with
   * `finishReason: 'stop'`; `'none'`: tools are not offered; `'required'` or a named function:
   * the answer is constrained to valid calls.
   */
  toolChoice?: ToolChoice
  /** Allow several calls in one answer where the template family does (default true). */
  parallelToolCalls?: boolean
}

export interface TokenChunk {
  tokenId: number
  /** May be '' while a UTF-8 character is incomplete or text may become a stop string. */
  text: string
  /** Log-probability of this token under the model (before sampling filters). */
  logprob: number
  topLogprobs?: { tokenId: number; logprob: number }[]
  /** A piece of a tool call this token wrote (the call's text is not in `text`). */
  toolCallDelta?: ToolCallDelta
  /** Every piece this token wrote, when it wrote more than one. */
  toolCallDeltas?: ToolCallDelta[]
}

export type FinishReason = 'stop' | 'length' | 'cancelled' | 'tool_calls'

export interface CompletionResult {
  text: string
  tokens: number[]
  finishReason: FinishReason
  usage: { promptTokens: number; completionTokens: number; cachedTokens: number }
  /**
   * `ttftMs`: from the engine receiving the request to its first token. `prepareMs`: preparing
   * it before that, off the engine thread (chat template, tokenizing, compiling its format);
   * `formatMs`: the format's share of that (the first after load also builds the token trie).
   */
  timings: { ttftMs: number; tokensPerSecond: number; prefillTokensPerSecond: number; prepareMs: number; formatMs: number }
  /** The experts that ran, in application order (`[]`: the base model). */
  experts: string[]
  /** The router's decision, when the request ran with `experts: 'auto'`. */
  routing?: RouteDecision
  /** The calls the answer made (`finishReason: 'tool_calls'`); `text` is then what the model wrote outside them. */
  toolCalls?: ToolCall[]
}

/** One routable expert's score for a query (see `Runtime.route`). */
export interface ExpertScore {
  name: string
  /** `weights.keywords · (hits − 2·excludeHits) · priority + weights.similarity · (similarity − rival)`: see the README. */
  score: number
  /** Keywords found in the query (whole words or phrases, case-insensitive). */
  keywordHits: string[]
  /** Exclude keywords found in the query. */
  excludeHits: string[]
  /**
   * Cosine of the query to the nearest of the expert's `routing.examples` (last-token
   * embeddings, centred); null without examples.
   */
  similarity: number | null
}

export interface RouteDecision {
  /** Chosen, best first; `[]` = the base model. */
  experts: string[]
  /** The query matched the generic-query rules (greetings, thanks, small talk, one word…). */
  generic: boolean
  /**
   * Every routable expert (one with keywords or examples) that has something to say about the
   * query (a keyword or exclude hit, or a similarity), best first.
   */
  scores: ExpertScore[]
  /** One human-readable line, for logs and debugging. */
  reason: string
  /**
   * The query's similarity to the nearest of the router's everyday reference queries (null
   * when no expert has examples): each expert's similarity is scored against it.
   */
  genericSimilarity: number | null
}

export interface RouteOptions {
  /** Chat input: earlier user turns routed together with the last one (default: the router's `historyTurns`, 0). */
  historyTurns?: number
}

/** Router tuning (`Runtime.setRouter`); every field is optional there, defaults below. */
export interface RouterSettings {
  /** An expert is chosen when its score reaches this. Default 0.5. */
  threshold: number
  /** At most this many experts per request. Default 2. */
  maxExperts: number
  /**
   * Case-insensitive regular expressions (Rust `regex` syntax) over the trimmed, lowercased
   * query; a match (or a one-word query) makes it generic. Default: a built-in list (read it from `rt.router.genericPatterns`).
   */
  genericPatterns: string[]
  /** Default `{ keywords: 1, similarity: 2 }`. */
  weights: { keywords: number; similarity: number }
  /** Chat input: earlier user turns routed with the last one. Default 0. */
  historyTurns: number
  /** A generic query goes to an expert only with this many net keyword hits. Default 2. */
  genericMinKeywordHits: number
}

export interface EmbedOptions {
  /** `mean` (default) over the text's tokens, or the `last` token's state. */
  pooling?: 'mean' | 'last'
  /** Scale each vector to unit length. Default true. */
  normalize?: boolean
  /** The embedding under these experts (names). Default: the base model. */
  experts?: string[]
}

export type ExpertKind = 'lora' | 'dora' | 'ia3' | 'lokr' | 'prompt'

export interface LoadExpertOptions {
  /** The name requests use; default: manifest `name`, else the directory name. */
  name?: string
  /**
   * Multiplies the adapter's effect (LoRA/DoRA/LoKr scaling; IA³ as `1 + scale·(l − 1)`).
   * Default 1. Not applicable to prompt tuning.
   */
  scale?: number
}

/** `manifest.json` beside an adapter (all fields optional; extra fields are kept). */
export interface ExpertManifest {
  name?: string
  description?: string
  version?: string
  /** Experts apply in ascending `load_order`, then in the order a request lists them. */
  load_order?: number
  /** Router hints: see `Runtime.route`. `examples` are typical queries, embedded at load. */
  routing?: { keywords?: string[]; exclude_keywords?: string[]; priority?: number; examples?: string[] }
  /** A model name (`Qwen/Qwen3-0.6B`) or `{ architecture, hidden_size, num_layers, vocab_size }`. */
  base_model?: string | { architecture?: string; hidden_size?: number; num_layers?: number; vocab_size?: number }
  [key: string]: unknown
}

export interface SessionOptions {
  system?: string
  /** The session's default experts, by name, or `'auto'`: every request is routed. */
  experts?: string[] | 'auto'
}
