// Sessions and requests: `createSession` options, `generate` / `complete` input and options, chunks and results.

import type { ChatMessage, ResponseFormat, Tool, ToolCall, ToolCallDelta, ToolChoice } from './chat'
import type { RouteDecision } from './experts'

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
  /**
   * Whether a model that thinks before it answers (Qwen3, Qwen3.5, SmolLM3, an expert whose
   * manifest declares `reasoning`) does so: `false` (or `{ budgetTokens: 0 }`) answers at once;
   * `true` thinks as long as it wants; `{ budgetTokens: n }` closes the thought with the
   * template's own closing marker after `n` thought tokens and lets the answer follow.
   * Default: the chat template's default (thinking, for Qwen3). The thought arrives in
   * `TokenChunk.reasoning` and `CompletionResult.reasoning`, never in `text`. Ignored by a
   * model that does not think.
   */
  thinking?: boolean | ThinkingOptions
  /** Alias of `thinking: boolean` (passed to the chat template as `enable_thinking`). */
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

/** `GenerateOptions.thinking` with a budget. */
export interface ThinkingOptions {
  /** Most thought tokens (0–2^31-1); 0 means no thought. The closing marker's tokens are not counted. */
  budgetTokens: number
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
      model: import('../runtime').Runtime
      /** Draft tokens per step at most (1–64, default 4); the length adapts to what is accepted. */
      maxDraft?: number
    }

/** One generated token, as a stream yields it. */
export interface TokenChunk {
  /** The token's id in the model's vocabulary. */
  tokenId: number
  /**
   * The answer text this token wrote. May be '' while a UTF-8 character is incomplete or text
   * may become a stop string, and while the model thinks.
   */
  text: string
  /** The thought text this token wrote (markers left out), while a thinking model thinks. */
  reasoning?: string
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
  /** Of `completionTokens`, those of the thought, its markers included (thinking models; 0 otherwise). */
  reasoningTokens: number
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
  /** The answer's text (tool-call markup and the thought left out). */
  text: string
  /** The model's thought before the answer, without its markers (thinking models only). */
  reasoning?: string
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
