// Byte-level readers and writers for the two weight formats the adversarial suite mutates:
// safetensors (8-byte header length, JSON header, data) and GGUF v3 (header, typed key/value
// metadata, tensor infos, aligned data). The readers record where each length, count and
// field sits so a case can overwrite it in place; the writers re-emit a (changed) model.

/** A deterministic PRNG (mulberry32): the same seed gives the same cases on every run. */
export function prng(seed) {
  let a = seed >>> 0
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
  return {
    next,
    /** An integer in [lo, hi). */
    int: (lo, hi) => lo + Math.floor(next() * (hi - lo)),
    pick: (xs) => xs[Math.floor(next() * xs.length)],
  }
}

// ---------------------------------------------------------------- safetensors

/** `{ headerLen, header (parsed, key order kept), headerText, data }` of a safetensors file. */
export function parseSafetensors(buf) {
  const headerLen = Number(buf.readBigUInt64LE(0))
  const headerText = buf.subarray(8, 8 + headerLen).toString('utf8')
  return { headerLen, header: JSON.parse(headerText), headerText, data: buf.subarray(8 + headerLen) }
}

/**
 * A safetensors file from a header (an object, or raw JSON text for what JSON.stringify cannot
 * write: 2^64 offsets, duplicate keys) and the data bytes. `headerLen` overrides the length field.
 */
export function writeSafetensors(header, data, { headerLen } = {}) {
  const text = Buffer.from(typeof header === 'string' ? header : JSON.stringify(header), 'utf8')
  const len = Buffer.alloc(8)
  len.writeBigUInt64LE(BigInt(headerLen ?? text.length))
  return Buffer.concat([len, text, data])
}

// ---------------------------------------------------------------- GGUF

export const GGUF = {
  UINT8: 0, INT8: 1, UINT16: 2, INT16: 3, UINT32: 4, INT32: 5, FLOAT32: 6, BOOL: 7, STRING: 8, ARRAY: 9, UINT64: 10, INT64: 11, FLOAT64: 12,
}
const SCALAR = {
  [GGUF.UINT8]: [1, 'readUInt8', 'writeUInt8'],
  [GGUF.INT8]: [1, 'readInt8', 'writeInt8'],
  [GGUF.UINT16]: [2, 'readUInt16LE', 'writeUInt16LE'],
  [GGUF.INT16]: [2, 'readInt16LE', 'writeInt16LE'],
  [GGUF.UINT32]: [4, 'readUInt32LE', 'writeUInt32LE'],
  [GGUF.INT32]: [4, 'readInt32LE', 'writeInt32LE'],
  [GGUF.FLOAT32]: [4, 'readFloatLE', 'writeFloatLE'],
  [GGUF.BOOL]: [1, 'readUInt8', 'writeUInt8'],
  [GGUF.UINT64]: [8, 'readBigUInt64LE', 'writeBigUInt64LE'],
  [GGUF.INT64]: [8, 'readBigInt64LE', 'writeBigInt64LE'],
  [GGUF.FLOAT64]: [8, 'readDoubleLE', 'writeDoubleLE'],
}

/**
 * Parses a GGUF v2/v3 file. Every field's byte position is kept:
 * `{ version, pos: {version, tensorCount, kvCount}, kvs: [{ key, type, value, pos: {key, type,
 * value, arrayType?, arrayCount?} }], tensors: [{ name, dims (BigInt[], ggml order), type,
 * offset (BigInt), pos: {name, nDims, dims[], type, offset} }], infoEnd, alignment, dataStart,
 * data }`. Array values are `{ type, values }`.
 */
export function parseGguf(buf) {
  let p = 0
  const u32 = () => ((p += 4), buf.readUInt32LE(p - 4))
  const u64 = () => ((p += 8), buf.readBigUInt64LE(p - 8))
  const str = () => {
    const n = Number(u64())
    const s = buf.subarray(p, p + n).toString('utf8')
    p += n
    return s
  }
  const value = (type) => {
    if (type === GGUF.STRING) return str()
    if (type === GGUF.ARRAY) {
      const t = u32()
      const n = Number(u64())
      const values = []
      for (let i = 0; i < n; i++) values.push(value(t))
      return { type: t, values }
    }
    const [size, read] = SCALAR[type]
    const v = buf[read](p)
    p += size
    return type === GGUF.BOOL ? v !== 0 : v
  }
  if (buf.readUInt32LE(0) !== 0x46554747) throw new Error('not a GGUF file')
  p = 4
  const pos = { version: 4, tensorCount: 8, kvCount: 16 }
  const version = u32()
  const tensorCount = Number(u64())
  const kvCount = Number(u64())
  const kvs = []
  for (let i = 0; i < kvCount; i++) {
    const kp = { key: p }
    const key = str()
    kp.type = p
    const type = u32()
    kp.value = p
    if (type === GGUF.ARRAY) {
      kp.arrayType = p
      kp.arrayCount = p + 4
    }
    kvs.push({ key, type, value: value(type), pos: kp })
  }
  const tensors = []
  for (let i = 0; i < tensorCount; i++) {
    const tp = { name: p }
    const name = str()
    tp.nDims = p
    const n = u32()
    tp.dims = []
    const dims = []
    for (let d = 0; d < n; d++) {
      tp.dims.push(p)
      dims.push(u64())
    }
    tp.type = p
    const type = u32()
    tp.offset = p
    tensors.push({ name, dims, type, offset: u64(), pos: tp })
  }
  const infoEnd = p
  const align = kvs.find((kv) => kv.key === 'general.alignment')
  const alignment = align ? Number(align.value) : 32
  const dataStart = Math.ceil(infoEnd / alignment) * alignment
  return { version, pos, kvs, tensors, infoEnd, alignment, dataStart, data: buf.subarray(dataStart) }
}

function encodeValue(type, v) {
  // A value already encoded (deeper than the writer's own recursion could go).
  if (v && Buffer.isBuffer(v.raw)) return v.raw
  if (type === GGUF.STRING) {
    const b = Buffer.from(v, 'utf8')
    const n = Buffer.alloc(8)
    n.writeBigUInt64LE(BigInt(b.length))
    return Buffer.concat([n, b])
  }
  if (type === GGUF.ARRAY) {
    const h = Buffer.alloc(12)
    h.writeUInt32LE(v.type, 0)
    h.writeBigUInt64LE(BigInt(v.count ?? v.values.length), 4)
    return Buffer.concat([h, ...v.values.map((x) => encodeValue(v.type, x))])
  }
  const [size, , write] = SCALAR[type]
  const b = Buffer.alloc(size)
  if (type === GGUF.BOOL) b.writeUInt8(v ? 1 : 0)
  else if (size === 8 && type !== GGUF.FLOAT64) b[write](BigInt(v))
  else b[write](v)
  return b
}

/**
 * Writes a GGUF file from `{ version, kvs: [{key, type, value}], tensors: [{name, dims, type,
 * offset}], data }`. The data starts at the next multiple of `layoutAlignment` (default: the
 * `general.alignment` it declares when that is a sane power of two, else 32): a declared
 * alignment that differs from the layout is itself a mutation. `counts` overrides the header's
 * tensor and kv counts.
 */
export function writeGguf(m, { layoutAlignment, counts = {} } = {}) {
  const parts = []
  const h = Buffer.alloc(24)
  h.writeUInt32LE(0x46554747, 0)
  h.writeUInt32LE(m.version ?? 3, 4)
  h.writeBigUInt64LE(BigInt(counts.tensors ?? m.tensors.length), 8)
  h.writeBigUInt64LE(BigInt(counts.kvs ?? m.kvs.length), 16)
  parts.push(h)
  for (const kv of m.kvs) {
    parts.push(encodeValue(GGUF.STRING, kv.key))
    const t = Buffer.alloc(4)
    t.writeUInt32LE(kv.type)
    parts.push(t, encodeValue(kv.type, kv.value))
  }
  for (const t of m.tensors) {
    parts.push(encodeValue(GGUF.STRING, t.name))
    const b = Buffer.alloc(4 + 8 * t.dims.length + 4 + 8)
    b.writeUInt32LE(t.dims.length, 0)
    t.dims.forEach((d, i) => b.writeBigUInt64LE(BigInt(d), 4 + 8 * i))
    b.writeUInt32LE(t.type, 4 + 8 * t.dims.length)
    b.writeBigUInt64LE(BigInt(t.offset), 8 + 8 * t.dims.length)
    parts.push(b)
  }
  let head = Buffer.concat(parts)
  let align = layoutAlignment
  if (align === undefined) {
    const declared = m.kvs.find((kv) => kv.key === 'general.alignment')
    const a = declared && typeof declared.value === 'number' ? declared.value : 32
    align = a > 0 && a <= 4096 && (a & (a - 1)) === 0 ? a : 32
  }
  const pad = (align - (head.length % align)) % align
  return Buffer.concat([head, Buffer.alloc(pad), m.data])
}

/** A deep copy of a parsed GGUF model that `writeGguf` accepts (the data is shared). */
export function cloneGguf(m) {
  return {
    version: m.version,
    kvs: m.kvs.map((kv) => ({ key: kv.key, type: kv.type, value: kv.type === GGUF.ARRAY ? { type: kv.value.type, values: [...kv.value.values] } : kv.value })),
    tensors: m.tensors.map((t) => ({ name: t.name, dims: [...t.dims], type: t.type, offset: t.offset })),
    data: m.data,
  }
}

/** A copy of `buf` with an unsigned integer of `size` bytes (4 or 8) written at `at`. */
export function patchUint(buf, at, size, value) {
  const out = Buffer.from(buf)
  if (size === 8) out.writeBigUInt64LE(BigInt.asUintN(64, BigInt(value)), at)
  else out.writeUInt32LE(Number(BigInt.asUintN(32, BigInt(value))), at)
  return out
}
