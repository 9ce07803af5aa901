// The encoder: encode_kernel (planes and per-block payloads), then finish_kernel (sizes,
// offsets, payload placement, header, raw fallback). Included by codec.cu.
#pragma once

#include "warp.cuh"

namespace {

// One round's groups of one lane, loaded before coding.
template <class F>
struct EncIn {
  uint32_t w[kGroups][2 * sizeof(typename F::T)];
};

// VEC (FULL rounds of an input that is vec8_aligned): vector loads only, no byte-load fallback.
template <class F, bool FULL, bool VEC>
__device__ inline void enc_load(const typename F::T* in, const Layout& L, long long start, int r,
                                EncIn<F>& x, int cnt[kGroups], long long e0[kGroups]) {
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    cnt[g] = group_count<FULL>(L, start, r, g, e0[g]);
    if constexpr (VEC)
      load_vec8(in + e0[g], x.w[g]);
    else
      load_packed(in + (cnt[g] ? e0[g] : 0), cnt[g], x.w[g]);
  }
}

// The fast path's per-symbol word: bits 0, 8, 16 = prefix bits 0, 1, 2; bit 24 = escape. Element
// k's word shifted left by k lands its bits in the three plane bytes and the escape-mask byte.
__device__ inline uint32_t spread_word(int32_t code) {
  const uint32_t p = (static_cast<uint32_t>(code) >> kEncPrefixShift) & 7u;
  return (p & 1u) | ((p >> 1) & 1u) << 8 | ((p >> 2) & 1u) << 16 |
         (code >> kEncWidthShift ? 1u << 24 : 0u);
}

// A group's raw planes (its 8 elements' raw bits, F::RAW) from its packed words, a plane at a
// time: raw byte plane j is byte j of the elements (raw bits 8j..8j+7 are element bits where they
// are below MANT), but for the byte that ends at the sign (MANT = 8j + 7: BF16, FP32's third),
// whose bit 7 is the sign, bit 7 of the elements' top byte; raw bit plane j is element bit
// 8 RAWB + j, or the sign where that is MANT (FP16's third). Elements past a partial group's
// count are zero in the words (load_packed), so their raw bits are zero.
template <class F>
__device__ __forceinline__ void raw_planes(const uint32_t* w, unsigned long long rbytes[],
                                           uint32_t tbits[]) {
  using T = typename F::T;
  constexpr int kMant = F::RAW - 1, kTop = F::BITS / 8 - 1;
#pragma unroll
  for (int j = 0; j < F::RAWB; ++j) {
    static_assert(F::RAWB == 0 || kMant - 8 * (F::RAWB - 1) >= 7, "a raw byte holds whole bits");
    rbytes[j] = byte_plane<T>(w, j);
    if (kMant - 8 * j == 7) {
      rbytes[j] = (rbytes[j] & 0x7f7f7f7f7f7f7f7full) |
                  (byte_plane<T>(w, kTop) & 0x8080808080808080ull);
    }
  }
#pragma unroll
  for (int j = 0; j < F::RAWb; ++j) {
    static_assert(F::RAWb == 0 || sizeof(T) == 2, "raw bit planes: 16-bit formats");
    const int bit = 8 * F::RAWB + j;
    if constexpr (sizeof(T) == 2) tbits[j] = bit_plane16(w, bit < kMant ? bit : F::BITS - 1);
  }
}

// A group's 8 symbols (exponent fields) as bytes, elements 0..3 in ex[0] and 4..7 in ex[1], by
// shifts and byte permutes of its packed words.
template <class F>
__device__ __forceinline__ void symbol_bytes(const uint32_t* w, uint32_t ex[2]) {
  constexpr int kMant = F::RAW - 1;
  if constexpr (sizeof(typename F::T) == 2) {  // word i: elements 2i, 2i + 1
    constexpr uint32_t kMask = ((1u << F::EXP_BITS) - 1u) * 0x00010001u;
    uint32_t e2[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) e2[i] = (w[i] >> kMant) & kMask;
    ex[0] = __byte_perm(e2[0], e2[1], 0x6420), ex[1] = __byte_perm(e2[2], e2[3], 0x6420);
  } else {  // word k: element k, its exponent byte 0 of the word shifted by kMant
    static_assert(F::EXP_BITS == 8, "FP32's exponent is a byte");
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t* q = w + 4 * h;
      ex[h] = __byte_perm(__byte_perm(q[0] >> kMant, q[1] >> kMant, 0x0040),
                          __byte_perm(q[2] >> kMant, q[3] >> kMant, 0x0040), 0x5410);
    }
  }
}

// One round of an exponent format under a byte-escape table: symbol bytes and raw planes by byte
// permutes, the three plane bytes and the escape mask by one table lookup and one add per
// element; escape bytes into the stage. Returns the round's payload bits.
template <class F, bool FULL>
__device__ inline uint32_t enc_round_fast(const EncIn<F>& x, const int cnt[kGroups],
                                          const long long e0[kGroups], uint8_t* out,
                                          const Layout& L, const uint32_t* s_spread, uint32_t bits,
                                          uint8_t* stage) {
  uint32_t ex[kGroups][2], acc[kGroups], nbits[kGroups], pos[kGroups];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    symbol_bytes<F>(x.w[g], ex[g]);
    acc[g] = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (FULL || k < cnt[g]) acc[g] += s_spread[(ex[g][k >> 2] >> (8 * (k & 3))) & 0xffu] << k;
    if (cnt[g]) {
      unsigned long long rbytes[F::RAWB];
      uint32_t tbits[F::RAWb > 0 ? F::RAWb : 1];
      raw_planes<F>(x.w[g], rbytes, tbits);
      const long long e = e0[g];
#pragma unroll
      for (int j = 0; j < F::RAWB; ++j) store_bytes(out + L.raw_byte_at[j] + e, cnt[g], rbytes[j]);
#pragma unroll
      for (int j = 0; j < F::RAWb; ++j) out[L.raw_bit_at[j] + e / 8] = tbits[j];
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

// The generic path's per-symbol words (s_enc), from the encoder word `code`: x has prefix bits 0,
// 1, 2 at bits 0, 8, 16 (element k's x shifted left by k lands them in the three plane bytes, as
// spread_word's); y has the payload left-aligned (its top `width` bits) and the width in bits 0..4,
// so that one funnel shift by y itself appends the codeword to an accumulator:
// funnelshift_l(y, acc, y) = (acc << w) | (y >> (32 - w)), and acc for w = 0 (y = 0). golden's
// tables have widths <= 8 (codebook.MAX_WIDTH), so the payload bits never reach bit 4.
__device__ inline uint2 enc_words(int32_t code) {
  const uint32_t c = static_cast<uint32_t>(code);
  const uint32_t p = (c >> kEncPrefixShift) & 7u, w = (c >> kEncWidthShift) & 15u;
  const uint32_t x = (p & 1u) | ((p >> 1) & 1u) << 8 | ((p >> 2) & 1u) << 16;
  return make_uint2(x, w ? (c & 0xffu) << (32u - w) | w : 0u);
}

// The byte-coded format's encoder words are looked up once per byte of input, by lanes whose
// symbols differ (up to 256 of them): with one table, a warp's lookup waited on ~5 shared-memory
// wavefronts of bank conflicts, and the lookups bounded the encoder (L1 92 % busy, BENCHMARKS.md
// §3b). The table is therefore held in kEncCopies copies, entry e of copy c at e * kEncCopies + c,
// lane l reading copy l % kEncCopies: a 64-bit load is served a half warp a wavefront, and the
// half warp's 16 lanes read 16 distinct bank pairs, so a lookup takes the two wavefronts any
// 64-bit warp load takes. The exponent formats look up few distinct symbols and keep one table.
template <class F>
__host__ __device__ constexpr int enc_copies() { return F::BYTE_CODED ? 16 : 1; }

template <class F>
__host__ __device__ constexpr size_t enc_table_bytes() { return F::BYTE_CODED ? 256 * enc_copies<F>() * sizeof(uint2) : 0; }
constexpr int kMaxEncodeSmem = kStageBytes + 256 * 16 * sizeof(uint2);  // enc_table_bytes<FP8>

// One round of the generic path: planes out, codewords ORed into the (zeroed) stage. One lookup
// per element gives its plane bits (added in at bit k) and its codeword (funnel-shifted onto the
// half group's accumulator: 4 codewords of <= 8 bits fit 32 bits), so the codewords are held in
// registers from the one pass to the emit after the warp's scan. `s_enc`: this lane's copy of
// the table (enc_copies).
template <class F, bool FULL>
__device__ inline uint32_t enc_round(const EncIn<F>& x, const int cnt[kGroups],
                                     const long long e0[kGroups], uint8_t* out, const Layout& L,
                                     const uint2* s_enc, uint32_t bits, uint32_t* stage) {
  using T = typename F::T;
  uint32_t nbits[kGroups], pos[kGroups];
  unsigned long long acc[kGroups];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    uint32_t planes = 0u, half[2] = {0u, 0u};
    uint32_t ysum[2] = {0u, 0u};  // the half's y words summed: bits 0..5 are its widths' sum
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if (FULL || k < cnt[g]) {
        const uint2 c = s_enc[F::sym(elem<T>(x.w[g], k)) * enc_copies<F>()];
        planes += c.x << k;
        half[k >> 2] = __funnelshift_l(c.y, half[k >> 2], c.y);
        ysum[k >> 2] += c.y;
      }
    }
    unsigned long long rbytes[F::RAWB > 0 ? F::RAWB : 1];
    uint32_t tbits[F::RAWb > 0 ? F::RAWb : 1];
    raw_planes<F>(x.w[g], rbytes, tbits);
    // A y word's bits 5..23 are zero, so 4 widths (<= 32) sum in bits 0..5 with no carry out.
    const uint32_t n0 = ysum[0] & 63u, n1 = ysum[1] & 63u;
    acc[g] = static_cast<unsigned long long>(half[0]) << n1 | half[1];  // n1 <= 32
    nbits[g] = n0 + n1;
    if (cnt[g]) {
      // A plane byte's index: e0[g] / 8, which in a whole round is group 0's plus 32 g (e0[g] =
      // e0[0] + 256 g, all >= 0), so that the stores share one address per plane.
      const long long e = e0[g], e8 = FULL ? (e0[0] >> 3) + 32 * g : e / 8;
#pragma unroll
      for (int j = 0; j < F::RAWB; ++j) store_bytes(out + L.raw_byte_at[j] + e, cnt[g], rbytes[j]);
#pragma unroll
      for (int j = 0; j < F::RAWb; ++j) out[L.raw_bit_at[j] + e8] = tbits[j];
#pragma unroll
      for (int j = 0; j < 3; ++j)
        out[L.prefix_at[j] + e8] = static_cast<uint8_t>(planes >> (8 * j));
    }
  }
  const uint32_t total = round_positions(nbits, pos);
#pragma unroll
  for (int g = 0; g < kGroups; ++g) emit_bits(stage, bits + pos[g], acc[g], nbits[g]);
  return total;
}

template <class F, bool Z, bool FULL, bool VEC, class S>
__device__ inline uint32_t enc_round_at(const typename F::T* in, uint8_t* out, const Layout& L,
                                        long long start, int r, const uint32_t* s_lut,
                                        const uint2* s_enc, uint32_t bits, uint32_t* stage,
                                        S& sum) {
  EncIn<F> x;
  int cnt[kGroups];
  long long e0[kGroups];
  enc_load<F, FULL, VEC>(in, L, start, r, x, cnt, e0);
#pragma unroll
  for (int g = 0; g < kGroups; ++g)
    if (cnt[g]) sum.template group<typename F::T>(e0[g], cnt[g], x.w[g]);
  if constexpr (Z)
    return enc_round_fast<F, FULL>(x, cnt, e0, out, L, s_lut, bits,
                                   reinterpret_cast<uint8_t*>(stage));
  else
    return enc_round<F, FULL>(x, cnt, e0, out, L, s_enc, bits, stage);
}

// `work` (zipccl_work_bytes): [0, 8) the payload size, [8, 24) the values checksum's sums (a
// SumAcc, zeroed with the tile sums), then from 32 on per tile of kTile blocks a uint64 sum
// (zeroed before the encode), per block a uint32 byte count, and the scratch slots (`block` bytes
// per block, 16 bytes of slack after them).
constexpr int kTile = 256;
struct Work {
  unsigned long long* total;
  SumAcc* sum;
  unsigned long long* tiles;
  uint32_t* counts;
  uint8_t* scratch;
};

__host__ __device__ inline long long align16(long long x) { return (x + 15) / 16 * 16; }
__host__ __device__ inline long long num_tiles(long long nb) { return (nb + kTile - 1) / kTile; }
__host__ __device__ inline long long counts_at(long long nb) { return align16(32 + 8 * num_tiles(nb)); }
__host__ __device__ inline long long scratch_at(long long nb) { return align16(counts_at(nb) + 4 * nb); }

__host__ __device__ inline Work work_of(void* work, long long nb) {
  uint8_t* w = static_cast<uint8_t*>(work);
  return {reinterpret_cast<unsigned long long*>(w), reinterpret_cast<SumAcc*>(w + 8),
          reinterpret_cast<unsigned long long*>(w + 32),
          reinterpret_cast<uint32_t*>(w + counts_at(nb)), w + scratch_at(nb)};
}

// Rounds r0 .. r0 + nr - 1 of block b's values into the SM's L1, by one warp: an encoder's warp
// asks for its first block's share while the table kernel before it still runs, so that its
// rounds' loads after the wait hit L1.
template <class F>
__device__ inline void prefetch_block(const typename F::T* in, const Layout& L, long long b,
                                      int r0, int nr) {
  if (b >= L.nb) return;
  const long long lo = b * L.block + static_cast<long long>(r0) * kRound;
  const long long end = min(min((b + 1) * L.block, L.n), lo + static_cast<long long>(nr) * kRound);
  if (end <= lo) return;  // this warp's share lies past the tensor's end
  const long long bytes = (end - lo) * static_cast<long long>(sizeof(typename F::T));
  const auto* p = reinterpret_cast<const uint8_t*>(in + lo);
  for (long long at = 128 * (threadIdx.x & 31); at < bytes; at += 32 * 128) prefetch_l1(p + at);
}

// A hint: the kRound elements from element e on (the round this warp codes next) into the SM's
// L1, a 128-byte line a lane, so that the round's loads find them there instead of waiting on
// memory after the round before. Lines past the tensor's end are left out.
template <class F>
__device__ inline void prefetch_round(const typename F::T* in, const Layout& L, long long e) {
  constexpr int kPer = 128 / sizeof(typename F::T), kLines = kRound / kPer;  // 8 to 32 lines
  const int lane = threadIdx.x & 31;
  const long long at = e + static_cast<long long>(lane) * kPer;
  if (lane < kLines && at < L.n) prefetch_l1(in + at);
}

// Two warps' halves of a block (block_split): the second warp's payload bytes, `bytes` of them at
// the start of its own stage, moved to follow the first warp's `at` bytes in the first's stage
// (both hold stream bytes in big-endian words: byte i at i ^ 3).
__device__ inline void append_stage(uint8_t* dst, uint32_t at, const uint8_t* src, uint32_t bytes) {
  for (uint32_t i = threadIdx.x & 31; i < bytes; i += 32) dst[(at + i) ^ 3u] = src[i ^ 3u];
}

// Each warp codes whole blocks (or, where block_split says two, the fast path's pairs of warps
// code them, each half the rounds): planes into the container, the payload into the block's scratch
// slot, its byte count into `counts` and the tile's sum. `head_to_hash`: a header stage whose table
// hash is still to be written (a default table's, see theory_kernel and staircase_kernel); CTA 0
// then computes it and the stage's CRC-32 (seal_stage) while the other CTAs encode. CK: the values
// checksum is summed into `work.sum` on the way. The 16-bit formats are held to 64 registers (four
// CTAs an SM), FP32 to 80 (three), where they spill nothing; FP8 keeps the compiler's own choice,
// below 64 (asking for at least one CTA an SM is not the same: it made FP8's encoder 6 % slower).
template <class F, bool Z, bool CK>
__global__ void __launch_bounds__(32 * kMaxWarps, sizeof(typename F::T) == 2 ? 4
                                                  : sizeof(typename F::T) == 4 ? 3 : 0)
encode_kernel(const typename F::T* __restrict__ in, uint8_t* __restrict__ out, const Layout L,
              const int32_t* __restrict__ tab, Work work, uint8_t* __restrict__ head_to_hash) {
  __shared__ uint32_t s_lut[256];  // Z: spread words; the hashing CTA's message
  __shared__ uint2 s_enc1[Z || F::BYTE_CODED ? 1 : 256];  // else enc_words (one table)
  extern __shared__ uint4 s_stage[];  // the warps' stages, then the byte-coded format's tables
  static_assert(16 * kShaBlocks <= 256, "the hashing CTA's message fits in s_lut");
  const int hashing = head_to_hash != nullptr;  // a default table comes unhashed
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, words = stage_words(L.block);
  const int split = block_split(Z, L, blockDim.x >> 5, gridDim.x - hashing), half = warp % split;
  const int per = rounds(L) / split, r0 = half * per;  // this warp's rounds of each block
  const long long first =
      (static_cast<long long>(blockIdx.x - hashing) * (blockDim.x >> 5) + warp) / split;
  if (!hashing || blockIdx.x) prefetch_block<F>(in, L, first, r0, per);  // not the table's output
  wait_for_predecessor();  // the table kernel's table and zeroed sums
  let_dependents_start();
  if (hashing && blockIdx.x == 0) {
    seal_stage(head_to_hash, s_lut, !F::BYTE_CODED);
    return;
  }
  __shared__ uint32_t s_half_bits[kMaxWarps];  // split: each half's payload bits
  uint32_t* stage = reinterpret_cast<uint32_t*>(s_stage) + warp * words;
  uint32_t* block_stage = stage - half * words;  // the block's payload: its first warp's stage
  uint2* s_enc = s_enc1;
  if constexpr (F::BYTE_CODED) {
    s_enc = reinterpret_cast<uint2*>(s_stage) + (blockDim.x >> 5) * words / 2;  // words: even
    for (int i = threadIdx.x; i < 256 * enc_copies<F>(); i += blockDim.x)
      s_enc[i] = enc_words(tab[i / enc_copies<F>()]);
  } else {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
      if constexpr (Z) s_lut[i] = spread_word(tab[i]);
      else s_enc[i] = enc_words(tab[i]);
    }
  }
  s_enc += lane % enc_copies<F>();
  __syncthreads();
  Summer<CK> sum;
  const bool vec = vec8_aligned(in);  // then so is every group (e0 is a multiple of 8)
  const long long units = static_cast<long long>(gridDim.x - hashing) * (blockDim.x >> 5) / split;
  for (long long b = first; b < L.nb; b += units) {
    if constexpr (!Z) {
      for (int i = lane; i < words; i += 32) stage[i] = 0u;
      __syncwarp();
    }
    const long long start = b * L.block;
    uint32_t bits = 0;
    const long long after = (b + units) * L.block + r0 * kRound;  // the warp's next block's
    for (int r = r0; r < r0 + per; ++r) {
      if constexpr (!Z)  // the next round: this block's, else the first of the warp's next block
        prefetch_round<F>(in, L, r + 1 < r0 + per ? start + (r + 1) * kRound : after);
      // Whole rounds: by vector loads only where the input is aligned for them (an unaligned
      // input's rounds take the general code; the fast path keeps its loads' fallback).
      if (full_round(L, start, r) && (Z || vec))
        bits += enc_round_at<F, Z, true, !Z>(in, out, L, start, r, s_lut, s_enc, bits, stage, sum);
      else
        bits += enc_round_at<F, Z, false, false>(in, out, L, start, r, s_lut, s_enc, bits, stage,
                                                 sum);
    }
    __syncwarp();
    if (split == 2) {  // the second half's bytes after the first's, in the first's stage
      if (lane == 0) s_half_bits[warp] = bits;
      pair_sync(warp);
      const uint32_t first_bits = s_half_bits[warp & ~1], second_bits = s_half_bits[warp | 1];
      if (half)
        append_stage(reinterpret_cast<uint8_t*>(block_stage), first_bits >> 3,
                     reinterpret_cast<const uint8_t*>(stage), second_bits >> 3);
      pair_sync(warp);
      if (half) continue;  // the first warp writes the block out
      bits = first_bits + second_bits;
    }
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
  sum.commit(work.sum);
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
static_assert(kMaxHeader <= kCrcSpan, "warp_crc32 covers a whole header");

// A thread's bytes of a header template in device memory, threadIdx.x + kHeadThreads * k, for
// the kernels that write a header with CTAs of kHeadThreads (the table kernels, finish_kernel's
// header CTA, seal_raw_kernel): read into registers early, so that their latency hides behind
// other loads instead of adding to the header's own chain.
constexpr int kHeadThreads = 256;
constexpr int kHeadPerThread = kMaxHeader / kHeadThreads;
static_assert(kHeadPerThread * kHeadThreads == kMaxHeader, "whole header bytes per thread");
struct HeadBytes { uint8_t b[kHeadPerThread]; };
__device__ inline HeadBytes load_head(const uint8_t* __restrict__ head) {
  HeadBytes h;
  for (int k = 0; k < kHeadPerThread; ++k) h.b[k] = head[threadIdx.x + kHeadThreads * k];
  return h;
}

// The header from `head` (golden's header with payload_bytes 0 and, where L.checksum, the
// checksum flag and a zero checksum, with the CRC-32 of those bytes) with the payload size and the
// checksum patched in and the CRC fixed up for them (warp_crc_field). Every thread of the CTA
// (kHeadThreads) must call it; the last warp's last lanes hold the template's CRC bytes.
static_assert(kMaxHeader == kHeaderBytes && kCrcAt == kHeaderBytes - 4, "the CRC ends the header");
__device__ inline void write_header(uint8_t* out, const Layout& L, const HeadBytes& head,
                                    unsigned long long total, unsigned long long checksum) {
  for (int k = 0; k < kHeadPerThread; ++k) {
    const int i = threadIdx.x + kHeadThreads * k, f = i - kSizeFieldAt, c = i - kChecksumAt;
    if (i < kCrcAt)
      out[i] = f >= 0 && f < 8                  ? static_cast<uint8_t>(total >> (8 * f))
               : L.checksum && c >= 0 && c < 8 ? static_cast<uint8_t>(checksum >> (8 * c))
                                                : head.b[k];
  }
  if (threadIdx.x >= kHeadThreads - 32) {
    const int lane = threadIdx.x & 31, j = lane - 28;  // lane 28 + j: the CRC's byte j
    uint32_t crc = 0;
    const uint8_t last = head.b[kHeadPerThread - 1];
    for (int b = 0; b < 4; ++b)
      crc |= static_cast<uint32_t>(__shfl_sync(kFull, last, 28 + b)) << (8 * b);
    crc ^= warp_crc_field(kSizeCrc, total);
    if (L.checksum) crc ^= warp_crc_field(kChecksumCrc, checksum);
    if (j >= 0) out[kCrcAt + j] = static_cast<uint8_t>(crc >> (8 * j));
  }
}

// Whether the buffer gets the raw layout: where L allows it and the split one is not smaller.
__device__ inline bool store_raw(const Layout& L, unsigned long long total) {
  return L.raw_size > 0 && L.payload_at + static_cast<long long>(total) >= L.raw_size;
}

// The encoder's last step, with no CTA waiting on another. Every CTA sums the tile sums (the
// payload size). The last CTA writes the size to `work.total` and to `size` ([buffer bytes,
// payload bytes]), zeroes the alignment gaps and writes the header from `head` (golden's split
// header with payload_bytes 0), while the others place the payloads: each group of kGroup blocks
// (one per warp) learns its base (the tiles and the tile's counts before it) and each warp gives
// its block its uint64 offset and moves its payload from the scratch slot. Where store_raw, the
// tensor's bytes under `raw_head` are stored instead, by every CTA; where the payload overflows
// the buffer (a collective's room), no payload is placed. Where L.checksum, the header gets the
// values checksum the encoder summed.
constexpr int kGroup = 8;
static_assert(32 * kGroup == kHeadThreads, "finish_kernel's header CTA");
__global__ void __launch_bounds__(32 * kGroup)
finish_kernel(const uint8_t* __restrict__ in, uint8_t* __restrict__ out, const Layout L,
              Work work, const uint8_t* __restrict__ head, const uint8_t* __restrict__ raw_head,
              long long* __restrict__ size) {
  wait_for_predecessor();  // the encoder's sums, counts and payloads (and the hashed header stage)
  const unsigned placers = gridDim.x - 1;  // the last CTA writes the header
  HeadBytes split_bytes{}, raw_bytes{};
  if (blockIdx.x == placers) {  // loaded beside the tile sums: which one is needed comes later
    if (head) split_bytes = load_head(head);
    if (raw_head) raw_bytes = load_head(raw_head);  // null from zipccl_encode (raw_size 0)
  }
  const long long nt = num_tiles(L.nb);
  unsigned long long all = 0;
  for (long long t = threadIdx.x; t < nt; t += blockDim.x) all += work.tiles[t];
  cta_scan(all, all);
  const bool raw = store_raw(L, all);
  const bool fits = !raw && L.payload_at + static_cast<long long>(all) <= L.capacity;
  if (blockIdx.x == placers) {
    if (threadIdx.x == 0) {
      *work.total = all;
      if (size) size[0] = raw ? L.raw_size : L.payload_at + static_cast<long long>(all);
      if (size) size[1] = raw ? 0 : static_cast<long long>(all);
    }
    const unsigned long long checksum = checksum_of(work.sum->pairs, work.sum->low);
    if (raw) {
      write_header(out, L, raw_bytes, 0, checksum);  // (the checksum only where L.checksum)
    } else {
      if (head) write_header(out, L, split_bytes, all, checksum);
      for (int g = 0; g < L.ngaps; ++g)
        for (long long i = L.gap_lo[g] + threadIdx.x; i < L.gap_hi[g]; i += blockDim.x) out[i] = 0;
    }
  }
  if (raw) {
    grid_copy(out + kHeaderBytes, in, L.raw_size - kHeaderBytes);
  } else if (fits && blockIdx.x < placers) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (long long first = static_cast<long long>(blockIdx.x) * kGroup; first < L.nb;
         first += static_cast<long long>(placers) * kGroup) {
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

// A tensor too small for the split layout, stored raw with a values checksum: one CTA copies its
// bytes, sums them, and writes `raw_head` (golden's raw header with the checksum flag) with the
// checksum and the CRC.
__global__ void __launch_bounds__(kHeadThreads)
seal_raw_kernel(const uint8_t* __restrict__ in, uint8_t* __restrict__ out, const Layout L,
                const uint8_t* __restrict__ raw_head) {
  __shared__ SumAcc s_sum;
  const HeadBytes template_bytes = load_head(raw_head);
  if (threadIdx.x == 0) s_sum = SumAcc{0, 0, 0};
  __syncthreads();
  Summer<true> sum;
  constexpr long long head = kHeaderBytes;
  grid_copy<true>(out + head, in, L.raw_size - head, &sum);
  sum.commit(&s_sum);
  __syncthreads();
  write_header(out, L, template_bytes, 0, checksum_of(s_sum.pairs, s_sum.low));
}

}  // namespace
