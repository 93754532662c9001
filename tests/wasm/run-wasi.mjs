// SPDX-License-Identifier: Apache-2.0
// Runs a wasm32-wasi command module under node's WASI with the whole file system preopened at "/" (paths must
// be absolute) and the environment passed through: node run-wasi.mjs prog.wasm [args...]. Exit status = the
// program's. Run node with --no-liftoff --experimental-wasm-relaxed-simd (tests/wasm/CMakeLists.txt says why).
import { readFile } from 'node:fs/promises';
import { argv, env, exit } from 'node:process';
import { WASI } from 'node:wasi';

const [file, ...args] = argv.slice(2);
if (!file) {
  console.error('usage: node run-wasi.mjs prog.wasm [args...]');
  exit(2);
}
const wasi = new WASI({ version: 'preview1', args: [file, ...args], env, preopens: { '/': '/' }, returnOnExit: true });
const module = await WebAssembly.compile(await readFile(file));
const imports = wasi.getImportObject ? wasi.getImportObject() : { wasi_snapshot_preview1: wasi.wasiImport };
const instance = await WebAssembly.instantiate(module, imports);
exit(wasi.start(instance));
