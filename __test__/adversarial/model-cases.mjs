// Adversarial cases of a model directory's files: config.json, safetensors weights, tokenizer
// files (chat templates included), generation_config.json, and special files in their place.
import { readFileSync } from 'node:fs'
import { parseSafetensors, prng, writeSafetensors } from './formats.mjs'
import { dedupe, DELETE, fx, JSON_FILES, JSON_VALUES, PROBE_CODES, raw, readJson, safetensorsMutations, SPECIALS, TEMPLATE_PROBE, TEMPLATES, toJson, toJsonDeep, withValue } from './inputs.mjs'

// ---------------------------------------------------------------- model: config.json

export function hfConfigCases(add) {
  const cat = 'model-config'
  const M = ['INVALID_MODEL']
  const MA = ['INVALID_MODEL', 'UNSUPPORTED_ARCHITECTURE']
  // Rope scaling types the engine does not implement are UNSUPPORTED_ARCHITECTURE, and so are
  // attention-changing fields turned on (src/model/unimplemented.rs).
  const UNIMPLEMENTED = ['use_bidirectional_attention', 'layer_types', 'sliding_window', 'use_sliding_window', 'no_rope_layers', 'attn_logit_softcapping', 'final_logit_softcapping',
    'query_pre_attn_scalar', 'attention_chunk_size', 'hidden_size_per_layer_input', 'partial_rotary_factor', 'embedding_multiplier',
    'residual_multiplier', 'attention_multiplier', 'logits_scaling', 'attention_k_eq_v', 'enable_moe_block']
  // An activation other than the family's is one the engine does not implement.
  const archField = (k) => ['architectures', 'model_type', 'rope_scaling', 'rope_parameters', 'hidden_activation', 'hidden_act', ...UNIMPLEMENTED].includes(k)
  // Texts are built when the case runs (thunks): building every case must stay cheap.
  const loadWith = (base, text) => async (ctx) => ctx.loadAndProbe(await ctx.modelDir(base, { 'config.json': text }))
  const bases = [['qwen3-tiny', JSON_VALUES.length], ['qwen2-tiny', 6], ['llama-tiny', 6], ['qwen3-untied-mqa', 4], ['ministral-tiny', 2], ['gemma3-mm-tiny', 3], ['granite-tiny', 3], ['smollm3-tiny', 2], ['gemma3-tiny', 2], ['phi3-tiny', 2], ['phi4-mini-tiny', 3], ['gemma4-tiny', 3], ['gemma4-mm-tiny', 2], ['qwen3moe-tiny', 3], ['qwen3moe-mixed-tiny', 2], ['gemma4-moe-tiny', 2], ['qwen35-tiny', 3], ['lfm2-tiny', 3]]
  for (const [base, perField] of bases) {
    const cfg = readJson(base, 'config.json')
    const rnd = prng(0xc0f19 + base.length)
    const fields = Object.keys(cfg).map((k) => [k])
    if (cfg.rope_parameters) fields.push(['rope_parameters', 'rope_theta'], ['rope_parameters', 'rope_type'])
    // Phi-4-mini's partial rotary factor and LongRoPE (its factor lists, an entry of each).
    for (const k of ['partial_rotary_factor', 'original_max_position_embeddings', 'short_factor', 'long_factor']) {
      if (cfg.rope_parameters?.[k] !== undefined) fields.push(['rope_parameters', k])
    }
    for (const k of ['short_factor', 'long_factor']) if (Array.isArray(cfg.rope_parameters?.[k])) fields.push(['rope_parameters', k, 2])
    if (cfg.layer_types) fields.push(['layer_types', 0])
    // Gemma 4's per-layer heads and its rotary embeddings by layer type.
    for (const [l, o] of Object.entries(cfg.per_layer_config ?? {})) for (const k of Object.keys(o)) fields.push(['per_layer_config', l, k])
    for (const t of ['full_attention', 'sliding_attention']) {
      for (const k of Object.keys(cfg.rope_parameters?.[t] ?? {})) fields.push(['rope_parameters', t, k])
    }
    if (Array.isArray(cfg.architectures)) fields.push(['architectures', 0])
    // A multimodal checkpoint's text model: each field of its text_config too.
    for (const k of Object.keys(cfg.text_config ?? {})) fields.push(['text_config', k])
    for (const keys of fields) {
      // The first model gets every value; the others a seeded selection.
      const values = perField >= JSON_VALUES.length ? JSON_VALUES : Array.from({ length: perField }, () => rnd.pick(JSON_VALUES))
      for (const [name, v] of dedupe(values)) {
        const field = keys[0] === 'text_config' && keys.length > 1 ? keys[1] : keys[0]
        add(cat, `${base}/${keys.join('.')}=${name}`, archField(field) ? MA : M, true, loadWith(base, () => toJson(withValue(cfg, keys, v))))
      }
    }
    for (const [name, text] of JSON_FILES) add(cat, `${base}/file=${name}`, M, false, loadWith(base, text))
  }
  const q3 = readJson('qwen3-tiny', 'config.json')
  const ll = readJson('llama-tiny', 'config.json')
  const g4 = readJson('gemma4-tiny', 'config.json')
  const mo = readJson('qwen3moe-tiny', 'config.json')
  const q5 = readJson('qwen35-tiny', 'config.json')
  const lf = readJson('lfm2-tiny', 'config.json')
  const specific = [
    // Qwen3-MoE's routed FFN (src/model/moe_config.rs).
    ['moe experts 2^40', mo, { num_experts: 2 ** 40 }, M, false],
    ['moe experts 2^63', mo, { num_experts: raw('9223372036854775808') }, M, false],
    ['moe experts -1', mo, { num_experts: -1 }, M, false],
    ['moe fewer experts than the file', mo, { num_experts: 4 }, M, false],
    ['moe no experts (every layer dense, no dense weights)', mo, { num_experts: 0 }, M, false],
    ['moe top-k 0', mo, { num_experts_per_tok: 0 }, M, false],
    ['moe top-k above the experts', mo, { num_experts_per_tok: 9 }, M, false],
    ['moe top-k every expert', mo, { num_experts_per_tok: 8 }, M, true],
    ['moe top-k NaN', mo, { num_experts_per_tok: raw('NaN') }, M, false],
    ['moe width 2^40', mo, { moe_intermediate_size: 2 ** 40 }, M, false],
    ['moe width 0', mo, { moe_intermediate_size: 0 }, M, false],
    ['moe sparse step 0', mo, { decoder_sparse_step: 0 }, M, false],
    ['moe sparse step 2^63', mo, { decoder_sparse_step: raw('9223372036854775808') }, M, false],
    // The hybrids' recurrent layers (src/model/hybrid_config.rs): sizes bounded before anything
    // is sized by them, the state per sequence too.
    ['qwen35 value heads 2^40', q5, { linear_num_value_heads: 2 ** 40 }, M, false],
    ['qwen35 value heads not a multiple of key heads', q5, { linear_num_value_heads: 3 }, M, false],
    ['qwen35 key heads 0', q5, { linear_num_key_heads: 0 }, M, false],
    ['qwen35 key head dim 2^40', q5, { linear_key_head_dim: 2 ** 40 }, M, false],
    ['qwen35 value head dim 1e9', q5, { linear_value_head_dim: 1e9 }, M, false],
    ['qwen35 state of 64k value heads of 128 x 128', q5, { linear_num_key_heads: 1, linear_num_value_heads: 65536, linear_key_head_dim: 128, linear_value_head_dim: 128 }, M, false],
    ['qwen35 conv kernel 1', q5, { linear_conv_kernel_dim: 1 }, M, false],
    ['qwen35 conv kernel 2^40', q5, { linear_conv_kernel_dim: 2 ** 40 }, M, false],
    ['qwen35 conv kernel -1', q5, { linear_conv_kernel_dim: -1 }, M, false],
    ['qwen35 conv kernel NaN', q5, { linear_conv_kernel_dim: raw('NaN') }, M, false],
    ['qwen35 partial rotary 0', q5, { rope_parameters: { ...q5.rope_parameters, partial_rotary_factor: 0 } }, M, false],
    ['qwen35 partial rotary 2', q5, { rope_parameters: { ...q5.rope_parameters, partial_rotary_factor: 2 } }, M, false],
    ['qwen35 partial rotary a string', q5, { rope_parameters: { ...q5.rope_parameters, partial_rotary_factor: '0.25' } }, M, false],
    ['qwen35 every layer linear attention', q5, { layer_types: new Array(4).fill('linear_attention') }, MA, false],
    ['qwen35 a mamba layer', q5, { layer_types: ['linear_attention', 'mamba', 'linear_attention', 'full_attention'] }, MA, false],
    ['qwen35 layer types of 100k', q5, { layer_types: new Array(100_000).fill('linear_attention') }, MA, false],
    ['qwen35 no layer types, interval 0', q5, { layer_types: undefined, full_attention_interval: 0 }, M, false],
    ['qwen35 no layer types, interval 2^63', q5, { layer_types: undefined, full_attention_interval: raw('9223372036854775808') }, M, false],
    ['qwen35 no layer types (every 4th full)', q5, { layer_types: undefined }, M, true],
    ['qwen35 multimodal without text_config', q5, { model_type: 'qwen3_5' }, MA, true],
    ['lfm2 conv taps 1', lf, { conv_L_cache: 1 }, M, false],
    ['lfm2 conv taps 2^40', lf, { conv_L_cache: 2 ** 40 }, M, false],
    ['lfm2 conv taps NaN', lf, { conv_L_cache: raw('NaN') }, M, false],
    ['lfm2 conv bias without biases', lf, { conv_bias: true }, M, false],
    ['lfm2 full_attn_idxs of 1e9', lf, { layer_types: undefined, full_attn_idxs: [1e9] }, M, false],
    ['lfm2 full_attn_idxs a string', lf, { layer_types: undefined, full_attn_idxs: '2' }, M, false],
    ['lfm2 full_attn_idxs', lf, { layer_types: undefined, full_attn_idxs: [2] }, M, true],
    ['lfm2 a mamba layer', lf, { layer_types: ['conv', 'mamba', 'full_attention', 'conv'] }, MA, false],
    ['lfm2 ffn multiplier NaN', lf, { block_ffn_dim_multiplier: raw('NaN') }, M, false],
    ['lfm2 ffn multiplier 1e300', lf, { block_ffn_dim_multiplier: 1e300 }, M, false],
    ['lfm2 ffn multiplier -1', lf, { block_ffn_dim_multiplier: -1 }, M, false],
    ['lfm2 ffn multiple of 0', lf, { block_multiple_of: 0 }, M, false],
    ['lfm2 norm_eps missing', lf, { norm_eps: undefined }, M, false],
    ['moe mlp_only_layers of layer 1e9', mo, { mlp_only_layers: [1e9] }, M, false],
    ['moe mlp_only_layers of 100k', mo, { mlp_only_layers: new Array(100_000).fill(0) }, M, false],
    ['moe mlp_only_layers a string', mo, { mlp_only_layers: 'all' }, M, false],
    ['moe norm_topk_prob a string', mo, { norm_topk_prob: 'true' }, M, false],
    ['moe norm_topk_prob off', mo, { norm_topk_prob: false }, M, true],
    ['moe shared expert', mo, { shared_expert_intermediate_size: 64 }, MA, false],
    ['moe as Qwen3MoeForCausalLM without model_type', mo, { model_type: undefined }, MA, true],
    ['unknown architecture', q3, { architectures: ['MambaForCausalLM'], model_type: 'mamba' }, MA, false],
    ['architecture of another family', q3, { architectures: ['GPT2LMHeadModel'], model_type: 'gpt2' }, MA, false],
    ['two architectures', q3, { architectures: ['Qwen3ForCausalLM', 'LlamaForCausalLM'] }, MA, true],
    ['empty architectures', q3, { architectures: [] }, MA, true],
    ['model_type mismatch', q3, { model_type: 'llama' }, MA, true],
    ['huge architecture name', q3, { architectures: ['X'.repeat(1_000_000)], model_type: 'y'.repeat(1_000_000) }, MA, false],
    ['hidden_size odd', q3, { hidden_size: 65 }, M, false],
    ['heads not dividing', q3, { num_key_value_heads: 3 }, M, false],
    ['kv heads above heads', q3, { num_key_value_heads: 8 }, M, false],
    ['head_dim mismatch', q3, { head_dim: 16 }, M, false],
    ['head_dim 1e9', q3, { head_dim: 1e9 }, M, false],
    ['head_dim odd', q3, { head_dim: 31 }, M, false],
    ['vocab smaller than tokenizer', q3, { vocab_size: 100 }, M, false],
    ['vocab 2^32', q3, { vocab_size: 2 ** 32 }, M, false],
    ['layers 2^32 + 3', q3, { num_hidden_layers: 2 ** 32 + 3 }, M, false],
    ['fewer layers', q3, { num_hidden_layers: 1, layer_types: ['full_attention'] }, M, true],
    ['layer_types too short', q3, { layer_types: ['full_attention'] }, M, true],
    // Attention-changing settings not implemented yet are refused by name (never ignored).
    ['layer_types unknown', q3, { layer_types: ['x', 'y', 'z'] }, MA, false],
    ['sliding layers, window 0', q3, { layer_types: ['sliding_attention', 'sliding_attention', 'sliding_attention'], sliding_window: 0, use_sliding_window: true }, MA, false],
    ['sliding window 1', q3, { use_sliding_window: true, sliding_window: 1, max_window_layers: 0 }, MA, false],
    ['sliding window -1', q3, { use_sliding_window: true, sliding_window: -1 }, MA, false],
    ['sliding window 2^63', q3, { use_sliding_window: true, sliding_window: raw('9223372036854775808') }, MA, false],
    // Mistral and Ministral run their windows (src/model/window_config.rs).
    ['mistral with a window', ll, { model_type: 'mistral', architectures: ['MistralForCausalLM'], sliding_window: 4096 }, MA, true],
    ['mistral window 0', ll, { model_type: 'mistral', sliding_window: 0 }, MA, false],
    ['mistral window 2^63', ll, { model_type: 'mistral', sliding_window: raw('9223372036854775808') }, MA, false],
    ['mistral window 1e400', ll, { model_type: 'mistral', sliding_window: raw('1e400') }, MA, false],
    ['mistral window a string', ll, { model_type: 'mistral', sliding_window: '4096' }, MA, false],
    ['mistral window 1', ll, { model_type: 'mistral', sliding_window: 1 }, MA, true],
    // Wider than any context: the window group's tables list every block (spans saturate).
    ['mistral window 2^40', ll, { model_type: 'mistral', sliding_window: 2 ** 40 }, MA, true],
    ['mistral with layer types', ll, { model_type: 'mistral', sliding_window: 4, layer_types: ['sliding_attention', 'full_attention'] }, MA, false],
    ['ministral layer types of 100k', ll, { model_type: 'ministral', sliding_window: 4, layer_types: new Array(100_000).fill('sliding_attention') }, MA, false],
    // SmolLM3's layers without RoPE (src/model/smollm3_config.rs).
    ['smollm3 no_rope_layers of 100k', ll, { model_type: 'smollm3', no_rope_layers: new Array(100_000).fill(0) }, MA, false],
    ['smollm3 no_rope_layers of 2', ll, { model_type: 'smollm3', no_rope_layers: [1, 2] }, MA, false],
    ['smollm3 no_rope_layers NaN', ll, { model_type: 'smollm3', no_rope_layers: [1, raw('NaN')] }, MA, false],
    ['smollm3 interval 0', ll, { model_type: 'smollm3', no_rope_layer_interval: 0 }, MA, false],
    ['smollm3 interval 2^63', ll, { model_type: 'smollm3', no_rope_layer_interval: raw('9223372036854775808') }, MA, false],
    ['smollm3 every layer without RoPE', ll, { model_type: 'smollm3', no_rope_layers: [0, 0] }, MA, true],
    // Phi-3's window, partial rotary factor and LongRoPE (src/model/phi3_config.rs, rope.rs).
    ['phi3 window 2^63', ll, { model_type: 'phi3', sliding_window: raw('9223372036854775808') }, MA, false],
    ['phi3 window 1', ll, { model_type: 'phi3', sliding_window: 1 }, MA, true],
    ['phi3 partial rotary NaN string', ll, { model_type: 'phi3', partial_rotary_factor: 'NaN' }, MA, false],
    ['phi3 partial rotary 1e-9', ll, { model_type: 'phi3', partial_rotary_factor: 1e-9 }, MA, false],
    ['phi3 partial rotary 2', ll, { model_type: 'phi3', partial_rotary_factor: 2 }, MA, false],
    ['phi3 partial rotary odd', ll, { model_type: 'phi3', partial_rotary_factor: 0.3125 }, MA, false],
    ['phi3 longrope 1M factors', ll, { model_type: 'phi3', rope_scaling: { type: 'longrope', short_factor: new Array(1 << 20).fill(1), long_factor: new Array(1 << 20).fill(1) } }, MA, false],
    ['phi3 longrope NaN factor', ll, { model_type: 'phi3', rope_scaling: { type: 'longrope', short_factor: [raw('NaN'), ...new Array(7).fill(1)], long_factor: new Array(8).fill(1) } }, MA, false],
    ['phi3 longrope factor 1e400', ll, { model_type: 'phi3', rope_scaling: { type: 'longrope', short_factor: new Array(8).fill(1), long_factor: [raw('1e400'), ...new Array(7).fill(1)] } }, MA, false],
    ['phi3 longrope no long factors', ll, { model_type: 'phi3', rope_scaling: { type: 'longrope', short_factor: new Array(8).fill(1) } }, MA, false],
    ['phi3 longrope original 0', ll, { model_type: 'phi3', original_max_position_embeddings: 0, rope_scaling: { type: 'longrope', short_factor: new Array(8).fill(1), long_factor: new Array(8).fill(2) } }, MA, false],
    ['phi3 longrope original 2^63', ll, { model_type: 'phi3', original_max_position_embeddings: raw('9223372036854775808'), rope_scaling: { type: 'longrope', short_factor: new Array(8).fill(1), long_factor: new Array(8).fill(2) } }, MA, false],
    ['phi3 longrope attention factor -1', ll, { model_type: 'phi3', rope_scaling: { type: 'longrope', attention_factor: -1, short_factor: new Array(8).fill(1), long_factor: new Array(8).fill(2) } }, MA, false],
    // Gemma 4 (src/model/gemma4_config.rs).
    ['gemma4 every layer sharing', g4, { num_kv_shared_layers: 6 }, MA, false],
    ['gemma4 sharing 2^63', g4, { num_kv_shared_layers: raw('9223372036854775808') }, MA, false],
    ['gemma4 global head dim 2^40', g4, { per_layer_config: null, global_head_dim: 2 ** 40 }, MA, false],
    ['gemma4 per-layer config of layer 1e9', g4, { per_layer_config: { 1000000000: { head_dim: 32 } } }, MA, false],
    ['gemma4 per-layer kv heads 3', g4, { per_layer_config: { 3: { head_dim: 32, num_key_value_heads: 3 }, 5: { head_dim: 32 } } }, MA, false],
    ['gemma4 per-layer unknown key', g4, { per_layer_config: { 3: { head_dim: 32, sliding_window: 2 }, 5: { head_dim: 32 } } }, MA, false],
    ['gemma4 per-layer inputs of 2^40', g4, { hidden_size_per_layer_input: 2 ** 40 }, MA, false],
    ['gemma4 per-layer vocabulary 10', g4, { vocab_size_per_layer_input: 10 }, MA, false],
    // Values from keys on the full layers (their v_proj, present in this file, goes unread).
    ['gemma4 k_eq_v', g4, { attention_k_eq_v: true }, MA, true],
    ['gemma4 k_eq_v a string', g4, { attention_k_eq_v: 'true' }, MA, false],
    ['gemma4 k_eq_v with 3 global kv heads', g4, { attention_k_eq_v: true, per_layer_config: null, global_head_dim: 32, num_global_key_value_heads: 3 }, MA, false],
    ['gemma4 MoE block without its sizes', g4, { enable_moe_block: true }, MA, false],
    ['gemma4 MoE block of 2^40 experts', g4, { enable_moe_block: true, num_experts: 2 ** 40, top_k_experts: 2, moe_intermediate_size: 8 }, MA, false],
    ['gemma4 MoE block top-k above the experts', g4, { enable_moe_block: true, num_experts: 4, top_k_experts: 5, moe_intermediate_size: 8 }, MA, false],
    ['gemma4 MoE block without expert weights', g4, { enable_moe_block: true, num_experts: 4, top_k_experts: 2, moe_intermediate_size: 8 }, MA, false],
    ['gemma4 proportional factor NaN', g4, { rope_parameters: { full_attention: { rope_type: 'proportional', partial_rotary_factor: 'NaN', rope_theta: 1e6 }, sliding_attention: { rope_type: 'default', rope_theta: 1e4 } } }, MA, false],
    ['gemma4 proportional factor 0', g4, { rope_parameters: { full_attention: { rope_type: 'proportional', partial_rotary_factor: 0, rope_theta: 1e6 }, sliding_attention: { rope_type: 'default', rope_theta: 1e4 } } }, MA, false],
    ['gemma4 rope theta -1', g4, { rope_parameters: { full_attention: { rope_type: 'proportional', partial_rotary_factor: 0.25, rope_theta: -1 }, sliding_attention: { rope_type: 'default', rope_theta: 1e4 } } }, MA, false],
    ['gemma4 no sharing, no per-layer inputs', g4, { num_kv_shared_layers: 0, hidden_size_per_layer_input: 0 }, MA, false],
    ['phi3 longrope', ll, { model_type: 'phi3', original_max_position_embeddings: 64, rope_scaling: { type: 'longrope', short_factor: new Array(8).fill(1), long_factor: new Array(8).fill(2) } }, MA, true],
    ['ministral chunked layer type', ll, { model_type: 'ministral', sliding_window: 4, layer_types: ['chunked_attention', 'full_attention'] }, MA, false],
    ['llama with a window of 1e400', ll, { sliding_window: raw('1e400') }, MA, false],
    ['no_rope_layers of 100k zeros', ll, { no_rope_layers: new Array(100_000).fill(0) }, MA, false],
    ['no_rope_layers a string', ll, { no_rope_layers: 'none' }, MA, false],
    ['attention softcap NaN string', q3, { attn_logit_softcapping: 'NaN' }, MA, false],
    ['final softcap 1e400', q3, { final_logit_softcapping: raw('1e400') }, MA, false],
    ['query_pre_attn_scalar -1', q3, { query_pre_attn_scalar: -1 }, MA, false],
    ['attention_chunk_size 2^63', ll, { attention_chunk_size: raw('9223372036854775808') }, MA, false],
    ['partial_rotary_factor 0', ll, { partial_rotary_factor: 0 }, MA, false],
    ['partial_rotary_factor 1e9', ll, { partial_rotary_factor: 1e9 }, MA, false],
    ['embedding_multiplier -0', ll, { embedding_multiplier: raw('-0.0') }, MA, false],
    ['residual_multiplier object', ll, { residual_multiplier: { x: 1 } }, MA, false],
    ['logits_scaling 1e-320', q3, { logits_scaling: 1e-320 }, MA, false],
    ['hidden_size_per_layer_input 2^40', q3, { hidden_size_per_layer_input: 2 ** 40 }, MA, false],
    ['max_position 1', q3, { max_position_embeddings: 1 }, M, true],
    ['max_position 3e7', q3, { max_position_embeddings: 3e7 }, M, true],
    // The default KV pool for 2^24 positions is a quarter of the machine: under the child's
    // address-space limit it cannot be reserved, which is OUT_OF_MEMORY, not an abort.
    ['max_position 2^24 (the engine maximum)', q3, { max_position_embeddings: 2 ** 24 }, [...M, 'OUT_OF_MEMORY'], true],
    ['rope_theta 1e-300', q3, { rope_theta: 1e-300 }, M, true],
    ['rope_theta 1e300', q3, { rope_theta: 1e300 }, M, true],
    ['eps 1e300', q3, { rms_norm_eps: 1e300 }, M, true],
    ['eps 0', q3, { rms_norm_eps: 0 }, M, true],
    ['hidden_act unknown', q3, { hidden_act: 'swishy' }, M, true],
    ['eos out of range', q3, { eos_token_id: 99999 }, M, true],
    ['eos list with garbage', q3, { eos_token_id: [397, -1, 'x', 2 ** 40] }, M, true],
    ['bos 2^63', q3, { bos_token_id: raw('9223372036854775808') }, M, true],
    ['torch_dtype unknown', q3, { torch_dtype: 'float8_e4m3' }, M, true],
    ['tied but lm_head expected', q3, { tie_word_embeddings: false }, M, false],
    ['intermediate_size 0', q3, { intermediate_size: 0 }, M, false],
    ['duplicate keys', null, `{"hidden_size": 64, ${JSON.stringify(q3).slice(1, -1)}, "hidden_size": -1}`, M, true],
    ['BOM', null, '\ufeff' + JSON.stringify(q3), M, true],
    ['UTF-16', null, Buffer.from(JSON.stringify(q3), 'utf16le'), M, false],
    ['10 MB of whitespace', null, ' '.repeat(10 << 20) + JSON.stringify(q3), M, true],
    ['trailing garbage', null, JSON.stringify(q3) + 'garbage', M, false],
    ['rope_scaling linear factor 0', q3, { rope_scaling: { type: 'linear', factor: 0 } }, M, true],
    ['rope_scaling linear factor -1', q3, { rope_scaling: { rope_type: 'linear', factor: -1 } }, M, true],
    ['rope_scaling linear factor 1e400', q3, { rope_scaling: { rope_type: 'linear', factor: raw('1e400') } }, M, true],
    ['rope_scaling linear factor string', q3, { rope_scaling: { rope_type: 'linear', factor: 'x' } }, M, true],
    ['rope_scaling yarn without fields', q3, { rope_scaling: { rope_type: 'yarn' } }, M, true],
    ['rope_scaling yarn factor 1e9', q3, { rope_scaling: { rope_type: 'yarn', factor: 1e9, original_max_position_embeddings: 0 } }, M, true],
    ['rope_scaling dynamic', q3, { rope_scaling: { rope_type: 'dynamic', factor: 2 } }, M, true],
    ['rope_scaling longrope empty', q3, { rope_scaling: { rope_type: 'longrope', short_factor: [], long_factor: [] } }, M, true],
    ['rope_scaling unknown type', q3, { rope_scaling: { rope_type: 'wobbly', factor: 2 } }, M, true],
    ['rope_scaling type number', q3, { rope_scaling: { rope_type: 5 } }, M, true],
    ['rope_scaling string', q3, { rope_scaling: 'linear' }, M, true],
    ['llama3 rope, low = high freq factor', ll, { rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 1, original_max_position_embeddings: 8192 } }, M, true],
    ['llama3 rope, original max 0', ll, { rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 0 } }, M, true],
    ['llama3 rope, factor 0', ll, { rope_scaling: { rope_type: 'llama3', factor: 0, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192 } }, M, true],
    ['llama3 rope, NaN strings', ll, { rope_scaling: { rope_type: 'llama3', factor: 'NaN', low_freq_factor: 'NaN', high_freq_factor: 'NaN', original_max_position_embeddings: 'NaN' } }, M, true],
    // MLP biases are not implemented: refused rather than silently dropped.
    ['llama mlp_bias true', ll, { mlp_bias: true }, MA, false],
    ['llama attention_bias true', ll, { attention_bias: true }, M, false],
    ['llama pretraining_tp 0', ll, { pretraining_tp: 0 }, M, true],
  ]
  for (const [name, base, edit, expect, ok] of specific) {
    const model = base === ll ? 'llama-tiny' : base === mo ? 'qwen3moe-tiny' : base === g4 ? 'gemma4-tiny' : 'qwen3-tiny'
    const text = base === null ? edit : () => toJson({ ...base, ...edit })
    add(cat, `specific/${name}`, name.includes('rope') ? MA : expect, ok, loadWith(model, text))
  }
}

// ---------------------------------------------------------------- model: safetensors
export function safetensorsCases(add) {
  const cat = 'model-safetensors'
  const M = ['INVALID_MODEL']
  const buf = readFileSync(fx('qwen3-tiny', 'model.safetensors'))
  for (const [name, bytes, ok] of safetensorsMutations(buf, 0x5afe)) {
    add(cat, `qwen3-tiny/${name}`, M, ok, async (ctx) => ctx.loadAndProbe(await ctx.modelDir('qwen3-tiny', { 'model.safetensors': bytes() })))
  }
  const llama = readFileSync(fx('llama-tiny', 'model.safetensors'))
  for (const [name, bytes, ok] of safetensorsMutations(llama, 0x11a3a, { flips: 20, dataFlips: 2, cuts: 6, tensors: 2 })) {
    add(cat, `llama-tiny/${name}`, M, ok, async (ctx) => ctx.loadAndProbe(await ctx.modelDir('llama-tiny', { 'model.safetensors': bytes() })))
  }
  // Sharded: the index names the files.
  const base = 'qwen3-untied-mqa'
  const index = readJson(base, 'model.safetensors.index.json')
  const shard = (i) => `model-0000${i}-of-00003.safetensors`
  const mapAll = (f) => ({ ...index, weight_map: Object.fromEntries(Object.entries(index.weight_map).map(([k, v]) => [k, f(v, k)])) })
  const idx = [
    ['weight_map empty', { ...index, weight_map: {} }, false],
    ['weight_map null', { ...index, weight_map: null }, false],
    ['weight_map array', { ...index, weight_map: [shard(1)] }, false],
    ['no weight_map', { metadata: {} }, false],
    ['shard names not strings', mapAll(() => 5), false],
    ['shard path traversal to another model', mapAll((v) => (v === shard(1) ? '../../../qwen3-tiny/model.safetensors' : v)), false],
    ['absolute shard path /dev/zero', mapAll((v) => (v === shard(1) ? '/dev/zero' : v)), false],
    ['absolute shard path /etc/passwd', mapAll((v) => (v === shard(2) ? '/etc/passwd' : v)), false],
    ['shard is the directory', mapAll((v) => (v === shard(3) ? '.' : v)), false],
    ['shard is the index', mapAll((v) => (v === shard(3) ? 'model.safetensors.index.json' : v)), false],
    ['shard name empty', mapAll((v) => (v === shard(3) ? '' : v)), false],
    ['shard name 100k long', mapAll((v) => (v === shard(2) ? 'a'.repeat(100_000) : v)), false],
    ['every tensor in one wrong shard', mapAll(() => shard(1)), true],
    ['total_size wrong', { ...index, metadata: { total_size: -1, total_parameters: 'x' } }, true],
  ]
  for (const [name, v, ok] of idx) {
    add(cat, `sharded/${name}`, M, ok, async (ctx) => ctx.loadAndProbe(await ctx.modelDir(base, { 'model.safetensors.index.json': () => toJson(v) })))
  }
  for (const [name, text] of JSON_FILES) {
    add(cat, `sharded/index file=${name}`, M, false, async (ctx) => ctx.loadAndProbe(await ctx.modelDir(base, { 'model.safetensors.index.json': text })))
  }
  add(cat, 'sharded/a shard missing', M, false, async (ctx) => ctx.loadAndProbe(await ctx.modelDir(base, { [shard(2)]: null })))
  add(cat, 'sharded/a shard truncated', M, false, async (ctx) =>
    ctx.loadAndProbe(await ctx.modelDir(base, { [shard(3)]: readFileSync(fx(base, shard(3))).subarray(0, 5000) })))
  add(cat, 'sharded/a tensor in two shards', M, true, async (ctx) =>
    ctx.loadAndProbe(await ctx.modelDir(base, { [shard(3)]: readFileSync(fx(base, shard(1))) })))
  add(cat, 'single file missing', ['INVALID_MODEL', 'MODEL_NOT_FOUND'], false, async (ctx) => ctx.loadAndProbe(await ctx.modelDir('qwen3-tiny', { 'model.safetensors': null })))
  add(cat, 'weights of another model', M, false, async (ctx) =>
    ctx.loadAndProbe(await ctx.modelDir('qwen3-tiny', { 'model.safetensors': readFileSync(fx('qwen2-tiny', 'model.safetensors')) })))
  add(cat, 'GGUF bytes named model.safetensors', M, false, async (ctx) =>
    ctx.loadAndProbe(await ctx.modelDir('qwen3-tiny', { 'model.safetensors': readFileSync(fx('qwen3-tiny', 'model-q8_0.gguf')) })))
  add(cat, 'NaN weights', M, true, async (ctx) => {
    const st = parseSafetensors(buf)
    const data = Buffer.from(st.data)
    for (let i = 0; i + 4 <= data.length; i += 4) data.writeUInt32LE(0x7fc00000, i)
    return ctx.loadAndProbe(await ctx.modelDir('qwen3-tiny', { 'model.safetensors': writeSafetensors(st.headerText, data) }))
  })
  add(cat, 'Infinity weights', M, true, async (ctx) => {
    const st = parseSafetensors(buf)
    const data = Buffer.from(st.data)
    for (let i = 0; i + 4 <= data.length; i += 4) data.writeFloatLE(i % 8 ? Infinity : -Infinity, i)
    return ctx.loadAndProbe(await ctx.modelDir('qwen3-tiny', { 'model.safetensors': writeSafetensors(st.headerText, data) }))
  })
}

// ---------------------------------------------------------------- tokenizer files

export function tokenizerCases(add) {
  const cat = 'model-tokenizer'
  const M = ['INVALID_MODEL']
  const tokText = readFileSync(fx('qwen3-tiny', 'tokenizer.json'), 'utf8')
  const tok = JSON.parse(tokText)
  const withTok = (name, v, ok, file = 'tokenizer.json', extra = {}) =>
    add(cat, name, M, ok, async (ctx) => ctx.loadAndProbe(await ctx.modelDir('qwen3-tiny', {
      [file]: () => {
        const x = typeof v === 'function' ? v() : v
        return typeof x === 'string' || Buffer.isBuffer(x) ? x : toJson(x)
      },
    })), extra)
  for (const n of [0, 1, 10, 100, tokText.length >> 2, tokText.length >> 1, tokText.length - 2, tokText.length - 1]) withTok(`tokenizer.json truncated at ${n}`, tokText.slice(0, n), false)
  for (const [name, text] of JSON_FILES) withTok(`tokenizer.json file=${name}`, text, false)
  const set = (keys, v) => () => withValue(tok, keys, v)
  const muts = [
    ['vocab id 5000', set(['model', 'vocab', 'zz'], 5000), false],
    ['vocab id -1', set(['model', 'vocab', 'zz'], -1), false],
    ['vocab id string', set(['model', 'vocab', 'zz'], 'x'), false],
    ['vocab id 1e20', set(['model', 'vocab', 'zz'], 1e20), false],
    ['vocab id 2^32', set(['model', 'vocab', 'zz'], 2 ** 32), false],
    ['vocab id 2^32 + 5 (wraps to 5)', set(['model', 'vocab', 'zz'], 2 ** 32 + 5), true],
    ['vocab id 0.5', set(['model', 'vocab', 'zz'], 0.5), false],
    ['vocab as array', set(['model', 'vocab'], Object.keys(tok.model.vocab)), false],
    ['vocab empty', set(['model', 'vocab'], {}), false],
    ['vocab null', set(['model', 'vocab'], null), false],
    ['two tokens with one id', set(['model', 'vocab', 'zzz'], 5), true],
    ['byte token removed', set(['model', 'vocab', 'a'], DELETE), true],
    ['merges unknown tokens', set(['model', 'merges'], [['zz', 'yy']]), false],
    ['merges malformed', set(['model', 'merges'], [5, ['a'], 'a b c']), false],
    ['merges empty', set(['model', 'merges'], []), true],
    ['merges null', set(['model', 'merges'], null), false],
    ['model type WordPiece', set(['model', 'type'], 'WordPiece'), false],
    ['model type Unigram', set(['model', 'type'], 'Unigram'), false],
    ['model type unknown', set(['model', 'type'], 'Mystery'), false],
    ['no model', set(['model'], DELETE), false],
    ['unk token unknown', set(['model', 'unk_token'], '<nope>'), true],
    ['byte_fallback without byte tokens', set(['model', 'byte_fallback'], true), true],
    ['dropout 2', set(['model', 'dropout'], 2), false],
    ['added token id 5000', set(['added_tokens', 0, 'id'], 5000), true],
    ['added token id -1', set(['added_tokens', 0, 'id'], -1), false],
    ['added token id string', set(['added_tokens', 0, 'id'], 'x'), false],
    ['added token empty content', set(['added_tokens', 0, 'content'], ''), true],
    ['added token 64 KB content', set(['added_tokens', 0, 'content'], 'z'.repeat(1 << 16)), true],
    ['added token special string', set(['added_tokens', 0, 'special'], 'yes'), false],
    ['added tokens not array', set(['added_tokens'], {}), false],
    ['added token duplicated', () => ({ ...tok, added_tokens: [...tok.added_tokens, { ...tok.added_tokens[1] }] }), true],
    ['10k added tokens past the vocab', () => ({ ...tok, added_tokens: [...tok.added_tokens, ...Array.from({ length: 10_000 }, (_, i) => ({ ...tok.added_tokens[0], id: 400 + i, content: `<x${i}>` }))] }), false],
    ['normalizer invalid regex', set(['normalizer'], { type: 'Replace', pattern: { Regex: '(' }, content: 'x' }), false],
    ['normalizer catastrophic regex', set(['normalizer'], { type: 'Replace', pattern: { Regex: '(a+)+$' }, content: 'b' }), true],
    ['normalizer replaces a char by 1000', set(['normalizer'], { type: 'Replace', pattern: { String: 'a' }, content: 'b'.repeat(1000) }), true],
    ['normalizer unknown', set(['normalizer'], { type: 'Mystery' }), false],
    ['normalizer precompiled garbage', set(['normalizer'], { type: 'Precompiled', precompiled_charsmap: 'not base64!' }), false],
    ['normalizer sequence 10k deep', () => toJsonDeep(tok, 'normalizer', '{"type":"Sequence","normalizers":['.repeat(10_000) + '{"type":"NFC"}' + ']}'.repeat(10_000)), false],
    ['pre-tokenizer invalid regex', set(['pre_tokenizer', 'pretokenizers', 0, 'pattern', 'Regex'], '[z-a]'), false],
    ['pre-tokenizer empty regex', set(['pre_tokenizer', 'pretokenizers', 0, 'pattern', 'Regex'], ''), true],
    ['pre-tokenizer catastrophic regex', set(['pre_tokenizer', 'pretokenizers', 0, 'pattern', 'Regex'], '(x+x+)+y'), true],
    ['pre-tokenizer unknown', set(['pre_tokenizer'], { type: 'Mystery' }), false],
    ['decoder replace empty pattern', set(['decoder'], { type: 'Replace', pattern: { String: '' }, content: 'xx' }), true],
    ['decoder unknown', set(['decoder'], { type: 'Mystery' }), false],
    ['post-processor ids past the vocab', set(['post_processor'], { type: 'TemplateProcessing', single: [{ SpecialToken: { id: '<x>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }], pair: [{ Sequence: { id: 'A', type_id: 0 } }], special_tokens: { '<x>': { id: '<x>', ids: [99999], tokens: ['<x>'] } } }), true],
    ['post-processor special token without ids', set(['post_processor'], { type: 'TemplateProcessing', single: [{ SpecialToken: { id: '<x>', type_id: 0 } }], pair: [], special_tokens: {} }), false],
    ['post-processor 10k specials', set(['post_processor'], { type: 'TemplateProcessing', single: [...Array(10_000).fill({ SpecialToken: { id: '<|endoftext|>', type_id: 0 } }), { Sequence: { id: 'A', type_id: 0 } }], pair: [{ Sequence: { id: 'A', type_id: 0 } }], special_tokens: { '<|endoftext|>': { id: '<|endoftext|>', ids: [395], tokens: ['<|endoftext|>'] } } }), true],
    ['truncation max_length 0', set(['truncation'], { direction: 'Right', max_length: 0, strategy: 'LongestFirst', stride: 0 }), true],
    ['truncation stride above max', set(['truncation'], { direction: 'Right', max_length: 2, strategy: 'LongestFirst', stride: 5 }), true],
    ['padding pad_id past the vocab', set(['padding'], { strategy: { Fixed: 64 }, direction: 'Right', pad_to_multiple_of: null, pad_id: 99999, pad_type_id: 0, pad_token: '<pad>' }), true],
    ['padding to 1e7', set(['padding'], { strategy: { Fixed: 1e7 }, direction: 'Right', pad_to_multiple_of: null, pad_id: 395, pad_type_id: 0, pad_token: '<|endoftext|>' }), true],
  ]
  // A tokenizer that fails on some input (a regex past its backtracking limit) fails the
  // request that hit it as INVALID_MODEL: the model's tokenizer is at fault.
  const failsOnSomeInput = { probe: [...PROBE_CODES, 'INVALID_MODEL'] }
  for (const [name, v, ok] of muts) withTok(`tokenizer.json ${name}`, v, ok, 'tokenizer.json', name.includes('catastrophic') ? failsOnSomeInput : {})

  const cfgText = readFileSync(fx('qwen3-tiny', 'tokenizer_config.json'), 'utf8')
  const cfg = JSON.parse(cfgText)
  for (const n of [0, 1, 100, cfgText.length >> 1, cfgText.trimEnd().length - 1]) withTok(`tokenizer_config.json truncated at ${n}`, cfgText.slice(0, n), false, 'tokenizer_config.json')
  // The file is optional: JSON that is not an object may be taken as no configuration.
  for (const [name, text] of JSON_FILES) withTok(`tokenizer_config.json file=${name}`, text, ['empty object', 'null', 'array', 'string', 'number'].includes(name), 'tokenizer_config.json')
  for (const k of ['chat_template', 'eos_token', 'bos_token', 'pad_token', 'add_bos_token', 'model_max_length', 'added_tokens_decoder', 'additional_special_tokens']) {
    for (const [name, v] of JSON_VALUES) withTok(`tokenizer_config.json ${k}=${name}`, () => withValue(cfg, [k], v), true, 'tokenizer_config.json')
  }
  const cfgMuts = [
    ['eos_token unknown', { eos_token: '<nope>' }],
    ['eos_token object', { eos_token: { content: '<|im_end|>', special: true } }],
    ['eos_token object without content', { eos_token: { special: true } }],
    ['eos_token a normal token', { eos_token: 'a' }],
    ['eos_token empty', { eos_token: '' }],
    ['bos_token 1 MB', { bos_token: 'b'.repeat(1 << 20), add_bos_token: true }],
    ['chat_template list', { chat_template: [{ name: 'default', template: '{{ messages[0].content }}' }, { name: 'tool_use', template: '{{' }] }],
    ['chat_template list without default', { chat_template: [{ name: 'x', template: '{{ messages[0].content }}' }] }],
    ['chat_template list of junk', { chat_template: [5, null, {}] }],
    ['chat_template list with bad default', { chat_template: [{ name: 'default', template: 5 }] }],
    ['added_tokens_decoder ids past the vocab', { added_tokens_decoder: { 99999: { content: '<x>', special: true } } }],
  ]
  for (const [name, edit] of cfgMuts) withTok(`tokenizer_config.json ${name}`, { ...cfg, ...edit }, true, 'tokenizer_config.json')
  for (const [name, t] of TEMPLATES) {
    withTok(`chat_template ${name}`, { ...cfg, chat_template: t }, true, 'tokenizer_config.json', TEMPLATE_PROBE)
  }
  // transformers 5 reads chat_template.jinja first.
  for (const [name, t] of TEMPLATES.filter((x, i) => i % 3 === 0 && !x[2])) withTok(`chat_template.jinja ${name}`, t, true, 'chat_template.jinja', TEMPLATE_PROBE)
  for (const [name, text] of JSON_FILES.slice(0, 6)) withTok(`chat_template.json file=${name}`, text, true, 'chat_template.json')
}

// ---------------------------------------------------------------- generation_config.json

export function generationConfigCases(add) {
  const cat = 'model-generation-config'
  const M = ['INVALID_MODEL']
  const gc = readJson('qwen3-tiny', 'generation_config.json')
  const run = (text) => async (ctx) => ctx.loadAndProbe(await ctx.modelDir('qwen3-tiny', { 'generation_config.json': text }), {}, { defaults: true })
  for (const k of ['temperature', 'top_p', 'top_k', 'min_p', 'repetition_penalty', 'eos_token_id', 'bos_token_id', 'pad_token_id', 'max_new_tokens', 'max_length', 'do_sample']) {
    for (const [name, v] of JSON_VALUES) add(cat, `${k}=${name}`, M, true, run(() => toJson(withValue(gc, [k], v))))
  }
  for (const [name, v] of [['eos list garbage', [397, -1, 'x', null, 2 ** 40, raw('1e400')]], ['eos list 100k', Array(100_000).fill(397)], ['eos list empty', []]]) {
    add(cat, name, M, true, run(() => toJson({ ...gc, eos_token_id: v })))
  }
  // The file is optional: JSON that is not an object may be taken as no defaults.
  for (const [name, text] of JSON_FILES) add(cat, `file=${name}`, M, ['empty object', 'null', 'array', 'string', 'number'].includes(name), run(text))
}

// ---------------------------------------------------------------- special files

export function specialFileCases(add) {
  const cat = 'special-files'
  const M = ['INVALID_MODEL']
  const MN = ['INVALID_MODEL', 'MODEL_NOT_FOUND']
  // Optional files may also be taken as absent.
  const optional = new Set(['generation_config.json', 'tokenizer_config.json', 'chat_template.jinja', 'chat_template.json'])
  // Read only when tokenizer_config.json has no template (the fixture's has one).
  const unread = new Set(['chat_template.json'])
  for (const file of ['config.json', 'tokenizer.json', 'model.safetensors', ...optional]) {
    for (const kind of SPECIALS) {
      const gone = kind === 'dangling' || kind === 'loop'
      add(cat, `model ${file} as ${kind}`, file === 'config.json' && gone ? MN : M, (optional.has(file) && kind !== 'sparse-1g') || unread.has(file),
        async (ctx) => ctx.loadAndProbe(await ctx.modelDir('qwen3-tiny', { [file]: { special: kind } })))
    }
  }
  for (const kind of SPECIALS) {
    add(cat, `sharded index as ${kind}`, MN, false, async (ctx) => ctx.loadAndProbe(await ctx.modelDir('qwen3-untied-mqa', { 'model.safetensors.index.json': { special: kind } })))
    add(cat, `a shard as ${kind}`, MN, false, async (ctx) => ctx.loadAndProbe(await ctx.modelDir('qwen3-untied-mqa', { 'model-00002-of-00003.safetensors': { special: kind } })))
    add(cat, `model path as ${kind}`, MN, false, async (ctx) => ctx.loadAndProbe(await ctx.special('model', kind)))
    add(cat, `gguf path as ${kind}`, MN, false, async (ctx) => ctx.loadAndProbe(await ctx.special('model.gguf', kind)))
    for (const file of ['adapter_config.json', 'adapter_model.safetensors', 'manifest.json']) {
      const gone = kind === 'dangling' || kind === 'loop'
      const expect = file === 'adapter_config.json' && gone ? ['INVALID_ADAPTER', 'EXPERT_NOT_FOUND'] : ['INVALID_ADAPTER']
      add(cat, `adapter ${file} as ${kind}`, expect, file === 'manifest.json' && gone, async (ctx) => ctx.loadExpertAndProbe(await ctx.adapterDir('lora', { [file]: { special: kind } })))
    }
    add(cat, `adapter path as ${kind}`, ['INVALID_ADAPTER', 'EXPERT_NOT_FOUND'], false, async (ctx) => ctx.loadExpertAndProbe(await ctx.special('adapter', kind)))
  }
  add(cat, 'model dir empty', MN, false, async (ctx) => ctx.loadAndProbe(await ctx.emptyDir('model')))
  add(cat, 'adapter dir empty', ['INVALID_ADAPTER', 'EXPERT_NOT_FOUND'], false, async (ctx) => ctx.loadExpertAndProbe(await ctx.emptyDir('adapter')))
  add(cat, 'empty file named .gguf', M, false, async (ctx) => ctx.loadAndProbe(await ctx.file('m.gguf', '')))
  add(cat, 'text file as model', M, false, async (ctx) => ctx.loadAndProbe(await ctx.file('model.bin', 'hello')))
  add(cat, 'directory named .gguf', MN, false, async (ctx) => ctx.loadAndProbe(await ctx.emptyDir('x.gguf')))
  add(cat, 'model dir given as its config.json', M, false, async (ctx) => ctx.loadAndProbe(fx('qwen3-tiny', 'config.json')))
  add(cat, 'model dir is /', MN, false, async (ctx) => ctx.loadAndProbe('/'))
  add(cat, 'model dir is /proc/self', MN, false, async (ctx) => ctx.loadAndProbe('/proc/self'))
  add(cat, 'model path /proc/self/mem', MN, false, async (ctx) => ctx.loadAndProbe('/proc/self/mem'))
  add(cat, 'adapter dir is a model dir', ['INVALID_ADAPTER', 'EXPERT_NOT_FOUND'], false, async (ctx) => ctx.loadExpertAndProbe(fx('qwen3-tiny')))
  add(cat, 'adapter given as its adapter_config.json', ['INVALID_ADAPTER', 'EXPERT_NOT_FOUND'], false, async (ctx) => ctx.loadExpertAndProbe(fx('adapters', 'lora', 'adapter_config.json')))
}
