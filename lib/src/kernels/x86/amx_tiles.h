// SPDX-License-Identifier: Apache-2.0
// AMX tile configuration shared by the amx kernel (screen_amx.cc) and the isa_probe benchmark.
//
// Why our own ldtilecfg: GCC 12's _tile_loadconfig is `asm volatile("ldtilecfg %X0" :: "m"(*(const void**)cfg))`,
// i.e. it tells the compiler that it reads 8 bytes. When the configuration is a local built just before the
// call, GCC then deletes the stores of colsb[] and rows[] as dead, and ldtilecfg loads "palette 1, every tile 0
// rows": the first tilezero/tileloadd raises #UD (SIGILL). That is what every AMX call did when built with g++ 12
// (g++ 13 happens to keep the stores, so the bug depends on the compiler version). The operand below
// covers all 64 bytes, so the stores are live whatever the compiler version.
#ifndef MAXSIM_SRC_KERNELS_X86_AMX_TILES_H_
#define MAXSIM_SRC_KERNELS_X86_AMX_TILES_H_

#include <cstdint>
#include <cstring>

namespace maxsim {
namespace x86 {

struct alignas(64) AmxTileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(AmxTileConfig) == 64, "ldtilecfg reads 64 bytes");

// Palette 1 with tiles 0..7 at 16 rows x 64 bytes (the only shape the kernels use). Needs AMX-TILE, which the
// caller has checked (the function has no target attribute: ldtilecfg is emitted as plain asm).
inline void AmxConfigure16x64() {
  AmxTileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
}

}  // namespace x86
}  // namespace maxsim

#endif  // MAXSIM_SRC_KERNELS_X86_AMX_TILES_H_
