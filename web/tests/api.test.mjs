// SPDX-License-Identifier: Apache-2.0
// node --test for web/maxsim.mjs, on every module this engine runs (relaxed where it validates and probes,
// and SIMD128): scores bit-identical to an independent JavaScript implementation of the canonical arithmetic
// and within the spec's bound of float64, certified == exact, top-k order, f16/bf16 input, packed bytes
// round trips (ArrayBuffer, Blob, Response), bad input -> MaxSimError with the library's message and the
// module still working afterwards, dispose and the FinalizationRegistry.
// Run: node --no-liftoff --experimental-wasm-relaxed-simd --expose-gc --test web/tests/
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import { MaxSim, MaxSimError, PackedCorpus } from '../maxsim.mjs';
import { canonicalScores, float64Scores, widen } from './reference.mjs';

// Deterministic generator (xorshift) of gaussian-ish values.
function rng(seed) {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    return s / 4294967296;
  };
}

function makeSets(seed, lengths, dim, { scale = 1, ties = false } = {}) {
  const r = rng(seed);
  const rows = lengths.reduce((a, b) => a + b, 0);
  const tokens = new Float32Array(rows * dim);
  for (let i = 0; i < tokens.length; i++) {
    tokens[i] = ties ? Math.round((r() - 0.5) * 4) / 4 : Math.fround((r() + r() + r() - 1.5) * scale);
  }
  return { tokens, dim, lengths };
}

function asRef(s) {
  const offsets = [0];
  for (const l of s.lengths) offsets.push(offsets[offsets.length - 1] + l);
  return { values: widen(s.tokens, s.dtype), dim: s.dim, offsets };
}

const bits = (x) => Array.from(new Uint32Array(Float32Array.from(x).buffer));

async function modules() {
  const list = [await MaxSim.load({ module: 'simd128' })];
  const auto = await MaxSim.load();
  if (auto.info().module === 'relaxed') list.push(auto); else auto.dispose();
  return list;
}

test('modules load and say which kernel runs and why', async () => {
  for (const ms of await modules()) {
    const info = ms.info();
    assert.match(info.kernel, /^wasm-(simd128|relaxed)$/);
    assert.equal(info.kernel, `wasm-${info.module}`);
    assert.ok(info.why.length > 10, info.why);
    assert.match(info.report, /no plugins in this build/);
    assert.match(info.version, /^\d+\.\d+\.\d+/);
    ms.dispose();
  }
});

test('package.json carries the library version', async () => {
  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url)));
  const cmake = readFileSync(new URL('../../CMakeLists.txt', import.meta.url), 'utf8');
  assert.equal(pkg.version, /project\(libmaxsim VERSION ([0-9.]+)/.exec(cmake)[1]);
  const ms = await MaxSim.load({ module: 'simd128' });
  assert.equal(ms.info().version, pkg.version);
  ms.dispose();
});

test('scores are the canonical f32 arithmetic bit for bit and within the float64 bound', async () => {
  const cases = [
    { q: [32, 5, 1], d: [7, 1, 20, 13, 3], dim: 128, opt: {} },
    { q: [3, 4], d: [9, 2, 5, 1], dim: 37, opt: {} },                // odd dim (a partial k-group)
    { q: [6], d: [5, 5, 5], dim: 16, opt: { ties: true } },          // many exact ties
    { q: [4, 2], d: [3, 8], dim: 64, opt: { scale: 1e-5 } },         // tiny norms
    { q: [4, 2], d: [3, 8], dim: 64, opt: { scale: 1e6 } },          // huge norms
  ];
  for (const ms of await modules()) {
    for (const [n, c] of cases.entries()) {
      const Q = makeSets(11 + n, c.q, c.dim, c.opt), D = makeSets(97 + n, c.d, c.dim, c.opt);
      const corpus = ms.pack(D);
      for (const metric of ['dot', 'cosine']) {
        const want = canonicalScores(asRef(Q), asRef(D), metric);
        const exact = ms.scores(Q, corpus, { metric, mode: 'exact' });
        const certified = ms.scores(Q, corpus, { metric, mode: 'certified' });
        assert.deepEqual(bits(exact), bits(want), `${ms.info().module} case ${n} ${metric} exact`);
        assert.deepEqual(bits(certified), bits(exact), `${ms.info().module} case ${n} ${metric} certified`);
      }
      const f64 = float64Scores(asRef(Q), asRef(D));
      const exact = ms.scores(Q, corpus);
      for (let i = 0; i < exact.length; i++) {
        assert.ok(Math.abs(exact[i] - f64.score[i]) <= f64.bound[i],
          `case ${n} score ${i}: ${exact[i]} vs float64 ${f64.score[i]} (bound ${f64.bound[i]})`);
      }
      corpus.dispose();
    }
    ms.dispose();
  }
});

test('topk ranks by score, ties by the lower index, with ids; short corpora pad with -1', async () => {
  for (const ms of await modules()) {
    const Q = makeSets(5, [8, 8, 3], 32), D = makeSets(6, [4, 9, 4, 1, 6, 4, 2], 32, { ties: true });
    const ids = [70n, 71n, 72n, 73n, 74n, 75n, 76n];
    const corpus = ms.pack(D, ids);
    const all = ms.scores(Q, corpus);
    for (const mode of ['exact', 'certified']) {
      const k = 9;
      const top = ms.topk(Q, corpus, k, { mode });
      for (let i = 0; i < 3; i++) {
        const order = [...Array(7).keys()].sort((a, b) => all[i * 7 + b] - all[i * 7 + a] || a - b);
        assert.deepEqual(Array.from(top.index.subarray(i * k, i * k + 7)), order);
        assert.deepEqual(bits(top.scores.subarray(i * k, i * k + 7)), bits(order.map((j) => all[i * 7 + j])));
        assert.deepEqual(Array.from(top.index.subarray(i * k + 7, i * k + 9)), [-1, -1]);
        assert.equal(top.ids[i * k], ids[order[0]]);
      }
    }
    corpus[Symbol.dispose ?? Symbol.for('Symbol.dispose')]();  // what `using` calls
    assert.throws(() => ms.scores(Q, corpus), /disposed/);
    ms.dispose();
  }
});

test('f16 and bf16 tokens score as their f32 values', async () => {
  for (const ms of await modules()) {
    const Q = makeSets(21, [5, 3], 24), D = makeSets(22, [4, 6, 2], 24);
    for (const dtype of ['bf16', 'f16']) {
      const h = new Uint16Array(D.tokens.length);
      const f = new Float32Array(1), u = new Uint32Array(f.buffer);
      for (let i = 0; i < h.length; i++) {
        f[0] = D.tokens[i];
        // truncation is enough here: any 16-bit pattern is a valid input
        h[i] = dtype === 'bf16' ? u[0] >>> 16 : ((u[0] >>> 16) & 0x8000) | (Math.min(30, Math.max(1, ((u[0] >>> 23) & 255) - 112)) << 10) | ((u[0] >>> 13) & 1023);
      }
      const D16 = { tokens: h, dim: D.dim, lengths: D.lengths, dtype };
      const corpus = ms.pack(D16);
      assert.equal(corpus.dtype, dtype);
      assert.deepEqual(bits(ms.scores(Q, corpus)), bits(canonicalScores(asRef(Q), asRef(D16), 'dot')));
      corpus.dispose();
    }
    ms.dispose();
  }
});

test('packed bytes round trip through ArrayBuffer, Blob and Response and are the same on both modules', async () => {
  const list = await modules();
  const D = makeSets(31, [3, 4, 5], 40), Q = makeSets(32, [6], 40);
  const bytes = list.map((ms) => new Uint8Array(ms.pack(D, [1, 2, 3]).toArrayBuffer()));
  for (const b of bytes) assert.deepEqual(b, bytes[0]);
  for (const ms of list) {
    const direct = ms.pack(D, [1, 2, 3]);
    for (const source of [bytes[0].buffer, new Blob([bytes[0]]), new Response(bytes[0])]) {
      const c = await ms.open(source, { validation: 'deep' });
      assert.ok(c instanceof PackedCorpus);
      assert.deepEqual(Array.from(c.ids()), [1n, 2n, 3n]);
      assert.deepEqual(bits(ms.scores(Q, c, { mode: 'certified' })), bits(ms.scores(Q, direct)));
      c.dispose();
    }
    direct.dispose();
    ms.dispose();
  }
});

test('bad input throws MaxSimError with the library message, and the module keeps working', async () => {
  for (const ms of await modules()) {
    const D = makeSets(41, [3, 4], 16), Q = makeSets(42, [2], 16);
    const corpus = ms.pack(D);
    const good = bits(ms.scores(Q, corpus));
    const packed = new Uint8Array(corpus.toArrayBuffer());
    const expectError = async (f, status, pattern) => {
      await assert.rejects(async () => f(), (e) => {
        assert.ok(e instanceof MaxSimError, `${e}`);
        assert.equal(e.status, status, e.message);
        assert.match(e.message, pattern);
        return true;
      });
      assert.deepEqual(bits(ms.scores(Q, corpus)), good, 'the module still gives the same scores');
    };
    const nan = Float32Array.from(D.tokens); nan[20] = NaN;
    const inf = Float32Array.from(D.tokens); inf[3] = -Infinity;
    await expectError(() => ms.pack({ ...D, tokens: nan }), 'MAXSIM_ERR_NON_FINITE', /set 0 token 1 .*element 4/);
    await expectError(() => ms.pack({ ...D, tokens: inf }), 'MAXSIM_ERR_NON_FINITE', /non-finite/);
    await expectError(() => ms.pack({ tokens: D.tokens, dim: 16, lengths: [3, 5] }), 'MAXSIM_ERR_INVALID_ARGUMENT', /add up to 8/);
    await expectError(() => ms.pack({ tokens: D.tokens.subarray(1), dim: 16, lengths: [3] }), 'MAXSIM_ERR_INVALID_ARGUMENT', /multiple of dim/);
    await expectError(() => ms.pack({ tokens: [1, 2], dim: 2, lengths: [1] }), 'MAXSIM_ERR_INVALID_ARGUMENT', /Float32Array/);
    await expectError(() => ms.scores(makeSets(43, [2], 8), corpus), 'MAXSIM_ERR_DIM_MISMATCH', /dim/);
    await expectError(() => ms.topk(Q, corpus, 0), 'MAXSIM_ERR_INVALID_ARGUMENT', /k must be/);
    await expectError(() => ms.scores(Q, corpus, { mode: 'fast' }), 'MAXSIM_ERR_INVALID_ARGUMENT', /mode 'fast'/);
    await expectError(() => ms.open(packed.slice(0, packed.length - 64)), 'MAXSIM_ERR_INVALID_BUFFER', /./);
    await expectError(() => ms.open(packed.slice(0, 100)), 'MAXSIM_ERR_INVALID_BUFFER', /header/);
    for (const at of [0, 40, packed.length - 1, Math.floor(packed.length / 2)]) {
      const bad = packed.slice();
      bad[at] ^= 0x5a;
      await expectError(() => ms.open(bad), 'MAXSIM_ERR_INVALID_BUFFER', /./);
    }
    await expectError(() => ms.open('not bytes'), 'MAXSIM_ERR_INVALID_ARGUMENT', /ArrayBuffer/);
    const other = await MaxSim.load({ module: 'simd128' });
    await expectError(() => other.scores(Q, corpus), 'MAXSIM_ERR_INVALID_ARGUMENT', /another MaxSim/);
    other.dispose();
    const gone = ms.pack(D);
    gone.dispose();
    await expectError(() => ms.scores(Q, gone), 'MAXSIM_ERR_INVALID_ARGUMENT', /disposed/);
    corpus.dispose();
    ms.dispose();
    assert.throws(() => ms.info(), /disposed/);
  }
});

test('corpora dropped without dispose() are released by the FinalizationRegistry', { skip: !globalThis.gc && 'needs --expose-gc' }, async () => {
  const ms = await MaxSim.load({ module: 'simd128' });
  const D = makeSets(51, [50, 50], 64);
  const before = MaxSim.leaksCollected;
  (() => { for (let i = 0; i < 8; i++) ms.pack(D); })();
  for (let i = 0; i < 20 && MaxSim.leaksCollected < before + 8; i++) {
    globalThis.gc();
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.ok(MaxSim.leaksCollected - before >= 8, `${MaxSim.leaksCollected - before} released`);  // + earlier tests' garbage
  ms.dispose();
});
