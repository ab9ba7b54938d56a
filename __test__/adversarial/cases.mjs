// The adversarial cases: hostile model files, adapters and API calls, generated from the
// fixtures with seeded PRNGs, so the same list (same ids, same bytes) comes out on every run
// and in every process. `buildCases()` is called by the test (for ids and expectations) and
// by each child (which runs the cases it is given by index; see child.mjs).
//
// A case is `{ cat, id, expect, ok, probe?, run(ctx) }`:
//   expect  codes the case may fail with (ExpertRuntimeError.code), the most specific code
//           that is right for it; anything else (INTERNAL, a TypeError, a crash, a hang) fails;
//   ok      whether succeeding is also fine (a mutated file can still be a valid one);
//   probe   codes allowed while the loaded model or adapter is exercised after a successful
//           load (default PROBE_CODES);
//   run     the case, with helpers from child.mjs (`ctx.load`, `ctx.probe`, `ctx.modelDir`…),
//           which also record the stage (`load`, `probe`, `call`) an error came from.
//
// The cases are written by entry point, one file each (model-cases, gguf-cases, adapter-cases,
// api-*-cases, recursion), from the hostile inputs they share (inputs.mjs); this module puts them
// together in one list, in that order.
import { adapterCases } from './adapter-cases.mjs'
import { apiExpertCases } from './api-expert-cases.mjs'
import { apiPersistCases } from './api-persist-cases.mjs'
import { apiRequestCases } from './api-request-cases.mjs'
import { apiRuntimeCases } from './api-runtime-cases.mjs'
import { ggufCases } from './gguf-cases.mjs'
import { generationConfigCases, hfConfigCases, safetensorsCases, specialFileCases, tokenizerCases } from './model-cases.mjs'
import { recursionCases } from './recursion.mjs'

export { PROBE_CODES, toJson } from './inputs.mjs'

// ---------------------------------------------------------------- the catalogue

export function buildCases() {
  const cases = []
  const add = (cat, id, expect, ok, run, extra = {}) => cases.push({ cat, id: `${cat}/${id}`, expect, ok, run, ...extra })
  hfConfigCases(add)
  safetensorsCases(add)
  tokenizerCases(add)
  generationConfigCases(add)
  specialFileCases(add)
  ggufCases(add)
  adapterCases(add)
  apiRuntimeCases(add)
  apiPersistCases(add)
  apiRequestCases(add)
  apiExpertCases(add)
  recursionCases(add)
  const seen = new Set()
  for (const c of cases) {
    if (seen.has(c.id)) throw new Error(`duplicate case id ${c.id}`)
    seen.add(c.id)
  }
  return cases
}
