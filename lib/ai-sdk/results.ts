// What a finished request reports, in the AI SDK's terms: finish reason, usage and provider metadata.

import type { JSONObject, LanguageModelV3FinishReason, LanguageModelV3Usage, SharedV3ProviderMetadata } from '@ai-sdk/provider'
import type { CompletionResult, CompletionUsage, FinishReason } from '../types'
import { PROVIDER_OPTIONS_KEY } from './options'

const UNIFIED: { [R in FinishReason]: LanguageModelV3FinishReason['unified'] } = {
  stop: 'stop',
  length: 'length',
  tool_calls: 'tool-calls',
  // Cancelled by something other than the call's own abortSignal (an abort rejects instead):
  // `GenerationStream.cancel()`, or the runtime disposed mid-answer.
  cancelled: 'other',
}

/** `finishReason` as the AI SDK reads it; `raw` is the engine's own. */
export function finishReasonOf(reason: FinishReason | undefined): LanguageModelV3FinishReason {
  if (reason === undefined) return { unified: 'error', raw: undefined }
  return { unified: UNIFIED[reason] ?? 'other', raw: reason }
}

/**
 * Token counts in the AI SDK's shape; `raw` holds the engine's own, speculative decoding's
 * included. `outputTokens.reasoning` is the engine's count of the thought's tokens (its markers
 * included), `text` the rest.
 */
export function usageOf(usage: CompletionUsage | undefined): LanguageModelV3Usage {
  if (!usage) {
    return {
      inputTokens: { total: undefined, noCache: undefined, cacheRead: undefined, cacheWrite: undefined },
      outputTokens: { total: undefined, text: undefined, reasoning: undefined },
    }
  }
  return {
    inputTokens: { total: usage.promptTokens, noCache: usage.promptTokens - usage.cachedTokens, cacheRead: usage.cachedTokens, cacheWrite: undefined },
    outputTokens: { total: usage.completionTokens, text: usage.completionTokens - usage.reasoningTokens, reasoning: usage.reasoningTokens },
    raw: { ...usage },
  }
}

/**
 * `providerMetadata['expert-runtime']`: the experts the request ran under (`[]`: the base model;
 * with `'auto'`, the router's choice), the router's decision, and where the time went.
 */
export function providerMetadataOf(result: CompletionResult): SharedV3ProviderMetadata {
  const meta: JSONObject = { experts: [...result.experts], timings: { ...result.timings } }
  if (result.routing) meta.routing = JSON.parse(JSON.stringify(result.routing)) as JSONObject
  return { [PROVIDER_OPTIONS_KEY]: meta }
}
