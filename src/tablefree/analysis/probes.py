"""Bit probes: how linearly readable the current token's code bits are from the residual state at each layer.

For every layer ℓ a linear probe (closed-form ridge on ±1 targets, the sign decides) is fitted on the states of
one part of the positions of held-out text and scored on another. A fixed-code model's layer 0 *is* the code,
so its probes read 100%; how fast accuracy falls with depth is how fast the network mixes the identity away.
The baseline is the constant probe that always predicts the fit set's majority value of a bit (a bit that is
nearly always 0 in real text, such as a high bit of frequent ids, has a baseline far above 50%).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from tablefree.analysis.linear import RidgeAccumulator
from tablefree.analysis.states import layer_states
from tablefree.codes import ids_to_bits, num_bits
from tablefree.model import TablefreeLM

DEFAULT_PROBE_RIDGE = 1e-3


@dataclass
class CodeSet:
    """A family of bits to probe: a name, what it is, and the function from ids (N,) to bits (N, K) in {0, 1}."""

    name: str
    description: str
    num_bits: int
    bits: Callable[[torch.Tensor], torch.Tensor]


def code_sets(model: TablefreeLM) -> list[CodeSet]:
    """The canonical bits of the token id (always), and the interface's own code bits when it has a code that
    differs from them (``affine``'s c' = A·c ⊕ b, or any interface exposing ``code_bits(ids)``)."""
    vocab_size = model.config.vocab_size
    k = num_bits(vocab_size)
    sets = [
        CodeSet(
            "canonical",
            f"the K = {k} bits of the token id (bit j = bit j of the integer id, LSB first)",
            k,
            lambda ids: ids_to_bits(ids, k, "lsb"),
        )
    ]
    own = interface_code_bits(model.input)
    if own is None:
        return sets
    every_id = torch.arange(vocab_size)
    own_bits = own(every_id)
    if _same_columns(own_bits, ids_to_bits(every_id, k, "lsb")):
        return sets  # the canonical bits, maybe reordered (canonical, msb order, a code under a projection)
    name = model.config.interface.name
    width = own_bits.shape[-1]
    sets.append(CodeSet("interface", f"the {name} interface's own {width}-bit code", width, own))
    return sets


def _same_columns(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two (V, K) bit matrices hold the same columns, in any order."""
    if a.shape != b.shape:
        return False
    return sorted(map(tuple, a.T.tolist())) == sorted(map(tuple, b.T.tolist()))


def interface_code_bits(interface: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """ids → the interface's own code bits (N, K'), or None for an interface without a binary code.

    An interface may define ``code_bits(ids)``; otherwise a fixed-code interface is read through its
    ``packed_code`` integers and ``bit_shifts`` (the code-vector bit j sits at integer bit ``bit_shifts[j]``)."""
    own = getattr(interface, "code_bits", None)
    if callable(own):
        return lambda ids: own(ids.to(_device(interface))).to("cpu", torch.int64)
    packed, shifts = getattr(interface, "packed_code", None), getattr(interface, "bit_shifts", None)
    if callable(packed) and isinstance(shifts, torch.Tensor):

        def bits(ids: torch.Tensor) -> torch.Tensor:
            code = packed(ids.to(shifts.device)).to(torch.int64)
            return ((code.unsqueeze(-1) >> shifts.to(torch.int64)) & 1).cpu()

        return bits
    return None


def _device(module: torch.nn.Module) -> torch.device:
    tensors = list(module.parameters()) + list(module.buffers())
    return tensors[0].device if tensors else torch.device("cpu")


def probe_code_bits(
    model: TablefreeLM,
    fit_windows: Iterable[torch.Tensor],
    score_windows: Iterable[torch.Tensor],
    ridge: float = DEFAULT_PROBE_RIDGE,
) -> dict[str, Any]:
    """Fit one linear probe per layer and bit on the positions of ``fit_windows`` (id tensors (B, T)), score it
    on those of ``score_windows``. Returns, per code set, accuracy[layer][bit], its mean and minimum per layer,
    and the majority baseline per bit; plus the number of fit and score positions."""
    sets = code_sets(model)
    device = next(model.parameters()).device
    layers = len(model.layers) + 1
    width = sum(s.num_bits for s in sets)
    accumulators = [RidgeAccumulator(model.config.d_model, width) for _ in range(layers)]
    for ids in fit_windows:
        targets = _targets(sets, ids)
        for layer, state in enumerate(layer_states(model, ids.to(device))):
            accumulators[layer].add(state.reshape(-1, state.shape[-1]), 2.0 * targets - 1.0)
    if accumulators[0].n == 0:
        raise ValueError("the bit probes got no positions to fit on")
    probes = [accumulator.solve(ridge) for accumulator in accumulators]
    majority = accumulators[0].sum_y >= 0  # the constant probe: each bit's more common value in the fit set
    correct = torch.zeros(layers, width, dtype=torch.float64)
    baseline = torch.zeros(width, dtype=torch.float64)
    scored = 0
    for ids in score_windows:
        truth = _targets(sets, ids).bool()
        for layer, state in enumerate(layer_states(model, ids.to(device))):
            predicted = probes[layer].predict(state.reshape(-1, state.shape[-1]).cpu()) >= 0
            correct[layer] += (predicted == truth).sum(0)
        baseline += (majority == truth).sum(0)
        scored += truth.shape[0]
    if scored == 0:
        raise ValueError("the bit probes got no positions to score on")
    accuracy, baseline = correct / scored, baseline / scored
    result: dict[str, Any] = {"positions": {"fit": accumulators[0].n, "score": scored}, "ridge": ridge}
    result["code_sets"] = _split_by_set(sets, accuracy, baseline)
    return result


def _targets(sets: list[CodeSet], ids: torch.Tensor) -> torch.Tensor:
    flat = ids.reshape(-1).to("cpu", torch.int64)
    return torch.cat([s.bits(flat).to(torch.float64) for s in sets], dim=1)


def _split_by_set(sets: list[CodeSet], accuracy: torch.Tensor, baseline: torch.Tensor) -> dict[str, Any]:
    out, start = {}, 0
    for code_set in sets:
        part = slice(start, start + code_set.num_bits)
        start += code_set.num_bits
        acc = accuracy[:, part]
        out[code_set.name] = {
            "description": code_set.description,
            "bits": code_set.num_bits,
            "accuracy": acc.tolist(),
            "mean_accuracy": acc.mean(1).tolist(),
            "min_accuracy": acc.min(1).values.tolist(),
            "majority_baseline": baseline[part].tolist(),
            "mean_majority_baseline": float(baseline[part].mean()),
        }
    return out
