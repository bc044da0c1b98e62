#!/usr/bin/env python3
"""The CUDA provider inside a program that uses the CUDA runtime (CuPy, PyTorch): stash's
memory lives in the same primary context, so the runtime's kernels read and write it.

  test_cuda_runtime.py LIBSTASH_SO        (exit 77 without a GPU, CuPy or PyTorch)
"""
import ctypes
import sys


def main():
    try:
        import cupy as cp
        import numpy as np
        import torch
    except ImportError as e:
        print("skipped: %s" % e)
        return 77
    lib = ctypes.CDLL(sys.argv[1])
    lib.stash_last_error.restype = ctypes.c_char_p
    lib.stash_cuda_provider.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.stash_heap_create.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                      ctypes.POINTER(ctypes.c_void_p)]
    lib.stash_heap_alloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                     ctypes.POINTER(ctypes.c_void_p)]
    lib.stash_heap_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.stash_heap_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.stash_heap_destroy.argtypes = [ctypes.c_void_p]
    provider = ctypes.c_void_p()
    if lib.stash_cuda_provider(ctypes.byref(provider)) != 0:
        print("skipped: %s" % lib.stash_last_error().decode())
        return 77
    if not torch.cuda.is_available():
        print("skipped: PyTorch sees no GPU")
        return 77

    # The runtime first: CuPy and PyTorch make the primary context current on this thread.
    warm = cp.arange(16, dtype=cp.float32)
    torch.zeros(1, device="cuda")
    heap = ctypes.c_void_p()
    for conf in (None,):
        assert lib.stash_heap_create(conf, provider, 0, ctypes.byref(heap)) == 0, lib.stash_last_error()
    failures = 0
    n = 1 << 24
    stream = cp.cuda.Stream(non_blocking=True)
    for rnd in range(3):
        ptr = ctypes.c_void_p()
        rc = lib.stash_heap_alloc(heap, n * 4, ctypes.c_void_p(stream.ptr), ctypes.byref(ptr))
        assert rc == 0, lib.stash_last_error()
        mem = cp.cuda.UnownedMemory(ptr.value, n * 4, None)
        with stream:
            a = cp.ndarray((n,), dtype=cp.float32, memptr=cp.cuda.MemoryPointer(mem, 0))
            a[:] = cp.arange(n, dtype=cp.float32) * (rnd + 1)        # a CuPy kernel writes
            t = torch.from_dlpack(a)                                  # PyTorch sees the same memory
            t.mul_(2)                                                 # and writes it
            stream.synchronize()
            got = cp.asnumpy(a)
        want = np.arange(n, dtype=np.float32) * (rnd + 1) * 2
        if not np.array_equal(got, want):
            print("round %d: contents differ" % rnd)
            failures += 1
        # a use on another stream, then free: the block waits for that stream
        other = cp.cuda.Stream(non_blocking=True)
        assert lib.stash_heap_record_stream(heap, ptr, ctypes.c_void_p(other.ptr)) == 0
        assert lib.stash_heap_free(heap, ptr) == 0, lib.stash_last_error()
        other.synchronize()
    assert lib.stash_heap_destroy(heap) == 0, lib.stash_last_error()
    print("ok: stash memory written by CuPy and PyTorch kernels in their context" if not failures else "FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
