"""Generation: the KV cache changes nothing but the cost; sampling controls; streaming whole characters."""

from __future__ import annotations

import io

import pytest
import torch

from interop_support import make_checkpoint, make_tokenizer
from tablefree.cli import main
from tablefree.data.tokenizer import load_tokenizer
from tablefree.generate import GenerateSpec, TextStream, filter_logits, generate, generate_tokens
from tablefree.model_config import ModelConfig

CONFIG = ModelConfig(vocab_size=320, d_model=48, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96, max_seq_len=24)


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json", vocab_size=320)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tokenizer_path):
    directory = tmp_path_factory.mktemp("ck") / "ck"
    make_checkpoint(directory, CONFIG, tokenizer_path, seed=3)
    return directory


@pytest.fixture(scope="module")
def model(checkpoint):
    from tablefree.checkpoint.model_dir import load_model

    return load_model(checkpoint)[0]


def reference_greedy(model, ids: list[int], steps: int) -> list[int]:
    """Greedy decoding by a full forward pass over the last max_seq_len tokens at every step."""
    ids = list(ids)
    window = model.config.max_seq_len
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids[-window:]]))[0, -1].argmax()))
    return ids[-steps:]


class CountingModel(torch.nn.Module):
    """Wraps a model and counts the token positions it is run on."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config, self.positions = model, model.config, 0

    def forward(self, ids, **kwargs):
        self.positions += ids.numel()
        return self.model(ids, **kwargs)


@pytest.mark.parametrize("prompt_len", [5, 20])  # 20 + 30 new tokens overflows the 24-token window
def test_greedy_with_cache_equals_full_recomputation(model, prompt_len):
    prompt = torch.randint(0, CONFIG.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(1))
    steps = 30
    counted = CountingModel(model)
    cached = list(generate_tokens(counted, prompt.tolist(), steps, temperature=0))
    cached_cost, counted.positions = counted.positions, 0
    uncached = list(generate_tokens(counted, prompt.tolist(), steps, temperature=0, use_cache=False))
    assert cached == uncached == reference_greedy(model, prompt.tolist(), steps)
    assert len(set(cached)) > 3  # not a degenerate repetition of one token
    assert cached_cost < counted.positions  # the cache saved work


def test_sampling_is_seeded_and_filters_apply(model):
    prompt = [1, 2, 3, 4]

    def sample(**kwargs):
        return list(generate_tokens(model, prompt, 20, **kwargs))

    assert sample(temperature=1.5, seed=4) == sample(temperature=1.5, seed=4)
    assert sample(temperature=1.5, seed=4) != sample(temperature=1.5, seed=5)
    greedy = sample(temperature=0)
    assert sample(temperature=2.0, top_k=1, seed=9) == greedy
    assert sample(temperature=2.0, top_p=1e-6, seed=9) == greedy


def test_filter_logits_top_k_and_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.05, 0.25, 0.15, 0.05]))
    kept = lambda out: torch.isfinite(out).nonzero().flatten().tolist()  # noqa: E731
    assert kept(filter_logits(logits, top_k=2)) == [0, 2]
    assert kept(filter_logits(logits, top_p=0.5)) == [0]  # 0.5 alone reaches p
    assert kept(filter_logits(logits, top_p=0.7)) == [0, 2]  # 0.5 + 0.25 >= 0.7
    assert kept(filter_logits(logits, top_p=0.8)) == [0, 2, 3]
    assert kept(filter_logits(logits, top_k=2, top_p=0.9)) == [0, 2]


def test_stream_prints_whole_characters(tokenizer_path):
    tokenizer = load_tokenizer(tokenizer_path)
    text = "naïve café, 日本語 and emoji 🙂!"
    ids = tokenizer.encode(text).ids
    assert len(ids) > len(text.split())  # multi-byte characters are split over byte tokens
    stream = TextStream(tokenizer)
    pieces = [stream.push(token) for token in ids] + [stream.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)
    assert "" in pieces  # some tokens held back until their character was complete


def test_generate_streams_what_it_returns_and_cuts_stop_strings(model, tokenizer_path):
    tokenizer = load_tokenizer(tokenizer_path)
    pieces: list[str] = []
    text = generate(model, tokenizer, GenerateSpec("The model", 25, temperature=0), stream=pieces.append)
    assert text and "".join(pieces) == text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    out = io.StringIO()
    cut = generate(model, tokenizer, GenerateSpec("The model", 25, temperature=0, stop=[stop]), stream=out)
    assert cut == text[: text.find(stop)]
    assert out.getvalue() == cut  # the stop string was never printed


def test_cli_generate_streams_the_greedy_continuation(checkpoint, model, tokenizer_path, capsys):
    code = main(
        ["generate", str(checkpoint), "--prompt", "Export", "--max-new-tokens", "12", "--temperature", "0"]
    )
    assert code == 0
    expected = generate(model, load_tokenizer(tokenizer_path), GenerateSpec("Export", 12, temperature=0))
    assert capsys.readouterr().out == "Export" + expected + "\n"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(top_k=0), "top_k"),
        (dict(top_p=1.5), "top_p"),
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(temperature=-1.0), "temperature must be >= 0"),
        (dict(temperature=float("nan")), "temperature"),
    ],
)
def test_bad_sampling_settings_are_named(model, kwargs, message):
    settings = dict(max_new_tokens=3) | kwargs
    with pytest.raises(ValueError, match=message):
        list(generate_tokens(model, [1, 2], **settings))


def test_cli_refuses_a_negative_temperature_before_any_output(checkpoint, capsys):
    assert main(["generate", str(checkpoint), "--prompt", "Export", "--temperature", "-1"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing echoed: the settings are checked first
    assert (
        captured.err
        == "tablefree generate: error: temperature must be >= 0 (0 is greedy decoding), got -1.0\n"
    )


def test_cli_error_during_generation_starts_on_its_own_line(checkpoint, capsys, monkeypatch):
    import tablefree.cli.interop

    def fails_midway(model, tokenizer, spec, *, stream):
        stream(" and then")
        raise ValueError("something went wrong")

    monkeypatch.setattr(tablefree.cli.interop, "generate", fails_midway)
    assert main(["generate", str(checkpoint), "--prompt", "Export"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "Export and then\n"
    assert captured.err == "tablefree generate: error: something went wrong\n"


def test_cli_help_shows_every_default(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = capsys.readouterr().out
    text = " ".join(out[out.index("options:") :].split())  # the option list, after the usage lines
    for option, default in [
        ("--max-new-tokens", "128"),
        ("--temperature", "1.0"),
        ("--top-k", "None"),
        ("--top-p", "None"),
        ("--device", "cpu"),
    ]:
        after = text[text.index(f"{option} {option.lstrip('-').replace('-', '_').upper()}") :]
        assert f"(default: {default})" in after[: after.index("--", len(option) + 1)], option


def test_cli_generate_on_an_exported_folder_suggests_import_hf(checkpoint, tmp_path, capsys):
    """issue 25: `generate` on an export said "no complete checkpoint" and no more."""
    from tablefree.export import export_hf

    export_hf(checkpoint, tmp_path / "hf")
    assert main(["generate", str(tmp_path / "hf"), "--prompt", "Export"]) == 1
    err = capsys.readouterr().err
    assert f"tablefree import-hf {tmp_path / 'hf'} --out DIR" in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_cli_generate_into_a_closed_pipe_ends_quietly(checkpoint):
    """issue 25: `tablefree generate ... | head -1` ended in two BrokenPipeError tracebacks."""
    import subprocess
    import sys

    from train_helpers import cli_env

    command = [sys.executable, "-m", "tablefree.cli", "generate", str(checkpoint), "--prompt", "Export"]
    process = subprocess.Popen(
        [*command, "--max-new-tokens", "400", "--temperature", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(),
    )
    assert process.stdout.read(1) == b"E"
    process.stdout.close()  # what `head -c 1` does
    err = process.stderr.read().decode()
    assert process.wait() == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_load_model_is_public_and_finds_a_runs_newest_checkpoint(checkpoint, model, tmp_path):
    """issue 25: loading a trained run into Python was not shown, and `tablefree.load_model` did not exist."""
    import shutil

    import tablefree

    run_dir = tmp_path / "run"
    shutil.copytree(checkpoint, run_dir / "checkpoints" / "step_00000004")
    loaded = tablefree.load_model(run_dir)
    assert isinstance(loaded, tablefree.TablefreeLM) and not loaded.training
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))
    assert "tablefree.load_model" in tablefree.TablefreeLM.__doc__
