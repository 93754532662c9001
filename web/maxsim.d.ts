// SPDX-License-Identifier: Apache-2.0
// Types of web/maxsim.mjs (libmaxsim for JavaScript, docs/wasm.md).

export type Dtype = 'f32' | 'f16' | 'bf16';
export type Metric = 'dot' | 'cosine';
export type Mode = 'exact' | 'certified' | 'approximate';
export type Validation = 'standard' | 'deep' | 'fast';

/** Token sets: rows of `dim` values; set i is rows [offsets[i], offsets[i+1]), or given by lengths. */
export interface TokenSets {
  /** Float32Array (dtype 'f32'), or Uint16Array of f16 / bf16 bits (dtype required). */
  tokens: Float32Array | Uint16Array;
  dim: number;
  lengths?: ArrayLike<number>;
  offsets?: ArrayLike<number>;
  dtype?: Dtype;
}

export interface ScoreOptions {
  metric?: Metric; // default 'dot'
  mode?: Mode; // default 'exact'
}

export interface TopK {
  /** [nQueries * k], best first; -Infinity past the corpus' end. */
  scores: Float32Array;
  /** [nQueries * k] document indices; -1 past the corpus' end. */
  index: Int32Array;
  /** [nQueries * k] corpus ids (2^64 - 1 past the end), or null when the corpus has none. */
  ids: BigUint64Array | null;
}

export interface Stats {
  pairs: number;
  queryTokens: number;
  refined: number;
  multiCandidate: number;
  docsPruned: number;
}

export interface Info {
  /** Which module was loaded, and why (relaxed SIMD validated and probed, or not). */
  module: 'relaxed' | 'simd128';
  why: string;
  /** The CPU kernel that runs: 'wasm-relaxed', 'wasm-simd128' or 'scalar'. */
  kernel: string;
  version: string;
  /** Milliseconds from load() to a usable module (fetch, compile, instantiate, probe). */
  loadMs: number;
  /** The library's own report (features, kernels and why, plugins, backend). */
  report: string;
}

export interface LoadOptions {
  module?: 'auto' | 'relaxed' | 'simd128';
  relaxedUrl?: string | URL;
  simd128Url?: string | URL;
  /** Force a kernel by name (as MAXSIM_ISA), e.g. 'scalar'. */
  isa?: string;
}

/** An error from the library (status: its name, e.g. 'MAXSIM_ERR_NON_FINITE'; message: the library's). */
export class MaxSimError extends Error {
  readonly status: string;
}

/** A validated, read-only packed corpus held in a module's memory until dispose(). */
export class PackedCorpus {
  readonly nSets: number;
  readonly nVectors: number;
  readonly dim: number;
  readonly dtype: Dtype;
  readonly hasIds: boolean;
  readonly byteLength: number;
  readonly module: MaxSim;
  /** A copy of the packed bytes (the .maxsim file format). */
  toArrayBuffer(): ArrayBuffer;
  toBlob(): Blob;
  ids(): BigUint64Array | null;
  dispose(): void;
  [Symbol.dispose](): void;
}

export class MaxSim {
  /** Corpora and modules garbage collected without dispose(), released by the FinalizationRegistry. */
  static leaksCollected: number;
  /** Loads the relaxed-SIMD module where it validates and its probe passes, else the SIMD128 one. */
  static load(options?: LoadOptions): Promise<MaxSim>;
  info(): Info;
  /** Counters of the last scores()/topk() call. */
  lastStats?: Stats;
  pack(sets: TokenSets, ids?: ArrayLike<number | bigint> | null): PackedCorpus;
  open(source: ArrayBuffer | ArrayBufferView | Blob | Response, options?: { validation?: Validation }): Promise<PackedCorpus>;
  openBytes(bytes: Uint8Array, options?: { validation?: Validation }): PackedCorpus;
  /** [nQueries * corpus.nSets] scores, row-major. */
  scores(queries: TokenSets, corpus: PackedCorpus, options?: ScoreOptions): Float32Array;
  topk(queries: TokenSets, corpus: PackedCorpus, k: number, options?: ScoreOptions): TopK;
  dispose(): void;
  [Symbol.dispose](): void;
}
