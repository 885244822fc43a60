// 64-byte aligned std::vector storage, shared by the C++ extensions (impl/kernels/cpu_fused, impl/kernels/cpu_attn).
//
// std::vector's allocator gives malloc's 16-byte alignment (a large block starts 16 bytes past a page), so a
// buffer read 64 bytes at a time (an AMX tile row, an AVX-512 vector) has every such read span two cache lines.
// Measured on a Sapphire Rapids-class Xeon (bench/investigations/amx_bf16_gemm.cpp): the same 2 x 2-tile GEMM ran
// at 0.9 TFLOP/s per core from a malloc'd buffer and 1.45 from a 64-byte aligned one. Every buffer the kernels
// load tiles or whole vectors from is an `avector`.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace cpu_mem {

constexpr std::size_t kAlign = 64;

template <typename T>
struct Aligned64 {
  using value_type = T;
  Aligned64() noexcept = default;
  template <typename U>
  Aligned64(const Aligned64<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{kAlign})); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, std::align_val_t{kAlign}); }
  template <typename U>
  bool operator==(const Aligned64<U>&) const noexcept { return true; }
  template <typename U>
  bool operator!=(const Aligned64<U>&) const noexcept { return false; }
};

template <typename T>
using avector = std::vector<T, Aligned64<T>>;

// Aligned64 whose resize() leaves new elements of trivial types unwritten (default-initialised), for a buffer the
// caller writes in full before reading it (no zero-filling pass over memory about to be overwritten).
template <typename T>
struct Aligned64NoInit : Aligned64<T> {
  Aligned64NoInit() noexcept = default;
  template <typename U>
  Aligned64NoInit(const Aligned64NoInit<U>&) noexcept {}
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(static_cast<Args&&>(args)...);
  }
};

template <typename T>
using avector_noinit = std::vector<T, Aligned64NoInit<T>>;

}  // namespace cpu_mem
