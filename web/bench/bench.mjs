// SPDX-License-Identifier: Apache-2.0
// WebAssembly benchmark: GSO/s of MaxSim.topk (k = 10) in exact and certified mode at Lq = 32, Ld = 180 and 300,
// d = 128, 1000 documents, one thread, for each module (relaxed SIMD, SIMD128) in node and (with --python) in
// headless Chromium, against the native `avx2` kernel measured in the same run through the native CLI
// (`maxsim search --isa avx2 --threads 1`, its own search timing) on the same packed file. Also the modules'
// size (raw and gzip -9) and load time. Writes a JSON result file (command, machine, date) and prints a table.
//
//   node --no-liftoff --experimental-wasm-relaxed-simd web/bench/bench.mjs --cli build/lib/cli/maxsim \
//        [--python build-web/venv/bin/python] [--queries 4] [--reps 3] [--out FILE] [--note TEXT]
//
// Data: synthetic ColBERT-like sets (bench-core.mjs), written as .npy into web/bench/data/ (ignored by git) and
// packed by the native CLI; node and the browser open that same file.
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';

import { MaxSim } from '../maxsim.mjs';
import { readNpy, writeNpy } from '../npy.mjs';
import { gso, sliceSets, syntheticSets, timeTopk } from './bench-core.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '..', '..');
const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : dflt;
};
const cli = arg('cli');
if (!cli) {
  console.error('usage: node web/bench/bench.mjs --cli PATH_TO_NATIVE_maxsim [--python PY] [--queries N] [--reps N] [--out FILE]');
  process.exit(2);
}
const NQ = Number(arg('queries', 4)), REPS = Number(arg('reps', 3)), LQ = 32, DIM = 128, ND = 1000, K = 10;
const shapes = [180, 300];
const modes = ['exact', 'certified'];

function writeSets(dir, name, sets) {
  const off = new BigInt64Array(sets.lengths.length + 1);
  sets.lengths.forEach((l, i) => { off[i + 1] = off[i] + BigInt(l); });
  writeFileSync(join(dir, `${name}_tokens.npy`), writeNpy(sets.tokens, [sets.tokens.length / sets.dim, sets.dim]));
  writeFileSync(join(dir, `${name}_offsets.npy`), writeNpy(off, [off.length]));
}

// The CLI's own search timing (stderr, --stats): the best of REPS runs.
function nativeSearch(dir, mode) {
  let best = Infinity, pruned = 0;
  for (let i = 0; i < REPS; i++) {
    const p = spawnSync(cli, ['search', join(dir, 'corpus.maxsim'), join(dir, 'queries_tokens.npy'),
      join(dir, 'queries_offsets.npy'), '-k', String(K), '--mode', mode, '--isa', 'avx2', '--threads', '1', '--stats',
      '--no-progress'], { encoding: 'utf8' });
    if (p.status !== 0) throw new Error(`native search failed: ${p.stderr}`);
    const m = /(?:search|scoring) ([\d.]+) (us|ms|s) /.exec(p.stderr);
    if (!m) throw new Error(`cannot read the native search time from: ${p.stderr}`);
    best = Math.min(best, Number(m[1]) * { us: 1e-3, ms: 1, s: 1e3 }[m[2]]);
    pruned = Number(/documents pruned by their bound (\d+)/.exec(p.stderr)?.[1] ?? 0);
  }
  return { ms: best, docsPruned: pruned };
}

const rows = [];
const dataDirs = {};
for (const ld of shapes) {
  const dir = join(here, 'data', `ld${ld}`);
  mkdirSync(dir, { recursive: true });
  const all = syntheticSets({ lengths: [...new Array(NQ).fill(LQ), ...new Array(ND).fill(ld)], dim: DIM, seed: 2026 + ld });
  writeSets(dir, 'queries', sliceSets(all, 0, NQ));
  writeSets(dir, 'docs', sliceSets(all, NQ, NQ + ND));
  execFileSync(cli, ['pack', join(dir, 'docs_tokens.npy'), join(dir, 'docs_offsets.npy'), '-o', join(dir, 'corpus.maxsim')],
    { stdio: 'ignore' });
  dataDirs[ld] = dir;
  for (const mode of modes) {
    const n = nativeSearch(dir, mode);
    rows.push({ engine: 'native', module: 'avx2', ld, mode, ms: n.ms, docsPruned: n.docsPruned,
      gso: gso(NQ, LQ, ND, ld, DIM, n.ms) });
  }
}

// node: both modules on the same files.
const loads = {};
for (const module of ['relaxed', 'simd128']) {
  const ms = await MaxSim.load({ module });
  loads[module] = ms.info().loadMs;
  const kernel = ms.info().kernel;
  for (const ld of shapes) {
    const dir = dataDirs[ld];
    const q = readNpy(readFileSync(join(dir, 'queries_tokens.npy')));
    const queries = { tokens: q.data, dim: DIM, lengths: new Array(NQ).fill(LQ) };
    const corpus = ms.openBytes(readFileSync(join(dir, 'corpus.maxsim')));
    for (const mode of modes) {
      const t = timeTopk(ms, queries, corpus, { mode, k: K, reps: REPS });
      rows.push({ engine: `node ${process.version}`, module, kernel, ld, mode, ms: t.ms, docsPruned: t.stats.docsPruned,
        gso: gso(NQ, LQ, ND, ld, DIM, t.ms) });
    }
    corpus.dispose();
  }
  ms.dispose();
}

// Chromium: the same measurement in web/bench/index.html.
let browser = null;
const python = arg('python');
if (python) {
  const out = execFileSync(python, [join(here, 'browser_bench.py'), '--queries', String(NQ), '--reps', String(REPS)],
    { encoding: 'utf8', maxBuffer: 1 << 24 });
  browser = JSON.parse(out.slice(out.indexOf('{')));
  for (const r of browser.rows) rows.push({ ...r, engine: browser.engine, gso: gso(NQ, LQ, ND, r.ld, DIM, r.ms) });
}

const native = (ld, mode) => rows.find((r) => r.engine === 'native' && r.ld === ld && r.mode === mode).gso;
for (const r of rows) r.ratioToAvx2 = r.gso / native(r.ld, r.mode);

const sizes = {};
for (const module of ['relaxed', 'simd128']) {
  const b = readFileSync(join(here, '..', `maxsim-${module}.wasm`));
  sizes[module] = { bytes: b.length, gzipBytes: gzipSync(b, { level: 9 }).length };
}
const cpu = (os.cpus()[0]?.model ?? 'unknown').trim();
const result = {
  benchmark: 'wasm_bench', date: new Date().toISOString(), command: process.argv.slice(1).join(' '),
  machine: { cpu, cores: os.cpus().length, os: `${os.type()} ${os.release()}`, node: process.version,
    chromium: browser?.engine ?? null },
  note: arg('note', ''),
  shape: { Lq: LQ, Ld: shapes, N: ND, d: DIM, queries: NQ, k: K, threads: 1, reps: REPS },
  loadMs: { node: loads, chromium: browser?.loadMs ?? null }, sizes, rows,
};
const out = arg('out', join(root, 'build-web', 'wasm_bench.json'));
mkdirSync(dirname(out), { recursive: true });
writeFileSync(out, JSON.stringify(result, null, 1) + '\n');

console.log(`| engine | module | Ld | mode | ms per call (${NQ} queries) | GSO/s | vs native avx2 |`);
console.log('|---|---|---|---|---|---|---|');
for (const r of rows) {
  console.log(`| ${r.engine} | ${r.module} | ${r.ld} | ${r.mode} | ${r.ms.toFixed(1)} | ${r.gso.toFixed(2)} | ${(100 * r.ratioToAvx2).toFixed(0)}% |`);
}
for (const [m, s] of Object.entries(sizes)) console.log(`module ${m}: ${s.bytes} bytes, ${s.gzipBytes} gzip -9; load ${loads[m].toFixed(1)} ms (node)`);
console.log(`wrote ${out}`);
