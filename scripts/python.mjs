// The Python package for tests, benchmarks and the Python demo: a virtual environment under
// target/ with maturin and pytest from PyPI, and the wheel built from this checkout (the same
// `--target` as the other builds, so the compiled dependencies are shared). Each step is a
// no-op when done. `node scripts/python.mjs test` runs the pytest suite, `… demo` the demo,
// `… wheel` prints the wheel's path.
//
// The wheel is the one a release publishes for this platform: abi3 (one wheel for CPython
// ≥ 3.9) and, on Linux, tagged manylinux_2_34 (maturin checks that it needs nothing newer than
// glibc 2.34 and nothing but glibc and libgcc_s, the Node addon's requirement), so pip installs
// it without compiling anything: no Rust toolchain on the user's machine.
import { existsSync, mkdirSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
import { ensureSmolLM2 } from './assets.mjs'
import { newest, root, run, rustHost } from './setup.mjs'

const venv = join(root, 'target', 'python-venv')
export const venvPython = join(venv, process.platform === 'win32' ? 'Scripts/python.exe' : 'bin/python')
const wheels = join(root, 'target', 'wheels')
const stamp = join(venv, '.expert-runtime-built')
// kubernetes-validate: the deployment manifests' schema check (python/tests/test_deploy.py).
const TOOLS = ['maturin==1.16.0', 'pytest==9.2.0', 'kubernetes-validate==1.37.0']

/** The venv with the package built from the current sources installed; returns its python. */
/** The wheel the last build left in target/wheels. */
export function builtWheel() {
  const wheel = existsSync(wheels) && readdirSync(wheels).find((f) => f.endsWith('.whl'))
  if (!wheel) throw new Error('no wheel in target/wheels: run `node scripts/python.mjs` first')
  return join(wheels, wheel)
}

export function ensurePython() {
  if (!existsSync(venvPython)) {
    console.error(`creating a Python virtual environment in ${venv} ...`)
    run(process.env.PYTHON || 'python3', ['-m', 'venv', venv])
    run(venvPython, ['-m', 'pip', 'install', '--quiet', '--disable-pip-version-check', ...TOOLS])
  }
  const built = existsSync(stamp) ? statSync(stamp).mtimeMs : 0
  if (built < newest(['src', 'python/expert_runtime', 'Cargo.toml', 'Cargo.lock', 'pyproject.toml'])) {
    console.error('building the Python package ...')
    const host = rustHost()
    rmSync(wheels, { recursive: true, force: true })
    mkdirSync(wheels, { recursive: true })
    const compat = process.platform === 'linux' ? ['--compatibility', 'manylinux_2_34'] : []
    run(venvPython, ['-m', 'maturin', 'build', '--release', '--quiet', '--strip', '--target', host, ...compat, '--out', wheels])
    const wheel = readdirSync(wheels).find((f) => f.endsWith('.whl'))
    run(venvPython, ['-m', 'pip', 'install', '--quiet', '--disable-pip-version-check', '--force-reinstall', '--no-deps', join(wheels, wheel)])
    writeFileSync(stamp, new Date().toISOString())
  }
  return venvPython
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const python = ensurePython()
  if (process.argv[2] === 'test') {
    process.env.EXPERT_RUNTIME_SMOLLM2 ||= ensureSmolLM2()
    run(python, ['-m', 'pytest', '-q', '-p', 'no:cacheprovider', 'python/tests', ...process.argv.slice(3)])
  } else if (process.argv[2] === 'demo') {
    run(python, ['python/examples/demo.py', ensureSmolLM2(), ...process.argv.slice(3)])
  } else if (process.argv[2] === 'wheel') {
    console.log(builtWheel())
  }
}
