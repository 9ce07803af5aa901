// golden.container.values_checksum, summed by the threads that read (encode) or write (decode) the
// tensor's values as they go: a 32-bit word's term depends on the word and its index alone, so any
// thread may add any word's, in any order, and the sums combine by addition. Included by warp.cuh.
#pragma once

#include "layout.cuh"

namespace {

constexpr uint32_t kSumKey = 0x9E3779B9u, kSumMix1 = 0x85EBCA6Bu, kSumMix2 = 0xC2B2AE35u;

// A thread's part of the checksum when ON; when not, every member is a no-op the compiler drops,
// so the kernels without a checksum are the same code as before it existed.
template <bool ON>
struct Summer {
  uint32_t lo = 0, hi = 0;

  // Word i (mod 2^32) of the tensor's bytes: golden's fmix32(w ^ i * key), summed and summed
  // with weight 2i + 1.
  __device__ __forceinline__ void word(uint32_t i, uint32_t w) {
    if constexpr (ON) {
      uint32_t h = w ^ (i * kSumKey);
      h ^= h >> 16;
      h *= kSumMix1;
      h ^= h >> 13;
      h *= kSumMix2;
      h ^= h >> 16;
      lo += h;
      hi += h * (2u * i + 1u);
    }
  }

  // A group's 8 elements from element e0 (a multiple of 8) on, packed little endian in
  // 2 * sizeof(T) words; only the bytes of its first cnt elements count (golden pads the
  // tensor's last word with zeros; the rest of a partial group is not the tensor's).
  template <typename T>
  __device__ __forceinline__ void group(long long e0, int cnt, const uint32_t* w) {
    if constexpr (ON) {
      const uint32_t i0 = static_cast<uint32_t>(e0 * static_cast<long long>(sizeof(T)) / 4);
      const int bytes = cnt * static_cast<int>(sizeof(T));
#pragma unroll
      for (int j = 0; j < 2 * static_cast<int>(sizeof(T)); ++j) {
        const int left = bytes - 4 * j;
        if (left > 0) word(i0 + j, left >= 4 ? w[j] : w[j] & ((1u << (8 * left)) - 1u));
      }
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

  // Adds the warp's sums into acc[0] (lo) and acc[1] (hi), made visible device-wide before the
  // call returns. Every lane of the warp must call it.
  __device__ __forceinline__ void commit(uint32_t* acc) const {
    if constexpr (ON) {
      uint32_t l = lo, h = hi;
#pragma unroll
      for (int d = 16; d; d >>= 1) l += __shfl_xor_sync(kFull, l, d), h += __shfl_xor_sync(kFull, h, d);
      if ((threadIdx.x & 31) == 0) {
        atomicAdd(acc, l);
        atomicAdd(acc + 1, h);
        __threadfence();
      }
    }
  }
};

// The decoder's check, by the grid's last CTA to finish: the summed checksum against the header's
// (at `expect`), kErrChecksum into `flag` where they differ. `acc`: lo, hi and a count of finished
// CTAs, zero before the grid starts; the last CTA leaves them zero again for the next decode. Every
// thread of every CTA must call it once.
template <bool ON>
__device__ inline void verify_sum(const Summer<ON>& sum, uint32_t* acc, const uint8_t* expect,
                                  int* flag) {
  if constexpr (ON) {
    __shared__ bool s_last;
    sum.commit(acc);
    __syncthreads();  // every warp's sums are in
    if (threadIdx.x == 0) s_last = atomicAdd(acc + 2, 1u) == gridDim.x - 1;
    __syncthreads();
    if (threadIdx.x == 0 && s_last) {
      __threadfence();
      const unsigned long long got =
          static_cast<unsigned long long>(atomicExch(acc + 1, 0u)) << 32 | atomicExch(acc, 0u);
      atomicExch(acc + 2, 0u);
      unsigned long long want = 0;
      for (int k = 0; k < 8; ++k) want |= static_cast<unsigned long long>(expect[k]) << (8 * k);
      if (got != want) atomicOr(flag, kErrChecksum);
    }
  }
}

}  // namespace
