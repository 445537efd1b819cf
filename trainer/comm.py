"""Counting the collectives a rank issues: calls and bytes per step, by operation.

Every strategy ends up in Python's torch.distributed: DDP through its comm hook (trainer/
strategies/ddp.py always registers one), FSDP2 through dist.all_gather_single /
reduce_scatter_single, DTensor (FSDP's gradient clipping) through the functional collectives,
and DeepSpeed's comm layer (deepspeed.comm's TorchBackend) through torch.distributed too. So the
counter wraps those module functions once, before DeepSpeed's backend captures references to
them, and counts only while a measured step runs. A collective that calls another one inside
(all_gather_object, coalesced variants) counts once, as the outermost call.

Bytes are the size of the whole buffer the operation works on, per call: the tensor of an
all-reduce or broadcast, the gathered (full) output of an all-gather, the full input of a
reduce-scatter. Bytes on the wire per rank follow from them: about 2(N-1)/N of that for a ring
all-reduce, (N-1)/N for an all-gather or reduce-scatter.

Seconds per operation are the time at least one call of that operation was in flight: from the
call until its work completed (the call's return when synchronous; the completion of its
future when async_op=True, as DDP's hook, FSDP2 and DeepSpeed's overlap use it). A union, not a
sum: DDP's buckets queue behind each other on gloo's thread, and summing each bucket's
call-to-completion time would count the queueing many times. So no operation exceeds the step it
ran in. On CUDA a future completes when the kernel is enqueued, not done, so there the time is
NCCL's own per-work timer (TORCH_NCCL_ENABLE_TIMING, set by trainer/process.py) summed per op,
delivered by the group's completion hook (`ProcessGroup._register_on_completion_hook`: NCCL's
watchdog hands it a copy of each finished work without its outputs). The counter never keeps a
Work: a CUDA work holds its output tensors (ProcessGroupNCCL's "reference to NCCL collective's
outputs"), so keeping it until the step ended kept every all-gathered buffer alive and raised
the peak memory of fsdp and zero3 by about a model's size. Functional collectives (DTensor's)
count their call only: their wait is inside the tensor.

On a device mesh (trainer/parallel/mesh.py) each dimension's process group is named
(`name_dims`), and calls and bytes are also counted per (dimension, operation): tensor
parallelism's activation collectives apart from data parallelism's gradient ones
(`per_dim_step`). A call on a group no dimension owns counts under "other", one on the world
group under "world".
"""
from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable

import torch

# torch.distributed function -> (operation name, which argument holds the measured buffer)
# The buffer is given as (position, keyword); "list" sums a list of tensors.
_C10D_OPS: dict[str, tuple[str, int, str]] = {
    "all_reduce": ("all_reduce", 0, "tensor"),
    "all_reduce_coalesced": ("all_reduce", 0, "tensors"),
    "all_gather": ("all_gather", 0, "tensor_list"),
    "all_gather_into_tensor": ("all_gather", 0, "output_tensor"),
    "all_gather_single": ("all_gather", 0, "output_tensor"),
    "_all_gather_base": ("all_gather", 0, "output_tensor"),
    "all_gather_coalesced": ("all_gather", 0, "output_tensor_lists"),
    "reduce_scatter": ("reduce_scatter", 1, "input_list"),
    "reduce_scatter_tensor": ("reduce_scatter", 1, "input"),
    "reduce_scatter_single": ("reduce_scatter", 1, "input"),
    "_reduce_scatter_base": ("reduce_scatter", 1, "input"),
    "broadcast": ("broadcast", 0, "tensor"),
    "reduce": ("reduce", 0, "tensor"),
    "all_to_all": ("all_to_all", 1, "input_tensor_list"),
    "all_to_all_single": ("all_to_all", 1, "input"),
    "gather": ("gather", 0, "tensor"),
    "scatter": ("scatter", 0, "tensor"),
    "send": ("send", 0, "tensor"),
    "recv": ("recv", 0, "tensor"),
    "isend": ("send", 0, "tensor"),
    "irecv": ("recv", 0, "tensor"),
    "barrier": ("barrier", -1, ""),
}
# torch.distributed._functional_collectives (DTensor's redistribute uses these).
_FUNCOL_OPS: dict[str, tuple[str, int, str]] = {
    "all_reduce": ("all_reduce", 0, "self"),
    "all_reduce_coalesced": ("all_reduce", 0, "self"),
    "all_gather_tensor": ("all_gather", 0, "self"),
    "all_gather_single": ("all_gather", 0, "self"),
    "reduce_scatter_tensor": ("reduce_scatter", 0, "self"),
    "reduce_scatter_single": ("reduce_scatter", 0, "self"),
    "all_to_all_single": ("all_to_all", 0, "self"),
    "broadcast": ("broadcast", 0, "self"),
}


def _nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.nelement() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def _group_size(group) -> int:
    """Ranks in a functional collective's group (a ProcessGroup, a (mesh, dim), a name...)."""
    import torch.distributed as dist

    try:
        from torch.distributed._functional_collectives import _resolve_group_name

        name = _resolve_group_name(group)
        return dist.distributed_c10d._resolve_process_group(name).size()
    except Exception:  # noqa: BLE001 - an unknown group form: the world is the best guess
        return dist.get_world_size() if dist.is_initialized() else 1


class CommCounter:
    """Calls and bytes per operation, summed while `active`; installed once per process."""

    def __init__(self) -> None:
        self.active = False
        self.calls: dict[str, int] = {}
        self.bytes: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self._in_flight: dict[str, tuple[int, float]] = {}  # op -> (calls in flight, since when)
        # NCCL-timed works expected from a group's completion hook: (group, seq) -> op. Only
        # numbers: a Work holds its outputs. Groups -> whether their hook is ours (False: untimed).
        self._expected: dict[tuple[object, int], str] = {}
        self._hooked: dict[object, bool] = {}
        self._depth = threading.local()
        self._lock = threading.Lock()
        self._installed = False
        self._dims: dict[object, str] = {}  # process group -> mesh dimension name
        self.dim_calls: dict[tuple[str, str], int] = {}  # (dimension, op) -> calls
        self.dim_bytes: dict[tuple[str, str], int] = {}

    def name_dims(self, groups: dict[str, object]) -> None:
        """{dimension name: its process group}: count calls per mesh dimension from now on."""
        self._dims.update({group: name for name, group in groups.items()})

    def _dim_of(self, group) -> str:
        """The mesh dimension a collective's group argument (a ProcessGroup, a group name, a
        (mesh, dim) pair, None for the world) belongs to."""
        import torch.distributed as dist

        try:
            pg = group
            if group is None or group is dist.group.WORLD:
                pg = dist.distributed_c10d._get_default_group()
            elif not isinstance(group, dist.ProcessGroup):
                from torch.distributed._functional_collectives import _resolve_group_name

                pg = dist.distributed_c10d._resolve_process_group(_resolve_group_name(group))
            # A dimension that spans every rank may be the world group itself: its name wins.
            return self._dims.get(pg) or ("world" if pg is dist.distributed_c10d._get_default_group() else "other")
        except Exception:  # noqa: BLE001 - an unknown group form is "other", never the run
            return "other"

    def add(self, op: str, nbytes: int) -> None:
        with self._lock:
            self.calls[op] = self.calls.get(op, 0) + 1
            self.bytes[op] = self.bytes.get(op, 0) + nbytes

    def add_dim(self, dim: str, op: str, nbytes: int) -> None:
        with self._lock:
            self.dim_calls[(dim, op)] = self.dim_calls.get((dim, op), 0) + 1
            self.dim_bytes[(dim, op)] = self.dim_bytes.get((dim, op), 0) + nbytes

    def _begin(self, op: str) -> None:
        with self._lock:
            n, since = self._in_flight.get(op, (0, 0.0))
            self._in_flight[op] = (n + 1, time.perf_counter() if n == 0 else since)

    def _end(self, op: str) -> None:
        with self._lock:
            n, since = self._in_flight[op]
            self._in_flight[op] = (n - 1, since)
            if n == 1:
                self.seconds[op] = self.seconds.get(op, 0.0) + time.perf_counter() - since

    def _ended_by(self, op: str, result) -> None:
        """The call returned `result`: its op ends now, or when its work completes."""
        try:
            future = result.get_future() if hasattr(result, "get_future") else None
        except RuntimeError:  # gloo's isend/irecv works have no future: their call's time only
            future = None
        if future is None:
            self._end(op)
        else:
            future.add_done_callback(lambda _: self._end(op))  # inline if already done

    def _timed_group(self, group):
        """The process group whose completion hook times this CUDA call (the hook registered on
        first use), or None: a group that takes no hook (gloo, NCCL without timing, a hook of
        someone else's) leaves CUDA seconds out, never the run."""
        try:
            import torch.distributed as dist

            pg = group if group is not None else dist.distributed_c10d._get_default_group()
            if pg not in self._hooked:
                try:
                    pg._register_on_completion_hook(functools.partial(self._completed, pg))
                    self._hooked[pg] = True
                except Exception:  # noqa: BLE001 - see the docstring
                    self._hooked[pg] = False
            return pg if self._hooked[pg] else None
        except Exception:  # noqa: BLE001 - an unknown group form: untimed
            return None

    @staticmethod
    def _seq(pg) -> int | None:
        """The group's collective sequence number (None: unreadable, the call goes untimed)."""
        try:
            return int(pg._get_sequence_number_for_group())
        except Exception:  # noqa: BLE001 - never a failed collective for a figure
            return None

    def _expect(self, pg, op: str, before: int | None) -> None:
        """The works this call issued on `pg`: the collective sequence numbers it advanced."""
        after = self._seq(pg)
        if before is None or after is None:
            return
        with self._lock:
            for seq in range(before + 1, after + 1):
                self._expected[(pg, seq)] = op

    def _completed(self, pg, info) -> None:
        """A group's completion hook (NCCL's watchdog thread): a counted work's NCCL-timed seconds."""
        if info.op_type.name in _P2P_OP_TYPES:  # numbered apart from collectives
            return
        with self._lock:
            op = self._expected.pop((pg, info.seq), None)
            if op is not None:
                self.seconds[op] = self.seconds.get(op, 0.0) + info.active_duration.total_seconds()

    def settle(self, timeout_s: float = 0.0) -> None:
        """Wait up to timeout_s for the completion hooks of counted CUDA works (after the loop,
        outside any timer; the watchdog reports a work some 100 ms after it finished)."""
        deadline = time.monotonic() + timeout_s
        while self._expected and time.monotonic() < deadline:
            time.sleep(0.01)

    def _wrap(self, fn: Callable, op: str, pos: int, key: str, size_of: Callable | None,
              nccl_timed: bool = True) -> Callable:
        counter = self

        group_at = _param_position(fn, "group") if nccl_timed else None
        group_param = _param_position(fn, "group")

        @functools.wraps(fn)
        def counted(*args, **kwargs):
            depth = getattr(counter._depth, "n", 0)
            counting = counter.active and depth == 0
            buf = None
            if counting:  # nothing more than the two checks above while not counting
                buf = kwargs.get(key) if key in kwargs else (args[pos] if 0 <= pos < len(args) else None)
            cuda = counting and _on_cuda(buf)
            pg = None
            if cuda and group_at is not None:
                group = kwargs["group"] if "group" in kwargs else (args[group_at] if group_at < len(args) else None)
                pg = counter._timed_group(group)
            before = counter._seq(pg) if pg is not None else None
            if counting:
                nbytes = _nbytes(buf)
                nbytes = size_of(nbytes, args, kwargs) if size_of is not None else nbytes
                counter.add(op, nbytes)
                if counter._dims:  # a mesh run: which dimension this call's group is
                    group = kwargs["group"] if "group" in kwargs else (
                        args[group_param] if group_param is not None and group_param < len(args) else None)
                    counter.add_dim(counter._dim_of(group), op, nbytes)
                if not cuda:  # on CUDA the call only enqueues: NCCL's timer is the time
                    counter._begin(op)
            counter._depth.n = depth + 1
            try:
                result = fn(*args, **kwargs)
            except BaseException:
                if counting and not cuda:
                    counter._end(op)
                raise
            finally:
                counter._depth.n = depth
            if counting and not cuda:
                counter._ended_by(op, result)
            if pg is not None:
                counter._expect(pg, op, before)
            return result

        counted.__shardbench_counted__ = True  # type: ignore[attr-defined]
        return counted

    def install(self) -> None:
        """Wrap torch.distributed's collectives (both the package and distributed_c10d, which
        other modules import from) and the functional collectives. Idempotent."""
        if self._installed:
            return
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        for name, (op, pos, key) in _C10D_OPS.items():
            original = getattr(c10d, name, None) or getattr(dist, name, None)
            if original is None or getattr(original, "__shardbench_counted__", False):
                continue
            wrapped = self._wrap(original, op, pos, key, None)
            for module in (dist, c10d):
                if getattr(module, name, None) is original:
                    setattr(module, name, wrapped)
        try:
            import torch.distributed._functional_collectives as funcol
        except ImportError:
            funcol = None  # type: ignore[assignment]
        if funcol is not None:
            for name, (op, pos, key) in _FUNCOL_OPS.items():
                original = getattr(funcol, name, None)
                if original is None or getattr(original, "__shardbench_counted__", False):
                    continue
                size_of = _gathered_bytes if op == "all_gather" else None
                setattr(funcol, name, self._wrap(original, op, pos, key, size_of, nccl_timed=False))
        self._installed = True

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self.bytes.clear()
            self.seconds.clear()
            self._expected.clear()
            self.dim_calls.clear()
            self.dim_bytes.clear()

    def per_step(self, steps: int) -> dict[str, dict[str, float]]:
        """{op: {"calls", "bytes", "seconds": means per step}} over `steps` counted steps."""
        if steps <= 0:
            return {}
        with self._lock:
            return {op: {"calls": self.calls[op] / steps, "bytes": self.bytes[op] / steps,
                         "seconds": self.seconds.get(op, 0.0) / steps} for op in sorted(self.calls)}


    def per_dim_step(self, steps: int) -> dict[str, dict[str, dict[str, float]]]:
        """{mesh dimension: {op: {"calls", "bytes": means per step}}}; empty off a mesh."""
        if steps <= 0:
            return {}
        out: dict[str, dict[str, dict[str, float]]] = {}
        with self._lock:
            for (dim, op), calls in sorted(self.dim_calls.items()):
                out.setdefault(dim, {})[op] = {"calls": calls / steps, "bytes": self.dim_bytes[(dim, op)] / steps}
        return out


def _param_position(fn: Callable, name: str) -> int | None:
    """Where `fn` takes `name` positionally (None: it has no such parameter)."""
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature
        return None
    return names.index(name) if name in names else None


def _on_cuda(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.is_cuda
    return isinstance(value, (list, tuple)) and any(_on_cuda(v) for v in value)


def _gathered_bytes(input_bytes: int, args, kwargs) -> int:
    """A functional all-gather is given this rank's input: the full output is N times that."""
    group = kwargs.get("group", args[2] if len(args) > 2 else None)
    return input_bytes * _group_size(group)


_P2P_OP_TYPES = frozenset({"SEND", "RECV", "RECVANYSOURCE"})

COUNTER = CommCounter()
"""The process's one counter (collectives are process-wide, so is the count)."""
