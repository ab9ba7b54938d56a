// The `expert-runtime inspect` and `chat` commands (lib/cli/), run as a user runs them: the
// built dist/cli.js in a child process. `inspect` is checked against what the fixture files
// say (config.json, adapter_config.json, the safetensors headers read here) and against a
// loaded Runtime; `chat` against the same questions asked through the API, piped and in a
// pseudo-terminal (python3's pty module) for Ctrl-C, /reset and Ctrl-D.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, spawnSync } from 'node:child_process'
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync, mkdirSync, cpSync } from 'node:fs'
import { createRequire } from 'node:module'
import os from 'node:os'
import path from 'node:path'
import { CLI, fixture, fixtureJson, runCli as cli } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { Runtime } = require('../dist/index.js')
const { loadProgressView } = require('../dist/cli/progress.js')
const THREADS = '2'
const SMOLLM2 = process.env.EXPERT_RUNTIME_SMOLLM2

/** The tensors of a safetensors file, from its header: `{ name: { dtype, shape, data_offsets } }`. */
function safetensorsHeader(file) {
  const bytes = readFileSync(file)
  const n = Number(bytes.readBigUInt64LE(0))
  const header = JSON.parse(bytes.subarray(8, 8 + n).toString('utf8'))
  delete header.__metadata__
  return header
}

function tensorTotals(files) {
  let tensors = 0
  let parameters = 0
  let bytes = 0
  for (const f of files) {
    for (const t of Object.values(safetensorsHeader(f))) {
      tensors++
      parameters += t.shape.reduce((a, b) => a * b, 1)
      bytes += t.data_offsets[1] - t.data_offsets[0]
    }
  }
  return { tensors, parameters, bytes }
}

async function inspectJson(...args) {
  const r = await cli(['inspect', ...args, '--json'])
  assert.equal(r.code, 0, r.stderr)
  return JSON.parse(r.stdout)
}


/** What `inspect` said of `path` (`m`) agrees with what loading it reports; `tokens` spell as said. */
async function agreesWithLoad(m, path, tokens) {
  const rt = await Runtime.load(path, { threads: 2 })
  try {
    const i = rt.info
    assert.deepEqual(
      [m.architecture, m.family, m.numLayers, m.hiddenSize, m.vocabSize, m.contextLength],
      [i.architecture, i.family, i.numLayers, i.hiddenSize, i.vocabSize, i.contextLength],
    )
    assert.deepEqual(m.eosTokens.map((e) => e.id), i.eosTokenIds)
    for (const e of tokens) assert.equal(rt.detokenize([e.id]), e.text)
  } finally {
    await rt.dispose()
  }
}

describe('expert-runtime inspect', () => {
  let tmp
  before(() => {
    tmp = mkdtempSync(path.join(os.tmpdir(), 'er-cli-inspect-'))
  })
  after(() => rmSync(tmp, { recursive: true, force: true }))

  it('an HF directory: every field as config.json, the tokenizer files and the safetensors header say', async () => {
    const dir = fixture('qwen3-tiny')
    const cfg = fixtureJson('qwen3-tiny', 'config.json')
    const tcfg = fixtureJson('qwen3-tiny', 'tokenizer_config.json')
    const gen = fixtureJson('qwen3-tiny', 'generation_config.json')
    const m = await inspectJson(dir)
    assert.equal(m.type, 'model')
    assert.equal(m.architecture, cfg.model_type)
    assert.equal(m.numLayers, cfg.num_hidden_layers)
    assert.equal(m.hiddenSize, cfg.hidden_size)
    assert.equal(m.intermediateSize, cfg.intermediate_size)
    assert.equal(m.numHeads, cfg.num_attention_heads)
    assert.equal(m.numKvHeads, cfg.num_key_value_heads)
    assert.equal(m.headDim, cfg.head_dim)
    assert.equal(m.vocabSize, cfg.vocab_size)
    assert.equal(m.contextLength, cfg.max_position_embeddings)
    assert.equal(m.ropeTheta, cfg.rope_theta)
    assert.equal(m.rmsNormEps, cfg.rms_norm_eps)
    assert.equal(m.tieWordEmbeddings, cfg.tie_word_embeddings)
    assert.equal(m.declaredDtype, cfg.torch_dtype)
    assert.equal(m.bosTokenId, cfg.bos_token_id)
    assert.equal(m.ropeScaling, null)
    const eosIds = [...new Set([cfg.eos_token_id, ...gen.eos_token_id])].sort((a, b) => a - b)
    assert.deepEqual(m.eosTokens.map((t) => t.id), eosIds)

    const files = [path.join(dir, 'model.safetensors')]
    const totals = tensorTotals(files)
    assert.equal(m.weights.container, 'safetensors')
    assert.equal(m.weights.files, 1)
    assert.equal(m.weights.fileBytes, statSync(files[0]).size)
    assert.equal(m.weights.tensors, totals.tensors)
    assert.equal(m.weights.parameters, totals.parameters)
    assert.deepEqual(m.weights.formats, [{ format: 'f32', tensors: totals.tensors, parameters: totals.parameters, bytes: totals.bytes }])

    const t = m.tokenizer
    assert.equal(t.source, 'tokenizer.json')
    assert.equal(t.model, fixtureJson('qwen3-tiny', 'tokenizer.json').model.type)
    assert.equal(t.chatTemplate, tcfg.chat_template)
    assert.equal(t.bos, null) // bos_token: null
    assert.deepEqual(t.eos.map((e) => e.text), [tcfg.eos_token])
    assert.deepEqual(m.warnings, [])
    // The layer plan: every layer the same, as the config describes them.
    const shape = `${cfg.num_attention_heads} heads, ${cfg.num_key_value_heads} kv, head dim ${cfg.head_dim}`
    assert.deepEqual(m.plan, [
      `layers 0–${cfg.num_hidden_layers - 1}: full attention (${shape}, rope 0, q/k norm) · gated MLP (SiLU, ${cfg.intermediate_size}) · pre-norm (w)`,
      `rope 0: theta ${cfg.rope_theta}, rotary dim ${cfg.head_dim} of ${cfg.head_dim}, half-split`,
    ])

    // What a load reports agrees.
    await agreesWithLoad(m, dir, m.eosTokens)

    // The text form: the same facts, the template's first lines.
    const text = await cli(['inspect', dir])
    assert.equal(text.code, 0, text.stderr)
    assert.match(text.stdout, new RegExp(`architecture\\s+${cfg.model_type}\\n`))
    assert.match(text.stdout, new RegExp(`layers\\s+${cfg.num_hidden_layers}\\n`))
    assert.match(text.stdout, new RegExp(`heads\\s+${cfg.num_attention_heads} \\(kv heads ${cfg.num_key_value_heads}, head dim ${cfg.head_dim}\\)`))
    assert.match(text.stdout, /\nlayer plan\s+layers 0–2: full attention .* · pre-norm \(w\)\n\s+rope 0: theta/)
    assert.match(text.stdout, /chat template\s+yes/)
    assert.ok(text.stdout.includes(`  | ${tcfg.chat_template.split('\n')[0]}\n`), text.stdout)
  })

  it('a GGUF: the same model as the HF directory, quantized (q8_0 and f32 tensors)', async () => {
    const gguf = fixture('llama-tiny', 'model-q8_0.gguf')
    const cfg = fixtureJson('llama-tiny', 'config.json')
    const m = await inspectJson(gguf)
    assert.equal(m.architecture, cfg.model_type)
    assert.deepEqual(
      [m.numLayers, m.hiddenSize, m.intermediateSize, m.numHeads, m.numKvHeads, m.vocabSize, m.tieWordEmbeddings],
      [cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size, cfg.tie_word_embeddings],
    )
    assert.equal(m.headDim, cfg.hidden_size / cfg.num_attention_heads)
    // llama.cpp's GGUF stores Q/K rows permuted: RoPE rotates adjacent pairs.
    assert.match(m.plan.at(-1), /^rope 0: theta \d+, rotary dim 16 of 16, interleaved pairs$/)
    assert.equal(m.weights.container, 'gguf')
    assert.equal(m.weights.fileBytes, statSync(gguf).size)
    // The same tensors as the safetensors file of the same model.
    const totals = tensorTotals([fixture('llama-tiny', 'model.safetensors')])
    assert.equal(m.weights.tensors, totals.tensors)
    assert.equal(m.weights.parameters, totals.parameters)
    assert.deepEqual(m.weights.formats.map((f) => f.format).sort(), ['f32', 'q8_0'])
    const q8 = m.weights.formats.find((f) => f.format === 'q8_0')
    assert.equal(q8.bytes, (q8.parameters / 32) * 34) // 34-byte blocks of 32
    assert.equal(m.tokenizer.source, 'gguf')
    assert.equal(m.tokenizer.model, 'gpt2')
    assert.equal(m.tokenizer.chatTemplate, fixtureJson('llama-tiny', 'tokenizer_config.json').chat_template)
  })

  it('the SmolLM2 GGUF: agrees with what a load of it reports', { skip: SMOLLM2 && existsSync(SMOLLM2) ? false : 'EXPERT_RUNTIME_SMOLLM2 is not set to a file' }, async () => {
    const m = await inspectJson(SMOLLM2)
    assert.equal(m.weights.fileBytes, statSync(SMOLLM2).size)
    assert.ok(m.weights.formats.some((f) => f.format === 'q4_1'), JSON.stringify(m.weights.formats))
    assert.ok(m.weights.parameters > 100e6 && m.weights.parameters < 200e6, String(m.weights.parameters))
    assert.equal(m.tokenizer.source, 'gguf')
    assert.match(m.tokenizer.chatTemplate, /<\|im_start\|>/)
    await agreesWithLoad(m, SMOLLM2, [...m.eosTokens, m.tokenizer.bos])
  })

  it('adapters: kind, rank, alpha, targets, base model and tensors as adapter_config.json and the file say', async () => {
    for (const name of ['lora', 'rslora', 'dora', 'ia3', 'lokr', 'prompt']) {
      const dir = fixture('adapters', name)
      const cfg = fixtureJson('adapters', name, 'adapter_config.json')
      const a = await inspectJson(dir)
      assert.equal(a.type, 'adapter', name)
      const kind = { LORA: cfg.use_dora ? 'dora' : cfg.use_rslora ? 'rslora' : 'lora', IA3: 'ia3', LOKR: 'lokr', PROMPT_TUNING: 'prompt' }[cfg.peft_type]
      assert.equal(a.kind, kind, name)
      const ranked = ['LORA', 'LOKR'].includes(cfg.peft_type)
      assert.equal(a.rank, ranked ? cfg.r : null, name)
      assert.equal(a.alpha, ranked ? (cfg.peft_type === 'LOKR' ? cfg.alpha : cfg.lora_alpha) : null, name)
      const targets = cfg.target_modules ?? []
      assert.deepEqual(a.targetModules, Array.isArray(targets) ? targets : [targets], name)
      assert.equal(a.targetModulesRegex, typeof cfg.target_modules === 'string', name)
      assert.equal(a.numVirtualTokens, cfg.peft_type === 'PROMPT_TUNING' ? cfg.num_virtual_tokens : null, name)
      assert.equal(a.baseModel, cfg.base_model_name_or_path, name)
      const file = path.join(dir, 'adapter_model.safetensors')
      const totals = tensorTotals([file])
      assert.equal(a.weights.tensors, totals.tensors, name)
      assert.equal(a.weights.parameters, totals.parameters, name)
      assert.equal(a.weights.fileBytes, statSync(file).size, name)
    }
    const lora = await inspectJson(fixture('adapters', 'lora'))
    assert.equal(lora.name, fixtureJson('adapters', 'lora', 'manifest.json').name)
    const text = await cli(['inspect', fixture('adapters', 'lora')])
    assert.equal(text.code, 0, text.stderr)
    assert.match(text.stdout, /kind\s+lora\n/)
    assert.match(text.stdout, /rank\s+4\n/)
  })

  it('--base: loads the base and says whether the adapter fits (exit code 1 and the error code when not)', async () => {
    const fits = await cli(['inspect', fixture('adapters', 'lora'), '--base', fixture('qwen3-tiny'), '--json', '--threads', THREADS])
    assert.equal(fits.code, 0, fits.stderr)
    assert.deepEqual(JSON.parse(fits.stdout).compatibility, { base: fixture('qwen3-tiny'), compatible: true })

    // A LoRA trained on llama-tiny (q_proj 64 rows) does not fit qwen3-tiny (128 rows).
    const misfit = await cli(['inspect', fixture('adapters', 'lora_llama'), '--base', fixture('qwen3-tiny'), '--json', '--threads', THREADS])
    assert.equal(misfit.code, 1, misfit.stderr)
    const c = JSON.parse(misfit.stdout).compatibility
    assert.equal(c.compatible, false)
    assert.equal(c.error.code, 'INVALID_ADAPTER')
    assert.match(c.error.message, /q_proj/)

    const text = await cli(['inspect', fixture('adapters', 'lora_llama'), '--base', fixture('qwen3-tiny'), '--threads', THREADS])
    assert.equal(text.code, 1)
    assert.match(text.stdout, /fits .*qwen3-tiny\s+no: INVALID_ADAPTER: /)

    // --base is for adapters; a base that does not load is an error, not an answer.
    const model = await cli(['inspect', fixture('qwen3-tiny'), '--base', fixture('qwen3-tiny')])
    assert.equal(model.code, 2)
    const missing = await cli(['inspect', fixture('adapters', 'lora'), '--base', path.join(tmp, 'nothing-here')])
    assert.equal(missing.code, 1)
    assert.match(missing.stderr, /MODEL_NOT_FOUND/)
  })

  it('hostile files: exit code 1 with the error code, never a crash', async () => {
    const good = readFileSync(fixture('qwen3-tiny', 'model-f32.gguf'))
    const write = (name, bytes) => {
      const p = path.join(tmp, name)
      writeFileSync(p, bytes)
      return p
    }
    const hugeTensors = Buffer.from(good)
    hugeTensors.writeBigUInt64LE(1n << 40n, 8) // tensor_count
    const longString = Buffer.from(good.subarray(0, 4096))
    longString.writeBigUInt64LE(2n << 30n, 24) // the first metadata key's length: 2 GB
    const hugeConfig = path.join(tmp, 'huge-config')
    mkdirSync(hugeConfig)
    cpSync(fixture('qwen3-tiny'), hugeConfig, { recursive: true })
    writeFileSync(path.join(hugeConfig, 'config.json'), JSON.stringify({ ...fixtureJson('qwen3-tiny', 'config.json'), hidden_size: 2 ** 40, vocab_size: 1e300 }))
    const badAdapter = path.join(tmp, 'bad-adapter')
    mkdirSync(badAdapter)
    writeFileSync(path.join(badAdapter, 'adapter_config.json'), JSON.stringify({ ...fixtureJson('adapters', 'lora', 'adapter_config.json'), r: 0 }))
    const cases = [
      [write('truncated.gguf', good.subarray(0, Math.floor(good.length * 0.6))), 'INVALID_MODEL'],
      [write('huge-tensors.gguf', hugeTensors), 'INVALID_MODEL'],
      [write('long-string.gguf', longString), 'INVALID_MODEL'],
      [write('empty.gguf', Buffer.alloc(0)), 'INVALID_MODEL'],
      [hugeConfig, 'INVALID_MODEL'],
      [badAdapter, 'INVALID_ADAPTER'],
      [path.join(tmp, 'nothing-here'), 'MODEL_NOT_FOUND'],
    ]
    for (const [p, code] of cases) {
      const r = await cli(['inspect', p])
      assert.equal(r.code, 1, `${p}: ${r.stderr}`)
      assert.match(r.stderr, new RegExp(`^expert-runtime inspect: ${code}: `), p)
      assert.equal(r.stdout, '')
    }
  })
})

// ---------------------------------------------------------------- chat

const MODEL = fixture('qwen3-tiny')

/** The answers the API gives to `questions` asked in turn in one session. */
async function apiAnswers(questions, { experts = [], maxTokens, reset = [], contextLength } = {}) {
  const rt = await Runtime.load(MODEL, { threads: 2, contextLength })
  try {
    for (const e of experts) await rt.loadExpert(e)
    const s = rt.createSession({ experts: experts.map((e) => path.basename(e)), contextShift: 'drop-oldest' })
    const out = []
    for (const [i, q] of questions.entries()) {
      if (reset.includes(i)) s.reset()
      out.push((await s.complete(q, { temperature: 0, maxTokens })).text)
    }
    return out
  } finally {
    await rt.dispose()
  }
}

describe('expert-runtime chat, piped', () => {
  it('answers each line in turn, as the API does in one session; only answers go to stdout', async () => {
    const questions = ['hello', 'what is sql?']
    const expected = await apiAnswers(questions, { maxTokens: 12 })
    const r = await cli(['chat', MODEL, '--max-tokens', '12', '--temperature', '0', '--threads', THREADS, '--verbose'], { input: questions.join('\n') + '\n' })
    assert.equal(r.code, 0, r.stderr)
    assert.equal(r.stdout, expected.map((a) => a + '\n').join(''))
    assert.match(r.stderr, /loading .*: 100%/)
    // 12 tokens is the limit: finish reason and stats on stderr.
    assert.equal(r.stderr.match(/^\[length\]$/gm)?.length, 2, r.stderr)
    assert.equal(r.stderr.match(/^\[12 tokens, [\d.]+ tok\/s/gm)?.length, 2, r.stderr)
  })

  it('--expert applies the adapter to every answer; /reset forgets the conversation; /help and blank lines print no answer', async () => {
    const lora = fixture('adapters', 'lora')
    const expected = await apiAnswers(['hello', 'hello'], { experts: [lora], maxTokens: 10, reset: [1] })
    assert.equal(expected[0], expected[1])
    const [base] = await apiAnswers(['hello'], { maxTokens: 10 })
    assert.notEqual(base, expected[0], 'the adapter changes the answer')
    const r = await cli(['chat', MODEL, '--expert', lora, '--max-tokens', '10', '--temperature', '0', '--threads', THREADS], { input: 'hello\n\n/help\n/reset\nhello\n' })
    assert.equal(r.code, 0, r.stderr)
    assert.equal(r.stdout, expected.map((a) => a + '\n').join(''))
    assert.match(r.stderr, /loaded expert lora \(lora\)/)
    assert.match(r.stderr, /\(conversation reset\)/)
    assert.match(r.stderr, /\/reset +forget the conversation/)
  })

  it('goes on past the context length: the oldest turns make room, answers equal the API’s', async () => {
    const questions = Array.from({ length: 15 }, (_, i) => `question ${i}: what is the weather like?`)
    const expected = await apiAnswers(questions, { maxTokens: 16, contextLength: 256 })
    const r = await cli(['chat', MODEL, '--max-tokens', '16', '--temperature', '0', '--context-length', '256', '--threads', THREADS], { input: questions.join('\n') + '\n' })
    assert.equal(r.code, 0, r.stderr)
    assert.doesNotMatch(r.stderr, /CONTEXT_OVERFLOW/)
    assert.equal(r.stdout, expected.map((a) => a + '\n').join(''))
  })

  it('without --max-tokens an answer stops at 1024 tokens, not at the end of the context', async () => {
    // Greedy, qwen3-tiny writes this story for thousands of tokens without an end-of-sequence token.
    const question = 'Tell me a long story.'
    const [expected] = await apiAnswers([question], { maxTokens: 1024, contextLength: 4096 })
    const r = await cli(['chat', MODEL, '--temperature', '0', '--context-length', '4096', '--threads', THREADS, '--verbose'], { input: question + '\n' })
    assert.equal(r.code, 0, r.stderr)
    assert.match(r.stderr, /^\[length\]$/m)
    assert.match(r.stderr, /^\[1024 tokens, /m)
    assert.equal(r.stdout, expected + '\n')
    // Not a terminal: the load's progress is a line per step, never redrawn in place.
    assert.doesNotMatch(r.stderr, /\r/)
    assert.match(r.stderr, /^loading .*: 100%$/m)
  })

  it('/exit leaves before the remaining lines', async () => {
    const r = await cli(['chat', MODEL, '--max-tokens', '4', '--threads', THREADS], { input: '/exit\nhello\n' })
    assert.equal(r.code, 0, r.stderr)
    assert.equal(r.stdout, '')
  })

  it('bad arguments are usage errors (exit 2); a model that does not load exits 1 with its code', async () => {
    for (const args of [['chat'], ['chat', MODEL, '--temperature', 'hot'], ['chat', MODEL, '--expert'], ['chat', MODEL, '--max-tokens', '0'], ['chat', MODEL, 'extra']]) {
      const r = await cli(args)
      assert.equal(r.code, 2, args.join(' '))
      assert.match(r.stderr, /usage: expert-runtime chat/)
    }
    const r = await cli(['chat', path.join(os.tmpdir(), 'er-no-such-model')])
    assert.equal(r.code, 1)
    assert.match(r.stderr, /MODEL_NOT_FOUND/)
    const e = await cli(['chat', MODEL, '--expert', fixture('adapters', 'lora_llama'), '--threads', THREADS])
    assert.equal(e.code, 1)
    assert.match(e.stderr, /INVALID_ADAPTER/)
  })
})

describe('expert-runtime chat: load progress', () => {
  /** What the view writes for `percents` (of 1000 bytes), then `end`. */
  const render = (tty, percents) => {
    let out = ''
    const view = loadProgressView('m.gguf', tty, (s) => (out += s))
    for (const p of percents) view.update({ loadedBytes: p * 10, totalBytes: 1000 })
    view.end()
    return out
  }

  it('on a terminal: one line, redrawn in place when the percentage changes, ended once', () => {
    const line = (pct) => `\rloading m.gguf: ${pct}%\x1b[K`
    assert.equal(render(true, [0, 0, 3, 3, 37, 100]), line(0) + line(3) + line(37) + line(100) + '\n')
    assert.equal(render(true, []), '', 'nothing drawn, nothing ended')
  })

  it('elsewhere (a log, a pipe): a line each time it has grown by 10 points, and one at 100%', () => {
    const out = render(false, [0, 5, 12, 25, 31, 60, 99, 100, 100])
    assert.equal(out, [12, 25, 60, 99, 100].map((p) => `loading m.gguf: ${p}%\n`).join(''))
  })
})

const PTY_SKIP = spawnSync('python3', ['-c', 'import pty, os; os.waitstatus_to_exitcode'], { stdio: 'ignore' }).status === 0 ? false : 'python3 with the pty module is needed to run the chat in a pseudo-terminal'

/** The CLI in a pseudo-terminal (python3's pty.spawn relays our pipes to the pty's master). */
class Terminal {
  output = ''
  #exited
  constructor(args) {
    const relay = 'import os, pty, sys; sys.exit(os.waitstatus_to_exitcode(pty.spawn(sys.argv[1:])))'
    this.child = spawn('python3', ['-c', relay, process.execPath, CLI, ...args], { stdio: ['pipe', 'pipe', 'inherit'] })
    this.child.stdout.setEncoding('utf8').on('data', (d) => (this.output += d))
    this.#exited = new Promise((resolve) => this.child.on('exit', (code) => resolve(code)))
  }

  /** Types `keys`. */
  send(keys) {
    this.child.stdin.write(keys)
  }

  /**
   * Waits until the output after offset `from` matches `pattern`; returns where the match
   * starts and ends. Fails when the program exits first or after `timeoutMs`, with the output.
   */
  async waitFor(pattern, from, timeoutMs = 90_000) {
    const deadline = Date.now() + timeoutMs
    for (;;) {
      const m = pattern.exec(this.output.slice(from))
      if (m) return { start: from + m.index, end: from + m.index + m[0].length, match: m }
      if (this.child.exitCode !== null || Date.now() > deadline) {
        const why = this.child.exitCode === null ? 'timed out' : `exited ${this.child.exitCode}`
        assert.fail(`no ${pattern} after offset ${from} (${why}); output there:\n${JSON.stringify(this.output.slice(from))}`)
      }
      await new Promise((r) => setTimeout(r, 20))
    }
  }

  exited() {
    return this.#exited
  }

  kill() {
    if (this.child.exitCode === null) this.child.kill('SIGKILL')
  }
}

/** What a terminal shows of `text` written by the program (the tty turns "\n" into "\r\n"). */
const onTerminal = (text) => text.replace(/\n/g, '\r\n')

/** readline's prompt in a terminal: cursor moves and a line clear, then "> ". */
const PROMPT = String.raw`(?:\x1b\[\d*[A-Z])*> `

const STATS = /\[(\d+) tokens, [\d.]+ tok\/s[^\]\n]*\]\r*\n/

describe('expert-runtime chat in a terminal', { skip: PTY_SKIP }, () => {
  it('streams answers; Ctrl-C cancels the answer being written; /reset; Ctrl-C at the prompt hints; Ctrl-D exits 0', { timeout: 300_000 }, async () => {
    // On qwen3-tiny, greedy, this question runs to 20,000 tokens without an end-of-sequence
    // token (~30 s on 2 cores), so the Ctrl-C sent once the answer has started always lands
    // mid-answer; "bye" (in a fresh conversation) ends by itself after a few hundred tokens.
    const long = 'Tell me a long story.'
    const [bye] = await apiAnswers(['bye'], { maxTokens: 20_000, contextLength: 100_000 })
    const t = new Terminal(['chat', MODEL, '--context-length', '100000', '--max-tokens', '20000', '--temperature', '0', '--threads', THREADS, '--verbose'])
    try {
      let at = (await t.waitFor(new RegExp(String.raw`Type /help for commands.*\r*\n` + PROMPT), 0)).end
      t.send(`${long}\r`)
      at = (await t.waitFor(/Tell me a long story\.\r*\n/, at)).end
      // Streamed: the answer shows while it is being written.
      await t.waitFor(/[^]{40}/, at)
      t.send('\x03')
      at = (await t.waitFor(/\[cancelled\]\r*\n/, at)).end
      const cancelled = await t.waitFor(STATS, at)
      assert.ok(Number(cancelled.match[1]) < 20_000, cancelled.match[0])
      at = (await t.waitFor(new RegExp('^' + PROMPT), cancelled.end)).end

      t.send('/reset\r')
      at = (await t.waitFor(new RegExp(String.raw`\(conversation reset\)\r*\n` + PROMPT), at)).end

      // Still alive: the next question is answered in full, exactly as the API answers it.
      t.send('bye\r')
      at = (await t.waitFor(/bye\r*\n/, at)).end
      const stats = await t.waitFor(STATS, at)
      const shown = t.output.slice(at, stats.start)
      assert.equal(shown, onTerminal(bye.endsWith('\n') ? bye : bye + '\n'))
      at = (await t.waitFor(new RegExp('^' + PROMPT), stats.end)).end

      // Ctrl-C at an empty prompt: a hint, not an exit; Ctrl-D then leaves.
      t.send('\x03')
      at = (await t.waitFor(/To exit, press Ctrl\+C again or Ctrl\+D or type \/exit/, at)).end
      t.send('\x04')
      assert.equal(await t.exited(), 0, JSON.stringify(t.output.slice(at)))
    } finally {
      t.kill()
    }
  })

  it('keys typed while an answer is written are not echoed into it: they wait at the next prompt', { timeout: 300_000 }, async () => {
    const t = new Terminal(['chat', MODEL, '--context-length', '100000', '--max-tokens', '20000', '--temperature', '0', '--threads', THREADS])
    try {
      const ready = await t.waitFor(new RegExp(String.raw`Type /help for commands.*\r*\n` + PROMPT), 0)
      t.send('Tell me a long story.\r')
      let at = (await t.waitFor(/Tell me a long story\.\r*\n/, ready.end)).end
      await t.waitFor(/[^]{40}/, at)
      // Typed mid-answer, Enter included: nothing shows, nothing is sent, the answer streams on.
      t.send('what next?\r')
      await t.waitFor(/[^]{40}/, t.output.length)
      t.send('\x03')
      const cancelled = await t.waitFor(/\[cancelled\]\r*\n/, at)
      const answer = t.output.slice(at, cancelled.start)
      assert.ok(!answer.includes('what next?'), `the typed keys were echoed into the answer: ${JSON.stringify(answer)}`)
      // The next prompt holds the text, as typed there: Ctrl-C drops it like any line.
      at = (await t.waitFor(new RegExp(PROMPT + String.raw`(?:\x1b\[\d*[A-Z])*what next\?`), cancelled.end)).end
      t.send('\x03')
      at = (await t.waitFor(new RegExp(String.raw`\r*\n` + PROMPT), at)).end
      t.send('\x04')
      assert.equal(await t.exited(), 0, JSON.stringify(t.output.slice(at)))
      // The load's progress was one line, redrawn in place, ended before the notes after it.
      assert.match(t.output.slice(0, ready.start), /^(?:\rloading [^\r\n]*: \d+%\x1b\[K)*\rloading [^\r\n]*: 100%\x1b\[K\r\n(?:warning: |loaded )/)
    } finally {
      t.kill()
    }
  })

  it('Ctrl-C drops a line being typed; twice at an empty prompt, it exits 0', { timeout: 120_000 }, async () => {
    const t = new Terminal(['chat', MODEL, '--threads', THREADS])
    try {
      let at = (await t.waitFor(new RegExp(String.raw`Type /help for commands.*\r*\n` + PROMPT), 0)).end
      t.send('abc\x03')
      at = (await t.waitFor(new RegExp(String.raw`abc[^]*\r*\n` + PROMPT), at)).end
      // Not armed by that one: the next Ctrl-C (empty prompt) gives the hint, the one after exits.
      t.send('\x03')
      await t.waitFor(/To exit, press Ctrl\+C again/, at)
      t.send('\x03')
      assert.equal(await t.exited(), 0)
    } finally {
      t.kill()
    }
  })
})
