/* access_probe: the cost of cuMemSetAccess and cuMemUnmap over a range made of k separately
 * mapped physical allocations of m MiB each (one call for the range, and one call per
 * allocation), median of 15 repetitions, on GPU 0. Build: cc access_probe.c -lcuda. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "probe_time.h"

#define MiB ((size_t)1 << 20)

int main(void) {
  CUdevice dev;
  CUcontext ctx;
  cuInit(0);
  cuDeviceGet(&dev, 0);
  cuDevicePrimaryCtxRetain(&ctx, dev);
  cuCtxSetCurrent(ctx);
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  size_t ms[] = {2, 20, 64, 256};
  int ks[] = {1, 2, 4, 8, 16, 32};
  printf("%8s %4s %12s %14s %12s %12s %12s\n", "MiB", "k", "access_1call", "access_k_calls", "unmap_1call",
         "map_each", "create_each");
  for (int a = 0; a < 4; a++) {
    for (int b = 0; b < 6; b++) {
      size_t m = ms[a] * MiB;
      int k = ks[b];
      if (m * k > 8192 * MiB) continue;
      double t1[15], tk[15], tu[15], tm[15], tc[15];
      CUdeviceptr va;
      CUmemGenericAllocationHandle h[32];
      cuMemAddressReserve(&va, m * k, 0, 0, 0);
      for (int r = 0; r < 15; r++) {
        double t0 = now_us();
        for (int i = 0; i < k; i++) cuMemCreate(&h[i], m, &prop, 0);
        tc[r] = (now_us() - t0) / k;
        t0 = now_us();
        for (int i = 0; i < k; i++) cuMemMap(va + i * m, m, 0, h[i], 0);
        tm[r] = (now_us() - t0) / k;
        t0 = now_us();
        if (cuMemSetAccess(va, m * k, &d, 1) != CUDA_SUCCESS) printf("access failed\n");
        t1[r] = now_us() - t0;
        t0 = now_us();
        cuMemUnmap(va, m * k);
        tu[r] = now_us() - t0;
        for (int i = 0; i < k; i++) cuMemMap(va + i * m, m, 0, h[i], 0);
        t0 = now_us();
        for (int i = 0; i < k; i++) cuMemSetAccess(va + i * m, m, &d, 1);
        tk[r] = now_us() - t0;
        cuMemUnmap(va, m * k);
        for (int i = 0; i < k; i++) cuMemRelease(h[i]);
      }
      cuMemAddressFree(va, m * k);
      printf("%8zu %4d %12.1f %14.1f %12.1f %12.2f %12.2f\n", ms[a], k, median(t1, 15),
             median(tk, 15), median(tu, 15), median(tm, 15), median(tc, 15));
    }
  }
  return 0;
}
