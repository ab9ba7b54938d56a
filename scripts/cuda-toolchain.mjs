// A CUDA 13.0 build toolchain from PyPI, for machines with no CUDA install and no GPU.
//
// `ensureCudaToolchain()` installs NVIDIA's wheels (nvcc, headers, cudart, nvrtc, cuBLAS,
// cuRAND) into a cache folder, adds the unversioned `lib*.so` names the linker looks for, and
// generates a `libcuda.so` stub: the driver is not packaged anywhere, and the binary only needs
// its symbol names at link time (the real `libcuda.so.1` is loaded where the binary runs). It
// returns the environment for `cargo` / `napi build --features cuda`.
//
// Versions are pinned to 13.0: the GPU machines run driver 580 (CUDA 13.0), which cannot load
// PTX written by a newer nvcc. `node scripts/cuda-toolchain.mjs` prints the environment as
// shell `export` lines.
import { execFileSync } from 'node:child_process'
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { homedir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

export const CUDA_VERSION = '13.0'
// Compute capability 9.0 (H100/H200); override with CUDA_COMPUTE_CAP.
export const DEFAULT_COMPUTE_CAP = '90'

const COMPILE_WHEELS = [
  'nvidia-cuda-nvcc==13.0.88',
  'nvidia-cuda-crt==13.0.88',
  'nvidia-nvvm==13.0.88',
  'nvidia-cuda-runtime==13.0.96',
  'nvidia-cuda-cccl==13.0.85',
]
const LINK_WHEELS = ['nvidia-cuda-nvrtc==13.0.88', 'nvidia-cublas==13.0.2.14', 'nvidia-curand==10.4.0.35']

function cacheRoot() {
  return process.env.EXPERT_RUNTIME_CACHE || join(homedir(), '.cache', 'expert-runtime')
}

function pipInstall(target, wheels) {
  const python = process.env.PYTHON || 'python3'
  console.error(`installing ${wheels.length} CUDA ${CUDA_VERSION} wheels into ${target} ...`)
  execFileSync(python, ['-m', 'pip', 'install', '--quiet', '--disable-pip-version-check', '--no-deps', '--upgrade',
    '--target', target, ...wheels], { stdio: 'inherit' })
}

// Every driver API function cudarc declares, read from its generated bindings in the cargo
// registry, so that the stub never lacks a symbol the binary references.
function driverSymbols() {
  const cargoHome = process.env.CARGO_HOME || join(homedir(), '.cargo')
  const src = join(cargoHome, 'registry', 'src')
  const files = existsSync(src)
    ? readdirSync(src).flatMap((reg) => readdirSync(join(src, reg))
      .filter((d) => d.startsWith('cudarc-'))
      .map((d) => join(src, reg, d, 'src', 'driver', 'sys', 'mod.rs')))
      .filter(existsSync)
    : []
  if (files.length === 0) throw new Error('cudarc sources not found: run `cargo fetch` first')
  const names = new Set()
  for (const f of files) {
    for (const m of readFileSync(f, 'utf8').matchAll(/^\s+(?:pub )?fn (cu[A-Za-z0-9_]+)\(/gm)) names.add(m[1])
  }
  return [...names].sort()
}

function writeDriverStub(dir) {
  const names = driverSymbols()
  mkdirSync(dir, { recursive: true })
  const c = join(dir, 'libcuda-stub.c')
  writeFileSync(c, '/* Link-time stand-in for the CUDA driver; never loaded at run time. */\n'
    + names.map((n) => `int ${n}(void) { return 999; }\n`).join(''))
  execFileSync('cc', ['-shared', '-fPIC', '-Wl,-soname,libcuda.so.1', '-o', join(dir, 'libcuda.so'), c], { stdio: 'inherit' })
  return names.length
}

function linkUnversioned(lib) {
  for (const f of readdirSync(lib)) {
    const m = /^(lib[A-Za-z]+)\.so\.\d+$/.exec(f)
    if (m && !existsSync(join(lib, `${m[1]}.so`))) symlinkSync(f, join(lib, `${m[1]}.so`))
  }
}

/** Installs (once) and returns `{ root, env }`. */
export function ensureCudaToolchain() {
  const target = join(cacheRoot(), `cuda-${CUDA_VERSION}`)
  const root = join(target, 'nvidia', 'cu13')
  const stamp = join(target, '.ready')
  if (!existsSync(stamp)) {
    rmSync(target, { recursive: true, force: true })
    pipInstall(target, [...COMPILE_WHEELS, ...LINK_WHEELS])
    linkUnversioned(join(root, 'lib'))
    const n = writeDriverStub(join(root, 'lib', 'stubs'))
    console.error(`generated a libcuda.so stub with ${n} driver symbols`)
    writeFileSync(stamp, [...COMPILE_WHEELS, ...LINK_WHEELS].join('\n'))
  }
  const lib = join(root, 'lib')
  const env = {
    CUDA_ROOT: root,
    CUDA_PATH: root,
    CUDA_HOME: root,
    CUDA_COMPUTE_CAP: process.env.CUDA_COMPUTE_CAP || DEFAULT_COMPUTE_CAP,
    // cudarc reads the toolkit version from `nvcc --version`; pin it so a stray nvcc cannot win.
    CUDARC_CUDA_VERSION: '13000',
    PATH: `${join(root, 'bin')}:${process.env.PATH}`,
    LIBRARY_PATH: [lib, join(lib, 'stubs'), process.env.LIBRARY_PATH].filter(Boolean).join(':'),
  }
  return { root, env }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { env } = ensureCudaToolchain()
  for (const [k, v] of Object.entries(env)) console.log(`export ${k}=${JSON.stringify(v)}`)
}
