"""A run's layout on a device mesh (torchtitan's ParallelDims): data-parallel replicate and shard
degrees and the tensor-parallel degree (layout.py, torch-free), the mesh built from them
(mesh.py) and the tensor-parallel plan of TinyGPT (tp.py)."""
