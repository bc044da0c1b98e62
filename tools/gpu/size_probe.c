/* size_probe: how the cost of one driver call grows with its size, on GPU 0, for the calls
 * whose cost the simulated device models by size (src/provider_sim.c): cuMemAlloc and
 * cuMemFree (PyTorch's default), cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap and
 * cuMemRelease of one physical allocation (policy:stash, expandable segments). Sizes 2 MiB
 * to 16 GiB; median of 15 repetitions of each. "alloc_fresh" times the first allocation of
 * each of 4 buffers kept live together (as PyTorch's segments are), "alloc" and "free" an
 * allocation freed at once. Build: cc -O2 size_probe.c -lcuda. Output: tools/gpu/probe_size.txt. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "probe_time.h"

#define MiB ((size_t)1 << 20)
#define REPS 15

#define CHECK(call)                                                    \
  do {                                                                 \
    CUresult r_ = (call);                                              \
    if (r_ != CUDA_SUCCESS) {                                          \
      fprintf(stderr, "%s failed: %d (line %d)\n", #call, r_, __LINE__); \
      exit(1);                                                         \
    }                                                                  \
  } while (0)

int main(void) {
  CUdevice dev;
  CUcontext ctx;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  size_t sizes[] = {2, 20, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
  printf("%8s %12s %8s %8s %8s %8s %10s %8s %8s\n", "MiB", "alloc_fresh", "alloc", "free",
         "create", "map", "set_access", "unmap", "release");
  for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
    size_t m = sizes[si] * MiB;
    double fresh[REPS * 4], al[REPS], fr[REPS], cr[REPS], mp[REPS], sa[REPS], um[REPS], rl[REPS];
    int nf = 0;
    for (int r = 0; r < REPS; r++) {
      CUdeviceptr p[4];
      int live = sizes[si] <= 16384 / 4 ? 4 : 1;
      for (int i = 0; i < live; i++) {
        double t0 = now_us();
        CHECK(cuMemAlloc(&p[i], m));
        fresh[nf++] = now_us() - t0;
      }
      for (int i = 0; i < live; i++) CHECK(cuMemFree(p[i]));
      double t0 = now_us();
      CHECK(cuMemAlloc(&p[0], m));
      al[r] = now_us() - t0;
      t0 = now_us();
      CHECK(cuMemFree(p[0]));
      fr[r] = now_us() - t0;

      CUdeviceptr va;
      CUmemGenericAllocationHandle h;
      CHECK(cuMemAddressReserve(&va, m, 0, 0, 0));
      t0 = now_us();
      CHECK(cuMemCreate(&h, m, &prop, 0));
      cr[r] = now_us() - t0;
      t0 = now_us();
      CHECK(cuMemMap(va, m, 0, h, 0));
      mp[r] = now_us() - t0;
      t0 = now_us();
      CHECK(cuMemSetAccess(va, m, &d, 1));
      sa[r] = now_us() - t0;
      t0 = now_us();
      CHECK(cuMemUnmap(va, m));
      um[r] = now_us() - t0;
      t0 = now_us();
      CHECK(cuMemRelease(h));
      rl[r] = now_us() - t0;
      CHECK(cuMemAddressFree(va, m));
    }
    printf("%8zu %12.1f %8.1f %8.1f %8.1f %8.2f %10.1f %8.1f %8.1f\n", sizes[si],
           median(fresh, nf), median(al, REPS), median(fr, REPS), median(cr, REPS),
           median(mp, REPS), median(sa, REPS), median(um, REPS), median(rl, REPS));
    fflush(stdout);
  }
  return 0;
}
