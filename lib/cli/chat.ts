// `expert-runtime chat <model> [--expert DIR]... [options]`: an interactive chat in the terminal
// on node:readline. Answers stream token by token; Ctrl-C cancels the answer being written (an
// AbortSignal passed to `generate`) and, at an empty prompt, exits on the second press as
// node's REPL does; Ctrl-D (end of input) exits. With stdin not a terminal, each input line is
// one question and each answer is written as it streams, followed by a newline; nothing else
// goes to stdout (progress and notes go to stderr), and the command exits at end of input.
//
// Keys typed while an answer is written do not reach readline (which would echo them into the
// answer): they are kept, unseen, and appear at the next prompt, ready to edit or send. Enter
// sends nothing then (a question is sent only from a prompt where it can be read); Ctrl-C stops
// the answer, Ctrl-D leaves once it is written.
import { createInterface, type Interface, type Key } from 'node:readline'
import { toError } from '../errors'
import { Runtime } from '../runtime'
import type { Session } from '../session'
import type { GenerateOptions } from '../types'
import { intOption, onePositional, parseArgs, stringOption, UsageError } from './args'
import { loadProgress } from './progress'

/**
 * The longest answer unless `--max-tokens` says otherwise. The API's default (the rest of the
 * context) lets a small model that loops write for thousands of tokens. Chat CLIs bound it:
 * `mlx_lm.chat` and `transformers chat` at 256 new tokens, llama.cpp's `llama-cli` and Ollama
 * not at all (-1). 1024 leaves room for a long answer (some 700 words, or a page of code) and
 * stops a loop within a minute on a CPU; `[length]` then says why the answer ended.
 */
export const DEFAULT_MAX_TOKENS = 1024

export const USAGE = `usage: expert-runtime chat <model.gguf | model-dir> [options]

  --expert DIR           load the adapter at DIR or hf:org/repo, apply it to every answer (repeatable)
  --system TEXT          the system prompt
  --temperature T        sampling temperature, 0 = greedy (default: the model's generation
                         config, else 0.8)
  --max-tokens N         the longest answer, in tokens (default: ${DEFAULT_MAX_TOKENS})
  --threads N            engine threads (default: all cores)
  --context-length N     the context length (default: the model's)
  --speculative          speculative decoding by prompt lookup (same answers; faster where
                         they repeat the conversation, as code edits do)
  --verbose              after each answer, print its token count and speed

In the chat: /reset forgets the conversation, /help lists commands, /exit (or Ctrl-D) leaves.
Ctrl-C stops the answer being written; at an empty prompt, press it twice to leave.`

const HELP = `/reset   forget the conversation (the system prompt stays)
/help    this list
/exit    leave (also Ctrl-D, or Ctrl-C twice at an empty prompt)
Ctrl-C while an answer is written stops it.`

interface ChatArgs {
  model: string
  experts: string[]
  system?: string
  temperature?: number
  maxTokens: number
  threads?: number
  contextLength?: number
  speculative: boolean
  verbose: boolean
}

function parse(argv: string[]): ChatArgs {
  const p = parseArgs(argv, { values: ['system', 'temperature', 'max-tokens', 'threads', 'context-length'], flags: ['verbose', 'speculative'], repeatable: ['expert'] })
  const model = onePositional(p, 'chat needs a model path')
  const t = stringOption(p, 'temperature')
  const temperature = t === undefined ? undefined : Number(t)
  if (temperature !== undefined && !(t!.trim() !== '' && Number.isFinite(temperature) && temperature >= 0)) {
    throw new UsageError('--temperature must be a number >= 0')
  }
  return {
    model,
    experts: p.lists.get('expert') ?? [],
    system: stringOption(p, 'system'),
    temperature,
    maxTokens: intOption(p, 'max-tokens', 1) ?? DEFAULT_MAX_TOKENS,
    threads: intOption(p, 'threads', 1),
    contextLength: intOption(p, 'context-length', 1),
    speculative: p.options.has('speculative'),
    verbose: p.options.has('verbose'),
  }
}

function fail(e: unknown): void {
  const err = toError(e)
  process.stderr.write(`expert-runtime chat: ${err.code}: ${err.message}\n`)
  process.exitCode = 1
}

async function load(a: ChatArgs): Promise<Runtime> {
  const { end, ...progress } = loadProgress(a.model)
  const rt = await Runtime.load(a.model, { threads: a.threads, contextLength: a.contextLength, ...progress }).finally(end)
  for (const w of rt.info.warnings) process.stderr.write(`warning: ${w}\n`)
  return rt
}

/** The conversation loop: one line in, one streamed answer out. */
class Chat {
  readonly #rl: Interface
  readonly #session: Session
  readonly #options: GenerateOptions
  readonly #tty: boolean
  readonly #verbose: boolean
  /** The answer being written, if any. */
  #answer: AbortController | undefined
  /** Ctrl-C was pressed once at an empty prompt. */
  #exitArmed = false
  /** Text typed while an answer was written, for the next prompt (terminal only). */
  #typedAhead = ''
  /** Ctrl-D was pressed while an answer was written: leave once it is. */
  #leaveAfterAnswer = false

  constructor(session: Session, a: ChatArgs, tty: boolean) {
    this.#session = session
    this.#tty = tty
    this.#verbose = a.verbose
    this.#options = { temperature: a.temperature, maxTokens: a.maxTokens, speculative: a.speculative ? { type: 'ngram' } : undefined }
    this.#rl = createInterface({ input: process.stdin, output: tty ? process.stdout : undefined, terminal: tty, prompt: '> ' })
    // In a terminal readline reads Ctrl-C as a key; otherwise it arrives as a signal.
    this.#rl.on('SIGINT', this.#onInterrupt)
    process.on('SIGINT', this.#onInterrupt)
  }

  readonly #onInterrupt = (): void => this.#interrupt()

  /** Notes for the person at the terminal (stderr: stdout carries only answers when piped). */
  #note(s: string): void {
    process.stderr.write(s + '\n')
  }

  #interrupt(): void {
    if (this.#answer) {
      this.#answer.abort()
      return
    }
    if (!this.#tty) {
      process.exitCode = 130
      this.#rl.close()
      return
    }
    if (this.#rl.line.length > 0) {
      // Like the REPL: Ctrl-C drops the line being typed.
      this.#rl.write(null, { ctrl: true, name: 'e' })
      this.#rl.write(null, { ctrl: true, name: 'u' })
      process.stdout.write('\n')
      this.#rl.prompt()
      return
    }
    if (this.#exitArmed) {
      this.#rl.close()
      return
    }
    this.#exitArmed = true
    process.stdout.write('\n')
    this.#note('(To exit, press Ctrl+C again or Ctrl+D or type /exit)')
    this.#rl.prompt()
  }

  /** Chats until the input ends or the user leaves; then Ctrl-C is a plain signal again. */
  async run(): Promise<void> {
    try {
      await this.#loop()
    } finally {
      process.off('SIGINT', this.#onInterrupt)
    }
  }

  async #loop(): Promise<void> {
    if (this.#tty) {
      this.#note('Type /help for commands, Ctrl-D to leave.')
      this.#rl.prompt()
    }
    // The iterator queues lines that arrive while an answer is written (piped input).
    for await (const raw of this.#rl) {
      this.#exitArmed = false
      const line = raw.trim()
      if (line === '') {
        // Skipped without an answer (piped input: no output line either).
      } else if (line.startsWith('/')) {
        if (!this.#command(line)) {
          this.#rl.close()
          return
        }
      } else {
        await this.#ask(line)
        if (this.#leaveAfterAnswer) {
          this.#rl.close()
          break
        }
      }
      if (this.#tty) this.#prompt()
    }
    // Left with Ctrl-D or Ctrl-C at the prompt: the shell's prompt starts on a line of its own.
    if (this.#tty) process.stdout.write('\n')
  }

  /** The prompt, with what was typed while the last answer was written. */
  #prompt(): void {
    this.#rl.prompt()
    const typed = this.#typedAhead
    this.#typedAhead = ''
    // As if typed now: readline shows it after the prompt and edits it as usual.
    if (typed) this.#rl.write(typed)
  }

  /**
   * Until the returned function is called, keys go to `#onAnswerKey` instead of readline, which
   * would echo them (and edit them into a line) in the middle of the answer. readline reads
   * keys as `keypress` events of its input (node:readline's emitKeypressEvents): its listeners
   * are set aside and put back.
   */
  #holdKeys(): () => void {
    const input = process.stdin
    const readline = input.listeners('keypress') as ((s: string | undefined, key: Key | undefined) => void)[]
    input.on('keypress', this.#onAnswerKey)
    for (const l of readline) input.off('keypress', l)
    return () => {
      for (const l of readline) input.on('keypress', l)
      input.off('keypress', this.#onAnswerKey)
    }
  }

  /** A key pressed while an answer is written. */
  readonly #onAnswerKey = (s: string | undefined, key: Key | undefined): void => {
    if (key?.ctrl && key.name === 'c') this.#interrupt()
    else if (key?.ctrl && key.name === 'd') this.#leaveAfterAnswer = true
    else if (key?.name === 'backspace') this.#typedAhead = [...this.#typedAhead].slice(0, -1).join('')
    // Printable text only: Enter, Tab, arrows and other control sequences do nothing here.
    else if (s && !key?.ctrl && !key?.meta && !/[\x00-\x1f\x7f]/.test(s)) this.#typedAhead += s
  }

  /** A slash command; false to leave. */
  #command(line: string): boolean {
    const [name] = line.split(/\s+/)
    switch (name) {
      case '/exit':
      case '/quit':
        return false
      case '/reset':
        this.#session.reset()
        this.#note('(conversation reset)')
        return true
      case '/help':
        this.#note(HELP)
        return true
      default:
        this.#note(`unknown command ${name}: /help lists them`)
        return true
    }
  }

  async #ask(question: string): Promise<void> {
    const ac = new AbortController()
    this.#answer = ac
    const releaseKeys = this.#tty ? this.#holdKeys() : undefined
    let wroteNewline = false
    try {
      const stream = this.#session.generate(question, { ...this.#options, signal: ac.signal })
      for await (const chunk of stream) {
        if (chunk.text) {
          process.stdout.write(chunk.text)
          wroteNewline = chunk.text.endsWith('\n')
        }
      }
      // A terminal gets a newline only where the answer lacks one; piped output one per answer.
      if (!this.#tty || !wroteNewline) process.stdout.write('\n')
      const r = stream.result
      if (r && r.finishReason !== 'stop') this.#note(`[${r.finishReason}]`)
      if (r && this.#verbose) {
        const t = r.timings
        this.#note(
          `[${r.usage.completionTokens} tokens, ${t.tokensPerSecond.toFixed(1)} tok/s; prompt ${r.usage.promptTokens} tokens ` +
            `(${r.usage.cachedTokens} cached), first token after ${t.ttftMs.toFixed(0)} ms` +
            (r.usage.draftTokens ? `; ${r.usage.acceptedDraftTokens} of ${r.usage.draftTokens} drafted tokens kept]` : ']'),
        )
      }
    } catch (e) {
      if (!wroteNewline) process.stdout.write('\n')
      const err = toError(e)
      this.#note(`error: ${err.code}: ${err.message}`)
    } finally {
      releaseKeys?.()
      this.#answer = undefined
    }
  }
}

export async function chat(argv: string[]): Promise<void> {
  const a = parse(argv)
  let rt: Runtime
  try {
    rt = await load(a)
  } catch (e) {
    fail(e)
    return
  }
  try {
    const names: string[] = []
    for (const dir of a.experts) {
      const e = await rt.loadExpert(dir)
      process.stderr.write(`loaded expert ${e.name} (${e.kind}) from ${dir}\n`)
      names.push(e.name)
    }
    // A terminal chat goes on past the context: the oldest turns make room (the system prompt stays).
    const session = rt.createSession({ system: a.system, experts: names, contextShift: 'drop-oldest' })
    const i = rt.info
    process.stderr.write(`loaded ${a.model} (${i.architecture}, ${i.dtype}, ${i.device}, context ${i.contextLength})\n`)
    await new Chat(session, a, process.stdin.isTTY === true && process.stdout.isTTY === true).run()
    session.dispose()
  } catch (e) {
    fail(e)
  } finally {
    await rt.dispose()
  }
}
