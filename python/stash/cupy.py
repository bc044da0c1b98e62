"""stash.cupy.install(): CuPy allocates device memory through stash.

    import cupy, stash
    stash.cupy.install()
    a = cupy.arange(1 << 20)

Allocations are made on the device's default stream (CuPy's allocator interface does not
pass its current stream).
"""
import ctypes

from . import _lib
from .torch import set_conf

_installed = None


def install(conf=None):
    """Make stash CuPy's allocator (for the calling thread's later allocations, as
    cupy.cuda.set_allocator). conf: a STASH_CONF string for heaps not made yet."""
    global _installed
    import cupy  # only here

    set_conf(conf)
    l = _lib.lib()
    malloc = ctypes.cast(l.stash_cupy_malloc, ctypes.c_void_p).value
    free = ctypes.cast(l.stash_cupy_free, ctypes.c_void_p).value
    _installed = cupy.cuda.memory.CFunctionAllocator(0, malloc, free, l)
    cupy.cuda.set_allocator(_installed.malloc)
    return _installed
