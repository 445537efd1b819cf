"""The device mesh of a layout: one torch DeviceMesh with dimensions (dp_replicate, dp_shard,
tp), built only when the layout needs one (trainer.parallel.layout.Layout.needs_mesh)."""
from __future__ import annotations

from shardbench.trainer.parallel.layout import DIMS, Layout


def build_mesh(layout: Layout, device_type: str):
    """The world's DeviceMesh (gloo on CPU, NCCL on CUDA: the default group's backend); every
    rank calls it. Each dimension's process group is named after it for the collective counter."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, (layout.dp_replicate, layout.dp_shard, layout.tp), mesh_dim_names=DIMS)
    from shardbench.trainer.comm import COUNTER

    name_dims = getattr(COUNTER, "name_dims", None)
    if name_dims is not None:
        name_dims({name: mesh.get_group(name) for name in DIMS})
    return mesh


def dp_mesh(mesh, layout: Layout):
    """The data-parallel part of the mesh: (dp_replicate, dp_shard) for HSDP, else the one
    data-parallel dimension that has ranks."""
    if layout.dp_replicate > 1 and layout.dp_shard > 1:
        return mesh["dp_replicate", "dp_shard"]
    return mesh["dp_replicate"] if layout.dp_replicate > 1 else mesh["dp_shard"]
