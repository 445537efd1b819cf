"""The planner: memory per rank by category, collectives per step and step time for any
strategy, model, shape and GPU count, before a run is launched (docs/planner.md).

Torch-free at import (the TUI and the matrix read it at start-up); the trace (fake tensors and
a fake process group) lives in trainer/plan/trace.py and is imported only when a plan is made.
"""
