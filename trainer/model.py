"""TinyGPT: a GPT-2 style causal language model in one file (after karpathy/nanoGPT).

Pre-LayerNorm blocks, GELU MLP, learned position embeddings, token embedding tied to the output
head (untied with ModelConfig.tie_embeddings False, as pipeline stages need it), attention
through `scaled_dot_product_attention` (flash / memory-efficient kernels on GPU).

Tensor-parallel ready (trainer/parallel.py): q, k and v are separate projections, so a column
plan shards each by heads (a fused qkv split by columns would hand one rank all of q and part of
k); attention takes its head count from the width it is given (a tensor-parallel rank sees
n_embd / tp of it, n_head / tp heads); the position embedding is a module called on the
positions, so a plan can shard its output by sequence. The separate projections are drawn as the
fused one was (one (3d, d) normal draw, split), so every strategy trains to the same losses as
before; checkpoints of the fused layout do not resume (presets.ModelConfig.attention).
"""
from __future__ import annotations

import math
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from shardbench.trainer.presets import PRESETS, ModelConfig  # noqa: F401 (re-exported)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.head_dim = cfg.n_embd // cfg.n_head
        self.q = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.k = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.v = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.q(x), self.k(x), self.v(x)
        width = q.size(-1)  # n_embd, or n_embd / tp on a tensor-parallel rank (its heads only)
        # (B, T, width) -> (B, heads here, T, head_dim)
        q, k, v = (t.view(B, T, width // self.head_dim, self.head_dim).transpose(1, 2) for t in (q, k, v))
        drop = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, width))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    def __init__(self, cfg: ModelConfig, activation_checkpointing: bool = False):
        super().__init__()
        self.cfg = cfg
        self.activation_checkpointing = activation_checkpointing
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight  # weight tying (GPT-2)
        self._init_weights()
        # GPT-2: scale residual projections by 1/sqrt(2 * n_layer) so deep stacks start stable.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    def _init_weights(self) -> None:
        """N(0, 0.02) weights and zero biases, drawn leaf by leaf in module order (as
        nn.Module.apply did for the fused model); q, k and v as one (3d, d) draw split in three,
        exactly the fused projection's weight, so the random stream and every value are the same."""
        done: set[int] = set()
        for module in self.modules():  # parents before their children
            if isinstance(module, CausalSelfAttention):
                fused = torch.empty(3 * module.q.out_features, module.q.in_features)
                nn.init.normal_(fused, mean=0.0, std=0.02)
                with torch.no_grad():
                    for part, rows in zip((module.q, module.k, module.v), fused.chunk(3)):
                        part.weight.copy_(rows)
                        nn.init.zeros_(part.bias)
                        done.add(id(part))
            elif id(module) in done:
                continue
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Tokens (B, T) -> logits (and the loss with targets). A pipeline stage (`stage()`) lacks
        the embeddings or the head: without wte it takes hidden states (B, T, d), without lm_head
        it returns them."""
        x = idx
        if self.wte is not None:
            T = idx.size(1)
            if T > self.cfg.block_size:
                raise ValueError(f"sequence length {T} exceeds block size {self.cfg.block_size}")
            # (T,) positions through the table: under sequence parallelism its output is sharded by
            # position and adds to this rank's part of the token embeddings.
            pos = torch.arange(T, device=idx.device)
            x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            if self.activation_checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        if self.lm_head is None:
            return x
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return logits, lm_loss(logits, targets)

    def stage(self, first: int, last: int, embed: bool, head: bool) -> TinyGPT:
        """A pipeline stage sharing this model's modules: blocks[first:last], the embeddings when
        `embed` (the first stage), the final LayerNorm and head when `head` (the last). Its
        attribute names are the model's, so the tensor-parallel plan and FSDP apply to it."""
        part = TinyGPT.__new__(TinyGPT)
        nn.Module.__init__(part)
        part.cfg, part.activation_checkpointing = self.cfg, self.activation_checkpointing
        part.wte, part.wpe, part.drop = (self.wte, self.wpe, self.drop) if embed else (None, None, None)  # type: ignore[assignment]
        part.blocks = nn.ModuleList(self.blocks[first:last])
        part.ln_f, part.lm_head = (self.ln_f, self.lm_head) if head else (None, None)  # type: ignore[assignment]
        return part


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in float32 (the model's and a pipeline's last stage's)."""
    return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def count_params(model: nn.Module) -> int:
    """Trainable parameters, each shared tensor once (the tied embedding is not counted twice)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def flops_params(cfg: ModelConfig) -> int:
    """N in 6N + 12LdT: every parameter except the position table (it does no matmul)."""
    return cfg.flops_params()


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token, PaLM appendix B (nanoGPT, torchtitan): 6N + 12 L d T."""
    return 6.0 * flops_params(cfg) + 12.0 * cfg.n_layer * cfg.n_embd * seq_len
