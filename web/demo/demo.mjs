// SPDX-License-Identifier: Apache-2.0
// The in-browser demo (web/demo/index.html): loads a packed corpus (data/corpus.maxsim, packed from the
// shipped ColBERTv2 embeddings by scripts/web-demo-data.sh, or a dropped .maxsim file), runs the shipped
// queries in every mode, shows the top 10, per-mode timings, certified == exact, and time per query against
// corpus size (the shipped documents repeated, packed in the page). The outcome is also left in
// window.demoResult for the browser test (tests/wasm/browser_test.py).
import { MaxSim } from '../maxsim.mjs';
import { readNpy } from '../npy.mjs';

const $ = (id) => document.getElementById(id);
const K = 10;

async function fetchBuffer(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`cannot fetch ${url}: HTTP ${r.status}`);
  return r.arrayBuffer();
}

function sets(tokens, offsetsNpy) {
  const off = Array.from(offsetsNpy.data, Number);
  return { tokens: tokens.data, dim: tokens.shape[1], offsets: off };
}

// Milliseconds per call of f, repeated until at least `budget` ms have passed (at least twice).
function timeIt(f, budget = 300) {
  f();  // warm-up (first call compiles the optimising tier)
  let n = 0;
  const t0 = performance.now();
  let t = t0;
  while (n < 2 || t - t0 < budget) {
    f();
    n++;
    t = performance.now();
  }
  return (t - t0) / n;
}

const bitsEqual = (a, b) => a.length === b.length &&
  new Uint32Array(a.buffer, a.byteOffset, a.length).every((v, i) => v === new Uint32Array(b.buffer, b.byteOffset, b.length)[i]);

function showTop(top, corpus, nq) {
  const box = $('results');
  box.textContent = '';
  const ids = corpus.hasIds ? top.ids : null;
  for (let i = 0; i < nq; i++) {
    const t = document.createElement('table');
    t.innerHTML = `<tr><th colspan="4">query ${i}</th></tr><tr><th>rank</th><th>doc</th><th>id</th><th>score</th></tr>`;
    for (let r = 0; r < K; r++) {
      const j = i * K + r;
      if (top.index[j] < 0) break;
      const row = t.insertRow();
      for (const v of [r + 1, top.index[j], ids ? ids[j] : top.index[j], top.scores[j].toPrecision(9)]) {
        row.insertCell().textContent = String(v);
      }
    }
    box.appendChild(t);
  }
}

function chart(points) {
  const W = 520, H = 220, L = 60, B = 36, T = 10, R = 110;
  const xs = points.map((p) => p.docs), ys = points.flatMap((p) => [p.exact, p.certified]);
  const xmax = Math.max(...xs), ymax = Math.max(...ys) * 1.1;
  const X = (x) => L + (W - L - R) * (x / xmax), Y = (y) => H - B - (H - B - T) * (y / ymax);
  const line = (key, color) => `<polyline fill="none" stroke="${color}" stroke-width="2" points="${
    points.map((p) => `${X(p.docs)},${Y(p[key])}`).join(' ')}"/>` + points.map((p) =>
    `<circle cx="${X(p.docs)}" cy="${Y(p[key])}" r="3" fill="${color}"/>`).join('');
  let s = `<svg width="${W}" height="${H}" role="img" aria-label="time per query vs corpus size">`;
  s += `<line x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}" stroke="#888"/><line x1="${L}" y1="${T}" x2="${L}" y2="${H - B}" stroke="#888"/>`;
  for (const p of points) s += `<text x="${X(p.docs)}" y="${H - B + 14}" text-anchor="middle">${p.docs}</text>`;
  for (let i = 0; i <= 4; i++) {
    const v = (ymax * i) / 4;
    s += `<text x="${L - 6}" y="${Y(v) + 4}" text-anchor="end">${v.toFixed(v < 10 ? 2 : 0)}</text>`;
  }
  s += `<text x="${(L + W - R) / 2}" y="${H - 4}" text-anchor="middle">documents in the corpus</text>`;
  s += `<text x="${L + 6}" y="${T + 4}">ms per query</text>`;
  s += line('exact', '#c33') + line('certified', '#36c');
  s += `<text x="${W - R + 8}" y="${T + 14}" fill="#c33">exact</text><text x="${W - R + 8}" y="${T + 30}" fill="#36c">certified</text>`;
  $('chart').innerHTML = s + '</svg>';
}

async function run(ms, corpus, queries, label) {
  $('source').textContent = `${label}: ${corpus.nSets} documents, ${corpus.nVectors} vectors, dim ${corpus.dim}, ${corpus.dtype}`;
  const nq = queries.offsets.length - 1;
  const table = $('timings');
  while (table.rows.length > 1) table.deleteRow(1);
  const timings = {};
  let top = null;
  for (const mode of ['exact', 'certified', 'approximate']) {
    const msCall = timeIt(() => ms.topk(queries, corpus, K, { mode }));
    const stats = ms.lastStats;
    timings[mode] = msCall / nq;
    const row = table.insertRow();
    for (const v of [mode, (msCall / nq).toFixed(3), Math.round((1000 * nq * corpus.nSets) / msCall).toLocaleString(),
      stats.docsPruned]) row.insertCell().textContent = String(v);
    if (mode === 'exact') top = ms.topk(queries, corpus, K, { mode });
  }
  const exact = ms.scores(queries, corpus, { mode: 'exact' });
  const certified = ms.scores(queries, corpus, { mode: 'certified' });
  const same = bitsEqual(exact, certified);
  $('check').innerHTML = same ? '<span class="ok">yes</span>' : '<span class="bad">NO (a library bug)</span>';
  showTop(top, corpus, nq);
  return {
    timings, certifiedEqualsExact: same,
    top: Array.from({ length: nq }, (_, i) => Array.from({ length: K }, (_, r) => ({
      index: top.index[i * K + r], score: top.scores[i * K + r],
      id: top.ids ? String(top.ids[i * K + r]) : null })).filter((h) => h.index >= 0)),
  };
}

async function main() {
  const ms = await MaxSim.load();
  const info = ms.info();
  $('module').textContent = info.module;
  $('kernel').textContent = info.kernel;
  $('load').textContent = `${info.loadMs.toFixed(0)} ms`;
  $('why').textContent = info.why;
  const [corpusBytes, qTok, qOff, dTok, dOff] = await Promise.all([
    fetchBuffer('data/corpus.maxsim'), fetchBuffer('data/queries_tokens.npy'), fetchBuffer('data/queries_offsets.npy'),
    fetchBuffer('data/docs_tokens.npy'), fetchBuffer('data/docs_offsets.npy')]);
  const queries = sets(readNpy(qTok), readNpy(qOff));
  const corpus = await ms.open(corpusBytes);
  const result = await run(ms, corpus, queries, 'data/corpus.maxsim');

  // Time per query against corpus size: the shipped documents repeated 1, 2, 4, 8 times.
  const docs = sets(readNpy(dTok), readNpy(dOff));
  const points = [];
  for (const times of [1, 2, 4, 8]) {
    const n = docs.offsets.length - 1, rows = docs.offsets[n];
    const tokens = new Float32Array(rows * docs.dim * times);
    const offsets = [0];
    for (let c = 0; c < times; c++) {
      tokens.set(docs.tokens, c * rows * docs.dim);
      for (let i = 1; i <= n; i++) offsets.push(c * rows + docs.offsets[i]);
    }
    const big = ms.pack({ tokens, dim: docs.dim, offsets });
    const nq = queries.offsets.length - 1;
    points.push({ docs: big.nSets,
      exact: timeIt(() => ms.topk(queries, big, K, { mode: 'exact' }), 150) / nq,
      certified: timeIt(() => ms.topk(queries, big, K, { mode: 'certified' }), 150) / nq });
    big.dispose();
  }
  chart(points);
  result.scaling = points;
  result.module = info.module;
  result.kernel = info.kernel;
  result.loadMs = info.loadMs;
  window.demoResult = result;
  $('status').textContent = 'done';

  const useFile = async (file) => {
    try {
      const c = await ms.open(file);
      if (c.dim !== queries.dim) throw new Error(`${file.name} has dim ${c.dim}, the queries ${queries.dim}`);
      await run(ms, c, queries, file.name);
      c.dispose();
    } catch (e) {
      $('source').textContent = `${file.name}: ${e.message}`;
    }
  };
  $('file').addEventListener('change', (e) => e.target.files[0] && useFile(e.target.files[0]));
  const drop = $('drop');
  drop.addEventListener('dragover', (e) => { e.preventDefault(); drop.classList.add('over'); });
  drop.addEventListener('dragleave', () => drop.classList.remove('over'));
  drop.addEventListener('drop', (e) => {
    e.preventDefault();
    drop.classList.remove('over');
    if (e.dataTransfer.files[0]) useFile(e.dataTransfer.files[0]);
  });
}

main().catch((e) => {
  $('status').textContent = `error: ${e.message}`;
  window.demoResult = { error: String(e.message ?? e) };
});
