// Adversarial cases of PEFT adapter directories: adapter_config.json, the weights and manifest.json.
import { readFileSync } from 'node:fs'
import { parseSafetensors, prng, writeSafetensors } from './formats.mjs'
import { dedupe, fx, JSON_FILES, JSON_VALUES, raw, readJson, safetensorsMutations, toJson, withValue } from './inputs.mjs'

// ---------------------------------------------------------------- adapters

export function adapterCases(add) {
  const cat = 'adapter'
  const A = ['INVALID_ADAPTER', 'UNSUPPORTED_ADAPTER']
  const run = (name, edits, opts) => async (ctx) => ctx.loadExpertAndProbe(await ctx.adapterDir(name, edits), opts)
  const bases = [['lora', JSON_VALUES.length], ['dora', 5], ['ia3', 8], ['lokr', 6], ['lokr_both', 3], ['prompt', 10], ['rslora', 3], ['lora_patterns', 3]]
  for (const [name, perField] of bases) {
    const cfg = readJson('adapters', name, 'adapter_config.json')
    const rnd = prng(0xada + name.length * 7)
    for (const k of Object.keys(cfg)) {
      const values = perField >= JSON_VALUES.length ? JSON_VALUES : Array.from({ length: perField }, () => rnd.pick(JSON_VALUES))
      for (const [vn, v] of dedupe(values)) {
        add(cat, `${name}/adapter_config ${k}=${vn}`, A, true, run(name, { 'adapter_config.json': () => toJson(withValue(cfg, [k], v)) }))
      }
    }
    for (const [fn, text] of JSON_FILES) add(cat, `${name}/adapter_config file=${fn}`, A, false, run(name, { 'adapter_config.json': text }))
  }
  const lora = readJson('adapters', 'lora', 'adapter_config.json')
  const L = (what, edit, expect = A, ok = true, base = 'lora') => add(cat, `lora-specific/${what}`, expect, ok, run(base, { 'adapter_config.json': () => toJson({ ...readJson('adapters', base, 'adapter_config.json'), ...edit }) }))
  for (const r of [0, 1, 3, 5, 2 ** 31, 1e9]) L(`r=${r}`, { r }, A, false)
  for (const [n, a] of [['0', 0], ['-8', -8], ['1e308', 1e308], ['1e400', raw('1e400')], ['"NaN"', 'NaN'], ['1e-320', 1e-320]]) L(`lora_alpha=${n}`, { lora_alpha: a })
  for (const t of ['LOHA', 'ADALORA', 'BOFT', 'OFT', 'VERA', 'X', '', 'lora', 'PREFIX_TUNING', 'P_TUNING']) L(`peft_type=${t}`, { peft_type: t }, A, false)
  for (const [n, tm] of [['nonexistent', ['nonexistent']], ['empty', []], ['string x', 'x'], ['invalid regex', '('], ['nested quantifier regex', '((((a*)*)*)*)*$'], ['1 MB regex', 'a'.repeat(1 << 20)], ['lm_head', ['lm_head']], ['embed_tokens', ['embed_tokens']], ['all-linear', 'all-linear'], ['q_proj string', 'q_proj']]) {
    L(`target_modules ${n}`, { target_modules: tm })
  }
  for (const [n, v] of [['[99]', [99]], ['[-1]', [-1]], ['[1e12]', [1e12]], ['5', 5], ['x', 'x'], ['[]', []]]) L(`layers_to_transform ${n}`, { layers_to_transform: v })
  L('layers_pattern mismatch', { layers_to_transform: [0], layers_pattern: 'blocks' })
  for (const [n, v] of [['q_proj 0', { q_proj: 0 }], ['q_proj 1e9', { q_proj: 1e9 }], ['invalid regex', { '(': 2 }], ['q_proj NaN', { q_proj: 'NaN' }], ['array', [1]]]) {
    L(`rank_pattern ${n}`, { rank_pattern: v })
    L(`alpha_pattern ${n}`, { alpha_pattern: v })
  }
  L('use_dora without magnitudes', { use_dora: true }, A, false)
  L('fan_in_fan_out', { fan_in_fan_out: true })
  for (const b of ['all', 'lora_only', 'x']) L(`bias ${b}`, { bias: b })
  L('modules_to_save lm_head', { modules_to_save: ['lm_head'] })
  L('layer_replication', { layer_replication: [[0, 2], [1, 3]] })
  L('target_parameters', { target_parameters: ['mlp.experts.gate_up_proj'] })
  L('trainable_token_indices', { trainable_token_indices: [1, 2, 3] })
  L('alora_invocation_tokens', { alora_invocation_tokens: [1, 2] })
  L('use_qalora', { use_qalora: true })
  L('lora_bias', { lora_bias: true })
  L('exclude_modules q_proj', { exclude_modules: ['q_proj'] })
  L('task_type SEQ_CLS', { task_type: 'SEQ_CLS' })
  L('use_bdlora', { use_bdlora: { x: 1 } })
  L('ia3 feedforward not targeted', { feedforward_modules: ['q_proj'] }, A, true, 'ia3')
  L('ia3 feedforward string', { feedforward_modules: 'x' }, A, true, 'ia3')
  for (const v of [0, 1e9, 3, 5, -1]) L(`prompt num_virtual_tokens ${v}`, { num_virtual_tokens: v }, A, false, 'prompt')
  // The weights' shapes are what count; token_dim and decompose_both may be ignored.
  for (const v of [63, 0, 1e9]) L(`prompt token_dim ${v}`, { token_dim: v }, A, true, 'prompt')
  L('prompt init TEXT without text', { prompt_tuning_init: 'TEXT' }, A, true, 'prompt')
  L('lokr decompose_both flipped', { decompose_both: true }, A, true, 'lokr')
  L('lokr_both decompose_both flipped', { decompose_both: false }, A, true, 'lokr_both')
  L('lokr alpha NaN', { alpha: 'NaN' }, A, true, 'lokr')
  L('lokr r 0', { r: 0 }, A, true, 'lokr')
  L('lokr use_effective_conv2d', { use_effective_conv2d: true }, A, true, 'lokr')
  // Adapters of other base models.
  for (const other of ['lora_llama', 'lora_qwen2', 'ia3_qwen2', 'dora_llama']) {
    add(cat, `wrong base/${other} on qwen3-tiny`, ['INVALID_ADAPTER'], false, async (ctx) => ctx.loadExpertAndProbe(fx('adapters', other)))
  }
  // Weights.
  for (const [name, perFile] of [['lora', 1], ['dora', 0.5], ['ia3', 0.5], ['lokr', 0.4], ['lokr_both', 0.3], ['prompt', 0.6], ['rslora', 0.3]]) {
    const buf = readFileSync(fx('adapters', name, 'adapter_model.safetensors'))
    const muts = safetensorsMutations(buf, 0xada9 + name.length, perFile === 1 ? { flips: 40, dataFlips: 4, cuts: 10, tensors: 4 } : { flips: 10, dataFlips: 2, cuts: 4, tensors: 2 })
    const rnd = prng(0xa11 + name.length)
    for (const [mn, bytes, ok] of muts) {
      if (perFile < 1 && rnd.next() > perFile) continue
      add(cat, `${name}/weights ${mn}`, ['INVALID_ADAPTER'], ok, run(name, { 'adapter_model.safetensors': bytes }))
    }
    add(cat, `${name}/weights missing`, ['INVALID_ADAPTER'], false, run(name, { 'adapter_model.safetensors': null }))
    add(cat, `${name}/weights NaN`, ['INVALID_ADAPTER'], true, async (ctx) => {
      const st = parseSafetensors(buf)
      const data = Buffer.from(st.data)
      for (let i = 0; i + 4 <= data.length; i += 4) data.writeUInt32LE(0x7fc00000, i)
      return ctx.loadExpertAndProbe(await ctx.adapterDir(name, { 'adapter_model.safetensors': writeSafetensors(st.headerText, data) }))
    })
    add(cat, `${name}/weights 1e38`, ['INVALID_ADAPTER'], true, async (ctx) => {
      const st = parseSafetensors(buf)
      const data = Buffer.from(st.data)
      for (let i = 0; i + 4 <= data.length; i += 4) data.writeFloatLE(3e38, i)
      return ctx.loadExpertAndProbe(await ctx.adapterDir(name, { 'adapter_model.safetensors': writeSafetensors(st.headerText, data) }))
    })
    if (name !== 'prompt') add(cat, `${name}/extra tensor for layer 99`, ['INVALID_ADAPTER'], true, async (ctx) => {
      const st = parseSafetensors(buf)
      const [k, v] = Object.entries(st.header).find(([key]) => key.includes('layers.0.'))
      return ctx.loadExpertAndProbe(await ctx.adapterDir(name, { 'adapter_model.safetensors': writeSafetensors({ ...st.header, [k.replace('layers.0.', 'layers.99.')]: v }, st.data) }))
    })
    add(cat, `${name}/pickle weights instead`, A, false, async (ctx) =>
      ctx.loadExpertAndProbe(await ctx.adapterDir(name, { 'adapter_model.safetensors': null, 'adapter_model.bin': Buffer.from([0x80, 0x02, 0x7d, 0x71, 0x00, 0x2e]) })))
  }
  // manifest.json
  const man = readJson('adapters', 'lora', 'manifest.json')
  const runM = (text) => run('lora', { 'manifest.json': text })
  for (const k of ['name', 'load_order', 'routing', 'base_model', 'description', 'version']) {
    for (const [vn, v] of JSON_VALUES) add(cat, `manifest ${k}=${vn}`, ['INVALID_ADAPTER'], true, runM(() => toJson(withValue(man, [k], v))))
  }
  const manMuts = [
    ['name empty', { name: '' }], ['name 100k', { name: 'n'.repeat(100_000) }], ['name with slash', { name: '../x/y' }], ['name with NUL', { name: 'a\u0000b' }],
    ['routing keywords number', { routing: { keywords: 5 } }], ['routing keywords of numbers', { routing: { keywords: [5, null] } }], ['routing priority string', { routing: { priority: 'x' } }],
    ['base_model llama', { base_model: { architecture: 'llama' } }], ['base_model hidden 65', { base_model: { hidden_size: 65 } }], ['base_model 99 layers', { base_model: { num_layers: 99 } }],
    ['base_model vocab 1', { base_model: { vocab_size: 1 } }], ['base_model hidden string', { base_model: { hidden_size: 'x' } }], ['base_model hidden -1', { base_model: { hidden_size: -1 } }],
    ['base_model hidden 2^64', { base_model: { hidden_size: raw('18446744073709551616') } }], ['base_model string', { base_model: 'Qwen/Qwen3-0.6B' }],
    ['1 MB description', { description: 'd'.repeat(1 << 20) }], ['10k extra fields', Object.fromEntries(Array.from({ length: 10_000 }, (_, i) => [`f${i}`, i]))],
  ]
  for (const [n, edit] of manMuts) add(cat, `manifest ${n}`, ['INVALID_ADAPTER', 'INVALID_ARGUMENT'], true, runM(() => toJson({ ...man, ...edit })))
  for (const [fn, text] of JSON_FILES) add(cat, `manifest file=${fn}`, ['INVALID_ADAPTER'], fn === 'empty object', runM(text))
  add(cat, 'manifest duplicate keys', ['INVALID_ADAPTER'], true, runM(`{"name":"a",${JSON.stringify(man).slice(1, -1)},"name":5}`))
}
