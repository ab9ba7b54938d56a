// Granite 3 (granite: Llama's network with embedding, residual and attention multipliers and a
// logit divisor) through the public API on __test__/fixtures/granite-tiny
// (scripts/gen_granite_fixtures.py): the family suite (family-suite.mjs).
import { describeFamily } from './family-suite.mjs'

describeFamily('granite-tiny', 'llama', 'granite')
