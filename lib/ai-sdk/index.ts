// `expert-runtime/ai-sdk`: a Vercel AI SDK provider (specification v3: `ai` 6, and `ai` 7 through
// its v3 adapter) over an in-process Runtime. It translates; the engine does the work.
export { createExpertRuntime } from './provider'
export type { ExpertRuntimeProvider, ExpertRuntimeProviderSettings } from './provider'
export type { ExpertRuntimeModelId } from './model-id'
export type { ExpertRuntimeEmbeddingModelOptions, ExpertRuntimeLanguageModelOptions } from './options'
export { ExpertRuntimeLanguageModel } from './language-model'
export { ExpertRuntimeEmbeddingModel } from './embedding-model'
