// AMX tiles on Linux, shared by the C++ extensions (impl/kernels/cpu_fused, impl/kernels/cpu_attn).
//
// A process may use the tiles once it has asked the kernel for their register state (arch_prctl
// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); every thread then loads a tile configuration before its first
// tile instruction and releases the tiles after its last. IMPL_CPU_AMX (impl/envs.py) turns every AMX path
// off: 0 false no n off, in any case, as the engine reads its other booleans.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>
#include <immintrin.h>

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <string>

#if defined(IMPL_AMX_EMULATE)
#include "cpu_amx_emulate.h"  // the tile instructions in software (tests on CPUs without AMX)
#endif

namespace cpu_amx {

// Whether the environment variable `name` is set to a false boolean (0 false no n off, in any case).
inline bool env_false(const char* name) {
  const char* env = std::getenv(name);
  if (env == nullptr) return false;
  std::string v(env);
  for (auto& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v == "0" || v == "false" || v == "no" || v == "n" || v == "off";
}

// Whether this process may run tile instructions: IMPL_CPU_AMX not false, and the kernel granted the state.
// (Emulated tiles need no state from the kernel.)
inline bool tiles_allowed() {
#if defined(IMPL_AMX_EMULATE)
  static const bool ok = !env_false("IMPL_CPU_AMX");
#else
  static const bool ok = !env_false("IMPL_CPU_AMX") &&
                         syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#endif
  return ok;
}

#if defined(__AMX_TILE__)
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-7 of 64-byte rows, tile t with rows[t] rows (0: unused), for the calling thread.
inline void config_rows_x64(const uint8_t (&rows)[8]) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = rows[t];
    cfg.colsb[t] = rows[t] ? 64 : 0;
  }
  _tile_loadconfig(&cfg);
}

// Tiles 0-7 all 16 rows x 64 bytes (the kernels' C, A and B tiles), for the calling thread.
inline void config_16x64() {
  const uint8_t rows[8] = {16, 16, 16, 16, 16, 16, 16, 16};
  config_rows_x64(rows);
}
#endif

}  // namespace cpu_amx
