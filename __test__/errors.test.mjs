// Load failures: each broken model must reject with its stable code (and a message that points
// at the problem), never crash or wedge the process: a good model still loads and generates
// after every failure.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { fixture, reference } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime, ExpertRuntimeError } = require('../dist/index.js')

const ref = reference('qwen3-tiny')

let tmp
before(async () => {
  tmp = await fs.promises.mkdtemp(path.join(os.tmpdir(), 'expert-runtime-errors-'))
})
after(async () => {
  if (tmp) await fs.promises.rm(tmp, { recursive: true, force: true })
})

/** A private copy of a fixture directory, optionally with its config.json edited. */
async function copyFixture(name, editConfig) {
  const dir = await fs.promises.mkdtemp(path.join(tmp, `${name}-`))
  await fs.promises.cp(fixture(name), dir, { recursive: true })
  if (editConfig) {
    const p = path.join(dir, 'config.json')
    const cfg = JSON.parse(await fs.promises.readFile(p, 'utf8'))
    editConfig(cfg)
    await fs.promises.writeFile(p, JSON.stringify(cfg, null, 2))
  }
  return dir
}

async function writeTmp(name, bytes) {
  const p = path.join(tmp, name)
  await fs.promises.writeFile(p, bytes)
  return p
}

/** Loads `p` expecting a rejection with `code`; returns the error. */
async function expectLoadError(p, code, options) {
  let err
  try {
    const rt = await Runtime.load(p, options)
    await rt.dispose()
  } catch (e) {
    err = e
  }
  assert.ok(err, `loading ${p} should fail with ${code}`)
  assert.ok(err instanceof ExpertRuntimeError, `${err?.name}: ${err?.message}`)
  assert.equal(err.code, code, err.message)
  assert.equal(typeof err.message, 'string')
  assert.ok(err.message.length > 0)
  return err
}

/** The process is fine: a good model loads and reproduces its greedy reference. */
async function assertHealthy() {
  const rt = await Runtime.load(fixture('qwen3-tiny'))
  try {
    const r = await rt.createSession().complete({ tokens: ref.prompt_ids }, { temperature: 0, maxTokens: 4 })
    assert.deepEqual(r.tokens, ref.f32.steps.slice(0, 4).map((s) => s.token))
  } finally {
    await rt.dispose()
  }
}

describe('Runtime.load failures', () => {
  it('missing path → MODEL_NOT_FOUND', async () => {
    const p = path.join(tmp, 'does-not-exist')
    const e = await expectLoadError(p, 'MODEL_NOT_FOUND')
    assert.match(e.message, /does-not-exist/)
    await assertHealthy()
  })

  it('directory without config.json → INVALID_MODEL', async () => {
    const dir = path.join(tmp, 'empty-dir')
    await fs.promises.mkdir(dir)
    const e = await expectLoadError(dir, 'INVALID_MODEL')
    assert.match(e.message, /config\.json/)
    await assertHealthy()
  })

  it('config.json that is not JSON → INVALID_MODEL', async () => {
    const dir = await copyFixture('qwen3-tiny')
    await fs.promises.writeFile(path.join(dir, 'config.json'), '{ not json')
    const e = await expectLoadError(dir, 'INVALID_MODEL')
    assert.match(e.message, /config\.json/)
    await assertHealthy()
  })

  it("config.json with model_type 'gpt2' → UNSUPPORTED_ARCHITECTURE", async () => {
    const dir = await copyFixture('qwen3-tiny', (c) => {
      c.model_type = 'gpt2'
      c.architectures = ['GPT2LMHeadModel']
    })
    const e = await expectLoadError(dir, 'UNSUPPORTED_ARCHITECTURE')
    assert.match(e.message, /gpt2/)
    await assertHealthy()
  })

  it('an unknown rope_scaling type → UNSUPPORTED_ARCHITECTURE naming it (4.x and 5.x config forms)', async () => {
    const v4 = await copyFixture('qwen3-tiny', (c) => {
      c.rope_scaling = { rope_type: 'mrope', type: 'mrope', mrope_section: [16, 24, 24] }
    })
    assert.match((await expectLoadError(v4, 'UNSUPPORTED_ARCHITECTURE')).message, /mrope/)
    const v5 = await copyFixture('qwen2-tiny', (c) => {
      c.rope_parameters = { rope_type: 'su', rope_theta: 1e6, factor: 4.0, original_max_position_embeddings: 128 }
    })
    assert.match((await expectLoadError(v5, 'UNSUPPORTED_ARCHITECTURE')).message, /"su"|\bsu\b/)
    await assertHealthy()
  })

  it('missing or broken tokenizer.json → INVALID_MODEL', async () => {
    const missing = await copyFixture('qwen3-tiny')
    await fs.promises.rm(path.join(missing, 'tokenizer.json'))
    assert.match((await expectLoadError(missing, 'INVALID_MODEL')).message, /tokenizer\.json/)
    const broken = await copyFixture('qwen3-tiny')
    await fs.promises.writeFile(path.join(broken, 'tokenizer.json'), '{')
    assert.match((await expectLoadError(broken, 'INVALID_MODEL')).message, /tokenizer\.json/)
    await assertHealthy()
  })

  it('no weights, or a missing shard → INVALID_MODEL', async () => {
    const none = await copyFixture('qwen3-tiny')
    await fs.promises.rm(path.join(none, 'model.safetensors'))
    assert.match((await expectLoadError(none, 'INVALID_MODEL')).message, /safetensors/)
    const sharded = await copyFixture('qwen3-untied-mqa')
    await fs.promises.rm(path.join(sharded, 'model-00002-of-00003.safetensors'))
    assert.match((await expectLoadError(sharded, 'INVALID_MODEL')).message, /model-00002-of-00003/)
    await assertHealthy()
  })

  it('truncated model.safetensors → INVALID_MODEL naming the file', async () => {
    const dir = await copyFixture('qwen3-tiny')
    const p = path.join(dir, 'model.safetensors')
    const { size } = await fs.promises.stat(p)
    await fs.promises.truncate(p, Math.floor(size / 2))
    const e = await expectLoadError(dir, 'INVALID_MODEL')
    assert.match(e.message, /model\.safetensors/)
    await assertHealthy()
  })

  it('garbage or empty model.safetensors → INVALID_MODEL', async () => {
    for (const bytes of [Buffer.alloc(100, 0xff), Buffer.alloc(0)]) {
      const dir = await copyFixture('qwen3-tiny')
      await fs.promises.writeFile(path.join(dir, 'model.safetensors'), bytes)
      assert.match((await expectLoadError(dir, 'INVALID_MODEL')).message, /model\.safetensors/)
    }
    await assertHealthy()
  })

  it('a tensor of the wrong shape (edited intermediate_size) → INVALID_MODEL naming the tensor', async () => {
    const dir = await copyFixture('qwen3-tiny', (c) => {
      c.intermediate_size = 96
    })
    const e = await expectLoadError(dir, 'INVALID_MODEL')
    assert.match(e.message, /model\.layers\.\d+\.mlp\.(gate|up|down)_proj\.weight/)
    assert.match(e.message, /shape/)
    await assertHealthy()
  })

  it('a tensor missing from the file (edited num_hidden_layers) → INVALID_MODEL naming it', async () => {
    const dir = await copyFixture('qwen3-tiny', (c) => {
      c.num_hidden_layers = 4
      c.layer_types = Array(4).fill('full_attention')
    })
    const e = await expectLoadError(dir, 'INVALID_MODEL')
    assert.match(e.message, /model\.layers\.3\./)
    await assertHealthy()
  })

  it('inconsistent config (heads not a multiple of kv heads) → INVALID_MODEL', async () => {
    const dir = await copyFixture('qwen3-tiny', (c) => {
      c.num_attention_heads = 3
    })
    await expectLoadError(dir, 'INVALID_MODEL')
    await assertHealthy()
  })

  it('garbage bytes .gguf → INVALID_MODEL', async () => {
    const bytes = Buffer.alloc(4096)
    for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 7919 + 13) & 0xff
    await expectLoadError(await writeTmp('garbage.gguf', bytes), 'INVALID_MODEL')
    await expectLoadError(await writeTmp('empty.gguf', Buffer.alloc(0)), 'INVALID_MODEL')
    await assertHealthy()
  })

  it('GGUF magic followed by garbage, or absurd header counts → INVALID_MODEL', async () => {
    const magic = Buffer.alloc(4096)
    for (let i = 0; i < magic.length; i++) magic[i] = (i * 7919 + 13) & 0xff
    magic.write('GGUF', 0, 'latin1')
    await expectLoadError(await writeTmp('magic.gguf', magic), 'INVALID_MODEL')

    const good = await fs.promises.readFile(fixture('qwen3-tiny', 'model-f32.gguf'))
    const hugeTensors = Buffer.from(good)
    hugeTensors.writeBigUInt64LE(0xff_ffff_ffffn, 8) // tensor_count
    await expectLoadError(await writeTmp('huge-tensors.gguf', hugeTensors), 'INVALID_MODEL')
    const hugeKv = Buffer.from(good.subarray(0, 4096))
    hugeKv.writeBigUInt64LE(0xffff_ffff_ffffn, 16) // metadata_kv_count
    await expectLoadError(await writeTmp('huge-kv.gguf', hugeKv), 'INVALID_MODEL')
    await assertHealthy()
  })

  it('truncated GGUF (first 60% of qwen3-tiny/model-f32.gguf) → INVALID_MODEL', async () => {
    const good = await fs.promises.readFile(fixture('qwen3-tiny', 'model-f32.gguf'))
    const p = await writeTmp('truncated.gguf', good.subarray(0, Math.floor(good.length * 0.6)))
    const e = await expectLoadError(p, 'INVALID_MODEL')
    assert.match(e.message, /truncated|ends at byte|file/i)
    // Cut inside the header (metadata) too.
    await expectLoadError(await writeTmp('header-cut.gguf', good.subarray(0, 100)), 'INVALID_MODEL')
    await expectLoadError(await writeTmp('metadata-cut.gguf', good.subarray(0, 2000)), 'INVALID_MODEL')
    await assertHealthy()
  })

  it('a plain file that is not a GGUF → INVALID_MODEL', async () => {
    await expectLoadError(fixture('qwen3-tiny', 'config.json'), 'INVALID_MODEL')
    await assertHealthy()
  })

  it("device: 'cuda' in this CPU build → NO_CUDA_DEVICE", async () => {
    for (const device of ['cuda', 'cuda:0']) {
      for (const p of [fixture('qwen3-tiny'), fixture('qwen3-tiny', 'model-f32.gguf')]) {
        const e = await expectLoadError(p, 'NO_CUDA_DEVICE', { device })
        assert.match(e.message, /cuda/i)
      }
    }
    await expectLoadError(fixture('qwen3-tiny'), 'INVALID_ARGUMENT', { device: 'cuda:x' })
    // `auto` falls back to the CPU.
    const rt = await Runtime.load(fixture('qwen3-tiny'), { device: 'auto' })
    assert.equal(rt.info.device, 'cpu')
    await rt.dispose()
    await assertHealthy()
  })
})
