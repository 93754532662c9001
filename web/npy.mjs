// SPDX-License-Identifier: Apache-2.0
// .npy files as the shared embeddings come (little-endian float32 / float16 / int64 / uint64, C order):
// readNpy(arrayBuffer) -> { dtype, shape, data } with data a typed array over a copy of the values
// (Float32Array, Uint16Array of f16 bits, BigInt64Array, BigUint64Array); throws an Error naming what is wrong.
// writeNpy(typedArray, shape) -> Uint8Array of a version 1.0 file.
const TYPES = { '<f4': Float32Array, '<f2': Uint16Array, '<i8': BigInt64Array, '<u8': BigUint64Array };

export function readNpy(buffer) {
  const bytes = new Uint8Array(buffer);
  const magic = [0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59];
  if (bytes.length < 10 || magic.some((m, i) => bytes[i] !== m)) throw new Error('not a .npy file (bad magic)');
  const v = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const major = bytes[6];
  const headerLen = major === 1 ? v.getUint16(8, true) : v.getUint32(8, true);
  const start = (major === 1 ? 10 : 12) + headerLen;
  const header = new TextDecoder().decode(bytes.subarray(major === 1 ? 10 : 12, start));
  const descr = /'descr':\s*'([^']+)'/.exec(header)?.[1];
  const fortran = /'fortran_order':\s*True/.test(header);
  const shape = (/'shape':\s*\(([^)]*)\)/.exec(header)?.[1] ?? '').split(',').map((s) => s.trim()).filter(Boolean)
    .map(Number);
  const Type = TYPES[descr];
  if (!Type) throw new Error(`unsupported .npy dtype ${descr} (float32, float16, int64, uint64)`);
  if (fortran) throw new Error('Fortran-order .npy files are not supported');
  const count = shape.reduce((a, b) => a * b, 1);
  if (start + count * Type.BYTES_PER_ELEMENT > bytes.length) throw new Error('.npy file is truncated');
  const data = new Type(bytes.slice(start, start + count * Type.BYTES_PER_ELEMENT).buffer);
  return { dtype: descr, shape, data };
}

const DESCR = new Map([[Float32Array, '<f4'], [Uint16Array, '<f2'], [BigInt64Array, '<i8'], [BigUint64Array, '<u8']]);

export function writeNpy(typed, shape) {
  const descr = DESCR.get(typed.constructor);
  if (!descr) throw new Error('writeNpy takes a Float32Array, Uint16Array (f16), BigInt64Array or BigUint64Array');
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': (${shape.join(', ')}${shape.length === 1 ? ',' : ''}), }`;
  header += ' '.repeat(63 - ((10 + header.length) % 64)) + '\n';
  const out = new Uint8Array(10 + header.length + typed.byteLength);
  out.set([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 1, 0]);
  new DataView(out.buffer).setUint16(8, header.length, true);
  out.set(new TextEncoder().encode(header), 10);
  out.set(new Uint8Array(typed.buffer, typed.byteOffset, typed.byteLength), 10 + header.length);
  return out;
}
