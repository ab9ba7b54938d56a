// Chooses the native addon. There are two builds of the same engine:
//   cpu   `native.js` (napi's generated loader): `expert-runtime.<platform>.node` beside this
//         package, else the optional dependency `expert-runtime-<platform>`;
//   cuda  `expert-runtime.linux-x64-gnu-cuda.node` beside this package, else the optional
//         dependency `expert-runtime-linux-x64-gnu-cuda`. It links the CUDA driver and
//         libraries, so it loads only where they are installed; it runs on CPU as well.
// A binary that fails to load is an exception from `require`, never a crash: `auto` then
// falls back to the CPU build, and `cuda` reports NO_CUDA_DEVICE with the reason.
import { existsSync } from 'node:fs'
import { join } from 'node:path'
import { ExpertRuntimeError } from './errors'

export type Binding = typeof import('../native')
export type Variant = 'cpu' | 'cuda'

const CUDA_PACKAGE = 'expert-runtime-linux-x64-gnu-cuda'
const CUDA_FILE = 'expert-runtime.linux-x64-gnu-cuda.node'

/** The npm package holding the CPU build for this platform (napi's naming). */
export function platformPackage(platform: string = process.platform, arch: string = process.arch): string {
  const abi = platform === 'linux' ? '-gnu' : platform === 'win32' ? '-msvc' : ''
  return `expert-runtime-${platform}-${arch}${abi}`
}

const loaded = new Map<Variant, Binding>()
const failures = new Map<Variant, Error>()

function requireCuda(): Binding {
  if (process.platform !== 'linux' || process.arch !== 'x64') {
    throw new Error(`no CUDA build for ${process.platform}-${process.arch}`)
  }
  const override = process.env.EXPERT_RUNTIME_CUDA_BINARY
  if (override) return require(override) as Binding
  const local = join(__dirname, '..', CUDA_FILE)
  if (existsSync(local)) return require(local) as Binding
  return require(CUDA_PACKAGE) as Binding
}

/** Loads one variant once; a failure is remembered (dlopen would fail the same way again). */
function load(variant: Variant): Binding | Error {
  const hit = loaded.get(variant) ?? failures.get(variant)
  if (hit) return hit
  try {
    if (process.env.EXPERT_RUNTIME_DISABLE_CUDA && variant === 'cuda') throw new Error('EXPERT_RUNTIME_DISABLE_CUDA is set')
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const b = variant === 'cuda' ? requireCuda() : (require('../native.js') as Binding)
    loaded.set(variant, b)
    return b
  } catch (e) {
    const err = e instanceof Error ? e : new Error(String(e))
    failures.set(variant, err)
    return err
  }
}

/**
 * The addon for a requested device:
 * - `cpu`: whichever build is loaded already (both run on CPU), else the CPU build;
 * - `auto`: the CUDA build when it loads, else the CPU build (the engine then picks the GPU
 *   if there is one);
 * - `cuda` / `cuda:N`: the CUDA build, or NO_CUDA_DEVICE saying why it did not load.
 */
export function bindingFor(device: string): { binding: Binding; variant: Variant } {
  const order: Variant[] = device === 'cpu'
    ? [...loaded.keys(), 'cpu', 'cuda']
    : device === 'auto' ? ['cuda', 'cpu'] : ['cuda']
  const errors: string[] = []
  for (const v of order) {
    const b = load(v)
    if (!(b instanceof Error)) return { binding: b, variant: v }
    errors.push(`${v} build: ${b.message.split('\n')[0]}`)
  }
  if (order.length === 1) {
    throw new ExpertRuntimeError('NO_CUDA_DEVICE', `${device}: the CUDA build of expert-runtime could not be loaded `
      + `(${errors[0]}). It needs ${CUDA_PACKAGE}, an NVIDIA driver and the CUDA 13 libraries (cudart, cuBLAS, cuRAND).`,
    { cause: failures.get('cuda') })
  }
  const pkg = platformPackage()
  throw new ExpertRuntimeError('NO_NATIVE_BINARY', `no expert-runtime binary could be loaded for ${process.platform}-${process.arch}. `
    + `Install ${pkg} (npm installs it with expert-runtime unless optional dependencies are omitted, e.g. --omit=optional; `
    + `it may also not exist for this platform). Details: ${errors.join('; ')}`,
  { cause: failures.get('cpu') })
}
