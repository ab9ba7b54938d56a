/** One turn of a conversation, as the model's chat template reads it. */
export interface ChatMessage {
  /** Who speaks. Other roles are passed to the chat template as they are. */
  role: 'system' | 'user' | 'assistant' | 'tool' | (string & {})
  /** The turn's text. Always plain text: spellings of control tokens in it are not markup. */
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
  /** No constraint. */
  | { type: 'text' }
  /** Any JSON object. */
  | { type: 'json_object' }
  | {
      type: 'json_schema'
      /** The schema the answer's JSON must be valid against. */
      schema: JsonSchema
      /** Accepted for OpenAI compatibility, not read. */
      name?: string
      /** Accepted for OpenAI compatibility, not read: the answer always follows the schema. */
      strict?: boolean
    }
  | {
      type: 'regex'
      /** The whole answer must match it (llguidance's regex syntax, Rust-like). */
      pattern: string
    }
  | {
      type: 'grammar'
      /** Lark syntax, as llguidance reads it (`%json { … }` and `@name` sub-grammars included). */
      grammar: string
    }

/** A function the model may call (OpenAI's shape). */
export interface Tool {
  /** Always `'function'`. */
  type: 'function'
  /** The function's name, description and parameters. */
  function: {
    /** The name the model calls it by. */
    name: string
    /** What it does, for the model. */
    description?: string
    /** A JSON schema of its arguments (an object schema). */
    parameters?: JsonSchema
    /**
     * Accepted for OpenAI compatibility, not read: calls forced by `toolChoice` always validate
     * against `parameters`; with `'auto'` a call that does not parse comes back as text.
     */
    strict?: boolean
  }
}

/**
 * Whether and which tools the model calls: `'auto'` (it decides), `'none'` (tools are not
 * offered), `'required'` (at least one call) or one named function (exactly that call).
 */
export type ToolChoice =
  | 'auto'
  | 'none'
  | 'required'
  | {
      type: 'function'
      function: {
        /** The tool the answer must call (once). */
        name: string
      }
    }

/** A call the model made; `arguments` is JSON text valid against the tool's `parameters`. */
export interface ToolCall {
  /** Unique within the conversation (`call_…`); a `role: 'tool'` reply names it in `toolCallId`. */
  id: string
  /** Always `'function'`. */
  type: 'function'
  /** What was called, with which arguments. */
  function: {
    /** The tool's name. */
    name: string
    /** The arguments as JSON text (parse it with `JSON.parse`). */
    arguments: string
  }
}

/** A piece of a tool call as it streams (OpenAI's delta shape): the first piece of a call carries `id`, `type` and `function.name`. */
export interface ToolCallDelta {
  /** Which call of the answer this piece belongs to (0 for the first). */
  index: number
  /** The call's id (first piece only). */
  id?: string
  /** `'function'` (first piece only). */
  type?: 'function'
  /** This piece of the call. */
  function: {
    /** The tool's name (first piece only). */
    name?: string
    /** The next piece of the arguments' JSON text (may be `''`). */
    arguments: string
  }
}

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
   */
  contextLength?: number
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
}

/** What the KV pool stores keys and values as (`KvCacheOptions.dtype`). */
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
  /** Bytes of K and V for one position over all layers. */
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
  /** Blocks whose memory the pool gave back to the OS after idle periods, in all (`kvCache.idleReleaseMs`). */
  kvBlocksReleased: number
  /** Bytes of the used blocks that live in GPU memory (0 on CPU). */
  kvDeviceBytes: number
  /** The GPU's free memory in bytes as of the engine's last step or command (read from the driver at most every 100 ms); `null` on CPU. */
  deviceMemoryFree: number | null
  /** The GPU's total memory in bytes; `null` on CPU. */
  deviceMemoryTotal: number | null
}

/** `Runtime.info`: what was loaded and how it runs. */
export interface RuntimeInfo {
  /** The model family as the engine runs it: `llama`, `qwen2` or `qwen3`. */
  architecture: string
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

/**
 * A request's input: a string (one user message) or `ChatMessage[]` (through the model's chat
 * template, into `Session.history`), or raw `{ text }` / `{ tokens }` (token ids) that continue
 * the session's token stream as they are.
 */
export type GenerateInput =
  | string
  | ChatMessage[]
  | {
      /** Raw text, tokenized as it is (no chat template). */
      text: string
    }
  | {
      /** Raw token ids. */
      tokens: number[]
    }

/** Sampling, limits and constraints of one request (`Session.generate` / `complete`). */
export interface GenerateOptions {
  /** Most tokens to generate. Defaults to the rest of the context. */
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
  /** OpenAI semantics over the output (scaled by each token's count so far); 0 disables. */
  frequencyPenalty?: number
  /** OpenAI semantics over the output (once for any token already output); 0 disables. */
  presencePenalty?: number
  /** Seeds the sampler (a non-negative integer): same seed and input, same output. */
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
  /**
   * Speculative decoding: guess the next tokens and check them all in one pass. With
   * `{ type: 'ngram' }` (prompt lookup) the guesses are copied from earlier in the
   * conversation where its last tokens occurred, so answers that repeat their input (code
   * edits, quoting, summaries, RAG) run several tokens per step; with
   * `{ type: 'draft', model }` a smaller model with the same tokenizer guesses. The output is
   * the same as without it: greedy tokens, and with a `seed` the same sampled tokens (each
   * guess is kept only when it equals what sampling that position picks). Ignored with
   * `responseFormat` and forced tool calls. `usage.draftTokens` / `usage.acceptedDraftTokens`
   * report the guesses and how many were kept.
   */
  speculative?: SpeculativeOptions
}

/** `GenerateOptions.speculative`: prompt lookup, or a smaller model with the same tokenizer. */
export type SpeculativeOptions =
  | {
      /** `'ngram'`: drafts copied from the context (no second model). */
      type: 'ngram'
      /** Draft tokens per step at most (1–64, default 8); the length adapts to what is accepted. */
      maxDraft?: number
      /** The longest suffix of the conversation matched (1–16, default 3). */
      ngram?: number
      /** The shortest suffix matched (1–`ngram`, default 2). */
      minNgram?: number
    }
  | {
      /**
       * `'draft'`: a smaller model proposes the drafts, greedily. It must share this model's
       * tokenizer (checked: `INVALID_ARGUMENT` otherwise); it runs on this runtime's engine
       * thread, with a private cache per request.
       */
      type: 'draft'
      /** The draft model, loaded with `Runtime.load`. */
      model: import('./runtime').Runtime
      /** Draft tokens per step at most (1–64, default 4); the length adapts to what is accepted. */
      maxDraft?: number
    }

/** One generated token, as a stream yields it. */
export interface TokenChunk {
  /** The token's id in the model's vocabulary. */
  tokenId: number
  /** May be '' while a UTF-8 character is incomplete or text may become a stop string. */
  text: string
  /** Log-probability of this token under the model (before sampling filters). */
  logprob: number
  /** The `topLogprobs` most likely tokens at this step, most likely first (when asked for). */
  topLogprobs?: {
    /** A candidate token's id. */
    tokenId: number
    /** Its log-probability under the model (before sampling filters). */
    logprob: number
  }[]
  /** A piece of a tool call this token wrote (the call's text is not in `text`). */
  toolCallDelta?: ToolCallDelta
  /** Every piece this token wrote, when it wrote more than one. */
  toolCallDeltas?: ToolCallDelta[]
  /**
   * First chunk only: the experts the request runs under, in application order (`[]`: the base
   * model). With `experts: 'auto'` a stream knows from its first token which experts run.
   */
  experts?: string[]
  /** First chunk only, for `experts: 'auto'`: the router's decision. */
  routing?: RouteDecision
}

/**
 * Why an answer ended: `stop` (an end-of-sequence token, a `stop` string, or a complete
 * `responseFormat`), `length` (`maxTokens`, the context or the KV pool), `cancelled` (`break`,
 * `AbortSignal`, `cancel()`, dispose) or `tool_calls` (the model called tools).
 */
export type FinishReason = 'stop' | 'length' | 'cancelled' | 'tool_calls'

/** Token counts of one request. */
export interface CompletionUsage {
  /** Tokens of the prompt (the whole conversation as the model read it), cached ones included. */
  promptTokens: number
  /** Tokens generated. */
  completionTokens: number
  /** Of `promptTokens`, those taken from the KV cache instead of being evaluated. */
  cachedTokens: number
  /** Tokens proposed by speculative decoding and checked by the model (0 without it). */
  draftTokens: number
  /** Of `draftTokens`, those the model agreed with: each saved a decode step. */
  acceptedDraftTokens: number
}

/** Where one request's time went. Times in milliseconds, rates in tokens per second. */
export interface CompletionTimings {
  /** Milliseconds from the engine receiving the request (after `prepareMs`) to its first token, queueing and prompt included. */
  ttftMs: number
  /** Decode rate after the first token, in tokens per second (one token: tokens over the whole request). */
  tokensPerSecond: number
  /** Prompt tokens evaluated (not from the cache) per second, from the engine receiving the request to the end of the prompt; 0 when none were. */
  prefillTokensPerSecond: number
  /** Milliseconds spent preparing the request off the engine thread (chat template, tokenizing, compiling its format). */
  prepareMs: number
  /** Of `prepareMs`, the milliseconds compiling its `responseFormat` or forced tool call (the first after load also builds the token trie). */
  formatMs: number
}

/** What one request produced (`Session.complete`, `GenerationStream.result`). */
export interface CompletionResult {
  /** The answer's text (tool-call markup left out). */
  text: string
  /** The generated token ids. */
  tokens: number[]
  /** Why it ended. */
  finishReason: FinishReason
  /** Token counts. */
  usage: CompletionUsage
  /** Where the time went (milliseconds, tokens per second). */
  timings: CompletionTimings
  /** The experts that ran, in application order (`[]`: the base model). */
  experts: string[]
  /** The router's decision, when the request ran with `experts: 'auto'`. */
  routing?: RouteDecision
  /** The calls the answer made (`finishReason: 'tool_calls'`); `text` is then what the model wrote outside them. */
  toolCalls?: ToolCall[]
}

/** One routable expert's score for a query (see `Runtime.route`). */
export interface ExpertScore {
  /** The expert's name. */
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

/** What the router chose for a query, and why (`Runtime.route`, `CompletionResult.routing`). */
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

/** Options of `Runtime.route`. */
export interface RouteOptions {
  /** Chat input: earlier user turns routed together with the last one (default: the router's `historyTurns`, 0). */
  historyTurns?: number
}

/** Router tuning (`Runtime.router`, `Runtime.setRouter`); every field is optional there, defaults below. */
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
  weights: {
    /** Multiplies the keyword term of the score. */
    keywords: number
    /** Multiplies the similarity term of the score. */
    similarity: number
  }
  /** Chat input: earlier user turns routed with the last one. Default 0. */
  historyTurns: number
  /** A generic query goes to an expert only with this many net keyword hits. Default 2. */
  genericMinKeywordHits: number
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

/** The PEFT method of an expert: LoRA (rsLoRA included), DoRA, IA³, LoKr or prompt tuning. */
export type ExpertKind = 'lora' | 'dora' | 'ia3' | 'lokr' | 'prompt'

/** Options of `Runtime.loadExpert`. */
export interface LoadExpertOptions {
  /**
   * The name requests use; default: manifest `name`, else the directory name (for an `hf:`
   * path, the repository's name).
   */
  name?: string
  /**
   * Where and how an `hf:` path is fetched (see `HubOptions`); default: the `hub` options the
   * runtime was loaded with. Unused for a local path.
   */
  hub?: HubOptions
  /**
   * Called as an `hf:` path's files are downloaded. Not called when every file is already in
   * the cache. An exception it throws stops the download and rejects the load with it.
   */
  onDownloadProgress?: (p: DownloadProgress) => void
  /**
   * Multiplies the adapter's effect (LoRA/DoRA/LoKr scaling; IA³ as `1 + scale·(l − 1)`).
   * Default 1. Not applicable to prompt tuning.
   */
  scale?: number
  /**
   * Read f32 and f16 LoRA and DoRA matrices in place from the memory-mapped
   * `adapter_model.safetensors` (CPU runtimes with f32 activations, the default there; f16 is
   * widened as the kernels read it, with the results of an f32 copy): no copy, so loading parses and
   * checks the header, names and shapes, and reads no weight value; the pages are the page
   * cache's, shared by every runtime that maps the file. Default `true`. Values are then not
   * checked for NaN or infinity at load (a NaN weight makes the logits of requests using the
   * expert NaN: nothing fails, but their tokens are meaningless). The file must not be
   * truncated or rewritten in place while the expert is loaded (a read of a lost page ends the
   * process, as with any mmap-based loader): save a retrained adapter to a new directory, or
   * write a new file and rename it over the old one, then `unload` and load again. `false`
   * copies the matrices into memory and checks every value (`INVALID_ADAPTER`). bf16, GPUs and
   * GGUF Llama q/k rows are always converted into memory.
   */
  mmap?: boolean
}

/** `manifest.json` beside an adapter (all fields optional; extra fields are kept). */
export interface ExpertManifest {
  /** The name requests use (unless `LoadExpertOptions.name` is given). */
  name?: string
  /** What it is for, for people. */
  description?: string
  /** The adapter's own version, for people. */
  version?: string
  /** Experts apply in ascending `load_order`, then in the order a request lists them. */
  load_order?: number
  /** Router hints: see `Runtime.route`. `examples` are typical queries, embedded at load. */
  routing?: {
    /** Words or phrases that make a query this expert's (case-insensitive, whole words). At most 1,024. */
    keywords?: string[]
    /** Words or phrases that count against it. */
    exclude_keywords?: string[]
    /** Multiplies its keyword score. Default 1. */
    priority?: number
    /** Typical queries, embedded at load for similarity routing. At most 256, each at most 4 KB. */
    examples?: string[]
  }
  /** A model name (`Qwen/Qwen3-0.6B`) or `{ architecture, hidden_size, num_layers, vocab_size }`. */
  base_model?:
    | string
    | {
        /** `llama`, `qwen2` or `qwen3` (also HF's `Qwen3ForCausalLM` spelling). */
        architecture?: string
        /** Must equal the base model's `hidden_size`. */
        hidden_size?: number
        /** Must equal the base model's number of layers. */
        num_layers?: number
        /** Must equal the base model's vocabulary size. */
        vocab_size?: number
      }
  [key: string]: unknown
}

/** Options of `Runtime.createSession`. */
export interface SessionOptions {
  /** The system prompt (the first turn of `history`; kept by `reset()`). */
  system?: string
  /** The session's default experts, by name, or `'auto'`: every request is routed. */
  experts?: string[] | 'auto'
  /**
   * What a chat turn that does not fit the context does. `'none'` (default): it fails with
   * `CONTEXT_OVERFLOW`. `'drop-oldest'`: the oldest whole turns (a user message with the
   * replies and tool results after it) leave `history` until the conversation leaves room for
   * the answer (`maxTokens`, else a quarter of the context, at most half); the system prompt
   * always stays, and its cached tokens are reused. Raw `{ text }` / `{ tokens }` input is
   * never shifted.
   */
  contextShift?: ContextShift
}

/** See `SessionOptions.contextShift`. */
export type ContextShift = 'none' | 'drop-oldest'

/** One storage format of the tensors `inspect` found (`f32`, `bf16`, `q4_1`, `q6_k`, …). */
export interface TensorFormatInfo {
  /** The format's lower-case name (safetensors dtype, or GGUF block type). */
  format: string
  /** Tensors stored in it. */
  tensors: number
  /** Elements of those tensors. */
  parameters: number
  /** Bytes they take in the files. */
  bytes: number
}

/** The weight files of a model or an adapter, from their headers (`inspect`). */
export interface WeightFilesInfo {
  /** The file format. */
  container: 'gguf' | 'safetensors'
  /** Weight files (shards count one each). */
  files: number
  /** Their size in bytes. */
  fileBytes: number
  /** Tensors in them. */
  tensors: number
  /** Elements of every tensor (a tied embedding counts once). */
  parameters: number
  /** The tensors by storage format, most bytes first. */
  formats: TensorFormatInfo[]
}

/** A special token: its id and its spelling in the vocabulary. */
export interface SpecialTokenInfo {
  /** The token id. */
  id: number
  /** Its vocabulary string (`<|im_end|>`); `null` when the vocabulary lacks the id. */
  text: string | null
}

/** A model's tokenizer, as `inspect` found it. */
export interface TokenizerInspection {
  /** Where it comes from: the directory's `tokenizer.json`, or the GGUF metadata. */
  source: 'tokenizer.json' | 'gguf'
  /** `BPE`, `Unigram`, `WordPiece` or `WordLevel` (tokenizer.json), or GGUF `tokenizer.ggml.model` (`gpt2`, `llama`). */
  model: string
  /** GGUF `tokenizer.ggml.pre` (the pre-tokenizer), else `null`. */
  pre: string | null
  /** Token ids (highest id + 1, added tokens included). */
  vocabSize: number
  /** The beginning-of-sequence token, if the tokenizer has one. */
  bos: SpecialTokenInfo | null
  /** The tokenizer's end-of-sequence tokens. */
  eos: SpecialTokenInfo[]
  /** Whether encoding with special tokens prepends BOS itself (GGUF `add_bos_token`). */
  addsBos: boolean
  /** The chat template's Jinja source; `null` when there is none (plain ChatML is used then). */
  chatTemplate: string | null
}

/** What `inspect` says about a model (HF directory or GGUF file), read without loading its weights. */
export interface ModelInspection {
  /** Tells a model from an adapter. */
  type: 'model'
  /** The path inspected. */
  path: string
  /** The family the engine runs it as: `llama`, `qwen2` or `qwen3`. */
  architecture: string
  /** Rows of the embedding (and output head). */
  vocabSize: number
  /** Width of the hidden state. */
  hiddenSize: number
  /** Width of the feed-forward layers. */
  intermediateSize: number
  /** Decoder layers. */
  numLayers: number
  /** Attention (query) heads. */
  numHeads: number
  /** Key/value heads (fewer than `numHeads`: grouped-query attention). */
  numKvHeads: number
  /** Width of one head. */
  headDim: number
  /** The context length the model declares (`max_position_embeddings` / `context_length`). */
  contextLength: number
  /** The RoPE base. */
  ropeTheta: number
  /** The model's own RoPE scaling, `null` when it has none. */
  ropeScaling: RopeScalingInfo | null
  /** The RMSNorm epsilon. */
  rmsNormEps: number
  /** Whether the output head reuses the embedding. */
  tieWordEmbeddings: boolean
  /** The dtype `config.json` declares (`torch_dtype` / `dtype`), else `null`. */
  declaredDtype: string | null
  /** `bos_token_id` of the config or GGUF metadata, else `null`. */
  bosTokenId: number | null
  /** The tokens that end an answer, gathered as a load gathers them (config, generation_config.json, tokenizer). */
  eosTokens: SpecialTokenInfo[]
  /** The weight files and their tensors' storage formats. */
  weights: WeightFilesInfo
  /** The tokenizer; `null` when it cannot be built (the reason is in `warnings`; a load would fail). */
  tokenizer: TokenizerInspection | null
  /** What you should know, e.g. why the tokenizer cannot be built. */
  warnings: string[]
}

/** The PEFT method of an adapter as `inspect` reports it (rsLoRA told apart from LoRA). */
export type AdapterKind = ExpertKind | 'rslora'

/** What `inspect` says about a PEFT adapter directory, read without loading a base model. */
export interface AdapterInspection {
  /** Tells an adapter from a model. */
  type: 'adapter'
  /** The path inspected. */
  path: string
  /** The PEFT method. */
  kind: AdapterKind
  /** `r` (LoRA, rsLoRA, DoRA, LoKr), else `null`. */
  rank: number | null
  /** `lora_alpha` (LoRA, rsLoRA, DoRA) or `alpha` (LoKr), else `null`. */
  alpha: number | null
  /** `target_modules` as written: module names, or one regular expression (`targetModulesRegex`). */
  targetModules: string[]
  /** Whether `targetModules` holds one regular expression rather than names. */
  targetModulesRegex: boolean
  /** Prompt tuning's virtual tokens, else `null`. */
  numVirtualTokens: number | null
  /** `base_model_name_or_path` of `adapter_config.json`, else `null`. */
  baseModel: string | null
  /** PEFT's `auto_mapping.base_model_class` (`Qwen3ForCausalLM`), else `null`. */
  baseModelClass: string | null
  /** `manifest.json`'s `name`, else `null`. */
  name: string | null
  /** `manifest.json`'s `description`, else `null`. */
  description: string | null
  /** `adapter_model.safetensors` and its tensors' storage formats. */
  weights: WeightFilesInfo
}

/** What `inspect(path)` resolves with: tell the two apart by `type`. */
export type Inspection = ModelInspection | AdapterInspection
