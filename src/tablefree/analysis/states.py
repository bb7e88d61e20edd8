"""Residual states of a model, layer by layer: ℓ = 0 is the input interface's output, ℓ = i the state after
block i (before the final norm). Read through forward hooks, so the model's own ``hidden`` runs unchanged."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from tablefree.model import TablefreeLM


def layer_names(model: TablefreeLM) -> list[str]:
    """``["interface", "block 1", ..., "block L"]``: what layer index ℓ holds."""
    return ["interface"] + [f"block {i + 1}" for i in range(len(model.layers))]


@contextlib.contextmanager
def captured_layers(model: TablefreeLM) -> Iterator[list[torch.Tensor]]:
    """While active, every forward pass appends the interface output and each block's output to the list."""
    captured: list[torch.Tensor] = []

    def keep(_module: torch.nn.Module, _inputs: object, output: torch.Tensor) -> None:
        captured.append(output.detach())

    modules = [model.input, *model.layers]
    handles = [module.register_forward_hook(keep) for module in modules]
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


@torch.inference_mode()
def layer_states(model: TablefreeLM, ids: torch.Tensor) -> list[torch.Tensor]:
    """The L + 1 residual states (B, T, d), in float32, for token ids (B, T) under causal attention."""
    with captured_layers(model) as captured:
        model.hidden(ids)
    expected = len(model.layers) + 1
    if (
        len(captured) != expected
    ):  # a block called twice, or a module replaced: the layers would be mislabelled
        raise RuntimeError(f"captured {len(captured)} layer outputs, expected {expected}")
    return [state.float() for state in captured]


@torch.inference_mode()
def effective_embeddings(
    model: TablefreeLM, ids: torch.Tensor | None = None, batch_size: int = 1024
) -> list[torch.Tensor]:
    """E_ℓ(t) for every id t in ``ids`` (default: all of [0, V)): the state after layer ℓ when the input is
    token t alone (position 0).

    Returns L + 1 tensors (len(ids), d) in float32 on the CPU, row i for ids[i]; ℓ = 0 is the interface output
    (for ``learned``, its table). Memory: (L + 1)·len(ids)·d floats.
    """
    device = next(model.parameters()).device
    ids = torch.arange(model.config.vocab_size) if ids is None else ids.reshape(-1).to(torch.int64)
    parts: list[list[torch.Tensor]] = [[] for _ in range(len(model.layers) + 1)]
    for batch in torch.split(ids, batch_size):
        for layer, state in enumerate(layer_states(model, batch.to(device).unsqueeze(1))):
            parts[layer].append(state[:, 0].cpu())
    return [torch.cat(chunks) for chunks in parts]
