// SmolLM3 (smollm3: Llama's network with every fourth layer without RoPE) through the public API
// on __test__/fixtures/smollm3-tiny (scripts/gen_smollm3_fixtures.py, experts from
// scripts/gen_family_experts.py): the family suite (family-suite.mjs).
import { describeFamily } from './family-suite.mjs'

describeFamily('smollm3-tiny', 'llama', 'smollm3')
