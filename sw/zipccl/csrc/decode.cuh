// The decoder: one warp per block, checking every block's consistency. Included by codec.cu.
#pragma once

#include <type_traits>

#include "warp.cuh"

namespace {

// One group's raw planes.
template <class F>
struct DecRaw {
  uint32_t tb;  // raw bit plane byte j at bits 8j..8j+7 (FP16)
  unsigned long long rb[F::RAWB > 0 ? F::RAWB : 1];
};

// The raw planes of the group of `cnt` elements at element e (a multiple of 8). VEC: cnt is 8 and
// the raw byte planes are 8-aligned there (round_aligned).
template <class F, bool VEC>
__device__ inline DecRaw<F> dec_raw(const uint8_t* buf, const Layout& L, long long e, int cnt) {
  DecRaw<F> x;
  x.tb = 0;
  if (cnt) {
#pragma unroll
    for (int j = 0; j < F::RAWb; ++j)
      x.tb |= static_cast<uint32_t>(buf[L.raw_bit_at[j] + (e >> 3)]) << (8 * j);
  }
#pragma unroll
  for (int j = 0; j < F::RAWB; ++j) {
    const uint8_t* p = buf + L.raw_byte_at[j] + e;
    x.rb[j] = VEC ? *reinterpret_cast<const unsigned long long*>(p) : load_bytes(p, cnt);
  }
  return x;
}

// Element k's raw bits (F::RAW: what F::join takes) from its group's raw planes.
template <class F>
__device__ __forceinline__ uint32_t raw_of(const DecRaw<F>& x, int k) {
  uint32_t raw = 0;
#pragma unroll
  for (int j = 0; j < F::RAWB; ++j)
    raw |= static_cast<uint32_t>((x.rb[j] >> (8 * k)) & 0xffu) << (8 * j);
#pragma unroll
  for (int j = 0; j < F::RAWb; ++j) raw |= ((x.tb >> (8 * j + k)) & 1u) << (8 * F::RAWB + j);
  return raw;
}

// The four symbol bytes of element entries e[0..3] (low bytes) as one word.
__device__ inline uint32_t pack4(const uint32_t e[4]) {
  return __byte_perm(__byte_perm(e[0], e[1], 0x0040), __byte_perm(e[2], e[3], 0x0040), 0x5410);
}

// A group's symbols as pair words: pair i holds element 2i's symbol in byte 0 and element
// 2i + 1's in byte 2, from its entries (an entry's byte 3 is 0; its bit 8, an error flag, is
// left out) or from its 8 symbol bytes (ex: elements 0..3, 4..7).
__device__ __forceinline__ void pairs_of_entries(const uint32_t ent[8], uint32_t sym2[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) sym2[i] = __byte_perm(ent[2 * i], ent[2 * i + 1], 0x3430);
}
__device__ __forceinline__ void pairs_of_bytes(uint32_t ex0, uint32_t ex1, uint32_t sym2[4]) {
  sym2[0] = __byte_perm(ex0, 0u, 0x4140), sym2[1] = __byte_perm(ex0, 0u, 0x4342);
  sym2[2] = __byte_perm(ex1, 0u, 0x4140), sym2[3] = __byte_perm(ex1, 0u, 0x4342);
}

// A 16-bit format's group of 8 elements, whole, as 4 words of 2 (element 2i in the low half):
// F::join of each symbol with its raw bits, a pair at a time: the raw bytes by one byte permute
// (BF16's bit 7, its sign, moved to bit 15), the pair's symbols (pairs_of_entries) shifted to
// MANT, and FP16's three raw bit planes together: the pair's bits of plane j (8j + 2i and
// 8j + 2i + 1 of tb) go to element bits t_j = 8, 9 (mantissa) and 15 (the sign) of either half.
// The even ones, a_j at bit 8j of y, times 0x205 = 2^9 + 2^2 + 1 land at 8j + {0, 2, 9}: nine
// distinct bits (no carries), among them a_0 at 9, a_1 at 10 and a_2 at 16, which are t_j + 1;
// the odd ones the same after a shift, then both to their half.
template <class F>
__device__ __forceinline__ void join_pairs16(const uint32_t sym2[4], const DecRaw<F>& raw,
                                             uint32_t w[4]) {
  constexpr int kMant = F::RAW - 1;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t rb = static_cast<uint32_t>(raw.rb[0] >> (32 * (i >> 1)));
    const uint32_t b = __byte_perm(rb, 0u, (i & 1) ? 0x4342 : 0x4140);
    uint32_t v = kMant >= 8 ? b : (b & 0x007f007fu) | (b & 0x00800080u) << 8;
    v |= sym2[i] << kMant;
    if constexpr (F::RAWb > 0) {
      static_assert(F::RAWb == 3 && F::RAWB == 1 && kMant == 10, "FP16's raw bit planes");
      const uint32_t y = raw.tb >> (2 * i);
      const uint32_t even = (y & 0x010101u) * 0x205u, odd = ((y >> 1) & 0x010101u) * 0x205u;
      v |= ((even >> 1) & 0x8300u) | ((odd << 15) & 0x83000000u);
    }
    w[i] = v;
  }
}

// FP32's group of 8 elements, whole, as 8 words: an element's high half is BF16's join of its
// symbol (pair words, as join_pairs16's) with its raw byte plane 2 (mantissa bits 16..22 and the
// sign), as join_pairs16 builds it for a pair; its low half is its bytes of raw byte planes 0
// and 1, a pair by one permute.
template <class F>
__device__ __forceinline__ void join_words32(const uint32_t sym2[4], const DecRaw<F>& raw,
                                             uint32_t w[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int h = 32 * (i >> 1);  // elements 2i, 2i + 1 are in the low or high half of a plane
    const uint32_t r0 = static_cast<uint32_t>(raw.rb[0] >> h);
    const uint32_t r1 = static_cast<uint32_t>(raw.rb[1] >> h);
    const uint32_t r2 = static_cast<uint32_t>(raw.rb[2] >> h);
    const uint32_t b = __byte_perm(r2, 0u, (i & 1) ? 0x4342 : 0x4140);
    const uint32_t hi = (b & 0x007f007fu) | (b & 0x00800080u) << 8 | sym2[i] << 7;
    const uint32_t lo = __byte_perm(r0, r1, (i & 1) ? 0x7362 : 0x5140);
    w[2 * i] = __byte_perm(lo, hi, 0x5410), w[2 * i + 1] = __byte_perm(lo, hi, 0x7632);
  }
}

// A whole group of an exponent format (all 8 elements, aligned for vector stores): its symbols'
// pair words joined with its raw planes, stored to `o` and summed.
template <class F, class S>
__device__ __forceinline__ void put_joined(const uint32_t sym2[4], const DecRaw<F>& raw,
                                           typename F::T* o, long long e0, S& sum) {
  if constexpr (sizeof(typename F::T) == 2) {
    uint32_t w[4];
    join_pairs16<F>(sym2, raw, w);
    *reinterpret_cast<uint4*>(o) = make_uint4(w[0], w[1], w[2], w[3]);
    sum.template group<uint16_t>(e0, 8, w);
  } else {
    static_assert(F::RAWB == 3 && F::RAW == 24, "FP32's raw planes");
    uint32_t w[8];
    join_words32<F>(sym2, raw, w);
    store_vec8(o, w);
    sum.template group<uint32_t>(e0, 8, w);
  }
}

// A group's decoded symbols joined with its raw planes (exponent formats) or packed as bytes
// (FP8), stored to `o` (cnt elements; VEC: all 8, by vector stores) and summed. ent[k]: element
// k's symbol table entry (or its symbol).
template <class F, bool VEC, class S>
__device__ __forceinline__ void dec_put(const uint32_t ent[8], const DecRaw<F>& raw,
                                        typename F::T* o, long long e0, int cnt, S& sum) {
  if constexpr (F::BYTE_CODED) {
    const uint32_t word[2] = {pack4(ent), pack4(ent + 4)};
    if constexpr (VEC)
      *reinterpret_cast<uint2*>(o) = make_uint2(word[0], word[1]);
    else
      store_bytes(o, cnt, word[0] | static_cast<unsigned long long>(word[1]) << 32);
    sum.template group<uint8_t>(e0, cnt, word);
  } else if constexpr (VEC) {
    uint32_t sym2[4];
    pairs_of_entries(ent, sym2);
    put_joined<F>(sym2, raw, o, e0, sum);
  } else {
    uint32_t v[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = F::join(ent[k] & 0xffu, raw_of(raw, k));
    store8(o, cnt, v);
    sum.template values<typename F::T>(e0, cnt, v);
  }
}

// FP16's error bit for symbol bytes (ORed together) past its 5-bit exponent field: a byte-escape
// table's escapes and ranks are whole bytes. 0 for the 8-bit exponent formats.
template <class F>
__device__ __forceinline__ int symbol_errors(uint32_t bytes) {
  if constexpr (!F::BYTE_CODED && F::EXP_BITS < 8)
    return bytes & ~(((1u << F::EXP_BITS) - 1u) * 0x01010101u) ? kErrSymbol : 0;
  return 0;
}

// The error bits of the OR of a round's entries (of its elements only): bit 8, a rank past the
// table's count; for FP16, a symbol past its 5-bit exponent field (entries hold 8-bit symbols).
template <class F>
__device__ __forceinline__ int entry_errors(uint32_t bad) {
  return (bad & 0x100u ? kErrRank : 0) | symbol_errors<F>(bad & 0xffu);
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

// A byte-escape table (the ZipCCL exponent layout: BF16, FP16, FP32), a group of a round that
// dec_round_z does not take: symbols by a byte-permute lookup (8 prefixes -> 8 symbols), escapes
// (`esc`: bit k set for element k) patched one by one from the stage from stream byte `at` on,
// joined with the group's raw planes (BF16: by permutes) and stored to element e0 of `out`.
template <class F, class S>
__device__ inline void dec_group_fast(const uint32_t pre[2], uint32_t esc, const DecRaw<F>& raw,
                                      int cnt, uint32_t at, const uint8_t* stage, const Fast& f,
                                      typename F::T* out, long long e0, int& err, S& sum) {
  out += e0;
  unsigned long long ex8 = 0;  // the 8 symbol bytes
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
  if constexpr (std::is_same_v<F, BF16>) {
    const unsigned long long rb = raw.rb[0];
    const uint32_t r[2] = {static_cast<uint32_t>(rb), static_cast<uint32_t>(rb >> 32)};
    uint32_t v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t t = __byte_perm(r[i >> 1], ex[i >> 1], (i & 1) ? 0x7362 : 0x5140);
      v[i] = ((t >> 1) & 0x7f807f80u) | (t & 0x007f007fu) | ((t & 0x00800080u) << 8);
    }
    sum.template group<uint16_t>(e0, cnt, v);
    if (cnt == 8 && aligned(out, 16)) {
      *reinterpret_cast<uint4*>(out) = make_uint4(v[0], v[1], v[2], v[3]);
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (k < cnt) out[k] = static_cast<uint16_t>(v[k >> 1] >> (16 * (k & 1)));
    }
  } else {
    err |= symbol_errors<F>((ex[0] & valid_bytes(cnt, false)) | (ex[1] & valid_bytes(cnt, true)));
    uint32_t ent[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) ent[k] = (ex[k >> 2] >> (8 * (k & 3))) & 0xffu;
    dec_put<F, false>(ent, raw, out, e0, cnt, sum);
  }
}

// The rank table in shared memory, from which the compact symbol table is built.
struct DecTab {
  uint8_t rank[256];
};

// A byte-escape table, a round that dec_round_z does not take (a partial round, a block not
// aligned for vectors); returns the round's payload bits. `bits` is where the round starts in the
// block's stream.
template <class F, bool FULL, class S>
__device__ inline uint32_t dec_round(const uint8_t* buf, typename F::T* out, const Layout& L,
                                     long long start, int r, const Fast& f,
                                     const unsigned long long* s_spread8, uint32_t bits,
                                     const uint32_t* stage, int& err, S& sum) {
  uint32_t planes[kGroups];
  int cnt[kGroups];
  long long e0[kGroups];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    cnt[g] = group_count<FULL>(L, start, r, g, e0[g]);
    uint32_t pl = 0;
    if (cnt[g]) {
#pragma unroll
      for (int j = 0; j < 3; ++j)
        pl |= static_cast<uint32_t>(buf[L.prefix_at[j] + e0[g] / 8]) << (8 * j);
    }
    planes[g] = pl;
  }
  uint32_t nbits[kGroups], pos[kGroups], esc[kGroups];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {  // escapes straight from the planes: bit k where prefix k == L
    const uint32_t p0 = planes[g] & 0xffu, p1 = (planes[g] >> 8) & 0xffu, p2 = planes[g] >> 16;
    esc[g] = ~(p0 ^ f.lit_planes) & ~(p1 ^ (f.lit_planes >> 8)) & ~(p2 ^ (f.lit_planes >> 16)) &
             ((1u << cnt[g]) - 1u) & 0xffu;
    nbits[g] = 8 * __popc(esc[g]);
  }
  const uint32_t total = round_positions(nbits, pos);
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    if (!cnt[g]) continue;
    uint32_t pre[2];
    prefix_bytes(planes[g], s_spread8, pre);
    const DecRaw<F> raw = dec_raw<F, false>(buf, L, e0[g], cnt[g]);
    dec_group_fast<F>(pre, esc[g], raw, cnt[g], (bits + pos[g]) >> 3,
                      reinterpret_cast<const uint8_t*>(stage), f, out, e0[g], err, sum);
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
  bool ok = aligned(out + start, 16);
#pragma unroll
  for (int j = 0; j < F::RAWB; ++j) ok = ok && aligned(buf + L.raw_byte_at[j] + start, 8);
  return ok;
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

// A byte-escape table, a whole round of an aligned block: vector loads and stores, and every
// escape of a group patched at once. s[g] holds the prefix nibbles with bit 3 of nibble k set
// where element k escapes (prefix == L); prmt's sign mode then replicates the msb of the
// looked-up byte for those elements, which is harmless: their symbol byte is replaced by the
// escape byte, and the literal prefix's bad byte is 0. The symbols are then joined with the raw
// planes: BF16's by permutes from its one raw byte plane, loaded before the scan; FP16's and
// FP32's as the generic decoder joins them (put_joined). pf: as in round_planes (raw planes too).
template <class F, class S>
__device__ inline uint32_t dec_round_z(const uint8_t* buf, typename F::T* out, const Layout& L,
                                       long long start, int r, const Fast& f,
                                       const uint32_t* s_spread4, uint32_t bits,
                                       const uint32_t* stage, int& err, bool pf, S& sum) {
  constexpr bool kBF16 = std::is_same_v<F, BF16>;
  const long long e = start + static_cast<long long>(r) * kRound + 8 * (threadIdx.x & 31);
  if (pf) {  // the next round's raw planes into L2
#pragma unroll
    for (int j = 0; j < F::RAWB; ++j)
#pragma unroll
      for (int g = 0; g < kGroups; ++g) prefetch_l2(buf + L.raw_byte_at[j] + e + kRound + 256 * g);
#pragma unroll
    for (int j = 0; j < F::RAWb; ++j)
      prefetch_l2(buf + L.raw_bit_at[j] + (e >> 3) + kRound / 8 + 32 * (threadIdx.x & 3));
  }
  uint32_t s[kGroups], nbits[kGroups], pos[kGroups], b[kGroups][3];
  round_planes(buf, L, e, pf, b);
  DecRaw<F> early[kBF16 ? kGroups : 1];
  if constexpr (kBF16) {
#pragma unroll
    for (int g = 0; g < kGroups; ++g) early[g] = dec_raw<F, true>(buf, L, e + 256 * g, 8);
  }
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
  uint32_t bad = 0, symbols = 0;
  typename F::T* o = out + e;
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
    if constexpr (kBF16) {
      // BF16 of element k: high byte sign | exponent >> 1, low byte exponent << 7 | mantissa.
      const unsigned long long rb = early[g].rb[0];
      const uint32_t r0 = static_cast<uint32_t>(rb), r1 = static_cast<uint32_t>(rb >> 32);
      const uint32_t h0 = bitsel<0x7f7f7f7fu>(ex0 >> 1, r0), l0 = bitsel<0x80808080u>(ex0 << 7, r0);
      const uint32_t h1 = bitsel<0x7f7f7f7fu>(ex1 >> 1, r1), l1 = bitsel<0x80808080u>(ex1 << 7, r1);
      const uint32_t v[4] = {prmt(l0, h0, 0x5140), prmt(l0, h0, 0x7362), prmt(l1, h1, 0x5140),
                             prmt(l1, h1, 0x7362)};
      *reinterpret_cast<uint4*>(o + 256 * g) = make_uint4(v[0], v[1], v[2], v[3]);
      sum.template group<uint16_t>(e + 256 * g, 8, v);
    } else {
      symbols |= ex0 | ex1;
      uint32_t sym2[4];
      pairs_of_bytes(ex0, ex1, sym2);
      put_joined<F>(sym2, dec_raw<F, true>(buf, L, e + 256 * g, 8), o + 256 * g, e + 256 * g, sum);
    }
  }
  if (bad) err |= kErrRank;
  err |= symbol_errors<F>(symbols);
  return total;
}

// Every format but the fast path (FP8; BF16, FP16, FP32 under other tables): per-prefix widths
// in registers, looked up four elements at a time by byte permutes; each element's bit offset in
// its half group by one multiply (a byte-wise prefix sum of the widths); one shared table, in the
// compact layout of region_off, maps (prefix, payload value) to the symbol (FP8: the byte; else
// the exponent field, joined with the raw planes), or flags an illegal rank (bit 8).
constexpr int kSym2 = 8 * 256;

__device__ inline uint16_t sym2_entry(const int32_t* tab, const DecTab& t, uint32_t nranked,
                                      int i) {
  const uint32_t r = tab[kRegionAt + (i >> 8)], v = i & 0xffu;
  if (r >> kRegionLiteralShift) return static_cast<uint16_t>(v);  // literal region: the value is the symbol
  const uint32_t rank = ((r >> kRegionBaseShift) & 0x3ffu) + v;
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

// The width bytes of a half group (0 past the group's count); volatile: recomputed after the
// scan instead of held across it.
__device__ inline uint32_t width_of(uint32_t w_lo, uint32_t w_hi, uint32_t sel, int cnt, bool hi) {
  uint32_t d;
  asm volatile("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(w_lo), "r"(w_hi), "r"(sel & 0x7777u));
  return d & valid_bytes(cnt, hi);
}

// Every format but BF16's fast path, any round: a group's prefixes from its plane bytes, the
// widths and entries as dec_round_sym_z finds them, past-the-count elements read as width 0 and
// left out of the error check.
template <class F, bool FULL, class S>
__device__ inline uint32_t dec_round_sym(const uint8_t* buf, typename F::T* out, const Layout& L,
                                         long long start, int r, uint32_t w_lo, uint32_t w_hi,
                                         uint32_t hb_lo, uint32_t hb_hi, const uint16_t* s_sym2,
                                         const unsigned long long* s_spread8, uint32_t bits,
                                         const uint32_t* stage, int& err, S& sum) {
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
    DecRaw<F> raw{};
    if constexpr (!F::BYTE_CODED) raw = dec_raw<F, false>(buf, L, e0[g], cnt[g]);
    uint32_t at = bits + pos[g], e[8];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t wb = width_of(w_lo, w_hi, sel[g][h], cnt[g], h);
      const uint32_t i = at >> 5;
      const uint32_t win = __funnelshift_l(stage[i + 1], stage[i], at & 31u);  // <= 32 bits
      const uint32_t incl = wb * 0x01010101u, excl = incl - wb;
      const uint32_t hb = __byte_perm(hb_lo, hb_hi, sel[g][h]);  // off_p >> w_p per element
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t w = (wb >> (8 * k)) & 0xffu, x = (excl >> (8 * k)) & 0xffu;
        const uint32_t val = __funnelshift_l(win << x, 0u, w);  // the top w bits, 0 if w = 0
        e[4 * h + k] = s_sym2[(((hb >> (8 * k)) & 0xffu) << w) | val];  // off_p + val
        if (FULL || 4 * h + k < cnt[g]) bad |= e[4 * h + k];
      }
      at += incl >> 24;
    }
    dec_put<F, false>(e, raw, out + e0[g], e0[g], cnt[g], sum);
  }
  err |= entry_errors<F>(bad);
  return total;
}

// Every format but BF16's fast path, a whole round of an aligned block, with vector loads and
// stores. Entry off_p + v of the symbol table is one funnel shift of the per-prefix byte hb = off_p
// >> w (<= 7) and the payload bits; the bit window shifts left by each width in turn (funnel
// shifts read only the low 5 bits of the amount, so the width bytes need no masking). pf: as in
// round_planes (raw byte and bit planes too).
template <class F, class S>
__device__ inline uint32_t dec_round_sym_z(const uint8_t* buf, typename F::T* out, const Layout& L,
                                           long long start, int r, uint32_t w_lo, uint32_t w_hi,
                                           uint32_t hb_lo, uint32_t hb_hi, const uint16_t* s_sym2,
                                           const uint32_t* s_spread4, uint32_t bits,
                                           const uint32_t* stage, int& err, bool pf, S& sum) {
  const long long e = start + static_cast<long long>(r) * kRound + 8 * (threadIdx.x & 31);
  if (pf) {  // the next round's raw planes into L2
#pragma unroll
    for (int j = 0; j < F::RAWB; ++j)
#pragma unroll
      for (int g = 0; g < kGroups; ++g) prefetch_l2(buf + L.raw_byte_at[j] + e + kRound + 256 * g);
#pragma unroll
    for (int j = 0; j < F::RAWb; ++j)
      prefetch_l2(buf + L.raw_bit_at[j] + (e >> 3) + kRound / 8 + 32 * (threadIdx.x & 3));
  }
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
  typename F::T* o = out + e;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    DecRaw<F> raw{};
    if constexpr (!F::BYTE_CODED) raw = dec_raw<F, true>(buf, L, e + 256 * g, 8);
    uint32_t at = bits + pos[g], ent[8];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t sh = h ? sel[g] >> 16 : sel[g];
      const uint32_t wb = prmt(w_lo, w_hi, sh), hb = prmt(hb_lo, hb_hi, sh);
      const uint32_t i = at >> 5;
      uint32_t t = __funnelshift_l(stage[i + 1], stage[i], at);  // <= 32 bits from `at`
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t w = wb >> (8 * k);  // low 5 bits: width k
        ent[4 * h + k] = s_sym2[__funnelshift_l(t, prmt(hb, 0u, 0x4440 + k), w)];
        if (k < 3) t = __funnelshift_l(0u, t, w);
      }
      bad |= (ent[4 * h] | ent[4 * h + 1]) | (ent[4 * h + 2] | ent[4 * h + 3]);
      at += (wb * 0x01010101u) >> 24;
    }
    dec_put<F, true>(ent, raw, o + 256 * g, e + 256 * g, 8, sum);
  }
  err |= entry_errors<F>(bad);
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

// CTAs per SM a decoder is compiled for (its register budget): the byte-coded and the 16-bit
// fast-path decoders are held to 64 registers (four CTAs per SM instead of two or three, which
// the latency-bound decoders need), the others to 80 (three CTAs; they spill nothing there).
template <class F, bool Z>
__host__ __device__ constexpr int decode_ctas() {
  return F::BYTE_CODED || (Z && sizeof(typename F::T) == 2) ? 4 : 3;
}

// Each warp decodes whole blocks. The payload stream is `pay` (payload_cap bytes): the
// container's own payload section, or a separate buffer. An exponent format under a byte-escape
// table (Z) takes dec_round_z for the whole rounds of an aligned block (round_aligned) and
// dec_round for the rest; every other table and FP8 the compact symbol table: dec_round_sym_z for
// those whole rounds, dec_round_sym for the rest. CK: the decoded values' checksum is summed on
// the way and checked against the header's at buf + kChecksumAt (verify_sum; `acc` its zeroed
// accumulator).
template <class F, bool Z, bool CK>
__global__ void __launch_bounds__(32 * kMaxWarps, decode_ctas<F, Z>())
decode_kernel(const uint8_t* __restrict__ buf, const uint8_t* __restrict__ pay,
              typename F::T* __restrict__ out, const Layout L, const int32_t* __restrict__ tab,
              const Report report, SumAcc* __restrict__ acc) {
  __shared__ DecTab t;
  constexpr bool kSym = !Z;  // the compact symbol table (every decoder but the fast path)
  __shared__ uint16_t s_sym2[kSym ? kSym2 : 1];
  __shared__ unsigned long long s_spread8[256];  // bit k of a plane byte -> byte k
  __shared__ uint32_t s_spread4[256];  // bit k of a plane byte -> nibble k
  __shared__ uint32_t s_off[kSym ? 8 : 1];  // compact symbol table: region offsets
  extern __shared__ uint4 s_stage[];
  constexpr long long head = kHeaderBytes;
  Summer<CK> sum;
  if (L.raw_size > 0 && buf[kLayoutAt] == kLayoutRaw) {  // uniform: the tensor's bytes follow
    grid_copy<CK>(reinterpret_cast<uint8_t*>(out), buf + head, L.raw_size - head, &sum);
    verify_sum(sum, acc, buf + kChecksumAt, report);
    return;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t* stage = reinterpret_cast<uint32_t*>(s_stage) + warp * stage_words(L.block);
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    unsigned long long v = 0;
    for (int k = 0; k < 8; ++k) v |= static_cast<unsigned long long>((i >> k) & 1) << (8 * k);
    s_spread8[i] = v;
    uint32_t u = 0;
    for (int k = 0; k < 8; ++k) u |= static_cast<uint32_t>((i >> k) & 1) << (4 * k);
    s_spread4[i] = u;
  }
  if constexpr (Z) {
    __syncthreads();
  } else {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) t.rank[i] = static_cast<uint8_t>(tab[kRankAt + i]);
    if (threadIdx.x < 8) s_off[threadIdx.x] = region_off(tab, threadIdx.x);
    __syncthreads();
  }
  const Fast f = Z ? load_fast(tab) : Fast{};
  const uint32_t w_lo = kSym ? width_bytes(tab, 0) : 0u;
  const uint32_t w_hi = kSym ? width_bytes(tab, 4) : 0u;
  uint32_t hb_lo = 0, hb_hi = 0;  // byte p: s_off[p] >> w_p
  if constexpr (kSym) {
    const uint32_t nranked = tab[kCountAt];
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
      ? static_cast<unsigned long long>(L.payload_bytes) : load_bytes(buf + kSizeFieldAt, 8);
  if (size > static_cast<unsigned long long>(L.payload_cap)) {  // uniform across the grid
    if (threadIdx.x == 0 && blockIdx.x == 0) report(kErrRoom);
    return;
  }
  int err = 0;
  if (blockIdx.x == 0) {  // canonical form: the encoder leaves the alignment gaps zero
    for (int g = 0; g < L.ngaps; ++g)
      for (long long i = L.gap_lo[g] + threadIdx.x; i < L.gap_hi[g]; i += blockDim.x)
        if (buf[i]) err |= kErrGaps;
  }
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
    if constexpr (kSym)
      stage_payload_wide(stage, pay + lo, len, pay, pay + L.payload_cap);
    else
      stage_payload(stage, pay + lo, len, pay, pay + L.payload_cap);
    __syncwarp();
    const long long start = b * L.block;
    uint32_t bits = 0;
    const bool fast = round_aligned<F>(buf, out, L, start);  // uniform across the warp
    for (int r = 0; r < rounds(L); ++r) {
      const bool full = full_round(L, start, r);
      if constexpr (kSym) {
        if (full && fast)
          bits += dec_round_sym_z<F>(buf, out, L, start, r, w_lo, w_hi, hb_lo, hb_hi, s_sym2,
                                     s_spread4, bits, stage, err,
                                     r + 1 < rounds(L) && full_round(L, start, r + 1), sum);
        else if (full)
          bits += dec_round_sym<F, true>(buf, out, L, start, r, w_lo, w_hi, hb_lo, hb_hi, s_sym2,
                                         s_spread8, bits, stage, err, sum);
        else
          bits += dec_round_sym<F, false>(buf, out, L, start, r, w_lo, w_hi, hb_lo, hb_hi, s_sym2,
                                          s_spread8, bits, stage, err, sum);
      } else if (full && fast) {
        bits += dec_round_z<F>(buf, out, L, start, r, f, s_spread4, bits, stage, err,
                               r + 1 < rounds(L) && full_round(L, start, r + 1), sum);
      } else if (full) {
        bits += dec_round<F, true>(buf, out, L, start, r, f, s_spread8, bits, stage, err, sum);
      } else {
        bits += dec_round<F, false>(buf, out, L, start, r, f, s_spread8, bits, stage, err, sum);
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
  if (err) report(err);
  verify_sum(sum, acc, buf + kChecksumAt, report);
}

}  // namespace
