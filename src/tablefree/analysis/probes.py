"""Bit probes: how readable the current token's code bits are from the residual state at each layer.

For every layer ℓ a probe is fitted on the states of some positions of held-out text and scored on others:
the **linear probe** (closed-form ridge on ±1 targets, the sign decides), and on request the **MLP probe** (one
hidden ReLU layer, ``mlp.fit_mlp``), which can read an XOR of code bits where a linear probe cannot by
construction. The default split is **type-disjoint**: the probe is fitted on the positions whose token type
lies in one half of the vocabulary (a fixed random half) and scored on the positions of the other half, so a
probe that only memorised which type carries which bits scores at chance; with ``split="positions"`` the fit
and score positions may share types (that probe can read a table lookup).

A probe means something only next to its **controls** (``run.controlled_probes`` adds them, for either kind):
the same probe on the untrained model of the same interface and seed (a fixed code is read at 100% before any
training: the residual path carries it), and random per-type labels (``random_labels``), which show what
memorising types alone gives. Selectivity = accuracy − the untrained model's accuracy. The constant probe
(each bit's majority value in the fit positions) is reported too: a skewed bit has a baseline far above 50%.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from tablefree.analysis.linear import RidgeAccumulator
from tablefree.analysis.mlp import MLPProbeSettings, fit_mlp
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


SPLITS = ("types", "positions")
TYPE_SPLIT_SEED = 0


def random_labels(vocab_size: int, bits: int, seed: int = 0) -> CodeSet:
    """A control code: ``bits`` random labels per token type (fixed by ``seed``), the same for every model."""
    table = torch.randint(0, 2, (vocab_size, bits), generator=torch.Generator().manual_seed(seed))
    return CodeSet(
        "random labels", f"{bits} random bits per token type (control)", bits, lambda ids: table[ids]
    )


def fit_types(vocab_size: int, seed: int = TYPE_SPLIT_SEED) -> torch.Tensor:
    """(V,) bool: the token types the type-disjoint probes are fitted on (a fixed random half); the rest score."""
    order = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(seed))
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[order[: vocab_size // 2]] = True
    return mask


PROBE_KINDS = ("linear", "mlp")


def probe_code_bits(
    model: TablefreeLM,
    fit_windows: Iterable[torch.Tensor],
    score_windows: Iterable[torch.Tensor],
    ridge: float = DEFAULT_PROBE_RIDGE,
    split: str = "types",
    sets: list[CodeSet] | None = None,
    kind: str = "linear",
    mlp: MLPProbeSettings | None = None,
) -> dict[str, Any]:
    """Fit one probe per layer on the positions of ``fit_windows`` (id tensors (B, T)), score it on those of
    ``score_windows``; with ``split="types"`` only positions of the fit half of the token types (``fit_types``)
    fit and only those of the other half score (the same windows may then be passed as both).

    ``kind="linear"``: ridge (``ridge``) per bit, from streamed statistics (O(d²) memory). ``kind="mlp"``: one
    small MLP (``mlp``, default ``MLPProbeSettings()``) per layer and code set, reading the set's bits jointly;
    it keeps the fit positions' states in memory ((L + 1)·positions·d floats) and trains on the model's device.
    ``sets``: the code sets to probe (default ``code_sets(model)``). Returns, per code set, accuracy[layer][bit],
    its mean and minimum per layer, and the majority baseline per bit; the probe, the split and the number of
    fit and score positions and types."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if kind not in PROBE_KINDS:
        raise ValueError(f"probe kind must be one of {PROBE_KINDS}, got {kind!r}")
    sets = code_sets(model) if sets is None else sets
    vocab_size = model.config.vocab_size
    fit_mask = fit_types(vocab_size) if split == "types" else torch.ones(vocab_size, dtype=torch.bool)
    score_mask = ~fit_mask if split == "types" else fit_mask
    seen = {
        "fit": torch.zeros(vocab_size, dtype=torch.bool),
        "score": torch.zeros(vocab_size, dtype=torch.bool),
    }
    device = next(model.parameters()).device
    layers = len(model.layers) + 1
    width = sum(s.num_bits for s in sets)
    settings = (mlp or MLPProbeSettings()) if kind == "mlp" else None
    fitters: list[_LinearFit | _MLPFit] = [
        _LinearFit(model.config.d_model, width, ridge)
        if settings is None
        else _MLPFit(sets, settings, device)
        for _ in range(layers)
    ]
    positives = torch.zeros(width, dtype=torch.float64)
    fitted = 0
    for ids in fit_windows:
        keep = fit_mask[ids.reshape(-1)]
        seen["fit"][ids.reshape(-1)[keep]] = True
        targets = _targets(sets, ids)[keep]
        positives += targets.sum(0)
        fitted += targets.shape[0]
        for layer, state in enumerate(layer_states(model, ids.to(device))):
            fitters[layer].add(state.reshape(-1, state.shape[-1])[keep.to(state.device)], targets)
    if fitted == 0:
        raise ValueError("the bit probes got no positions to fit on")
    readers = [fitter.fit() for fitter in fitters]
    majority = 2 * positives >= fitted  # the constant probe: each bit's more common value in the fit set
    correct = torch.zeros(layers, width, dtype=torch.float64)
    baseline = torch.zeros(width, dtype=torch.float64)
    scored = 0
    for ids in score_windows:
        keep = score_mask[ids.reshape(-1)]
        seen["score"][ids.reshape(-1)[keep]] = True
        truth = _targets(sets, ids)[keep].bool()
        for layer, state in enumerate(layer_states(model, ids.to(device))):
            rows = state.reshape(-1, state.shape[-1])[keep.to(state.device)]
            correct[layer] += (readers[layer](rows) == truth).sum(0)
        baseline += (majority == truth).sum(0)
        scored += truth.shape[0]
    if scored == 0:
        raise ValueError("the bit probes got no positions to score on")
    accuracy, baseline = correct / scored, baseline / scored
    result: dict[str, Any] = {
        "probe": kind,
        "split": split,
        "positions": {"fit": fitted, "score": scored},
        "types": {"fit": int(seen["fit"].sum()), "score": int(seen["score"].sum())},
        "shared_types": int((seen["fit"] & seen["score"]).sum()),
    }
    if settings is None:
        result["ridge"] = ridge
    else:
        result["mlp"] = settings.record()
    result["code_sets"] = _split_by_set(sets, accuracy, baseline)
    return result


class _LinearFit:
    """Ridge per bit on ±1 targets, from streamed sufficient statistics; the sign decides."""

    def __init__(self, features: int, width: int, ridge: float) -> None:
        self.accumulator, self.ridge = RidgeAccumulator(features, width), ridge

    def add(self, rows: torch.Tensor, targets: torch.Tensor) -> None:
        self.accumulator.add(rows, 2.0 * targets - 1.0)

    def fit(self) -> Callable[[torch.Tensor], torch.Tensor]:
        probe = self.accumulator.solve(self.ridge)
        return lambda rows: probe.predict(rows.cpu()) >= 0


class _MLPFit:
    """The fit rows kept (in float32 on the CPU), then one MLP per code set, so that a set's probe reads only
    that set's bits."""

    def __init__(self, sets: list[CodeSet], settings: MLPProbeSettings, device: torch.device) -> None:
        self.sets, self.settings, self.device = sets, settings, device
        self.rows: list[torch.Tensor] = []
        self.targets: list[torch.Tensor] = []

    def add(self, rows: torch.Tensor, targets: torch.Tensor) -> None:
        self.rows.append(rows.detach().to("cpu", torch.float32))
        self.targets.append(targets)

    def fit(self) -> Callable[[torch.Tensor], torch.Tensor]:
        x, y = torch.cat(self.rows), torch.cat(self.targets)
        self.rows, self.targets = [], []  # the fits keep what they need
        probes, start = [], 0
        for code_set in self.sets:
            part = y[:, start : start + code_set.num_bits]
            start += code_set.num_bits
            probes.append(fit_mlp(x, part, self.settings, self.device))
        return lambda rows: torch.cat([probe.predict(rows) for probe in probes], dim=1)


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
