// Experts and routing: `Runtime.loadExpert` options, `manifest.json`, the router's settings and decisions.

import type { DownloadProgress, HubOptions } from './load'

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
