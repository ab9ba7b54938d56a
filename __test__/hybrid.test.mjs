// The hybrid families through the public API: Qwen3.5 (`qwen3_5_text`: Gated DeltaNet layers and
// gated attention) on __test__/fixtures/qwen35-tiny and LFM2 (short convolutions and attention)
// on lfm2-tiny, both from scripts/gen_hybrid_fixtures.py. Each session keeps a recurrent state
// beside its KV blocks: its next turn continues from it, batched rows continue each their own,
// speculative drafts a sample rejects are rolled back out of it, and sessions that cannot all
// hold one take turns.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { assertQ8FollowsHf } from './family-suite.mjs'
import { collect, fixture, fixtureJson, GREEDY, LOGPROB_TOL, reference } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')

const EAGER = { type: 'ngram', ngram: 1, minNgram: 1, maxDraft: 4 }

function assertSteps(chunks, steps, what) {
  assert.deepEqual(chunks.map((c) => c.tokenId), steps.map((s) => s.token), `${what}: greedy tokens differ`)
  chunks.forEach((c, i) => assert.ok(Math.abs(c.logprob - steps[i].logprob) <= LOGPROB_TOL, `${what} step ${i}: ${c.logprob} vs ${steps[i].logprob}`))
}

for (const [name, family, ggufFamily] of [['qwen35-tiny', 'qwen3_5_text', 'qwen35'], ['lfm2-tiny', 'lfm2', 'lfm2']]) {
  const ref = reference(name)
  describe(`hybrid ${family}: ${name}`, () => {
    let rt
    before(async () => {
      rt = await Runtime.load(fixture(name))
    })
    after(() => rt?.dispose())

    it('answers as HF from safetensors and from its GGUF, a 150-token prompt too; reports its states', async () => {
      const stats = rt.stats()
      assert.equal(stats.kvStateSlots, 32)
      assert.ok(stats.kvStateBytesPerSequence > 0)
      for (const r of [rt, await Runtime.load(fixture(name, 'model-f32.gguf'))]) {
        try {
          assert.equal(r.info.family, r === rt ? family : ggufFamily)
          for (const [prompt, steps] of [[ref.prompt_ids, ref.f32.steps], [ref.long.prompt_ids, ref.long.f32.steps]]) {
            const { chunks } = await collect(r.createSession().generate({ tokens: prompt }, { ...GREEDY, maxTokens: steps.length }))
            // (HF's chunked and token-by-token forms differ by up to 2e-4 at 150 tokens.)
            if (prompt === ref.prompt_ids) assertSteps(chunks, steps, r === rt ? 'safetensors' : 'GGUF')
            else assert.deepEqual(chunks.map((c) => c.tokenId), steps.map((s) => s.token))
          }
          if (ref.llamacpp?.tokens && r !== rt) {
            const { chunks } = await collect(r.createSession().generate({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: ref.llamacpp.tokens.length }))
            assert.deepEqual(chunks.map((c) => c.tokenId), ref.llamacpp.tokens)
          }
        } finally {
          if (r !== rt) await r.dispose()
        }
      }
    })

    it('a second turn continues from the session state (cachedTokens) and answers as HF', async () => {
      const s = rt.createSession()
      const a = await s.complete({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: ref.f32.steps.length })
      assert.deepEqual(a.tokens, ref.f32.steps.map((st) => st.token))
      const b = await s.complete({ tokens: ref.second_turn.prompt_ids }, { ...GREEDY, maxTokens: ref.second_turn.f32.steps.length })
      assert.equal(b.usage.cachedTokens, ref.prompt_ids.length + ref.f32.steps.length - 1)
      assert.deepEqual(b.tokens, ref.second_turn.f32.steps.map((st) => st.token))
      assert.ok(rt.stats().kvStateSlotsUsed >= 1)
    })

    it('6 concurrent sessions decode in one batch exactly as each alone', async () => {
      const runs = Array.from({ length: 6 }, (_, i) => ref.long.prompt_ids.slice(i * 7, i * 7 + 5 + 9 * i))
      const solo = []
      for (const tokens of runs) solo.push((await rt.createSession().complete({ tokens }, { ...GREEDY, maxTokens: 12 })).tokens)
      const together = await Promise.all(runs.map((tokens) => rt.createSession().complete({ tokens }, { ...GREEDY, maxTokens: 12 })))
      assert.deepEqual(together.map((r) => r.tokens), solo)
    })

    it('embeddings of texts batched together equal each alone (each text its own state)', async () => {
      const texts = ['hello there', 'a longer text about robots and signs', 'x']
      const together = await rt.embed(texts)
      // (Up to f32 rounding: the products of a batch of other size sum in another order.)
      for (const [i, t] of texts.entries()) {
        const alone = (await rt.embed([t]))[0]
        const worst = alone.reduce((m, v, j) => Math.max(m, Math.abs(v - together[i][j])), 0)
        assert.ok(worst < 1e-5, `text ${i}: ${worst}`)
      }
    })

    it('speculative decoding keeps the greedy tokens: rejected drafts leave the state', async () => {
      const plain = await rt.createSession().complete({ tokens: ref.long.prompt_ids }, { ...GREEDY, maxTokens: 24 })
      const spec = await rt.createSession().complete({ tokens: ref.long.prompt_ids }, { ...GREEDY, maxTokens: 24, speculative: EAGER })
      assert.deepEqual(spec.tokens, plain.tokens)
      assert.ok(spec.usage.draftTokens > 0 && spec.usage.acceptedDraftTokens < spec.usage.draftTokens, JSON.stringify(spec.usage))
      // The session goes on from the settled state.
      const s = rt.createSession()
      await s.complete({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: 8, speculative: EAGER })
      const next = await s.complete({ tokens: [50, 60] }, { ...GREEDY, maxTokens: 8 })
      const fresh = rt.createSession()
      await fresh.complete({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: 8 })
      assert.deepEqual(next.tokens, (await fresh.complete({ tokens: [50, 60] }, { ...GREEDY, maxTokens: 8 })).tokens)
    })

    it('sessions sharing a prompt prefix start from a state snapshot taken where the shared blocks end, and answer as cold', async () => {
      const r = await Runtime.load(fixture(name))
      try {
        const shared = ref.long.prompt_ids.slice(0, 100)
        const prompts = [7, 11, 13, 17].map((k) => [...shared, ...ref.long.prompt_ids.slice(100 + k, 108 + k)])
        const runs = []
        for (const tokens of prompts) runs.push(await r.createSession().complete({ tokens }, { ...GREEDY, maxTokens: 8 }))
        // The first computes all; the second finds 6 shared blocks but no state there, and leaves
        // one; the others start from it.
        assert.deepEqual(runs.map((x) => x.usage.cachedTokens), [0, 0, 96, 96])
        for (const [i, tokens] of prompts.entries()) {
          const cold = await rt.createSession().complete({ tokens }, { ...GREEDY, maxTokens: 8 })
          assert.deepEqual(runs[i].tokens, cold.tokens, `prompt ${i}`)
        }
      } finally {
        await r.dispose()
      }
    })

    it('with one state slot, sessions take turns and an evicted session starts over', async () => {
      const one = await Runtime.load(fixture(name), { kvCache: { maxSequences: 1 } })
      try {
        assert.equal(one.stats().kvStateSlots, 1)
        const runs = [3, 6, 9].map((n) => ref.long.prompt_ids.slice(0, n))
        const together = await Promise.all(runs.map((tokens) => one.createSession().complete({ tokens }, { ...GREEDY, maxTokens: 6 })))
        const solo = []
        for (const tokens of runs) solo.push((await rt.createSession().complete({ tokens }, { ...GREEDY, maxTokens: 6 })).tokens)
        assert.deepEqual(together.map((r) => r.tokens), solo)
        const a = one.createSession()
        await a.complete({ tokens: runs[0] }, { ...GREEDY, maxTokens: 4 })
        await one.createSession().complete({ tokens: runs[1] }, { ...GREEDY, maxTokens: 4 })
        const again = await a.complete({ tokens: [50] }, { ...GREEDY, maxTokens: 4 })
        assert.equal(again.usage.cachedTokens, 0, 'its state went to the other session')
      } finally {
        await one.dispose()
      }
    })

    if (name === 'qwen35-tiny') {
      it('a LoRA on in_proj_qkv, in_proj_z, out_proj and the attention and MLP projections answers as PEFT, batched with the base', async () => {
        const cases = fixtureJson(name, 'experts', 'reference.json').cases
        await rt.loadExpert(fixture(name, 'experts', 'lora'), { name: 'lora' })
        const c = cases.lora
        const { chunks } = await collect(rt.createSession().generate({ tokens: c.prompt_ids }, { ...GREEDY, maxTokens: c.steps.length, experts: ['lora'] }))
        assertSteps(chunks, c.steps, 'lora')
        const both = await Promise.all([['lora'], []].map((experts) => rt.createSession().complete({ tokens: c.prompt_ids }, { ...GREEDY, maxTokens: c.steps.length, experts })))
        assert.deepEqual(both[0].tokens, c.steps.map((s) => s.token))
        assert.deepEqual(both[1].tokens, cases.base.steps.map((s) => s.token))
        // A GGUF base keeps the value heads in llama.cpp's order: the same adapter is refused.
        const g = await Runtime.load(fixture(name, 'model-f32.gguf'))
        try {
          await assert.rejects(g.loadExpert(fixture(name, 'experts', 'lora')), (e) => e.code === 'UNSUPPORTED_ADAPTER' && /linear_attn/.test(e.message))
        } finally {
          await g.dispose()
        }
      })
    }

    it("contextShift 'drop-oldest' re-evaluates what is kept: a shifted turn runs as the kept conversation in a fresh session", async () => {
      const small = await Runtime.load(fixture(name), { contextLength: 192 })
      try {
        const turn = { ...GREEDY, maxTokens: 16 }
        const s = small.createSession({ system: 'You answer in one short sentence.', contextShift: 'drop-oldest' })
        let last
        for (let i = 0; i < 10; i++) last = await s.complete(`Question ${i}: what is the weather like today?`, turn)
        const kept = s.history.slice(0, -1)
        assert.ok(kept.length < 1 + 2 * 10, 'turns were dropped')
        const fresh = small.createSession()
        fresh.setHistory(kept.slice(0, -1))
        const again = await fresh.complete(kept.at(-1).content, turn)
        assert.deepEqual(again.tokens, last.tokens)
        assert.equal(again.usage.promptTokens, last.usage.promptTokens)
      } finally {
        await small.dispose()
      }
    })

    it('a KV cache of f16 for the attention layers (the states stay f32) follows HF until a near-tie', async () => {
      const h = await Runtime.load(fixture(name), { kvCache: { dtype: 'f16' } })
      try {
        await assertQ8FollowsHf(h, ref)
      } finally {
        await h.dispose()
      }
    })

    it('quantize-on-load (q8_0) follows HF until a near-tie', async () => {
      const q = await Runtime.load(fixture(name), { quantize: 'q8_0' })
      try {
        await assertQ8FollowsHf(q, ref)
      } finally {
        await q.dispose()
      }
    })
  })
}
