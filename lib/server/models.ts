import type { Runtime } from '../runtime'
import type { GenerateInput, RouteDecision } from '../types'
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

/** The experts a request runs under, known before it starts (what a streamed answer announces). */
export interface ExpertRun {
  /** In application order (manifest `load_order`, then as selected), as `CompletionResult.experts`. */
  experts: string[]
  /** The router's decision, for `model: "auto"`. */
  routing: RouteDecision | null
}

/**
 * Resolves a selection before the request starts: `auto` is routed here with `rt.route`, on
 * the text the engine would route (the conversation's last user turn, or the prompt; a
 * token-id prompt by its detokenized text), and the request then runs with the chosen experts.
 * That way the first chunk of a streamed answer can already say which experts run.
 */
export async function resolveExperts(rt: Runtime, selection: Selection, input: GenerateInput): Promise<ExpertRun> {
  if (selection !== 'auto') return { experts: applicationOrder(rt, selection), routing: null }
  const query = typeof input === 'string' || Array.isArray(input) ? input : 'text' in input ? input.text : rt.detokenize(input.tokens)
  const routing = await rt.route(query)
  return { experts: applicationOrder(rt, routing.experts), routing }
}

/** `names` in the order the engine applies them: ascending manifest `load_order` (0 without), then as listed. */
function applicationOrder(rt: Runtime, names: string[]): string[] {
  const order = new Map(rt.experts.map((e) => [e.name, e.manifest?.load_order ?? 0]))
  return names
    .map((name, i) => ({ name, i, key: order.get(name) ?? 0 }))
    .sort((a, b) => a.key - b.key || a.i - b.i)
    .map((x) => x.name)
}
