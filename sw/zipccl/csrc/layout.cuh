// The container layout the kernels see (Layout, mirrored by zipccl/_cuda.py), the float formats'
// traits, error bits, and the byte/word load and store helpers. Included by codec.cu.
#pragma once

#include <cstdint>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "table.cuh"

constexpr int kGaps = 10;

// Mirrors the ctypes structure in zipccl/_cuda.py: all fields 64-bit, no padding. (Outside the
// anonymous namespace: the exported launchers take it, so it needs external linkage.)
struct Layout {
  long long n, nb, block, ngaps;
  long long raw_byte_at[3], raw_bit_at[3], prefix_at[3];
  long long offsets_at, payload_at, capacity, payload_bytes, payload_cap;
  long long gap_lo[kGaps], gap_hi[kGaps];
  // The raw layout's size when the buffer may hold it (codec.compress on the device: the encoder
  // stores the tensor raw where the split layout is not smaller, the decoder reads the layout from
  // the header); 0 for a buffer known to be split (a collective's piece).
  long long raw_size;
  // 1: the kernels compute the header's values checksum (encode) or check it (decode), at
  // kChecksumAt; 0: the buffer carries none. (The header's field positions are table.cuh's
  // constants, checked against golden by tests/test_cuda_constants.py.)
  long long checksum;
};

namespace {

constexpr int kGroups = 4;                   // groups of 8 elements per lane per round
constexpr int kRound = 32 * 8 * kGroups;     // elements per warp round
constexpr int kStageBytes = 36864;           // shared memory budget for the stages of one CTA
constexpr int kMaxWarps = 8;
constexpr unsigned kFull = 0xffffffffu;

// Error bits of the decoder's flag (zipccl/_cuda.py names them).
constexpr int kErrOffsets = 1, kErrSize = 2, kErrRank = 4, kErrPadding = 8, kErrPlanePad = 16;
constexpr int kErrRoom = 32;  // the header's payload size exceeds the payload's room
constexpr int kErrChecksum = 64;  // the decoded values' checksum is not the header's
constexpr int kErrGaps = 128;  // alignment gap bytes are not zero (not the encoder's buffer)
constexpr int kErrSymbol = 256;  // a decoded symbol past the format's exponent field (FP16)

// Where a decode reports problems: their bits OR-ed into the device word `bits` and, where
// `notice` is set (a mapped pinned host word: a validating decompress), a 1 stored there, so
// that the host, once its stream sync returns, copies `bits` only when something was found.
struct Report {
  int* bits;
  int* notice;
  __device__ void operator()(int err) const {
    atomicOr(bits, err);
    if (notice) *reinterpret_cast<volatile int*>(notice) = 1;
  }
};

// The table words (kRegionAt, kRankAt, kCountAt, kFastAt) are laid out in table.cuh.

// Warps per CTA and stage words per warp for a block size: a block's payload is at most `block`
// bytes (codewords are at most 8 bits) plus two words of slack for the bit extractor, rounded to
// whole 16-byte vectors.
__host__ __device__ inline int stage_words(long long block);
__host__ __device__ inline int warps_for(long long block) {
  const long long w = kStageBytes / (4ll * stage_words(block));
  return static_cast<int>(w < 1 ? 1 : w > kMaxWarps ? kMaxWarps : w);
}
__host__ __device__ inline int stage_words(long long block) {
  return static_cast<int>(((block / 4 + 2) + 3) / 4 * 4);
}
// The decoder's fast-path table in registers.
struct Fast {
  uint32_t lit_planes, sym_lo, sym_hi, bad_lo, bad_hi;  // lit_planes: byte j = 0xff * bit j of L
  uint32_t lit_rep;  // L in every nibble
};

__device__ inline Fast load_fast(const int32_t* tab) {
  Fast f;
  const uint32_t lit = static_cast<uint32_t>(tab[kFastAt]);
  f.lit_planes = (lit & 1u ? 0xffu : 0u) | (lit & 2u ? 0xff00u : 0u) | (lit & 4u ? 0xff0000u : 0u);
  f.sym_lo = tab[kFastAt + 1], f.sym_hi = tab[kFastAt + 2];
  f.bad_lo = tab[kFastAt + 3], f.bad_hi = tab[kFastAt + 4];
  f.lit_rep = (lit & 7u) * 0x11111111u;
  return f;
}

// 0xFF in each of the first `cnt` bytes of the low (hi=false) or high word of 8 elements.
__device__ inline uint32_t valid_bytes(int cnt, bool hi) {
  const int c = hi ? cnt - 4 : cnt;
  return c >= 4 ? 0xffffffffu : c <= 0 ? 0u : (1u << (8 * c)) - 1u;
}

template <int BITS> struct Uint;
template <> struct Uint<8> { using T = uint8_t; };
template <> struct Uint<16> { using T = uint16_t; };
template <> struct Uint<32> { using T = uint32_t; };

template <int BITS_, int MANT, int EXPB, bool BYTE>
struct Fmt {
  static constexpr int BITS = BITS_;
  static constexpr bool BYTE_CODED = BYTE;  // the whole element is the symbol (FP8)
  using T = typename Uint<BITS>::T;
  static constexpr int RAW = BYTE ? 0 : 1 + MANT;  // raw bits: the mantissa, the sign at bit MANT
  static constexpr int RAWB = RAW / 8;  // raw byte planes
  static constexpr int RAWb = RAW % 8;  // raw bit planes
  static constexpr uint32_t MMASK = (1u << MANT) - 1;
  static constexpr int EXP_BITS = EXPB;
  __device__ static uint32_t sym(uint32_t x) {
    return BYTE ? x : (x >> MANT) & ((1u << EXP_BITS) - 1);
  }
  __device__ static uint32_t join(uint32_t s, uint32_t r) {
    return BYTE ? s : ((r >> MANT) << (BITS - 1)) | (s << MANT) | (r & MMASK);
  }
};

using BF16 = Fmt<16, 7, 8, false>;
using FP16 = Fmt<16, 10, 5, false>;
using FP32 = Fmt<32, 23, 8, false>;
using FP8 = Fmt<8, 0, 0, true>;

__device__ inline bool aligned(const void* p, int bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// prmt.b32 in its default mode: byte n of the result is byte c[4n+2:4n] of b:a, or that byte's sign
// replicated when c[4n+3] is set. Only c[15:0] is read. (__byte_perm masks a selector that is not
// a constant with 0x7777 first.)
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Bits of a where M is set, of c elsewhere: one lop3 (the compiler splits the masks otherwise).
template <uint32_t M>
__device__ __forceinline__ uint32_t bitsel(uint32_t a, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xE2;" : "=r"(d) : "r"(a), "n"(M), "r"(c));  // (a & M) | (c & ~M)
  return d;
}

// A hint: the line of `p` into L2 (no register is held for it).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// A hint: the line of `p` into the SM's L1.
__device__ __forceinline__ void prefetch_l1(const void* p) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}

// 8 elements v[k] (each below 2^(8 sizeof(T))) to `p` (8- or 16-byte aligned) by vector stores.
template <typename T>
__device__ inline void store_vec8(T* p, const uint32_t v[8]) {
  if constexpr (sizeof(T) == 1) {
    uint2 w = {0, 0};
#pragma unroll
    for (int k = 0; k < 4; ++k) w.x |= v[k] << (8 * k), w.y |= v[k + 4] << (8 * k);
    *reinterpret_cast<uint2*>(p) = w;
  } else if constexpr (sizeof(T) == 2) {
    uint4 w = {v[0] | v[1] << 16, v[2] | v[3] << 16, v[4] | v[5] << 16, v[6] | v[7] << 16};
    *reinterpret_cast<uint4*>(p) = w;
  } else {
    reinterpret_cast<uint4*>(p)[0] = make_uint4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<uint4*>(p)[1] = make_uint4(v[4], v[5], v[6], v[7]);
  }
}

template <typename T>
__device__ inline void store8(T* p, int cnt, const uint32_t v[8]) {
  if (cnt == 8 && aligned(p, sizeof(T) == 1 ? 8 : 16)) {
    store_vec8(p, v);
    return;
  }
#pragma unroll
  for (int k = 0; k < 8; ++k)
    if (k < cnt) p[k] = static_cast<T>(v[k]);
}

// 8 bytes packed little endian in a uint64 (element k at byte k).
__device__ inline void store_bytes(uint8_t* p, int cnt, unsigned long long w) {
  if (cnt == 8 && aligned(p, 8)) {
    *reinterpret_cast<unsigned long long*>(p) = w;
    return;
  }
  for (int k = 0; k < cnt; ++k) p[k] = static_cast<uint8_t>(w >> (8 * k));
}

__device__ inline unsigned long long load_bytes(const uint8_t* p, int cnt) {
  if (cnt == 8 && aligned(p, 8)) return *reinterpret_cast<const unsigned long long*>(p);
  unsigned long long w = 0;
  for (int k = 0; k < cnt; ++k) w |= static_cast<unsigned long long>(p[k]) << (8 * k);
  return w;
}

// The alignment of 8 elements that load_vec8 needs.
template <typename T>
__device__ inline bool vec8_aligned(const T* p) {
  return aligned(p, sizeof(T) == 1 ? 8 : 16);
}

// 8 elements at `p` (vec8_aligned) in 2*sizeof(T) little-endian words, by vector loads.
template <typename T>
__device__ inline void load_vec8(const T* p, uint32_t w[2 * sizeof(T)]) {
  if constexpr (sizeof(T) == 1) {
    const uint2 v = __ldcs(reinterpret_cast<const uint2*>(p));
    w[0] = v.x, w[1] = v.y;
  } else {
#pragma unroll
    for (int i = 0; i < sizeof(T) / 2; ++i) {
      const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p) + i);
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
  }
}

// 8 elements packed in 2*sizeof(T) little-endian words (fewer registers for prefetching).
template <typename T>
__device__ inline void load_packed(const T* p, int cnt, uint32_t w[2 * sizeof(T)]) {
  constexpr int kWords = 2 * sizeof(T), kPer = 4 / sizeof(T);
  if (cnt == 8 && vec8_aligned(p)) {
    load_vec8(p, w);
    return;
  }
#pragma unroll
  for (int i = 0; i < kWords; ++i) w[i] = 0u;
#pragma unroll
  for (int k = 0; k < 8; ++k)
    if (k < cnt) w[k / kPer] |= static_cast<uint32_t>(p[k]) << (8 * sizeof(T) * (k % kPer));
}

template <typename T>
__device__ inline uint32_t elem(const uint32_t w[2 * sizeof(T)], int k) {
  constexpr int kPer = 4 / sizeof(T);
  if constexpr (sizeof(T) == 4) {
    return w[k];
  } else {
    return (w[k / kPer] >> (8 * sizeof(T) * (k % kPer))) & ((1u << (8 * sizeof(T))) - 1u);
  }
}

// Byte j of each of a group's 8 elements (packed as load_packed leaves them), element k's at
// byte k: byte permutes, 1 to 3 for 4 elements.
template <typename T>
__device__ __forceinline__ unsigned long long byte_plane(const uint32_t w[2 * sizeof(T)], int j) {
  if constexpr (sizeof(T) == 1) {
    return w[0] | static_cast<unsigned long long>(w[1]) << 32;  // (j is 0)
  } else if constexpr (sizeof(T) == 2) {  // word i: elements 2i (bytes 0, 1), 2i + 1 (bytes 2, 3)
    const uint32_t sel = j | (2 + j) << 4 | (4 + j) << 8 | (6 + j) << 12;
    const uint32_t lo = __byte_perm(w[0], w[1], sel), hi = __byte_perm(w[2], w[3], sel);
    return lo | static_cast<unsigned long long>(hi) << 32;
  } else {  // word k: element k
    const uint32_t sel = j | (4 + j) << 4;
    const uint32_t lo =
        __byte_perm(__byte_perm(w[0], w[1], sel), __byte_perm(w[2], w[3], sel), 0x5410);
    const uint32_t hi =
        __byte_perm(__byte_perm(w[4], w[5], sel), __byte_perm(w[6], w[7], sel), 0x5410);
    return lo | static_cast<unsigned long long>(hi) << 32;
  }
}

// Bit s of each of a group's 8 16-bit elements (packed two a word), element k's at bit k: word i's
// two bits land at bits 2i and 16 + 2i, and the high ones shift down by 15 to 2i + 1.
__device__ __forceinline__ uint32_t bit_plane16(const uint32_t w[4], int s) {
  uint32_t x = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) x |= ((w[i] >> s) & 0x00010001u) << (2 * i);
  return (x | x >> 15) & 0xffu;
}

}  // namespace
