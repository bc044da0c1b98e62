/* wait_probe: the host time of cuStreamWaitEvent (policy:stash's stream_wait: a stream made to
 * wait on the device for another stream's event), against cuEventRecord and cuEventQuery,
 * medians of 2001 calls each on GPU 0: with the event complete, and with it pending behind
 * work queued on the other stream (a 1 GiB memset per 64 calls). Build: cc wait_probe.c -lcuda
 * (tools/gpu/run_stash_gpu.sh builds and runs it). */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

#include "probe_time.h"

#define N 2001
#define MiB ((size_t)1 << 20)

static double v[N];

int main(void) {
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS) return 1;
  cuDevicePrimaryCtxRetain(&ctx, dev);
  cuCtxSetCurrent(ctx);
  CUstream a, b;
  cuStreamCreate(&a, CU_STREAM_NON_BLOCKING);
  cuStreamCreate(&b, CU_STREAM_NON_BLOCKING);
  CUevent e;
  cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
  CUdeviceptr buf;
  size_t bytes = 1024 * MiB;
  if (cuMemAlloc(&buf, bytes) != CUDA_SUCCESS) return 1;
  for (int pending = 0; pending < 2; pending++) {
    double rec[N], wait[N], query[N];
    for (int i = 0; i < N; i++) {
      if (pending && i % 64 == 0) cuMemsetD32Async(buf, (unsigned)i, bytes / 4, a);
      double t0 = now_us();
      cuEventRecord(e, a);
      double t1 = now_us();
      CUresult q = cuEventQuery(e);
      double t2 = now_us();
      CUresult r = cuStreamWaitEvent(b, e, 0);
      double t3 = now_us();
      if (r != CUDA_SUCCESS || (q != CUDA_SUCCESS && q != CUDA_ERROR_NOT_READY)) {
        fprintf(stderr, "wait_probe: error %d / %d\n", (int)r, (int)q);
        return 1;
      }
      rec[i] = t1 - t0;
      query[i] = t2 - t1;
      wait[i] = t3 - t2;
      if (!pending) cuStreamSynchronize(a), cuStreamSynchronize(b);
    }
    cuCtxSynchronize();
    for (int i = 0; i < N; i++) v[i] = rec[i];
    double mr = median(v, N);
    for (int i = 0; i < N; i++) v[i] = query[i];
    double mq = median(v, N);
    for (int i = 0; i < N; i++) v[i] = wait[i];
    double mw = median(v, N);
    printf("%s: cuEventRecord %.2f us, cuEventQuery %.2f us, cuStreamWaitEvent %.2f us "
           "(medians of %d)\n",
           pending ? "event pending behind work" : "event complete", mr, mq, mw, N);
  }
  cuMemFree(buf);
  cuEventDestroy(e);
  cuStreamDestroy(a);
  cuStreamDestroy(b);
  return 0;
}
