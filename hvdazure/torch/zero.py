"""Sharded optimizer state and gradients (`zero_stage` 1 and 2) on horovod.torch's collectives.

The user's optimizer is kept (it is `trainer.optimizer`) but steps this rank's slice only: its param groups
hold one flat tensor per dtype, this rank's contiguous 1/N of the group's trained parameters laid end to end
(core/optimizer_shards.py splits them), so its state holds the slice's moments and nothing more. A step:
the gradients are exchanged (stage 1: allreduced as at stage 0, then this rank's slice taken; stage 2:
reduce-scattered straight into the slice, and the full gradients freed), the slice is stepped, and the
updated slices are allgathered into every rank's parameters, which stay whole (predict, export, SyncBN and
the checkpoint's weights see the full model). The model's parameters are the truth: the slice is copied from
them before each step, so that a checkpoint load or a user's change of a weight is never overwritten.

Checkpoints hold the state canonically (core/optimizer_shards.py's state file), streamed to rank 0 one rank's
slice at a time (rank 0 never holds the whole state) and scattered the same way on resume, so a run resumes
on any number of ranks and at any stage, including stage 0's `optimizer.pt` read into slices and back: this
class says when (collect, scatter, the spool), torch/zero_state.py how (the plans, the bytes, the file).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
import os
import tempfile
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import horovod
import horovod.torch as hvd
import torch

from hvdazure.core.config import ConfigError
from hvdazure.core.optimizer_shards import FlatPartition, StateFileWriter
from hvdazure.core.rank_logging import logger
from hvdazure.torch.gradients import COMPRESSION, OPS, GradientsAfterBackward
from hvdazure.torch.zero_state import (
    DictSource,
    StateSource,
    file_entries,
    file_metadata,
    own_bytes,
    plan_from_source,
    plan_of_state,
    rank0_sends,
    slice_bytes,
    slices_state_dict,
    to_rank0,
    write_slice,
)

# torch.optim's optimizers whose state and update are per element: a slice steps as the whole tensor would
ELEMENTWISE = ("SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Adamax", "NAdam", "RAdam", "Adadelta", "Rprop",
               "ASGD")
# ... and those that couple a tensor's elements (or its sparse rows): a slice cannot step on its own
COUPLED = {"LBFGS": "it runs a line search over all parameters as one vector",
           "Adafactor": "its factored second moments are per row and column of each matrix",
           "Muon": "it orthogonalizes each matrix's update as a whole",
           "SparseAdam": "it takes sparse gradients"}
# Buckets a rank has in flight at once (reduce-scatters during backward, allgathers after the step): one being
# exchanged while the next is prepared. More would overlap more but hold more full-size buffers at once.
IN_FLIGHT = 2


NEEDED = ("grouped_reducescatter", "reducescatter_async", "allgather_async", "alltoall")  # Horovod 0.27+


def refuse_without_collectives(available: Sequence[str], version: str) -> None:
    """A ConfigError when the Horovod built here lacks a collective sharding needs (`available`: the names
    horovod.torch has): reduce-scatter came in 0.25, its grouped form and scaling factors in 0.27."""
    if missing := [name for name in NEEDED if name not in available]:
        raise ConfigError(f"config field 'zero_stage': this Horovod ({version}) has no {missing[0]}, which "
                          "sharding needs: build Horovod 0.28.1 (scripts/build_horovod.sh), or use "
                          "zero_stage: 0")


def refuse_coupled(optimizer: torch.optim.Optimizer) -> None:
    """A ConfigError naming an optimizer whose update couples a tensor's elements; a warning (rank 0) for
    one hvdazure does not know (its state must be per element for the slices to step exactly)."""
    names = [cls.__name__ for cls in type(optimizer).__mro__]
    for name in names:
        if name in COUPLED:
            raise ConfigError(f"config field 'zero_stage': {type(optimizer).__name__} cannot step a slice of "
                              f"the parameters ({COUPLED[name]}); use zero_stage: 0 with it")
        if name in ELEMENTWISE:
            return
    if hvd.rank() == 0:
        logger.warning(f"zero_stage: {type(optimizer).__name__} is not one of torch.optim's per-element "
                       "optimizers: its slices step exactly only if its state and update are per element")


@dataclass
class _Flat:
    """One group's trained parameters of one dtype, and this rank's slice of them."""

    params: list[torch.nn.Parameter]
    partition: FlatPartition
    shard: torch.Tensor  # this rank's slice of the weights, as the user's optimizer steps it
    pieces: list[tuple[torch.Tensor, torch.Tensor]]  # (a run of a parameter's elements, its place in shard)


class ShardedOptimizer:
    """The user's optimizer made to step this rank's slice (see the module's docstring). `optimizer` is
    rewritten in place: its param groups' parameters become this rank's slices, one per bucket (a run of
    the group's trained parameters of one dtype, up to `bucket_bytes`, split evenly over the ranks: the
    parameters one reduce-scatter and one allgather carry)."""

    def __init__(self, optimizer: torch.optim.Optimizer, stage: int, reduce_op: str, compression: str,
                 gradient_predivide_factor: float, device: torch.device, bucket_bytes: int) -> None:
        refuse_without_collectives(dir(hvd), horovod.__version__)
        refuse_coupled(optimizer)
        self.optimizer, self.stage, self.device = optimizer, stage, device
        self.rank, self.world = hvd.rank(), hvd.size()
        self.op, self.compression = OPS[reduce_op], COMPRESSION[compression]
        self.scale: dict[str, float] = {}
        if reduce_op == "average" and gradient_predivide_factor != 1.0:
            self.scale = {"prescale_factor": 1.0 / gradient_predivide_factor,
                          "postscale_factor": gradient_predivide_factor}
        before = optimizer.state_dict()  # canonical numbering; state some optimizers set up in __init__
        self.params: list[torch.nn.Parameter] = [p for g in optimizer.param_groups for p in g["params"]]
        self.group_sizes = [len(g["params"]) for g in optimizer.param_groups]
        self.numels = {i: p.numel() for i, p in enumerate(self.params)}
        self.shapes = {i: p.shape for i, p in enumerate(self.params)}
        self.flats: list[list[_Flat]] = []  # per group, its buckets
        index = 0
        for group in optimizer.param_groups:
            by_dtype: dict[torch.dtype, list[tuple[int, torch.nn.Parameter]]] = {}
            for p in group["params"]:
                if p.requires_grad:
                    by_dtype.setdefault(p.dtype, []).append((index, p))
                index += 1
            self.flats.append([self._flat(bucket) for members in by_dtype.values()
                               for bucket in _buckets(members, bucket_bytes)])
        self.all_flats = [flat for flats in self.flats for flat in flats]
        self._gradients = GradientsAfterBackward(
            [p for p in self.params if p.requires_grad], reduce_op, compression, gradient_predivide_factor) \
            if stage == 1 else None
        optimizer.state.clear()
        for group, flats in zip(optimizer.param_groups, self.flats, strict=True):
            group["params"] = [flat.shard for flat in flats]
        self._pending: StateSource | None = None
        self._spool: str | None = None
        self._spool_current = False  # the spool holds the state as it is now (no step, no load since)
        # the spool is deleted with this object, or at exit: not an atexit hook holding it (and its model's
        # optimizer state) alive until the process ends, as a sweep's trials follow one another in one process
        self._spool_paths: list[str] = []
        weakref.finalize(self, _unlink, self._spool_paths)
        # stage 2: each bucket is reduce-scattered as soon as backward has produced its last gradient of the
        # step's last micro-batch, and its full gradients freed then (`arm` says which backward is the last)
        self._armed = False
        self._ready = [0] * len(self.all_flats)
        self._in_flight: dict[int, tuple[Any, Any]] = {}  # bucket -> (Horovod handle, compression context)
        self._slices: dict[int, torch.Tensor] = {}  # bucket -> this rank's reduced slice
        if stage == 2 and self.world > 1:
            # a parameter is this optimizer's until another claims it (a model shared by trainers in one
            # process: a sweep's trials, a notebook's): the hooks of an older one then do nothing, and hold
            # it only weakly
            me = weakref.ref(self)
            for k, flat in enumerate(self.all_flats):
                for p in flat.params:
                    setattr(p, _OWNER, me)
                    p.register_post_accumulate_grad_hook(functools.partial(_produced, me, k))
        if before["state"]:  # set up by the optimizer's constructor (Adagrad's sums): cut into the slice
            source = DictSource(before, self.numels)
            plan = plan_from_source(self.all_flats, source)
            self._install(plan, slice_bytes(self.all_flats, source, plan, self.rank))

    def _flat(self, members: list[tuple[int, torch.nn.Parameter]]) -> _Flat:
        params = [p for _, p in members]
        partition = FlatPartition(tuple(i for i, _ in members), tuple(p.numel() for p in params), self.world,
                                  params[0].element_size())
        shard = torch.zeros(partition.shard_size, dtype=params[0].dtype, device=self.device)
        by_index = dict(members)
        pieces = [(by_index[piece.index].detach().view(-1)[piece.start:piece.start + piece.length],
                   shard[piece.at:piece.at + piece.length]) for piece in partition.pieces(self.rank)]
        return _Flat(params, partition, shard, pieces)

    def partitions(self) -> list[FlatPartition]:
        return [flat.partition for flat in self.all_flats]

    def layout_record(self) -> dict[str, Any]:
        """The checkpoint manifest's record of the partition: the stage, the ranks, and per bucket its
        parameters (canonical indices), their sizes and each rank's shard size (FlatPartition.record)."""
        return {"zero_stage": self.stage, "ranks": self.world,
                "buckets": [partition.record() for partition in self.partitions()]}

    def state_bytes(self) -> int:
        """The bytes of optimizer state this rank holds."""
        return sum(v.numel() * v.element_size() for s in self.optimizer.state.values() for v in s.values()
                   if isinstance(v, torch.Tensor))

    # --- a step --------------------------------------------------------------------------------------------
    def arm(self, last_backward: bool) -> None:
        """Before each micro-batch's backward: whether it is the step's last (stage 2 then reduce-scatters
        each bucket as soon as its gradients are complete)."""
        self._armed = last_backward

    def _produced(self, k: int, param: torch.Tensor) -> None:
        """A parameter's gradient is complete for this backward (its post-accumulate-grad hook)."""
        if not self._armed or k in self._in_flight or k in self._slices:
            return
        self._ready[k] += 1
        if self._ready[k] == len(self.all_flats[k].params):
            self._launch(k)
            self._collect_finished()

    def _launch(self, k: int) -> None:
        """Start bucket k's reduce-scatter, and free its full gradients; with IN_FLIGHT buckets already in
        flight, first wait for the oldest (its full-size buffer goes then): the bytes in flight stay bounded
        when the collectives run slower than backward produces gradients."""
        while len(self._in_flight) >= IN_FLIGHT:
            self._finish(next(iter(self._in_flight)))
        flat = self.all_flats[k]
        buffer, context = self.compression.compress(self._flat_gradients(flat))
        handle = hvd.reducescatter_async(buffer, name=f"hvdazure.zero.gradients.{k}", op=self.op,
                                         **self.scale)
        self._in_flight[k] = (handle, context)
        for p in flat.params:
            p.grad = None

    def _collect_finished(self) -> None:
        """Take the slices of the reduce-scatters already done (their full-size buffers go with them)."""
        for k in [k for k, (handle, _) in self._in_flight.items() if hvd.poll(handle)]:
            self._finish(k)

    def _finish(self, k: int) -> None:
        handle, context = self._in_flight.pop(k)
        self._slices[k] = self.compression.decompress(hvd.synchronize(handle), context)

    def exchange(self) -> None:
        """The step's gradients, averaged over ranks, into this rank's slices (`shard.grad`), and the slices'
        weights from the model's parameters. Stage 1 keeps the full (averaged) gradients, as stage 0 does;
        stage 2 has freed them (during backward, or here for a bucket backward did not complete)."""
        flats = self.all_flats
        self._spool_current = False  # this step changes the state the last checkpoint's spool holds
        with torch.no_grad():
            for flat in flats:
                for param_run, shard_run in flat.pieces:
                    shard_run.copy_(param_run)
        if self._gradients is not None:  # stage 1: allreduced whole, as at stage 0; then the slice taken
            self._gradients()
            for flat in flats:
                grad = torch.zeros_like(flat.shard)
                by_index = dict(zip(flat.partition.indices, flat.params, strict=True))
                for piece in flat.partition.pieces(self.rank):
                    param_grad = by_index[piece.index].grad
                    if param_grad is not None:
                        grad[piece.at:piece.at + piece.length] = \
                            param_grad.reshape(-1)[piece.start:piece.start + piece.length]
                flat.shard.grad = grad
            return
        if self.world == 1:
            for flat in flats:
                flat.shard.grad = self._flat_gradients(flat)
                for p in flat.params:
                    p.grad = None
            return
        for k in range(len(flats)):  # a bucket some of whose parameters got no gradient this step
            if k not in self._in_flight and k not in self._slices:
                self._launch(k)
        for k in list(self._in_flight):
            self._finish(k)
        for k, flat in enumerate(flats):
            flat.shard.grad = self._slices.pop(k)
        self._ready = [0] * len(flats)
        self._armed = False

    def _flat_gradients(self, flat: _Flat) -> torch.Tensor:
        """The bucket's gradients end to end, zeros where a parameter has none, padded to the split."""
        parts = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), dtype=p.dtype,
                                                                           device=self.device)
                 for p in flat.params]
        padding = flat.partition.padded - flat.partition.total
        if padding:
            parts.append(torch.zeros(padding, dtype=flat.shard.dtype, device=self.device))
        return torch.cat(parts)

    def shard_gradients(self) -> list[torch.Tensor]:
        return [flat.shard.grad for flat in self.all_flats if flat.shard.grad is not None]

    def global_probe(self, probe: torch.Tensor | float) -> torch.Tensor:
        """`probe` (NaN or inf when this slice's gradients are) summed over ranks: the same on every rank."""
        value = torch.as_tensor(probe, dtype=torch.float64, device=self.device).reshape(1)
        return hvd.allreduce(value, op=hvd.Sum, name="hvdazure.zero.probe")[0] if self.world > 1 else value[0]

    def poison(self) -> None:
        """Mark this rank's slice non-finite (one element), so that every rank's loss scaler skips the step
        one rank's slice overflowed in."""
        for grad in self.shard_gradients():
            grad.view(-1)[:1].fill_(math.nan)
            break

    def clip_(self, max_norm: float) -> None:
        """torch.nn.utils.clip_grad_norm_ over all ranks' slices: the global norm from the slices' sums of
        squares (one scalar allreduce); padding is zero and counts for nothing."""
        grads = self.shard_gradients()
        squares = torch.zeros(1, dtype=torch.float64, device=self.device)
        for g in grads:
            squares += g.detach().double().pow(2).sum()
        if self.world > 1:
            squares = hvd.allreduce(squares, op=hvd.Sum, name="hvdazure.zero.norm")
        coefficient = torch.clamp(max_norm / (squares.sqrt() + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coefficient.to(g.dtype))

    def gather_weights(self) -> None:
        """Every rank's updated slice into every rank's parameters: one allgather a bucket, at most
        IN_FLIGHT at a time (the next starts while the last is copied), each gathered bucket copied into the
        parameters and dropped as it is taken: the whole gathered model is never in memory at once."""
        flats = self.all_flats
        if self.world == 1:
            for flat in flats:
                self._copy_into_params(flat, flat.shard.detach())
            return
        started: collections.deque[tuple[_Flat, int]] = collections.deque()
        for k, flat in enumerate(flats):
            if len(started) >= IN_FLIGHT:
                done, handle = started.popleft()
                self._copy_into_params(done, hvd.synchronize(handle))
            handle = hvd.allgather_async(flat.shard.detach(), name=f"hvdazure.zero.weights.{k}")
            started.append((flat, handle))
        while started:
            done, handle = started.popleft()
            self._copy_into_params(done, hvd.synchronize(handle))

    @staticmethod
    def _copy_into_params(flat: _Flat, whole: torch.Tensor) -> None:
        with torch.no_grad():
            for p, start in zip(flat.params, flat.partition.offsets(), strict=True):
                p.view(-1).copy_(whole[start:start + p.numel()])

    def zero_grad(self) -> None:
        for flat in self.all_flats:
            flat.shard.grad = None
            for p in flat.params:
                p.grad = None

    # --- checkpoints ---------------------------------------------------------------------------------------
    def hold_for_scatter(self, source: StateSource) -> None:
        """Rank 0: a checkpoint's optimizer state, read (memory-mapped), to be scattered by `scatter`."""
        self._pending = source

    def scatter(self) -> bool:
        """Every rank together: rank 0's pending checkpoint state, cut into each rank's slice and sent to it
        one rank at a time. False (and nothing done) when rank 0 holds none."""
        pending = hvd.broadcast_object(self._pending is not None and self.rank == 0, root_rank=0,
                                       name="hvdazure.zero.pending")
        if not pending:
            return False
        source = self._pending if self.rank == 0 else None
        plan = hvd.broadcast_object(plan_from_source(self.all_flats, source) if source is not None else None,
                                    root_rank=0, name="hvdazure.zero.plan")
        for rank in range(self.world):
            data = slice_bytes(self.all_flats, source, plan, rank) if source is not None else None
            mine = rank0_sends(data, rank, self.rank, self.world)
            if rank == self.rank:
                self._install(plan, mine)
        self._pending = None
        return True

    def _install(self, plan: dict[str, Any], data: torch.Tensor) -> None:
        """This rank's slice of the state into the user's optimizer (through its load_state_dict: it casts
        and places each value as the optimizer expects)."""
        self._spool_current = False
        self.optimizer.load_state_dict(slices_state_dict(self.all_flats, [len(f) for f in self.flats], plan,
                                                         data, self.device))

    def collect(self) -> str:
        """Every rank together: the state, streamed to rank 0 one rank's slice at a time into a local state
        file (the spool; the previous one is deleted). Returns its path on rank 0, "" elsewhere."""
        self._drop_spool()
        plan = plan_of_state(self.all_flats, self.optimizer)  # the same names and dtypes on every rank
        writer = None
        if self.rank == 0:
            handle, path = tempfile.mkstemp(prefix="hvdazure-optimizer-", suffix=".safetensors")
            self._spool = path
            self._spool_paths.append(path)
            file = os.fdopen(handle, "w+b")
            metadata = file_metadata(self.all_flats, plan, self.group_sizes, self.stage)
            writer = StateFileWriter(file, file_entries(self.all_flats, plan, self.shapes), metadata)
        try:
            for rank in range(self.world):
                mine = own_bytes(self.all_flats, self.optimizer, plan) if rank == self.rank else None
                received = to_rank0(mine, rank, self.rank, self.world)
                if writer is not None:
                    write_slice(writer, self.all_flats, plan, rank, received)
        finally:
            if writer is not None:
                writer.file.close()
        self._spool_current = self._spool is not None
        return self._spool or ""

    def spool_writer(self) -> Callable[[BinaryIO], None]:
        """A checkpoint writer copying the spool `collect` wrote (rank 0), which must hold the state as it is
        now: after a step since (rank 0 saving alone after an error) it is an older step's, and nothing is
        written rather than that state beside newer weights."""
        path = self._spool
        if path is None or not self._spool_current:
            raise RuntimeError(f"the optimizer state is sharded over the ranks (zero_stage {self.stage}): "
                               "only all ranks together can save it, not rank 0 alone after an error: no "
                               "checkpoint of this step written (resume from the newest checkpoint)")

        def write(file: BinaryIO) -> None:
            with open(path, "rb") as spool:
                while chunk := spool.read(1 << 24):
                    file.write(chunk)
        return write

    def _drop_spool(self) -> None:
        _unlink(self._spool_paths)
        self._spool = None


def _unlink(paths: list[str]) -> None:
    """Delete the files `paths` names (those already gone too), and forget them."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    paths.clear()


_OWNER = "_hvdazure_zero_owner"  # the parameter's attribute naming the ShardedOptimizer it belongs to


def _produced(owner: weakref.ref[ShardedOptimizer], k: int, param: torch.Tensor) -> None:
    """A parameter's post-accumulate-grad hook: its owner's, if it still is (see ShardedOptimizer)."""
    optimizer = owner()
    if optimizer is not None and getattr(param, _OWNER, None) is owner:
        optimizer._produced(k, param)


def _buckets(members: list[tuple[int, torch.nn.Parameter]],
             bucket_bytes: int) -> list[list[tuple[int, torch.nn.Parameter]]]:
    """Consecutive runs of parameters of up to `bucket_bytes` (a larger parameter is a bucket of its own)."""
    buckets: list[list[tuple[int, torch.nn.Parameter]]] = [[]]
    size = 0
    for index, p in members:
        if buckets[-1] and size + p.numel() * p.element_size() > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append((index, p))
        size += p.numel() * p.element_size()
    return [b for b in buckets if b]


