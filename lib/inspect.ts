import { bindingFor } from './binding'
import type * as N from '../native'
import { invalidArgument, toError } from './errors'
import type {
  AdapterInspection,
  AdapterKind,
  Inspection,
  ModelInspection,
  RopeScalingInfo,
  TokenizerInspection,
  WeightFilesInfo,
} from './types'

function weights(w: N.JsWeightsSummary): WeightFilesInfo {
  return { ...w, container: w.container as WeightFilesInfo['container'], formats: w.formats.map((f) => ({ ...f })) }
}

function tokenizer(t: N.JsTokenizerInspection): TokenizerInspection {
  return {
    source: t.source as TokenizerInspection['source'],
    model: t.model,
    pre: t.pre ?? null,
    vocabSize: t.vocabSize,
    bos: t.bos ? { id: t.bos.id, text: t.bos.text ?? null } : null,
    eos: t.eos.map((e) => ({ id: e.id, text: e.text ?? null })),
    addsBos: t.addsBos,
    chatTemplate: t.chatTemplate ?? null,
  }
}

function model(path: string, m: N.JsModelInspection): ModelInspection {
  return {
    type: 'model',
    path,
    architecture: m.architecture,
    family: m.family,
    plan: [...m.plan],
    vocabSize: m.vocabSize,
    hiddenSize: m.hiddenSize,
    intermediateSize: m.intermediateSize,
    numLayers: m.numLayers,
    numHeads: m.numHeads,
    numKvHeads: m.numKvHeads,
    headDim: m.headDim,
    contextLength: m.contextLength,
    ropeTheta: m.ropeTheta,
    ropeScaling: m.ropeScaling ? (JSON.parse(m.ropeScaling) as RopeScalingInfo) : null,
    rmsNormEps: m.rmsNormEps,
    tieWordEmbeddings: m.tieWordEmbeddings,
    declaredDtype: m.declaredDtype ?? null,
    bosTokenId: m.bosTokenId ?? null,
    eosTokens: m.eosTokens.map((e) => ({ id: e.id, text: e.text ?? null })),
    weights: weights(m.weights),
    tokenizer: m.tokenizer ? tokenizer(m.tokenizer) : null,
    warnings: [...m.warnings],
  }
}

function adapter(path: string, a: N.JsAdapterInspection): AdapterInspection {
  return {
    type: 'adapter',
    path,
    kind: a.kind as AdapterKind,
    rank: a.rank ?? null,
    alpha: a.alpha ?? null,
    targetModules: [...a.targetModules],
    targetModulesRegex: a.targetModulesRegex,
    numVirtualTokens: a.numVirtualTokens ?? null,
    baseModel: a.baseModel ?? null,
    baseModelClass: a.baseModelClass ?? null,
    name: a.name ?? null,
    description: a.description ?? null,
    weights: weights(a.weights),
  }
}

/**
 * Describes a model (HF directory or GGUF file) or a PEFT adapter directory from its files,
 * without loading weights: architecture and sizes, tensor storage formats, tokenizer, special
 * tokens and chat template; or an adapter's method, rank, targets and base model. Runs off the
 * JS thread. A file a load would refuse is refused the same way (`INVALID_MODEL`,
 * `INVALID_ADAPTER`, `UNSUPPORTED_ARCHITECTURE`, `MODEL_NOT_FOUND`, …). Whether an adapter
 * fits a base model needs the base: load it and call `loadExpert`.
 */
export async function inspect(path: string): Promise<Inspection> {
  if (typeof path !== 'string' || path.length === 0) throw invalidArgument('path must be a non-empty string')
  const { binding } = bindingFor('cpu')
  let r: N.JsInspection
  try {
    r = await binding.inspectModel(path)
  } catch (e) {
    throw toError(e)
  }
  if (r.model) return model(path, r.model)
  if (r.adapter) return adapter(path, r.adapter)
  throw toError(new Error('INTERNAL: inspect returned nothing'))
}
