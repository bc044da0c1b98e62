/* provider_cuda_none.c: the CUDA provider of a build made without the CUDA toolkit. */
#include "internal.h"

stash_status_t stash_cuda_provider(const stash_provider_t** out) {
  if (out) *out = NULL;
  return _stash_error(STASH_ERR_UNSUPPORTED,
                      "cuda: this stash was built without the CUDA toolkit (cuda.h): rebuild "
                      "with it installed to use GPUs");
}

stash_status_t stash_cuda_stream_create(int device, void** stream) {
  (void)device;
  if (stream) *stream = NULL;
  const stash_provider_t* p;
  return stash_cuda_provider(&p);
}

stash_status_t stash_cuda_stream_destroy(void* stream) {
  (void)stream;
  const stash_provider_t* p;
  return stash_cuda_provider(&p);
}

void* _stash_cuda_symbol(const char* name) {
  (void)name;
  return NULL;
}

int _stash_cuda_context_current(int device) {
  (void)device;
  return -1;
}
