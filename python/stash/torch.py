"""stash.torch.install(): PyTorch allocates CUDA memory through stash.

    import torch, stash
    stash.torch.install()                  # or install("policy:pytorch,expandable_segments:True")
    x = torch.empty(1 << 20, device="cuda")
    stash.memory_allocated()               # torch.cuda.memory_allocated() raises for plug-ins

It must run before PyTorch's first CUDA allocation (PyTorch cannot swap an allocator in
use). torch.cuda.empty_cache(), set_per_process_memory_fraction() and Tensor.record_stream()
reach stash through the allocator's hooks; so do CUDA graphs (torch.cuda.graph): what a
capture allocates comes from a private pool, a heap of its own that empty_cache leaves alone
and that is given back once the graphs using it are gone and its blocks freed
(graph_pools() lists them). memory_stats() and the other statistics are the default heap's.
"""
import json
import ctypes
import os

from . import _lib

_installed = None


class InstallError(RuntimeError):
    pass


def _address(name):
    return ctypes.cast(getattr(_lib.lib(), name), ctypes.c_void_p).value


def set_conf(conf):
    """Configure the heaps that do not exist yet (STASH_CONF's grammar)."""
    if conf is None:
        return
    if _lib.lib().stash_default_heap_list(None, 0) and os.environ.get("STASH_CONF") != conf:
        raise InstallError("stash: the heaps already exist with STASH_CONF=%r; conf=%r comes too "
                           "late" % (os.environ.get("STASH_CONF"), conf))
    os.environ["STASH_CONF"] = conf


def install(conf=None):
    """Make stash PyTorch's CUDA allocator (conf: a STASH_CONF string for the heaps, e.g.
    "policy:pytorch"). Raises InstallError when PyTorch has already allocated CUDA memory with
    its own allocator. Installing twice is a no-op."""
    global _installed
    import torch  # only here: the rest of the package works without PyTorch

    if _installed is not None:
        return _installed
    set_conf(conf)
    path = _lib.path()
    alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "stash_torch_malloc", "stash_torch_free")
    raw = alloc.allocator()
    raw.set_init_fn(_address("stash_torch_init"))
    raw.set_reset_fn(_address("stash_torch_reset"))
    raw.set_memory_fraction_fn(_address("stash_torch_set_memory_fraction"))
    raw.set_record_stream_fn(_address("stash_torch_record_stream"))
    raw.set_base_alloc_fn(_address("stash_torch_base_alloc"))
    if hasattr(raw, "set_begin_allocate_to_pool"):  # CUDA graphs' private pools (PyTorch 2.3+)
        raw.set_begin_allocate_to_pool(_address("stash_torch_begin_allocate_to_pool"))
        raw.set_end_allocate_to_pool_fn(_address("stash_torch_end_allocate_to_pool"))
        raw.set_release_pool(_address("stash_torch_release_pool"))
    try:
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        raise InstallError("stash.torch.install() must run before PyTorch's first CUDA allocation "
                           "(PyTorch says: %s)" % e) from None
    _installed = alloc
    return alloc


def graph_pools():
    """The CUDA graphs' private pools that exist now: one dict per pool, with its device and
    its heap's reserved_bytes, allocated_bytes and active blocks (current values)."""
    l = _lib.lib()
    out = []
    for h in _lib.heaps(l.stash_torch_pool_list):
        st = json.loads(_lib.text(l.stash_heap_stats_json, h))
        out.append({"device": l.stash_heap_device(h),
                    "reserved_bytes": st["reserved_bytes.all.current"],
                    "allocated_bytes": st["allocated_bytes.all.current"],
                    "active": st["active.all.current"]})
    return out
