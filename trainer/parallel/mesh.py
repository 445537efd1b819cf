"""The device mesh of a layout: one torch DeviceMesh with dimensions (pp, dp_replicate, dp_shard,
tp), built only when the layout needs one (trainer.parallel.layout.Layout.needs_mesh)."""
from __future__ import annotations

from shardbench.trainer.parallel.layout import DIMS, Layout


def build_mesh(layout: Layout, device_type: str):
    """The world's DeviceMesh (gloo on CPU, NCCL on CUDA: the default group's backend); every
    rank calls it. Each dimension's process group is named after it for the collective counter."""
    from torch.distributed.device_mesh import init_device_mesh

    shape = (layout.pp, layout.dp_replicate, layout.dp_shard, layout.tp)
    mesh = init_device_mesh(device_type, shape, mesh_dim_names=DIMS)
    from shardbench.trainer.comm import COUNTER

    name_dims = getattr(COUNTER, "name_dims", None)
    if name_dims is not None:
        name_dims({name: mesh.get_group(name) for name in DIMS})
    return mesh


def dp_mesh(mesh, layout: Layout):
    """FSDP's part of the mesh: (dp_replicate, dp_shard) for HSDP (2-D: FSDP2 replicates over the
    first dimension and shards over the second, even a shard degree of 1; a 1-D mesh would be
    sharded over), else dp_shard."""
    return mesh["dp_replicate", "dp_shard"] if layout.dp_replicate > 1 else mesh["dp_shard"]
