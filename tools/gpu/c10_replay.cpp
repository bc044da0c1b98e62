// c10_replay: replay an RMM CSV log through PyTorch's own caching allocator (c10) on a real
// GPU, one pass, in a fresh process, and write the log back out with the pointers PyTorch
// returned - the addresses the driver gave this very run - plus PyTorch's figures as JSON.
// Used on the device machine to check stash-replay's policy:pytorch against the real thing.
//
//   PYTORCH_CUDA_ALLOC_CONF=... c10_replay IN.csv OUT.csv   (prints one JSON line)
//   c10_replay IN.csv -      no log: times a cold pass and a warm second pass (ns/event)
//   c10_replay --pairs       the same size allocated and freed 10^6 times, median of 7
//
// Build (on the device): see tools/gpu/run_c10_replays.sh
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#define CK(x)                                                                   \
  do {                                                                          \
    cudaError_t e_ = (x);                                                       \
    if (e_ != cudaSuccess) {                                                    \
      fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

struct Op {
  bool alloc;
  size_t id, size;
  int stream;
  std::string line_head;  // "Thread,Time" of the row
};

static int pairs() {
  CK(cudaSetDevice(0));
  CK(cudaFree(0));
  c10::cuda::CUDACachingAllocator::init(1);
  const size_t sizes[] = {4096, 65536, 1 << 20, 4 << 20, 64 << 20};
  for (size_t size : sizes) {
    std::vector<double> v;
    for (int r = 0; r < 7; r++) {
      const int n = 1000000;
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < n; i++) {
        void* p = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(size, nullptr);
        c10::cuda::CUDACachingAllocator::raw_delete(p);
      }
      v.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n);
    }
    std::sort(v.begin(), v.end());
    printf("{\"pairs_size\": %zu, \"ns_per_pair\": %.1f}\n", size, v[3]);
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 2 && !strcmp(argv[1], "--pairs")) return pairs();
  if (argc < 3) {
    fprintf(stderr, "usage: %s IN.csv OUT.csv\n", argv[0]);
    return 2;
  }
  FILE* f = fopen(argv[1], "r");
  if (!f) { perror(argv[1]); return 2; }
  char line[1024];
  if (!fgets(line, sizeof line, f)) return 2;
  std::vector<Op> ops;
  std::vector<size_t> sizes;
  std::unordered_map<unsigned long long, size_t> live;
  std::unordered_map<unsigned long long, int> stream_ix;
  std::vector<unsigned long long> stream_val;
  while (fgets(line, sizeof line, f)) {
    char* fld[6];
    int n = 0;
    char* save = nullptr;
    for (char* p = strtok_r(line, ",\n", &save); p && n < 6; p = strtok_r(nullptr, ",\n", &save)) fld[n++] = p;
    if (n < 6) continue;
    unsigned long long ptr = strtoull(fld[3], nullptr, 16), size = strtoull(fld[4], nullptr, 10);
    unsigned long long sv = strtoull(fld[5], nullptr, 16);
    auto it = stream_ix.find(sv);
    int si;
    if (it == stream_ix.end()) {
      si = (int)stream_val.size();
      stream_ix[sv] = si;
      stream_val.push_back(sv);
    } else {
      si = it->second;
    }
    std::string head = std::string(fld[0]) + "," + fld[1];
    if (!strcmp(fld[2], "allocate")) {
      live[ptr] = sizes.size();
      ops.push_back({true, sizes.size(), size, si, head});
      sizes.push_back(size);
    } else if (!strcmp(fld[2], "free")) {
      auto l = live.find(ptr);
      if (l == live.end()) continue;
      ops.push_back({false, l->second, sizes[l->second], si, head});
      live.erase(l);
    }
  }
  fclose(f);
  CK(cudaSetDevice(0));
  CK(cudaFree(0));
  std::vector<cudaStream_t> streams(stream_val.size(), nullptr);
  for (size_t i = 0; i < streams.size(); i++)
    if (stream_val[i] != 0) CK(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking));
  c10::cuda::CUDACachingAllocator::init(1);
  std::vector<void*> ptrs(sizes.size(), nullptr);
  std::vector<int> alloc_stream(sizes.size(), 0);
  // With OUT.csv "-", nothing is written and the loop is timed (ns per event).
  bool log = strcmp(argv[2], "-") != 0;
  FILE* out = log ? fopen(argv[2], "w") : nullptr;
  if (log && !out) { perror(argv[2]); return 2; }
  if (log) fprintf(out, "Thread,Time,Action,Pointer,Size,Stream\n");
  auto t0 = std::chrono::steady_clock::now();
  for (const Op& o : ops) {
    if (o.alloc) {
      void* p = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(o.size, streams[o.stream]);
      ptrs[o.id] = p;
      alloc_stream[o.id] = o.stream;
      if (log) fprintf(out, "%s,allocate,%p,%zu,0x%llx\n", o.line_head.c_str(), p, o.size, stream_val[o.stream]);
    } else {
      if (log)
        fprintf(out, "%s,free,%p,%zu,0x%llx\n", o.line_head.c_str(), ptrs[o.id], o.size,
                stream_val[alloc_stream[o.id]]);
      c10::cuda::CUDACachingAllocator::raw_delete(ptrs[o.id]);
      ptrs[o.id] = nullptr;
    }
  }
  double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
              (double)ops.size();
  double warm = 0;
  if (!log) { /* free what the trace left live, then a second pass over the warm cache */
    for (size_t i = 0; i < ptrs.size(); i++)
      if (ptrs[i]) { c10::cuda::CUDACachingAllocator::raw_delete(ptrs[i]); ptrs[i] = nullptr; }
    auto t1 = std::chrono::steady_clock::now();
    for (const Op& o : ops) {
      if (o.alloc) {
        ptrs[o.id] = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(o.size, streams[o.stream]);
        alloc_stream[o.id] = o.stream;
      } else {
        c10::cuda::CUDACachingAllocator::raw_delete(ptrs[o.id]);
        ptrs[o.id] = nullptr;
      }
    }
    warm = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t1).count() /
           (double)ops.size();
  }
  if (log) fclose(out);
  CK(cudaDeviceSynchronize());
  auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  const char* conf = getenv("PYTORCH_CUDA_ALLOC_CONF");
  printf("{\"trace\": \"%s\", \"conf\": \"%s\", \"peak_reserved_bytes\": %lld, "
         "\"peak_allocated_bytes\": %lld, \"device_allocs\": %lld, \"device_frees\": %lld, "
         "\"ns_per_event\": %.1f, \"warm_ns_per_event\": %.1f}\n",
         argv[1], conf ? conf : "", (long long)st.reserved_bytes[0].peak,
         (long long)st.allocated_bytes[0].peak, (long long)st.num_device_alloc,
         (long long)st.num_device_free, ns, warm);
  return 0;
}
