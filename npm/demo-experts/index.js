'use strict'
// Directories of the demo experts (PEFT adapters with a manifest), for `Runtime.loadExpert`.
// scripts/pack.mjs copies them in from the repository's experts/ when it packs this package.
const path = require('node:path')

/** The SQL expert: answers a database question with one SQL query. */
exports.sql = path.join(__dirname, 'sql-smollm2')
/** The shell expert: answers a request with one shell command. */
exports.shell = path.join(__dirname, 'shell-smollm2')
/** The base model both were trained on (any of its formats loads them: safetensors or GGUF). */
exports.baseModel = 'hf:HuggingFaceTB/SmolLM2-135M-Instruct'
