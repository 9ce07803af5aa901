// zipccl split-layout codec kernels (golden/container.py bytes), built by zipccl/_cuda.py (nvcc).
//
// One warp codes one block of `block` elements, with no CTA-wide barrier and no waiting on other
// blocks. It walks the block in rounds of 1024 elements: lane l owns 4 groups of 8 consecutive
// elements (group g starts at round element 256*g + 8*l, so every warp access is contiguous). A
// group's 8 elements are one byte of every bit plane (prefix planes, FP16's raw bit planes) and one
// 8-byte store per raw byte plane. Payload bit positions come from one warp scan per round of
// packed per-group bit counts; the payload is assembled in the warp's slice of shared memory (the
// *stage*, big-endian 32-bit words: stream byte i at stage byte i ^ 3) and copied out.
//
// Compress (zipccl_compress) is one memset and up to three launches, none of which waits for the
// host or for another block: (1) theory_kernel, when no table is given: golden.theory's table from
// a strided sample, built on the device (table.cuh) into the buffer's table words and the header
// stage; (2) encode: planes straight into the container, each block's payload into its fixed slot
// of a scratch area, its byte count, and an atomic add into its tile's sum (tiles of 256 blocks);
// (3) finish: every CTA sums the tile sums, places its blocks' uint64 offsets and payloads, CTA 0
// writes the header (payload size, CRC-32) and the sizes, and where the split layout would not be
// smaller the tensor is stored raw instead. Decompress is one launch: each warp reads its block's
// offsets, stages the payload and checks the block for consistency, reporting problems through an
// error flag; a buffer compress wrote is decoded by its own header (raw or split, payload size).
//
// BF16 under a byte-escape table (the ZipCCL exponent layout) has its own path (Z = true). Its
// encoder gets bytes by permutes, and an element's three plane bytes and escape mask by one table
// lookup and one add. Byte-coded formats (FP8) decode by byte-permute width lookups, byte-wise
// prefix sums of the widths and a (prefix, value) symbol table laid out so that an entry's index
// is one funnel shift. Both decoders take a fast path for the whole rounds of a block whose raw
// bytes and output are aligned for vector access: plane bytes at immediate offsets, a group's
// prefixes as one word of nibbles from three lookups, bare prmt lookups, BF16 escapes patched
// without a loop, and an L2 prefetch of the next round; partial rounds and unaligned buffers take
// the general code. With the compact table, this took BF16 decode from 1781 to 2073 GB/s and FP8
// from 677 to 876 GB/s of GPU work (256 MiB, H200, benchmarks/variants.py); staging FP8's large
// per-block payload with eight loads in flight per lane, 863 -> 1065 GB/s. Measured numbers and
// the path that led here: benchmarks/results/codec.md.
#include <cstdint>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <mutex>
#include <type_traits>

#include "table.cuh"

constexpr int kGaps = 10;

// Mirrors the ctypes structure in zipccl/_cuda.py: all fields 64-bit, no padding. (Outside the
// anonymous namespace: the exported launchers take it, so it needs external linkage.)
struct Layout {
  long long n, nb, block, ngaps;
  long long raw_byte_at[3], raw_bit_at[3], prefix_at[3];
  long long offsets_at, payload_at, capacity, payload_bytes, payload_cap;
  long long size_field_at, crc_at;  // golden.container's header: payload_bytes and CRC-32 fields
  long long gap_lo[kGaps], gap_hi[kGaps];
  // The raw layout's size when the buffer may hold it (codec.compress on the device: the encoder
  // stores the tensor raw where the split layout is not smaller, the decoder reads the layout from
  // the header); 0 for a buffer known to be split (a collective's piece).
  long long raw_size;
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
  static constexpr int RAW = BYTE ? 0 : 1 + MANT;
  static constexpr int RAWB = RAW / 8;  // raw byte planes
  static constexpr int RAWb = RAW % 8;  // raw bit planes
  static constexpr uint32_t MMASK = (1u << MANT) - 1;
  static constexpr int EXP_BITS = EXPB;
  __device__ static uint32_t sym(uint32_t x) {
    return BYTE ? x : (x >> MANT) & ((1u << EXP_BITS) - 1);
  }
  __device__ static uint32_t raw(uint32_t x) {
    return BYTE ? 0u : ((x >> (BITS - 1)) << MANT) | (x & MMASK);
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

template <typename T>
__device__ inline void store8(T* p, int cnt, const uint32_t v[8]) {
  if (cnt == 8 && aligned(p, sizeof(T) == 1 ? 8 : 16)) {
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

// 8 elements packed in 2*sizeof(T) little-endian words (fewer registers for prefetching).
template <typename T>
__device__ inline void load_packed(const T* p, int cnt, uint32_t w[2 * sizeof(T)]) {
  constexpr int kWords = 2 * sizeof(T), kPer = 4 / sizeof(T);
  if (cnt == 8 && aligned(p, sizeof(T) == 1 ? 8 : 16)) {
    if constexpr (sizeof(T) == 1) {
      const uint2 v = __ldcs(reinterpret_cast<const uint2*>(p));
      w[0] = v.x, w[1] = v.y;
    } else {
#pragma unroll
      for (int i = 0; i < kWords / 4; ++i) {
        const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p) + i);
        w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
      }
    }
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


// ------------------------------------------------------------------------------ warp primitives

// Bit positions of a lane's groups within one round: earlier groups of the whole warp come first,
// then the same group's earlier lanes (group g of lane l holds round elements 256*g + 8*l ...).
// The four counts travel packed in 16-bit fields of one uint64 (each warp sum <= 32 * 64 bits).
__device__ inline uint32_t round_positions(const uint32_t nbits[kGroups], uint32_t pos[kGroups]) {
  const int lane = threadIdx.x & 31;
  unsigned long long packed = 0;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) packed |= static_cast<unsigned long long>(nbits[g]) << (16 * g);
  unsigned long long x = packed;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const unsigned long long y = __shfl_up_sync(kFull, x, d);
    if (lane >= d) x += y;
  }
  const unsigned long long sums = __shfl_sync(kFull, x, 31), excl = x - packed;
  uint32_t before = 0;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    pos[g] = before + static_cast<uint32_t>((excl >> (16 * g)) & 0xffffu);
    before += static_cast<uint32_t>((sums >> (16 * g)) & 0xffffu);
  }
  return before;
}

// OR the low `n` (<= 64) bits of `acc`, MSB first, into the big-endian word stage at bit `pos`.
__device__ inline void emit_bits(uint32_t* stage, uint32_t pos, unsigned long long acc, uint32_t n) {
  if (!n) return;
  const uint32_t i = pos >> 5, off = pos & 31u;
  const unsigned long long v = acc << (64u - n);  // left-aligned
  const uint32_t w0 = static_cast<uint32_t>(v >> (32u + off)), w1 = static_cast<uint32_t>(v >> off);
  const uint32_t w2 = off ? static_cast<uint32_t>(v << (32u - off)) : 0u;
  if (w0) atomicOr(&stage[i], w0);
  if (w1) atomicOr(&stage[i + 1], w1);
  if (w2) atomicOr(&stage[i + 2], w2);
}

// The `w` (<= 8) bits at stream bit `pos` of a big-endian word stage.
__device__ inline uint32_t read_bits(const uint32_t* stage, uint32_t pos, uint32_t w) {
  const uint32_t i = pos >> 5;
  const uint32_t top = __funnelshift_l(stage[i + 1], stage[i], pos & 31u);
  return w ? top >> (32u - w) : 0u;
}

// Elements of group g of this lane in round r of a block starting at `start`: count (0..8) and the
// first element's index. FULL: the caller knows the whole round is inside the block and tensor.
template <bool FULL>
__device__ inline int group_count(const Layout& L, long long start, int r, int g, long long& e0) {
  const long long local = static_cast<long long>(r) * kRound + 256 * g + 8 * (threadIdx.x & 31);
  e0 = start + local;
  if constexpr (FULL) return 8;
  return (local < L.block && e0 < L.n) ? static_cast<int>(min(8ll, L.n - e0)) : 0;
}

__device__ inline int rounds(const Layout& L) {
  return static_cast<int>((L.block + kRound - 1) / kRound);
}

__device__ inline bool full_round(const Layout& L, long long start, int r) {
  const long long end = static_cast<long long>(r + 1) * kRound;
  return end <= L.block && start + end <= L.n;
}

// The word at byte address `p` (4-aligned), bytes outside [lo, hi) read as zero.
__device__ inline uint32_t load_word_within(const uint8_t* p, const uint8_t* lo, const uint8_t* hi) {
  if (p >= lo && p + 4 <= hi) return *reinterpret_cast<const uint32_t*>(p);
  uint32_t w = 0;
  for (int k = 0; k < 4; ++k)
    if (p + k >= lo && p + k < hi) w |= static_cast<uint32_t>(p[k]) << (8 * k);
  return w;
}

// Copy `len` bytes from `src` (16-byte aligned, readable up to 4 bytes past `len`) to `dst` (any
// alignment) with one warp: whole 32-bit words where `dst` is aligned, bytes at its two ends.
__device__ inline void warp_copy(uint8_t* dst, const uint8_t* src, uint32_t len) {
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t head =
      min(len, static_cast<uint32_t>((4u - (reinterpret_cast<uintptr_t>(dst) & 3u)) & 3u));
  const uint32_t words = (len - head) / 4;
  if (lane < head) dst[lane] = src[lane];
  const uint32_t* s = reinterpret_cast<const uint32_t*>(src);
  uint32_t* d = reinterpret_cast<uint32_t*>(dst + head);
  for (uint32_t k = lane; k < words; k += 32) d[k] = __funnelshift_r(s[k], s[k + 1], 8u * head);
  for (uint32_t i = head + 4 * words + lane; i < len; i += 32) dst[i] = src[i];
}

// ------------------------------------------------------------------------------ encode

// One round's groups of one lane, loaded before coding.
template <class F>
struct EncIn {
  uint32_t w[kGroups][2 * sizeof(typename F::T)];
};

template <class F, bool FULL>
__device__ inline void enc_load(const typename F::T* in, const Layout& L, long long start, int r,
                                EncIn<F>& x, int cnt[kGroups], long long e0[kGroups]) {
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    cnt[g] = group_count<FULL>(L, start, r, g, e0[g]);
    load_packed(in + (cnt[g] ? e0[g] : 0), cnt[g], x.w[g]);
  }
}

// The fast path's per-symbol word: bits 0, 8, 16 = prefix bits 0, 1, 2; bit 24 = escape. Element
// k's word shifted left by k lands its bits in the three plane bytes and the escape-mask byte.
__device__ inline uint32_t spread_word(int32_t code) {
  const uint32_t p = (static_cast<uint32_t>(code) >> 8) & 7u;
  return (p & 1u) | ((p >> 1) & 1u) << 8 | ((p >> 2) & 1u) << 16 | (code >> 12 ? 1u << 24 : 0u);
}

// One round of BF16 under a byte-escape table: exponent and raw bytes by byte permutes, the three
// plane bytes and the escape mask by one table lookup and one add per element; escape bytes into
// the stage. Returns the round's payload bits.
template <bool FULL>
__device__ inline uint32_t enc_round_fast(const EncIn<BF16>& x, const int cnt[kGroups],
                                          const long long e0[kGroups], uint8_t* out,
                                          const Layout& L, const uint32_t* s_spread, uint32_t bits,
                                          uint8_t* stage) {
  uint32_t ex[kGroups][2], acc[kGroups], nbits[kGroups], pos[kGroups];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const uint32_t* w = x.w[g];
    uint32_t e2[4], r2[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      e2[i] = (w[i] >> 7) & 0x00ff00ffu;
      r2[i] = (w[i] & 0x007f007fu) | ((w[i] >> 8) & 0x00800080u);
    }
    ex[g][0] = __byte_perm(e2[0], e2[1], 0x6420), ex[g][1] = __byte_perm(e2[2], e2[3], 0x6420);
    acc[g] = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (FULL || k < cnt[g]) acc[g] += s_spread[(ex[g][k >> 2] >> (8 * (k & 3))) & 0xffu] << k;
    if (cnt[g]) {
      const uint32_t raw_lo = __byte_perm(r2[0], r2[1], 0x6420);
      const uint32_t raw_hi = __byte_perm(r2[2], r2[3], 0x6420);
      const long long e = e0[g];
      store_bytes(out + L.raw_byte_at[0] + e, cnt[g],
                  raw_lo | static_cast<unsigned long long>(raw_hi) << 32);
#pragma unroll
      for (int j = 0; j < 3; ++j) out[L.prefix_at[j] + e / 8] = static_cast<uint8_t>(acc[g] >> (8 * j));
    }
    nbits[g] = 8 * __popc(acc[g] >> 24);
  }
  const uint32_t total = round_positions(nbits, pos);
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    uint32_t at = (bits + pos[g]) >> 3;
    for (uint32_t m = acc[g] >> 24; m; m &= m - 1)
      stage[at++ ^ 3u] = static_cast<uint8_t>(__byte_perm(ex[g][0], ex[g][1], __ffs(m) - 1));
  }
  return total;
}

// One round of the generic path: planes out, codewords ORed into the (zeroed) stage.
template <class F, bool FULL>
__device__ inline uint32_t enc_round(const EncIn<F>& x, const int cnt[kGroups],
                                     const long long e0[kGroups], uint8_t* out, const Layout& L,
                                     const uint32_t* s_code, uint32_t bits, uint32_t* stage) {
  using T = typename F::T;
  uint32_t nbits[kGroups], pos[kGroups];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    uint32_t pbits[3] = {0u, 0u, 0u}, tbits[F::RAWb > 0 ? F::RAWb : 1] = {0u};
    unsigned long long rbytes[F::RAWB > 0 ? F::RAWB : 1] = {0ull};
    nbits[g] = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if (FULL || k < cnt[g]) {
        const uint32_t v = elem<T>(x.w[g], k);
        const uint32_t r = F::raw(v);
        const uint32_t code = s_code[F::sym(v)];
        const uint32_t p = (code >> 8) & 7u;
#pragma unroll
        for (int j = 0; j < 3; ++j) pbits[j] |= ((p >> j) & 1u) << k;
#pragma unroll
        for (int j = 0; j < F::RAWB; ++j)
          rbytes[j] |= static_cast<unsigned long long>((r >> (8 * j)) & 0xffu) << (8 * k);
#pragma unroll
        for (int j = 0; j < F::RAWb; ++j) tbits[j] |= ((r >> (8 * F::RAWB + j)) & 1u) << k;
        nbits[g] += code >> 12;
      }
    }
    if (cnt[g]) {
      const long long e = e0[g];
#pragma unroll
      for (int j = 0; j < F::RAWB; ++j) store_bytes(out + L.raw_byte_at[j] + e, cnt[g], rbytes[j]);
#pragma unroll
      for (int j = 0; j < F::RAWb; ++j) out[L.raw_bit_at[j] + e / 8] = tbits[j];
#pragma unroll
      for (int j = 0; j < 3; ++j) out[L.prefix_at[j] + e / 8] = pbits[j];
    }
  }
  const uint32_t total = round_positions(nbits, pos);
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {  // second pass: the codewords, MSB first
    unsigned long long acc = 0;
    uint32_t n = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if (FULL || k < cnt[g]) {
        const uint32_t code = s_code[F::sym(elem<T>(x.w[g], k))], w = code >> 12;
        acc = (acc << w) | (code & 0xffu);
        n += w;
      }
    }
    emit_bits(stage, bits + pos[g], acc, n);
  }
  return total;
}

template <class F, bool Z, bool FULL>
__device__ inline uint32_t enc_round_at(const typename F::T* in, uint8_t* out, const Layout& L,
                                        long long start, int r, const uint32_t* s_lut,
                                        uint32_t bits, uint32_t* stage) {
  EncIn<F> x;
  int cnt[kGroups];
  long long e0[kGroups];
  enc_load<F, FULL>(in, L, start, r, x, cnt, e0);
  if constexpr (Z)
    return enc_round_fast<FULL>(x, cnt, e0, out, L, s_lut, bits, reinterpret_cast<uint8_t*>(stage));
  else
    return enc_round<F, FULL>(x, cnt, e0, out, L, s_lut, bits, stage);
}

// `work` (zipccl_work_bytes): [0, 8) the payload size, then per tile of kTile blocks a uint64 sum
// (zeroed before the encode), per block a uint32 byte count, and the scratch slots (`block` bytes
// per block, 16 bytes of slack after them).
constexpr int kTile = 256;
struct Work {
  unsigned long long* total;
  unsigned long long* tiles;
  uint32_t* counts;
  uint8_t* scratch;
};

__host__ __device__ inline long long align16(long long x) { return (x + 15) / 16 * 16; }
__host__ __device__ inline long long num_tiles(long long nb) { return (nb + kTile - 1) / kTile; }
__host__ __device__ inline long long counts_at(long long nb) { return align16(16 + 8 * num_tiles(nb)); }
__host__ __device__ inline long long scratch_at(long long nb) { return align16(counts_at(nb) + 4 * nb); }

__host__ __device__ inline Work work_of(void* work, long long nb) {
  uint8_t* w = static_cast<uint8_t*>(work);
  return {reinterpret_cast<unsigned long long*>(w), reinterpret_cast<unsigned long long*>(w + 16),
          reinterpret_cast<uint32_t*>(w + counts_at(nb)), w + scratch_at(nb)};
}

// Each warp codes whole blocks: planes into the container, the payload into the block's scratch
// slot, its byte count into `counts` and the tile's sum.
template <class F, bool Z>
__global__ void __launch_bounds__(32 * kMaxWarps)
encode_kernel(const typename F::T* __restrict__ in, uint8_t* __restrict__ out, const Layout L,
              const int32_t* __restrict__ tab, Work work) {
  __shared__ uint32_t s_lut[256];  // Z: spread words; else the encoder words
  extern __shared__ uint4 s_stage[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, words = stage_words(L.block);
  uint32_t* stage = reinterpret_cast<uint32_t*>(s_stage) + warp * words;
  for (int i = threadIdx.x; i < 256; i += blockDim.x) s_lut[i] = Z ? spread_word(tab[i]) : tab[i];
  __syncthreads();
  const long long warps = static_cast<long long>(gridDim.x) * (blockDim.x >> 5);
  for (long long b = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + warp; b < L.nb;
       b += warps) {
    if constexpr (!Z) {
      for (int i = lane; i < words; i += 32) stage[i] = 0u;
      __syncwarp();
    }
    const long long start = b * L.block;
    uint32_t bits = 0;
    for (int r = 0; r < rounds(L); ++r) {
      if (full_round(L, start, r))
        bits += enc_round_at<F, Z, true>(in, out, L, start, r, s_lut, bits, stage);
      else
        bits += enc_round_at<F, Z, false>(in, out, L, start, r, s_lut, bits, stage);
    }
    __syncwarp();
    const uint32_t nbytes = (bits + 7u) >> 3;
    uint4* slot = reinterpret_cast<uint4*>(work.scratch + b * L.block);
    const uint4* s4 = reinterpret_cast<const uint4*>(stage);
    for (uint32_t i = lane; i < (nbytes + 15u) / 16u; i += 32) {
      const uint4 v = s4[i];  // big-endian words -> stream byte order
      slot[i] = make_uint4(__byte_perm(v.x, 0, 0x0123), __byte_perm(v.y, 0, 0x0123),
                           __byte_perm(v.z, 0, 0x0123), __byte_perm(v.w, 0, 0x0123));
    }
    if (lane == 0) {
      work.counts[b] = nbytes;
      atomicAdd(&work.tiles[b / kTile], static_cast<unsigned long long>(nbytes));
    }
    __syncwarp();  // the stage is read out before the next block writes it
  }
}

// CTA-wide inclusive scan of one uint64 per thread (blockDim.x a multiple of 32, at most 1024);
// `total` gets the CTA's sum. Every thread must call it.
__device__ inline unsigned long long cta_scan(unsigned long long v, unsigned long long& total) {
  __shared__ unsigned long long s_warp[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  unsigned long long x = v;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const unsigned long long y = __shfl_up_sync(kFull, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) s_warp[warp] = x;
  __syncthreads();
  if (warp == 0) {
    unsigned long long s = lane < nw ? s_warp[lane] : 0ull;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const unsigned long long y = __shfl_up_sync(kFull, s, d);
      if (lane >= d) s += y;
    }
    if (lane < nw) s_warp[lane] = s;
  }
  __syncthreads();
  x += warp ? s_warp[warp - 1] : 0ull;
  total = s_warp[nw - 1];
  __syncthreads();  // s_warp may be reused by the next call
  return x;
}

constexpr int kMaxHeader = 512;  // zipccl/_cuda.py checks golden's header fits

// Header bytes [0, L.crc_at) from `head` (golden's header with payload_bytes 0) with the payload
// size patched in, then their CRC-32 at L.crc_at.
__device__ inline void write_header(uint8_t* out, const Layout& L, const uint8_t* head,
                                    unsigned long long total) {
  __shared__ Crc8 s_crc;
  __shared__ uint8_t s_head[kMaxHeader];
  crc_tables(s_crc);
  for (int i = threadIdx.x; i < L.crc_at; i += blockDim.x) {
    const long long f = i - L.size_field_at;
    s_head[i] = f >= 0 && f < 8 ? static_cast<uint8_t>(total >> (8 * f)) : head[i];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t c = crc32(s_crc, s_head, static_cast<int>(L.crc_at));
    for (int k = 0; k < 4; ++k) s_head[L.crc_at + k] = static_cast<uint8_t>(c >> (8 * k));
  }
  __syncthreads();
  for (int i = threadIdx.x; i < L.crc_at + 4; i += blockDim.x) out[i] = s_head[i];
}

// `len` bytes from `src` to `dst` by the whole grid, 16 bytes a thread where both are aligned.
__device__ inline void grid_copy(uint8_t* dst, const uint8_t* src, long long len) {
  const long long tid = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  long long done = 0;
  if (aligned(dst, 16) && aligned(src, 16)) {
    const long long vecs = len / 16;
    for (long long i = tid; i < vecs; i += step)
      reinterpret_cast<uint4*>(dst)[i] = __ldcs(reinterpret_cast<const uint4*>(src) + i);
    done = 16 * vecs;
  }
  for (long long i = done + tid; i < len; i += step) dst[i] = src[i];
}

// Whether the buffer gets the raw layout: where L allows it and the split one is not smaller.
__device__ inline bool store_raw(const Layout& L, unsigned long long total) {
  return L.raw_size > 0 && L.payload_at + static_cast<long long>(total) >= L.raw_size;
}

// The encoder's last step, with no CTA waiting on another. Every CTA sums the tile sums (the
// payload size); each group of kGroup blocks (one per warp) then learns its base (the tiles and
// the tile's counts before it) and each warp gives its block its uint64 offset and moves its
// payload from the scratch slot. CTA 0 writes the size to `work.total` and to `size` ([buffer
// bytes, payload bytes]), zeroes the alignment gaps and writes the header from `head` (golden's
// split header with payload_bytes 0). Where store_raw, the tensor's bytes under `raw_head` are
// stored instead; where the payload overflows the buffer (a collective's room), no payload is
// placed.
constexpr int kGroup = 8;
__global__ void __launch_bounds__(32 * kGroup)
finish_kernel(const uint8_t* __restrict__ in, uint8_t* __restrict__ out, const Layout L,
              Work work, const uint8_t* __restrict__ head, const uint8_t* __restrict__ raw_head,
              long long* __restrict__ size) {
  const long long nt = num_tiles(L.nb);
  unsigned long long all = 0;
  for (long long t = threadIdx.x; t < nt; t += blockDim.x) all += work.tiles[t];
  cta_scan(all, all);
  const bool raw = store_raw(L, all);
  const bool fits = !raw && L.payload_at + static_cast<long long>(all) <= L.capacity;
  if (blockIdx.x == 0) {
    if (threadIdx.x == 0) {
      *work.total = all;
      if (size) size[0] = raw ? L.raw_size : L.payload_at + static_cast<long long>(all);
      if (size) size[1] = raw ? 0 : static_cast<long long>(all);
    }
    if (raw) {
      for (int i = threadIdx.x; i < L.crc_at + 4; i += blockDim.x) out[i] = raw_head[i];
    } else {
      if (head) write_header(out, L, head, all);
      for (int g = 0; g < L.ngaps; ++g)
        for (long long i = L.gap_lo[g] + threadIdx.x; i < L.gap_hi[g]; i += blockDim.x) out[i] = 0;
    }
  }
  if (raw) {
    grid_copy(out + L.crc_at + 4, in, L.raw_size - L.crc_at - 4);
  } else if (fits) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (long long first = static_cast<long long>(blockIdx.x) * kGroup; first < L.nb;
         first += static_cast<long long>(gridDim.x) * kGroup) {
      const long long tile = first / kTile;  // kTile is a multiple of kGroup
      unsigned long long before = 0;
      for (long long t = threadIdx.x; t < tile; t += blockDim.x) before += work.tiles[t];
      for (long long j = tile * kTile + threadIdx.x; j < first; j += blockDim.x)
        before += work.counts[j];
      cta_scan(before, before);
      const long long b = first + warp;
      unsigned long long mine = lane < warp && first + lane < L.nb ? work.counts[first + lane] : 0;
      for (int d = 16; d; d >>= 1) mine += __shfl_xor_sync(kFull, mine, d);
      if (b < L.nb) {
        const unsigned long long at = before + mine;
        if (lane == 0) store_bytes(out + L.offsets_at + 8 * b, 8, at);
        warp_copy(out + L.payload_at + at, work.scratch + b * L.block, work.counts[b]);
      }
    }
  }
}

// ------------------------------------------------------------------------------ decode

// One round's groups of one lane, loaded before decoding.
template <class F>
struct DecIn {
  uint32_t planes[kGroups];  // prefix plane byte j at bits 8j..8j+7
  uint32_t tb[kGroups];      // raw bit plane byte j at bits 8j..8j+7 (FP16)
  unsigned long long rb[kGroups][F::RAWB > 0 ? F::RAWB : 1];
};

template <class F, bool FULL>
__device__ inline void dec_load(const uint8_t* buf, const Layout& L, long long start, int r,
                                DecIn<F>& x, int cnt[kGroups], long long e0[kGroups]) {
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    cnt[g] = group_count<FULL>(L, start, r, g, e0[g]);
    const long long e = cnt[g] ? e0[g] : 0;
    uint32_t pl = 0, tb = 0;
    if (cnt[g]) {
#pragma unroll
      for (int j = 0; j < 3; ++j) pl |= static_cast<uint32_t>(buf[L.prefix_at[j] + e / 8]) << (8 * j);
#pragma unroll
      for (int j = 0; j < F::RAWb; ++j)
        tb |= static_cast<uint32_t>(buf[L.raw_bit_at[j] + e / 8]) << (8 * j);
    }
    x.planes[g] = pl;
    x.tb[g] = tb;
#pragma unroll
    for (int j = 0; j < F::RAWB; ++j) x.rb[g][j] = load_bytes(buf + L.raw_byte_at[j] + e, cnt[g]);
  }
}

__device__ inline uint32_t prefix_of(uint32_t planes, int k) {
  return ((planes >> k) & 1u) | ((planes >> (8 + k)) & 1u) << 1 | ((planes >> (16 + k)) & 1u) << 2;
}

// The 8 prefixes of a group as bytes (elements 0..3 in pre[0], 4..7 in pre[1]), by three lookups
// in a table that spreads bit k of a plane byte to bit 0 of byte k.
__device__ inline void prefix_bytes(uint32_t planes, const unsigned long long* s_spread8,
                                    uint32_t pre[2]) {
  const unsigned long long pre8 = s_spread8[planes & 0xffu] | s_spread8[(planes >> 8) & 0xffu] << 1 |
                                  s_spread8[planes >> 16] << 2;
  pre[0] = static_cast<uint32_t>(pre8), pre[1] = static_cast<uint32_t>(pre8 >> 32);
}

// The same as nibbles (nibble k: prefix k), by lookups in a table that spreads bit k of a plane
// byte to bit 4k.
__device__ __forceinline__ uint32_t prefix_nibbles(uint32_t p0, uint32_t p1, uint32_t p2,
                                                   const uint32_t* s_spread4) {
  return s_spread4[p0] + (s_spread4[p1] << 1) + (s_spread4[p2] << 2);
}

// BF16 under a byte-escape table, a group of a round that dec_round_z does not take: exponents by
// a byte-permute lookup (8 prefixes -> 8 symbols), escapes (`esc`: bit k set for element k)
// patched one by one from the stage from stream byte `at` on, output by permutes.
__device__ inline void dec_group_fast(const uint32_t pre[2], uint32_t esc,
                                      unsigned long long rb, int cnt, uint32_t at,
                                      const uint8_t* stage, const Fast& f, uint16_t* out,
                                      int& err) {
  unsigned long long ex8 = 0;  // the 8 exponent bytes
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t sel = __byte_perm(pre[h] | (pre[h] >> 4), 0u, 0x4420);
    if (__byte_perm(f.bad_lo, f.bad_hi, sel) & valid_bytes(cnt, h)) err |= kErrRank;
    ex8 |= static_cast<unsigned long long>(__byte_perm(f.sym_lo, f.sym_hi, sel)) << (32 * h);
  }
  for (; esc; esc &= esc - 1) {
    const int sh = 8 * (__ffs(esc) - 1);
    ex8 = (ex8 & ~(0xffull << sh)) | static_cast<unsigned long long>(stage[at++ ^ 3u]) << sh;
  }
  const uint32_t ex[2] = {static_cast<uint32_t>(ex8), static_cast<uint32_t>(ex8 >> 32)};
  const uint32_t raw[2] = {static_cast<uint32_t>(rb), static_cast<uint32_t>(rb >> 32)};
  uint32_t v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t t = __byte_perm(raw[i >> 1], ex[i >> 1], (i & 1) ? 0x7362 : 0x5140);
    v[i] = ((t >> 1) & 0x7f807f80u) | (t & 0x007f007fu) | ((t & 0x00800080u) << 8);
  }
  if (cnt == 8 && aligned(out, 16)) {
    *reinterpret_cast<uint4*>(out) = make_uint4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (k < cnt) out[k] = static_cast<uint16_t>(v[k >> 1] >> (16 * (k & 1)));
  }
}

// Per-CTA decoder tables in shared memory (generic path).
struct DecTab {
  uint32_t region[8];
  uint8_t rank[256];
};

// One round of decoding by the general code (every round of BF16, FP16 and FP32; under a
// byte-escape table, the rounds dec_round_z does not take); returns the round's payload bits.
// `bits` is where the round starts in the block's stream.
template <class F, bool Z, bool FULL>
__device__ inline uint32_t dec_round(const uint8_t* buf, typename F::T* out, const Layout& L,
                                     long long start, int r, const DecTab& t, uint32_t nranked,
                                     const Fast& f, const unsigned long long* s_spread8,
                                     uint32_t bits, const uint32_t* stage, int& err) {
  DecIn<F> x;
  int cnt[kGroups];
  long long e0[kGroups];
  dec_load<F, FULL>(buf, L, start, r, x, cnt, e0);
  uint32_t nbits[kGroups], pos[kGroups], esc[kGroups];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    nbits[g] = 0;
    if constexpr (Z) {  // escapes straight from the planes: bit k set where prefix k == L
      const uint32_t p0 = x.planes[g] & 0xffu, p1 = (x.planes[g] >> 8) & 0xffu;
      const uint32_t p2 = x.planes[g] >> 16;
      esc[g] = ~(p0 ^ f.lit_planes) & ~(p1 ^ (f.lit_planes >> 8)) & ~(p2 ^ (f.lit_planes >> 16)) &
               ((1u << cnt[g]) - 1u) & 0xffu;
      nbits[g] = 8 * __popc(esc[g]);
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (FULL || k < cnt[g]) nbits[g] += t.region[prefix_of(x.planes[g], k)] & 15u;
    }
  }
  const uint32_t total = round_positions(nbits, pos);
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    if (!cnt[g]) continue;
    if constexpr (Z) {
      uint32_t pre[2];
      prefix_bytes(x.planes[g], s_spread8, pre);
      dec_group_fast(pre, esc[g], x.rb[g][0], cnt[g], (bits + pos[g]) >> 3,
                     reinterpret_cast<const uint8_t*>(stage), f,
                     reinterpret_cast<uint16_t*>(out) + e0[g], err);
      continue;
    }
    uint32_t v[8], at = bits + pos[g];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t region = t.region[prefix_of(x.planes[g], k)];
      const uint32_t w = FULL || k < cnt[g] ? region & 15u : 0u;
      const uint32_t val = read_bits(stage, at, w);
      const bool lit = region >> 15;
      const uint32_t rank = ((region >> 4) & 0x3ffu) + val;
      if ((FULL || k < cnt[g]) && !lit && rank >= nranked) err |= kErrRank;
      uint32_t raw = 0;
#pragma unroll
      for (int j = 0; j < F::RAWB; ++j)
        raw |= static_cast<uint32_t>((x.rb[g][j] >> (8 * k)) & 0xffu) << (8 * j);
#pragma unroll
      for (int j = 0; j < F::RAWb; ++j) raw |= ((x.tb[g] >> (8 * j + k)) & 1u) << (8 * F::RAWB + j);
      v[k] = F::join(lit ? val : t.rank[min(rank, 255u)], raw);
      at += w;
    }
    store8(out + e0[g], cnt[g], v);
  }
  return total;
}

// Whether a block's whole rounds can take the fast path, checked once per block (uniform across
// the warp): raw bytes 8-aligned for vector loads, output aligned for vector stores (16 bytes for 8
// BF16 elements, 8 bytes for 8 FP8 ones). Every group of the block keeps its start's alignment.
template <class F>
__device__ inline bool round_aligned(const uint8_t* buf, const typename F::T* out, const Layout& L,
                                     long long start) {
  if constexpr (F::BYTE_CODED) return aligned(out + start, 8);
  return aligned(buf + L.raw_byte_at[0] + start, 8) && aligned(out + start, 16);
}

// This lane's plane bytes of a whole round whose first element is e: b[g][j], byte j of group g,
// read at immediate offsets from one pointer per plane (no 64-bit signed division per load). pf:
// the next round is whole too (same block); its plane bytes go into L2, all 4 sectors of each
// plane's 128 bytes (a hint that holds no register, unlike loading them ahead).
__device__ __forceinline__ void round_planes(const uint8_t* buf, const Layout& L, long long e,
                                             bool pf, uint32_t b[kGroups][3]) {
  const uint8_t* p0 = buf + L.prefix_at[0] + (e >> 3);
  const uint8_t* p1 = buf + L.prefix_at[1] + (e >> 3);
  const uint8_t* p2 = buf + L.prefix_at[2] + (e >> 3);
  if (pf) {
    const int q = kRound / 8 + 32 * (threadIdx.x & 3);
    prefetch_l2(p0 + q), prefetch_l2(p1 + q), prefetch_l2(p2 + q);
  }
#pragma unroll
  for (int g = 0; g < kGroups; ++g)
    b[g][0] = p0[32 * g], b[g][1] = p1[32 * g], b[g][2] = p2[32 * g];
}

// Escape counts (<= 8 per group) of a round: pos[g] = escapes before this lane's group g (earlier
// groups of the warp, then group g of earlier lanes); returns the round's escapes. One 32-bit scan
// of 8-bit fields: an exclusive count is <= 31 * 8, and only lane 31's inclusive sum (never sent
// on) can carry out of a field, which the subtraction undoes; the totals (<= 256) by two
// reductions into 16-bit fields.
__device__ inline uint32_t round_escapes(const uint32_t n[kGroups], uint32_t pos[kGroups]) {
  const int lane = threadIdx.x & 31;
  const uint32_t own = n[0] | n[1] << 8 | n[2] << 16 | n[3] << 24;
  uint32_t x = own;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const uint32_t y = __shfl_up_sync(kFull, x, d);
    if (lane >= d) x += y;
  }
  const uint32_t excl = x - own;
#if __CUDA_ARCH__ >= 800
  const uint32_t t01 = __reduce_add_sync(kFull, n[0] | n[1] << 16);
  const uint32_t t23 = __reduce_add_sync(kFull, n[2] | n[3] << 16);
#else
  uint32_t t01 = n[0] | n[1] << 16, t23 = n[2] | n[3] << 16;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1)
    t01 += __shfl_xor_sync(kFull, t01, d), t23 += __shfl_xor_sync(kFull, t23, d);
#endif
  const uint32_t b1 = t01 & 0xffffu, b2 = b1 + (t01 >> 16), b3 = b2 + (t23 & 0xffffu);
  pos[0] = excl & 0xffu;
  pos[1] = b1 + ((excl >> 8) & 0xffu);
  pos[2] = b2 + ((excl >> 16) & 0xffu);
  pos[3] = b3 + (excl >> 24);
  return b3 + (t23 >> 16);
}

// BF16 under a byte-escape table, a whole round of an aligned block: vector loads and stores,
// and every escape of a group patched at once. s[g] holds the prefix nibbles with bit 3 of nibble
// k set where element k escapes (prefix == L); prmt's sign mode then replicates the msb of the
// looked-up byte for those elements, which is harmless: their exponent byte is replaced by the
// escape byte, and the literal prefix's bad byte is 0. pf: as in round_planes (raw bytes too).
__device__ inline uint32_t dec_round_z(const uint8_t* buf, uint16_t* out, const Layout& L,
                                       long long start, int r, const Fast& f,
                                       const uint32_t* s_spread4, uint32_t bits,
                                       const uint32_t* stage, int& err, bool pf) {
  const long long e = start + static_cast<long long>(r) * kRound + 8 * (threadIdx.x & 31);
  const unsigned long long* rw =
      reinterpret_cast<const unsigned long long*>(buf + L.raw_byte_at[0] + e);
  if (pf) {  // the next round's raw bytes into L2
#pragma unroll
    for (int g = 0; g < kGroups; ++g) prefetch_l2(rw + kRound / 8 + 32 * g);
  }
  uint32_t s[kGroups], nbits[kGroups], pos[kGroups], b[kGroups][3];
  round_planes(buf, L, e, pf, b);
  unsigned long long rb[kGroups];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) rb[g] = rw[32 * g];
  const uint32_t lit = f.lit_rep;  // L in every nibble
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const uint32_t sel = prefix_nibbles(b[g][0], b[g][1], b[g][2], s_spread4);
    const uint32_t x = sel ^ lit;  // nibble zero where the element escapes
    const uint32_t esc = ~(x | ((x & 0x77777777u) + 0x77777777u)) & 0x88888888u;
    s[g] = sel | esc;
    nbits[g] = __popc(esc);  // escapes
  }
  const uint32_t total = 8 * round_escapes(nbits, pos);  // pos[g]: in escape bytes
  const uint32_t base = bits >> 3;  // bits: whole bytes here
  uint32_t bad = 0;
  uint16_t* o = out + e;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const uint32_t sv = s[g], esc = sv & 0x88888888u;
    uint32_t ex0 = prmt(f.sym_lo, f.sym_hi, sv), ex1 = prmt(f.sym_lo, f.sym_hi, sv >> 16);
    bad |= prmt(f.bad_lo, f.bad_hi, sv) | prmt(f.bad_lo, f.bad_hi, sv >> 16);
    if (esc) {
      // The group's escape bytes start at stream byte `at`. Take the 8 stream bytes from there
      // (big-endian in a, bb: stream byte at + j is prmt index j ^ 3); escape k takes the byte
      // after the group's earlier escapes.
      const uint32_t at = base + pos[g];
      const uint32_t i = at >> 2, sh = 8u * (at & 3u);
      const uint32_t w0 = stage[i], w1 = stage[i + 1], w2 = stage[i + 2];
      const uint32_t a = __funnelshift_l(w1, w0, sh), bb = __funnelshift_l(w2, w1, sh);
      const uint32_t src = ((esc >> 3) * 0x11111110u) ^ 0x33333333u;  // nibble k: j ^ 3
      const uint32_t mix = 0x76547654u ^ (esc >> 1);  // nibble k: k (escape) or 4 + k (table)
      ex0 = prmt(prmt(a, bb, src), ex0, mix);
      ex1 = prmt(prmt(a, bb, src >> 16), ex1, mix >> 16);
    }
    // BF16 of element k: high byte sign | exponent >> 1, low byte exponent << 7 | mantissa.
    const uint32_t r0 = static_cast<uint32_t>(rb[g]), r1 = static_cast<uint32_t>(rb[g] >> 32);
    const uint32_t h0 = bitsel<0x7f7f7f7fu>(ex0 >> 1, r0), l0 = bitsel<0x80808080u>(ex0 << 7, r0);
    const uint32_t h1 = bitsel<0x7f7f7f7fu>(ex1 >> 1, r1), l1 = bitsel<0x80808080u>(ex1 << 7, r1);
    *reinterpret_cast<uint4*>(o + 256 * g) = make_uint4(
        prmt(l0, h0, 0x5140), prmt(l0, h0, 0x7362), prmt(l1, h1, 0x5140), prmt(l1, h1, 0x7362));
  }
  if (bad) err |= kErrRank;
  return total;
}

// Byte-coded formats (FP8): per-prefix widths in registers, looked up four elements at a time by
// byte permutes; each element's bit offset in its half group by one multiply (a byte-wise prefix
// sum of the widths); one shared table, in the compact layout of region_off, maps (prefix,
// payload value) to the symbol, or flags an illegal rank (bit 8).
constexpr int kSym2 = 8 * 256;

__device__ inline uint16_t sym2_entry(const int32_t* tab, const DecTab& t, uint32_t nranked,
                                      int i) {
  const uint32_t r = tab[kRegionAt + (i >> 8)], v = i & 0xffu;
  if (r >> 15) return static_cast<uint16_t>(v);  // literal region: the value is the symbol
  const uint32_t rank = ((r >> 4) & 0x3ffu) + v;
  return rank < nranked ? t.rank[rank] : 0x100;
}

// The compact layout of the (prefix, value) table: regions in ascending width (then prefix),
// region p at the sum of the earlier regions' sizes rounded up to its own size 2^w_p, so that
// off_p / 2^w_p <= 7 and every entry is below 8 * 256. Entry off_p + v is then (off_p >> w_p)
// << w_p | v, one funnel shift, and concurrent lookups spread over more banks than at p << 8 | v.
__device__ inline uint32_t region_off(const int32_t* tab, int p) {
  const uint32_t wp = static_cast<uint32_t>(tab[kRegionAt + p]) & 15u;
  uint32_t sum = 0;
  for (int q = 0; q < 8; ++q) {
    const uint32_t wq = static_cast<uint32_t>(tab[kRegionAt + q]) & 15u;
    if (wq < wp || (wq == wp && q < p)) sum += 1u << wq;
  }
  return (sum + (1u << wp) - 1u) & ~((1u << wp) - 1u);
}

__device__ inline uint32_t width_bytes(const int32_t* tab, int first) {
  uint32_t w = 0;
  for (int p = 0; p < 4; ++p) w |= (static_cast<uint32_t>(tab[kRegionAt + first + p]) & 15u) << (8 * p);
  return w;
}

// The four symbol bytes of element entries e[0..3] (low bytes) as one word.
__device__ inline uint32_t pack4(const uint32_t e[4]) {
  return __byte_perm(__byte_perm(e[0], e[1], 0x0040), __byte_perm(e[2], e[3], 0x0040), 0x5410);
}

// The width bytes of a half group (0 past the group's count); volatile: recomputed after the
// scan instead of held across it.
__device__ inline uint32_t width_of(uint32_t w_lo, uint32_t w_hi, uint32_t sel, int cnt, bool hi) {
  uint32_t d;
  asm volatile("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(w_lo), "r"(w_hi), "r"(sel & 0x7777u));
  return d & valid_bytes(cnt, hi);
}

template <bool FULL>
__device__ inline uint32_t dec_round_byte(const uint8_t* buf, uint8_t* out, const Layout& L,
                                          long long start, int r, uint32_t w_lo, uint32_t w_hi,
                                          uint32_t hb_lo, uint32_t hb_hi, const uint16_t* s_sym2,
                                          const unsigned long long* s_spread8, uint32_t bits,
                                          const uint32_t* stage, int& err) {
  uint32_t sel[kGroups][2], nbits[kGroups], pos[kGroups];
  int cnt[kGroups];
  long long e0[kGroups];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    cnt[g] = group_count<FULL>(L, start, r, g, e0[g]);
    uint32_t planes = 0;
    if (cnt[g]) {
#pragma unroll
      for (int j = 0; j < 3; ++j)
        planes |= static_cast<uint32_t>(buf[L.prefix_at[j] + e0[g] / 8]) << (8 * j);
    }
    uint32_t pre[2];
    prefix_bytes(planes, s_spread8, pre);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sel[g][h] = __byte_perm(pre[h] | (pre[h] >> 4), 0u, 0x4420);  // nibble k: prefix k
    }
    nbits[g] = ((width_of(w_lo, w_hi, sel[g][0], cnt[g], 0) * 0x01010101u) >> 24) +
               ((width_of(w_lo, w_hi, sel[g][1], cnt[g], 1) * 0x01010101u) >> 24);
  }
  const uint32_t total = round_positions(nbits, pos);
  uint32_t bad = 0;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    if (!cnt[g]) continue;
    uint32_t at = bits + pos[g], word[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t wb = width_of(w_lo, w_hi, sel[g][h], cnt[g], h);
      const uint32_t i = at >> 5;
      const uint32_t win = __funnelshift_l(stage[i + 1], stage[i], at & 31u);  // <= 32 bits
      const uint32_t incl = wb * 0x01010101u, excl = incl - wb;
      const uint32_t hb = __byte_perm(hb_lo, hb_hi, sel[g][h]);  // off_p >> w_p per element
      uint32_t e[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t w = (wb >> (8 * k)) & 0xffu, x = (excl >> (8 * k)) & 0xffu;
        const uint32_t val = __funnelshift_l(win << x, 0u, w);  // the top w bits, 0 if w = 0
        e[k] = s_sym2[(((hb >> (8 * k)) & 0xffu) << w) | val];  // off_p + val
        if (FULL || 4 * h + k < cnt[g]) bad |= e[k];
      }
      word[h] = pack4(e);
      at += incl >> 24;
    }
    store_bytes(out + e0[g], cnt[g], word[0] | static_cast<unsigned long long>(word[1]) << 32);
  }
  if (bad & 0x100u) err |= kErrRank;
  return total;
}

// FP8, a whole round of an aligned block, with an 8-byte store per group. Entry off_p + v of the
// symbol table is one funnel shift of the per-prefix byte hb = off_p >> w (<= 7) and the payload
// bits; the bit window shifts left by each width in turn (funnel shifts read only the low 5 bits
// of the amount, so the width bytes need no masking). pf: as in round_planes.
__device__ inline uint32_t dec_round_byte_z(const uint8_t* buf, uint8_t* out, const Layout& L,
                                            long long start, int r, uint32_t w_lo, uint32_t w_hi,
                                            uint32_t hb_lo, uint32_t hb_hi, const uint16_t* s_sym2,
                                            const uint32_t* s_spread4, uint32_t bits,
                                            const uint32_t* stage, int& err, bool pf) {
  const long long e = start + static_cast<long long>(r) * kRound + 8 * (threadIdx.x & 31);
  uint32_t sel[kGroups], nbits[kGroups], pos[kGroups], b[kGroups][3];
  round_planes(buf, L, e, pf, b);
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    sel[g] = prefix_nibbles(b[g][0], b[g][1], b[g][2], s_spread4);
    const uint32_t wl = prmt(w_lo, w_hi, sel[g]), wh = prmt(w_lo, w_hi, sel[g] >> 16);
    nbits[g] = ((wl * 0x01010101u) >> 24) + ((wh * 0x01010101u) >> 24);
  }
  const uint32_t total = round_positions(nbits, pos);
  uint32_t bad = 0;
  uint8_t* o = out + e;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    uint32_t at = bits + pos[g], word[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t sh = h ? sel[g] >> 16 : sel[g];
      const uint32_t wb = prmt(w_lo, w_hi, sh), hb = prmt(hb_lo, hb_hi, sh);
      const uint32_t i = at >> 5;
      uint32_t t = __funnelshift_l(stage[i + 1], stage[i], at);  // <= 32 bits from `at`
      uint32_t ent[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t w = wb >> (8 * k);  // low 5 bits: width k
        ent[k] = s_sym2[__funnelshift_l(t, prmt(hb, 0u, 0x4440 + k), w)];
        if (k < 3) t = __funnelshift_l(0u, t, w);
      }
      bad |= (ent[0] | ent[1]) | (ent[2] | ent[3]);
      word[h] = pack4(ent);
      at += (wb * 0x01010101u) >> 24;
    }
    *reinterpret_cast<uint2*>(o + 256 * g) = make_uint2(word[0], word[1]);
  }
  if (bad & 0x100u) err |= kErrRank;
  return total;
}

// Stage `len` payload bytes from `src` into big-endian words (stream byte i at stage byte i ^ 3),
// with two zero words after them (the bit reader looks one word ahead); bytes outside [lo, hi)
// are never read.
__device__ inline void stage_payload(uint32_t* stage, const uint8_t* src, uint32_t len,
                                     const uint8_t* lo, const uint8_t* hi) {
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t shift = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(src) & 3u);
  const uint8_t* base = src - shift;
  const uint32_t used = (len + 3) / 4;
  for (uint32_t k = lane; k < used + 2; k += 32) {
    uint32_t v = 0;
    if (k < used) {
      const uint32_t a = load_word_within(base + 4 * k, lo, hi);
      const uint32_t b = shift ? load_word_within(base + 4 * k + 4, lo, hi) : 0u;
      v = __funnelshift_r(a, b, 8u * shift);
      if (4 * k + 4 > len) v &= (1u << (8 * (len - 4 * k))) - 1u;  // len - 4k in 1..3
    }
    stage[k] = __byte_perm(v, 0, 0x0123);
  }
}

// FP8 staging with several word loads in flight per lane: when the payload's words (from the
// 4-aligned `base` on) all lie inside [lo, hi), each lane loads kStageU words (and their
// successors) before it stores any, so a block costs used / (32 kStageU) memory latencies instead
// of used / 32. The words are the same as stage_payload's (same funnel shift, same mask of the
// last word, zeros at used and used + 1). Elsewhere (a block at the very end of the stream, a
// stream start that is not 4-aligned): stage_payload.
constexpr int kStageU = 8;

__device__ inline void stage_payload_wide(uint32_t* stage, const uint8_t* src, uint32_t len,
                                          const uint8_t* lo, const uint8_t* hi) {
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t shift = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(src) & 3u);
  const uint8_t* base = src - shift;
  const uint32_t used = (len + 3) / 4, nraw = used + (shift ? 1u : 0u);
  if (base >= lo && base + 4ull * nraw <= hi) {  // uniform across the warp
    const uint32_t* s = reinterpret_cast<const uint32_t*>(base);
    const uint32_t sh = 8u * shift;
    for (uint32_t k0 = 0; k0 < used + 2; k0 += 32 * kStageU) {
      uint32_t a[kStageU], b[kStageU];
#pragma unroll
      for (int u = 0; u < kStageU; ++u) {
        const uint32_t k = k0 + 32 * u + lane;
        a[u] = k < used ? __ldg(s + k) : 0u;
        b[u] = k < used && shift ? __ldg(s + k + 1) : 0u;
      }
#pragma unroll
      for (int u = 0; u < kStageU; ++u) {
        const uint32_t k = k0 + 32 * u + lane;
        uint32_t v = __funnelshift_r(a[u], b[u], sh);
        if (k < used && 4 * k + 4 > len) v &= (1u << (8 * (len - 4 * k))) - 1u;  // len - 4k in 1..3
        if (k < used + 2) stage[k] = __byte_perm(v, 0, 0x0123);
      }
    }
    return;
  }
  stage_payload(stage, src, len, lo, hi);
}

// Each warp decodes whole blocks. The payload stream is `pay` (payload_cap bytes): the
// container's own payload section, or a separate buffer. Whole rounds of an aligned block
// (round_aligned) take dec_round_z or dec_round_byte_z, the rest the general code. The byte-coded
// and BF16 fast-path decoders are held to 64 registers, with no spills: four CTAs per SM instead
// of two or three, which the latency-bound decoders need (86 -> 64 registers once took BF16 from
// 1414 to 1732 GB/s; the generic kernels need more registers).
template <class F, bool Z>
__global__ void __launch_bounds__(32 * kMaxWarps, (F::BYTE_CODED || Z) ? 4 : 1)
decode_kernel(const uint8_t* __restrict__ buf, const uint8_t* __restrict__ pay,
              typename F::T* __restrict__ out, const Layout L, const int32_t* __restrict__ tab,
              int* __restrict__ flag) {
  __shared__ DecTab t;
  __shared__ uint16_t s_sym2[F::BYTE_CODED ? kSym2 : 1];
  constexpr bool kSpread = Z || F::BYTE_CODED;
  __shared__ unsigned long long s_spread8[kSpread ? 256 : 1];  // bit k of a plane byte -> byte k
  __shared__ uint32_t s_spread4[kSpread ? 256 : 1];  // bit k of a plane byte -> nibble k
  __shared__ uint32_t s_off[F::BYTE_CODED ? 8 : 1];  // compact symbol table: region offsets
  extern __shared__ uint4 s_stage[];
  const long long head = L.crc_at + 4;
  if (L.raw_size > 0 && buf[kLayoutAt] == kLayoutRaw) {  // uniform: the tensor's bytes follow
    grid_copy(reinterpret_cast<uint8_t*>(out), buf + head, L.raw_size - head);
    return;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t* stage = reinterpret_cast<uint32_t*>(s_stage) + warp * stage_words(L.block);
  if constexpr (kSpread) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
      unsigned long long v = 0;
      for (int k = 0; k < 8; ++k) v |= static_cast<unsigned long long>((i >> k) & 1) << (8 * k);
      s_spread8[i] = v;
      uint32_t u = 0;
      for (int k = 0; k < 8; ++k) u |= static_cast<uint32_t>((i >> k) & 1) << (4 * k);
      s_spread4[i] = u;
    }
  }
  if constexpr (Z) {
    __syncthreads();
  } else {
    if (threadIdx.x < 8) t.region[threadIdx.x] = tab[kRegionAt + threadIdx.x];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) t.rank[i] = static_cast<uint8_t>(tab[kRankAt + i]);
    if (F::BYTE_CODED && threadIdx.x < 8) s_off[threadIdx.x] = region_off(tab, threadIdx.x);
    __syncthreads();
  }
  const uint32_t nranked = tab[kCountAt];
  const Fast f = Z ? load_fast(tab) : Fast{};
  const uint32_t w_lo = F::BYTE_CODED ? width_bytes(tab, 0) : 0u;
  const uint32_t w_hi = F::BYTE_CODED ? width_bytes(tab, 4) : 0u;
  uint32_t hb_lo = 0, hb_hi = 0;  // byte p: s_off[p] >> w_p
  if constexpr (F::BYTE_CODED) {
    for (int p = 0; p < 8; ++p) {
      const uint32_t hb = s_off[p] >> (static_cast<uint32_t>(tab[kRegionAt + p]) & 15u);
      if (p < 4) hb_lo |= hb << (8 * p); else hb_hi |= hb << (8 * (p - 4));
    }
    for (int i = threadIdx.x; i < kSym2; i += blockDim.x) {
      uint16_t v = 0;  // alignment padding: never read
      for (int p = 0; p < 8; ++p) {
        const uint32_t d = static_cast<uint32_t>(i) - s_off[p];
        if (d < (1u << (static_cast<uint32_t>(tab[kRegionAt + p]) & 15u)))
          v = sym2_entry(tab, t, nranked, p << 8 | static_cast<int>(d));
      }
      s_sym2[i] = v;
    }
    __syncthreads();
  }
  // payload_bytes < 0: the size is the one in the buffer's own header (a collective's receiver
  // learns it only here); a payload past the room it was sent with is not decoded at all.
  const unsigned long long size = L.payload_bytes >= 0
      ? static_cast<unsigned long long>(L.payload_bytes) : load_bytes(buf + L.size_field_at, 8);
  if (size > static_cast<unsigned long long>(L.payload_cap)) {  // uniform across the grid
    if (threadIdx.x == 0 && blockIdx.x == 0) atomicOr(flag, kErrRoom);
    return;
  }
  int err = 0;
  const long long warps = static_cast<long long>(gridDim.x) * (blockDim.x >> 5);
  for (long long b = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + warp; b < L.nb;
       b += warps) {
    if constexpr (F::BYTE_CODED) {  // hints: next block's offsets, this block's planes
      if (b + warps < L.nb) prefetch_l2(buf + L.offsets_at + 8 * (b + warps));
      const long long s0 = b * L.block, q = 32 * lane;
      if (q < L.block / 8 && s0 + 8 * q < L.n) {
#pragma unroll
        for (int j = 0; j < 3; ++j) prefetch_l2(buf + L.prefix_at[j] + (s0 >> 3) + q);
      }
    }
    const unsigned long long lo = load_bytes(buf + L.offsets_at + 8 * b, 8);
    const unsigned long long hi = b + 1 < L.nb ? load_bytes(buf + L.offsets_at + 8 * (b + 1), 8) : size;
    if (!(lo <= hi && hi <= size && hi - lo <= static_cast<unsigned long long>(L.block))) {
      err |= kErrOffsets;  // uniform across the warp: nothing below is read
      continue;
    }
    const uint32_t len = static_cast<uint32_t>(hi - lo);
    if constexpr (F::BYTE_CODED)
      stage_payload_wide(stage, pay + lo, len, pay, pay + L.payload_cap);
    else
      stage_payload(stage, pay + lo, len, pay, pay + L.payload_cap);
    __syncwarp();
    const long long start = b * L.block;
    uint32_t bits = 0;
    const bool fast = round_aligned<F>(buf, out, L, start);  // uniform across the warp
    for (int r = 0; r < rounds(L); ++r) {
      const bool full = full_round(L, start, r);
      if constexpr (F::BYTE_CODED) {
        uint8_t* o = reinterpret_cast<uint8_t*>(out);
        if (full && fast)
          bits += dec_round_byte_z(buf, o, L, start, r, w_lo, w_hi, hb_lo, hb_hi, s_sym2, s_spread4,
                                   bits, stage, err,
                                   r + 1 < rounds(L) && full_round(L, start, r + 1));
        else
          bits += full ? dec_round_byte<true>(buf, o, L, start, r, w_lo, w_hi, hb_lo, hb_hi, s_sym2,
                                              s_spread8, bits, stage, err)
                       : dec_round_byte<false>(buf, o, L, start, r, w_lo, w_hi, hb_lo, hb_hi,
                                               s_sym2, s_spread8, bits, stage, err);
      } else if (Z && full && fast) {
        bits += dec_round_z(buf, reinterpret_cast<uint16_t*>(out), L, start, r, f, s_spread4, bits,
                            stage, err, r + 1 < rounds(L) && full_round(L, start, r + 1));
      } else if (full) {
        bits += dec_round<F, Z, true>(buf, out, L, start, r, t, nranked, f, s_spread8, bits,
                                      stage, err);
      } else {
        bits += dec_round<F, Z, false>(buf, out, L, start, r, t, nranked, f, s_spread8, bits,
                                       stage, err);
      }
    }
    if (lane == 0) {
      const uint32_t nbytes = (bits + 7u) >> 3, tail = bits & 7u;
      const uint8_t* bytes = reinterpret_cast<const uint8_t*>(stage);
      if (nbytes != len) err |= kErrSize;
      else if (tail && (bytes[(nbytes - 1) ^ 3u] & ((1u << (8u - tail)) - 1u))) err |= kErrPadding;
      const int used = static_cast<int>(L.n & 7);
      if (b == L.nb - 1 && used) {
        const long long last = (L.n - 1) / 8;
        for (int j = 0; j < 3; ++j)
          if (buf[L.prefix_at[j] + last] >> used) err |= kErrPlanePad;
        for (int j = 0; j < F::RAWb; ++j)
          if (buf[L.raw_bit_at[j] + last] >> used) err |= kErrPlanePad;
      }
    }
    __syncwarp();  // the stage is read out before the next block is staged
  }
  if (err) atomicOr(flag, err);
}

// ------------------------------------------------------------------------------ launchers

// Persistent grids: as many CTAs as can be resident at once (never more than needed).
// The occupancy query costs microseconds of host time per call, so the answer is remembered per
// (kernel, device, threads, shared memory): kernels of one signature share this instantiation's
// table, and their occupancies differ. One process sees few of each. (ctypes releases
// the GIL around the launchers, hence the lock.)
template <typename K>
unsigned resident_grid(K kernel, int threads, size_t smem, long long ctas) {
  struct Seen { const void* kernel; int dev, threads; size_t smem; long long grid; };
  static Seen seen[32];
  static int nseen = 0;
  static std::mutex lock;
  const std::lock_guard<std::mutex> hold(lock);
  int dev = 0;
  cudaGetDevice(&dev);
  long long grid = 0;
  for (int i = 0; i < nseen; ++i)
    if (seen[i].kernel == reinterpret_cast<const void*>(kernel) && seen[i].dev == dev &&
        seen[i].threads == threads && seen[i].smem == smem)
      grid = seen[i].grid;
  if (!grid) {
    int per_sm = 1, sms = 1;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    grid = static_cast<long long>(per_sm > 0 ? per_sm : 1) * sms;
    if (nseen < 32) {
      seen[nseen++] = {reinterpret_cast<const void*>(kernel), dev, threads, smem, grid};
    }
  }
  return static_cast<unsigned>(grid < ctas ? grid : ctas);
}

// The encoder's launches once its table is ready (and its tile sums zero): encode, finish.
template <class F, bool Z>
int launch_encode(const void* in, void* out, const Layout* L, const int32_t* tab, void* work,
                  const uint8_t* head, const uint8_t* raw_head, long long* size, cudaStream_t s) {
  const int warps = warps_for(L->block), threads = 32 * warps;
  const size_t smem = static_cast<size_t>(warps) * stage_words(L->block) * 4;
  const long long ctas = (L->nb + warps - 1) / warps;
  const Work w = work_of(work, L->nb);
  uint8_t* o = static_cast<uint8_t*>(out);
  encode_kernel<F, Z><<<resident_grid(encode_kernel<F, Z>, threads, smem, ctas), threads, smem, s>>>(
      static_cast<const typename F::T*>(in), o, *L, tab, w);
  const long long copiers = L->raw_size >> 18;  // CTAs to share a raw store, 256 KiB each
  const long long groups = (L->nb + kGroup - 1) / kGroup;
  finish_kernel<<<resident_grid(finish_kernel, 32 * kGroup, 0, groups > copiers ? groups : copiers),
                  32 * kGroup, 0, s>>>(static_cast<const uint8_t*>(in), o, *L, w, head, raw_head,
                                       size);
  return cudaGetLastError();
}

template <class F, bool Z = false>
int launch_decode(const void* buf, const void* pay, void* out, const Layout* L, const int32_t* tab,
                  int* flag, cudaStream_t s) {
  const int warps = warps_for(L->block), threads = 32 * warps;
  const size_t smem = static_cast<size_t>(warps) * stage_words(L->block) * 4;
  const long long ctas = (L->nb + warps - 1) / warps;
  decode_kernel<F, Z><<<resident_grid(decode_kernel<F, Z>, threads, smem, ctas), threads, smem, s>>>(
      static_cast<const uint8_t*>(buf), static_cast<const uint8_t*>(pay),
      static_cast<typename F::T*>(out), *L, tab, flag);
  return cudaGetLastError();
}

// Calls `run(format, fast)` for a kernel kind (zipccl/_cuda.py KIND): 0 bfloat16, 1 float16,
// 2 float32, 3 FP8 (both formats code the whole byte), 4 bfloat16 under a byte-escape table
// (the fast path, fast = true).
template <class Run>
int by_kind(int kind, Run&& run) {
  switch (kind) {
    case 0: return run(BF16{}, std::false_type{});
    case 1: return run(FP16{}, std::false_type{});
    case 2: return run(FP32{}, std::false_type{});
    case 3: return run(FP8{}, std::false_type{});
    case 4: return run(BF16{}, std::true_type{});
    default: return cudaErrorInvalidValue;
  }
}

// ------------------------------------------------------------------------------ sample summary

// The value of an exponent format's bit pattern (FP8 has none here: its tables are presets).
template <class F>
__device__ inline double value_of(uint32_t x) {
  if constexpr (F::BITS == 32) return __uint_as_float(x);
  else if constexpr (F::MMASK == 0x7fu) return __uint_as_float(x << 16);
  else return __half2float(__ushort_as_half(static_cast<unsigned short>(x)));
}

// The sample is read as kSlots interleaved slots: slot i holds the values in[i * stride],
// in[(i + kSlots) * stride], ... (the sample's values i, i + kSlots, ...). Each slot is summed in
// order, the 32 slots of a warp by a shuffle tree, and the kSlots / 32 warp sums in order: the
// same bits on every run, whether one CTA or many read the slots.
constexpr int kSlots = 1024;
constexpr int kSampleSize = 65536;  // golden.theory.SAMPLE_SIZE: the most values a sample holds
struct Sums {  // the finite non-zero values' squares, their count, the zero count (FP8: zero)
  double sq, live, zeros;
};

// The sums of sample slot `slot`; with HIST, the count of each symbol added to `hist`.
// Strided loads are latency-bound: IN of them are in flight at once.
template <class F, bool HIST, int IN>
__device__ inline Sums slot_sums(const typename F::T* __restrict__ in, long long stride,
                                 long long count, long long slot, unsigned* hist) {
  constexpr int kInFlight = IN;
  Sums s{0.0, 0.0, 0.0};
  for (long long i0 = slot; i0 < count; i0 += kInFlight * kSlots) {
    uint32_t v[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const long long i = i0 + static_cast<long long>(k) * kSlots;
      v[k] = i < count ? static_cast<uint32_t>(in[i * stride]) : 0u;
    }
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      if (i0 + static_cast<long long>(k) * kSlots >= count) break;
      const uint32_t x = v[k];
      if constexpr (HIST) atomicAdd(&hist[F::sym(x)], 1u);
      if constexpr (!F::BYTE_CODED) {
        const double d = value_of<F>(x);
        if (d == 0.0) {
          s.zeros += 1.0;
        } else if (isfinite(d)) {
          s.sq += d * d;
          s.live += 1.0;
        }
      }
    }
  }
  return s;
}

// The warp's sum of its lanes' Sums, in lane 0.
__device__ inline Sums warp_sums(Sums s) {
  for (int d = 16; d; d >>= 1) {
    s.sq += __shfl_down_sync(kFull, s.sq, d);
    s.live += __shfl_down_sync(kFull, s.live, d);
    s.zeros += __shfl_down_sync(kFull, s.zeros, d);
  }
  return s;
}

// Component i of the kSlots / 32 warp sums, added in order.
__device__ inline double sum_warps(const double (*part)[3], int i) {
  double total = 0.0;
  for (int w = 0; w < kSlots / 32; ++w) total += part[w][i];
  return total;
}

// codec.sample_summary in one CTA of kSlots threads: words 0-2 the float64 bits of the sample's
// sums, then the count of each of the 256 symbols.
template <class F>
__global__ void __launch_bounds__(kSlots)
summary_kernel(const typename F::T* __restrict__ in, long long stride, long long count,
               long long* __restrict__ out) {
  __shared__ unsigned s_hist[256];
  __shared__ double s_part[kSlots / 32][3];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) s_hist[i] = 0;
  __syncthreads();
  const Sums w = warp_sums(slot_sums<F, true, 16>(in, stride, count, threadIdx.x, s_hist));
  if ((threadIdx.x & 31) == 0) {
    s_part[threadIdx.x >> 5][0] = w.sq;
    s_part[threadIdx.x >> 5][1] = w.live;
    s_part[threadIdx.x >> 5][2] = w.zeros;
  }
  __syncthreads();
  if (threadIdx.x < 3) out[threadIdx.x] = __double_as_longlong(sum_warps(s_part, threadIdx.x));
  for (int i = threadIdx.x; i < 256; i += blockDim.x) out[3 + i] = s_hist[i];
}

// The theory kernel's scratch, after the header stage in a compress call's scratch (zeroed by the
// call's memset).
struct TheoryControl {
  unsigned ticket;  // sampling warps done
  unsigned pad;
  double part[kSlots / 32][3];  // each sampling warp's sums
};

// codec.default_table on the device: golden.theory.zipccl_table from the sample's statistics
// (RMS of the finite non-zero values, zero share), as table words in `words` and as the header
// template `head` (table bytes zero) completed with the table and its hash in `stage`. Launched
// as kSlots / 32 CTAs whose first warp reads 32 sample slots (the sample is strided: one SM alone
// reads it at a fraction of the memory's speed); the last CTA to finish (a ticket, no waiting)
// adds the warps' sums in summary_kernel's order and builds the table, one bin per thread.
constexpr int kTheoryThreads = 256;
template <class F>
__global__ void __launch_bounds__(kTheoryThreads)
theory_kernel(const typename F::T* __restrict__ in, long long stride, long long count,
              const uint8_t* __restrict__ head, uint8_t* __restrict__ stage,
              int32_t* __restrict__ words) {
  __shared__ double s_cdf[257], s_prob[256], s_sums[3];
  __shared__ uint8_t s_tb[kTableBytes];
  __shared__ bool s_last;
  __shared__ unsigned long long s_hash;
  auto* ctl = reinterpret_cast<TheoryControl*>(stage + kMaxHeader);
  const int tid = threadIdx.x, lane = tid & 31;
  if (tid < 32) {
    const Sums w = warp_sums(
        slot_sums<F, false, kSampleSize / kSlots>(in, stride, count, blockIdx.x * 32ll + lane,
                                                     nullptr));
    if (lane == 0) {
      ctl->part[blockIdx.x][0] = w.sq;
      ctl->part[blockIdx.x][1] = w.live;
      ctl->part[blockIdx.x][2] = w.zeros;
      __threadfence();
      s_last = atomicAdd(&ctl->ticket, 1u) == gridDim.x - 1;
    }
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();  // the other CTAs' sums are visible
  if (tid < 32) {
    const volatile double(*part)[3] = ctl->part;
    for (int i = 0; i < 3; ++i) {  // lane w loads warp w's sum; added in order, as sum_warps does
      const double mine = part[lane][i];
      double total = 0.0;
      for (int v = 0; v < kSlots / 32; ++v) total += __shfl_sync(kFull, mine, v);
      if (lane == 0) s_sums[i] = total;
    }
  }
  for (int i = tid; i < kTableBytes; i += blockDim.x) s_tb[i] = 0;
  __syncthreads();
  const double sigma = s_sums[1] > 0.0 ? sqrt(s_sums[0] / s_sums[1]) : 0.0;
  const double zeros = s_sums[2] / static_cast<double>(count);
  constexpr int top = (1 << F::EXP_BITS) - 1, bias = (1 << F::EXP_BITS) / 2 - 1;
  const bool spread = sigma > 0.0 && isfinite(sigma);
  for (int j = tid; j <= top + 1; j += blockDim.x)
    s_cdf[j] = spread ? theory_cdf(j, top, bias, sigma) : 0.0;
  __syncthreads();
  for (int i = tid; i < 256; i += blockDim.x)
    s_prob[i] = i <= top ? theory_prob(i, s_cdf[i], s_cdf[i + 1], zeros) : 0.0;
  __syncthreads();
  for (int i = tid; i < 256; i += blockDim.x) {  // golden.theory.top_symbols: the 7 best bins
    const int r = theory_rank(s_prob, i);
    if (r < kTop) s_tb[10 + r] = static_cast<uint8_t>(i);
  }
  if (tid == 0) s_tb[0] = 8 | kLiteralFlag, s_tb[8] = kTop;  // zipccl_layout: p0 escapes
  __syncthreads();
  table_words(s_tb, words);
  if (tid == 0) {
    unsigned long long key = 0;
    for (int r = 0; r < kTop; ++r) key |= static_cast<unsigned long long>(s_tb[10 + r]) << (8 * r);
    s_hash = theory_hash64(s_tb, key);
  }
  __syncthreads();
  for (int i = tid; i < kMaxHeader; i += blockDim.x) {
    const int t = i - kTableAt, h = i - kHashAt;
    stage[i] = t >= 0 && t < kTableBytes ? s_tb[t]
             : h >= 0 && h < 8 ? static_cast<uint8_t>(s_hash >> (8 * h)) : head[i];
  }
}

// The launchers run on `device` (the tensors' device), switching the host thread's current device
// for the call only where it differs.
class OnDevice {
 public:
  explicit OnDevice(int device) {
    cudaGetDevice(&prev_);
    if (prev_ != device) cudaSetDevice(device);
  }
  ~OnDevice() {
    int now = prev_;
    cudaGetDevice(&now);
    if (now != prev_) cudaSetDevice(prev_);
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int prev_ = 0;
};

}  // namespace

// Bytes of the `work` buffer zipccl_encode needs for `nb` blocks of `block` elements.
extern "C" long long zipccl_work_bytes(long long nb, long long block) {
  return scratch_at(nb) + nb * block + 16;
}

// `head`: golden's split-layout header with payload_bytes 0 (device memory), written with the
// real size and CRC; or null.
extern "C" int zipccl_encode(int device, int kind, const void* in, void* out, const Layout* L,
                             const int32_t* tab, void* work, const void* head, void* stream) {
  const OnDevice on(device);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t e = cudaMemsetAsync(work, 0, counts_at(L->nb), s);  // a new work area
  if (e != cudaSuccess) return e;
  const uint8_t* h = static_cast<const uint8_t*>(head);
  return by_kind(kind, [&](auto f, auto z) {
    return launch_encode<decltype(f), decltype(z)::value>(in, out, L, tab, work, h, nullptr,
                                                         nullptr, s);
  });
}

// codec.compress's kernels in one call, none of which waits for the host. `scratch`: the header
// stage (kMaxHeader bytes), the theory kernel's control, then the encoder's work area at
// kScratchWorkAt; one memset zeroes everything that must start at zero. `tab`: a given table's
// words; null builds golden.theory's table on the device (theory_kernel) from the `count` values
// `stride` apart into `words`, and completes the header template `head` with it in the stage.
// The buffer takes the raw layout (`raw_head`, L->raw_size) where the split one is not smaller;
// `size` gets [buffer bytes, payload bytes].
constexpr long long kScratchWorkAt = 2048;
static_assert(kMaxHeader + sizeof(TheoryControl) <= kScratchWorkAt, "scratch layout");

extern "C" int zipccl_compress(int device, int kind, const void* in, void* out, const Layout* L,
                               const int32_t* tab, int32_t* words, void* scratch,
                               const void* head, const void* raw_head, long long stride,
                               long long count, long long* size, void* stream) {
  const OnDevice on(device);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  uint8_t* stage = static_cast<uint8_t*>(scratch);
  void* work = stage + kScratchWorkAt;
  cudaError_t e = cudaMemsetAsync(scratch, 0, kScratchWorkAt + counts_at(L->nb), s);
  if (e != cudaSuccess) return e;
  const uint8_t* h = static_cast<const uint8_t*>(head);
  const uint8_t* rh = static_cast<const uint8_t*>(raw_head);
  return by_kind(kind, [&](auto f, auto z) {
    using F = decltype(f);
    if constexpr (F::BYTE_CODED) {
      if (!tab) return static_cast<int>(cudaErrorInvalidValue);  // FP8 has no theory table
    } else if (!tab) {
      theory_kernel<F><<<kSlots / 32, kTheoryThreads, 0, s>>>(
          static_cast<const typename F::T*>(in), stride, count, h, stage, words);
    }
    return launch_encode<F, decltype(z)::value>(in, out, L, tab ? tab : words, work,
                                                tab ? h : stage, rh, size, s);
  });
}

// `pay` is the payload stream (L->payload_cap bytes); L->payload_bytes < 0 takes its size from
// the header at `buf`. clear != 0 zeroes the flag first; else problems are OR-ed into it.
extern "C" int zipccl_decode(int device, int kind, const void* buf, const void* pay, void* out,
                             const Layout* L, const int32_t* tab, int* flag, int clear,
                             void* stream) {
  const OnDevice on(device);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (clear) {
    cudaError_t e = cudaMemsetAsync(flag, 0, sizeof(int), s);
    if (e != cudaSuccess) return e;
  }
  return by_kind(kind, [&](auto f, auto z) {
    return launch_decode<decltype(f), decltype(z)::value>(buf, pay, out, L, tab, flag, s);
  });
}

// codec.sample_summary of the `count` values at in[0], in[stride], ... into `out` (int64[259]).
extern "C" int zipccl_summary(int device, int kind, const void* in, long long stride, long long count,
                              void* out, void* stream) {
  const OnDevice on(device);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  return by_kind(kind, [&](auto f, auto) {
    using F = decltype(f);
    summary_kernel<F><<<1, kSlots, 0, s>>>(static_cast<const typename F::T*>(in), stride, count,
                                         static_cast<long long*>(out));
    return static_cast<int>(cudaGetLastError());
  });
}

extern "C" const char* zipccl_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}
