"""Model shapes: the TinyGPT configuration and its named presets. No torch import, so argument
checks and the matrix expander can read them cheaply."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelConfig:
    n_layer: int = 12
    """Transformer blocks."""
    n_head: int = 12
    """Attention heads per block; must divide n_embd."""
    n_embd: int = 768
    """Model width d."""
    vocab_size: int = 50257
    """Token vocabulary (GPT-2's BPE size)."""
    block_size: int = 2048
    """Longest sequence the position table holds: the run's seq len may not exceed it."""
    default_seq_len: int = 1024
    """Sequence length used when the run does not give one."""
    dropout: float = 0.0
    """Off by default: benchmarks compare deterministic work."""
    attention: str = "q,k,v"
    """How attention's input projections are stored: separate q, k, v (tensor-parallel ready).
    Part of a checkpoint's resume key, so a checkpoint of the earlier fused `qkv` layout (whose key
    lacks it) is refused in one line instead of failing on missing state-dict keys."""
    tie_embeddings: bool = True
    """The output head shares the token embedding's weight (GPT-2). Untied (--no-tie-embeddings):
    the head has a weight of its own, drawn from the same random stream after the rest; pipeline
    parallelism needs it (the two uses sit on the first and last stage)."""

    def flops_params(self) -> int:
        """N in 6N + 12LdT: every parameter except the position table (it does no matmul); untied,
        the head's V x d counts (a matmul), the token embedding not (a lookup): the same N."""
        d, L, V = self.n_embd, self.n_layer, self.vocab_size
        # qkv, attention proj, mlp fc, mlp proj (weights + biases), two LayerNorms
        per_block = (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d) + 4 * d
        return V * d + L * per_block + 2 * d

    def n_params(self) -> int:
        """Every trainable parameter (the tied embedding once), without building the model."""
        head = 0 if self.tie_embeddings else self.vocab_size * self.n_embd  # untied: the head's own weight
        return self.flops_params() + self.block_size * self.n_embd + head


PRESETS: dict[str, ModelConfig] = {
    # A few million parameters: CPU tests and the embedded default matrix.
    "tiny": ModelConfig(n_layer=2, n_head=4, n_embd=128, vocab_size=16384, block_size=256, default_seq_len=128),
    # The seed's TinyGPT (GPT-2 small class, 124M with the 1024-position table, ~125M at 2048).
    "gpt2-124m": ModelConfig(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, block_size=2048,
                             default_seq_len=1024),
    "gpt2-350m": ModelConfig(n_layer=24, n_head=16, n_embd=1024, vocab_size=50257, block_size=2048,
                             default_seq_len=1024),
    "gpt2-1.3b": ModelConfig(n_layer=24, n_head=32, n_embd=2048, vocab_size=50257, block_size=2048,
                             default_seq_len=2048),
    # The 7B LLaMA's shape (32 x 4096, 32 heads) in this GPT-2 architecture: a memory stress case.
    "llama-7b-shape": ModelConfig(n_layer=32, n_head=32, n_embd=4096, vocab_size=32000, block_size=4096,
                                  default_seq_len=2048),
}
