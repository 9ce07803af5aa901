// zipccl split-layout codec kernels (golden/container.py bytes), built by zipccl/_cuda.py (nvcc).
//
// A CTA codes one block of `block` elements at a time with T = max(32, block/32) threads; each
// thread owns up to 4 groups of 8 consecutive elements (group g of thread t starts at element
// g*8*T + 8*t, so warp accesses are contiguous). A group's 8 elements are one byte of every bit
// plane (prefix planes, FP16's raw bit planes) and one 8-byte store per raw byte plane. The payload
// bits of a block are placed by one CTA-wide scan of packed per-group bit counts into a
// shared-memory stream (MSB first, as golden packs them). CTAs are persistent (as many as fit on
// the GPU) and load their next block while coding the current one.
//
// Compress is one pass: CTAs take block ids from an atomic counter and find where their payload
// goes by a decoupled look-back over the earlier blocks' published byte counts (the single-pass
// scan of Merrill & Garland), then write the payload and their uint64 block offset straight into
// the container. Decompress reads the block offsets, stages the block's payload in shared memory
// and checks every block for consistency, reporting problems through an error flag.
//
// BF16 under a byte-escape table (the ZipCCL exponent layout) has its own path (Z = true): 4
// elements per 32-bit operation (byte permutes, 4-byte compares, multiply spreads and gathers)
// instead of one table lookup per element. Measured numbers: benchmarks/results/codec.md.
#include <cstdint>
#include <cuda_runtime.h>

constexpr int kGaps = 10;

// Mirrors the ctypes structure in zipccl/_cuda.py: all fields 64-bit, no padding. (Outside the
// anonymous namespace: the exported launchers take it, so it needs external linkage.)
struct Layout {
  long long n, nb, block, threads, ngaps;
  long long raw_byte_at[3], raw_bit_at[3], prefix_at[3];
  long long offsets_at, payload_at, capacity, payload_bytes;
  long long gap_lo[kGaps], gap_hi[kGaps];
};

namespace {

constexpr int kMaxThreads = 512;
constexpr int kFastThreads = 128;  // the fast path runs block = 4096 only: 8 CTAs of 128 per SM
constexpr int kGroups = 4;  // groups of 8 elements per thread: threads = max(32, block / 32)
constexpr unsigned kFull = 0xffffffffu;
constexpr unsigned long long kFlagAgg = 1ull << 62;
constexpr unsigned long long kFlagInc = 2ull << 62;
constexpr unsigned long long kValue = (1ull << 62) - 1;

// Error bits of the decoder's flag (zipccl/_cuda.py names them).
constexpr int kErrOffsets = 1, kErrSize = 2, kErrRank = 4, kErrPadding = 8, kErrPlanePad = 16;

// Table words (int32): [0,256) encoder: payload | prefix << 8 | width << 12;
// [256,264) regions: width | base << 4 | literal << 15; [264,520) rank -> symbol; [520] count.
constexpr int kRegionAt = 256, kRankAt = 264, kCountAt = 520;
// Byte-escape tables (one literal region, every ranked region of width 0: the ZipCCL exponent
// layout) also carry, for the BF16 fast path: [521] literal prefix L, [522..523] prefix -> symbol
// bytes, [524..525] prefix -> 0xFF if the prefix is illegal, [526] m, then m pairs
// (symbol splat to 4 bytes, its prefix splat to 4 bytes).
constexpr int kFastAt = 521;

// The fast path's table in registers.
struct Fast {
  uint32_t lit, sym_lo, sym_hi, bad_lo, bad_hi, m, sym[7], pre[7];
};

__device__ inline Fast load_fast(const int32_t* tab) {
  Fast f;
  f.lit = static_cast<uint32_t>(tab[kFastAt]) * 0x01010101u;
  f.sym_lo = tab[kFastAt + 1], f.sym_hi = tab[kFastAt + 2];
  f.bad_lo = tab[kFastAt + 3], f.bad_hi = tab[kFastAt + 4];
  f.m = tab[kFastAt + 5];
#pragma unroll
  for (int i = 0; i < 7; ++i) f.sym[i] = tab[kFastAt + 6 + 2 * i], f.pre[i] = tab[kFastAt + 7 + 2 * i];
  return f;
}

// 0xFF in each of the first `cnt` bytes of the low (hi=false) or high word of 8 elements.
__device__ inline uint32_t valid_bytes(int cnt, bool hi) {
  const int c = hi ? cnt - 4 : cnt;
  return c >= 4 ? 0xffffffffu : c <= 0 ? 0u : (1u << (8 * c)) - 1u;
}

// Bit k of a byte -> bit 0 of byte k, for bits 0..3 (nibble) of `b`.
__device__ inline uint32_t spread4(uint32_t b) { return ((b & 0xfu) * 0x00204081u) & 0x01010101u; }

// Bit j of bytes 0..3 of `x` -> bits 0..3.
__device__ inline uint32_t gather4(uint32_t x, int j) {
  return ((((x >> j) & 0x01010101u) * 0x01020408u) >> 24) & 0xfu;
}

template <int BITS> struct Uint;
template <> struct Uint<8> { using T = uint8_t; };
template <> struct Uint<16> { using T = uint16_t; };
template <> struct Uint<32> { using T = uint32_t; };

template <int BITS_, int MANT, int EXPB, bool BYTE>
struct Fmt {
  static constexpr int BITS = BITS_;
  using T = typename Uint<BITS>::T;
  static constexpr int RAW = BYTE ? 0 : 1 + MANT;
  static constexpr int RAWB = RAW / 8;  // raw byte planes
  static constexpr int RAWb = RAW % 8;  // raw bit planes
  static constexpr uint32_t MMASK = (1u << MANT) - 1;
  __device__ static uint32_t sym(uint32_t x) { return BYTE ? x : (x >> MANT) & ((1u << EXPB) - 1); }
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

// Load up to 8 elements (cnt of them); vectorised when all 8 are there and aligned.
template <typename T>
__device__ inline void load8(const T* p, int cnt, uint32_t v[8]) {
  if (cnt == 8 && aligned(p, sizeof(T) == 1 ? 8 : 16)) {
    if constexpr (sizeof(T) == 1) {
      uint2 w = __ldcs(reinterpret_cast<const uint2*>(p));
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = (w.x >> (8 * k)) & 0xff, v[k + 4] = (w.y >> (8 * k)) & 0xff;
    } else if constexpr (sizeof(T) == 2) {
      uint4 w = __ldcs(reinterpret_cast<const uint4*>(p));
      uint32_t a[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) v[2 * k] = a[k] & 0xffff, v[2 * k + 1] = a[k] >> 16;
    } else {
      uint4 w0 = __ldcs(reinterpret_cast<const uint4*>(p));
      uint4 w1 = __ldcs(reinterpret_cast<const uint4*>(p) + 1);
      v[0] = w0.x, v[1] = w0.y, v[2] = w0.z, v[3] = w0.w;
      v[4] = w1.x, v[5] = w1.y, v[6] = w1.z, v[7] = w1.w;
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = k < cnt ? p[k] : 0u;
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

// CTA-wide exclusive scan of a packed uint64 (4 16-bit group counters, each sum < 2^16;
// blockDim.x a multiple of 32); `total` gets the CTA sum.
__device__ inline unsigned long long block_scan(unsigned long long v, unsigned long long* sh,
                                                unsigned long long& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  unsigned long long x = v;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    unsigned long long y = __shfl_up_sync(kFull, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) sh[warp] = x;
  __syncthreads();
  if (warp == 0) {
    unsigned long long s = lane < nw ? sh[lane] : 0ull;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      unsigned long long y = __shfl_up_sync(kFull, s, d);
      if (lane >= d) s += y;
    }
    if (lane < nw) sh[lane] = s;
  }
  __syncthreads();
  const unsigned long long base = warp ? sh[warp - 1] : 0ull;
  total = sh[nw - 1];
  __syncthreads();
  return base + x - v;
}

// Bit position of each of a thread's groups: earlier groups of the whole CTA come first, then
// the same group's earlier threads (group g of thread t holds elements g*8*T + 8*t ...).
__device__ inline void group_positions(const uint32_t nbits[kGroups], unsigned long long* sh,
                                       uint32_t pos[kGroups], uint32_t& total) {
  unsigned long long packed = 0;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) packed |= static_cast<unsigned long long>(nbits[g]) << (16 * g);
  unsigned long long sums;
  const unsigned long long excl = block_scan(packed, sh, sums);
  uint32_t before = 0;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    pos[g] = before + static_cast<uint32_t>((excl >> (16 * g)) & 0xffffu);
    before += static_cast<uint32_t>((sums >> (16 * g)) & 0xffffu);
  }
  total = before;
}

// Write `n` (<= 64) bits of `acc`, MSB first, at bit `pos` of the shared payload stream.
__device__ inline void emit_bits(uint32_t* s_pay, uint32_t pos, unsigned long long acc, uint32_t n) {
  for (uint32_t rem = n; rem;) {
    const uint32_t B = pos >> 3, off = pos & 7u, take = min(8u - off, rem);
    const uint32_t byte = static_cast<uint32_t>((acc >> (rem - take)) & ((1u << take) - 1u))
                          << (8u - off - take);
    atomicOr(&s_pay[B >> 2], byte << (8u * (B & 3u)));
    pos += take;
    rem -= take;
  }
}

// Exclusive prefix of block b's byte count over blocks 0..b-1 (decoupled look-back, warp 0).
__device__ inline unsigned long long look_back(volatile unsigned long long* status, long long b,
                                               unsigned long long agg) {
  const int lane = threadIdx.x;
  if (b == 0) {
    if (lane == 0) status[0] = kFlagInc | agg;
    return 0;
  }
  if (lane == 0) status[b] = kFlagAgg | agg;
  unsigned long long excl = 0;
  for (long long idx = b - 1;; idx -= 32) {
    const long long j = idx - lane;
    unsigned long long s = kFlagInc;  // before block 0: an inclusive zero
    if (j >= 0) {
      do {
        s = status[j];
      } while ((s >> 62) == 0);
    }
    const unsigned inc = __ballot_sync(kFull, (s >> 62) == 2);
    const int stop = inc ? __ffs(inc) - 1 : 31;
    unsigned long long v = lane <= stop ? (s & kValue) : 0ull;
#pragma unroll
    for (int d = 16; d; d >>= 1) v += __shfl_down_sync(kFull, v, d);
    excl += __shfl_sync(kFull, v, 0);
    if (inc) break;
  }
  if (lane == 0) status[b] = kFlagInc | (excl + agg);
  return excl;
}

// Elements of group g of thread t: local index g*8*T + 8*t .. +7 (T = blockDim.x), so every warp
// load and store is contiguous; up to kGroups groups (block <= 32*T) are loaded up front.
__device__ inline int group_count(const Layout& L, long long start, int g, long long& e0) {
  const long long local = 8ll * (static_cast<long long>(g) * blockDim.x + threadIdx.x);
  e0 = start + local;
  return (local < L.block && e0 < L.n) ? static_cast<int>(min(8ll, L.n - e0)) : 0;
}

// What one thread loads for one block before coding it (prefetched a block ahead).
template <class F>
struct EncIn {
  uint32_t w[kGroups][2 * sizeof(typename F::T)];
};

template <class F>
__device__ inline void enc_load(const typename F::T* in, const Layout& L, long long b,
                                EncIn<F>& x) {
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    long long e0;
    const int cnt = group_count(L, b * L.block, g, e0);
    load_packed(in + (cnt ? e0 : 0), cnt, x.w[g]);
  }
}

// Code block b (input in registers) into the container; the CTA's shared payload stream must be
// zero on entry. Returns after the payload and the block offset are written.
__device__ inline void enc_finish(long long b, uint32_t total, uint8_t* out, const Layout& L,
                                  const uint32_t* s_pay, unsigned long long* s_excl,
                                  unsigned long long* work);

// BF16 under a byte-escape table, 8 elements in SIMD-within-a-register steps: exponent and raw
// bytes by byte permutes, prefixes by 4-byte compares, planes by multiply-gathers. Leaves the 8
// exponent bytes and the escape byte mask (0xff per escaped element) for the payload pass.
__device__ inline uint32_t enc_group_fast(const uint32_t w[4], int cnt, long long e, uint8_t* out,
                                          const Layout& L, const Fast& f, uint32_t ex[2],
                                          uint32_t esc[2]) {
  uint32_t e2[4], r2[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    e2[i] = (w[i] >> 7) & 0x00ff00ffu;
    r2[i] = (w[i] & 0x007f007fu) | ((w[i] >> 8) & 0x00800080u);
  }
  ex[0] = __byte_perm(e2[0], e2[1], 0x6420), ex[1] = __byte_perm(e2[2], e2[3], 0x6420);
  const uint32_t raw_lo = __byte_perm(r2[0], r2[1], 0x6420);
  const uint32_t raw_hi = __byte_perm(r2[2], r2[3], 0x6420);
  uint32_t pre[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t p = f.lit;
#pragma unroll
    for (int i = 0; i < 7; ++i) {
      if (i < f.m) {
        const uint32_t hit = __vcmpeq4(ex[h], f.sym[i]);
        p = (p & ~hit) | (f.pre[i] & hit);
      }
    }
    const uint32_t valid = valid_bytes(cnt, h);
    pre[h] = p & valid;
    esc[h] = __vcmpeq4(p, f.lit) & valid;
  }
  if (cnt) {
    store_bytes(out + L.raw_byte_at[0] + e, cnt,
                raw_lo | static_cast<unsigned long long>(raw_hi) << 32);
#pragma unroll
    for (int j = 0; j < 3; ++j)
      out[L.prefix_at[j] + e / 8] = gather4(pre[0], j) | gather4(pre[1], j) << 4;
  }
  return (__popc(esc[0]) + __popc(esc[1]));  // 8 bits per escape
}

template <class F, bool Z>
__device__ inline void enc_block(const EncIn<F>& x, long long b, uint8_t* out, const Layout& L,
                                 const uint32_t* s_code, const Fast& f,
                                 unsigned long long* s_scan, uint32_t* s_pay,
                                 unsigned long long* s_excl, unsigned long long* work) {
  using T = typename F::T;
  long long e0[kGroups];
  int cnt[kGroups];
  uint32_t nbits[kGroups];
  if constexpr (Z) {
    uint32_t ex[kGroups][2], esc[kGroups][2];
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      cnt[g] = group_count(L, b * L.block, g, e0[g]);
      nbits[g] = enc_group_fast(x.w[g], cnt[g], e0[g], out, L, f, ex[g], esc[g]);
    }
    uint32_t pos[kGroups], total;
    group_positions(nbits, s_scan, pos, total);
    uint8_t* s_bytes = reinterpret_cast<uint8_t*>(s_pay);
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      uint32_t at = pos[g] >> 3;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if ((esc[g][k >> 2] >> (8 * (k & 3))) & 1u) {
          s_bytes[at++] = static_cast<uint8_t>(ex[g][k >> 2] >> (8 * (k & 3)));
        }
      }
    }
    enc_finish(b, total, out, L, s_pay, s_excl, work);
    return;
  }
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    cnt[g] = group_count(L, b * L.block, g, e0[g]);
    uint32_t pbits[3] = {0u, 0u, 0u}, tbits[F::RAWb > 0 ? F::RAWb : 1] = {0u};
    unsigned long long rbytes[F::RAWB > 0 ? F::RAWB : 1] = {0ull};
    nbits[g] = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if (k < cnt[g]) {
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
  uint32_t pos[kGroups], total;
  group_positions(nbits, s_scan, pos, total);
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {  // second pass: the codewords, MSB first
    unsigned long long acc = 0;
    uint32_t n = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if (k < cnt[g]) {
        const uint32_t code = s_code[F::sym(elem<T>(x.w[g], k))], w = code >> 12;
        acc = (acc << w) | (code & 0xffu);
        n += w;
      }
    }
    if (n) emit_bits(s_pay, pos[g], acc, n);
  }
  enc_finish(b, total, out, L, s_pay, s_excl, work);
}

// After the CTA's payload stream is in shared memory: look back, write offset and payload.
__device__ inline void enc_finish(long long b, uint32_t total, uint8_t* out, const Layout& L,
                                  const uint32_t* s_pay, unsigned long long* s_excl,
                                  unsigned long long* work) {
  __syncthreads();
  const uint32_t nbytes = (total + 7u) >> 3;
  if (threadIdx.x < 32) {
    const unsigned long long excl = look_back(work + 2, b, nbytes);
    if (threadIdx.x == 0) *s_excl = excl;
  }
  __syncthreads();
  const unsigned long long excl = *s_excl;
  if (threadIdx.x == 0) {
    store_bytes(out + L.offsets_at + 8 * b, 8, excl);
    if (b == L.nb - 1) work[1] = excl + nbytes;
  }
  const long long dst = L.payload_at + static_cast<long long>(excl);
  if (dst + nbytes <= L.capacity) {
    const uint8_t* src = reinterpret_cast<const uint8_t*>(s_pay);
    for (uint32_t i = threadIdx.x; i < nbytes; i += blockDim.x) out[dst + i] = src[i];
  }
}

// Persistent CTAs take block ids from an atomic counter (so every earlier id belongs to a running
// CTA and the look-back cannot deadlock) and load the next block while coding the current one.
template <class F, bool Z>
__global__ void __launch_bounds__(Z ? kFastThreads : kMaxThreads, Z ? 8 : 1)
encode_kernel(const typename F::T* __restrict__ in, uint8_t* __restrict__ out, const Layout L,
              const int32_t* __restrict__ tab, unsigned long long* __restrict__ work) {
  __shared__ uint32_t s_code[256];
  __shared__ unsigned long long s_scan[32];
  __shared__ long long s_bid[2];
  __shared__ unsigned long long s_excl;
  extern __shared__ uint32_t s_pay[];  // the block's payload bytes, little-endian words

  const int T = blockDim.x;
  const int words = static_cast<int>(L.block / 4) + 1;
  for (int i = threadIdx.x; i < 256; i += T) s_code[i] = tab[i];
  const Fast f = Z ? load_fast(tab) : Fast{};
  if (threadIdx.x == 0) s_bid[0] = static_cast<long long>(atomicAdd(work, 1ull));
  if (blockIdx.x == 0) {  // the alignment gaps between sections are zero in golden's buffers
    for (int g = 0; g < L.ngaps; ++g)
      for (long long i = L.gap_lo[g] + threadIdx.x; i < L.gap_hi[g]; i += T) out[i] = 0;
  }
  __syncthreads();
  long long b = s_bid[0];
  EncIn<F> cur, nxt;
  if (b < L.nb) enc_load<F>(in, L, b, cur);
  while (b < L.nb) {
    if (threadIdx.x == 0) s_bid[1] = static_cast<long long>(atomicAdd(work, 1ull));
    for (int i = threadIdx.x; i < words; i += T) s_pay[i] = 0u;
    __syncthreads();
    const long long next = s_bid[1];
    if (next < L.nb) enc_load<F>(in, L, next, nxt);
    enc_block<F, Z>(cur, b, out, L, s_code, f, s_scan, s_pay, &s_excl, work);
    cur = nxt;
    b = next;
    __syncthreads();  // the payload copy-out has read s_pay before it is cleared again
  }
}

// What one thread loads for one block before decoding it (prefetched a block ahead).
template <class F>
struct DecIn {
  unsigned long long lo, hi;
  uint32_t planes[kGroups];  // prefix plane byte j at bits 8j..8j+7
  uint32_t tb[kGroups];      // raw bit plane byte j at bits 8j..8j+7 (FP16)
  unsigned long long rb[kGroups][F::RAWB > 0 ? F::RAWB : 1];
};

template <class F>
__device__ inline void dec_load(const uint8_t* buf, const Layout& L, long long b, DecIn<F>& x) {
  x.lo = load_bytes(buf + L.offsets_at + 8 * b, 8);
  x.hi = b + 1 < L.nb ? load_bytes(buf + L.offsets_at + 8 * (b + 1), 8)
                      : static_cast<unsigned long long>(L.payload_bytes);
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    long long e0;
    const int cnt = group_count(L, b * L.block, g, e0);
    const long long e = cnt ? e0 : 0;
    uint32_t pl = 0, tb = 0;
    if (cnt) {
#pragma unroll
      for (int j = 0; j < 3; ++j) pl |= static_cast<uint32_t>(buf[L.prefix_at[j] + e / 8]) << (8 * j);
#pragma unroll
      for (int j = 0; j < F::RAWb; ++j)
        tb |= static_cast<uint32_t>(buf[L.raw_bit_at[j] + e / 8]) << (8 * j);
    }
    x.planes[g] = pl;
    x.tb[g] = tb;
#pragma unroll
    for (int j = 0; j < F::RAWB; ++j) x.rb[g][j] = load_bytes(buf + L.raw_byte_at[j] + e, cnt);
  }
}

__device__ inline uint32_t prefix_of(uint32_t planes, int k) {
  return ((planes >> k) & 1u) | ((planes >> (8 + k)) & 1u) << 1 | ((planes >> (16 + k)) & 1u) << 2;
}

// Decode block b; returns the error bits found (the caller ORs them into the flag).
// BF16 under a byte-escape table: prefixes by multiply-spreads, exponents by a byte-permute
// lookup (8 prefixes -> 8 symbols), escapes patched from the staged payload, output by permutes.
__device__ inline void dec_group_fast(uint32_t planes, unsigned long long rb, int cnt, uint32_t at,
                                      int len, const uint8_t* s_bytes, const Fast& f,
                                      uint16_t* out, int& err) {
  uint32_t ex[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t pre = 0;
#pragma unroll
    for (int j = 0; j < 3; ++j) pre |= spread4(planes >> (8 * j + 4 * h)) << j;
    const uint32_t y = pre | (pre >> 4);
    const uint32_t sel = __byte_perm(y, 0u, 0x4420);
    const uint32_t valid = valid_bytes(cnt, h);
    if (__byte_perm(f.bad_lo, f.bad_hi, sel) & valid) err |= kErrRank;
    uint32_t e = __byte_perm(f.sym_lo, f.sym_hi, sel);
    const uint32_t esc = __vcmpeq4(pre, f.lit) & valid;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if ((esc >> (8 * k)) & 1u) {
        const uint32_t byte = s_bytes[min(at, static_cast<uint32_t>(len))];
        e = (e & ~(0xffu << (8 * k))) | byte << (8 * k);
        at += 1;
      }
    }
    ex[h] = e;
  }
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
    for (int k = 0; k < cnt; ++k) out[k] = static_cast<uint16_t>(v[k >> 1] >> (16 * (k & 1)));
  }
}

template <class F, bool Z>
__device__ inline int dec_block(const DecIn<F>& x, long long b, const uint8_t* buf,
                                typename F::T* out, const Layout& L, const uint32_t* s_region,
                                const uint8_t* s_rank, uint32_t nranked, const Fast& f,
                                unsigned long long* s_scan, uint8_t* s_bytes) {
  if (!(x.lo <= x.hi && x.hi <= static_cast<unsigned long long>(L.payload_bytes) &&
        x.hi - x.lo <= static_cast<unsigned long long>(L.block)))
    return kErrOffsets;  // uniform across the CTA: nothing below is read
  const int len = static_cast<int>(x.hi - x.lo);
  for (int i = threadIdx.x; i < len + 2; i += blockDim.x)
    s_bytes[i] = i < len ? buf[L.payload_at + x.lo + i] : 0;
  __syncthreads();
  long long e0[kGroups];
  int cnt[kGroups];
  uint32_t nbits[kGroups];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    cnt[g] = group_count(L, b * L.block, g, e0[g]);
    nbits[g] = 0;
    if constexpr (Z) {
      uint32_t pre[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        pre[h] = 0;
#pragma unroll
        for (int j = 0; j < 3; ++j) pre[h] |= spread4(x.planes[g] >> (8 * j + 4 * h)) << j;
        nbits[g] += __popc(__vcmpeq4(pre[h], f.lit) & valid_bytes(cnt[g], h));
      }
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (k < cnt[g]) nbits[g] += s_region[prefix_of(x.planes[g], k)] & 15u;
    }
  }
  uint32_t pos[kGroups], total;
  group_positions(nbits, s_scan, pos, total);
  int err = 0;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    if (!cnt[g]) continue;
    if constexpr (Z) {
      dec_group_fast(x.planes[g], x.rb[g][0], cnt[g], pos[g] >> 3, len, s_bytes, f,
                     reinterpret_cast<uint16_t*>(out) + e0[g], err);
      continue;
    }
    uint32_t v[8], at = pos[g];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t region = s_region[prefix_of(x.planes[g], k)];
      const uint32_t w = k < cnt[g] ? region & 15u : 0u;
      const uint32_t B = min(at >> 3, static_cast<uint32_t>(len));
      const uint32_t window = static_cast<uint32_t>(s_bytes[B]) << 8 | s_bytes[B + 1];
      const uint32_t val = (window >> (16u - (at & 7u) - w)) & ((1u << w) - 1u);
      const bool lit = region >> 15;
      const uint32_t rank = ((region >> 4) & 0x3ffu) + val;
      if (k < cnt[g] && !lit && rank >= nranked) err |= kErrRank;
      uint32_t r = 0;
#pragma unroll
      for (int j = 0; j < F::RAWB; ++j)
        r |= static_cast<uint32_t>((x.rb[g][j] >> (8 * k)) & 0xffu) << (8 * j);
#pragma unroll
      for (int j = 0; j < F::RAWb; ++j) r |= ((x.tb[g] >> (8 * j + k)) & 1u) << (8 * F::RAWB + j);
      v[k] = F::join(lit ? val : s_rank[min(rank, 255u)], r);
      at += w;
    }
    store8(out + e0[g], cnt[g], v);
  }
  if (threadIdx.x == 0) {
    const uint32_t nbytes = (total + 7u) >> 3, tail = total & 7u;
    if (nbytes != static_cast<uint32_t>(len)) err |= kErrSize;
    else if (tail && (s_bytes[nbytes - 1] & ((1u << (8u - tail)) - 1u))) err |= kErrPadding;
    const int used = static_cast<int>(L.n & 7);
    if (b == L.nb - 1 && used) {
      const long long last = (L.n - 1) / 8;
      for (int j = 0; j < 3; ++j)
        if (buf[L.prefix_at[j] + last] >> used) err |= kErrPlanePad;
      for (int j = 0; j < F::RAWb; ++j)
        if (buf[L.raw_bit_at[j] + last] >> used) err |= kErrPlanePad;
    }
  }
  return err;
}

// Persistent CTAs stride over the blocks, loading the next block while decoding the current one.
template <class F, bool Z>
__global__ void __launch_bounds__(Z ? kFastThreads : kMaxThreads, Z ? 8 : 1)
decode_kernel(const uint8_t* __restrict__ buf, typename F::T* __restrict__ out, const Layout L,
              const int32_t* __restrict__ tab, int* __restrict__ flag) {
  __shared__ uint32_t s_region[8];
  __shared__ uint8_t s_rank[256];
  __shared__ unsigned long long s_scan[32];
  extern __shared__ uint8_t s_bytes[];  // the block's payload stream (+2 bytes of slack)

  const int T = blockDim.x;
  if (threadIdx.x < 8) s_region[threadIdx.x] = tab[kRegionAt + threadIdx.x];
  for (int i = threadIdx.x; i < 256; i += T) s_rank[i] = static_cast<uint8_t>(tab[kRankAt + i]);
  const uint32_t nranked = tab[kCountAt];
  const Fast f = Z ? load_fast(tab) : Fast{};
  int err = 0;
  DecIn<F> cur, nxt;
  long long b = blockIdx.x;
  if (b < L.nb) dec_load<F>(buf, L, b, cur);
  __syncthreads();
  for (; b < L.nb; b += gridDim.x) {
    if (b + gridDim.x < L.nb) dec_load<F>(buf, L, b + gridDim.x, nxt);
    err |= dec_block<F, Z>(cur, b, buf, out, L, s_region, s_rank, nranked, f, s_scan, s_bytes);
    cur = nxt;
    __syncthreads();  // s_bytes is restaged for the next block
  }
  if (err) atomicOr(flag, err);
}

// Persistent grids: as many CTAs as can be resident at once (never more than there are blocks).
template <typename K>
unsigned resident_grid(K kernel, int threads, size_t smem, long long nb) {
  int per_sm = 1, dev = 0, sms = 1;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const long long grid = static_cast<long long>(per_sm > 0 ? per_sm : 1) * sms;
  return static_cast<unsigned>(grid < nb ? grid : nb);
}

template <class F, bool Z = false>
int launch_encode(const void* in, void* out, const Layout* L, const int32_t* tab, void* work,
                  cudaStream_t s) {
  cudaError_t e = cudaMemsetAsync(work, 0, (L->nb + 2) * sizeof(unsigned long long), s);
  if (e != cudaSuccess) return e;
  const size_t smem = (L->block / 4 + 1) * sizeof(uint32_t);
  const int threads = static_cast<int>(L->threads);
  const unsigned grid = resident_grid(encode_kernel<F, Z>, threads, smem, L->nb);
  encode_kernel<F, Z><<<grid, threads, smem, s>>>(
      static_cast<const typename F::T*>(in), static_cast<uint8_t*>(out), *L, tab,
      static_cast<unsigned long long*>(work));
  return cudaGetLastError();
}

template <class F, bool Z = false>
int launch_decode(const void* buf, void* out, const Layout* L, const int32_t* tab, int* flag,
                  cudaStream_t s) {
  const size_t smem = L->block + 2;
  const int threads = static_cast<int>(L->threads);
  const unsigned grid = resident_grid(decode_kernel<F, Z>, threads, smem, L->nb);
  decode_kernel<F, Z><<<grid, threads, smem, s>>>(
      static_cast<const uint8_t*>(buf), static_cast<typename F::T*>(out), *L, tab, flag);
  return cudaGetLastError();
}

}  // namespace

// kind: 0 bfloat16, 1 float16, 2 float32, 3 FP8 (both formats code the whole byte),
// 4 bfloat16 under a byte-escape table (the fast path).
extern "C" int zipccl_encode(int kind, const void* in, void* out, const Layout* L,
                             const int32_t* tab, void* work, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (kind) {
    case 0: return launch_encode<BF16>(in, out, L, tab, work, s);
    case 1: return launch_encode<FP16>(in, out, L, tab, work, s);
    case 2: return launch_encode<FP32>(in, out, L, tab, work, s);
    case 3: return launch_encode<FP8>(in, out, L, tab, work, s);
    case 4: return launch_encode<BF16, true>(in, out, L, tab, work, s);
    default: return cudaErrorInvalidValue;
  }
}

// clear != 0 zeroes the flag first; else problems are OR-ed into what it holds.
extern "C" int zipccl_decode(int kind, const void* buf, void* out, const Layout* L,
                             const int32_t* tab, int* flag, int clear, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (clear) {
    cudaError_t e = cudaMemsetAsync(flag, 0, sizeof(int), s);
    if (e != cudaSuccess) return e;
  }
  switch (kind) {
    case 0: return launch_decode<BF16>(buf, out, L, tab, flag, s);
    case 1: return launch_decode<FP16>(buf, out, L, tab, flag, s);
    case 2: return launch_decode<FP32>(buf, out, L, tab, flag, s);
    case 3: return launch_decode<FP8>(buf, out, L, tab, flag, s);
    case 4: return launch_decode<BF16, true>(buf, out, L, tab, flag, s);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" const char* zipccl_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}
