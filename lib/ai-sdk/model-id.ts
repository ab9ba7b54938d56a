// Model ids of the provider: which experts a model runs under, as the OpenAI server reads its `model` field.

import { NoSuchModelError } from '@ai-sdk/provider'

/** What a model id selects: the experts it runs under (`[]`: the base model) or `'auto'` (the router picks). */
export type Selection = string[] | 'auto'

/**
 * The model ids a provider knows: the base model's id (`modelName`, default `'base'`), an
 * expert's name, several joined with `+` (applied in that order), or `'auto'`. Any string is
 * accepted here: experts are checked when a call runs, against those loaded then.
 */
export type ExpertRuntimeModelId = 'base' | 'auto' | (string & {})

type ModelType = 'languageModel' | 'embeddingModel'

/**
 * `modelId` → experts. Only the id's shape is checked here (a non-empty string, no empty or
 * repeated name): experts may be loaded after the model object is made, so whether each is
 * loaded is the engine's to say when a call runs (`EXPERT_NOT_FOUND`).
 */
export function selectionOf(modelId: unknown, baseId: string, modelType: ModelType): Selection {
  const refuse = (message: string) => new NoSuchModelError({ modelId: String(modelId), modelType, message })
  if (typeof modelId !== 'string' || modelId.length === 0) throw refuse('expert-runtime: a model id must be a non-empty string')
  if (modelId === baseId) return []
  if (modelId === 'auto') {
    if (modelType === 'embeddingModel') {
      throw refuse("expert-runtime: 'auto' (the router) picks experts for a conversation, not for embeddings: name the base model or experts")
    }
    return 'auto'
  }
  const names = modelId.split('+')
  if (names.some((n) => n.length === 0)) throw refuse(`expert-runtime: model id '${modelId}' has an empty expert name (join names with '+': 'a+b')`)
  if (new Set(names).size !== names.length) throw refuse(`expert-runtime: model id '${modelId}' names an expert twice`)
  return names
}
