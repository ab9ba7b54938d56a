// Gemma 4 text (gemma4_text: per-layer heads, proportional RoPE, per-layer input embeddings,
// layer scalars, KV sharing) through the public API on __test__/fixtures/gemma4-tiny
// (scripts/gen_gemma4_fixtures.py) and its GGUF: the family suite (family-suite.mjs) through the paged
// pool, whose window and global layers keep blocks of their own head shapes and whose
// KV-sharing layers keep none. Prompt tuning is refused on it (tests/gemma4.rs).
import { describeFamily } from './family-suite.mjs'

// (Its per-layer projections take 8 inputs, fewer than a Q8_0 block: they stay dense.)
describeFamily('gemma4-tiny', 'gemma4', 'gemma4_text', { ggufFamily: 'gemma4', experts: ['lora', 'dora', 'ia3'], quantized: 'q8_0+dense' })

// Shaped like the 26B-A4B (scripts/gen_gemma4_moe_fixture.py): values from keys on the full
// layer, and a routed FFN of MoE experts beside every MLP. (Its MoE experts' down projections
// take 16 inputs, fewer than a Q8_0 block: they stay dense.)
describeFamily('gemma4-moe-tiny', 'gemma4', 'gemma4_text', { ggufFamily: 'gemma4', experts: ['lora', 'dora', 'ia3'], quantized: 'q8_0+dense', q8Reference: 'q8_0' })
