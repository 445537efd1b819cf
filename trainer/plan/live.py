"""Live tensor bytes and their peak over a stretch of code: the one instrument that measures a
run's total tensor peak (the trainer's untimed memory step, real tensors) and predicts it (the
planner's trace, fake tensors), so prediction and measurement count the same things.

Every storage is counted once, from the moment an op produces it (a TorchDispatchMode sees every
aten op's outputs) until it is freed (a weak reference on the storage). Tensors that existed
before are registered with `track()` (the trainer hands over every tensor the garbage collector
knows, plus strategy buffers Python cannot reach). FSDP2 frees and re-allocates its unsharded
parameters by resizing their storages in place, which no op reports: its two helpers are wrapped
while the tracker is active.
"""
from __future__ import annotations

import gc
import weakref
from collections.abc import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary


def _storage(t: torch.Tensor):
    local = getattr(t, "_local_tensor", None)  # a DTensor holds its shard
    t = local if isinstance(local, torch.Tensor) else t
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # e.g. sparse or nested tensors
        return None


class LiveTensors(TorchDispatchMode):
    """Bytes of live storages by tag; `peak` and `peak_by_tag` where the total was largest."""

    def __init__(self, device: str | None = None) -> None:
        super().__init__()
        self.device = device
        """Count only tensors on this device type (cuda: the GPU's memory, not pinned host batches)."""
        self.live = 0
        self.peak = 0
        self.by_tag: dict[str, int] = {}
        self.peak_by_tag: dict[str, int] = {}
        self.tag = "state"
        self.phase = "forward"
        """forward or backward (the caller switches it at a micro-step's first gradient hook)."""
        self.peak_less_grads: dict[str, int] = {"forward": 0, "backward": 0}
        """Per phase, most live bytes less those tagged "grads" (what ZeRO-1/2 hold apart from
        gradients: DeepSpeed copies each into its reduce buckets, allocated at backward's start)."""
        self._sizes = WeakIdKeyDictionary()  # storage -> [bytes, tag]
        self._patched: list[tuple[object, str, object]] = []

    # -- counting -------------------------------------------------------------------------------
    def _change(self, tag: str, delta: int) -> None:
        self.live += delta
        self.by_tag[tag] = self.by_tag.get(tag, 0) + delta
        if self.live > self.peak:
            self.peak = self.live
            self.peak_by_tag = {k: v for k, v in self.by_tag.items() if v}
        less = self.live - self.by_tag.get("grads", 0)
        if less > self.peak_less_grads[self.phase]:
            self.peak_less_grads[self.phase] = less

    def _add(self, t: torch.Tensor, tag: str) -> None:
        if self.device is not None and t.device.type != self.device:
            return
        st = _storage(t)
        if st is None or st in self._sizes:
            return
        n = st.nbytes()
        entry = [n, tag]
        self._sizes[st] = entry
        weakref.finalize(st, self._freed, entry)
        if n:
            self._change(tag, n)

    def _freed(self, entry: list) -> None:
        if entry[0]:
            self._change(entry[1], -entry[0])
            entry[0] = 0

    def _resized(self, t: torch.Tensor) -> None:
        st = _storage(t)
        if st is None:
            return
        entry = self._sizes.get(st)
        if entry is None:
            self._add(t, self.tag)
            return
        n = st.nbytes()
        if n != entry[0]:
            self._change(entry[1], n - entry[0])
            entry[0] = n

    def track(self, tensors: Iterable, tag: str = "state") -> None:
        """Count tensors that exist already (they are uncounted when freed)."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._add(t, tag)

    def track_all_reachable(self, tag: str = "state") -> None:
        """Every tensor the garbage collector can see (parameters, optimizer state, buffers)."""
        self.track((o for o in gc.get_objects() if _is_tensor(o)), tag)

    def retag(self, tensors: Iterable, tag: str) -> None:
        """Move tensors (already counted) to another tag, e.g. gradients made during backward."""
        for t in tensors:
            st = _storage(t) if isinstance(t, torch.Tensor) else None
            entry = self._sizes.get(st) if st is not None else None
            if entry is None:
                if st is not None:
                    self._add(t, tag)
                continue
            if entry[1] != tag:
                self.by_tag[entry[1]] = self.by_tag.get(entry[1], 0) - entry[0]
                self.by_tag[tag] = self.by_tag.get(tag, 0) + entry[0]
                entry[1] = tag

    # -- the mode -------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.resize_.default or func is torch.ops.aten.set_.source_Storage:
            self._resized(args[0])
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._add(t, self.tag)
        return out

    def __enter__(self):
        self._patch_fsdp()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for module, name, original in reversed(self._patched):
                setattr(module, name, original)
            self._patched.clear()

    def _patch_fsdp(self) -> None:
        try:
            from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
        except ImportError:
            return
        for name in ("alloc_storage", "free_storage"):
            original = getattr(_fsdp_param, name, None)
            if original is None:
                continue

            def wrapped(tensor, _original=original):
                _original(tensor)
                self._resized(tensor)

            for module in (_fsdp_param, _fsdp_param_group):
                if getattr(module, name, None) is original:
                    self._patched.append((module, name, original))
                    setattr(module, name, wrapped)


def _is_tensor(o: object) -> bool:
    """isinstance(o, Tensor), False for a dead weakref.proxy among gc's objects (torch.compile
    leaves some): isinstance on one raises ReferenceError."""
    try:
        return isinstance(o, torch.Tensor)
    except ReferenceError:
        return False
