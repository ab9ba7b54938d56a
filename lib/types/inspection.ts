// What `inspect(path)` reads from a model or an adapter without loading it.

import type { ExpertKind } from './experts'
import type { RopeScalingInfo } from './runtime-info'

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
  /** The network the engine runs it as: `llama`, `qwen2`, `qwen3` or `gemma3`. */
  architecture: string
  /** The family as the checkpoint names it (see `RuntimeInfo.family`). */
  family: string
  /**
   * The layer plan the engine would run: one line per run of identical layers (mixer ·
   * feed-forward block · norms), then one per rotary embedding, then model-wide settings that
   * differ from a plain transformer's, e.g.
   * `layers 0–27: full attention (16 heads, 8 kv, head dim 128, rope 0, q/k norm) · gated MLP (SiLU, 3072) · pre-norm (w)`.
   */
  plan: string[]
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
