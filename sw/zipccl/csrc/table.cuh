// Tables on the device, so that a compress call never waits for the host: golden.theory's ZipCCL
// table from the sample's statistics, a table's canonical bytes (golden.codebook) -> the kernels'
// int32 table words, the header's table hash (SHA-256) and its CRC-32. Included by codec.cu.
#pragma once

#include <cstdint>

namespace {

// golden.codebook's canonical table (8 region descriptors, uint16 rank count, 256 ranks) and
// golden.container's header fields that hold it; tests/test_cuda_constants.py checks every
// constexpr here that golden defines against golden.
constexpr int kTableBytes = 266;
constexpr int kLayoutAt = 5, kHashAt = 96, kTableAt = 104;
constexpr uint8_t kLayoutRaw = 0;
constexpr uint8_t kLiteralFlag = 0x80, kWidthMask = 0x0f;
constexpr int kTop = 7;  // golden.theory.ZIPCCL_TOP: exponents given their own 3-bit code
constexpr int kPrefixBits = 3;  // golden.codebook.PREFIX_BITS: a code's prefix

// ------------------------------------------------------------------------------ CRC-32

// zlib's CRC-32 (reflected polynomial 0xEDB88320) of a header, by one warp instead of one
// thread (a byte a step is one serial chain of 508 lookups: 4.6 us). The CRC is
// linear: with the register's initial ones moved into the message (its first 4 bytes
// complemented) and 4 zero bytes put in front (a zero register ignores them), the 512 bytes split
// into 32 chunks of 16; lane l computes its chunk's CRC from a zero register, moves it past the
// 16 * (31 - l) bytes after the chunk (a product with x^(8 * bytes) mod P), and the lanes' values
// XOR to the register after the whole message.
constexpr uint32_t kCrcPoly = 0xEDB88320u;
constexpr int kCrcChunk = 16, kCrcSpan = 32 * kCrcChunk;  // the longest message: 512 bytes

// a * b mod P, both reflected (bit 31 is x^0): zlib's multmodp.
__host__ __device__ constexpr uint32_t crc_mul(uint32_t a, uint32_t b) {
  uint32_t p = 0;
  for (int i = 0; i < 32; ++i) {
    if (a & (0x80000000u >> i)) p ^= b;
    b = b & 1u ? (b >> 1) ^ kCrcPoly : b >> 1;
  }
  return p;
}

// x^(8 * bytes) mod P: what a CRC register is multiplied by when `bytes` zero bytes follow.
__host__ __device__ constexpr uint32_t crc_zeros(int bytes) {
  uint32_t r = 0x80000000u, x8 = 0x00800000u;  // 1 and x^8
  for (; bytes; bytes >>= 1, x8 = crc_mul(x8, x8))
    if (bytes & 1) r = crc_mul(r, x8);
  return r;
}

struct CrcShifts { uint32_t after[32]; };  // lane l: x^(8 * 16 * (31 - l)) mod P
__host__ __device__ constexpr CrcShifts crc_shifts() {
  CrcShifts s{};
  for (int l = 0; l < 32; ++l) s.after[l] = crc_zeros(kCrcChunk * (31 - l));
  return s;
}
__constant__ CrcShifts kCrcShifts = crc_shifts();

// CRC-32 of the `len` bytes at `p` (4 <= len <= kCrcSpan), in every lane; every lane of the warp
// calls it. Bit by bit (no table to build): it runs beside the table's hash, off the chain.
__device__ inline uint32_t warp_crc32(const uint8_t* p, int len) {
  const int lane = threadIdx.x & 31, front = kCrcSpan - len;
  uint32_t v = 0;
#pragma unroll
  for (int q = 0; q < kCrcChunk; ++q) {
    const int i = lane * kCrcChunk + q - front;
    v ^= i < 0 ? 0u : p[i] ^ (i < 4 ? 0xffu : 0u);
    for (int k = 0; k < 8; ++k) v = v & 1u ? (v >> 1) ^ kCrcPoly : v >> 1;
  }
  v = crc_mul(v, kCrcShifts.after[lane]);
  for (int d = 16; d; d >>= 1) v ^= __shfl_xor_sync(0xffffffffu, v, d);
  return v ^ 0xffffffffu;
}

// A header's CRC-32 with an 8-byte little-endian field changed from zero, without reading the
// header again: the CRC is affine in the message, so the change is the XOR of a term per set bit
// of the field (the register that bit leaves, from a zero register, moved past the bytes after the
// field), made at compile time. Header templates carry the CRC of their bytes with the payload
// size and values checksum zero; the kernels that fill those fields in fix the CRC up.
constexpr int kHeaderBytes = 512, kCrcAt = kHeaderBytes - 4;  // golden.container's header
constexpr int kSizeFieldAt = 24;  // golden.container.PAYLOAD_BYTES_AT
constexpr int kChecksumAt = 376;  // golden.container.CHECKSUM_AT: the table's end, 8-aligned
static_assert(kChecksumAt == (kTableAt + kTableBytes + 7) / 8 * 8 && kChecksumAt + 8 <= kCrcAt &&
                  kCrcAt <= kCrcSpan, "header fields");

struct CrcField { uint32_t bit[64]; };
__host__ __device__ constexpr CrcField crc_field(int at) {
  CrcField f{};
  const uint32_t after = crc_zeros(kCrcAt - at - 8);
  for (int k = 0; k < 64; ++k) {
    uint32_t v = 0;
    for (int b = 0; b < 64; ++b) {
      v ^= b == k ? 1u : 0u;
      v = v & 1u ? (v >> 1) ^ kCrcPoly : v >> 1;
    }
    f.bit[k] = crc_mul(v, after);
  }
  return f;
}
__constant__ CrcField kSizeCrc = crc_field(kSizeFieldAt);
__constant__ CrcField kChecksumCrc = crc_field(kChecksumAt);
__constant__ CrcField kHashCrc = crc_field(kHashAt);

// What `value` in field `f` changes in the CRC, in every lane (every lane of the warp calls it).
__device__ inline uint32_t warp_crc_field(const CrcField& f, unsigned long long value) {
  const int lane = threadIdx.x & 31;
  uint32_t v = (value >> lane & 1u ? f.bit[lane] : 0u) ^
               (value >> (lane + 32) & 1u ? f.bit[lane + 32] : 0u);
  for (int d = 16; d; d >>= 1) v ^= __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}

// ------------------------------------------------------------------------------ SHA-256

__constant__ uint32_t kSha[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

__device__ inline uint32_t rotr(uint32_t x, int n) { return __funnelshift_r(x, x, n); }

// The SHA-256 message of a canonical table: the table, 0x80, zeros, the 64-bit big-endian bit
// length; kShaBlocks blocks of 16 big-endian words.
constexpr int kShaBlocks = (kTableBytes + 9 + 63) / 64;

__device__ inline uint32_t sha_byte(const uint8_t* tb, int i) {
  if (i < kTableBytes) return tb[i];
  if (i == kTableBytes) return 0x80u;
  const int from_end = 64 * kShaBlocks - 1 - i;
  return from_end < 8 ? static_cast<uint32_t>((8ull * kTableBytes) >> (8 * from_end)) & 0xffu : 0u;
}

// The message's 16 * kShaBlocks words into `msg` (shared memory), by the whole CTA.
__device__ inline void sha_message(const uint8_t* tb, uint32_t* msg) {
  for (int t = threadIdx.x; t < 16 * kShaBlocks; t += blockDim.x)
    msg[t] = sha_byte(tb, 4 * t) << 24 | sha_byte(tb, 4 * t + 1) << 16 |
             sha_byte(tb, 4 * t + 2) << 8 | sha_byte(tb, 4 * t + 3);
  __syncthreads();
}

// golden.codebook.Codebook.hash64: the first 8 bytes of the table's SHA-256, little endian, from
// its sha_message. One thread: five compression rounds in a dependent chain, so the rounds are
// unrolled and the message schedule is a rolling window of 16 words, all in registers (a 64-word
// schedule lands in local memory, whose latency the chain then pays at every step).
__device__ inline unsigned long long table_sha64(const uint32_t* msg) {
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
#pragma unroll 1
  for (int blk = 0; blk < kShaBlocks; ++blk) {
    uint32_t w[16];
#pragma unroll
    for (int t = 0; t < 16; ++t) w[t] = msg[16 * blk + t];
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
#pragma unroll
    for (int t = 0; t < 64; ++t) {
      if (t >= 16) {  // w[t & 15] holds w[t - 16]
        const uint32_t x = w[(t - 15) & 15], y = w[(t - 2) & 15];
        w[t & 15] += (rotr(x, 7) ^ rotr(x, 18) ^ (x >> 3)) + w[(t - 7) & 15] +
                     (rotr(y, 17) ^ rotr(y, 19) ^ (y >> 10));
      }
      const uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                          kSha[t] + w[t & 15];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
  }
  unsigned long long out = 0;  // digest bytes 0..7 (big-endian words) as a little-endian uint64
  for (int j = 0; j < 8; ++j)
    out |= static_cast<unsigned long long>((h[j / 4] >> (24 - 8 * (j % 4))) & 0xffu) << (8 * j);
  return out;
}

// The hashes of recent theory tables, which a training run repeats call after call: keyed by the
// seven ranks (the rest of a ZipCCL exponent table is fixed). A seqlock per entry: a reader that
// sees the sequence change (or odd) treats the entry as a miss, so a torn entry is never used.
struct HashEntry { unsigned int seq; unsigned int pad; unsigned long long key, hash; };
constexpr int kHashSlots = 256;
__device__ HashEntry g_theory_hashes[kHashSlots];

__device__ inline unsigned long long theory_hash64(const uint32_t* msg, unsigned long long key) {
  HashEntry& e = g_theory_hashes[(key * 0x9E3779B97F4A7C15ull) >> 56];
  volatile HashEntry& v = e;
  const unsigned int s1 = v.seq;
  const unsigned long long k = v.key, h = v.hash;
  __threadfence();
  if (!(s1 & 1u) && s1 && v.seq == s1 && k == key) return h;
  const unsigned long long hash = table_sha64(msg);
  if (!(s1 & 1u) && atomicCAS(&e.seq, s1, s1 + 1u) == s1) {
    __threadfence();
    v.key = key;
    v.hash = hash;
    __threadfence();
    atomicExch(&e.seq, s1 + 2u);
  }
  return hash;
}

// The hash and CRC-32 fields of a header stage whose table is in place (payload size and checksum
// zero), by one CTA (`msg`: shared scratch of 16 * kShaBlocks words). Thread 0 hashes: table_sha64
// of the stage's table bytes or, for a ZipCCL theory table (`theory`), theory_hash64's cached
// hash, keyed by its seven ranks. Meanwhile warp 1 (warp 0 after the hash in a one-warp CTA)
// takes the CRC of the stage with its hash field still zero; the hash then moves it (kHashCrc).
// Every thread of the CTA calls it.
__device__ inline void seal_stage(uint8_t* stage, uint32_t* msg, bool theory) {
  __shared__ unsigned long long s_hash;
  __shared__ uint32_t s_crc;
  sha_message(stage + kTableAt, msg);
  if (threadIdx.x == 0) {
    unsigned long long key = 0;
    for (int r = 0; r < kTop; ++r)
      key |= static_cast<unsigned long long>(stage[kTableAt + 10 + r]) << (8 * r);
    s_hash = theory ? theory_hash64(msg, key) : table_sha64(msg);
  }
  if (threadIdx.x >> 5 == (blockDim.x > 32 ? 1 : 0)) {
    const uint32_t crc = warp_crc32(stage, kCrcAt);
    if ((threadIdx.x & 31) == 0) s_crc = crc;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const unsigned long long hash = s_hash;
    const uint32_t crc = s_crc ^ warp_crc_field(kHashCrc, hash);
    const int lane = threadIdx.x;
    if (lane < 8) stage[kHashAt + lane] = static_cast<uint8_t>(hash >> (8 * lane));
    if (lane < 4) stage[kCrcAt + lane] = static_cast<uint8_t>(crc >> (8 * lane));
  }
}

// ------------------------------------------------------------------------------ table words

// Table words (int32), golden.codebook's GPU table image (Codebook.gpu_words; its GPU_*
// constants): [0,256) encoder: payload | prefix << 8 | width << 12; [256,264) regions:
// width | base << 4 | literal << 15; [264,520) rank -> symbol; [520] count.
constexpr int kEncPrefixShift = 8, kEncWidthShift = 12;
constexpr int kRegionBaseShift = 4, kRegionLiteralShift = 15;
constexpr int kRegionAt = 256, kRankAt = 264, kCountAt = 520;
// Byte-escape tables (one literal region, every ranked region of width 0: the ZipCCL exponent
// layout) also carry, for the BF16 fast-path decoder: [521] literal prefix L, [522..523] prefix ->
// symbol bytes, [524..525] prefix -> 0xFF if the prefix is illegal.
constexpr int kFastAt = 521;
constexpr int kFastWords = 5;
constexpr int kTableWords = kFastAt + kFastWords;

// golden.codebook's lookup tables (encoder_lut, region_table, rank_lut) and the fast-path words
// of the canonical table `tb` (shared memory), written to `words` by the whole CTA; `tb` must be
// a valid complete table (the theory table below is by construction).
__device__ inline void table_words(const uint8_t* tb, int32_t* words) {
  __shared__ int s_base[8], s_lit;
  const int n = tb[8] | tb[9] << 8;
  if (threadIdx.x == 0) {
    int acc = 0;
    s_lit = -1;
    for (int p = 0; p < 8; ++p) {
      const bool lit = tb[p] & kLiteralFlag;
      s_base[p] = lit ? 0 : acc;
      if (lit) s_lit = p; else acc += 1 << (tb[p] & kWidthMask);
    }
  }
  __syncthreads();
  const int lit = s_lit;
  for (int s = threadIdx.x; s < 256; s += blockDim.x) {  // unranked symbols take the literal
    if (lit >= 0) words[s] = s | lit << kEncPrefixShift | 8 << kEncWidthShift;
    words[kRankAt + s] = s < n ? tb[10 + s] : 0;
  }
  __syncthreads();
  for (int r = threadIdx.x; r < n; r += blockDim.x) {
    for (int p = 0; p < 8; ++p) {
      const int w = tb[p] & kWidthMask;
      if (p != lit && s_base[p] <= r && r < s_base[p] + (1 << w))
        words[tb[10 + r]] = (r - s_base[p]) | p << kEncPrefixShift | w << kEncWidthShift;
    }
  }
  if (threadIdx.x < 8) {
    const int p = threadIdx.x, base = s_base[p];
    words[kRegionAt + p] = (tb[p] & kWidthMask) | (base < 256 ? base : 256) << kRegionBaseShift |
                           (p == lit) << kRegionLiteralShift;
  }
  if (threadIdx.x == 0) {
    words[kCountAt] = n;
    bool escape = lit >= 0;
    uint32_t sym[2] = {0, 0}, bad[2] = {0, 0};
    for (int p = 0; p < 8; ++p) {
      if (p == lit) continue;
      escape &= (tb[p] & kWidthMask) == 0;
      if (s_base[p] < n) sym[p / 4] |= static_cast<uint32_t>(tb[10 + s_base[p]]) << (8 * (p % 4));
      else bad[p / 4] |= 0xffu << (8 * (p % 4));
    }
    const uint32_t fast[kFastWords] = {static_cast<uint32_t>(lit), sym[0], sym[1], bad[0], bad[1]};
    for (int j = 0; j < kFastWords; ++j) words[kFastAt + j] = escape ? static_cast<int32_t>(fast[j]) : 0;
  }
  __syncthreads();
}

// ------------------------------------------------------------------------------ theory table

// golden.theory.exponent_probabilities with golden's operations in golden's order: the cdf at the
// bin edges 0, 2^(j - bias), inf, then a bin's difference scaled by the non-zero share and the
// zero share added to bin 0. CUDA's erfc may differ from the host's in the last ulps; the
// ranking only changes at exact ties.
// The outer edges' values are exact in golden too (2 * 0.5 * erfc(-0.0) - 1 and erfc(-inf) = 2),
// so they take no erfc.
__device__ inline double theory_cdf(int j, int top, int bias, double sigma) {
  if (j == 0) return 0.0;
  if (j > top) return 1.0;
  return 2.0 * (0.5 * erfc(-(ldexp(1.0, j - bias) / sigma) / 1.4142135623730951)) - 1.0;
}

__device__ inline double theory_prob(int i, double cdf_lo, double cdf_hi, double zeros) {
  const double p = (cdf_hi - cdf_lo) * (1.0 - zeros);
  return i == 0 ? p + zeros : p;
}

}  // namespace
