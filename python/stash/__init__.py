"""stash: a GPU memory caching allocator - the Python side.

    import stash
    stash.torch.install()           # PyTorch allocates through stash (before any CUDA tensor)
    stash.cupy.install()            # or CuPy
    stash.memory_allocated()        # torch.cuda's statistics, from stash's heaps
    stash.record_memory_history()   # and a snapshot that PyTorch's memory viewer opens
    stash.dump_snapshot("snap.pickle")

Standard library and ctypes only; PyTorch and CuPy are imported only by stash.torch and
stash.cupy. Every function takes device=None for the current device (PyTorch's or CuPy's
when they are in use, else stash's own, stash_set_device).
"""
import ctypes
import json
import pickle
import sys

from . import _lib
from ._lib import last_error

__all__ = ["memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
           "max_memory_reserved", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
           "memory_summary", "memory_account", "explain", "empty_cache", "mem_get_info", "record_memory_history", "snapshot",
           "dump_snapshot", "last_error", "library_path"]


def library_path():
    """The libstash this package uses."""
    return _lib.path()


def _current_device():
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            return cupy.cuda.Device().id
        except Exception:  # no GPU: fall through to stash's own notion
            pass
    return _lib.lib().stash_get_device()


def _device_index(device):
    """None, an int, "cuda:1" or a torch.device -> the device number."""
    if device is None:
        return _current_device()
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        _, _, n = device.partition(":")
        return int(n) if n else _current_device()
    if type(device).__name__ == "device":  # torch.device
        return device.index if device.index is not None else _current_device()
    return int(device)


def _heap(device):
    device = _device_index(device)
    h = ctypes.c_void_p()
    _lib.check(_lib.lib().stash_default_heap(int(device), ctypes.byref(h)), "device %s" % device)
    return h


_text = _lib.text


def memory_stats(device=None):
    """torch.cuda.memory_stats(): a dict of flattened keys ("allocated_bytes.all.current", ...),
    sorted, for the device's stash heap."""
    return json.loads(_text(_lib.lib().stash_heap_stats_json, _heap(device)))


def memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None):
    _lib.check(_lib.lib().stash_heap_reset_peak_stats(_heap(device)), "reset_peak_memory_stats")


def reset_accumulated_memory_stats(device=None):
    _lib.check(_lib.lib().stash_heap_reset_accumulated_stats(_heap(device)),
               "reset_accumulated_memory_stats")


def memory_summary(device=None, abbreviated=False):
    """torch.cuda.memory_summary(): the same table."""
    return _text(_lib.lib().stash_heap_summary, _heap(device), bool(abbreviated))


class _Account(ctypes.Structure):  # stash_account_t
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "segments", "reserved", "live", "rounding", "pending_free", "lent", "lent_live", "holes",
        "nholes", "largest_hole", "ends", "nends")]


def _accounts(heap):
    """(small pool, large pool) accounts from one view of the heap (stash_heap_accounts)."""
    small, large = _Account(), _Account()
    _lib.check(_lib.lib().stash_heap_accounts(heap, ctypes.byref(small), ctypes.byref(large)),
               "memory_account")
    return small, large


def memory_account(device=None):
    """Where the device's reserved bytes are now, per pool: {"small_pool": {...},
    "large_pool": {...}}, each with reserved = live + rounding + pending_free + lent + holes +
    ends (bytes), and segments, lent_live (what stitched blocks asked for of the lent bytes),
    nholes, largest_hole and nends (stash_heap_accounts: both pools from one view)."""
    small, large = _accounts(_heap(device))
    return {pool: {name: getattr(acc, name) for name, _ in _Account._fields_}
            for pool, acc in (("small_pool", small), ("large_pool", large))}


def explain(device=None):
    """memory_account() in words, one line per pool holding memory, in MiB: "large pool:
    9480.0 MiB reserved in 1 segment = 7857.4 live + 0.0 rounding + ... + 622.5 in 27 holes
    (the largest 48.0) + 0.0 free at 0 segment ends" - as stash-replay --explain says it at
    the peak."""
    lines = []
    for small, acc in zip((True, False), _accounts(_heap(device))):
        line = _text(_lib.lib().stash_account_text, ctypes.byref(acc), small)
        if line:
            lines.append(line)
    return "\n".join(lines)


def empty_cache():
    """torch.cuda.empty_cache(): every stash heap gives back the memory it holds unused."""
    _lib.lib().stash_torch_reset()


def mem_get_info(device=None):
    """torch.cuda.mem_get_info(): (free, total) bytes of the device, from the driver."""
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _lib.check(_lib.lib().stash_heap_mem_get_info(_heap(device), ctypes.byref(free),
                                                  ctypes.byref(total)), "mem_get_info")
    return free.value, total.value


def record_memory_history(enabled=True, max_entries=100000, device=None):
    """torch.cuda.memory._record_memory_history(): keep the last max_entries allocator events
    of the device (enabled=None or False: stop and forget them). No stack frames are
    recorded (frames are empty lists in snapshots)."""
    n = 0 if enabled in (None, False) else int(max_entries)
    _lib.check(_lib.lib().stash_heap_record_history(_heap(device), n), "record_memory_history")


# ---- snapshots --------------------------------------------------------------------------

_STATES = {0: "active_allocated", 1: "active_pending_free", 2: "inactive",
           4: "active_allocated"}  # 3 unmapped: left out; 4 lent to a stitched block
_CONF_DEFAULTS = {"max_split_size": -1, "garbage_collection_threshold": 0.0,
                  "expandable_segments": False}


def _segments(heap, device, pool_id=(0, 0)):
    out = []

    def visit(seg_p, blocks_p, arg):
        seg = seg_p.contents
        if seg.mapped_size == 0:  # a stitched range: its memory is shown where it is lent
            return 0
        blocks = []
        for i in range(seg.nblocks):
            b = blocks_p[i]
            state = _STATES.get(b.state)
            if state is None:
                continue
            blocks.append({"address": b.address, "size": b.size,
                           "requested_size": b.requested_size, "state": state, "frames": []})
        active = [b for b in blocks if b["state"] != "inactive"]
        out.append({"device": device, "address": seg.address,
                    "total_size": sum(b["size"] for b in blocks),
                    "allocated_size": sum(b["size"] for b in blocks
                                          if b["state"] == "active_allocated"),
                    "active_size": sum(b["size"] for b in active),
                    "requested_size": sum(b["requested_size"] for b in active),
                    "stream": seg.stream or 0,
                    "segment_type": "small" if seg.is_small else "large",
                    "segment_pool_id": pool_id, "is_expandable": bool(seg.is_expandable),
                    "frames": [], "blocks": blocks})
        return 0

    fn = _lib.VISIT_FN(visit)
    _lib.check(_lib.lib().stash_heap_visit(heap, fn, None), "snapshot")
    return out


def _traces(heap):
    l = _lib.lib()
    n = l.stash_heap_history(heap, None, 0)
    arr = (_lib.TraceEntry * max(n, 1))()
    n = l.stash_heap_history(heap, arr, n)
    out = []
    for e in arr[:n]:
        action = l.stash_trace_action_name(e.action).decode()
        entry = {"action": action, "size": e.size, "stream": e.stream or 0, "time_us": e.time_us,
                 "compile_context": "N/A", "user_metadata": "", "frames": []}
        entry["device_free" if action == "oom" else "addr"] = e.address
        out.append(entry)
    return out


def _settings(heap):
    l = _lib.lib()
    conf = ctypes.create_string_buffer(4096)  # larger than stash_conf_t
    l.stash_heap_conf(heap, conf)
    text = _text(l.stash_conf_format, conf)
    s = {"PYTORCH_CUDA_ALLOC_CONF": text, "pinned_num_register_threads": 1,
         "release_lock_on_cudamalloc": False, "pinned_use_cuda_host_register": False,
         "graph_capture_record_stream_reuse": False}
    s.update(_CONF_DEFAULTS)
    divisions = {str(1 << b): 0 for b in range(16)}
    for item in text.replace("[", "").replace("]", "").split(","):
        k, _, v = item.partition(":")
        if k == "max_split_size_mb":
            s["max_split_size"] = int(v) << 20
        elif k == "garbage_collection_threshold":
            s["garbage_collection_threshold"] = float(v)
        elif k == "expandable_segments":
            s["expandable_segments"] = v == "True"
        elif k == "roundup_power2_divisions" and v:
            pass  # the buckets follow as "1:4,2:4,..."
        elif k.isdigit() and k in divisions:
            divisions[k] = int(v)
    s["roundup_power2_divisions"] = divisions
    return s


def snapshot():
    """torch.cuda.memory._snapshot(): every device heap's segments with their blocks (and
    those of CUDA graphs' private pools, with the pool's id as segment_pool_id),
    device_traces (the recorded history, per device), allocator_settings. Blocks of
    policy:stash lent to a stitched range show as active_allocated in the arena that holds
    them; stitched ranges themselves are not listed (their memory would count twice)."""
    segments, settings = [], None
    l = _lib.lib()
    heaps = _lib.heaps(l.stash_default_heap_list)
    devices = [l.stash_heap_device(h) for h in heaps]
    traces = [[] for _ in range(max(devices) + 1 if devices else 0)]
    for h, device in zip(heaps, devices):
        segments += _segments(h, device)
        traces[device] = _traces(h)
        if settings is None:
            settings = _settings(h)
    for h in _lib.heaps(l.stash_torch_pool_list):  # CUDA graphs' private pools, with their ids
        a, b = ctypes.c_uint64(), ctypes.c_uint64()
        if l.stash_torch_pool_id(h, ctypes.byref(a), ctypes.byref(b)) == 0:
            segments += _segments(h, l.stash_heap_device(h), (a.value, b.value))
    segments.sort(key=lambda s: (s["device"], s["address"]))
    return {"segments": segments, "device_traces": traces,
            "allocator_settings": settings or {}, "external_annotations": []}


def dump_snapshot(path):
    """torch.cuda.memory._dump_snapshot(): pickle snapshot() to path."""
    with open(path, "wb") as f:
        pickle.dump(snapshot(), f)


from . import cupy, torch  # noqa: E402  (the submodules import nothing heavy at import time)
