// SPDX-License-Identifier: Apache-2.0
// libmaxsim for JavaScript: the WebAssembly build of the library (docs/wasm.md) behind a small API. Plain ES
// module, no dependencies, the same code in browsers and node (>= 18). Types: maxsim.d.ts.
//
//   const ms = await MaxSim.load();                       // relaxed-SIMD module where it validates and probes
//   const corpus = ms.pack({ tokens, dim: 128, lengths });  // Float32Array, or Uint16Array with dtype f16/bf16
//   const hits = ms.topk({ tokens: q, dim: 128, lengths: [32] }, corpus, 10, { mode: 'certified' });
//   corpus.dispose(); ms.dispose();
//
// Memory: every PackedCorpus and MaxSim holds WebAssembly memory until dispose() (or `using`); objects that are
// garbage collected without it are released by a FinalizationRegistry (counted in MaxSim.leaksCollected).

// maxsim_status values (lib/include/maxsim/maxsim.h), in order.
const STATUS = ['MAXSIM_OK', 'MAXSIM_ERR_INVALID_ARGUMENT', 'MAXSIM_ERR_INVALID_BUFFER', 'MAXSIM_ERR_NON_FINITE',
  'MAXSIM_ERR_DIM_MISMATCH', 'MAXSIM_ERR_IO', 'MAXSIM_ERR_OUT_OF_MEMORY', 'MAXSIM_ERR_UNSUPPORTED',
  'MAXSIM_ERR_BACKEND_UNAVAILABLE', 'MAXSIM_ERR_BUFFER_TOO_SMALL', 'MAXSIM_ERR_PLUGIN', 'MAXSIM_ERR_INTERNAL',
  'MAXSIM_ERR_CANCELLED'];
const DTYPE = { f32: 1, f16: 2, bf16: 3 };
const DTYPE_NAME = { 1: 'f32', 2: 'f16', 3: 'bf16' };
const METRIC = { dot: 0, cosine: 1 };
const MODE = { exact: 0, certified: 1, approximate: 2 };
const VALIDATION = { standard: 0, deep: 1, fast: 2 };

/** An error from the library (status = its name, e.g. 'MAXSIM_ERR_NON_FINITE') or from argument checks here. */
export class MaxSimError extends Error {
  constructor(status, message) {
    super(message);
    this.name = 'MaxSimError';
    this.status = status;
  }
}

function fail(message) {
  throw new MaxSimError('MAXSIM_ERR_INVALID_ARGUMENT', message);
}

const dispose = Symbol.dispose ?? Symbol.for('Symbol.dispose');

// ---- WASI: the few imports the module has (the library never prints or reads files here) ----
function wasiImports(getMemory) {
  const ENOSYS = 52;
  const known = {
    environ_sizes_get(countPtr, sizePtr) {
      const v = new DataView(getMemory().buffer);
      v.setUint32(countPtr, 0, true);
      v.setUint32(sizePtr, 0, true);
      return 0;
    },
    environ_get() { return 0; },
    fd_write(fd, iovs, iovsLen, nwrittenPtr) {
      const v = new DataView(getMemory().buffer);
      let n = 0;
      for (let i = 0; i < iovsLen; i++) n += v.getUint32(iovs + 8 * i + 4, true);
      v.setUint32(nwrittenPtr, n, true);
      return 0;
    },
    clock_time_get(id, precision, timePtr) {  // the library's progress timing
      new DataView(getMemory().buffer).setBigUint64(timePtr, BigInt(Math.round(performance.now() * 1e6)), true);
      return 0;
    },
    fd_close() { return 0; },
    fd_seek() { return 8; },  // EBADF: no files
    proc_exit(code) { throw new MaxSimError('MAXSIM_ERR_INTERNAL', `the module exited (code ${code})`); },
  };
  return new Proxy(known, { get: (t, name) => t[name] ?? (() => ENOSYS) });
}

async function fetchBytes(url) {
  const u = url instanceof URL ? url : new URL(url, import.meta.url);
  if (u.protocol === 'file:') {
    const { readFile } = await import('node:fs/promises');
    return new Uint8Array(await readFile(u));
  }
  const r = await fetch(u);
  if (!r.ok) throw new MaxSimError('MAXSIM_ERR_IO', `cannot fetch ${u}: HTTP ${r.status}`);
  return new Uint8Array(await r.arrayBuffer());
}

async function instantiate(bytes) {
  let memory = null;
  const { instance } = await WebAssembly.instantiate(bytes, { wasi_snapshot_preview1: wasiImports(() => memory) });
  memory = instance.exports.memory;
  instance.exports._initialize();
  return instance.exports;
}

const registry = new FinalizationRegistry((release) => {
  MaxSim.leaksCollected++;
  release();
});

// ---- token sets: { tokens, dim, lengths | offsets, dtype? } ----
function checkSets(sets, what) {
  if (sets === null || typeof sets !== 'object') fail(`${what} must be an object { tokens, dim, lengths | offsets }`);
  const { tokens, dim } = sets;
  let dtype = sets.dtype ?? (tokens instanceof Float32Array ? 'f32' : undefined);
  if (!(tokens instanceof Float32Array) && !(tokens instanceof Uint16Array)) {
    fail(`${what}.tokens must be a Float32Array, or a Uint16Array of f16/bf16 bits`);
  }
  if (tokens instanceof Uint16Array && dtype !== 'f16' && dtype !== 'bf16') {
    fail(`${what}.tokens is a Uint16Array: say what its bits are with dtype 'f16' or 'bf16'`);
  }
  if (tokens instanceof Float32Array && dtype !== 'f32') fail(`${what}.tokens is a Float32Array but dtype is '${dtype}'`);
  if (!Number.isInteger(dim) || dim <= 0) fail(`${what}.dim must be a positive integer (got ${dim})`);
  if (tokens.length % dim !== 0) fail(`${what}.tokens has ${tokens.length} values, not a multiple of dim ${dim}`);
  const rows = tokens.length / dim;
  let offsets;
  if (sets.offsets !== undefined && sets.lengths !== undefined) fail(`${what}: give lengths or offsets, not both`);
  if (sets.offsets !== undefined) {
    offsets = Array.from(sets.offsets, Number);
    if (offsets.length < 1) fail(`${what}.offsets needs n_sets + 1 values`);
  } else if (sets.lengths !== undefined) {
    offsets = [0];
    for (const l of sets.lengths) {
      const n = Number(l);
      if (!Number.isInteger(n) || n < 0) fail(`${what}.lengths has ${l}, not a non-negative integer`);
      offsets.push(offsets[offsets.length - 1] + n);
    }
  } else {
    fail(`${what} needs lengths (tokens per set) or offsets (n_sets + 1 row offsets)`);
  }
  if (offsets[offsets.length - 1] !== rows && sets.offsets === undefined) {
    fail(`${what}.lengths add up to ${offsets[offsets.length - 1]} tokens but tokens holds ${rows} rows of dim ${dim}`);
  }
  for (let i = 0; i < offsets.length; i++) {
    if (!Number.isInteger(offsets[i]) || offsets[i] < 0 || offsets[i] > rows) {
      fail(`${what}.offsets[${i}] = ${offsets[i]} is outside [0, ${rows}] (rows of tokens)`);
    }
  }
  return { tokens, dim, dtype: DTYPE[dtype], offsets, n: offsets.length - 1 };
}

function option(table, value, name) {
  if (!(value in table)) fail(`${name} '${value}' is not one of ${Object.keys(table).join(', ')}`);
  return table[value];
}

/** A validated, read-only packed corpus inside a MaxSim module. */
export class PackedCorpus {
  #ms; #handle; #buffer;
  constructor(ms, handle, buffer) {
    this.#ms = ms;
    this.#handle = handle;
    this.#buffer = buffer;
    const d = ms._describe(handle);
    this.nSets = d[0];
    this.nVectors = d[1];
    this.dim = d[2];
    this.dtype = DTYPE_NAME[d[3]];
    this.hasIds = d[4] !== 0;
    this.byteLength = d[5];
    const release = ms._releaser(handle, buffer);
    this.#release = release;
    registry.register(this, release, this);
  }
  #release;
  get _handle() {
    if (!this.#handle) throw new MaxSimError('MAXSIM_ERR_INVALID_ARGUMENT', 'this PackedCorpus was disposed');
    this.#ms._check();
    return this.#handle;
  }
  get module() { return this.#ms; }
  /** The packed bytes (a copy): save them, fetch them back with MaxSim.open. */
  toArrayBuffer() {
    const d = this.#ms._describe(this._handle);
    return this.#ms._heap().slice(d[6], d[6] + d[5]).buffer;
  }
  toBlob() { return new Blob([this.toArrayBuffer()], { type: 'application/octet-stream' }); }
  /** External ids (BigUint64Array) or null. */
  ids() {
    const d = this.#ms._describe(this._handle);
    if (!d[4]) return null;
    return new BigUint64Array(this.#ms._heap().buffer.slice(d[8], d[8] + 8 * d[0]));
  }
  dispose() {
    if (!this.#handle) return;
    registry.unregister(this);
    this.#release();
    this.#handle = 0;
  }
  [dispose]() { this.dispose(); }
}

export class MaxSim {
  static leaksCollected = 0;
  #x; #ctx; #info; #broken = null;

  /**
   * Loads the module: the relaxed-SIMD one when WebAssembly.validate accepts it and its probe finds
   * f32x4.relaxed_madd fused, else the SIMD128 one. options.module: 'auto' (default), 'relaxed' or
   * 'simd128'; options.relaxedUrl / simd128Url: where the .wasm files are (default: beside this file);
   * options.isa: force a kernel by name ('scalar', ...).
   */
  static async load(options = {}) {
    const want = options.module ?? 'auto';
    if (!['auto', 'relaxed', 'simd128'].includes(want)) fail(`module '${want}' is not auto, relaxed or simd128`);
    const relaxedUrl = options.relaxedUrl ?? new URL('./maxsim-relaxed.wasm', import.meta.url);
    const simdUrl = options.simd128Url ?? new URL('./maxsim-simd128.wasm', import.meta.url);
    const t0 = performance.now();
    let why;
    if (want !== 'simd128') {
      const bytes = await fetchBytes(relaxedUrl);
      if (WebAssembly.validate(bytes)) {
        const x = await instantiate(bytes);
        const ms = new MaxSim(x, options.isa);
        const probe = ms.#kernelStatus('wasm-relaxed');
        if (probe.available || want === 'relaxed') {
          ms.#info = { module: 'relaxed', why: probe.available
            ? 'this engine validates relaxed SIMD and the probe found f32x4.relaxed_madd fused'
            : `relaxed module forced; its kernel is unavailable: ${probe.reason}` };
          ms.#info.loadMs = performance.now() - t0;
          return ms;
        }
        why = `this engine validates relaxed SIMD but ${probe.reason}; using the SIMD128 module`;
        ms.dispose();
      } else {
        if (want === 'relaxed') throw new MaxSimError('MAXSIM_ERR_UNSUPPORTED', 'this engine does not validate the relaxed-SIMD module');
        why = 'this engine does not validate relaxed SIMD; using the SIMD128 module';
      }
    } else {
      why = 'SIMD128 module requested';
    }
    const bytes = await fetchBytes(simdUrl);
    if (!WebAssembly.validate(bytes)) {
      throw new MaxSimError('MAXSIM_ERR_UNSUPPORTED', 'this engine does not support WebAssembly SIMD (SIMD128)');
    }
    const ms = new MaxSim(await instantiate(bytes), options.isa);
    ms.#info = { module: 'simd128', why, loadMs: performance.now() - t0 };
    return ms;
  }

  constructor(exports, isa) {
    this.#x = exports;
    const out = this.#alloc(4);
    const name = isa ? this.#string(isa) : 0;
    try {
      this.#run(() => this.#x.mjs_context_create(name, out));
      this.#ctx = this.#u32()[out >>> 2];
    } finally {
      this.#x.mjs_free(out);
      if (name) this.#x.mjs_free(name);
    }
    const x = this.#x, ctx = this.#ctx;
    registry.register(this, () => x.mjs_context_destroy(ctx), this);
  }

  /** Which module and kernel run, why, the library version, load time and the library's own report. */
  info() {
    this._check();
    const x = this.#x;
    const out = this.#alloc(4);
    let report = '';
    try {
      this.#run(() => x.mjs_context_report(this.#ctx, out));
      const p = this.#u32()[out >>> 2];
      report = this.#cstring(p);
      x.mjs_free(p);
    } finally {
      x.mjs_free(out);
    }
    return { ...this.#info, kernel: this.#cstring(x.mjs_context_kernel(this.#ctx)),
      version: this.#cstring(x.mjs_version()), report };
  }

  /** Packs token sets (+ optional ids: BigUint64Array or numbers) into a PackedCorpus. */
  pack(sets, ids) {
    this._check();
    const s = checkSets(sets, 'sets');
    if (ids !== undefined && ids !== null && ids.length !== s.n) fail(`ids has ${ids.length} values for ${s.n} sets`);
    const x = this.#x;
    const blocks = [];
    try {
      const { data, offs } = this.#setsIn(s, blocks);
      const idp = ids ? this.#copyIn(BigUint64Array.from(ids, (v) => BigInt(v)), blocks) : 0;
      const out = this.#block(4, blocks);
      this.#run(() => x.mjs_pack(this.#ctx, data, s.dtype, s.dim, s.n, offs, idp, out));
      return new PackedCorpus(this, this.#u32()[out >>> 2], 0);
    } finally {
      for (const b of blocks) x.mjs_free(b);
    }
  }

  /**
   * A PackedCorpus from packed bytes: ArrayBuffer, typed array, Blob or fetch Response. Validated
   * (options.validation: 'standard' (default), 'deep', or 'fast' for bytes this process packed itself).
   */
  async open(source, options = {}) {
    let bytes;
    if (source instanceof ArrayBuffer) bytes = new Uint8Array(source);
    else if (ArrayBuffer.isView(source)) bytes = new Uint8Array(source.buffer, source.byteOffset, source.byteLength);
    else if (typeof Blob !== 'undefined' && source instanceof Blob) bytes = new Uint8Array(await source.arrayBuffer());
    else if (typeof Response !== 'undefined' && source instanceof Response) {
      if (!source.ok) throw new MaxSimError('MAXSIM_ERR_IO', `cannot read the packed corpus: HTTP ${source.status}`);
      bytes = new Uint8Array(await source.arrayBuffer());
    } else fail('open() takes an ArrayBuffer, a typed array, a Blob or a fetch Response');
    return this.openBytes(bytes, options);
  }

  /** open() for bytes already in memory (synchronous). */
  openBytes(bytes, options = {}) {
    this._check();
    const level = option(VALIDATION, options.validation ?? 'standard', 'validation');
    const x = this.#x;
    const buf = this.#alloc(bytes.length);
    const out = this.#alloc(4);
    try {
      this.#heap().set(bytes, buf);
      this.#run(() => x.mjs_open(buf, bytes.length, level, out));
      return new PackedCorpus(this, this.#u32()[out >>> 2], buf);
    } catch (e) {
      x.mjs_free(buf);
      throw e;
    } finally {
      x.mjs_free(out);
    }
  }

  /** Scores of every query set against every corpus document: Float32Array [nQueries * nSets], row-major. */
  scores(queries, corpus, options = {}) {
    const q = this.#queries(queries, corpus);
    const { metric, mode } = this.#modes(options);
    const x = this.#x;
    const blocks = [];
    try {
      const { data, offs } = this.#setsIn(q, blocks);
      const out = this.#block(4 * q.n * corpus.nSets, blocks);
      const stats = this.#block(40, blocks);
      this.#run(() => x.mjs_score_matrix(this.#ctx, data, q.dtype, q.dim, q.n, offs, corpus._handle, metric, mode, out,
        stats));
      this.lastStats = this.#stats(stats);
      return new Float32Array(this.#heap().buffer.slice(out, out + 4 * q.n * corpus.nSets));
    } finally {
      for (const b of blocks) x.mjs_free(b);
    }
  }

  /**
   * The k best documents per query set: { scores: Float32Array [nQueries * k], index: Int32Array (-1 past the
   * corpus' end), ids: BigUint64Array or null }, ranked by score, ties by the lower document index.
   */
  topk(queries, corpus, k, options = {}) {
    const q = this.#queries(queries, corpus);
    if (!Number.isInteger(k) || k <= 0) fail(`k must be a positive integer (got ${k})`);
    const { metric, mode } = this.#modes(options);
    const x = this.#x;
    const blocks = [];
    try {
      const { data, offs } = this.#setsIn(q, blocks);
      const sc = this.#block(4 * q.n * k, blocks);
      const ix = this.#block(8 * q.n * k, blocks);
      const ids = corpus.hasIds ? this.#block(8 * q.n * k, blocks) : 0;
      const stats = this.#block(40, blocks);
      this.#run(() => x.mjs_topk(this.#ctx, data, q.dtype, q.dim, q.n, offs, corpus._handle, k, metric, mode, sc, ix,
        ids, stats));
      this.lastStats = this.#stats(stats);
      const heap = this.#heap().buffer;
      const index = Int32Array.from(new BigUint64Array(heap.slice(ix, ix + 8 * q.n * k)),
        (v) => (v === 0xFFFFFFFFFFFFFFFFn ? -1 : Number(v)));
      return { scores: new Float32Array(heap.slice(sc, sc + 4 * q.n * k)), index,
        ids: ids ? new BigUint64Array(heap.slice(ids, ids + 8 * q.n * k)) : null };
    } finally {
      for (const b of blocks) x.mjs_free(b);
    }
  }

  dispose() {
    if (!this.#ctx) return;
    registry.unregister(this);
    if (!this.#broken) this.#x.mjs_context_destroy(this.#ctx);
    this.#ctx = 0;
  }
  [dispose]() { this.dispose(); }

  // ---- internals ----
  _check() {
    if (this.#broken) throw new MaxSimError('MAXSIM_ERR_INTERNAL', `the module stopped (${this.#broken}); load a new one`);
    if (!this.#ctx) throw new MaxSimError('MAXSIM_ERR_INVALID_ARGUMENT', 'this MaxSim was disposed');
  }
  _heap() { return this.#heap(); }
  _describe(handle) {
    const out = this.#alloc(72);
    try {
      this.#run(() => this.#x.mjs_describe(handle, out));
      return Array.from(new Float64Array(this.#heap().buffer, out, 9));
    } finally {
      this.#x.mjs_free(out);
    }
  }
  _releaser(handle, buffer) {
    const x = this.#x;
    return () => {
      x.mjs_release(handle);
      if (buffer) x.mjs_free(buffer);
    };
  }
  #kernelStatus(name) {
    const x = this.#x;
    const out = this.#alloc(4);
    try {
      for (let i = 0; i < x.mjs_kernel_count(); i++) {
        if (this.#cstring(x.mjs_kernel_name(i)) !== name) continue;
        const ok = x.mjs_kernel_available(i, out) !== 0;
        return { available: ok, reason: ok ? '' : this.#cstring(this.#u32()[out >>> 2]) };
      }
      return { available: false, reason: `this module has no kernel ${name}` };
    } finally {
      x.mjs_free(out);
    }
  }
  #queries(queries, corpus) {
    this._check();
    if (!(corpus instanceof PackedCorpus)) fail('corpus must be a PackedCorpus (MaxSim.pack or MaxSim.open)');
    if (corpus.module !== this) fail('corpus belongs to another MaxSim module');
    return checkSets(queries, 'queries');
  }
  #modes(options) {
    return { metric: option(METRIC, options.metric ?? 'dot', 'metric'),
      mode: option(MODE, options.mode ?? 'exact', 'mode') };
  }
  #stats(p) {
    const v = new BigUint64Array(this.#heap().buffer, p, 5);
    return { pairs: Number(v[0]), queryTokens: Number(v[1]), refined: Number(v[2]), multiCandidate: Number(v[3]),
      docsPruned: Number(v[4]) };
  }
  #status(s) {
    if (s === 0) return;
    throw new MaxSimError(STATUS[s] ?? `status ${s}`, this.#cstring(this.#x.mjs_last_error()));
  }
  #run(f) { this.#status(this.#call(f)); }
  #call(f) {
    try {
      return f();
    } catch (e) {
      if (e instanceof WebAssembly.RuntimeError) this.#broken = e.message;
      throw e;
    }
  }
  #heap() { return new Uint8Array(this.#x.memory.buffer); }
  #u32() { return new Uint32Array(this.#x.memory.buffer); }
  #alloc(n) {
    const p = this.#call(() => this.#x.mjs_alloc(n));
    if (!p) throw new MaxSimError('MAXSIM_ERR_OUT_OF_MEMORY', `cannot allocate ${n} bytes of WebAssembly memory`);
    return p;
  }
  #block(n, blocks) {
    const p = this.#alloc(n);
    blocks.push(p);
    this.#heap().fill(0, p, p + n);
    return p;
  }
  // Tokens and u64 offsets of checked sets into module memory (freed with `blocks`).
  #setsIn(sets, blocks) {
    return { data: this.#copyIn(sets.tokens, blocks), offs: this.#copyIn(BigUint64Array.from(sets.offsets, BigInt), blocks) };
  }
  #copyIn(typed, blocks) {
    const bytes = new Uint8Array(typed.buffer, typed.byteOffset, typed.byteLength);
    const p = this.#alloc(bytes.length);
    blocks.push(p);
    this.#heap().set(bytes, p);
    return p;
  }
  #string(s) {
    const b = new TextEncoder().encode(s + '\0');
    const p = this.#alloc(b.length);
    this.#heap().set(b, p);
    return p;
  }
  #cstring(p) {
    if (!p) return '';
    const h = this.#heap();
    let e = p;
    while (h[e] !== 0) e++;
    return new TextDecoder().decode(h.subarray(p, e));
  }
}
