// Qwen3-MoE (qwen3_moe: Qwen3's attention with routed FFN blocks of MoE experts) through the
// public API on __test__/fixtures/qwen3moe-tiny (every layer routed, GGUF `qwen3moe`) and
// qwen3moe-mixed-tiny (a dense layer among routed ones, safetensors only), both from
// scripts/gen_qwen3moe_fixtures.py: the family suite (family-suite.mjs). Its batching test runs 8
// sessions whose rows pick different MoE experts in one pass, grouped per MoE expert.
import { describeFamily } from './family-suite.mjs'

describeFamily('qwen3moe-tiny', 'qwen3', 'qwen3_moe', { ggufFamily: 'qwen3moe', q8Reference: 'q8_0' })
describeFamily('qwen3moe-mixed-tiny', 'qwen3', 'qwen3_moe', { gguf: false, q8Reference: 'q8_0' })
