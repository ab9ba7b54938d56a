// Mistral and Ministral through the public API on __test__/fixtures/mistral-tiny (every layer
// sliding, window 6) and ministral-tiny (sliding and full layers by layer_types, window 5), tiny
// random models from scripts/gen_mistral_fixtures.py. Both run as Llama's network with a
// window. Greedy f32 parity is in generate.test.mjs with the other families; here: a second turn
// continues past the window from the session's cache, prefixes are shared, and a batch of
// sessions of different lengths decodes exactly as each alone.
import { describe, before, after } from 'node:test'
import { createRequire } from 'node:module'
import { fixture, reference } from './helpers.mjs'
import { itRunsSessionsPastTheWindow } from './window-sessions.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')

for (const name of ['mistral-tiny', 'ministral-tiny']) {
  describe(`${name}: past the window through the API`, () => {
    const ref = reference(name)
    let rt
    before(async () => {
      rt = await Runtime.load(fixture(name))
    })
    after(() => rt?.dispose())

    itRunsSessionsPastTheWindow(() => rt, ref, fixture(name))
  })
}
