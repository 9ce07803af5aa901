// Warp and grid primitives: bit positions of a lane's groups, plane bytes by ballot, the payload stage.
// Included by codec.cu.
#pragma once

#include "checksum.cuh"

namespace {

// Programmatic dependent launch (Hopper): the kernels of one compress call form a chain (table,
// encode, finish), and each but the first is launched to start before the one it depends on has
// finished (codec.cu launch_after), so its launch latency hides behind the running kernel. A
// kernel lets its dependent be placed (let_dependents_start: every CTA once, early), and the
// dependent waits for it to finish, its writes visible, before it reads anything
// (wait_for_predecessor). Without such a launch both are no-ops.
__device__ __forceinline__ void let_dependents_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_predecessor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// A grid's last-CTA ticket: the previous count of `ticket`, incremented with acquire-release
// semantics at GPU scope. The release makes the caller's earlier writes, and (being cumulative)
// those its CTA made before a __syncthreads, visible to whoever takes a later ticket; the acquire
// makes the CTA that takes the last ticket see every other CTA's, once a __syncthreads passes
// that on to its other threads. No __threadfence on either side.
__device__ __forceinline__ unsigned take_ticket(unsigned* ticket) {
  unsigned previous;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;"
               : "=r"(previous) : "l"(ticket) : "memory");
  return previous;
}

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

// OR `w` into the shared-memory word at `p` where `w` is not zero: a reduction (no value
// returned) at a shared-window address, which leaves the encoder's round fewer instructions than
// atomicOr does.
__device__ __forceinline__ void or_shared_nonzero(uint32_t* p, uint32_t w) {
  const uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("{\n\t.reg .pred nz;\n\tsetp.ne.u32 nz, %1, 0;\n\t"
               "@nz red.shared.or.b32 [%0], %1;\n\t}" ::"r"(at), "r"(w) : "memory");
}

// OR the low `n` (<= 64) bits of `acc`, MSB first, into the big-endian word stage (in shared
// memory) at bit `pos` (nothing where n is 0). The 64 left-aligned bits hi:lo land in three
// words: hi >> off, the low half of hi:lo >> off, and lo << (32 - off) (0 for off = 0: the
// clamped funnel shift).
__device__ inline void emit_bits(uint32_t* stage, uint32_t pos, unsigned long long acc,
                                 uint32_t n) {
  const uint32_t i = pos >> 5, off = pos & 31u;
  const unsigned long long v = n ? acc << (64u - n) : 0ull;  // left-aligned
  const uint32_t hi = static_cast<uint32_t>(v >> 32), lo = static_cast<uint32_t>(v);
  or_shared_nonzero(&stage[i], hi >> off);
  or_shared_nonzero(&stage[i + 1], __funnelshift_r(lo, hi, off));
  or_shared_nonzero(&stage[i + 2], __funnelshift_lc(0u, lo, 32u - off));
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

__host__ __device__ inline int rounds(const Layout& L) {
  return static_cast<int>((L.block + kRound - 1) / kRound);
}

// Warps that code one block in the encoder: two for the fast path (Z), each half of the
// rounds, where the rounds and the CTA's warps split evenly (a block's payload is whole escape
// bytes there, so the second half's bytes follow the first's whatever their count) and the grid
// holds two warps for every block, else one. Two halve a block's latency where a tensor has fewer
// blocks than the GPU holds warps; where it has more, one warp a block already fills every slot
// and the split's meeting and byte moves only cost (2-6 % at 256 MiB-1 GiB: BENCHMARKS.md §3i).
// `ctas`: the encoding CTAs launched (launch_encode asks for two warps a block where the split is
// possible, and gets at most a full GPU's worth).
__host__ __device__ inline int block_split(bool z, const Layout& L, int warps, long long ctas) {
  const bool even = z && rounds(L) % 2 == 0 && warps % 2 == 0;
  return even && ctas * warps >= 2 * L.nb ? 2 : 1;
}

// The two warps 2p and 2p + 1 of a CTA meet (named barrier 1 + p; 0 is __syncthreads).
__device__ __forceinline__ void pair_sync(int warp) {
  asm volatile("bar.sync %0, 64;" ::"r"(1 + (warp >> 1)) : "memory");
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

// Copy `len` bytes from `src` (16-byte aligned, readable up to 16 bytes past `len`) to `dst` (any
// alignment, not overlapping `src`) with one warp: 16-byte stores where `dst` is aligned, each a
// lane's two 16-byte loads shifted by `dst`'s misalignment, bytes at its two ends. A payload is a
// few KiB, so a lane's stores are few: the more bytes each one moves, the fewer trips to memory the
// copy waits on (the finish kernel's moves are latency-bound).
__device__ inline void warp_copy(uint8_t* __restrict__ dst, const uint8_t* __restrict__ src,
                                 uint32_t len) {
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t head =
      min(len, static_cast<uint32_t>((16u - (reinterpret_cast<uintptr_t>(dst) & 15u)) & 15u));
  const uint32_t vecs = (len - head) / 16, q = head >> 2, shift = 8u * (head & 3u);
  if (lane < head) dst[lane] = src[lane];
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* d = reinterpret_cast<uint4*>(dst + head);
#pragma unroll 4
  for (uint32_t k = lane; k < vecs; k += 32) {
    const uint4 a = __ldg(s + k), b = __ldg(s + k + 1);
    // words q .. q + 4 of a:b (q is the same on every lane: selects, no local memory)
    const uint32_t w0 = q == 0 ? a.x : q == 1 ? a.y : q == 2 ? a.z : a.w;
    const uint32_t w1 = q == 0 ? a.y : q == 1 ? a.z : q == 2 ? a.w : b.x;
    const uint32_t w2 = q == 0 ? a.z : q == 1 ? a.w : q == 2 ? b.x : b.y;
    const uint32_t w3 = q == 0 ? a.w : q == 1 ? b.x : q == 2 ? b.y : b.z;
    const uint32_t w4 = q == 0 ? b.x : q == 1 ? b.y : q == 2 ? b.z : b.w;
    d[k] = make_uint4(__funnelshift_r(w0, w1, shift), __funnelshift_r(w1, w2, shift),
                      __funnelshift_r(w2, w3, shift), __funnelshift_r(w3, w4, shift));
  }
  for (uint32_t i = head + 16 * vecs + lane; i < len; i += 32) dst[i] = src[i];
}

// `len` bytes from `src` to `dst` by the whole grid, 16 bytes a thread where both are aligned, else
// 8 bytes (a pair of words) a thread; `sum` gets the copied bytes' checksum terms (byte 0 of `dst`
// is byte 0 of the tensor).
template <bool ON = false>
__device__ inline void grid_copy(uint8_t* dst, const uint8_t* src, long long len,
                                 Summer<ON>* sum = nullptr) {
  const long long tid = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  long long done = 0;
  if (aligned(dst, 16) && aligned(src, 16)) {
    const long long vecs = len / 16;
    for (long long i = tid; i < vecs; i += step) {
      const uint4 v = __ldcs(reinterpret_cast<const uint4*>(src) + i);
      reinterpret_cast<uint4*>(dst)[i] = v;
      if constexpr (ON) {
        const uint32_t w = static_cast<uint32_t>(4 * i);
        sum->pair(w, v.x, v.y), sum->pair(w + 2, v.z, v.w);
      }
    }
    done = 16 * vecs;
  }
  for (long long p = done / 8 + tid; 8 * p < len; p += step) {
    uint32_t w[2] = {0u, 0u};
    for (long long b = 8 * p; b < 8 * p + 8 && b < len; ++b) {
      dst[b] = src[b];
      w[(b >> 2) & 1] |= static_cast<uint32_t>(src[b]) << (8 * (b & 3));
    }
    if constexpr (ON) sum->pair(static_cast<uint32_t>(2 * p), w[0], w[1]);
  }
}

}  // namespace
