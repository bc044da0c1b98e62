/* va_probe: how does the CUDA driver place cuMemAlloc allocations in the address space?
 * Reads operations from stdin - "a SIZE" (allocate) or "f N" (free the N-th allocation)
 * - and prints "a N SIZE ADDRESS" / "f N" for each. Build on the device:
 *   gcc -O2 va_probe.c -I$C/include -L$C/lib64/stubs -lcuda -o va_probe */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
      cuCtxSetCurrent(ctx)) {
    fprintf(stderr, "no device\n");
    return 1;
  }
  static CUdeviceptr ptrs[1 << 16];
  static size_t sizes[1 << 16];
  int n = 0;
  char op;
  unsigned long long v;
  while (scanf(" %c %llu", &op, &v) == 2) {
    if (op == 'a' && n < (1 << 16)) {
      CUresult r = cuMemAlloc(&ptrs[n], (size_t)v);
      sizes[n] = (size_t)v;
      printf("a %d %llu 0x%llx %d\n", n, v, (unsigned long long)ptrs[n], (int)r);
      n++;
    } else if (op == 'f' && v < (unsigned long long)n && ptrs[v]) {
      cuMemFree(ptrs[v]);
      ptrs[v] = 0;
      printf("f %llu\n", v);
    }
  }
  return 0;
}
