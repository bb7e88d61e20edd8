"""The chunked next-token loss equals the loss of the whole logits tensor, in value and in gradients (fp32, bf16
under autocast and bf16 weights), and never holds the logits of all the tokens at once, forward or backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from tablefree import model as model_module
from tablefree.model import build_model, chunked_next_token_loss, next_token_loss
from tablefree.model_config import preset

B, T, D, V = 3, 20, 16, 97  # 60 tokens: chunks of 7 leave a short last chunk


def inputs(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(B, T, D, generator=generator).to(dtype).requires_grad_()
    weight = (torch.randn(V, D, generator=generator) * 0.5).to(dtype).requires_grad_()
    targets = torch.randint(0, V, (B, T), generator=generator)
    return hidden, weight, targets


def loss_and_grads(chunked: bool, dtype: torch.dtype, autocast: bool, reduction: str = "mean"):
    hidden, weight, targets = inputs(dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        if chunked:
            loss = chunked_next_token_loss(hidden, weight, targets, reduction, chunk_tokens=7)
        else:
            loss = next_token_loss(F.linear(hidden, weight), targets, reduction)
    # per-token losses: a different weight per token, so a token's loss landing in another's place shows
    (
        loss
        if reduction == "mean"
        else (loss * torch.linspace(0.5, 1.5, loss.numel()).view(loss.shape)).sum()
    ).backward()
    return loss.detach(), hidden.grad, weight.grad


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_chunked_loss_equals_the_whole_logits_loss_in_fp32(reduction) -> None:
    expected = loss_and_grads(False, torch.float32, False, reduction)
    found = loss_and_grads(True, torch.float32, False, reduction)
    assert found[0].shape == expected[0].shape
    for name, want, got in zip(("loss", "hidden grad", "weight grad"), expected, found, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, msg=name)
    assert expected[1].abs().max() > 0 and expected[2].abs().max() > 0


@pytest.mark.parametrize(
    ("dtype", "autocast"),
    [(torch.float32, True), (torch.bfloat16, False)],
    ids=["bf16-autocast", "bf16-weights"],  # fp32 weights, the head in bf16; bf16 weights (FSDP2's policy)
)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_chunked_loss_equals_the_whole_logits_loss_in_bf16(dtype, autocast, reduction) -> None:
    """Equal to bf16 rounding: the loss exactly (the same bf16 logits, the same fp32 cross-entropy), the
    gradients within 2^-6 of their largest element. The head's weight gradient is rounded to bf16 once per
    chunk rather than once, so it may stray further from the exact (fp64) gradient than the unchunked one
    does, but not by more than 3 times as far."""
    expected = loss_and_grads(False, dtype, autocast, reduction)
    found = loss_and_grads(True, dtype, autocast, reduction)
    exact = loss_and_grads(False, torch.float64, False, reduction)
    torch.testing.assert_close(found[0], expected[0], rtol=0, atol=0)
    for name, want, got, truth in zip(
        ("hidden grad", "weight grad"), expected[1:], found[1:], exact[1:], strict=True
    ):
        assert got.dtype == want.dtype, name
        scale = float(want.abs().max())
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=2**-6 * scale, msg=name)
        error, reference_error = ((g.double() - truth).abs().max() for g in (got, want))
        assert error <= 3 * reference_error + 1e-12 * scale, name


class LargestTensor(TorchDispatchMode):
    """The most elements any operation's output had, forward and backward."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        return out


@pytest.mark.parametrize("chunked", [True, False])
def test_no_tensor_holds_every_tokens_logits(chunked) -> None:
    """Forward and backward of the chunked loss make no tensor of B·T·V elements (the unchunked loss does: the
    check can fail)."""
    hidden, weight, targets = inputs()
    with LargestTensor() as tracker:
        if chunked:
            loss = chunked_next_token_loss(hidden, weight, targets, chunk_tokens=7)
        else:
            loss = next_token_loss(F.linear(hidden, weight), targets)
        loss.backward()
    if chunked:
        assert tracker.largest < B * T * V
        assert tracker.largest == max(7 * V, B * T * D, V * D)  # a chunk's logits; the inputs' gradients
    else:
        assert tracker.largest >= B * T * V


def test_the_model_trains_and_validates_on_the_chunked_loss(monkeypatch) -> None:
    """``model(ids, targets=...)`` is the chunked loss (several chunks here), equal to the loss of its logits
    with the same gradient for every parameter; ``reduction="none"`` gives the per-token losses."""
    config = preset("tiny", vocab_size=V, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_seq_len=T)
    model = build_model(config, seed=0)
    monkeypatch.setattr(model_module, "LOSS_CHUNK_BYTES", 4 * V * 16)  # 16 tokens a chunk: 4 chunks of 60
    assert model_module.loss_chunk_tokens(V) == 16
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(1))
    targets = ids.roll(-1, dims=1)
    model(ids, targets=targets).backward()
    chunked = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    next_token_loss(model(ids), targets).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(chunked[name], p.grad, rtol=1e-5, atol=1e-6, msg=name)
    with torch.no_grad():
        per_token = model(ids, targets=targets, reduction="none")
        torch.testing.assert_close(per_token, next_token_loss(model(ids), targets, reduction="none"))
    assert per_token.shape == (B, T)


def test_an_unknown_reduction_is_refused() -> None:
    hidden, weight, targets = inputs()
    with pytest.raises(ValueError, match=r"reduction: expected 'mean' or 'none', got 'sum'"):
        chunked_next_token_loss(hidden, weight, targets, "sum")
