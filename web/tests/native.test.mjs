// SPDX-License-Identifier: Apache-2.0
// The WebAssembly modules against the native build on the shared real embeddings (../shared/data): a file
// packed by the native CLI loads and scores in JavaScript with the CLI's exact scores and ranking (bit for bit:
// the CLI prints 9 significant digits, which read back to the same f32), every metric and mode; the JavaScript
// packer writes the same bytes as the native one; and the native CLI scores a JavaScript-packed file the same.
// Needs MAXSIM_CLI (the native `maxsim` binary) and MAXSIM_SHARED_DIR (or ../shared beside the checkout);
// skips with the reason otherwise. scripts/lanes/wasm.sh provides both.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { MaxSim } from '../maxsim.mjs';
import { readNpy, writeNpy } from '../npy.mjs';

const cli = process.env.MAXSIM_CLI;
const shared = process.env.MAXSIM_SHARED_DIR ?? fileURLToPath(new URL('../../../shared', import.meta.url));
const data = join(shared, 'data', 'colbert-nanofiqa');
const skip = !cli ? 'MAXSIM_CLI is not set (the native maxsim binary)'
  : !existsSync(join(data, 'docs_tokens.npy')) ? `no shared data at ${data}` : false;

function search(file, metric, mode, k) {
  const out = execFileSync(cli, ['search', file, join(data, 'queries_tokens.npy'), join(data, 'queries_offsets.npy'),
    '-k', String(k), '--metric', metric, '--mode', mode, '--format', 'json', '--no-progress'], { encoding: 'utf8' });
  return JSON.parse(out).results;
}

test('native-packed file scores bit-identically in every module; JS-packed bytes equal the native ones', { skip }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'maxsim-wasm-'));
  try {
    const nativeFile = join(dir, 'native.maxsim');
    // Numeric ids (an int64 .npy; the CLI stores a text file's lines as string ids, which the JavaScript API
    // does not write).
    const ids = readFileSync(join(data, 'docs_ids.txt'), 'utf8').split('\n').filter(Boolean).map(BigInt);
    writeFileSync(join(dir, 'ids.npy'), writeNpy(BigInt64Array.from(ids), [ids.length]));
    execFileSync(cli, ['pack', join(data, 'docs_tokens.npy'), join(data, 'docs_offsets.npy'), '--ids',
      join(dir, 'ids.npy'), '-o', nativeFile], { stdio: 'ignore' });
    const nativeBytes = readFileSync(nativeFile);
    const q = readNpy(readFileSync(join(data, 'queries_tokens.npy')));
    const queries = { tokens: q.data, dim: q.shape[1],
      offsets: Array.from(readNpy(readFileSync(join(data, 'queries_offsets.npy'))).data, Number) };
    const d = readNpy(readFileSync(join(data, 'docs_tokens.npy')));
    const docs = { tokens: d.data, dim: d.shape[1],
      offsets: Array.from(readNpy(readFileSync(join(data, 'docs_offsets.npy'))).data, Number) };
    const k = 10;
    const mods = [await MaxSim.load({ module: 'simd128' }), await MaxSim.load()];
    for (const ms of mods) {
      const label = ms.info().module;
      const jsPacked = ms.pack(docs, ids);
      assert.ok(Buffer.from(jsPacked.toArrayBuffer()).equals(nativeBytes), `${label}: packed bytes differ from the CLI's`);
      const corpus = await ms.open(nativeBytes, { validation: 'deep' });
      for (const metric of ['dot', 'cosine']) {
        for (const mode of ['exact', 'certified']) {
          const want = search(nativeFile, metric, mode, k);
          const top = ms.topk(queries, corpus, k, { metric, mode });
          for (const r of want) {
            r.hits.forEach((h, rank) => {
              const j = r.query * k + rank;
              assert.equal(top.index[j], h.doc, `${label} ${metric} ${mode} query ${r.query} rank ${rank + 1}`);
              assert.equal(top.ids[j], BigInt(h.doc_id ?? h.id));
              assert.equal(top.scores[j], Math.fround(h.score), `${label} ${metric} ${mode} q${r.query} r${rank + 1}`);
            });
          }
        }
      }
      // The reverse: the native CLI on the JavaScript-packed file.
      const jsFile = join(dir, `${label}.maxsim`);
      writeFileSync(jsFile, Buffer.from(jsPacked.toArrayBuffer()));
      assert.deepEqual(search(jsFile, 'dot', 'certified', k), search(nativeFile, 'dot', 'certified', k));
      corpus.dispose();
      jsPacked.dispose();
      ms.dispose();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
