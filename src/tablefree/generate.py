"""Text generation with a KV cache: greedy or sampled (temperature, top-k, top-p), streamed as text.

The model sees at most ``max_seq_len`` tokens, as in nanoGPT's ``generate``: the next token is predicted from the
last ``max_seq_len`` tokens. While everything fits, each new token costs one cached forward step; once the
window is full, the window is recomputed for every new token (positions restart at 0 in the window, which is
what the model was trained on), so cached and uncached generation give the same tokens.

Text is streamed by incremental detokenisation: a piece is released only once it decodes to complete
characters, so a multi-byte character split across byte-level tokens prints whole.

Python API: ``generate(model, tokenizer, GenerateSpec(prompt, ...))`` (text) and ``generate_tokens(model, ids, ...)`` (ids).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TextIO

import torch

from tablefree.data.tokenizer import eot_id
from tablefree.model import KVCache


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Set to -inf every logit outside the top-k and outside the nucleus of probability top_p (last dim)."""
    if top_k is not None and top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and 0.0 < top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the tokens ranked above it already reach top_p; the most likely is always kept.
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def next_token(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> int:
    """The next token from the last position's logits (V,): argmax when ``temperature == 0``, else a sample.

    Sampling runs in fp32 on the CPU with a CPU generator, so a seed gives the same draws on every device.
    """
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 is greedy decoding), got {temperature}")
    logits = logits.detach().float().cpu()
    if temperature == 0:
        return int(logits.argmax())
    probs = filter_logits(logits / temperature, top_k, top_p).softmax(-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def check_sampling(
    max_new_tokens: int, temperature: float, top_k: int | None = None, top_p: float | None = None
) -> None:
    """Refuse sampling settings that mean nothing, naming the option and the range it takes."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not temperature >= 0:  # also refuses NaN
        raise ValueError(f"temperature must be >= 0 (0 is greedy decoding), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must lie in (0, 1], got {top_p}")


@torch.no_grad()
def generate_tokens(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop_ids: Sequence[int] = (),
    use_cache: bool = True,
) -> Iterator[int]:
    """Yield up to ``max_new_tokens`` new token ids after ``prompt_ids`` (stops after a token in ``stop_ids``).

    ``use_cache=False`` recomputes the whole window for every token (the reference the cache is tested
    against).
    """
    if not prompt_ids:
        raise ValueError("prompt_ids is empty; start from at least one token (e.g. <|endoftext|>)")
    check_sampling(max_new_tokens, temperature, top_k, top_p)
    window = model.config.max_seq_len
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    ids = [int(t) for t in prompt_ids]
    cache: KVCache | None = None
    pending = ids[-window:]  # tokens not yet in the cache
    for _ in range(max_new_tokens):
        if cache is None or cache.length + len(pending) > window:
            cache = KVCache() if use_cache else None
            pending = ids[-window:]  # (re)compute the whole window from position 0
        logits = model(torch.tensor([pending], device=device), cache=cache)[0, -1]
        token = next_token(logits, temperature, top_k, top_p, generator)
        ids.append(token)
        pending = [token]
        yield token
        if token in stop_ids:
            return


class TextStream:
    """Incremental detokeniser: ``push(id)`` returns the newly completed text (possibly ""), ``flush()`` the
    rest. Decodes a short sliding span, so the cost per token stays constant (the TGI/vLLM scheme)."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0  # start of the span decoded for context
        self.read_offset = 0  # end of the text already returned

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, token: int) -> str:
        self.ids.append(int(token))
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        text = self._decode(self.ids[self.prefix_offset :])
        if len(text) > len(before) and not text.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return text[len(before) :]
        return ""

    def flush(self) -> str:
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        text = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(before) :]


@dataclass(frozen=True)
class GenerateSpec:
    """What to generate: ``prompt`` (text, or token ids; an empty one starts a new document at
    ``<|endoftext|>``), up to ``max_new_tokens``, greedy when ``temperature == 0`` (a negative one is refused),
    else sampled under ``top_k`` / ``top_p`` with ``seed``; ending at ``<|endoftext|>`` (``stop_at_eot``) or at
    the first of the ``stop`` strings, which is cut off, as lm-eval's ``until``. ``use_cache=False`` recomputes
    the window for every token. Checked when built (``check_sampling``)."""

    prompt: str | Sequence[int]
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: Sequence[str] = ()
    stop_at_eot: bool = True
    use_cache: bool = True

    def __post_init__(self) -> None:
        check_sampling(self.max_new_tokens, self.temperature, self.top_k, self.top_p)


def generate(
    model: torch.nn.Module,
    tokenizer,
    spec: GenerateSpec,
    *,
    stream: TextIO | Callable[[str], object] | None = None,
) -> str:
    """Continue ``spec.prompt`` and return the new text (without the prompt); ``GenerateSpec`` says how.

    ``tokenizer`` is a ``tokenizers.Tokenizer``. ``stream`` (a text file such as ``sys.stdout``, or a callable)
    receives the text as it is produced.
    """
    prompt, max_new_tokens, temperature, top_k, top_p = (
        spec.prompt,
        spec.max_new_tokens,
        spec.temperature,
        spec.top_k,
        spec.top_p,
    )
    seed, stop, stop_at_eot, use_cache = spec.seed, spec.stop, spec.stop_at_eot, spec.use_cache
    write = _writer(stream)
    eot = _eot_or_none(tokenizer)
    prompt_ids = list(tokenizer.encode(prompt).ids if isinstance(prompt, str) else prompt)
    if not prompt_ids:
        if eot is None:
            raise ValueError("empty prompt, and the tokenizer has no end-of-text token to start from")
        prompt_ids = [eot]
    stop_ids = (eot,) if stop_at_eot and eot is not None else ()
    detok = TextStream(tokenizer)
    text, emitted = "", 0
    for token in generate_tokens(
        model,
        prompt_ids,
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        stop_ids=stop_ids,
        use_cache=use_cache,
    ):
        text += detok.push(token)
        cut = _first_stop(text, stop)
        if cut is not None:
            text = text[:cut]
            break
        # Hold back a tail that could be the start of a stop string, so it is never printed.
        safe = len(text) - _stop_prefix_len(text, stop)
        if write and safe > emitted:
            write(text[emitted:safe])
            emitted = safe
    else:
        text += detok.flush()
        cut = _first_stop(text, stop)
        text = text if cut is None else text[:cut]
    if write and len(text) > emitted:
        write(text[emitted:])
    return text


def _eot_or_none(tokenizer) -> int | None:
    try:
        return eot_id(tokenizer)
    except ValueError:
        return None


def _first_stop(text: str, stop: Sequence[str]) -> int | None:
    positions = [text.find(s) for s in stop if s and s in text]
    return min(positions) if positions else None


def _stop_prefix_len(text: str, stop: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    longest = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if s.startswith(text[-n:]):
                longest = n
                break
    return longest


def _writer(stream: TextIO | Callable[[str], object] | None) -> Callable[[str], None] | None:
    if stream is None:
        return None
    if callable(stream):
        return stream  # type: ignore[return-value]

    def write(piece: str) -> None:
        stream.write(piece)
        stream.flush()

    return write


def print_stream(piece: str) -> None:
    """Write a piece of generated text to the terminal immediately."""
    sys.stdout.write(piece)
    sys.stdout.flush()
