/* map_probe: which cuMemMap forms the driver accepts: a whole physical allocation, a
 * prefix of one (offset 0, smaller size), a part at a non-zero offset; and the same
 * allocation mapped at two addresses. Build: cc map_probe.c -lcuda (on the GPU machine). */
#include <cuda.h>
#include <stdio.h>

#define MiB ((size_t)1 << 20)
#define TRY(x) printf("%-60s %d\n", #x, (int)(x))

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
  prop.location.id = 0;
  CUmemGenericAllocationHandle h;
  TRY(cuMemCreate(&h, 8 * MiB, &prop, 0));
  CUdeviceptr va;
  TRY(cuMemAddressReserve(&va, 64 * MiB, 0, 0, 0));
  TRY(cuMemMap(va, 8 * MiB, 0, h, 0));                     /* whole */
  TRY(cuMemMap(va + 8 * MiB, 2 * MiB, 0, h, 0));           /* prefix, second mapping */
  TRY(cuMemMap(va + 16 * MiB, 2 * MiB, 2 * MiB, h, 0));    /* part at an offset */
  TRY(cuMemMap(va + 24 * MiB, 6 * MiB, 2 * MiB, h, 0));    /* suffix at an offset */
  TRY(cuMemMap(va + 32 * MiB, 8 * MiB, 0, h, 0));          /* whole, second mapping */
  CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  TRY(cuMemSetAccess(va, 8 * MiB, &d, 1));
  TRY(cuMemSetAccess(va + 32 * MiB, 8 * MiB, &d, 1));
  TRY(cuMemsetD32(va, 0x12345678u, 2 * MiB));
  unsigned v = 0;
  TRY(cuMemcpyDtoH(&v, va + 32 * MiB + 4, 4));
  printf("alias reads 0x%x (0x12345678 expected)\n", v);
  /* unmap part of a whole mapping */
  TRY(cuMemUnmap(va, 2 * MiB));
  TRY(cuMemUnmap(va, 8 * MiB));
  TRY(cuMemUnmap(va + 32 * MiB, 8 * MiB));
  TRY(cuMemRelease(h));
  TRY(cuMemAddressFree(va, 64 * MiB));
  return 0;
}
