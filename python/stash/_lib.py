"""Loading libstash and declaring its C functions (ctypes, standard library only).

The library is looked for, in order: where STASH_LIBRARY points; next to this package
(python/stash/libstash.so); in the repository's build tree (build/libstash.so).
"""
import ctypes
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_lib = None
_path = None


def _candidates():
    env = os.environ.get("STASH_LIBRARY")
    if env:
        yield env
        return
    yield os.path.join(_HERE, "libstash.so")
    yield os.path.join(os.path.dirname(os.path.dirname(_HERE)), "build", "libstash.so")


class SegmentInfo(ctypes.Structure):
    _fields_ = [("address", ctypes.c_size_t), ("total_size", ctypes.c_size_t),
                ("mapped_size", ctypes.c_size_t), ("is_small", ctypes.c_bool),
                ("is_expandable", ctypes.c_bool), ("stream", ctypes.c_void_p),
                ("nblocks", ctypes.c_size_t)]


class BlockInfo(ctypes.Structure):
    _fields_ = [("address", ctypes.c_size_t), ("size", ctypes.c_size_t),
                ("requested_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("stream", ctypes.c_void_p)]


class TraceEntry(ctypes.Structure):
    _fields_ = [("action", ctypes.c_int), ("address", ctypes.c_size_t),
                ("size", ctypes.c_size_t), ("stream", ctypes.c_void_p),
                ("time_us", ctypes.c_int64)]


VISIT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(SegmentInfo), ctypes.POINTER(BlockInfo),
                            ctypes.c_void_p)

_SIGNATURES = {
    # name: (restype, argtypes)
    "stash_last_error": (ctypes.c_char_p, []),
    "stash_status_name": (ctypes.c_char_p, [ctypes.c_int]),
    "stash_default_heap": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]),
    "stash_get_device": (ctypes.c_int, []),
    "stash_default_heap_list": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]),
    "stash_heap_device": (ctypes.c_int, [ctypes.c_void_p]),
    "stash_heap_stats_json": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]),
    "stash_heap_summary": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_bool, ctypes.c_char_p,
                                             ctypes.c_size_t]),
    "stash_heap_reset_peak_stats": (ctypes.c_int, [ctypes.c_void_p]),
    "stash_heap_reset_accumulated_stats": (ctypes.c_int, [ctypes.c_void_p]),
    "stash_heap_empty_cache": (ctypes.c_int, [ctypes.c_void_p]),
    "stash_heap_mem_get_info": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                               ctypes.POINTER(ctypes.c_size_t)]),
    "stash_heap_visit": (ctypes.c_int, [ctypes.c_void_p, VISIT_FN, ctypes.c_void_p]),
    "stash_heap_record_history": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t]),
    "stash_heap_history": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.POINTER(TraceEntry),
                                             ctypes.c_size_t]),
    "stash_trace_action_name": (ctypes.c_char_p, [ctypes.c_int]),
    "stash_heap_conf": (None, [ctypes.c_void_p, ctypes.c_void_p]),
    "stash_conf_format": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]),
    "stash_torch_malloc": (ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]),
    "stash_torch_free": (None, [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]),
    "stash_torch_init": (None, [ctypes.c_int]),
    "stash_torch_reset": (None, []),
    "stash_torch_set_memory_fraction": (None, [ctypes.c_double, ctypes.c_int]),
    "stash_torch_record_stream": (None, [ctypes.c_void_p, ctypes.c_void_p]),
    "stash_torch_base_alloc": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]),
    "stash_torch_begin_allocate_to_pool": (None, [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64,
                                                   ctypes.c_void_p]),
    "stash_torch_end_allocate_to_pool": (None, [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]),
    "stash_torch_release_pool": (None, [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]),
    "stash_torch_pool_list": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]),
    "stash_torch_pool_id": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64),
                                           ctypes.POINTER(ctypes.c_uint64)]),
    "stash_heap_account": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p]),
    "stash_heap_accounts": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]),
    "stash_account_text": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_bool, ctypes.c_char_p,
                                             ctypes.c_size_t]),
    "stash_cupy_malloc": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]),
    "stash_cupy_free": (None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]),
}


def lib():
    """The loaded libstash (a ctypes.CDLL), loading it on first use."""
    global _lib, _path
    if _lib is not None:
        return _lib
    tried = []
    for path in _candidates():
        if os.path.exists(path):
            l = ctypes.CDLL(path)
            for name, (res, args) in _SIGNATURES.items():
                f = getattr(l, name)
                f.restype = res
                f.argtypes = args
            _lib, _path = l, path
            return l
        tried.append(path)
    raise OSError("stash: libstash.so not found (tried %s); build it (cmake --build build) or "
                  "set STASH_LIBRARY" % ", ".join(tried))


def path():
    """Where libstash was loaded from."""
    lib()
    return _path


def last_error():
    return lib().stash_last_error().decode("utf-8", "replace")


def text(fn, *args):
    """The string a C function that writes into (buf, n) and returns the length gives."""
    n = fn(*args, None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    fn(*args, buf, n + 1)
    return buf.value.decode()


def heaps(list_fn):
    """The heaps a stash_*_list(out, max) function names now, as c_void_p values."""
    n = list_fn(None, 0)
    buf = (ctypes.c_void_p * max(n, 1))()
    n = min(n, list_fn(buf, n))
    return [ctypes.c_void_p(buf[i]) for i in range(n)]


def check(status, what):
    if status != 0:
        name = lib().stash_status_name(status).decode()
        raise RuntimeError("stash: %s: %s: %s" % (what, name, last_error()))
