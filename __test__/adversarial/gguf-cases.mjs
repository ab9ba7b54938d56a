// Adversarial cases of GGUF model files: header, metadata, tensor infos and data, mutated and cut.
import { readFileSync } from 'node:fs'
import { GGUF, cloneGguf, parseGguf, patchUint, prng, writeGguf } from './formats.mjs'
import { flip, fx, TEMPLATE_PROBE, TEMPLATES } from './inputs.mjs'

// ---------------------------------------------------------------- GGUF

export function ggufCases(add) {
  const cat = 'model-gguf'
  const M = ['INVALID_MODEL']
  const MA = ['INVALID_MODEL', 'UNSUPPORTED_ARCHITECTURE']
  for (const [base, file, seed, full] of [['qwen3-tiny', 'model-q8_0.gguf', 0x66, true], ['llama-tiny', 'model-f32.gguf', 0x67, false], ['qwen3-tiny', 'model-f32.gguf', 0x68, false], ['granite-tiny', 'model-f32.gguf', 0x69, false], ['gemma3-gguf-tiny', 'model-f32.gguf', 0x6a, false], ['smollm3-tiny', 'model-f32.gguf', 0x6b, false], ['phi3-tiny', 'model-f32.gguf', 0x6c, false], ['phi4-mini-tiny', 'model-f32.gguf', 0x6d, false], ['gemma4-tiny', 'model-f32.gguf', 0x6e, false], ['qwen3moe-tiny', 'model-f32.gguf', 0x6f, false], ['gemma4-moe-tiny', 'model-f32.gguf', 0x70, false], ['qwen35-tiny', 'model-f32.gguf', 0x71, false], ['lfm2-tiny', 'model-f32.gguf', 0x72, false]]) {
    const buf = readFileSync(fx(base, file))
    const g = parseGguf(buf)
    const rnd = prng(seed)
    const arch = g.kvs.find((kv) => kv.key === 'general.architecture').value
    const tag = `${base}/${file}`
    const run = (bytes, opts) => async (ctx) => ctx.loadAndProbe(await ctx.file('model.gguf', bytes()), opts)
    const addG = (name, expect, ok, bytes, extra) => add(cat, `${tag}/${name}`, expect, ok, run(bytes), extra)
    const patch = (at, size, v) => () => patchUint(buf, at, size, v)
    const rewrite = (f, opts) => () => {
      const m = cloneGguf(g)
      f(m)
      return writeGguf(m, opts)
    }
    // Header fields.
    for (const v of [0, 1, 2, 4, 0xffffffff]) addG(`version ${v}`, M, v === 2, patch(g.pos.version, 4, v))
    addG('magic GGUG', M, false, () => Buffer.concat([Buffer.from('GGUG'), buf.subarray(4)]))
    // One tensor info fewer or more (read from the padding) can still describe a loadable model.
    for (const v of [0, g.tensors.length - 1, g.tensors.length + 1, 2 ** 31, 2 ** 32, 2n ** 63n, 2n ** 64n - 1n]) {
      addG(`tensor count ${v}`, M, v === g.tensors.length - 1 || v === g.tensors.length + 1, patch(g.pos.tensorCount, 8, v))
    }
    for (const v of [0, g.kvs.length - 1, g.kvs.length + 1, 2 ** 32, 2n ** 64n - 1n]) addG(`kv count ${v}`, M, false, patch(g.pos.kvCount, 8, v))
    // Every metadata entry: its key length, its type, string lengths, array counts and types.
    const kvs = full ? g.kvs : g.kvs.filter(() => rnd.next() < 0.4)
    for (const kv of kvs) {
      const keyLen = Buffer.byteLength(kv.key)
      for (const v of [0, keyLen + 1, 2 ** 30 + 1, 2n ** 63n, 2n ** 64n - 1n]) addG(`${kv.key} key length ${v}`, MA, false, patch(kv.pos.key, 8, v))
      for (const t of [13, 255, kv.type === GGUF.STRING ? GGUF.UINT32 : GGUF.STRING, kv.type === GGUF.ARRAY ? GGUF.UINT64 : GGUF.ARRAY]) {
        addG(`${kv.key} type ${t}`, MA, false, patch(kv.pos.type, 4, t))
      }
      if (kv.type === GGUF.STRING) {
        const n = Buffer.byteLength(kv.value)
        for (const v of [0, n + 1, 2 ** 30 + 1, 2n ** 64n - 1n]) addG(`${kv.key} string length ${v}`, MA, v === 0 && !kv.key.startsWith('general.arch'), patch(kv.pos.value, 8, v))
      }
      if (kv.type === GGUF.ARRAY) {
        const n = kv.value.values.length
        for (const v of [0, n - 1, n + 1, 2 ** 30 + 1, 2n ** 64n - 1n]) addG(`${kv.key} array count ${v}`, M, false, patch(kv.pos.arrayCount, 8, v))
        for (const t of [GGUF.ARRAY, 13, 255, GGUF.FLOAT64, GGUF.UINT8]) addG(`${kv.key} array type ${t}`, M, false, patch(kv.pos.arrayType, 4, t))
      }
    }
    // Tensor infos.
    const tensors = full ? g.tensors.filter((t, i) => i < 3 || rnd.next() < 0.2) : g.tensors.filter(() => rnd.next() < 0.2)
    for (const t of tensors) {
      const p = t.pos
      for (const v of [0, 2 ** 30 + 1, 2n ** 64n - 1n]) addG(`${t.name} name length ${v}`, M, false, patch(p.name, 8, v))
      // (A 3-D tensor, a routed FFN's stacked MoE experts, patched to its own n_dims is unchanged.)
      for (const v of [0, 3, 4, 5, 255]) addG(`${t.name} n_dims ${v}`, M, v === t.dims.length, patch(p.nDims, 4, v))
      // (A dimension patched to its own value leaves the file as it was.)
      for (const v of [0, 1, 2 ** 31, 2 ** 32, 2n ** 63n, 2n ** 64n - 1n, Number(t.dims[0]) + 1]) addG(`${t.name} dim0 ${v}`, M, BigInt(v) === BigInt(t.dims[0]), patch(p.dims[0], 8, v))
      if (p.dims.length > 1) addG(`${t.name} dims 2^32 x 2^32`, M, false, () => patchUint(patchUint(buf, p.dims[0], 8, 2 ** 32), p.dims[1], 8, 2 ** 32))
      // Another ggml type, or an offset that stays inside the file, reads other bytes of the
      // file as the weights: still a loadable model. Past the end it must fail.
      for (const v of [1, 2, 4, 12, 15, 16, 30, 39, 40, 1000, 0xffffffff]) addG(`${t.name} type ${v}`, M, v < 40, patch(p.type, 4, v))
      for (const v of [1, 3, 31, 2 ** 32, 2n ** 63n, 2n ** 64n - 1n, buf.length, BigInt(g.data.length) - 1n]) addG(`${t.name} offset ${v}`, M, Number(v) < 64, patch(p.offset, 8, v))
    }
    // Every ggml type for a 2-D weight, a norm and the embedding (the data is then wrong but
    // inside the file, or past it).
    if (full) {
      for (const name of ['blk.0.attn_q.weight', 'blk.1.ffn_norm.weight', 'token_embd.weight']) {
        const t = g.tensors.find((x) => x.name === name)
        for (let ty = 0; ty <= 41; ty++) {
          if (ty === t.type) continue
          add(cat, `${tag}/${name} as ggml type ${ty}`, M, true, run(patch(t.pos.type, 4, ty)))
        }
      }
    }
    // Metadata values, rewritten with another type or value.
    const setKv = (key, type, value) => rewrite((m) => {
      const i = m.kvs.findIndex((kv) => kv.key === key)
      if (type === null) m.kvs.splice(i, 1)
      else if (i < 0) m.kvs.push({ key, type, value })
      else m.kvs[i] = { key, type, value }
    })
    const VALS = [
      ['deleted', null, null], ['0', GGUF.UINT32, 0], ['1', GGUF.UINT32, 1], ['-1 i32', GGUF.INT32, -1], ['1e9', GGUF.UINT32, 1e9], ['u32 max', GGUF.UINT32, 0xffffffff],
      ['2^63 u64', GGUF.UINT64, 2n ** 63n], ['u64 max', GGUF.UINT64, 2n ** 64n - 1n], ['i64 min', GGUF.INT64, -(2n ** 63n)], ['NaN f32', GGUF.FLOAT32, NaN],
      ['Infinity f32', GGUF.FLOAT32, Infinity], ['-Infinity f64', GGUF.FLOAT64, -Infinity], ['1.5 f32', GGUF.FLOAT32, 1.5], ['string', GGUF.STRING, 'x'],
      ['array', GGUF.ARRAY, { type: GGUF.UINT32, values: [1, 2] }], ['true', GGUF.BOOL, true], ['-1e30 f64', GGUF.FLOAT64, -1e30],
    ]
    const archKeys = g.kvs.filter((kv) => kv.key.startsWith(`${arch}.`)).map((kv) => kv.key)
    for (const key of archKeys) {
      const vals = full ? VALS : VALS.filter(() => rnd.next() < 0.35)
      // A rotary dimension other than the head's is partial RoPE, refused as not implemented.
      for (const [name, type, value] of vals) addG(`${key}=${name}`, key.endsWith('.rope.dimension_count') ? MA : M, true, setKv(key, type, value))
    }
    // Attention-changing keys the decoder does not implement yet: refused, never ignored.
    for (const [key, name, type, value] of [
      ['attention.sliding_window', '4096', GGUF.UINT32, 4096], ['attention.sliding_window', 'u64 max', GGUF.UINT64, 2n ** 64n - 1n],
      ['attn_logit_softcapping', '50', GGUF.FLOAT32, 50], ['final_logit_softcapping', 'NaN', GGUF.FLOAT32, NaN],
      ['final_logit_softcapping', '-Infinity f64', GGUF.FLOAT64, -Infinity], ['rope.dimension_count', '2', GGUF.UINT32, 2],
    ]) {
      // (Gemma 3 and Phi-3 run their windows: a window of 4096 is a model they load. Phi-3 reads a
      // partial rotary dimension too; phi4-mini-tiny's LongRoPE factors then have the wrong length.)
      const runs = (['gemma3', 'phi3', 'gemma4'].includes(arch) && key === 'attention.sliding_window' && name === '4096') ||
        ((base === 'phi3-tiny' || arch === 'qwen35') && key === 'rope.dimension_count') ||
        (arch === 'gemma4' && key === 'final_logit_softcapping')
      addG(`${arch}.${key}=${name} (not implemented)`, MA, runs, setKv(`${arch}.${key}`, type, value))
    }
    // The recurrent layers' keys (src/model/hybrid_config.rs): typed errors, no huge state.
    if (arch === 'qwen35') {
      for (const [key, name, type, value] of [
        ['ssm.conv_kernel', '0', GGUF.UINT32, 0], ['ssm.conv_kernel', '1', GGUF.UINT32, 1], ['ssm.conv_kernel', 'u32 max', GGUF.UINT32, 0xffffffff],
        ['ssm.state_size', '2^31', GGUF.UINT32, 2 ** 31], ['ssm.group_count', '0', GGUF.UINT32, 0], ['ssm.group_count', '3', GGUF.UINT32, 3],
        ['ssm.time_step_rank', 'u64 max', GGUF.UINT64, 2n ** 64n - 1n], ['ssm.inner_size', '33', GGUF.UINT32, 33], ['ssm.inner_size', '2^40', GGUF.UINT64, 2 ** 40],
        ['rope.dimension_count', '3', GGUF.UINT32, 3], ['rope.dimension_count', '1000', GGUF.UINT32, 1000],
      ]) {
        addG(`${arch}.${key}=${name} (recurrent)`, MA, false, setKv(`${arch}.${key}`, type, value))
      }
      // (The file lists its recurrent layers: the interval is only read without the list.)
      addG(`${arch}.full_attention_interval=0 beside the list (recurrent)`, MA, true, setKv(`${arch}.full_attention_interval`, GGUF.UINT32, 0))
      addG(`${arch}.full_attention_interval=0 without the list (recurrent)`, MA, false, rewrite((m) => {
        m.kvs = m.kvs.filter((kv) => kv.key !== `${arch}.attention.recurrent_layers`)
        m.kvs.find((kv) => kv.key === `${arch}.full_attention_interval`).value = 0
      }))
      addG(`${arch}.attention.recurrent_layers all true`, MA, false, setKv(`${arch}.attention.recurrent_layers`, GGUF.ARRAY, { type: GGUF.BOOL, values: [true, true, true, true] }))
      addG(`${arch}.attention.recurrent_layers of 2`, MA, false, setKv(`${arch}.attention.recurrent_layers`, GGUF.ARRAY, { type: GGUF.BOOL, values: [true, false] }))
    }
    if (arch === 'lfm2') {
      for (const [key, name, type, value] of [['shortconv.l_cache', '0', GGUF.UINT32, 0], ['shortconv.l_cache', '1', GGUF.UINT32, 1], ['shortconv.l_cache', 'u32 max', GGUF.UINT32, 0xffffffff]]) {
        addG(`${arch}.${key}=${name} (recurrent)`, MA, false, setKv(`${arch}.${key}`, type, value))
      }
      addG(`${arch}.attention.head_count_kv of 2 layers`, MA, false, setKv(`${arch}.attention.head_count_kv`, GGUF.ARRAY, { type: GGUF.UINT32, values: [0, 2] }))
      addG(`${arch}.attention.head_count_kv all 0`, MA, false, setKv(`${arch}.attention.head_count_kv`, GGUF.ARRAY, { type: GGUF.UINT32, values: [0, 0, 0, 0] }))
      addG(`${arch}.attention.head_count_kv scalar`, MA, false, setKv(`${arch}.attention.head_count_kv`, GGUF.UINT32, 2))
    }
    // A routed FFN's keys the decoder does not implement (src/model/moe_config.rs).
    if (arch === 'qwen3moe') {
      for (const [key, name, type, value] of [
        ['expert_shared_count', '1', GGUF.UINT32, 1], ['expert_gating_func', 'sigmoid (2)', GGUF.UINT32, 2], ['expert_gating_func', 'u64 max', GGUF.UINT64, 2n ** 64n - 1n],
      ]) {
        addG(`${arch}.${key}=${name} (not implemented)`, MA, false, setKv(`${arch}.${key}`, type, value))
      }
      addG(`${arch}.expert_gating_func=softmax (1)`, MA, true, setKv(`${arch}.expert_gating_func`, GGUF.UINT32, 1))
    }
    for (const [name, v] of [['llama', 'llama'], ['qwen2', 'qwen2'], ['mamba', 'mamba'], ['empty', ''], ['1 MB', 'a'.repeat(1 << 20)]]) {
      addG(`general.architecture=${name}`, MA, v === 'llama' || v === 'qwen2' || v === arch, setKv('general.architecture', GGUF.STRING, v))
    }
    addG('general.architecture deleted', MA, false, setKv('general.architecture', null))
    addG('general.architecture u32', MA, false, setKv('general.architecture', GGUF.UINT32, 5))
    for (const [name, type, value, layout] of [
      ['0', GGUF.UINT32, 0], ['1', GGUF.UINT32, 1, 1], ['3', GGUF.UINT32, 3], ['7', GGUF.UINT32, 7], ['16', GGUF.UINT32, 16, 16], ['64', GGUF.UINT32, 64, 64],
      ['2^31', GGUF.UINT32, 2 ** 31], ['u32 max', GGUF.UINT32, 0xffffffff], ['-1 i32', GGUF.INT32, -1], ['0 u8', GGUF.UINT8, 0], ['2^32 u64', GGUF.UINT64, 2 ** 32],
      ['string', GGUF.STRING, '32'], ['f32 32.0', GGUF.FLOAT32, 32],
    ]) {
      // A small wrong alignment shifts where the data is read from: garbage weights, a valid file.
      add(cat, `${tag}/general.alignment=${name}`, M, layout !== undefined || value === 3 || value === 7 || type === GGUF.UINT64 || type === GGUF.STRING || type === GGUF.FLOAT32 || type === GGUF.INT32,
        run(() => {
          const m = cloneGguf(g)
          m.kvs.push({ key: 'general.alignment', type, value })
          return writeGguf(m, { layoutAlignment: layout ?? 32 })
        }))
    }
    // Tokenizer metadata.
    const tokens = g.kvs.find((kv) => kv.key === 'tokenizer.ggml.tokens').value.values
    const tokMuts = [
      ['tokens empty', 'tokenizer.ggml.tokens', GGUF.ARRAY, { type: GGUF.STRING, values: [] }, false],
      ['tokens as u32', 'tokenizer.ggml.tokens', GGUF.ARRAY, { type: GGUF.UINT32, values: tokens.map((_, i) => i) }, false],
      ['tokens first 100', 'tokenizer.ggml.tokens', GGUF.ARRAY, { type: GGUF.STRING, values: tokens.slice(0, 100) }, false],
      ['tokens 100k', 'tokenizer.ggml.tokens', GGUF.ARRAY, { type: GGUF.STRING, values: [...tokens, ...Array.from({ length: 100_000 }, (_, i) => `t${i}`)] }, false],
      ['tokens all one string', 'tokenizer.ggml.tokens', GGUF.ARRAY, { type: GGUF.STRING, values: tokens.map(() => 'a') }, true],
      ['tokens empty strings', 'tokenizer.ggml.tokens', GGUF.ARRAY, { type: GGUF.STRING, values: tokens.map((t, i) => (i % 2 ? '' : t)) }, true],
      ['tokens deleted', 'tokenizer.ggml.tokens', null, null, false],
      ['token_type short', 'tokenizer.ggml.token_type', GGUF.ARRAY, { type: GGUF.INT32, values: [1, 1] }, true],
      ['token_type garbage', 'tokenizer.ggml.token_type', GGUF.ARRAY, { type: GGUF.INT32, values: tokens.map((_, i) => (i % 7) * 99 - 1) }, true],
      ['token_type strings', 'tokenizer.ggml.token_type', GGUF.ARRAY, { type: GGUF.STRING, values: tokens.map(() => 'x') }, true],
      ['merges garbage', 'tokenizer.ggml.merges', GGUF.ARRAY, { type: GGUF.STRING, values: ['a', 'a b c', '', 'zz yy', ' '] }, true],
      ['merges u8', 'tokenizer.ggml.merges', GGUF.ARRAY, { type: GGUF.UINT8, values: [1, 2, 3] }, false],
      ['merges deleted', 'tokenizer.ggml.merges', null, null, true],
      ['model llama without scores', 'tokenizer.ggml.model', GGUF.STRING, 'llama', true],
      ['model bert', 'tokenizer.ggml.model', GGUF.STRING, 'bert', false],
      ['model unknown', 'tokenizer.ggml.model', GGUF.STRING, 'mystery', false],
      ['model deleted', 'tokenizer.ggml.model', null, null, false],
      ['pre unknown', 'tokenizer.ggml.pre', GGUF.STRING, 'mystery', true],
      ['pre empty', 'tokenizer.ggml.pre', GGUF.STRING, '', true],
      ['eos 400', 'tokenizer.ggml.eos_token_id', GGUF.UINT32, 400, true],
      ['eos u32 max', 'tokenizer.ggml.eos_token_id', GGUF.UINT32, 0xffffffff, true],
      ['eos -1', 'tokenizer.ggml.eos_token_id', GGUF.INT32, -1, true],
      ['eos string', 'tokenizer.ggml.eos_token_id', GGUF.STRING, '397', true],
      ['eos u64 max', 'tokenizer.ggml.eos_token_id', GGUF.UINT64, 2n ** 64n - 1n, true],
      ['bos 1e9', 'tokenizer.ggml.bos_token_id', GGUF.UINT32, 1e9, true],
      ['padding -5', 'tokenizer.ggml.padding_token_id', GGUF.INT32, -5, true],
      ['add_bos_token 5', 'tokenizer.ggml.add_bos_token', GGUF.UINT32, 5, true],
      ['add_bos_token string', 'tokenizer.ggml.add_bos_token', GGUF.STRING, 'yes', true],
      ['scores NaN', 'tokenizer.ggml.scores', GGUF.ARRAY, { type: GGUF.FLOAT32, values: tokens.map(() => NaN) }, true],
      ['scores short', 'tokenizer.ggml.scores', GGUF.ARRAY, { type: GGUF.FLOAT32, values: [1] }, true],
      ['chat_template u32', 'tokenizer.chat_template', GGUF.UINT32, 5, true],
      ['chat_template deleted', 'tokenizer.chat_template', null, null, true],
    ]
    for (const [name, key, type, value, ok] of tokMuts) {
      if (!full && rnd.next() < 0.5) continue
      addG(name, M, ok, setKv(key, type, value))
    }
    for (const [name, t] of TEMPLATES.filter((x) => !x[2] && (full || rnd.next() < 0.25))) addG(`chat_template ${name}`, M, true, setKv('tokenizer.chat_template', GGUF.STRING, t), TEMPLATE_PROBE)
    // Tensor list edits.
    for (const t of full ? g.tensors.filter((_, i) => i % 4 === 0) : [g.tensors[1]]) {
      addG(`tensor ${t.name} removed`, M, false, rewrite((m) => m.tensors.splice(m.tensors.findIndex((x) => x.name === t.name), 1)))
    }
    addG('tensor listed twice', M, true, rewrite((m) => m.tensors.push({ ...m.tensors[1] })))
    addG('tensors reversed', M, true, rewrite((m) => m.tensors.reverse()))
    addG('tensor with an empty name', M, true, rewrite((m) => m.tensors.push({ ...m.tensors[1], name: '' })))
    addG('unknown extra tensor', M, true, rewrite((m) => m.tensors.push({ ...m.tensors[1], name: 'blk.99.attn_q.weight' })))
    addG('metadata key listed twice', M, true, rewrite((m) => m.kvs.push({ ...m.kvs.find((kv) => kv.key === `${arch}.block_count`), value: 1e9 })))
    addG('100k junk metadata keys', M, true, rewrite((m) => m.kvs.push(...Array.from({ length: 100_000 }, (_, i) => ({ key: `junk.${i}`, type: GGUF.UINT8, value: 1 })))))
    addG('nested arrays 60 deep', M, true, rewrite((m) => {
      let v = { type: GGUF.UINT8, values: [1] }
      for (let i = 0; i < 60; i++) v = { type: GGUF.ARRAY, values: [v] }
      m.kvs.push({ key: 'junk.deep', type: GGUF.ARRAY, value: v })
    }))
    addG('nested arrays 100 deep', M, false, rewrite((m) => {
      let v = { type: GGUF.UINT8, values: [1] }
      for (let i = 0; i < 100; i++) v = { type: GGUF.ARRAY, values: [v] }
      m.kvs.push({ key: 'junk.deep', type: GGUF.ARRAY, value: v })
    }))
    // Truncations and bit flips.
    const cuts = new Set([0, 3, 4, 8, 16, 24, 25, g.infoEnd - 1, g.infoEnd, g.dataStart, g.dataStart + 1, buf.length - 1])
    while (cuts.size < (full ? 40 : 20)) cuts.add(rnd.int(0, buf.length))
    for (const n of [...cuts].sort((a, b) => a - b)) addG(`truncated at ${n}`, M, false, () => buf.subarray(0, n))
    for (let i = 0; i < (full ? 80 : 25); i++) {
      const at = rnd.int(0, g.infoEnd)
      const bit = rnd.int(0, 8)
      // A flip inside the chat template can make it fail to render (TEMPLATE_PROBE).
      add(cat, `${tag}/header bit ${bit} flipped at ${at}`, MA, true, run(() => flip(buf, at, bit)), TEMPLATE_PROBE)
    }
    for (let i = 0; i < (full ? 6 : 2); i++) {
      const at = rnd.int(g.dataStart, buf.length)
      const bit = rnd.int(0, 8)
      add(cat, `${tag}/data bit ${bit} flipped at ${at}`, M, true, run(() => flip(buf, at, bit)))
    }
    // Options on top of a GGUF file.
    // Loads with a warning in info.warnings (rope.test.mjs checks it); the default KV pool
    // shrinks to what the address-space limit lets it reserve, or the load is OUT_OF_MEMORY.
    add(cat, `${tag}/contextLength past the file's context`, ['OUT_OF_MEMORY'], true, async (ctx) => ctx.loadAndProbe(fx(base, file), { contextLength: 1e6 }))
  }
}
