// createExpertRuntime: the AI SDK provider (ProviderV3) of one Runtime, in-process.

import { NoSuchModelError } from '@ai-sdk/provider'
import type { EmbeddingModelV3, ImageModelV3, LanguageModelV3, ProviderV3 } from '@ai-sdk/provider'
import { checkInt, onlyKeys, optionKeys, optionsObject } from '../checks'
import { invalidArgument } from '../errors'
import type { Runtime } from '../runtime'
import { ExpertRuntimeEmbeddingModel } from './embedding-model'
import { ExpertRuntimeLanguageModel } from './language-model'
import { selectionOf, type ExpertRuntimeModelId } from './model-id'

/** Options of `createExpertRuntime`. */
export interface ExpertRuntimeProviderSettings {
  /** The base model's id (no experts), as the OpenAI server's `modelName`. Default `'base'`. */
  modelName?: string
  /** Texts per embedding call; `embedMany` splits longer lists into parallel calls. Default 256. */
  maxEmbeddingsPerCall?: number
}

/**
 * The provider: `provider(id)` / `languageModel(id)` for text, `embeddingModel(id)` for vectors.
 * An id is the base model's (`'base'`), an expert's name, several joined with `+` (`'sql+terse'`,
 * applied in that order), or `'auto'` (the router picks per request; language models only).
 */
export interface ExpertRuntimeProvider extends ProviderV3 {
  (modelId: ExpertRuntimeModelId): LanguageModelV3
  languageModel(modelId: ExpertRuntimeModelId): LanguageModelV3
  embeddingModel(modelId: ExpertRuntimeModelId): EmbeddingModelV3
  /** @deprecated The AI SDK's older name of `embeddingModel`. */
  textEmbeddingModel(modelId: ExpertRuntimeModelId): EmbeddingModelV3
  /** Throws `NoSuchModelError`: the runtime makes no images. */
  imageModel(modelId: string): ImageModelV3
}

const SETTINGS_KEYS = optionKeys<ExpertRuntimeProviderSettings>({ modelName: true, maxEmbeddingsPerCall: true })

/**
 * An AI SDK provider over `runtime` (which may still be loading: calls wait for it, and reject
 * with its error if it fails). Each call runs one request on a fresh session of the runtime; the
 * runtime stays the caller's to dispose.
 *
 * ```ts
 * const er = createExpertRuntime(Runtime.load('/models/SmolLM2-135M-Instruct.Q4_1.gguf'))
 * const { text } = await generateText({ model: er('base'), prompt: 'Say hi' })
 * ```
 */
export function createExpertRuntime(runtime: Runtime | Promise<Runtime>, settings?: ExpertRuntimeProviderSettings): ExpertRuntimeProvider {
  const s = optionsObject(settings, 'settings')
  onlyKeys(s, SETTINGS_KEYS, 'createExpertRuntime')
  const baseId = s.modelName ?? 'base'
  if (typeof baseId !== 'string' || baseId.length === 0 || baseId === 'auto' || baseId.includes('+')) {
    throw invalidArgument("modelName must be a non-empty string other than 'auto', without '+'")
  }
  const maxEmbeddingsPerCall = s.maxEmbeddingsPerCall === undefined ? 256 : checkInt('maxEmbeddingsPerCall', s.maxEmbeddingsPerCall, 1)
  const ready = Promise.resolve(runtime)
  // A load that fails is reported by the calls that wait for it, not as an unhandled rejection.
  ready.catch(() => {})
  const rt = () => ready

  const languageModel = (modelId: ExpertRuntimeModelId) => new ExpertRuntimeLanguageModel(modelId, selectionOf(modelId, baseId, 'languageModel'), rt)
  const embeddingModel = (modelId: ExpertRuntimeModelId) => {
    const selection = selectionOf(modelId, baseId, 'embeddingModel') as string[]
    return new ExpertRuntimeEmbeddingModel(modelId, selection, rt, maxEmbeddingsPerCall)
  }
  const provider = (modelId: ExpertRuntimeModelId) => languageModel(modelId)
  return Object.assign(provider, {
    specificationVersion: 'v3' as const,
    languageModel,
    embeddingModel,
    textEmbeddingModel: embeddingModel,
    imageModel: (modelId: string): ImageModelV3 => {
      throw new NoSuchModelError({ modelId, modelType: 'imageModel', message: `expert-runtime has no image models (asked for '${modelId}')` })
    },
  })
}
