import type { Runtime } from '../runtime'
import type { CompletionResult, RouteDecision, TokenChunk } from '../types'
import { badRequest, notFound } from './errors'

/** What a request's `model` selects: the experts it runs under (`[]`: the base model). */
export type Selection = string[] | 'auto'

/**
 * `model` → experts: the base model's id, an expert's name, several joined with `+`, or
 * `auto` (the router picks). Missing: the base model. Unknown: 404 `model_not_found`.
 */
export function selectModel(rt: Runtime, baseId: string, model: unknown): Selection {
  if (model === undefined || model === null || model === baseId) return []
  if (typeof model !== 'string') throw badRequest('model must be a string', 'model')
  if (model === 'auto') return 'auto'
  const loaded = new Set(rt.experts.map((e) => e.name))
  const names = model.split('+')
  for (const n of names) {
    if (!loaded.has(n)) throw notFound(`The model '${model}' does not exist: '${n}' is neither the base model ('${baseId}') nor a loaded expert`, 'model_not_found')
  }
  if (new Set(names).size !== names.length) throw badRequest(`model '${model}' names an expert twice`, 'model')
  return names
}

/** `GET /v1/models`: the base model, every loaded expert, and `auto`. */
export function listModels(rt: Runtime, baseId: string, created: number) {
  const entry = (id: string, extra: Record<string, unknown> = {}) => ({ id, object: 'model', created, owned_by: 'expert-runtime', ...extra })
  return {
    object: 'list',
    data: [
      entry(baseId, { root: baseId }),
      ...rt.experts.map((e) => entry(e.name, { root: baseId, parent: baseId, kind: e.kind })),
      entry('auto', { root: baseId, parent: baseId, description: 'the router picks the experts for each request' }),
    ],
  }
}

/** The experts a request ran under, as answers announce them (`expert_runtime`). */
export interface ExpertRun {
  /** In application order (manifest `load_order`, then as selected), as `CompletionResult.experts`. */
  experts: string[]
  /** The router's decision, for `model: "auto"`. */
  routing: RouteDecision | null
}

/**
 * What a generation's first chunk (or, when it wrote none, its result) says about the experts
 * it runs under: the engine routes `auto` when it admits the request, among the experts
 * loaded then, and says so in the first chunk, so a streamed answer can name them before its
 * first token and an expert unloaded meanwhile is never picked.
 */
export function expertRun(from: Pick<TokenChunk, 'experts' | 'routing'> | Pick<CompletionResult, 'experts' | 'routing'>): ExpertRun {
  return { experts: from.experts ?? [], routing: from.routing ?? null }
}
