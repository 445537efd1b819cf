"""Deterministic synthetic tokens: the same tokens for every global step, whatever the strategy
or world size, so that losses can be compared step by step.

Row g of global step s depends only on (seed, s, g), so each rank generates only its own rows
(generation cost does not grow with the world size). Rows are keyed by the data-parallel rank,
not the global one: data-parallel rank r of D (world / tp) takes, at micro-step m, global rows
[(m * D + r) * micro_batch, ... + micro_batch), and the ranks of one tensor-parallel group take
the same rows. Every row is used exactly once per step, and the step's mean loss is the same
however the rows are split. Without tensor parallelism D is the world size and r the rank.

Tokens follow a skewed (Zipf-like) unigram distribution and repeat the previous token 30% of
the time, so the model has something to learn within tens of steps and the loss falls (uniform
noise would sit at ln(V) for ever and hide a broken optimizer step).
"""
from __future__ import annotations

import torch

_MASK = (1 << 63) - 1


def row_tokens(seed: int, step: int, row: int, seq_len: int, vocab: int) -> torch.Tensor:
    """(seq_len + 1,) int64 tokens of global row `row` of global step `step`."""
    gen = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 1_000_000_007 + row) & _MASK)
    skewed = (torch.rand(seq_len + 1, generator=gen) ** 4 * vocab).long().clamp_(max=vocab - 1)
    repeat = torch.rand(seq_len, generator=gen) < 0.3
    tokens = skewed.clone()
    tokens[1:] = torch.where(repeat, skewed[:-1], skewed[1:])
    return tokens


class SyntheticBatches:
    """Yields this rank's (inputs, targets) micro-batches, on the CPU; the trainer copies them."""

    def __init__(self, seed: int, seq_len: int, vocab: int, micro_batch: int, grad_accum: int,
                 rank: int, world_size: int, pin_memory: bool = False):
        """rank, world_size: the data-parallel rank and degree (trainer.parallel.layout.Layout)."""
        self.seed, self.seq_len, self.vocab = seed, seq_len, vocab
        self.micro_batch, self.grad_accum = micro_batch, grad_accum
        self.rank, self.world_size = rank, world_size
        self.pin_memory = pin_memory

    def step_batches(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's grad_accum micro-batches for global step `step` (only its own rows)."""
        out = []
        for micro in range(self.grad_accum):
            first = (micro * self.world_size + self.rank) * self.micro_batch
            rows = torch.stack([row_tokens(self.seed, step, first + i, self.seq_len, self.vocab)
                                for i in range(self.micro_batch)])
            x, y = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
            if self.pin_memory:
                x, y = x.pin_memory(), y.pin_memory()
            out.append((x, y))
        return out
