"""How much memory a piece of training code allocates on its device, at its peak.

CUDA: the caching allocator's own counters (max_memory_allocated after a reset). CPU: the profiler's
allocation records, whose running total follows every allocation and free of the CPU allocator while
it records (counted from its value at the first record: the total carries on from earlier recordings,
whose tensors freed outside a recording were never subtracted), so CPU tests can plan against a cap of
a few MiB on a tiny model. Either way the figure is
the peak above what was allocated when measuring began; `device_bytes` counts what a model holds on
the device (what was there before).
"""
from __future__ import annotations

import contextlib
import time

import torch
from torch import nn


class PeakMeter:
    """`with meter.measuring(): ...` (or start() ... stop()), then meter.peak (bytes above the start) and
    meter.seconds. On a CPU, tensors that existed before start() and are freed while measuring are not
    subtracted (the profiler does not know their size): the figure errs high, never low."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak = 0
        self.seconds = 0.0
        self._start = 0
        self._began = 0.0
        self._profile = None

    @contextlib.contextmanager
    def measuring(self):
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            from torch.profiler import ProfilerActivity, profile

            self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._profile.start()
        self._began = time.perf_counter()

    def stop(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.seconds = time.perf_counter() - self._began
            self.peak = max(0, torch.cuda.max_memory_allocated(self.device) - self._start)
            return
        self.seconds = time.perf_counter() - self._began
        self._profile.stop()
        events = _allocations(self._profile)
        self._profile = None
        if events:  # the reporter's total runs on across recordings: count from where this one began
            _, first_total, first_size = events[0]
            self.peak = max(0, max(total for _, total, _ in events) - (first_total - first_size))
        else:
            self.peak = 0


def _allocations(prof) -> list[tuple[int, int, int]]:
    """(time, the allocator reporter's running total after it, bytes: negative for a free) of each CPU
    allocation or free the profile saw, in time order."""
    from torch._C._profiler import _EventType

    out, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            out.append((event.start_time_ns, event.extra_fields.total_allocated, event.extra_fields.alloc_size))
        stack.extend(event.children)
    return sorted(out)


def device_bytes(module: nn.Module, device: torch.device, exclude: tuple[torch.Tensor, ...] = ()) -> int:
    """Bytes of the module's parameters and buffers on `device`, each storage once, leaving out storages
    inside the `exclude` buffers (block swap's host copies, which on a CPU "device" share its type)."""
    ranges = [(t.data_ptr(), t.data_ptr() + t.untyped_storage().nbytes()) for t in exclude]
    seen, total = set(), 0
    for t in [*module.parameters(), *module.buffers()]:
        if t.device.type != device.type or t.numel() == 0:
            continue
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in seen or any(lo <= ptr < hi for lo, hi in ranges):
            continue
        seen.add(ptr)
        total += storage.nbytes()
    return total
