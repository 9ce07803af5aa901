// What launching a compress call's three-kernel chain costs the host, by launch strategy (the
// measurement behind csrc/launch.cuh's cached call graphs; BENCHMARKS.md §3f). Standalone:
//
//     nvcc -O2 -arch=sm_90 benchmarks/investigations/launch_cost.cu -o /tmp/launch_cost && /tmp/launch_cost
//
// Three trivial kernels with a by-value argument the size of the codec's Layout, chained by
// programmatic dependent launches as codec.cu chains its kernels, launched (a) one by one with
// cudaLaunchKernelEx, (b) as two or one such launches, (c) from a graph captured from (a), its
// three nodes' parameters set per call (what launch.cuh does), (d) from that graph as is. Each
// figure: the median host time of 3000 calls, with the device idle before each and back to back.
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <vector>
#include <algorithm>
struct Big { long long v[36]; };  // ~ Layout by value
__global__ void k1(const int* in, int* out, Big b) {
  asm volatile("griddepcontrol.launch_dependents;");
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = in[0] + (int)b.v[3];
}
__global__ void k2(const int* in, int* out, Big b) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  if (threadIdx.x == 0 && blockIdx.x == 0) out[1] = out[0] + 1;
}
__global__ void k3(const int* in, int* out, Big b) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (threadIdx.x == 0 && blockIdx.x == 0) out[2] = out[1] + 1;
}
template <typename K>
cudaError_t pdl(K k, unsigned grid, cudaStream_t s, const int* in, int* out, Big b, bool dep) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid); cfg.blockDim = dim3(256); cfg.stream = s;
  cudaLaunchAttribute a[1];
  a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = a; cfg.numAttrs = dep ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, k, in, out, b);
}
using clk = std::chrono::steady_clock;
template <class F> double med(F f, cudaStream_t s, int n, bool idle) {
  std::vector<double> t;
  for (int i = 0; i < n; ++i) {
    if (idle || i % 50 == 0) cudaStreamSynchronize(s);
    auto t0 = clk::now(); f(); auto t1 = clk::now();
    t.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(t.begin(), t.end()); return t[t.size() / 2];
}
int main() {
  cudaSetDevice(0); cudaFree(0);
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  int *in, *out; cudaMalloc(&in, 64); cudaMalloc(&out, 64); cudaMemset(in, 0, 64);
  Big b{}; const int N = 3000;
  auto three = [&] { pdl(k1, 32, s, in, out, b, false); pdl(k2, 528, s, in, out, b, true); pdl(k3, 133, s, in, out, b, true); };
  auto two = [&] { pdl(k1, 32, s, in, out, b, false); pdl(k3, 133, s, in, out, b, true); };
  auto one = [&] { pdl(k1, 32, s, in, out, b, false); };
  auto chev = [&] { k1<<<32, 256, 0, s>>>(in, out, b); };
  // graph of the chain, captured from the PDL launches
  cudaGraph_t g; cudaGraphExec_t ge;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal); three(); cudaStreamEndCapture(s, &g);
  cudaError_t e = cudaGraphInstantiate(&ge, g, 0);
  printf("instantiate %s\n", cudaGetErrorString(e));
  size_t nn = 0; cudaGraphGetNodes(g, nullptr, &nn); std::vector<cudaGraphNode_t> nodes(nn); cudaGraphGetNodes(g, nodes.data(), &nn);
  printf("nodes %zu\n", nn);
  std::vector<cudaKernelNodeParams> kp(nn);
  for (size_t i = 0; i < nn; ++i) cudaGraphKernelNodeGetParams(nodes[i], &kp[i]);
  int* out2; cudaMalloc(&out2, 64);
  int flip = 0;
  auto graph_update = [&] {
    int* o = (flip ^= 1) ? out2 : out;
    for (size_t i = 0; i < nn; ++i) {
      void* args[3] = {&in, &o, &b};
      cudaKernelNodeParams p = kp[i]; p.kernelParams = args;
      cudaGraphExecKernelNodeSetParams(ge, nodes[i], &p);
    }
    cudaGraphLaunch(ge, s);
  };
  auto graph_plain = [&] { cudaGraphLaunch(ge, s); };
  for (int w = 0; w < 200; ++w) { three(); graph_update(); }
  cudaStreamSynchronize(s);
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
  for (int idle = 1; idle >= 0; --idle) {
    printf("%s\n", idle ? "idle device (sync before each)" : "back to back");
    printf("  3 PDL launches        %.2f us\n", med(three, s, N, idle));
    printf("  2 PDL launches        %.2f us\n", med(two, s, N, idle));
    printf("  1 launchEx            %.2f us\n", med(one, s, N, idle));
    printf("  1 <<<>>>              %.2f us\n", med(chev, s, N, idle));
    printf("  graph +3 setparams    %.2f us\n", med(graph_update, s, N, idle));
    printf("  graph launch only     %.2f us\n", med(graph_plain, s, N, idle));
  }
  cudaStreamSynchronize(s);
  int h[3]; cudaMemcpy(h, out, 12, cudaMemcpyDeviceToHost);
  printf("check %d %d %d err %s\n", h[0], h[1], h[2], cudaGetErrorString(cudaGetLastError()));
  return h[0] == 0 && h[1] == 1 && h[2] == 2 ? 0 : 1;  // the chain ran in order
}
