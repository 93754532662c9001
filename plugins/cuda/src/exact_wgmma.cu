// Hopper (sm_90a) exact forward for long queries: wgmma with the query stationary in registers.
//
// ExactWgmmaKernel: persistent blocks of WGS warpgroups; a block owns one row group (WGS x QS x 64 query rows)
// of a strided list of pairs. Each warpgroup holds QS sets of 64 query rows as wgmma A fragments in registers
// (loaded once per query); the document streams through shared memory in 128-token stages and every stage
// feeds wgmma.m64n128k16 (B = 128 document tokens from shared memory, 8 k steps for d <= 128). The row max of
// each 64 x 128 accumulator tile is folded into a running max per query row; nothing of size Lq x Ld leaves
// the register file. The stage ring is guarded by mbarriers (full: every thread's copies of a stage landed;
// empty: every thread's wgmma reading it finished), so warpgroups are not kept in step and one warpgroup's
// fold overlaps the others' tensor-core work.
//
// Numbers: the same bits as every other 16-bit kernel (kernels.h). A similarity is the chain of 8 k16
// tensor-core steps from a +0 start, and wgmma step s sums exactly the dimensions that mma.sync step s sums in
// device_common.cuh's fixed k order: {32c + 8u + 4h + j : u, j in 0..3} for s = 2c + h. Within a step the
// placement differs (the 4 contiguous dimensions 32c + 8u + 4h + 0..3 sit at logical k 4u..4u+3, so that a
// document row can be copied in 8-byte pieces; 4-byte pieces, which keep mma.sync's placement, made the copies
// the bottleneck: visual 0.76 ms against 0.60), and the query fragments follow that placement. That a k16 step
// does not depend on the order of its 16 products is what the tensor cores do, not something PTX promises:
// gpu_conformance_test (LongQueryWgmmaKernelEqualsMmaSync) checks the bits against the mma.sync kernel
// (MAXSIM_CUDA_WGMMA=0), against the argmax path and against certified refinement on random, clustered,
// near-tie, duplicate and large-norm data, every run.
//
// Scope: bf16/f16, 96 < dim <= 128, 128- or 256-row groups, values only (argmax requests, i.e. the training
// forward, use ExactTcSmemKernel), dot or cosine, with or without a document mask. Compiled only for sm_90a;
// elsewhere the kernel body is empty and WgmmaUsable() says no.
#include <math.h>

#include <algorithm>
#include <atomic>
#include <type_traits>
#include <cstdlib>
#include <cstring>

#include "forward_common.cuh"

namespace mscuda {
namespace {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MAXSIM_HAVE_WGMMA 1
#endif

// 1 in the module compiled for sm_90a, 0 in the others: read back by the host to learn what the loaded module
// can do (a PTX JIT for a later GPU, or a build without sm_90a, must not launch the kernel).
__device__ int g_wgmma_compiled =
#if defined(MAXSIM_HAVE_WGMMA)
    1;
#else
    0;
#endif

constexpr int kWgTokens = 128;                      // document tokens per stage (wgmma N)
constexpr int kWgRegionBytes = kWgTokens * 128;     // 64 logical k positions x 2 bytes per token
constexpr int kWgStageBytes = 2 * kWgRegionBytes;   // 128 logical k positions

#if defined(MAXSIM_HAVE_WGMMA)  // the device helpers exist only in the sm_90a pass

// Shared-memory matrix descriptor: 128-byte swizzle, K-major, 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t SmemDesc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

__device__ __forceinline__ void CpAsync8(uint32_t smem, const void* gmem, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem), "l"(gmem), "r"(pred ? 8 : 0));
}
// cp.async writes through the generic proxy; wgmma reads through the async proxy.
__device__ __forceinline__ void FenceProxyAsync() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void WgFence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void WgCommit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void WgWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads across a wgmma wait.
__device__ __forceinline__ void PinAcc(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// mbarriers (shared::cta): init, arrive, the cp.async arrive (fires when this thread's prior copies land; it
// does not add to the pending count, so the init count includes it), and the parity wait.
__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void MbarArriveCopies(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// D (64 x 128 f32: this thread's 64 values) = A (registers, 4 x 32 bits) x B (shared-memory descriptor) + D,
// or A x B when sd == 0. TY: the 16-bit input type's PTX name.
#define MAXSIM_WGMMA_M64N128K16(TY) \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " \
      "{" \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(sd))

template <typename T>
__device__ __forceinline__ void Wgmma(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                      uint64_t desc, int sd) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    MAXSIM_WGMMA_M64N128K16("bf16");
  } else {
    MAXSIM_WGMMA_M64N128K16("f16");
  }
}
#undef MAXSIM_WGMMA_M64N128K16

// One 64 x 128 tile: 8 k steps over the stage at `stage`. qa / qc: rows g / g+8 of this warp's 16 rows,
// 32-dimension chunk c as one uint4 (device_common.cuh: step 2c uses .x/.y, step 2c+1 .z/.w). Step 0 runs with
// scale-d = 0 (D = A*B) instead of adding a zeroed accumulator: the same value as mma.sync's +0 start except
// that an exact zero may come out as -0 (where the +0 start gives +0); the folds map -0 back to +0 (below).
template <typename T>
__device__ __forceinline__ void IssueTile(float (&d)[64], const uint4 (&qa)[4], const uint4 (&qc)[4],
                                          uint32_t stage) {
  WgFence();
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    const int c = s >> 1;
    const uint32_t a0 = (s & 1) ? qa[c].z : qa[c].x, a1 = (s & 1) ? qc[c].z : qc[c].x;
    const uint32_t a2 = (s & 1) ? qa[c].w : qa[c].y, a3 = (s & 1) ? qc[c].w : qc[c].y;
    Wgmma<T>(d, a0, a1, a2, a3, SmemDesc(stage + (s >> 2) * kWgRegionBytes + (s & 3) * 32), s > 0);
  }
  WgCommit();
  PinAcc(d);
}

// Folds one finished tile into the running maxima of rows g (ra) and g+8 (rb). Lane (g, t) holds, for n8 block
// j, columns 8j + 2t and 8j + 2t + 1 of rows g (d[4j], d[4j+1]) and g+8 (d[4j+2], d[4j+3]).
__device__ __forceinline__ void FoldTileMax(const ForwardArgs& a, const float (&d)[64], uint64_t db, uint64_t ld,
                                            uint64_t base, bool plain, float& ra, float& rb, bool& saw_kept) {
  const int t = threadIdx.x & 3;
  if (plain && base + kWgTokens <= ld) {
    // Two independent reduction trees (rows g and g+8), 4 levels deep instead of a 32-long chain.
    float m[8], n[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      m[j] = fmaxf(fmaxf(d[4 * j], d[4 * j + 1]), fmaxf(d[4 * j + 32], d[4 * j + 33]));
      n[j] = fmaxf(fmaxf(d[4 * j + 2], d[4 * j + 3]), fmaxf(d[4 * j + 34], d[4 * j + 35]));
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      m[j] = fmaxf(m[j], m[j + 4]);
      n[j] = fmaxf(n[j], n[j + 4]);
    }
    m[0] = fmaxf(fmaxf(m[0], m[2]), fmaxf(m[1], m[3]));
    n[0] = fmaxf(fmaxf(n[0], n[2]), fmaxf(n[1], n[3]));
    ra = fmaxf(ra, m[0]);
    rb = fmaxf(rb, n[0]);
    saw_kept = true;
    return;
  }
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const uint64_t col = base + 8 * j + 2 * t + e;
      const bool keep = col < ld && a.d.Kept(db + col);
      if (keep) {
        const float w = a.cosine ? InvNorm(RowNorm(a.d, db + col)) : 1.0f;
        // + 0.0f: -0 -> +0 before the weight (scale-d = 0 start, IssueTile), so keys match the mma.sync chain's.
        const float va = a.cosine ? (d[4 * j + e] + 0.0f) * w : d[4 * j + e];
        const float vb = a.cosine ? (d[4 * j + 2 + e] + 0.0f) * w : d[4 * j + 2 + e];
        ra = fmaxf(ra, va);
        rb = fmaxf(rb, vb);
        saw_kept = true;
      }
    }
  }
}

#endif  // MAXSIM_HAVE_WGMMA

// Persistent: grid = G x CPG blocks; block (c, grp) serves row group grp of pairs c, c + CPG, c + 2 CPG, ...
// (the G blocks of a pair run at about the same time, so a document is read from memory once and then from L2).
// The two warpgroups are not kept in step: the stage ring is guarded by mbarriers (full: every thread's copies
// of the tile landed; empty: every thread's wgmma reading it finished), so one warpgroup's folds overlap the
// other's tensor-core work. Every thread copies its share of each tile `ahead` tiles ahead, across pairs.
template <typename T, int WGS, int QS, int S, int BPS>
__global__ void __launch_bounds__(WGS * 128, BPS) ExactWgmmaKernel(const ForwardArgs a, uint32_t cpg, int ahead) {
#if defined(MAXSIM_HAVE_WGMMA)
  extern __shared__ uint8_t smem_raw[];
  constexpr int kThreads = WGS * 128, kRows = WGS * QS * 64;
  __shared__ float s_term[kRows];
  __shared__ __align__(8) uint64_t s_full[S], s_empty[S];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wq = warp & 3;
  const int g = lane >> 2, t = lane & 3;
  const uint32_t G = a.part.groups;
  const uint32_t grp = blockIdx.x % G;
  const uint64_t c0 = blockIdx.x / G;
  const uint32_t r0b = grp * kRows;
  const uint32_t dim = a.q.dim;
  const uint64_t qrb = a.q.row_bytes, drb = a.d.row_bytes;
  const uint32_t full0 = static_cast<uint32_t>(__cvta_generic_to_shared(s_full));
  const uint32_t empty0 = static_cast<uint32_t>(__cvta_generic_to_shared(s_empty));
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      MbarInit(full0 + 8 * s, kThreads);
      MbarInit(empty0 + 8 * s, kThreads);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  const uint32_t sraw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t sbase = (sraw + 1023u) & ~1023u;  // the 128-byte swizzle repeats every 1024 bytes
  // Tiles of pair p for this block's rows: none when the query has no row in this group.
  auto pair_tiles = [&](uint64_t p, uint64_t* db, uint64_t* ld) -> uint64_t {
    uint64_t qi, dj;
    a.pairs.Resolve(p, &qi, &dj);
    *db = a.d.Begin(dj);
    *ld = a.d.End(dj) - *db;
    const uint64_t lq = a.q.End(qi) - a.q.Begin(qi);
    if (grp > 0 && r0b >= lq) return 0;
    return (*ld + kWgTokens - 1) / kWgTokens;
  };

  // Producer cursor: the next tile to copy is tile `pt` of pair `pp` (document rows from pdb, pld tokens).
  // Copy assignment: thread tid always moves 8-byte piece pc (dims 8pc..8pc+3 = 32c + 8u + 4h + 0..3) of
  // tokens tok0, tok0 + 8, ...; the piece is k step s = 2c + h's dimension set quarter u, placed at logical k
  // 4u..4u+3 of that step (the query fragments below use the same placement).
  const int pc = tid & 31, tok0 = tid >> 5;
  const int cc = pc >> 3, uu = (pc >> 1) & 3, hh = pc & 1;
  const int ks = 2 * cc + hh;
  const uint32_t dst_off = static_cast<uint32_t>(ks >> 2) * kWgRegionBytes + 8 * (uu & 1);
  const int chunk = 2 * (ks & 3) + (uu >> 1);
  const bool pc_in_dim = static_cast<uint32_t>(4 * pc) < dim;
  uint64_t pp = c0, pt = 0, pdb = 0, pld = 0, pn = 0;
  uint64_t produced = 0;
  auto skip_done = [&]() {
    while (pp < a.pairs.n_pairs && pt >= pn) {
      pp += cpg;
      pt = 0;
      pn = pp < a.pairs.n_pairs ? pair_tiles(pp, &pdb, &pld) : 0;
    }
  };
  if (pp < a.pairs.n_pairs) pn = pair_tiles(pp, &pdb, &pld);
  skip_done();
  auto produce = [&]() {
    if (pp >= a.pairs.n_pairs) return;
    const uint32_t s = static_cast<uint32_t>(produced % S);
    if (produced >= S) MbarWait(empty0 + 8 * s, static_cast<uint32_t>((produced / S - 1) & 1));
    const uint32_t st = sbase + s * kWgStageBytes + dst_off;
    const uint8_t* dbase = a.d.orig + pdb * drb;
#pragma unroll
    for (int i = 0; i < kWgTokens * 32 / kThreads; ++i) {
      const int tok = tok0 + i * (kThreads / 32);
      const uint64_t n = pt * kWgTokens + tok;
      const bool pred = pc_in_dim && n < pld;
      const uint8_t* src = dbase + (pred ? n * drb + pc * 8 : 0);
      CpAsync8(st + tok * 128 + ((chunk ^ (tok & 7)) << 4), src, pred);
    }
    MbarArriveCopies(full0 + 8 * s);
    ++produced;
    ++pt;
    skip_done();
  };
#pragma unroll 1
  for (int s = 0; s < ahead; ++s) produce();

  const bool plain = a.d.mask == nullptr && !a.cosine;
  float acc0[64], acc1[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc0[i] = acc1[i] = 0.0f;  // never read (scale-d = 0), but defined
  uint4 qa[QS][4], qc[QS][4];
  uint64_t loaded_q = ~0ull, consumed = 0;
  for (uint64_t p = c0; p < a.pairs.n_pairs; p += cpg) {
    uint64_t qi, dj;
    a.pairs.Resolve(p, &qi, &dj);
    const uint64_t qb = a.q.Begin(qi), lq = a.q.End(qi) - qb;
    if (grp > 0 && r0b >= lq) continue;  // no rows here (the producer skipped it too)
    const uint64_t db = a.d.Begin(dj), ld = a.d.End(dj) - db;
    if (qi != loaded_q) {
      // This warpgroup's two 64-row sets: rows r0b + wg*128 + qs*64 + wq*16 + g (+8). Every wgmma that read the
      // previous fragments has completed (each tile ends with wait_group 0).
      const uint8_t* qbase = a.q.orig + qb * qrb;
      // Lane t's A elements at logical k 2t, 2t+1 / 2t+8, 2t+9 of step 2c+h are, with the placement above, dims
      // 32c + 8(t/2) + 4h + 2(t%2) + {0,1} / the same + 16: word 2h + t%2 of two 16-byte row slices.
      // qa[qs][c] = {step 2c a0, step 2c a2, step 2c+1 a0, step 2c+1 a2} (IssueTile's order); qc: row + 8.
      auto frag = [&](uint64_t r, int c) -> uint4 {
        const uint32_t off = 32 * c + 8 * (t >> 1);
        if (r >= lq || off >= dim) return Zero4();
        const uint4 lo = Ld16(qbase + r * qrb + off * 2);
        const uint4 hi4 = off + 16 < dim ? Ld16(qbase + r * qrb + (off + 16) * 2) : Zero4();
        return (t & 1) ? make_uint4(lo.y, hi4.y, lo.w, hi4.w) : make_uint4(lo.x, hi4.x, lo.z, hi4.z);
      };
#pragma unroll
      for (int qs = 0; qs < QS; ++qs) {
        const uint64_t ra = r0b + wg * QS * 64 + qs * 64 + wq * 16 + g, rb = ra + 8;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          qa[qs][c] = frag(ra, c);
          qc[qs][c] = frag(rb, c);
        }
      }
      loaded_q = qi;
    }
    float run[QS][2];
#pragma unroll
    for (int qs = 0; qs < QS; ++qs) run[qs][0] = run[qs][1] = -INFINITY;
    bool saw_kept = false;
    const uint64_t ntiles = (ld + kWgTokens - 1) / kWgTokens;
    for (uint64_t tile = 0; tile < ntiles; ++tile, ++consumed) {
      const uint32_t s = static_cast<uint32_t>(consumed % S);
      MbarWait(full0 + 8 * s, static_cast<uint32_t>((consumed / S) & 1));
      FenceProxyAsync();  // the copies (generic proxy) before this thread's wgmma reads (async proxy)
      const uint32_t st = sbase + s * kWgStageBytes;
      // Both row sets are issued, the next copies go out while they run, then set 0 is folded during set 1.
      // (Folding set 1 of the previous tile during set 0 of this one, across iterations, makes ptxas
      // serialise every wgmma: ptxas report C7514.)
      if constexpr (QS == 2) {
        IssueTile<T>(acc0, qa[0], qc[0], st);
        IssueTile<T>(acc1, qa[QS - 1], qc[QS - 1], st);
        produce();
        WgWait<1>();
        PinAcc(acc0);
        FoldTileMax(a, acc0, db, ld, tile * kWgTokens, plain, run[0][0], run[0][1], saw_kept);
        WgWait<0>();
        PinAcc(acc1);
        MbarArrive(empty0 + 8 * s);  // this thread's reads of the stage are done
        FoldTileMax(a, acc1, db, ld, tile * kWgTokens, plain, run[1][0], run[1][1], saw_kept);
      } else {
        IssueTile<T>(acc0, qa[0], qc[0], st);
        produce();
        WgWait<0>();
        PinAcc(acc0);
        MbarArrive(empty0 + 8 * s);  // this thread's reads of the stage are done
        FoldTileMax(a, acc0, db, ld, tile * kWgTokens, plain, run[0][0], run[0][1], saw_kept);
      }
    }
#pragma unroll
    for (int qs = 0; qs < QS; ++qs) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v = run[qs][h];
        v = fmaxf(v, __shfl_xor_sync(kFull, v, 1));
        v = fmaxf(v, __shfl_xor_sync(kFull, v, 2));
        // A dot-product maximum of -0 is the mma.sync chain's +0 (IssueTile); cosine keys were fixed per element.
        run[qs][h] = a.cosine ? v : v + 0.0f;
      }
    }
    if (G == 1) {
      // One group covers the query: the block sums its rows (two block barriers per pair).
      const bool doc_nonempty = a.d.mask ? __syncthreads_or(saw_kept) != 0 : (__syncthreads(), ld > 0);
      if (t == 0) {
#pragma unroll
        for (int qs = 0; qs < QS; ++qs) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t r = wg * QS * 64 + qs * 64 + wq * 16 + g + 8 * h;
            float term = 0.0f;
            if (r < lq && a.q.Kept(qb + r)) {
              term = a.cosine ? run[qs][h] * InvNorm(RowNorm(a.q, qb + r)) : run[qs][h];
            }
            s_term[r] = term;
          }
        }
      }
      __syncthreads();
      if (tid == 0) {
        double sum = 0.0;
        for (uint64_t r = 0; r < lq; ++r) sum += static_cast<double>(s_term[r]);
        *a.pairs.ScorePtr(p, qi, dj) = doc_nonempty ? static_cast<float>(sum) : -INFINITY;
      }
    } else if (t == 0) {
      // Partials (finalize sums the groups and decides emptiness from the mask).
#pragma unroll
      for (int qs = 0; qs < QS; ++qs) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t rl = wg * QS * 64 + qs * 64 + wq * 16 + g + 8 * h;
          const uint64_t r = r0b + rl;
          if (r < lq) {
            float term = 0.0f;
            if (a.q.Kept(qb + r)) term = a.cosine ? run[qs][h] * InvNorm(RowNorm(a.q, qb + r)) : run[qs][h];
            const uint64_t slot = (p * G + grp) * a.part.group_rows + rl;
            a.part.term[slot] = term;
            a.part.arg[slot] = -1;
          }
        }
      }
    }
  }
#endif
}

template <typename T, int WGS, int QS, int S, int BPS>
cudaError_t LaunchWgmmaShape(const ForwardArgs& a, cudaStream_t stream) {
  const int smem = S * kWgStageBytes + 1024;  // + alignment slack for the 1024-byte swizzle period
  const cudaError_t e = AllowDynamicSmemOnce<ExactWgmmaKernel<T, WGS, QS, S, BPS>>(smem);
  if (e != cudaSuccess) return e;
  // Stages copied ahead: S - 1 (all but the one being read; producing waits for the stage of the tile before).
  // H100, 2026-11-24: q128 0.120-0.122 ms against 0.129-0.131 with S - 2, visual 0.545-0.548 against 0.559-0.560.
  // MAXSIM_CUDA_WGMMA_AHEAD=1..S-1 overrides it, for measurement.
  static const int ahead_env = [] {
    const char* v = std::getenv("MAXSIM_CUDA_WGMMA_AHEAD");
    return v == nullptr ? 0 : std::atoi(v);
  }();
  const int ahead = ahead_env >= 1 && ahead_env <= S - 1 ? ahead_env : S - 1;
  // BPS resident blocks per SM, G blocks per pair at a time.
  const uint64_t G = a.part.groups;
  const uint64_t per_group = std::max<uint64_t>(1, static_cast<uint64_t>(BPS) * SmCount() / G);
  const uint64_t cpg = std::min<uint64_t>(per_group, a.pairs.n_pairs);
  const uint64_t blocks = G * cpg;
  if (blocks > 0x7fffffffull) return cudaErrorInvalidConfiguration;
  ExactWgmmaKernel<T, WGS, QS, S, BPS>
      <<<static_cast<unsigned>(blocks), WGS * 128, smem, stream>>>(a, static_cast<uint32_t>(cpg), ahead);
  return cudaGetLastError();
}

// Block shapes (H100, bf16, 2026-11-24, visual shape: 4 x 64 rows 0.595 ms against 2 x 128 rows 0.622-0.628):
//  - 256-row blocks: 4 warpgroups of one 64-row set, 4 stages (129 KB, one block per SM, 128 registers);
//  - 128-row blocks: 2 warpgroups of one set, 3 stages (97 KB, two blocks per SM).
// MAXSIM_CUDA_WGMMA_SHAPE=2x2 selects 2 warpgroups of two 64-row sets (255 registers), for measurement.
template <typename T>
cudaError_t LaunchWgmmaT(const ForwardArgs& a, cudaStream_t stream) {
  if (a.part.group_rows == 128) return LaunchWgmmaShape<T, 2, 1, 3, 2>(a, stream);
  static const bool two_sets = [] {
    const char* v = std::getenv("MAXSIM_CUDA_WGMMA_SHAPE");
    return v != nullptr && std::strcmp(v, "2x2") == 0;
  }();
  return two_sets ? LaunchWgmmaShape<T, 2, 2, 4, 1>(a, stream) : LaunchWgmmaShape<T, 4, 1, 4, 1>(a, stream);
}

}  // namespace

bool WgmmaAvailable(int dev) {
  // What the module loaded for the device was compiled for, cached per device (0 = not yet asked).
  static std::atomic<int> cached[64];
  if (dev < 0 || dev >= 64) return false;
  int v = cached[dev].load();
  if (v == 0) {
    int major = 0, minor = 0, compiled = 0, current = 0;
    const bool hopper = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                        major == 9 && minor == 0;
    if (hopper && cudaGetDevice(&current) == cudaSuccess) {
      if (current == dev || cudaSetDevice(dev) == cudaSuccess) {
        if (cudaMemcpyFromSymbol(&compiled, g_wgmma_compiled, sizeof(int)) != cudaSuccess) compiled = 0;
        if (current != dev) cudaSetDevice(current);
      }
    }
    cudaGetLastError();  // a failed query above must not surface as a later launch error
    v = hopper && compiled == 1 ? 1 : 2;
    cached[dev].store(v);
  }
  return v == 1;
}

bool WgmmaUsable(const ForwardArgs& a) {
  // Read per call (cheap next to a launch) so that tests and benchmarks can compare both kernels in one process.
  const char* off = std::getenv("MAXSIM_CUDA_WGMMA");
  if (off != nullptr && std::strcmp(off, "0") == 0) return false;
  if (a.pairs.argmax != nullptr) return false;
  if (a.part.group_rows != 256 && a.part.group_rows != 128) return false;
  if (a.q.dtype != a.d.dtype || (a.q.dtype != kBF16 && a.q.dtype != kF16)) return false;
  if (a.q.dim <= 96 || a.q.dim > 128) return false;
  int dev = 0;
  return cudaGetDevice(&dev) == cudaSuccess && WgmmaAvailable(dev);
}

cudaError_t LaunchExactWgmma(const ForwardArgs& a, cudaStream_t stream) {
  const uint64_t tasks = a.pairs.n_pairs * a.part.groups;
  if (tasks == 0) return cudaSuccess;
  if (tasks > 0x7fffffffull) return cudaErrorInvalidConfiguration;
  return a.q.dtype == kBF16 ? LaunchWgmmaT<__nv_bfloat16>(a, stream) : LaunchWgmmaT<__half>(a, stream);
}

}  // namespace mscuda
