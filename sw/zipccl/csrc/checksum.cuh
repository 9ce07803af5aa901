// golden.container.values_checksum, summed by the threads that read (encode) or write (decode) the
// tensor's values as they go: a pair of 32-bit words' terms depend on the pair and its index alone,
// so any thread may add any pair's, in any order, and the sums combine by addition. Included by
// warp.cuh.
#pragma once

#include "layout.cuh"

namespace {

constexpr uint32_t kSumKey = 0x9E3779B9u;

// The accumulator of a grid's sums (the decoder's `acc`; the encoder's in its work area): the pair
// products' sum first (8-aligned), then the word sum and, for the decoder, a count of finished CTAs.
struct SumAcc {
  unsigned long long pairs;
  uint32_t low, done;
};

__host__ __device__ inline unsigned long long checksum_of(unsigned long long pairs, uint32_t low) {
  return (((pairs ^ (pairs >> 32)) & 0xffffffffull) << 32) | low;
}

// A thread's part of the checksum when ON; when not, every member is a no-op the compiler drops,
// so the kernels without a checksum are the same code as before it existed.
template <bool ON>
struct Summer {
  unsigned long long pairs = 0;
  uint32_t low = 0;

  // Words i and i + 1 (i even, mod 2^32) of the tensor's bytes: one multiply-add.
  __device__ __forceinline__ void pair(uint32_t i, uint32_t w0, uint32_t w1) {
    if constexpr (ON) {
      const uint32_t k = i * kSumKey;
      low += w0 + w1;
      pairs += static_cast<unsigned long long>(w0 + k) * (w1 + k + kSumKey);
    }
  }

  // A group's 8 elements from element e0 (a multiple of 8) on, packed little endian in
  // 2 * sizeof(T) words; only the bytes of its first cnt elements count (golden pads the
  // tensor's last pair of words with zeros; the rest of a partial group is not the tensor's).
  template <typename T>
  __device__ __forceinline__ void group(long long e0, int cnt, const uint32_t* w) {
    if constexpr (ON) {
      const uint32_t i0 = static_cast<uint32_t>(e0 * static_cast<long long>(sizeof(T)) / 4);
      const int bytes = cnt * static_cast<int>(sizeof(T));
#pragma unroll
      for (int j = 0; j < 2 * static_cast<int>(sizeof(T)); j += 2)
        if (4 * j < bytes) pair(i0 + j, masked(w[j], bytes - 4 * j), masked(w[j + 1], bytes - 4 * j - 4));
    }
  }

  // The same from 8 element values (one per entry of v, as the generic decoder holds them).
  template <typename T>
  __device__ __forceinline__ void values(long long e0, int cnt, const uint32_t v[8]) {
    if constexpr (ON && sizeof(T) == 4) {
      group<T>(e0, cnt, v);
    } else if constexpr (ON && sizeof(T) == 2) {
      const uint32_t w[4] = {(v[0] & 0xffffu) | v[1] << 16, (v[2] & 0xffffu) | v[3] << 16,
                             (v[4] & 0xffffu) | v[5] << 16, (v[6] & 0xffffu) | v[7] << 16};
      group<T>(e0, cnt, w);
    } else if constexpr (ON) {
      uint32_t w[2] = {0u, 0u};
#pragma unroll
      for (int k = 0; k < 8; ++k) w[k >> 2] |= (v[k] & 0xffu) << (8 * (k & 3));
      group<T>(e0, cnt, w);
    }
  }

  // Adds the warp's sums into `acc`, made visible device-wide before the call returns. Every
  // lane of the warp must call it.
  __device__ __forceinline__ void commit(SumAcc* acc) const {
    if constexpr (ON) {
      unsigned long long p = pairs;
      uint32_t l = low;
#pragma unroll
      for (int d = 16; d; d >>= 1) p += __shfl_xor_sync(kFull, p, d), l += __shfl_xor_sync(kFull, l, d);
      if ((threadIdx.x & 31) == 0) {
        atomicAdd(&acc->pairs, p);
        atomicAdd(&acc->low, l);
        __threadfence();
      }
    }
  }

 private:
  // The first `left` bytes of a word (all of it from 4 on, none at 0 or below).
  __device__ __forceinline__ static uint32_t masked(uint32_t w, int left) {
    return left >= 4 ? w : left <= 0 ? 0u : w & ((1u << (8 * left)) - 1u);
  }
};

// The decoder's check, by the grid's last CTA to finish: the summed checksum against the header's
// (at `expect`), kErrChecksum reported where they differ. `acc` is zero before the grid starts;
// the last CTA leaves it zero again for the next decode. Every thread of every CTA must call it
// once.
template <bool ON>
__device__ inline void verify_sum(const Summer<ON>& sum, SumAcc* acc, const uint8_t* expect,
                                  const Report& report) {
  if constexpr (ON) {
    __shared__ bool s_last;
    sum.commit(acc);
    __syncthreads();  // every warp's sums are in
    if (threadIdx.x == 0) s_last = atomicAdd(&acc->done, 1u) == gridDim.x - 1;
    __syncthreads();
    if (threadIdx.x == 0 && s_last) {
      __threadfence();
      const unsigned long long pairs = atomicExch(&acc->pairs, 0ull);
      const uint32_t low = atomicExch(&acc->low, 0u);
      atomicExch(&acc->done, 0u);
      unsigned long long want = 0;
      for (int k = 0; k < 8; ++k) want |= static_cast<unsigned long long>(expect[k]) << (8 * k);
      if (checksum_of(pairs, low) != want) report(kErrChecksum);
    }
  }
}

}  // namespace
