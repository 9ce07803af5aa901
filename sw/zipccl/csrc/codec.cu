// zipccl split-layout codec kernels (golden/container.py bytes), built by zipccl/_cuda.py (nvcc).
//
// One warp codes one block of `block` elements, with no CTA-wide barrier and no waiting on other
// blocks (the fast-path encoder gives a block to two warps of a CTA, each half its rounds, when a
// tensor has too few blocks to fill the GPU's warps: warp.cuh block_split). It walks the block in
// rounds of 1024 elements: lane l owns 4 groups of 8 consecutive elements (group g starts at round
// element 256*g + 8*l, so every warp access is contiguous). A group's 8 elements are one byte of
// every bit plane (prefix planes, FP16's raw bit planes) and one 8-byte store per raw byte plane.
// Payload bit positions come from one warp scan per round of packed per-group bit counts; the
// payload is assembled in the warp's slice of shared memory (the *stage*, big-endian 32-bit words:
// stream byte i at stage byte i ^ 3) and copied out.
//
// Compress (zipccl_compress) is three launches (a memset and two with a given table), none of which
// waits for the host or for another block, queued as one cached CUDA graph whose parameters each
// call sets (launch.cuh: a third of three launches' host time): (1) when no table is given, the
// default table from a strided sample, built on the device (sample.cuh, table.cuh: golden.theory's
// for exponent formats, the staircase table for FP8) into the buffer's table words and the header
// stage (its hash and the header's CRC-32 are left to one extra encode CTA); (2) encode: planes
// straight into the container, each block's payload into its fixed slot of a scratch area, its byte
// count, and an atomic add into its tile's sum (tiles of 256 blocks); (3) finish: every CTA sums
// the tile sums, one writes the header (payload size, checksum, the CRC-32 fixed up for them) and
// the sizes while the others place their blocks' uint64 offsets and payloads, and where the split
// layout would not be smaller the tensor is stored raw instead. Decompress is one launch: each warp
// reads its block's offsets, stages the payload and checks the block for consistency, reporting
// problems through an error flag (and, for a validating call, a notice in host memory); a buffer
// compress wrote is decoded by its own header (raw or split, payload size).
//
// An exponent format (BF16, FP16, FP32) under a byte-escape table (the ZipCCL exponent layout)
// has its own path (Z = true; FP16 decodes on it only, see encode_fast). Its encoder gets symbol
// and raw bytes by permutes, and an element's three plane bytes and escape mask by one table
// lookup and one add; the other encoders look each symbol up once (its spread plane bits and its
// codeword, appended by one funnel shift). Every other decoder finds symbols by byte-permute
// width lookups, byte-wise prefix sums of the widths and a (prefix, value) symbol table laid out
// so that an entry's index is one funnel shift. The decoders take a fast path for the whole
// rounds of a block whose raw bytes and output are aligned for vector access: plane bytes at
// immediate offsets, a group's prefixes as one word of nibbles from three lookups, bare prmt
// lookups, byte escapes patched without a loop, and an L2 prefetch of the next round; partial
// rounds and unaligned buffers take the general code. Their payloads (but the fast path's escape
// bytes) are staged with eight loads in flight per lane (the decoders are latency-bound).
// Measured numbers and the path that led here: BENCHMARKS.md §3 and benchmarks/results/codec.md.
//
// Files: layout.cuh (Layout, format traits, load/store helpers), table.cuh (device-side tables,
// CRC-32, SHA-256), warp.cuh (warp primitives), encode.cuh, decode.cuh, sample.cuh (sample
// summary, theory table), launch.cuh (grids, dependent launches, the call graphs); this file has
// the launchers and the exported entry points.
#include <climits>
#include <type_traits>

#include "decode.cuh"
#include "encode.cuh"
#include "launch.cuh"
#include "sample.cuh"

namespace {

// ------------------------------------------------------------------------------ launchers

// Whether a fast-path kind encodes on the fast path: FP16's is slower there than its generic
// encoder at 256 MiB (one H200: 1,286 against 1,391 GB/s; one H100: 3 %), though faster at 16
// MiB, so FP16 under byte escapes encodes generically and decodes on the fast path (1,520
// against 1,393 GB/s at 256 MiB; BENCHMARKS.md §3b).
template <class F, bool Z>
constexpr bool encode_fast = Z && !std::is_same_v<F, FP16>;

// The encoder's launches once its table is ready (and its tile sums zero): encode, finish.
// `head_to_hash`: the header stage `head` when its table hash is still to be computed (one more
// encode CTA does it), else null. `after_table`: a table kernel runs just before (the encode may
// start before it ends); else a memset does. `fast`: the kind's (by_kind), which encode_fast
// narrows.
template <class F, bool fast>
cudaError_t launch_encode(Chain& chain, const void* in, void* out, const Layout* L,
                          const int32_t* tab, void* work, const uint8_t* head,
                          const uint8_t* raw_head, long long* size,
                          uint8_t* head_to_hash = nullptr, bool after_table = false) {
  const int warps = warps_for(L->block), threads = 32 * warps;
  const size_t smem = static_cast<size_t>(warps) * stage_words(L->block) * 4 + enc_table_bytes<F>();
  constexpr bool Z = encode_fast<F, fast>;
  const int want = block_split(Z, *L, warps, LLONG_MAX);  // warps a block, given the room
  const long long ctas = (L->nb * want + warps - 1) / warps;
  const Work w = work_of(work, L->nb);
  uint8_t* o = static_cast<uint8_t*>(out);
  const auto kernel = L->checksum ? encode_kernel<F, Z, true> : encode_kernel<F, Z, false>;
  if (enc_table_bytes<F>()) allow_dynamic_smem(kernel, kMaxEncodeSmem);
  const unsigned grid = resident_grid(kernel, threads, smem, ctas) + !!head_to_hash;
  const auto* x = static_cast<const typename F::T*>(in);
  cudaError_t e = chain.kernel(kernel, grid, threads, smem, after_table, x, o, *L, tab, w,
                               head_to_hash);
  if (e != cudaSuccess) return e;
  const long long copiers = L->raw_size >> 18;  // CTAs to share a raw store, 256 KiB each
  const long long groups = (L->nb + kGroup - 1) / kGroup;
  const unsigned finishers =  // and one CTA for the header
      resident_grid(finish_kernel, 32 * kGroup, 0, groups > copiers ? groups : copiers) + 1;
  return chain.kernel(finish_kernel, finishers, 32 * kGroup, 0, true,
                      static_cast<const uint8_t*>(in), o, *L, w, head, raw_head, size);
}

// `acc`: the checksum's accumulator (zero; left zero) where L->checksum.
template <class F, bool Z = false>
int launch_decode(const void* buf, const void* pay, void* out, const Layout* L, const int32_t* tab,
                  const Report& report, SumAcc* acc, cudaStream_t s) {
  const int warps = warps_for(L->block), threads = 32 * warps;
  const size_t smem = static_cast<size_t>(warps) * stage_words(L->block) * 4;
  const long long ctas = (L->nb + warps - 1) / warps;
  if (L->checksum && !acc) return cudaErrorInvalidValue;
  const auto kernel = L->checksum ? decode_kernel<F, Z, true> : decode_kernel<F, Z, false>;
  kernel<<<resident_grid(kernel, threads, smem, ctas), threads, smem, s>>>(
      static_cast<const uint8_t*>(buf), static_cast<const uint8_t*>(pay),
      static_cast<typename F::T*>(out), *L, tab, report, acc);
  return cudaGetLastError();
}

// Calls `run(format, fast)` for a kernel kind (zipccl/_cuda.py KIND, FAST): 0 bfloat16, 1 float16,
// 2 float32, 3 FP8 (both formats code the whole byte); 4 bfloat16, 5 float16, 6 float32 under a
// byte-escape table (the fast path, fast = true).
constexpr int kKinds = 7;
template <class Run>
int by_kind(int kind, Run&& run) {
  switch (kind) {
    case 0: return run(BF16{}, std::false_type{});
    case 1: return run(FP16{}, std::false_type{});
    case 2: return run(FP32{}, std::false_type{});
    case 3: return run(FP8{}, std::false_type{});
    case 4: return run(BF16{}, std::true_type{});
    case 5: return run(FP16{}, std::true_type{});
    case 6: return run(FP32{}, std::true_type{});
    default: return cudaErrorInvalidValue;
  }
}

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
  Chain chain(s);
  return by_kind(kind, [&](auto f, auto z) {
    return launch_encode<decltype(f), decltype(z)::value>(chain, in, out, L, tab, work, h,
                                                         nullptr, nullptr);
  });
}

// A Plan's arguments of zipccl_compress (zipccl/_cuda.py CompressPlan): the same for every call.
struct CompressPlan {
  const Layout* L;
  const void* split_head;  // golden's split-layout header, payload size and table zero
  const void* raw_head;    // golden's raw-layout header, complete (but for a values checksum)
  const void* rows;        // FP8's staircase layouts (golden.builders.staircase_layouts)
  long long stride, count;  // the theory sample: `count` values `stride` apart
  int device, nrows;
};

// A compress call's size record (zipccl/_cuda.py META_BYTES): the buffer's bytes and payload
// bytes, then the default table's words.
struct SizeRecord {
  long long bytes, payload;
  int32_t words[kTableWords];
};

// zipccl_compress's answer when `stream` is being captured and the call brought the scratch
// its calls share: a captured call needs a scratch of its own (zipccl/_cuda.py CAPTURING).
constexpr int kCapturing = 0x40000000;

// codec.compress's kernels in one call, none of which waits for the host, queued from a cached
// graph (launch.cuh run_chain). `scratch`: the header stage (kMaxHeader bytes), the table kernel's
// control, then the encoder's work area at kScratchWorkAt. The control is zero between calls
// (zipccl/_cuda.py allocates the scratch zeroed; the table kernels leave it zero and zero the
// encoder's tile sums); with a given table one memset zeroes what must start at zero instead.
// `fresh`: the scratch is this call's own (inside a stream capture it must be). `tab`: a given
// table's words, with its header template `head`; null builds the default table on the device
// from the plan's sample into the record's words, and completes the plan's split header with it
// in the stage: golden.theory's table (theory_kernel) for exponent formats, FP8's staircase table
// (staircase_kernel) for byte-coded ones. The buffer takes the raw layout where the split one is
// not smaller; `record` gets the sizes.
constexpr long long kScratchWorkAt = 2048;
static_assert(kMaxHeader + sizeof(TheoryControl) <= kScratchWorkAt &&
                  kMaxHeader + sizeof(StairControl) <= kScratchWorkAt, "scratch layout");
static_assert(sizeof(SizeRecord) == 16 + 4 * kTableWords, "the size record has no padding");

extern "C" int zipccl_compress(const CompressPlan* P, int kind, const void* in, void* out,
                               SizeRecord* record, void* scratch, int fresh, const int32_t* tab,
                               const void* head, void* stream) {
  if (kind < 0 || kind >= kKinds) return cudaErrorInvalidValue;  // (before any CUDA call)
  const OnDevice on(P->device);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing(s, &capture);
  if (e != cudaSuccess) return e;
  if (capture != cudaStreamCaptureStatusNone && !fresh) return kCapturing;
  if (!tab && (P->stride <= 0 || P->count <= 0)) return cudaErrorInvalidValue;
  const Layout* L = P->L;
  uint8_t* stage = static_cast<uint8_t*>(scratch);
  void* work = stage + kScratchWorkAt;
  auto* counts = static_cast<unsigned long long*>(work);
  const long long count_words = counts_at(L->nb) / 8;
  const auto* h = static_cast<const uint8_t*>(tab ? head : P->split_head);
  const auto* rh = static_cast<const uint8_t*>(P->raw_head);
  int32_t* words = record->words;
  long long* size = &record->bytes;
  const auto queue = [&](Chain& chain) -> cudaError_t {
    if (tab) {  // no table kernel to zero the tile sums
      const cudaError_t z = chain.zero(scratch, kScratchWorkAt + counts_at(L->nb));
      if (z != cudaSuccess) return z;
    }
    return static_cast<cudaError_t>(by_kind(kind, [&](auto f, auto z) -> int {
      using F = decltype(f);
      const auto* x = static_cast<const typename F::T*>(in);
      cudaError_t t = cudaSuccess;
      if constexpr (F::BYTE_CODED) {
        const auto* rows = static_cast<const uint8_t*>(P->rows);
        if (!tab && (!rows || P->nrows <= 0 || P->nrows > 0xffff)) return cudaErrorInvalidValue;
        if (!tab)
          t = chain.kernel(staircase_kernel<F>, kSlots / 32, kStairThreads, 0, false, x,
                           P->stride, P->count, rows, P->nrows, h, stage, words, counts,
                           count_words);
      } else if (!tab) {
        t = chain.kernel(theory_kernel<F>, kSlots / 32, kTheoryThreads, 0, false, x, P->stride,
                         P->count, h, stage, words, counts, count_words);
      }
      if (t != cudaSuccess) return t;
      return launch_encode<F, decltype(z)::value>(chain, in, out, L, tab ? tab : words, work,
                                                  tab ? h : stage, rh, size,
                                                  tab ? nullptr : stage, !tab);
    }));
  };
  if (capture != cudaStreamCaptureStatusNone) {
    Chain chain(s);
    return queue(chain);
  }
  return run_chain(GraphKey{s, P->device, kind, tab != nullptr, *L}, s, queue);
}

// Copies the device word `flag` to `*result` through the calling thread's notice word `host`
// (pinned) and zeroes the flag, waiting for `s` (a validating decode that found something).
static cudaError_t read_flag(int* flag, volatile int* host, int* result, cudaStream_t s) {
  cudaError_t e = cudaMemcpyAsync(const_cast<int*>(host), flag, sizeof(int),
                                  cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaMemsetAsync(flag, 0, sizeof(int), s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e == cudaSuccess) *result = *host;
  return e;
}

// The calling thread's notice word for validating decodes (Report::notice): mapped pinned memory
// the kernel stores into, and the host reads after its stream sync; its device address in `dev`.
// Each validating call waits for its decode, so the thread's word is free again when it returns.
static cudaError_t notice_word(volatile int** host, int** dev) {
  thread_local int* word = nullptr;
  thread_local int* device_word = nullptr;
  if (!word) {
    cudaError_t e = cudaHostAlloc(reinterpret_cast<void**>(&word), sizeof(int),
                                  cudaHostAllocMapped | cudaHostAllocPortable);
    if (e == cudaSuccess)
      e = cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_word), word, 0);
    if (e != cudaSuccess) return e;
  }
  *host = word;
  *dev = device_word;
  return cudaSuccess;
}

// `pay` is the payload stream (L->payload_cap bytes); L->payload_bytes < 0 takes its size from
// the header at `buf`. clear != 0 zeroes the flag first; else problems are OR-ed into it. Where
// L->checksum, the decoded values are checked against the header's checksum, with `acc` (16
// bytes, zero) as the accumulator, which the decode leaves zero. `result` not null (a validating
// decode): the call also waits for the decode and stores the flag there, reading the device word
// (and zeroing it) only where the kernel stored a notice; one stream sync in all when nothing was
// found. The flag must then be zero.
extern "C" int zipccl_decode(int device, int kind, const void* buf, const void* pay, void* out,
                             const Layout* L, const int32_t* tab, int* flag, int clear,
                             void* acc, void* stream, int* result) {
  const OnDevice on(device);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (clear) {
    cudaError_t e = cudaMemsetAsync(flag, 0, sizeof(int), s);
    if (e != cudaSuccess) return e;
  }
  volatile int* notice = nullptr;
  Report report{flag, nullptr};
  if (result) {
    const cudaError_t e = notice_word(&notice, &report.notice);
    if (e != cudaSuccess) return e;
    *notice = 0;
  }
  cudaError_t e = static_cast<cudaError_t>(by_kind(kind, [&](auto f, auto z) {
    return launch_decode<decltype(f), decltype(z)::value>(buf, pay, out, L, tab, report,
                                                         static_cast<SumAcc*>(acc), s);
  }));
  if (e != cudaSuccess || !result) return e;
  e = cudaStreamSynchronize(s);
  *result = 0;
  return e == cudaSuccess && *notice ? read_flag(flag, notice, result, s) : e;
}

// The raw layout with a values checksum for a tensor too small for the split one (L->raw_size
// bytes in all): `raw_head` is golden's raw header with the checksum flag.
extern "C" int zipccl_seal_raw(int device, const void* in, void* out, const Layout* L,
                               const void* raw_head, void* stream) {
  const OnDevice on(device);
  seal_raw_kernel<<<1, kHeadThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out), *L,
      static_cast<const uint8_t*>(raw_head));
  return cudaGetLastError();
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
