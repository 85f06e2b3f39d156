"""Block swap: the frozen weights of the last N blocks live in pinned CPU RAM and visit the GPU per use.

Each swapped block's frozen parameters and buffers are packed into one flat pinned host buffer
(the "offload side", authoritative: frozen weights never need copying back). To use a block, one
device buffer of the same size is allocated on a side CUDA stream and filled with a single
non_blocking copy; the block's tensors become views into it. Releasing a block points them back at
the host buffer and drops the device buffer. LoRA weights (anything that requires grad) stay on
the GPU all along.

Schedule (positions are indices in engine.memory.blocks.blocks(), ComfyUI's call order):
- forward pre-hook of any block: make the block resident (waiting for its prefetch, or loading it
  now), and start loading the next `prefetch` swapped blocks;
- forward post-hook of a swapped block: release it, unless it is among the last `prefetch` swapped
  blocks and backward will need it (backward starts with those);
- backward pre-hook (a grad hook on the block's outputs): release swapped blocks after this one
  (their backward is finished), make this one resident, prefetch the `prefetch` before it;
- end of backward: release all, and prefetch the first ones for the next forward.

What autograd holds: without activation checkpointing, linear layers save views of their weights
(weight.t()) for backward, which would keep every block's device buffer alive and memory would not
fall. The swapped block's forward therefore runs under saved_tensors_hooks that replace any saved
view of its device buffer by a token, and backward rebuilds the view from the block's buffer of that
moment (loading it first if the schedule has not). Cast copies of weights (fp8 bases compute from
bf16/fp32 copies) are ordinary tensors to autograd and are held until backward: use checkpointing
with fp8. With checkpointing, the recompute in backward runs the block's forward again through the
guard below (inside the checkpoint wrapper), so the weights are resident for it.
"""
from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from ..config.checks import ConfigError

_ALIGN = 256  # bytes; every tensor's view into the flat buffers starts on this boundary


class _Slot:
    """One swapped block: where its frozen tensors are, and whether they are on the device now."""

    def __init__(self, position: int, block: nn.Module, device: torch.device, pin: bool):
        self.position = position
        self.device = device
        self.entries = []  # (owner module, name, is_param, dtype, shape, byte offset, bytes)
        seen: dict[int, int] = {}
        offset = 0
        sources = []
        for module in block.modules():
            for table, is_param in ((module._parameters, True), (module._buffers, False)):
                for name, t in table.items():
                    if t is None or t.requires_grad:  # LoRA weights stay on the compute device
                        continue
                    if id(t) in seen:
                        start = self.entries[seen[id(t)]][5]
                    else:
                        seen[id(t)] = len(self.entries)
                        start = offset
                        offset += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
                        sources.append((start, t))
                    self.entries.append((module, name, is_param, t.dtype, tuple(t.shape), start,
                                         t.numel() * t.element_size()))
        self.nbytes = max(offset, _ALIGN)
        self.host = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=pin)
        for start, t in sources:
            self._view(self.host, start, t.dtype, tuple(t.shape)).copy_(t.detach())
        self.dev: torch.Tensor | None = None
        self.ready = None  # CUDA event: the device copy is complete
        self.state = "offloaded"  # offloaded | loading | resident
        self._bind(self.host)

    @staticmethod
    def _view(buffer: torch.Tensor, start: int, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
        count = 1
        for s in shape:
            count *= s
        size = torch.empty((), dtype=dtype).element_size()
        return buffer[start:start + count * size].view(dtype).view(shape)

    def _bind(self, buffer: torch.Tensor) -> None:
        for module, name, is_param, dtype, shape, start, _ in self.entries:
            view = self._view(buffer, start, dtype, shape)
            if is_param:
                module._parameters[name].data = view
            else:
                module._buffers[name] = view

    def load(self, stream) -> None:
        if stream is None:  # a CPU "device": a distinct copy, so use and release are observable
            self.dev = self.host.clone()
        else:
            with torch.cuda.stream(stream):
                self.dev = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
                self.dev.copy_(self.host, non_blocking=True)
                self.ready = stream.record_event()
        self.state = "loading"

    def activate(self) -> None:
        if self.ready is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(self.ready)
            self.dev.record_stream(current)  # allocated on the side stream, used on this one
            self.ready = None
        self._bind(self.dev)
        self.state = "resident"

    def release(self) -> None:
        self._bind(self.host)
        self.dev, self.ready = None, None
        self.state = "offloaded"

    def hide(self) -> None:
        """Point the tensors at empty ones (so a framework's model.to(device) moves nothing)."""
        for module, name, is_param, dtype, _, _, _ in self.entries:
            empty = torch.empty(0, dtype=dtype)
            if is_param:
                module._parameters[name].data = empty
            else:
                module._buffers[name] = empty


class BlockSwapper:
    def __init__(self, all_blocks: list[nn.Module], count: int, device: torch.device, prefetch: int = 1,
                 checkpointed: bool = True):
        if count > len(all_blocks):
            raise ConfigError(f"memory.block_swap is {count} but this model has {len(all_blocks)} blocks: use at "
                              f"most {len(all_blocks)} (0 turns block swap off).")
        if prefetch < 1:
            raise ValueError("prefetch depth must be at least 1")
        self.device = device
        self.prefetch = prefetch
        cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if cuda else None
        first = len(all_blocks) - count
        self.slots = {p: _Slot(p, all_blocks[p], device, pin=cuda) for p in range(first, len(all_blocks))}
        self.order = sorted(self.slots)
        self.late_loads = 0  # loads the schedule did not start in time (should stay 0 after the first step)
        self.trace: list[tuple[str, int]] = []  # (what, position): tests check the schedule with it
        self._needs_backward: set[int] = set()
        self._device_ptrs: dict[int, int] = {}  # device buffer address -> position, for saved-tensor packing
        self._backward_open = False
        self._hold = False  # all_resident(): no releases while set
        self._handles = []
        for position, block in enumerate(all_blocks):
            self._handles.append(block.register_forward_pre_hook(functools.partial(self._before_forward, position)))
            if position in self.slots:
                self._handles.append(block.register_forward_hook(functools.partial(self._after_forward, position)))
                block.forward = self._guarded(position, block.forward, saved_hooks=not checkpointed)

    # ---- placement ------------------------------------------------------------------------
    @contextlib.contextmanager
    def hidden(self):
        """Swapped weights invisible to model.to() / DeepSpeed's initialise (which moves the whole model)."""
        for position, slot in self.slots.items():
            self._release(position)
            slot.hide()
        try:
            yield
        finally:
            for slot in self.slots.values():
                slot.release()

    @contextlib.contextmanager
    def all_resident(self):
        """Every swapped block on the device for the duration: no copies per block (sample rendering,
        when the memory for the whole model is there). Afterwards the swap schedule resumes."""
        for position in self.order:
            self._activate(position, late_ok=True)
        self._hold = True
        try:
            yield
        finally:
            self._hold = False
            for position in self.order:
                self._release(position)
            for position in self.order[: self.prefetch]:  # the next forward starts with these
                self._load(position)

    def resident(self) -> list[int]:
        return [p for p, s in self.slots.items() if s.state != "offloaded"]

    # ---- moves ----------------------------------------------------------------------------
    def _load(self, position: int) -> None:
        slot = self.slots[position]
        if slot.state == "offloaded":
            slot.load(self.stream)
            self._device_ptrs[slot.dev.untyped_storage().data_ptr()] = position
            self.trace.append(("load", position))

    def _activate(self, position: int, late_ok: bool = False) -> None:
        slot = self.slots[position]
        if slot.state == "resident":
            return
        if slot.state == "offloaded":
            if not late_ok:
                self.late_loads += 1
            self._load(position)
        slot.activate()
        self.trace.append(("use", position))

    def _release(self, position: int) -> None:
        if self._hold:
            return
        slot = self.slots[position]
        if slot.state != "offloaded":
            self._device_ptrs.pop(slot.dev.untyped_storage().data_ptr(), None)
            slot.release()
            self.trace.append(("release", position))

    # ---- forward ----------------------------------------------------------------------------
    def _before_forward(self, position: int, module, args) -> None:
        if position in self.slots:
            self._activate(position, late_ok=not self._needs_backward and position == self.order[0])
        ahead = [p for p in self.order if p > position][: self.prefetch]
        for p in ahead:
            self._load(p)

    def _after_forward(self, position: int, module, args, output) -> None:
        outputs = [t for t in tree_leaves(output) if torch.is_tensor(t) and t.requires_grad]
        needed = torch.is_grad_enabled() and bool(outputs)
        if needed:
            self._needs_backward.add(position)
            torch.autograd.graph.register_multi_grad_hook(
                outputs, functools.partial(self._before_backward, position), mode="any")
        if not (needed and position in self.order[-self.prefetch:]):
            self._release(position)

    def _guarded(self, position: int, forward, saved_hooks: bool):
        """The block's forward, made safe for recompute (checkpointing) and for saved weight views."""
        swapper = self

        @functools.wraps(forward)
        def run(*args, **kwargs):
            swapper._activate(position)
            if not saved_hooks or not torch.is_grad_enabled():
                return forward(*args, **kwargs)
            with torch.autograd.graph.saved_tensors_hooks(swapper._pack, swapper._unpack):
                return forward(*args, **kwargs)
        return run

    def _pack(self, tensor: torch.Tensor):
        position = self._device_ptrs.get(tensor.untyped_storage().data_ptr())
        if position is None:
            return tensor
        return ("weight", position, tensor.dtype, tuple(tensor.shape), tensor.stride(), tensor.storage_offset())

    def _unpack(self, packed):
        if torch.is_tensor(packed):
            return packed
        _, position, dtype, shape, stride, offset = packed
        self._activate(position)
        return self.slots[position].dev.view(dtype).as_strided(shape, stride, offset)

    # ---- backward ---------------------------------------------------------------------------
    def _before_backward(self, position: int, grad) -> None:
        if not self._backward_open:
            self._backward_open = True
            torch.autograd.Variable._execution_engine.queue_callback(self._after_backward)
        for p in self.order:
            if p > position:
                self._release(p)
        self._activate(position)
        behind = [p for p in reversed(self.order) if p < position and p in self._needs_backward][: self.prefetch]
        for p in behind:
            self._load(p)

    def _after_backward(self) -> None:
        self._backward_open = False
        self._needs_backward.clear()
        for p in self.order:
            self._release(p)
        for p in self.order[: self.prefetch]:  # the next forward starts with these
            self._load(p)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
