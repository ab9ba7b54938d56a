// The `quantize` and `mmap` load options through the public API: what `info` reports, that
// `quantize: 'q8_0'` on the f32 safetensors runs exactly as the Q8_0 GGUF converted from the same
// weights (with and without an expert on top), and bad values. The numerics against HF on the
// quantized weights are in tests/quantize.rs.
import { describe, it } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import path from 'node:path'
import { collect, fixture, GREEDY, reference, coded } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')


const ref = reference('qwen3-tiny')

/** Greedy tokens of `model` loaded with `options`, without and with the `lora` fixture expert. */
async function greedy(model, options) {
  const rt = await Runtime.load(model, options)
  try {
    await rt.loadExpert(fixture('adapters', 'lora'), { name: 'lora' })
    const s = rt.createSession()
    const run = async (experts) =>
      (await collect(s.generate({ tokens: ref.prompt_ids }, { ...GREEDY, maxTokens: 16, experts }))).result.tokens
    return { info: rt.info, base: await run([]), lora: await run(['lora']) }
  } finally {
    await rt.dispose()
  }
}

describe('quantize and mmap (qwen3-tiny)', () => {
  it("quantize: 'q8_0' on the f32 safetensors runs as the converted Q8_0 GGUF, experts included", async () => {
    const gguf = await greedy(path.join(fixture('qwen3-tiny'), 'model-q8_0.gguf'))
    const dense = await greedy(fixture('qwen3-tiny'))
    for (const source of [fixture('qwen3-tiny'), path.join(fixture('qwen3-tiny'), 'model-f32.gguf')]) {
      const q8 = await greedy(source, { quantize: 'q8_0' })
      assert.equal(q8.info.quantization, 'q8_0')
      assert.equal(q8.info.weightBytes, gguf.info.weightBytes)
      assert.ok(q8.info.weightBytes * 3 < dense.info.weightBytes, `${q8.info.weightBytes} vs dense ${dense.info.weightBytes}`)
      assert.deepEqual(q8.base, gguf.base)
      assert.deepEqual(q8.lora, gguf.lora)
      assert.notDeepEqual(q8.lora, q8.base, 'the expert applies on top of the quantized base')
    }
    assert.equal(dense.info.quantization, 'none')
    assert.equal(gguf.info.quantization, 'q8_0')
  })

  it('q4_0 and q4_k: smaller still, generation runs with experts; rows of 64 fall back to formats that fit', async () => {
    const q8 = await greedy(fixture('qwen3-tiny'), { quantize: 'q8_0' })
    for (const quantize of ['q4_0', 'q4_k']) {
      const q4 = await greedy(fixture('qwen3-tiny'), { quantize })
      // 64-wide rows hold no 256-value K-quant block: the projections are q4_0, the
      // embedding (no q6_k either) q8_0.
      assert.match(q4.info.quantization, /^(q4_0\+q8_0|q8_0\+q4_0)$/)
      assert.ok(q4.info.weightBytes < q8.info.weightBytes)
      assert.equal(q4.base.length, 16)
      assert.notDeepEqual(q4.lora, q4.base)
    }
  })

  it('mmap: false copies the weights and changes nothing else', async () => {
    const mapped = await greedy(fixture('qwen3-tiny'))
    const copied = await greedy(fixture('qwen3-tiny'), { mmap: false })
    assert.deepEqual(copied, mapped)
    assert.deepEqual(mapped.base, ref.f32.steps.map((s) => s.token))
  })

  it('bad values are INVALID_ARGUMENT', async () => {
    for (const options of [{ quantize: 'q3_k' }, { quantize: 'Q8_0' }, { quantize: 8 }, { quantize: null }, { mmap: 'yes' }, { mmap: 1 }]) {
      await assert.rejects(Runtime.load(fixture('qwen3-tiny'), options), coded('INVALID_ARGUMENT'), JSON.stringify(options))
    }
  })
})
