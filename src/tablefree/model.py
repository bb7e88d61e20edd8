"""A decoder-only Llama-style transformer whose input interface comes from the registry.

Pre-norm blocks (RMSNorm or LayerNorm), rotary position embeddings in Hugging Face Llama's rotate-half
convention, SwiGLU (or GELU) MLP, optional grouped-query attention, no biases, causal attention through
``scaled_dot_product_attention``, and an untied output head. The model knows nothing of parallelism
(see ``tablefree.train.parallelize``) and nothing of the input interface beyond its contract
(``tablefree.interfaces.base.InputInterface``).

Initialisation follows Hugging Face's Llama / SmolLM2 recipe: every Linear and embedding weight is drawn from
N(0, init_std=0.02), norm gains are 1, unless the input interface initialises its own parameter
(``InputInterface.init_parameter``, e.g. ``projected``'s ``init: lift``). Each tensor is drawn from its own
generator seeded by (seed, parameter name), so the backbone of a ``learned`` model and of a fixed-code model get
identical weights for one seed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from tablefree.interfaces import build_interface
from tablefree.model_config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # As in HF Llama: normalise in fp32, scale in the input dtype.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def build_norm(config: ModelConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return RMSNorm(config.d_model, config.norm_eps)
    return nn.LayerNorm(config.d_model, eps=config.norm_eps, bias=False)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape positions.shape + (head_dim,), computed in fp32 (HF Llama's default RoPE)."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.int64).float() / head_dim)
    )
    freqs = positions.float().unsqueeze(-1) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, hd); cos/sin: (T, hd) or (B, T, hd)."""
    if cos.dim() == 3:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos.to(x.dtype)) + (rotated * sin.to(x.dtype))


@dataclass
class KVCache:
    """Keys and values of the tokens seen so far, one (k, v) pair per layer; grows by concatenation."""

    layers: list[tuple[torch.Tensor, torch.Tensor] | None] = field(default_factory=list)

    @property
    def length(self) -> int:
        first = self.layers[0] if self.layers else None
        return 0 if first is None else first[0].shape[2]

    def update(self, index: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        while len(self.layers) <= index:
            self.layers.append(None)
        previous = self.layers[index]
        if previous is not None:
            k = torch.cat((previous[0], k), dim=2)
            v = torch.cat((previous[1], v), dim=2)
        self.layers[index] = (k, v)
        return k, v


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        self.index = index
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        self.wq = nn.Linear(config.d_model, config.n_heads * config.head_dim, bias=False)
        self.wk = nn.Linear(config.d_model, config.n_kv_heads * config.head_dim, bias=False)
        self.wv = nn.Linear(config.d_model, config.n_kv_heads * config.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * config.head_dim, config.d_model, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        cache: KVCache | None,
        outputs: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``outputs`` (B, Q): compute the output only at these positions of x (keys and values still come
        from every position); the result is then (B, Q, d)."""
        B, T, _ = x.shape
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        k = apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(self.index, k, v)
        if outputs is not None:
            x, cos, sin, mask = _output_rows(x, cos, sin, mask, outputs, k.shape[2] - T)
        Q = x.shape[1]
        q = apply_rope(self.wq(x).view(B, Q, self.n_heads, self.head_dim).transpose(1, 2), cos, sin)
        if self.n_kv_heads != self.n_heads:  # GQA: kv head i serves query heads i*r .. i*r+r-1 (HF repeat_kv)
            repeats = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(y.transpose(1, 2).reshape(B, Q, -1))


def _output_rows(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mask: torch.Tensor | None,
    outputs: torch.Tensor,
    start: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, cos, sin and the attention mask at the output positions (B, Q) only; a causal default (mask None)
    becomes an explicit mask over the ``start`` cached keys and the T new ones."""
    B, T = x.shape[:2]
    x = gather_rows(x, outputs)
    if cos.dim() == 2:
        cos, sin = cos[outputs], sin[outputs]
    else:
        cos, sin = gather_rows(cos, outputs), gather_rows(sin, outputs)
    if mask is None:
        keys = torch.arange(start + T, device=x.device)
        return x, cos, sin, (keys <= (outputs + start).unsqueeze(-1)).unsqueeze(1)
    mask = mask.expand(B, 1, T, start + T)
    index = outputs.view(B, 1, -1, 1).expand(B, 1, outputs.shape[1], start + T)
    return x, cos, sin, mask.gather(2, index)


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x[b, index[b, q]] for x (B, T, ...) and index (B, Q): the result is (B, Q, ...)."""
    return x[torch.arange(x.shape[0], device=x.device).unsqueeze(1), index]


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gated = config.mlp == "swiglu"
        self.w1 = nn.Linear(config.d_model, config.d_ff, bias=False)  # gate (swiglu) or up (gelu)
        self.w2 = nn.Linear(config.d_ff, config.d_model, bias=False)  # down
        self.w3 = nn.Linear(config.d_model, config.d_ff, bias=False) if self.gated else None  # up (swiglu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        self.attn_norm = build_norm(config)
        self.attn = Attention(config, index)
        self.mlp_norm = build_norm(config)
        self.mlp = MLP(config)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        cache: KVCache | None,
        outputs: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``outputs`` (B, Q): the block's output at these positions only, (B, Q, d)."""
        update = self.attn(self.attn_norm(x), cos, sin, mask, cache, outputs)
        x = (x if outputs is None else gather_rows(x, outputs)) + update
        return x + self.mlp(self.mlp_norm(x))


class TablefreeLM(nn.Module):
    """The decoder-only LM: ``config.interface`` turns token ids into d_model vectors (a trainable table only for
    ``learned``), then pre-norm blocks with RoPE attention and a linear head; ``forward(ids)`` returns logits
    (batch, T, vocab_size), ``loss(inputs, targets)`` the mean next-token cross-entropy. Build one with
    ``tablefree.build_model(config, seed)``; load a trained one with ``tablefree.load_model(run_dir)``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.input = build_interface(config.interface, config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = build_norm(config)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        *,
        targets: torch.Tensor | None = None,
        reduction: str = "mean",
    ) -> torch.Tensor:
        """Logits (B, T, V) for token ids (B, T); given ``targets`` (B, T), the next-token loss instead
        (``chunked_next_token_loss``: the mean, or per token with ``reduction="none"``), computed without ever
        holding the logits of all the tokens at once. The loss is asked of ``forward`` so that wrappers that
        act around it (DDP, FSDP2) see the head used.

        ``positions`` (T,) or (B, T) default to ``cache.length + arange(T)``. ``mask`` is an optional boolean
        attention mask broadcastable to (B, 1, T, T_keys), True where attention is allowed; without it,
        attention is causal (over the cached prefix too, when a cache is given).
        """
        hidden = self.hidden(ids, positions, mask, cache)
        if targets is not None:
            return chunked_next_token_loss(hidden, self.head.weight, targets, reduction)
        return self.head(hidden)

    def hidden(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        outputs: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The final-norm hidden states (B, T, d) that ``head`` turns into logits; arguments as ``forward``.

        ``outputs`` (B, Q) asks for the states at these positions only (B, Q, d): the last block then computes
        its queries, attention output and MLP only there (its keys and values still cover every position),
        and scoring applies the head only where it reads log-probs."""
        T = ids.shape[1]
        start = cache.length if cache is not None else 0
        if positions is None:
            positions = torch.arange(start, start + T, device=ids.device)
        if mask is None and start > 0:  # causal over the cached prefix plus the new tokens
            keys = torch.arange(start + T, device=ids.device)
            mask = keys.unsqueeze(0) <= (keys[start:].unsqueeze(1))
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta)
        x = self.input(ids)
        if x.dtype != self.head.weight.dtype:  # fixed codes come out in the default dtype
            x = x.to(self.head.weight.dtype)
        for index, block in enumerate(self.layers):
            x = block(x, cos, sin, mask, cache, outputs if index == len(self.layers) - 1 else None)
        if outputs is not None and not self.layers:  # no last block to select them
            x = gather_rows(x, outputs)
        return self.norm(x)

    def loss(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy, computed in fp32 chunk by chunk (``chunked_next_token_loss``)."""
        return self(ids, targets=targets)

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """N(0, init_std) for every matrix parameter, ones for norm gains; one generator per (seed, name).

        Only parameters are initialised here: an interface's buffers are its fixed state, which it computes
        itself from its options (``reset_fixed_state``)."""
        self.input.reset_fixed_state()
        for name, tensor in self.named_parameters():
            if tensor.device.type != "meta":
                self.init_tensor(name, tensor, seed)

    @torch.no_grad()
    def init_tensor(self, name: str, tensor: torch.Tensor, seed: int = 0) -> None:
        """Initialise the full tensor of parameter ``name`` in place, as ``init_weights`` does: a sharded
        (meta-device) build initialises each full tensor with this and keeps its shard, so it gets the same
        weights as an unsharded build."""
        if name.startswith("input.") and self.input.init_parameter(name.removeprefix("input."), tensor):
            return
        if name.endswith("norm.weight"):
            tensor.fill_(1.0)
        elif tensor.dim() == 2 and tensor.is_floating_point():
            generator = torch.Generator(device=tensor.device).manual_seed(_name_seed(seed, name))
            tensor.normal_(0.0, self.config.init_std, generator=generator)


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy in fp32 of logits (B, T, V) already computed, for targets (B, T): what
    ``chunked_next_token_loss`` computes without the whole (B, T, V) tensor, kept as its definition.

    ``reduction="mean"`` over all tokens; ``"none"`` gives the per-token losses (B, T).
    """
    losses = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction=reduction
    )
    return losses if reduction != "none" else losses.view(targets.shape)


# The fp32 logits of one chunk of tokens are at most this large: at V = 49,152, 1,365 tokens (of the 16,384 of
# a micro-batch of 8 × 2048) instead of 3.2 GB for the whole micro-batch, and as much again for their gradient.
LOSS_CHUNK_BYTES = 256 * 2**20


def loss_chunk_tokens(vocab_size: int) -> int:
    """How many tokens' logits one chunk of the loss holds (``LOSS_CHUNK_BYTES`` of fp32 logits)."""
    return max(1, LOSS_CHUNK_BYTES // (4 * vocab_size))


def chunked_next_token_loss(
    hidden: torch.Tensor,
    head_weight: torch.Tensor,
    targets: torch.Tensor,
    reduction: str = "mean",
    chunk_tokens: int | None = None,
) -> torch.Tensor:
    """The model's loss: next-token cross-entropy in fp32 of the logits ``hidden @ head_weight.T``, for final
    hidden states (B, T, d) and targets (B, T), equal to ``next_token_loss(head(hidden), targets)``, computed
    ``chunk_tokens`` tokens at a time (default ``loss_chunk_tokens(V)``) so that the fp32 logits of the whole
    batch never exist, forward or backward: each chunk's head matmul and cross-entropy run under
    ``torch.utils.checkpoint``, which keeps only the chunk's inputs and recomputes its logits in the backward
    pass. Under autocast the head matmul runs in its dtype, as the unchunked head does.

    ``reduction="mean"`` over all tokens (training); ``"none"`` gives the per-token losses (B, T), which
    validation averages per window. Training and validation use this one function.
    """
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction: expected 'mean' or 'none', got {reduction!r}")
    chunk = chunk_tokens or loss_chunk_tokens(head_weight.shape[0])
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_targets = targets.reshape(-1)
    keep_graph = torch.is_grad_enabled() and (hidden.requires_grad or head_weight.requires_grad)
    pieces = []
    # split, not slicing: the backward gathers the chunks' gradients into one (N, d) tensor once
    for part, part_targets in zip(flat_hidden.split(chunk), flat_targets.split(chunk), strict=True):
        if keep_graph:
            pieces.append(checkpoint(_chunk_losses, part, head_weight, part_targets, use_reentrant=False))
        else:
            pieces.append(_chunk_losses(part, head_weight, part_targets))
    losses = torch.cat(pieces)
    return losses.mean() if reduction == "mean" else losses.view(targets.shape)


def _chunk_losses(hidden: torch.Tensor, head_weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.linear(hidden, head_weight).float(), targets, reduction="none")


def _name_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


def build_model(config: ModelConfig, seed: int = 0, device: torch.device | str | None = None) -> TablefreeLM:
    """Build and initialise a model (on ``device``; "meta" builds it without allocating memory).

    Interface seeds left to the training seed (``seed: null``) are set to ``seed``; ``model.config``
    holds the resolved config."""
    config = config.resolve_seed(seed)
    with torch.device(device or "cpu"):
        model = TablefreeLM(config)
    model.init_weights(seed)
    return model
