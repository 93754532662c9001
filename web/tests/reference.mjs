// SPDX-License-Identifier: Apache-2.0
// Independent JavaScript references for the node tests: the canonical f32 arithmetic of docs/semantics.md
// (sequential fused multiply-add chain, strict > max, double sum rounded once; cosine with the packed norms)
// written from the spec, and the float64 MaxSim with the spec's error bound.

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

// The adjacent f32 from f (a finite f32) toward the larger (up = true) or smaller values.
function nextF32(f, up) {
  if (f === 0) return up ? 1.401298464324817e-45 : -1.401298464324817e-45;
  f32[0] = f;
  if ((f > 0) === up) u32[0]++; else u32[0]--;
  return f32[0];
}

// fl(a * b + c) rounded once, for f32 values a, b, c: the exact product in double, the exact sum as s + e
// (TwoSum), s rounded to f32 unless s is exactly halfway between two f32 and e != 0 (then e picks the side).
export function fma32(a, b, c) {
  const p = a * b;
  const s = p + c;
  const bb = s - p;
  const e = (p - (s - bb)) + (c - bb);
  const f = Math.fround(s);
  if (e === 0 || f === s) return f;
  const g = nextF32(f, s > f);
  if ((f + g) / 2 !== s) return f;
  return (e > 0) === (g > f) ? g : f;
}

// f32 values of a token set's rows (tokens: Float32Array, or Uint16Array of bf16 / f16 bits).
export function widen(tokens, dtype) {
  if (dtype === 'f32' || tokens instanceof Float32Array) return tokens;
  const out = new Float32Array(tokens.length);
  for (let i = 0; i < tokens.length; i++) {
    const h = tokens[i];
    if (dtype === 'bf16') {
      u32[0] = h << 16;
      out[i] = f32[0];
    } else {
      const e = (h >> 10) & 31, m = h & 1023, sign = h & 0x8000 ? -1 : 1;
      out[i] = sign * (e === 0 ? m * 2 ** -24 : e === 31 ? (m ? NaN : Infinity) : (1 + m / 1024) * 2 ** (e - 15));
    }
  }
  return out;
}

// The packed norm: f32 of sqrt of the double sum of squares over 8 lanes (lane = k mod 8), lanes combined as
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) (packing/src/quantize_ref.cc).
export function norm32(v, off, dim) {
  const l = [0, 0, 0, 0, 0, 0, 0, 0];
  for (let k = 0; k < dim; k++) l[k % 8] += v[off + k] * v[off + k];
  return Math.fround(Math.sqrt(((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))));
}

const invNorm = (n) => (n >= 2 ** -126 ? Math.fround(1 / n) : 0);

// Canonical scores [nq * nd] of query sets against document sets ({ values: f32 rows, dim, offsets }).
export function canonicalScores(Q, D, metric) {
  const dim = Q.dim;
  const out = new Float32Array((Q.offsets.length - 1) * (D.offsets.length - 1));
  const dinv = [];
  for (let t = 0; t < D.offsets[D.offsets.length - 1]; t++) dinv.push(invNorm(norm32(D.values, t * dim, dim)));
  for (let i = 0; i + 1 < Q.offsets.length; i++) {
    for (let j = 0; j + 1 < D.offsets.length; j++) {
      if (D.offsets[j + 1] === D.offsets[j]) {
        out[i * (D.offsets.length - 1) + j] = -Infinity;
        continue;
      }
      let sum = 0;
      for (let s = Q.offsets[i]; s < Q.offsets[i + 1]; s++) {
        let best = -Infinity;
        for (let t = D.offsets[j]; t < D.offsets[j + 1]; t++) {
          let acc = 0;
          for (let k = 0; k < dim; k++) acc = fma32(Q.values[s * dim + k], D.values[t * dim + k], acc);
          const key = metric === 'cosine' ? Math.fround(acc * dinv[t]) : acc;
          if (key > best) best = key;
        }
        sum += metric === 'cosine' ? Math.fround(best * invNorm(norm32(Q.values, s * dim, dim))) : best;
      }
      out[i * (D.offsets.length - 1) + j] = Math.fround(sum);
    }
  }
  return out;
}

// float64 MaxSim (dot) and the spec's bound on |exact f32 - float64| (docs/semantics.md).
export function float64Scores(Q, D) {
  const dim = Q.dim;
  const gamma = ((dim + 2) * 2 ** -24) / (1 - (dim + 2) * 2 ** -24);
  const nd = D.offsets.length - 1;
  const score = [], bound = [];
  for (let i = 0; i + 1 < Q.offsets.length; i++) {
    for (let j = 0; j < nd; j++) {
      let sum = 0, b = 0;
      for (let s = Q.offsets[i]; s < Q.offsets[i + 1]; s++) {
        let best = -Infinity, worst = 0;
        for (let t = D.offsets[j]; t < D.offsets[j + 1]; t++) {
          let dot = 0, abs = 0;
          for (let k = 0; k < dim; k++) {
            dot += Q.values[s * dim + k] * D.values[t * dim + k];
            abs += Math.abs(Q.values[s * dim + k] * D.values[t * dim + k]);
          }
          best = Math.max(best, dot);
          worst = Math.max(worst, gamma * abs + dim * 2 ** -148);
        }
        sum += best;
        b += worst;
      }
      score.push(sum);
      bound.push((b + 2 * 2 ** -24 * Math.abs(sum)) * 1.01);
    }
  }
  return { score, bound };
}
