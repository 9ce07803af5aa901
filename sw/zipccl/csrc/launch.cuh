// Host side of the launchers: grid sizes, dependent launches, and a call's launches as a Chain
// that goes either straight onto the stream or into a cached CUDA graph of the same launches.
// Included by codec.cu.
//
// Why graphs: a compress call is three launches, and on the H200's hosts each launch costs the
// calling thread 3-4 µs, about half of the call's host time. Setting a cached graph's kernel
// parameters and launching it costs 3-5 µs for all three (BENCHMARKS.md §3f). The graph is
// recorded once per (stream, kernel kind, given table or not, layout), from the call's own
// launches, and from then on only its parameters change. Inside a user's stream capture the
// launches go straight into the user's graph instead.
#pragma once

#include <cuda_runtime.h>

#include <cstring>
#include <mutex>
#include <tuple>
#include <utility>

#include "layout.cuh"

namespace {

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

// A kernel whose dynamic shared memory may pass 48 KB must be allowed it first, once per device
// (the encoder's stages and the byte-coded format's table copies: encode.cuh enc_copies).
template <typename K>
void allow_dynamic_smem(K kernel, int bytes) {
  struct Allowed { const void* kernel; int dev; };
  static Allowed allowed[64];
  static int nallowed = 0;
  static std::mutex lock;
  const std::lock_guard<std::mutex> hold(lock);
  int dev = 0;
  cudaGetDevice(&dev);
  for (int i = 0; i < nallowed; ++i)
    if (allowed[i].kernel == reinterpret_cast<const void*>(kernel) && allowed[i].dev == dev) return;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (nallowed < 64) allowed[nallowed++] = {reinterpret_cast<const void*>(kernel), dev};
}

// Whether `device` runs programmatic dependent launches (compute capability 9.0 and up).
bool dependent_launch(int device) {
  static int known[64];  // 0 unknown, 1 no, 2 yes; a race only repeats the query
  if (device < 0 || device >= 64) return false;
  if (!known[device]) {
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    known[device] = major >= 9 ? 2 : 1;
  }
  return known[device] == 2;
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

constexpr int kMaxChainNodes = 4;
constexpr int kMaxParamBytes = 512;  // a chain kernel's parameters, packed (the Layout is ~300)

// A node's parameters as last set in the executable, packed one after another (no padding):
// a call whose parameters are the ones already set (the same tensors and buffers as the call
// before, as a loop that reuses its buffers makes) skips setting them, about 1 µs a node.
struct NodeParams {
  size_t bytes = 0;  // 0: unknown (the executable's are the recording call's), set them
  unsigned char data[kMaxParamBytes];

  // Stores the packed `values`; whether they differ from the stored ones (or do not fit).
  template <typename... Values>
  bool update(const Values&... values) {
    unsigned char next[kMaxParamBytes];
    size_t at = 0;
    bool fits = true;
    const auto pack = [&](const void* value, size_t size) {
      fits = fits && at + size <= kMaxParamBytes;
      if (fits) std::memcpy(next + at, value, size), at += size;
    };
    (pack(&values, sizeof(Values)), ...);
    if (!fits) {
      bytes = 0;
      return true;
    }
    if (at == bytes && std::memcmp(next, data, at) == 0) return false;
    std::memcpy(data, next, at);
    bytes = at;
    return true;
  }
};

// A recorded call: its graph, the executable, and each node with the kernel it runs (null: the
// memset node; a chain has at most one, and no kernel twice) and the parameters last set on it.
struct CallGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  const void* func[kMaxChainNodes] = {};
  cudaGraphNode_t node[kMaxChainNodes] = {};
  NodeParams params[kMaxChainNodes];
  int n = 0;
  cudaMemsetParams memset = {};  // the memset node's parameters as recorded

  int index_of(const void* f) const {
    for (int i = 0; i < n; ++i)
      if (func[i] == f) return i;
    return -1;
  }
};

// One call's launches. On a stream: each kernel is launched as it comes, `after` ones allowed to
// start before the kernel before them has finished (warp.cuh wait_for_predecessor: their CTAs
// wait for it), which hides all but the first launch's latency. On a recorded graph of the same
// launches (`g`): each sets its node's parameters instead, and the caller launches the graph.
class Chain {
 public:
  explicit Chain(cudaStream_t s) : s_(s) {}
  Chain(cudaStream_t s, CallGraph* g) : s_(s), g_(g) {}

  template <typename... Params, typename... Args>
  cudaError_t kernel(void (*k)(Params...), unsigned grid, unsigned threads, size_t smem,
                     bool after, Args... args) {
    std::tuple<Params...> values(static_cast<Params>(args)...);
    return g_ ? set(reinterpret_cast<const void*>(k), grid, threads, smem, values,
                    std::index_sequence_for<Params...>{})
              : launch(k, grid, threads, smem, after, values, std::index_sequence_for<Params...>{});
  }

  // Zero `bytes` at `p`.
  cudaError_t zero(void* p, size_t bytes) {
    if (!g_) return cudaMemsetAsync(p, 0, bytes, s_);
    const int i = g_->index_of(nullptr);
    if (i < 0) return cudaErrorInvalidValue;
    cudaMemsetParams m = g_->memset;  // the same bytes as recorded: the same layout
    if (m.width * m.elementSize != bytes || m.height != 1) return cudaErrorInvalidValue;
    m.dst = p;
    if (!g_->params[i].update(p)) return cudaSuccess;
    const cudaError_t e = cudaGraphExecMemsetNodeSetParams(g_->exec, g_->node[i], &m);
    if (e != cudaSuccess) g_->params[i].bytes = 0;
    return e;
  }

 private:
  template <typename... Params, size_t... I>
  cudaError_t launch(void (*k)(Params...), unsigned grid, unsigned threads, size_t smem,
                     bool after, std::tuple<Params...>& values, std::index_sequence<I...>) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s_;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    int device = 0;
    cudaGetDevice(&device);
    cfg.attrs = attr;
    cfg.numAttrs = after && dependent_launch(device) ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, k, std::get<I>(values)...);
  }

  template <typename Values, size_t... I>
  cudaError_t set(const void* f, unsigned grid, unsigned threads, size_t smem, Values& values,
                  std::index_sequence<I...>) {
    const int i = g_->index_of(f);
    if (i < 0) return cudaErrorInvalidValue;
    if (!g_->params[i].update(grid, threads, smem, std::get<I>(values)...)) return cudaSuccess;
    void* args[] = {static_cast<void*>(&std::get<I>(values))..., nullptr};
    cudaKernelNodeParams p = {};
    p.func = const_cast<void*>(f);
    p.gridDim = dim3(grid);
    p.blockDim = dim3(threads);
    p.sharedMemBytes = static_cast<unsigned>(smem);
    p.kernelParams = args;
    const cudaError_t e = cudaGraphExecKernelNodeSetParams(g_->exec, g_->node[i], &p);
    if (e != cudaSuccess) g_->params[i].bytes = 0;  // unknown again: the next call sets them
    return e;
  }

  cudaStream_t s_;
  CallGraph* g_ = nullptr;
};

// What makes two calls' launch sequences the same graph: the stream it runs on (a graph's launches
// are ordered behind its previous launch), the device, the kernel kind, whether a table was given
// (a memset where the table kernel would be), and the layout (grids, template choices).
struct GraphKey {
  cudaStream_t stream;
  int device, kind, table_given;
  Layout L;

  bool operator==(const GraphKey& o) const {
    return stream == o.stream && device == o.device && kind == o.kind &&
           table_given == o.table_given && std::memcmp(&L, &o.L, sizeof(Layout)) == 0;
  }
};

// A host thread's recorded calls, the most recently used first. Per thread, so no lock; a thread
// that exits leaves its few graphs to the process (no CUDA call runs in a thread's or the
// process's exit, when the driver may be gone).
class CallGraphs {
 public:
  static CallGraphs& mine() {
    thread_local CallGraphs* graphs = new CallGraphs();
    return *graphs;
  }

  // The graph recorded for `key`, or one recorded now from `queue(Chain&)` (on a private stream,
  // in this device's context); null where recording failed (the call then launches directly).
  template <class Queue>
  CallGraph* find_or_record(const GraphKey& key, Queue&& queue) {
    for (int i = 0; i < n_; ++i) {
      if (entry_[i].key == key) {
        Entry hit = entry_[i];
        for (int j = i; j > 0; --j) entry_[j] = entry_[j - 1];
        entry_[0] = hit;
        return &entry_[0].graph;
      }
    }
    CallGraph g;
    if (!record(key.device, queue, g)) return nullptr;
    if (n_ == kEntries) drop(entry_[--n_].graph);
    for (int j = n_; j > 0; --j) entry_[j] = entry_[j - 1];
    entry_[0] = Entry{key, g};
    ++n_;
    return &entry_[0].graph;
  }

 private:
  static constexpr int kEntries = 16;
  struct Entry {
    GraphKey key;
    CallGraph graph;
  };

  static void drop(CallGraph& g) {
    if (g.exec) cudaGraphExecDestroy(g.exec);  // a launch in flight completes first
    if (g.graph) cudaGraphDestroy(g.graph);
    g = CallGraph{};
  }

  template <class Queue>
  bool record(int device, Queue& queue, CallGraph& g) {
    if (device < 0 || device >= kDevices) return false;
    if (!capture_[device] &&
        cudaStreamCreateWithFlags(&capture_[device], cudaStreamNonBlocking) != cudaSuccess) {
      capture_[device] = nullptr;
      cudaGetLastError();
      return false;
    }
    const cudaStream_t cap = capture_[device];
    bool ok = cudaStreamBeginCapture(cap, cudaStreamCaptureModeRelaxed) == cudaSuccess;
    if (ok) {
      Chain chain(cap);
      ok = queue(chain) == cudaSuccess;
      ok = cudaStreamEndCapture(cap, &g.graph) == cudaSuccess && ok;
    }
    ok = ok && nodes_of(g) && cudaGraphInstantiate(&g.exec, g.graph, 0) == cudaSuccess;
    if (!ok) {
      drop(g);
      cudaGetLastError();  // the call launches directly instead; nothing sticky is left
    }
    return ok;
  }

  // Each node of the recorded graph with its kernel: a node per kernel, at most one memset.
  static bool nodes_of(CallGraph& g) {
    size_t n = 0;
    if (cudaGraphGetNodes(g.graph, nullptr, &n) != cudaSuccess || n > kMaxChainNodes) return false;
    if (cudaGraphGetNodes(g.graph, g.node, &n) != cudaSuccess) return false;
    int memsets = 0;
    for (g.n = 0; g.n < static_cast<int>(n); ++g.n) {
      const cudaGraphNode_t node = g.node[g.n];
      cudaGraphNodeType type;
      if (cudaGraphNodeGetType(node, &type) != cudaSuccess) return false;
      if (type == cudaGraphNodeTypeKernel) {
        cudaKernelNodeParams p = {};
        if (cudaGraphKernelNodeGetParams(node, &p) != cudaSuccess) return false;
        if (!p.func || g.index_of(p.func) >= 0) return false;
        g.func[g.n] = p.func;
      } else if (type != cudaGraphNodeTypeMemset || memsets++ ||
                 cudaGraphMemsetNodeGetParams(node, &g.memset) != cudaSuccess) {
        return false;
      }
    }
    return true;
  }

  static constexpr int kDevices = 64;
  Entry entry_[kEntries];
  int n_ = 0;
  cudaStream_t capture_[kDevices] = {};
};

// Runs a call's launches `queue(Chain&)` on `s` (not being captured: the caller launches a
// captured call's kernels itself) from this thread's graph for `key`, recorded at its first call;
// straight onto `s` where recording or setting the graph's parameters failed.
template <class Queue>
cudaError_t run_chain(const GraphKey& key, cudaStream_t s, Queue&& queue) {
  CallGraph* g = CallGraphs::mine().find_or_record(key, queue);
  if (g) {
    Chain chain(s, g);
    if (queue(chain) == cudaSuccess) return cudaGraphLaunch(g->exec, s);
    cudaGetLastError();
  }
  Chain chain(s);
  return queue(chain);
}

}  // namespace
