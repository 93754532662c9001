// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: arbitrary bytes as a packed buffer. Validation must reject or accept without crashing; an
// accepted buffer is scored (exact, certified, approximate, top-k) against a fixed query, and certified must
// equal exact bit for bit. If the first byte is odd the checksums are recomputed first, so that mutations reach
// the structural checks behind them instead of stopping at the checksum.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "maxsim/maxsim.h"
#include "maxsim/packed_format.h"
#include "packed.h"

namespace {
maxsim_context* Context() {
  static maxsim_context* ctx = [] {
    maxsim_options o;
    maxsim_options_init(&o);
    o.num_threads = 1;
    o.load_plugins = 0;
    maxsim_context* c = nullptr;
    if (maxsim_context_create(&o, &c) != MAXSIM_OK) std::abort();
    return c;
  }();
  return ctx;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool reseal = data[0] & 1;
  const uint8_t* body = data + 1;
  const size_t n = size - 1;
  void* buf = std::aligned_alloc(64, (n + 63) / 64 * 64 + 64);
  std::memcpy(buf, body, n);
  auto* b = static_cast<uint8_t*>(buf);
  if (reseal && n >= MAXSIM_PACK_HEADER_SIZE) {
    const uint64_t payload = maxsim::pack::Checksum64(b + 256, n - 256);
    std::memcpy(b + offsetof(maxsim_pack_header, payload_checksum), &payload, 8);
    const uint64_t header = maxsim::pack::Checksum64(b, offsetof(maxsim_pack_header, header_checksum));
    std::memcpy(b + offsetof(maxsim_pack_header, header_checksum), &header, 8);
  }
  maxsim_packed* p = nullptr;
  if (maxsim_packed_open(buf, n, MAXSIM_VALIDATE_DEEP, &p) == MAXSIM_OK) {
    maxsim_packed_desc desc;
    if (maxsim_packed_describe(p, &desc) != MAXSIM_OK) std::abort();
    const uint32_t dim = desc.dim;
    std::vector<float> q(3 * static_cast<size_t>(dim));
    for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>((i * 7919) % 13) - 6.0f;
    const uint64_t qoff[2] = {0, 3};
    maxsim_dense_sets qs{};
    qs.struct_size = sizeof(qs);
    qs.data = q.data();
    qs.dtype = MAXSIM_F32;
    qs.dim = dim;
    qs.n_sets = 1;
    qs.offsets = qoff;
    const maxsim_sets Q{nullptr, &qs}, D{p, nullptr};
    const uint64_t nd = desc.n_sets;
    if (nd <= 4096) {
      std::vector<float> exact(nd), cert(nd), approx(nd);
      std::vector<int32_t> ae(3 * nd), ac(3 * nd);
      maxsim_score_options o;
      maxsim_score_options_init(&o);
      if (maxsim_score_matrix(Context(), &Q, &D, &o, exact.data(), ae.data()) != MAXSIM_OK) std::abort();
      o.mode = MAXSIM_MODE_CERTIFIED;
      if (maxsim_score_matrix(Context(), &Q, &D, &o, cert.data(), ac.data()) != MAXSIM_OK) std::abort();
      if (std::memcmp(exact.data(), cert.data(), nd * 4) != 0 || ae != ac) std::abort();  // the contract
      o.mode = MAXSIM_MODE_APPROXIMATE;
      if (maxsim_score_matrix(Context(), &Q, &D, &o, approx.data(), nullptr) != MAXSIM_OK) std::abort();
      std::vector<float> ts(5);
      std::vector<uint64_t> ti(5), ids(5);
      if (maxsim_topk(Context(), &Q, &D, 5, &o, ts.data(), ti.data(), desc.has_ids ? ids.data() : nullptr) != MAXSIM_OK) {
        std::abort();
      }
    }
    maxsim_packed_release(p);
  }
  std::free(buf);
  return 0;
}
