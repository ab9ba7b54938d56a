// EmbeddingModelV3 over Runtime.embed: the base model's pooled final hidden states, under the id's experts.

import { TooManyEmbeddingValuesForCallError } from '@ai-sdk/provider'
import type { EmbeddingModelV3, EmbeddingModelV3CallOptions, EmbeddingModelV3Result } from '@ai-sdk/provider'
import type { Runtime } from '../runtime'
import { throwIfAborted, untilAborted } from './abort'
import type { ExpertRuntimeModelId } from './model-id'
import { embedOptions } from './options'

/**
 * An embedding model of `createExpertRuntime` (`embed`, `embedMany`): one vector per text,
 * `info.hiddenSize` long, unit length unless `normalize: false`. `usage.tokens` counts the
 * texts' tokens as the engine reads them. The engine evaluates texts as rows of its batched
 * passes, beside running decodes, so `embedMany`'s calls (`maxEmbeddingsPerCall` texts each)
 * run in parallel; an aborted call rejects at once (the engine finishes the texts it has and
 * the vectors are dropped).
 */
export class ExpertRuntimeEmbeddingModel implements EmbeddingModelV3 {
  readonly specificationVersion = 'v3'
  readonly provider = 'expert-runtime'
  readonly modelId: ExpertRuntimeModelId
  readonly maxEmbeddingsPerCall: number
  readonly supportsParallelCalls = true
  // Plain (TypeScript-private) fields, not `#private` ones: the AI SDK 7 wraps v3 models in
  // Proxies that call methods with the proxy as `this`, where `#private` fields cannot be read.
  private readonly runtime: () => Promise<Runtime>
  private readonly experts: string[]

  /** @internal */
  constructor(modelId: ExpertRuntimeModelId, experts: string[], runtime: () => Promise<Runtime>, maxEmbeddingsPerCall: number) {
    this.modelId = modelId
    this.experts = experts
    this.runtime = runtime
    this.maxEmbeddingsPerCall = maxEmbeddingsPerCall
  }

  async doEmbed(options: EmbeddingModelV3CallOptions): Promise<EmbeddingModelV3Result> {
    if (options.values.length > this.maxEmbeddingsPerCall) {
      throw new TooManyEmbeddingValuesForCallError({ provider: this.provider, modelId: this.modelId, maxEmbeddingsPerCall: this.maxEmbeddingsPerCall, values: options.values })
    }
    const embed = embedOptions(options.providerOptions, this.experts)
    const rt = await this.runtime()
    throwIfAborted(options.abortSignal)
    const vectors = await untilAborted(rt.embed(options.values, embed), options.abortSignal)
    let tokens = 0
    // Tokenized as Runtime.embed reads a text (the tokenizer's default special tokens).
    for (const text of options.values) tokens += rt.tokenize(text).length
    return { embeddings: vectors.map((v) => Array.from(v)), usage: { tokens }, warnings: [] }
  }
}
