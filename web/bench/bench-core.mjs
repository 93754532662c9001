// SPDX-License-Identifier: Apache-2.0
// The measurement shared by the node benchmark (web/bench/bench.mjs) and its browser page (web/bench/index.html):
// synthetic ColBERT-like data and the timing of MaxSim.topk on a packed corpus, per module and mode.

// Deterministic uniform [0, 1) generator (xorshift32).
function rng(seed) {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    return s / 4294967296;
  };
}

function gauss(r) {
  return Math.sqrt(-2 * Math.log(1 - r())) * Math.cos(2 * Math.PI * r());
}

// Sets of unit-norm tokens (lengths[i] each) clustered around `topics` random directions (each set draws its
// tokens from a few topics, as ColBERT documents do), so that certified screening meets realistic near-ties.
// Queries and documents drawn in one call share the topics.
export function syntheticSets({ lengths, dim, seed, topics = 256, perSet = 6, noise = 0.6 }) {
  const r = rng(seed);
  const centers = new Float32Array(topics * dim);
  for (let i = 0; i < centers.length; i++) centers[i] = gauss(r);
  const rows = lengths.reduce((a, b) => a + b, 0);
  const tokens = new Float32Array(rows * dim);
  let row = 0;
  for (const len of lengths) {
    const mine = Array.from({ length: perSet }, () => Math.floor(r() * topics));
    for (let t = 0; t < len; t++, row++) {
      const c = mine[Math.floor(r() * perSet)];
      const o = row * dim;
      let norm = 0;
      for (let k = 0; k < dim; k++) {
        const v = centers[c * dim + k] + noise * gauss(r);
        tokens[o + k] = v;
        norm += v * v;
      }
      const inv = 1 / Math.sqrt(norm);
      for (let k = 0; k < dim; k++) tokens[o + k] = Math.fround(tokens[o + k] * inv);
    }
  }
  return { tokens, dim, lengths };
}

// Sets [first, last) of `sets` as their own token sets.
export function sliceSets(sets, first, last) {
  let begin = 0;
  for (let i = 0; i < first; i++) begin += sets.lengths[i];
  const lengths = sets.lengths.slice(first, last);
  const rows = lengths.reduce((a, b) => a + b, 0);
  return { tokens: sets.tokens.slice(begin * sets.dim, (begin + rows) * sets.dim), dim: sets.dim, lengths };
}

// Best time (ms) of one topk call over `reps` runs after one warm-up, and the call's stats.
export function timeTopk(ms, queries, corpus, { mode, k = 10, reps = 3 }) {
  ms.topk(queries, corpus, k, { mode });
  let best = Infinity;
  for (let i = 0; i < reps; i++) {
    const t0 = performance.now();
    ms.topk(queries, corpus, k, { mode });
    best = Math.min(best, performance.now() - t0);
  }
  return { ms: best, stats: ms.lastStats };
}

// GSO/s as docs/benchmarks.md counts them: 2 x Lq x Ld x d per (query, document) pair, whatever the mode does.
export function gso(nq, lq, nd, ld, dim, ms) {
  return (2 * nq * lq * nd * ld * dim) / (ms * 1e6);
}
