// `npm test`: Rust unit and parity tests, then the build, then the Node suites.
import { ensureSmolLM2 } from './assets.mjs'
import { ensureBuilt, ensureInstalled, run } from './setup.mjs'

ensureInstalled()
// Rust tests build the engine without the napi layer (its symbols exist only inside Node).
run('cargo', ['test', '--release', '--no-default-features'])
ensureBuilt()
process.env.EXPERT_RUNTIME_SMOLLM2 ||= ensureSmolLM2()
run(process.execPath, ['--test', '--test-concurrency=1', '__test__/'])
