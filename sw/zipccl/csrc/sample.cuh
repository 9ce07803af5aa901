// The deterministic sample: summary_kernel (statistics and histogram for the collectives),
// theory_kernel (golden.theory's table built on the device) and staircase_kernel (FP8's
// golden.builders.staircase_table built on the device). Included by codec.cu.
#pragma once

#include "encode.cuh"

namespace {

// The value of an exponent format's bit pattern (FP8's tables need the histogram alone).
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
          s.sq = fma(d, d, s.sq);  // fused: the bits do not depend on the compiler's choice
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

// theory_kernel's sample slots blockIdx.x * 32 + lane, with slot_sums' bits (summary_kernel's),
// in warp 0: 8 warps load, warp w the values 8w..8w+7 of every slot of each pass of kSampleSize
// (so an SM has 64 loads in flight, not one warp's), keeping a value's d where it counts (finite,
// non-zero; else 0, which leaves the sum as it is) and counting apart; then warp 0 adds each
// slot's squares in slot_sums' order from shared memory. Every thread of the CTA calls it.
constexpr int kTheoryThreads = kHeadThreads;
constexpr int kSampleWarps = kTheoryThreads / 32;
constexpr int kSlotValues = kSampleSize / kSlots;  // a slot's values per pass
constexpr int kWarpValues = kSlotValues / kSampleWarps;
template <class F>
__device__ inline Sums cta_slot_sums(const typename F::T* __restrict__ in, long long stride,
                                     long long count) {
  __shared__ double s_d[kSlotValues][32];
  __shared__ unsigned s_live[kSampleWarps][32], s_zeros[kSampleWarps][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long slot = blockIdx.x * 32ll + lane;
  Sums s{0.0, 0.0, 0.0};
  for (long long pass = 0; pass < count; pass += kSampleSize) {  // one pass: count <= kSampleSize
    uint32_t v[kWarpValues];
#pragma unroll
    for (int k = 0; k < kWarpValues; ++k) {
      const long long i = pass + slot + static_cast<long long>(warp * kWarpValues + k) * kSlots;
      v[k] = i < count ? static_cast<uint32_t>(in[i * stride]) : 0u;
    }
    unsigned live = 0, zeros = 0;
#pragma unroll
    for (int k = 0; k < kWarpValues; ++k) {
      const long long i = pass + slot + static_cast<long long>(warp * kWarpValues + k) * kSlots;
      const bool sampled = i < count;
      const double d = value_of<F>(v[k]);
      const bool counts = sampled && d != 0.0 && isfinite(d);
      zeros += sampled && d == 0.0;
      live += counts;
      s_d[warp * kWarpValues + k][lane] = counts ? d : 0.0;
    }
    s_live[warp][lane] = live;
    s_zeros[warp][lane] = zeros;
    __syncthreads();
    if (warp == 0) {
      for (int k = 0; k < kSlotValues; ++k) s.sq = fma(s_d[k][lane], s_d[k][lane], s.sq);
      for (int w = 0; w < kSampleWarps; ++w) {
        s.live += s_live[w][lane];
        s.zeros += s_zeros[w][lane];
      }
    }
    __syncthreads();
  }
  return s;
}

// The end of a table built on the device (`tb`, shared memory, complete): the kernels' table words
// into `words`, and the header stage: the template `head` (its table and hash fields zero, read
// when the kernel started, so that its latency hid behind the sampling) with the table's bytes in
// their field (the hash field stays zero: the encode kernel writes it and the CRC, seal_stage).
// Every thread of the CTA calls it.
__device__ inline void publish_table(const uint8_t* tb, const HeadBytes& head,
                                     uint8_t* __restrict__ stage, int32_t* __restrict__ words) {
  table_words(tb, words);
  for (int k = 0; k < kHeadPerThread; ++k) {
    const int i = threadIdx.x + kHeadThreads * k, t = i - kTableAt;
    stage[i] = t >= 0 && t < kTableBytes ? tb[t] : head.b[k];
  }
}

// A table kernel's control, after the header stage in a compress call's scratch (the two kernels'
// controls overlap). It is all zero between calls (the scratch is allocated zeroed, and each
// kernel's last CTA zeroes every field it used), so a compress with no table needs no memset: the
// table kernel also zeroes the encoder's tile sums (`counts`, `count_words` uint64), which the
// encode kernel after it accumulates into.
__device__ inline void zero_counts(unsigned long long* __restrict__ counts, long long count_words) {
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
       i < count_words; i += step)
    counts[i] = 0;
}

struct TheoryControl {
  unsigned ticket;  // sampling CTAs done
  unsigned pad;
  double part[kSlots / 32][3];  // each sampling CTA's sums (its 32 slots')
};

// golden.theory.top_symbols: the kTop most probable of the 256 bins into `ranks`, best first
// (ties to the smaller bin); thread i holds bin i's probability `p` (blockDim.x == 256). Each warp
// sorts its 32 bins by a bitonic network of shuffles; the global top kTop lie among the warps'
// heads (a bin's betters are all in the top kTop when it is), and a head's rank among the 8 kTop
// heads is its global rank there, so each head counts the heads better than it, all at once: one
// barrier in all, and no serial rounds.
__device__ inline void theory_top(double p, uint8_t* ranks) {
  constexpr int kHeads = 8 * kTop;
  __shared__ double s_p[kHeads];
  __shared__ int s_i[kHeads];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  auto better = [](double q, int j, double p, int i) { return q > p || (q == p && j < i); };
  int i = tid;
  for (int k = 2; k <= 32; k <<= 1) {  // descending by `better`: a strict total order
    for (int j = k >> 1; j; j >>= 1) {
      const double q = __shfl_xor_sync(kFull, p, j);
      const int qi = __shfl_xor_sync(kFull, i, j);
      const bool first = !(lane & j), down = !(lane & k) || k == 32;  // down: best first
      if (better(q, qi, p, i) == (first == down)) p = q, i = qi;
    }
  }
  if (lane < kTop) s_p[warp * kTop + lane] = p, s_i[warp * kTop + lane] = i;
  __syncthreads();
  if (tid < kHeads) {
    const double hp = s_p[tid];
    const int hi = s_i[tid];
    int rank = 0;
#pragma unroll 8
    for (int c = 0; c < kHeads; ++c) rank += better(s_p[c], s_i[c], hp, hi);
    if (rank < kTop) ranks[rank] = static_cast<uint8_t>(hi);
  }
}

// codec.default_table on the device: golden.theory.zipccl_table from the sample's statistics
// (RMS of the finite non-zero values, zero share), as table words in `words` and as the header
// template `head` (table bytes zero) completed with the table and its hash in `stage`. Launched
// as kSlots / 32 CTAs that each read 32 sample slots (cta_slot_sums; the sample is strided: one SM
// alone reads it at a fraction of the memory's speed); the last CTA to finish (a ticket, no
// waiting) adds the slots' sums in summary_kernel's order and builds the table, one bin per thread.
static_assert(kTheoryThreads == 256, "theory_top: one bin per thread");
static_assert(kWarpValues * kSampleWarps == kSlotValues, "cta_slot_sums: whole warps");
template <class F>
__global__ void __launch_bounds__(kTheoryThreads)
theory_kernel(const typename F::T* __restrict__ in, long long stride, long long count,
              const uint8_t* __restrict__ head, uint8_t* __restrict__ stage,
              int32_t* __restrict__ words, unsigned long long* __restrict__ counts,
              long long count_words) {
  __shared__ double s_sums[3], s_part[kSlots / 32][3];
  __shared__ uint8_t s_tb[kTableBytes];
  __shared__ bool s_last;
  auto* ctl = reinterpret_cast<TheoryControl*>(stage + kMaxHeader);
  const int tid = threadIdx.x, lane = tid & 31;
  let_dependents_start();  // the encoder's CTAs wait for this kernel's end, not for its launch
  const HeadBytes template_bytes = load_head(head);
  zero_counts(counts, count_words);
  const Sums mine = cta_slot_sums<F>(in, stride, count);
  if (tid < 32) {
    const Sums w = warp_sums(mine);
    if (lane == 0) {
      ctl->part[blockIdx.x][0] = w.sq;
      ctl->part[blockIdx.x][1] = w.live;
      ctl->part[blockIdx.x][2] = w.zeros;
      s_last = take_ticket(&ctl->ticket) == gridDim.x - 1;
    }
  }
  __syncthreads();
  if (!s_last) return;
  // past the barrier after take_ticket: the other CTAs' sums are visible
  if (tid == 0) ctl->ticket = 0;  // every CTA has taken its ticket: zero for the next call
  static_assert(kSlots / 32 == 32, "one sampling CTA's sums per lane");
  if (tid < 32) {  // lane w loads CTA w's sums (one round trip); lane i < 3 adds component i
    for (int i = 0; i < 3; ++i) {
      s_part[lane][i] = __ldcg(&ctl->part[lane][i]);
      ctl->part[lane][i] = 0.0;  // the control is zero between calls, whichever kernel comes next
    }
    __syncwarp();
    if (lane < 3) s_sums[lane] = sum_warps(s_part, lane);  // (three chains at once, not in turn)
  }
  for (int i = tid; i < kTableBytes; i += blockDim.x) s_tb[i] = 0;
  __syncthreads();
  const double sigma = s_sums[1] > 0.0 ? sqrt(s_sums[0] / s_sums[1]) : 0.0;
  const double zeros = s_sums[2] / static_cast<double>(count);
  constexpr int top = (1 << F::EXP_BITS) - 1, bias = (1 << F::EXP_BITS) / 2 - 1;
  const bool spread = sigma > 0.0 && isfinite(sigma);
  // bin tid's probability from both its edges' cdf (the two erfc chains overlap; sharing the
  // edges between threads would cost two barriers)
  const double p = tid > top ? 0.0
                   : spread  ? theory_prob(tid, theory_cdf(tid, top, bias, sigma),
                                           theory_cdf(tid + 1, top, bias, sigma), zeros)
                             : theory_prob(tid, 0.0, 0.0, zeros);
  theory_top(p, s_tb + 10);  // golden.theory.top_symbols: the 7 best bins
  if (tid == 0) s_tb[0] = 8 | kLiteralFlag, s_tb[8] = kTop;  // zipccl_layout: p0 escapes
  __syncthreads();
  publish_table(s_tb, template_bytes, stage, words);
}

// ------------------------------------------------------------------------------ FP8 table

// The staircase kernel's control, where the theory kernel's is (and zero between calls too).
struct StairControl {
  unsigned ticket;  // CTAs done
  unsigned hist[256];  // the sample's symbol counts, summed over the CTAs
};

// The CTA-wide inclusive prefix sum of one value per thread (blockDim.x == 256).
__device__ inline unsigned block_scan256(unsigned v, unsigned* warp_total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int d = 1; d < 32; d <<= 1) {
    const unsigned up = __shfl_up_sync(kFull, v, d);
    if (lane >= d) v += up;
  }
  if (lane == 31) warp_total[warp] = v;
  __syncthreads();
  for (int w = 0; w < warp; ++w) v += warp_total[w];
  return v;
}

// codec.default_table of an FP8 tensor on the device: golden.builders.staircase_table of the
// sample's byte histogram (an empty sample counts as one zero symbol, as codec._nonempty does),
// as table words in `words` and the header in `stage` (theory_kernel's contract), but for the
// table's hash: FP8 tables change with every histogram, so no cache saves the SHA-256, and one
// thread takes longer over it than the rest of this kernel; the encode kernel computes it in one
// extra CTA instead (seal_stage), beside the encoding.
// `rows`: golden.builders.staircase_layouts(), `nrows` rows of 8 widths. kSlots / 32 CTAs
// histogram a share of the sample each (many loads in flight: the sample is strided); the last
// CTA ranks the symbols (count descending, ties to the smaller symbol), scores every row by its
// exact bit total, one row per thread, and takes the first row of the least total.
constexpr int kStairThreads = kHeadThreads;
template <class F>
__global__ void __launch_bounds__(kStairThreads)
staircase_kernel(const typename F::T* __restrict__ in, long long stride, long long count,
                 const uint8_t* __restrict__ rows, int nrows, const uint8_t* __restrict__ head,
                 uint8_t* __restrict__ stage, int32_t* __restrict__ words,
                 unsigned long long* __restrict__ counts, long long count_words) {
  static_assert(F::BYTE_CODED, "the staircase family codes whole bytes");
  constexpr int kInFlight = 8;
  __shared__ unsigned s_hist[256], s_cum[257], s_warp[kStairThreads / 32];
  __shared__ int s_order[256];
  __shared__ unsigned long long s_best;
  __shared__ uint8_t s_tb[kTableBytes];
  __shared__ bool s_last;
  auto* ctl = reinterpret_cast<StairControl*>(stage + kMaxHeader);
  const int tid = threadIdx.x;
  let_dependents_start();  // as theory_kernel
  const HeadBytes template_bytes = load_head(head);
  zero_counts(counts, count_words);
  s_hist[tid] = 0;
  __syncthreads();
  const long long step = static_cast<long long>(gridDim.x) * kStairThreads;
  for (long long i0 = blockIdx.x * static_cast<long long>(kStairThreads) + tid; i0 < count;
       i0 += kInFlight * step) {
    uint32_t v[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const long long i = i0 + k * step;
      v[k] = i < count ? static_cast<uint32_t>(in[i * stride]) : 0u;
    }
#pragma unroll
    for (int k = 0; k < kInFlight; ++k)
      if (i0 + k * step < count) atomicAdd(&s_hist[F::sym(v[k])], 1u);
  }
  __syncthreads();
  if (s_hist[tid]) atomicAdd(&ctl->hist[tid], s_hist[tid]);
  __syncthreads();
  if (tid == 0) s_last = take_ticket(&ctl->ticket) == gridDim.x - 1;
  __syncthreads();
  if (!s_last) return;
  // past the barrier after take_ticket: the other CTAs' counts are visible
  const unsigned mine = __ldcg(&ctl->hist[tid]);
  ctl->hist[tid] = 0;  // every CTA has added its counts: zero for the next call
  if (tid == 0) ctl->ticket = 0;
  s_hist[tid] = mine;
  for (int i = tid; i < kTableBytes; i += blockDim.x) s_tb[i] = 0;
  if (tid == 0) s_best = ~0ull;
  __syncthreads();
  int rank = 0;
#pragma unroll 32
  for (int j = 0; j < 256; ++j) {
    const unsigned c = s_hist[j];
    rank += c > mine || (c == mine && j < tid);
  }
  s_order[rank] = tid;
  __syncthreads();
  const unsigned cum = block_scan256(s_hist[s_order[tid]], s_warp);
  s_cum[tid + 1] = cum;
  if (tid == 0) s_cum[0] = 0;
  __syncthreads();
  if (s_cum[256] == 0) {  // the order is then 0, 1, ..., 255 either way
    s_cum[tid + 1] = 1;
    __syncthreads();
  }
  for (int r = tid; r < nrows; r += blockDim.x) {
    unsigned start = 0;
    unsigned long long bits = 0;
    for (int p = 0; p < 8; ++p) {
      const int w = rows[8 * r + p];
      const unsigned end = min(start + (1u << w), 256u);
      bits += static_cast<unsigned long long>(kPrefixBits + w) * (s_cum[end] - s_cum[start]);
      start = end;
    }
    atomicMin(&s_best, bits << 16 | static_cast<unsigned>(r));
  }
  __syncthreads();
  const int best = static_cast<int>(s_best & 0xffffu);
  __shared__ int s_ranked;
  if (tid == 0) {
    int cap = 0;
    for (int p = 0; p < 8; ++p) cap += 1 << rows[8 * best + p];
    s_ranked = min(cap, 256);
    s_tb[8] = s_ranked & 0xff, s_tb[9] = s_ranked >> 8;
  }
  if (tid < 8) s_tb[tid] = rows[8 * best + tid];
  __syncthreads();
  if (tid < s_ranked) s_tb[10 + tid] = static_cast<uint8_t>(s_order[tid]);
  __syncthreads();
  publish_table(s_tb, template_bytes, stage, words);
}

}  // namespace
