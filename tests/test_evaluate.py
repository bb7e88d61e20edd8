"""Evaluation: the scoring engine against an independent forward pass, lm-eval's formulas on hand-computed cases,
prompt construction against lm-eval's own task code on the real benchmark files, input validation, run_eval."""

from __future__ import annotations

import ast
import hashlib
import json
import math
import random
import re
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tablefree import build_model, preset
from tablefree.checkpoint.model_dir import mark_complete, save_model
from tablefree.cli import main as cli_main
from tablefree.data.shards import write_shard
from tablefree.data.tokenizer import tokenizer_hash
from tablefree.evaluate import (
    TASKS,
    EvalSpec,
    encode_pair,
    encode_pairs,
    format_results,
    load_docs,
    loglikelihoods,
    run_eval,
)
from tablefree.evaluate.engine import _batches, _is_argmax, _Row
from tablefree.evaluate.metrics import (
    aggregate,
    bootstrap_stderr,
    mean_stderr,
    multiple_choice_scores,
    perplexity_rows,
)
from tablefree.evaluate.task_functions import lambada_split
from tablefree.evaluate.task_record import build_requests
from tablefree.evaluate.validation import token_byte_lengths, validation_metrics

REPO = Path(__file__).resolve().parents[1]
MAX_LEN = 128
EOT = "<|endoftext|>"


# ------------------------------------------------------------------------------------------------------------
# Fixtures: a real tiny model and a byte-level BPE trained here on the repository's own sources


def _train_tokenizer(vocab_size: int, seed_text: str = "") -> Tokenizer:
    text = (
        seed_text
        + "".join(p.read_text(encoding="utf-8") for p in sorted((REPO / "src").rglob("*.py")))[:60_000]
    )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([text], trainer=trainer)
    return tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return _train_tokenizer(400)


@pytest.fixture(scope="module")
def model(tokenizer):
    # init_std 0.2 makes the untrained model's distributions peaked, so wrong positions give visibly wrong numbers
    config = preset(
        "tiny",
        vocab_size=tokenizer.get_vocab_size(),
        d_model=32,
        n_layers=2,
        n_heads=2,
        d_ff=64,
        max_seq_len=MAX_LEN,
        init_std=0.2,
        interface="canonical",
    )
    return build_model(config, seed=3).eval()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, model, tokenizer) -> Path:
    root = tmp_path_factory.mktemp("ckpt")
    tokenizer.save(str(root / "tok.json"))
    meta = {"step": 7, "tokens_seen": 0, "tokenizer_hash": tokenizer_hash(tokenizer)}
    return save_model(root / "step_00000007", model, meta=meta, tokenizer_path=root / "tok.json")


def plain_loglikelihood(model, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """An independent computation: one plain causal forward pass over the (left-truncated) full sequence."""
    max_len = model.config.max_seq_len
    inputs = (context + continuation)[-(max_len + 1) :][:-1]
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([inputs])).double(), dim=-1)[0]
    logprobs = logprobs[-len(continuation) :]
    target = torch.tensor(continuation)
    chosen = logprobs[torch.arange(len(continuation)), target]
    return float(chosen.sum()), bool((logprobs.argmax(dim=-1) == target).all())


def random_requests(vocab: int, seed: int, groups: int = 12) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    requests = []
    for _ in range(groups):
        context = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        for _ in range(rng.randint(1, 4)):  # shared contexts, as in multiple choice
            requests.append((context, [rng.randrange(vocab) for _ in range(rng.randint(1, 9))]))
    requests.append(requests[0])  # an exact duplicate
    return requests


# ------------------------------------------------------------------------------------------------------------
# The engine


def test_loglikelihoods_equal_an_independent_forward_pass(model):
    requests = random_requests(model.config.vocab_size, seed=0)
    got = loglikelihoods(model, requests, batch_size=4)
    for (context, continuation), (ll, greedy) in zip(requests, got, strict=True):
        want_ll, want_greedy = plain_loglikelihood(model, context, continuation)
        assert ll == pytest.approx(want_ll, abs=1e-5 * max(1.0, abs(want_ll)))
        assert greedy == want_greedy


def test_greedy_flag_detects_the_models_own_continuation(model):
    context = [5, 17, 42, 8, 99]
    tokens = list(context)
    with torch.no_grad():
        for _ in range(4):  # the model's greedy continuation, one token at a time
            tokens.append(int(model(torch.tensor([tokens]))[0, -1].argmax()))
    greedy_continuation = tokens[len(context) :]
    wrong_last = [*greedy_continuation[:-1], (greedy_continuation[-1] + 1) % model.config.vocab_size]
    (ll_good, greedy_good), (ll_bad, greedy_bad) = loglikelihoods(
        model, [(context, greedy_continuation), (context, wrong_last)], batch_size=2
    )
    assert greedy_good and not greedy_bad
    assert ll_good > ll_bad


def test_results_do_not_depend_on_batch_size_or_order(model):
    requests = random_requests(model.config.vocab_size, seed=1, groups=20)
    reference = loglikelihoods(model, requests, batch_size=1)
    order = list(range(len(requests)))
    random.Random(2).shuffle(order)
    for batch_size in (3, 64):
        shuffled = loglikelihoods(model, [requests[i] for i in order], batch_size=batch_size)
        for position, i in enumerate(order):
            assert shuffled[position][0] == pytest.approx(reference[i][0], abs=1e-5)
            assert shuffled[position][1] == reference[i][1]


def test_greedy_check_takes_the_first_maximum_as_argmax_does():
    nan = float("nan")
    rows = [[-1.0, -0.5, -0.5], [-1.0, -0.5, -0.5], [-0.2, -3.0, -0.9], [-2.0, -2.0, -0.1], [-1.0, nan, -0.1]]
    logprobs = torch.tensor(rows * 2)
    # the first of a tie, the second of a tie, the clear maximum, not the maximum, a NaN (argmax picks it);
    # then the same rows with other targets
    targets = torch.tensor([1, 2, 0, 0, 1, 2, 1, 1, 2, 2])
    chosen = logprobs.gather(1, targets.unsqueeze(1)).squeeze(1)
    got = _is_argmax(logprobs, targets, chosen)
    want = [True, False, True, False, True, False, True, False, True, False]
    assert got.tolist() == (logprobs.argmax(dim=-1) == targets).tolist() == want


def test_batches_cap_rows_and_padding_and_keep_every_row_in_order():
    lengths = [100, 60, 58, 57, 57, 56, 55, 20, 19, 19, 18, 18, 18]
    rows = [_Row.start(tuple(range(n))) for n in lengths]
    batches = _batches(rows, batch_size=4)
    assert [row for batch in batches for row in batch] == rows
    assert [[len(row.tokens) for row in batch] for batch in batches] == [
        [100],  # with the next row, 20% of the batch would be padding
        [60, 58, 57, 57],  # batch_size rows
        [56, 55],  # a 20-token row would make it 22% padding
        [20, 19, 19, 18],
        [18, 18],
    ]
    for batch in batches:
        padded = len(batch) * len(batch[0].tokens)
        assert padded - sum(len(row.tokens) for row in batch) <= 0.1 * padded


def test_left_truncation_keeps_the_last_max_len_plus_one_tokens(model):
    rng = random.Random(4)
    vocab = model.config.vocab_size
    continuation = [rng.randrange(vocab) for _ in range(6)]
    context = [rng.randrange(vocab) for _ in range(MAX_LEN + 20)]
    other_start = [rng.randrange(vocab) for _ in range(25)] + context[25:]  # differs only in dropped tokens
    (ll, greedy), (ll_other, _) = loglikelihoods(
        model, [(context, continuation), (other_start, continuation)]
    )
    # hand truncation: keep the last MAX_LEN + 1 tokens, feed all but the last
    kept = (context + continuation)[-(MAX_LEN + 1) :]
    assert len(kept) == MAX_LEN + 1
    want, want_greedy = plain_loglikelihood(model, kept[: -len(continuation)], continuation)
    assert ll == pytest.approx(want, abs=1e-5 * abs(want))
    assert greedy == want_greedy
    assert ll_other == pytest.approx(ll, abs=1e-5 * abs(ll))  # the dropped tokens do not matter
    # ... while a context that fits is not truncated: the first token matters
    short = context[-20:]
    (a, _), (b, _) = loglikelihoods(
        model, [(short, continuation), ([short[0] + 1, *short[1:]], continuation)]
    )
    assert a != pytest.approx(b, abs=1e-6)


def test_engine_rejects_what_lm_eval_asserts_against(model):
    with pytest.raises(ValueError, match="empty context"):
        loglikelihoods(model, [([], [1])])
    with pytest.raises(ValueError, match="empty continuation"):
        loglikelihoods(model, [([1], [])])
    with pytest.raises(ValueError, match="exceeds"):
        loglikelihoods(model, [([1], [2] * (MAX_LEN + 1))])


# ------------------------------------------------------------------------------------------------------------
# Text -> tokens, against lm-eval's own _encode_pair


def _lm_eval_encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    from lm_eval.api.model import TemplateLM

    shim = SimpleNamespace(backend="causal", tok_encode=lambda text, **_: tokenizer.encode(text).ids)
    return TemplateLM._encode_pair(shim, context, continuation)


def test_encode_pair_matches_lm_eval(tokenizer):
    pairs = [
        ("Question: why?\nAnswer:", " because"),
        ("The cat sat on the  ", "mat."),  # trailing spaces move to the continuation
        ("x", " y z"),
        ("def f(", "x):\n    return x"),
    ]
    pairs += [("A man is sitting on a roof. He", f" ending number {i}, of sorts.") for i in range(3)]
    batch = encode_pairs(tokenizer, pairs, prefix_token_id=0)
    for (context, continuation), got in zip(pairs, batch, strict=True):
        want = _lm_eval_encode_pair(tokenizer, context, continuation)
        assert got == want
        assert encode_pair(tokenizer, context, continuation, prefix_token_id=0) == want
    context_ids, continuation_ids = encode_pair(tokenizer, "The cat sat on the  ", "mat.", 0)
    assert tokenizer.decode(context_ids) == "The cat sat on the"
    assert tokenizer.decode(continuation_ids) == "  mat."


def test_empty_context_conditions_on_the_prefix_token(tokenizer):
    eot = tokenizer.token_to_id(EOT)
    context, continuation = encode_pair(tokenizer, "", " hello", prefix_token_id=eot)
    assert context == [eot] and continuation == tokenizer.encode(" hello").ids


# ------------------------------------------------------------------------------------------------------------
# Metrics, on hand-computed cases


def test_acc_norm_divides_by_characters_and_acc_bytes_by_utf8_bytes():
    # acc: -10 > -12 picks choice 0; by characters -10/2 = -5 < -12/8 = -1.5 picks choice 1;
    # by bytes choice 1 "éééééééé" is 16 bytes: -12/16 = -0.75, choice 2 "abcdefghij" -11/10 = -1.1.
    lls = [-10.0, -12.0, -11.0]
    choices = ["ab", "éééééééé", "abcdefghij"]
    scores = multiple_choice_scores(lls, choices, gold=1)
    assert (scores["pred"], scores["pred_norm"], scores["pred_bytes"]) == (0, 2, 1)
    assert (scores["acc"], scores["acc_norm"], scores["acc_bytes"]) == (0, 0, 1)
    # ties go to the first index, as np.argmax
    assert multiple_choice_scores([-1.0, -1.0], ["a", "b"], gold=1)["pred"] == 0


def test_mean_stderr_and_perplexity_by_hand():
    values = [1, 0, 1, 1]  # mean 0.75, sample variance 0.25, stderr sqrt(0.25 / 4) = 0.25
    assert aggregate("acc", values, 0) == pytest.approx((0.75, 0.25))
    assert mean_stderr([2.0, 4.0]) == pytest.approx(1.0)  # sample sd sqrt(2), / sqrt(2)
    value, stderr = aggregate("perplexity", [-1.0, -3.0], bootstrap_iters=0)
    assert value == pytest.approx(math.exp(2.0)) and stderr is None


def test_bootstrap_stderr_reproduces_lm_evals_random_draws(monkeypatch):
    from lm_eval.api import metrics as lm_metrics

    monkeypatch.setenv("DISABLE_MULTIPROC", "1")  # lm-eval's single-process path draws the same samples
    values = [-float(i % 7) - 0.5 * (i % 3) for i in range(60)]
    want = lm_metrics.bootstrap_stderr(lm_metrics.perplexity, values, iters=2000)
    got = bootstrap_stderr(perplexity_rows, values, iters=2000)
    assert got == pytest.approx(want, rel=1e-9)
    assert got != pytest.approx(bootstrap_stderr(perplexity_rows, values[::-1], iters=1000), rel=1e-6)


# ------------------------------------------------------------------------------------------------------------
# Prompts, choices and gold, against lm-eval's own task definitions on the real files


def _lm_eval_task_dir() -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent


def _lm_eval_module(relative: str):
    """Import one of lm-eval's task utils (they import ``datasets`` only for a type, so a stub does)."""
    import importlib

    sys.modules.setdefault("datasets", types.ModuleType("datasets"))
    return importlib.import_module("lm_eval.tasks." + relative.replace("/", "."))


LM_EVAL_YAML = {
    "hellaswag": "hellaswag/hellaswag.yaml",
    "piqa": "piqa/piqa.yaml",
    "lambada": "lambada/lambada_openai.yaml",
    "arc_easy": "arc/arc_easy.yaml",
    "arc_challenge": "arc/arc_easy.yaml",  # arc_challenge.yaml includes it, changing only the dataset
    "winogrande": "winogrande/default.yaml",
    "openbookqa": "openbookqa/openbookqa.yaml",
    "sciq": "sciq/sciq.yaml",
    "boolq": "super_glue/boolq/default.yaml",
    "copa": "super_glue/copa/default.yaml",
}


def _lm_eval_definition(task: str):
    """(doc_to_text, doc_to_choice, doc_to_target, process_doc, target_delimiter) as lm-eval resolves them."""
    from lm_eval.utils import apply_template

    path = _lm_eval_task_dir() / LM_EVAL_YAML[task]

    class Loader(yaml.SafeLoader):
        pass

    def function(loader, node):
        module, name = loader.construct_scalar(node).rsplit(".", 1)
        package = str(path.parent.relative_to(_lm_eval_task_dir()))
        return getattr(_lm_eval_module(f"{package}/{module}"), name)

    Loader.add_constructor("!function", function)
    config = yaml.load(path.read_text(), Loader=Loader)
    has_choice = config.get("doc_to_choice") is not None

    def resolve(spec, doc, kind):  # ConfigurableTask.doc_to_text / doc_to_choice / doc_to_target
        if isinstance(spec, (int, list)) or callable(spec):
            return spec(doc) if callable(spec) else spec
        if spec in doc:
            return doc[spec]
        rendered = apply_template(spec, doc)
        if kind == "choice":
            return ast.literal_eval(rendered)
        if rendered.isdigit() and has_choice:
            return ast.literal_eval(rendered)
        return rendered

    process = config.get("process_docs")
    if process is not None:
        # hellaswag: process_docs(dataset) is dataset.map(_process_doc), which adds columns to the record
        process_doc = process(SimpleNamespace(map=lambda fn: fn))
        process = lambda doc: {**doc, **process_doc(doc)}  # noqa: E731
    return (
        lambda doc: resolve(config["doc_to_text"], doc, "text"),
        (lambda doc: resolve(config["doc_to_choice"], doc, "choice")) if has_choice else None,
        lambda doc: resolve(config["doc_to_target"], doc, "target"),
        process or (lambda doc: doc),
        config.get("target_delimiter", " "),
    )


def _as_lm_eval_doc(task: str, fields: dict) -> dict:
    if task == "boolq":  # SuperGLUE's BoolQ: label = int(answer)
        return {**fields, "label": int(fields["answer"])}
    return fields


@pytest.mark.parametrize("name", list(TASKS))
def test_requests_match_lm_evals_task_definitions_on_real_records(shared_data, name):
    to_text, to_choice, to_target, process, delimiter = _lm_eval_definition(name)
    task = TASKS[name]
    docs = load_docs(task, shared_data / "eval", limit=1000)
    assert len(docs) == {"copa": 100, "arc_challenge": 299, "arc_easy": 570, "openbookqa": 500}.get(
        name, 1000
    )
    for doc in docs:
        ours = build_requests(task, doc.fields)
        ref = process(_as_lm_eval_doc(name, dict(doc.fields)))
        if task.output_type == "loglikelihood":
            assert ours.pairs == [(to_text(ref), to_target(ref))]
            continue
        text, choices, target = to_text(ref), to_choice(ref), to_target(ref)
        assert ours.choices == choices
        if isinstance(text, int):  # multiple input (WinoGrande): one context per choice
            assert ours.pairs == [(context, delimiter + target) for context in choices]
            assert ours.gold == text
        else:
            assert ours.pairs == [(text, delimiter + choice) for choice in choices]
            assert ours.gold == (choices.index(target) if isinstance(target, str) else target)


def test_copa_continuations_start_with_two_spaces(shared_data):
    doc = load_docs(TASKS["copa"], shared_data / "eval", limit=1)[0]
    requests = build_requests(TASKS["copa"], doc.fields)
    assert requests.pairs[0] == ("The man turned on the faucet therefore", "  the toilet filled with water.")
    assert requests.gold == 1


@pytest.mark.parametrize(
    ("text", "context", "target"),
    [
        ('He looked at her and said "go away."', 'He looked at her and said "go', ' away."'),
        ("I don't care about signs", "I don't care about", " signs"),
        ("ends with a dash-", "ends with a", " dash-"),
        ("two  spaces", "two ", " spaces"),  # split on single spaces, as lm-eval's template does
        ("line\nbreak word", "line\nbreak", " word"),
    ],
)
def test_lambada_split_keeps_punctuation_with_the_last_word(text, context, target):
    from lm_eval.utils import apply_template

    assert lambada_split(text) == (context, target)
    assert apply_template("{{text.split(' ')[:-1]|join(' ')}}", {"text": text}) == context
    assert apply_template("{{' '+text.split(' ')[-1]}}", {"text": text}) == target


# ------------------------------------------------------------------------------------------------------------
# Bad input


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


HELLASWAG_OK = {"activity_label": "A", "ctx_a": "b", "ctx_b": "c", "endings": ["x", "y"], "label": 1}


@pytest.mark.parametrize(
    ("second_line", "message"),
    [
        ("{not json", r"hellaswag_val\.jsonl:2: malformed JSON"),
        (json.dumps({k: v for k, v in HELLASWAG_OK.items() if k != "ctx_b"}), r":2: missing field 'ctx_b'"),
        (json.dumps({**HELLASWAG_OK, "label": 2}), r":2: label 2 out of range for 2 endings"),
        (json.dumps({**HELLASWAG_OK, "endings": "xy"}), r":2: field 'endings' must be list"),
    ],
)
def test_bad_records_name_file_and_line(tmp_path, second_line, message):
    _write(tmp_path / "hellaswag_val.jsonl", json.dumps(HELLASWAG_OK) + "\n" + second_line + "\n")
    with pytest.raises(ValueError, match=message):
        load_docs(TASKS["hellaswag"], tmp_path)


def test_a_limit_reads_only_the_records_it_scores_but_counts_every_line(tmp_path):
    good = json.dumps(HELLASWAG_OK)
    _write(tmp_path / "hellaswag_val.jsonl", f"{good}\n{good}\n{{not json\n")
    assert len(load_docs(TASKS["hellaswag"], tmp_path, limit=2)) == 2  # the bad third line is never scored
    with pytest.raises(ValueError, match=r"hellaswag_val\.jsonl:3: malformed JSON"):
        load_docs(TASKS["hellaswag"], tmp_path, limit=3)
    _write(tmp_path / "piqa/valid.jsonl", '{"goal": "g", "sol1": "a", "sol2": "b"}\n' * 3)
    _write(tmp_path / "piqa/valid-labels.lst", "0\n1\n")
    with pytest.raises(ValueError, match=r"2 labels for 3 records"):  # misaligned files fail at any limit
        load_docs(TASKS["piqa"], tmp_path, limit=1)
    _write(tmp_path / "piqa/valid-labels.lst", "0\n1\n1\n")
    assert [doc.fields["label"] for doc in load_docs(TASKS["piqa"], tmp_path, limit=2)] == [0, 1]


def test_bad_labels_in_other_formats_name_file_and_line(tmp_path):
    _write(tmp_path / "piqa/valid.jsonl", '{"goal": "g", "sol1": "a", "sol2": "b"}\n' * 2)
    _write(tmp_path / "piqa/valid-labels.lst", "0\n2\n")
    with pytest.raises(ValueError, match=r"valid-labels\.lst:2: label must be 0 or 1"):
        load_docs(TASKS["piqa"], tmp_path)
    _write(tmp_path / "piqa/valid-labels.lst", "0\n")
    with pytest.raises(ValueError, match=r"1 labels for 2 records"):
        load_docs(TASKS["piqa"], tmp_path)
    arc = {"question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "C"}
    _write(tmp_path / "extra/arc_easy_validation.jsonl", json.dumps(arc) + "\n")
    with pytest.raises(ValueError, match=r"arc_easy_validation\.jsonl:1: answerKey 'C' is not one of"):
        load_docs(TASKS["arc_easy"], tmp_path)
    wino = {"sentence": "no blank", "option1": "a", "option2": "b", "answer": "1"}
    _write(tmp_path / "extra/winogrande_xl_validation.jsonl", json.dumps(wino) + "\n")
    with pytest.raises(ValueError, match=r"winogrande_xl_validation\.jsonl:1: .*no '_' blank"):
        load_docs(TASKS["winogrande"], tmp_path)
    boolq = {"question": "q", "passage": "p", "answer": "yes"}
    _write(tmp_path / "extra/boolq_validation.jsonl", json.dumps(boolq) + "\n")
    with pytest.raises(ValueError, match=r"boolq_validation\.jsonl:1: field 'answer' must be bool"):
        load_docs(TASKS["boolq"], tmp_path)


def test_missing_data_file_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"tablefree data download-evals \S+nowhere --tasks lambada"):
        load_docs(TASKS["lambada"], tmp_path / "nowhere")


def test_all_missing_files_are_listed_at_once_with_the_command_that_fetches_them(
    shared_data, checkpoint, tmp_path, capsys
):
    """Only the main three benchmarks present: `--tasks all` names every missing file in one error."""
    for name in ("hellaswag", "piqa", "lambada"):
        for relative in TASKS[name].files:
            _write(tmp_path / relative, (shared_data / "eval" / relative).read_text())
    code = cli_main(["eval", str(checkpoint), "--tasks", "all", "--eval-data", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1
    extra = [name for name in TASKS if name not in ("hellaswag", "piqa", "lambada")]
    for name in extra:
        for relative in TASKS[name].files:
            assert f"{name}: {tmp_path / relative}" in err
    assert f"tablefree data download-evals {tmp_path} --tasks {','.join(extra)}" in err
    assert "hellaswag:" not in err and "Traceback" not in err


# ------------------------------------------------------------------------------------------------------------
# run_eval end to end


def _prepared_dataset(root: Path, tokenizer: Tokenizer, text: str) -> list[int]:
    eot = tokenizer.token_to_id(EOT)
    tokens = [eot, *tokenizer.encode(text).ids, eot, *tokenizer.encode(text.upper()).ids]
    root.mkdir(parents=True, exist_ok=True)
    write_shard(root / "val_000000.bin", np.array(tokens), tokenizer.get_vocab_size())
    sha = hashlib.sha256((root / "val_000000.bin").read_bytes()).hexdigest()
    manifest = {
        "version": 1,
        "tokenizer_hash": tokenizer_hash(tokenizer),
        "tokenizer_file": "tokenizer.json",
        "vocab_size": tokenizer.get_vocab_size(),
        "eot_id": eot,
        "splits": {"val": {"shards": [{"file": "val_000000.bin", "tokens": len(tokens), "sha256": sha}]}},
    }
    (root / "manifest.json").write_text(json.dumps(manifest))
    return tokens


def test_run_eval_writes_results_and_examples(shared_data, checkpoint, model, tokenizer, tmp_path):
    text = "It is a truth universally acknowledged, that a single man in possession of a good fortune. " * 8
    tokens = _prepared_dataset(tmp_path / "data", tokenizer, text)
    results = run_eval(
        EvalSpec(
            checkpoint.parent,  # a directory of step_* checkpoints resolves to the newest
            ["hellaswag", "lambada", "winogrande", "validation"],
            data_dir=shared_data / "eval",
            limit=6,
            batch_size=5,
            examples_out=tmp_path / "ex.jsonl",
            val_data=tmp_path / "data",
            bootstrap_iters=1000,
            out=tmp_path / "results.json",
            dtype="fp32",  # compared below with an fp32 forward pass; `auto` is bf16 on CPUs that multiply it natively
        )
    )
    assert json.loads((tmp_path / "results.json").read_text()) == json.loads(json.dumps(results))
    assert results["checkpoint"] == str(checkpoint) and results["step"] == 7
    assert results["tokenizer_hash"] == tokenizer_hash(tokenizer)
    records = [json.loads(line) for line in (tmp_path / "ex.jsonl").read_text().splitlines()]
    hellaswag = [r for r in records if r["task"] == "hellaswag"]
    assert [r["doc_id"] for r in hellaswag] == list(range(6))
    entry = results["tasks"]["hellaswag"]
    assert entry["n"] == 6 and entry["headline"] == "acc_norm"
    assert entry["data_sha256"] == {
        "hellaswag_val.jsonl": "dc1be2fa1bef56aab8e92a5be597a617e363b09239fa66822939d7fb7a8da4ec"
    }
    for metric in ("acc", "acc_norm", "acc_bytes"):
        assert entry["metrics"][metric] == pytest.approx(np.mean([r[metric] for r in hellaswag]))
    assert entry["stderr"]["acc"] == pytest.approx(mean_stderr([r["acc"] for r in hellaswag]))
    # one document, end to end from the strings: lm-eval's encoding, a plain forward pass per choice
    doc = load_docs(TASKS["hellaswag"], shared_data / "eval", limit=1)[0].fields
    requests = build_requests(TASKS["hellaswag"], doc)
    for (context, continuation), ll in zip(requests.pairs, hellaswag[0]["loglikelihoods"], strict=True):
        want, _ = plain_loglikelihood(model, *_lm_eval_encode_pair(tokenizer, context, continuation))
        assert ll == pytest.approx(want, abs=1e-5 * abs(want))
    lambada = [r for r in records if r["task"] == "lambada"]
    perplexity = results["tasks"]["lambada"]["metrics"]["perplexity"]
    assert perplexity == pytest.approx(math.exp(-np.mean([r["loglikelihoods"][0] for r in lambada])))
    assert results["tasks"]["lambada"]["stderr"]["perplexity"] > 0
    assert set(results["tasks"]["winogrande"]["metrics"]) == {"acc"}
    # validation: hand computation over the same windows (the last one shorter)
    validation = results["tasks"]["validation"]
    windows = min(6, math.ceil((len(tokens) - 1) / MAX_LEN))
    assert validation["n"] == windows
    data = torch.tensor(tokens[: windows * MAX_LEN + 1])
    nats, nbytes, scored = 0.0, 0, 0
    for w in range(windows):
        chunk = data[w * MAX_LEN : (w + 1) * MAX_LEN + 1]
        with torch.no_grad():
            nats += float(model.loss(chunk[None, :-1], chunk[None, 1:])) * (len(chunk) - 1)
        nbytes += len(tokenizer.decode(chunk[1:].tolist()).encode("utf-8"))  # decode skips <|endoftext|>
        scored += len(chunk) - 1
    assert validation["tokens"] == scored
    assert validation["metrics"]["val_loss"] == pytest.approx(nats / scored, rel=1e-5)
    assert validation["metrics"]["val_ppl"] == pytest.approx(math.exp(nats / scored), rel=1e-5)
    assert validation["metrics"]["bits_per_byte"] == pytest.approx(nats / (math.log(2) * nbytes), rel=1e-5)
    table = format_results(results)
    assert "acc_norm*" in table and "bits_per_byte*" in table


def _two_shard_dataset(root: Path, tokenizer: Tokenizer, texts: list[str], split_at: int) -> list[int]:
    """A val split of ``texts`` as documents (EOT before each), cut into two shards at token ``split_at``."""
    eot = tokenizer.token_to_id(EOT)
    stream, starts = [], []
    for text in texts:
        starts.append(len(stream))
        stream += [eot, *tokenizer.encode(text).ids]
    root.mkdir(parents=True, exist_ok=True)
    shards = []
    for index, part in enumerate((stream[:split_at], stream[split_at:])):
        name = f"val_{index:06d}.bin"
        write_shard(root / name, np.array(part), tokenizer.get_vocab_size())
        sha = hashlib.sha256((root / name).read_bytes()).hexdigest()
        shards.append({"file": name, "tokens": len(part), "sha256": sha})
    manifest = {
        "version": 1,
        "tokenizer_hash": tokenizer_hash(tokenizer),
        "vocab_size": tokenizer.get_vocab_size(),
        "eot_id": eot,
        "splits": {"val": {"shards": shards, "tokens": len(stream), "document_starts": starts}},
    }
    (root / "manifest.json").write_text(json.dumps(manifest))
    return stream


def test_validation_scores_every_token_and_says_what_a_limit_left_out(model, tokenizer, tmp_path):
    """issue 25.3: windows that did not fill up were dropped silently (the last short documents went unscored,
    and so did each shard's first token), and a limit cut the split without saying which documents it left."""
    texts = ["A long first document about windows and tokens. " * 12, "A short one.", "The last, short."]
    stream = _two_shard_dataset(tmp_path / "data", tokenizer, texts, split_at=MAX_LEN + 7)
    assert (len(stream) - 1) % MAX_LEN  # the last window is a short one
    whole = validation_metrics(
        model, tokenizer, str(tmp_path / "data"), tokenizer_hash(tokenizer), batch_size=2
    )
    assert whole["tokens"] == len(stream) - 1 and whole["coverage"]["left_out_by"] is None
    assert whole["per_document"]["documents"] == 3 and whole["coverage"]["documents_whole"] == 3
    data = torch.tensor(stream)
    chunks = [data[start : start + MAX_LEN + 1] for start in range(0, len(stream) - 1, MAX_LEN)]
    with torch.no_grad():
        nats = sum(float(model.loss(c[None, :-1], c[None, 1:])) * (len(c) - 1) for c in chunks)
    assert whole["metrics"]["val_loss"] == pytest.approx(nats / (len(stream) - 1), rel=1e-5)
    assert sum(whole["per_document"]["nats"]) == pytest.approx(nats, rel=1e-5)
    limited = validation_metrics(
        model, tokenizer, str(tmp_path / "data"), tokenizer_hash(tokenizer), batch_size=2, limit=1
    )
    cover = limited["coverage"]
    assert cover["scored_tokens"] == MAX_LEN and cover["scored_targets"] == [1, 1 + MAX_LEN]
    assert cover["left_out_by"] == "limit=1 windows" and cover["documents_whole"] == 0
    assert [d["index"] for d in cover["partly_scored"]] == [0]
    assert [d["index"] for d in cover["not_scored"]] == [1, 2]
    table = format_results({"tasks": {"validation": limited}})
    assert f"scored {MAX_LEN:,} of {len(stream) - 1:,} tokens" in table and "document 2" in table
    assert "* the task's headline metric" in table


def test_token_byte_lengths_count_utf8_bytes(tokenizer):
    lengths = token_byte_lengths(tokenizer, tokenizer.get_vocab_size() + 3)
    text = "naïve café — ok"
    ids = tokenizer.encode(text).ids
    assert int(lengths[ids].sum()) == len(text.encode("utf-8"))
    assert lengths[tokenizer.token_to_id(EOT)] == 0 and lengths[-1] == 0


def test_mismatched_tokenizer_is_refused(shared_data, checkpoint, tokenizer, tmp_path):
    other = _train_tokenizer(380, seed_text="zzz qqq ")
    other.save(str(tmp_path / "other.json"))
    with pytest.raises(ValueError, match="does not match the tokenizer_hash"):
        run_eval(
            EvalSpec(
                checkpoint,
                ["copa"],
                data_dir=shared_data / "eval",
                limit=2,
                tokenizer=tmp_path / "other.json",
            )
        )
    bad = tmp_path / "bad"
    save_model(
        bad,
        build_model(preset("tiny", vocab_size=400, d_model=32, n_layers=1, n_heads=2, d_ff=32)),
        meta={"tokenizer_hash": tokenizer_hash(other)},
        tokenizer_path=tmp_path / "other.json",
    )
    (bad / "tokenizer.json").write_text(tokenizer.to_str())  # the file no longer matches the recorded hash
    mark_complete(bad)  # its digest recorded afterwards: the tokenizer-hash check itself must catch it
    with pytest.raises(ValueError, match="refusing to use it"):
        run_eval(EvalSpec(bad, ["copa"], data_dir=shared_data / "eval", limit=2))


def test_cli_prints_table_and_reports_errors(shared_data, checkpoint, tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = [
        "eval",
        str(checkpoint),
        "--tasks",
        "copa,arc_easy",
        "--limit",
        "3",
        "--eval-data",
        str(shared_data / "eval"),
    ]
    assert cli_main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "copa" in printed and "arc_easy" in printed and "acc*" in printed
    assert set(json.loads(out.read_text())["tasks"]) == {"copa", "arc_easy"}
    assert cli_main(["eval", str(checkpoint), "--tasks", "nope"]) == 1
    assert "unknown task 'nope'" in capsys.readouterr().err
    assert cli_main(["eval", str(checkpoint), "--tasks", "copa", "--eval-data", str(tmp_path / "empty")]) == 1
    assert "download-evals" in capsys.readouterr().err


def test_validation_refuses_a_dataset_of_another_tokenizer(checkpoint, tokenizer, tmp_path):
    _prepared_dataset(
        tmp_path / "data", tokenizer, "some text to fill a few windows of validation data " * 20
    )
    manifest = json.loads((tmp_path / "data/manifest.json").read_text())
    (tmp_path / "data/manifest.json").write_text(json.dumps({**manifest, "tokenizer_hash": "0" * 64}))
    with pytest.raises(ValueError, match="validation needs the same tokenizer"):
        run_eval(EvalSpec(checkpoint, ["validation"], val_data=tmp_path / "data"))
    with pytest.raises(ValueError, match="--val-data"):
        run_eval(EvalSpec(checkpoint, ["validation"]))


# ------------------------------------------------------------------------------------------------------------
# Checked before scoring (issue 15), kept as it finishes, bad files end in our own errors (issue 12)


def _copy_eval(shared_data: Path, root: Path, names: list[str]) -> Path:
    for name in names:
        for relative in TASKS[name].files:
            _write(root / relative, (shared_data / "eval" / relative).read_text(encoding="utf-8"))
    return root


def test_unwritable_outputs_are_refused_before_any_work(shared_data, checkpoint, tmp_path, monkeypatch):
    import tablefree.evaluate.evaluator as evaluator

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the output paths were checked")

    monkeypatch.setattr(evaluator, "load_model", no_model)
    common = {"data_dir": shared_data / "eval", "limit": 2}
    with pytest.raises(
        FileNotFoundError, match=r"--out \S+missing/dir/r\.json: directory \S+missing/dir does"
    ):
        run_eval(EvalSpec(checkpoint, ["copa"], out=tmp_path / "missing/dir/r.json", **common))
    with pytest.raises(ValueError, match=r"--examples-out \S+: is a directory"):
        run_eval(EvalSpec(checkpoint, ["copa"], examples_out=tmp_path, **common))
    with pytest.raises(ValueError, match=r"--examples-out and --out are the same file"):
        run_eval(
            EvalSpec(
                checkpoint, ["copa"], out=tmp_path / "a.json", examples_out=tmp_path / "a.json", **common
            )
        )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("limit", [0, -3])
def test_limit_zero_is_an_error_everywhere(checkpoint, limit, capsys):
    from tablefree.evaluate.tasks import parse_limit

    with pytest.raises(ValueError, match="limit must be a positive number of documents"):
        run_eval(EvalSpec(checkpoint, ["copa"], limit=limit))
    with pytest.raises(ValueError, match=r"leave it out .* for the full sets"):
        parse_limit(str(limit))
    with pytest.raises(SystemExit):
        cli_main(["eval", str(checkpoint), "--limit", str(limit)])
    assert "limit must be a positive number" in capsys.readouterr().err
    assert parse_limit("all") is None and parse_limit(None) is None and parse_limit("7") == 7


def test_aliases_and_all_resolve_to_one_name_per_task():
    from tablefree.evaluate.tasks import TASK_ALIASES, get_task, parse_task_names

    assert TASK_ALIASES == {"lambada_openai": "lambada"}
    assert get_task("lambada_openai") is TASKS["lambada"]
    assert parse_task_names("lambada_openai, piqa,lambada") == ["lambada", "piqa"]
    assert parse_task_names(["hellaswag,piqa", "copa"]) == ["hellaswag", "piqa", "copa"]
    assert parse_task_names("all") == list(TASKS)
    assert parse_task_names("piqa,validation", extra=["validation"]) == ["piqa", "validation"]
    with pytest.raises(ValueError, match="unknown tasks 'x', 'y'"):
        parse_task_names("x,piqa,y")


def _long_lambada(root: Path, tokenizer: Tokenizer) -> tuple[Path, int]:
    """A LAMBADA file whose third document's last word is longer than MAX_LEN tokens."""
    rng = random.Random(0)
    word = "".join(rng.choice("qxzjvkw#%&") for _ in range(4 * MAX_LEN))
    assert len(tokenizer.encode(" " + word).ids) > MAX_LEN
    lines = [
        '{"text": "the cat sat on the mat"}',
        '{"text": "a b c"}',
        json.dumps({"text": "it was " + word}),
    ]
    return _write(root / "lambada_test.jsonl", "\n".join(lines) + "\n"), len(tokenizer.encode(" " + word).ids)


def test_a_continuation_longer_than_the_context_is_found_before_scoring(
    shared_data, checkpoint, tokenizer, tmp_path, monkeypatch
):
    import tablefree.evaluate.evaluator as evaluator

    root = _copy_eval(shared_data, tmp_path / "eval", ["copa"])
    path, length = _long_lambada(root, tokenizer)
    scored = []
    monkeypatch.setattr(evaluator, "loglikelihoods", lambda *a, **k: scored.append(1))
    with pytest.raises(ValueError) as error:
        run_eval(EvalSpec(checkpoint, ["copa", "lambada"], data_dir=root, out=tmp_path / "r.json"))
    message = str(error.value)
    assert message.startswith(f"{path}:3: lambada document 2 has a continuation of {length} tokens")
    assert f"context of {MAX_LEN} tokens" in message and "max_seq_len" in message and "--limit 2" in message
    assert scored == [] and not (tmp_path / "r.json").exists()
    # the documents before it fit
    monkeypatch.undo()
    results = run_eval(EvalSpec(checkpoint, ["lambada"], data_dir=root, limit=2, bootstrap_iters=10))
    assert results["tasks"]["lambada"]["n"] == 2


def test_each_finished_task_is_written_before_the_next_one_runs(
    shared_data, checkpoint, tmp_path, monkeypatch
):
    import tablefree.evaluate.evaluator as evaluator

    real = evaluator.score_task

    def stop_at_second(model, prepared, *args, **kwargs):
        if prepared.task.name == "arc_easy":
            raise KeyboardInterrupt
        return real(model, prepared, *args, **kwargs)

    monkeypatch.setattr(evaluator, "score_task", stop_at_second)
    out, examples = tmp_path / "r.json", tmp_path / "ex.jsonl"
    with pytest.raises(KeyboardInterrupt):
        run_eval(
            EvalSpec(
                checkpoint,
                ["copa", "arc_easy"],
                data_dir=shared_data / "eval",
                limit=3,
                out=out,
                examples_out=examples,
            )
        )
    partial = json.loads(out.read_text())
    assert set(partial["tasks"]) == {"copa"} and partial["pending"] == ["arc_easy"]
    assert [json.loads(line)["task"] for line in examples.read_text().splitlines()] == ["copa"] * 3
    monkeypatch.setattr(evaluator, "score_task", real)
    final = run_eval(
        EvalSpec(checkpoint, ["copa", "arc_easy"], data_dir=shared_data / "eval", limit=3, out=out)
    )
    assert "pending" not in json.loads(out.read_text()) and set(final["tasks"]) == {"copa", "arc_easy"}


HUGE = "1" * 5000


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"[" * 100_000 + b"]" * 100_000, r":2: JSON nested too deeply"),
        (
            b'{"activity_label": "A", "ctx_a": "b", "ctx_b": "c", "endings": ["x"], "label": '
            + HUGE.encode()
            + b"}",
            r":2: unreadable JSON value \(Exceeds the limit",
        ),
        (
            json.dumps({**HELLASWAG_OK, "label": True}).encode(),
            r":2: field 'label' must be int or str, got True",
        ),
        (
            json.dumps({**HELLASWAG_OK, "label": HUGE}).encode(),
            r":2: field 'label' must be an integer, got '1111",
        ),
        (json.dumps({**HELLASWAG_OK, "label": "²"}).encode(), r":2: field 'label' must be an integer"),
        (
            json.dumps({**HELLASWAG_OK, "ctx_a": "caf\xe9"}, ensure_ascii=False).encode("latin-1"),
            r":2: invalid UTF-8 \(byte 0xe9",
        ),
        (json.dumps({**HELLASWAG_OK, "ctx_a": "\ud800"}).encode(), r":2: a \\u escape encodes half of a"),
        (json.dumps(HELLASWAG_OK).replace("1}", "NaN}").encode(), r":2: unreadable JSON value \(NaN is not"),
        (b"[1, 2]", r":2: expected a JSON object, got list"),
    ],
)
def test_corrupt_eval_files_end_in_an_error_naming_file_and_line(tmp_path, data, message):
    path = tmp_path / "hellaswag_val.jsonl"
    path.write_bytes(json.dumps(HELLASWAG_OK).encode() + b"\n" + data + b"\n")
    with pytest.raises(ValueError, match=re.escape(str(path)) + message):
        load_docs(TASKS["hellaswag"], tmp_path)


def test_byte_order_marks(tmp_path):
    path = tmp_path / "hellaswag_val.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (json.dumps(HELLASWAG_OK) + "\n\n").encode() * 2)  # UTF-8: read
    docs = load_docs(TASKS["hellaswag"], tmp_path)
    assert [d.fields for d in docs] == [HELLASWAG_OK] * 2 and docs[1].where == f"{path}:3"
    path.write_bytes((json.dumps(HELLASWAG_OK) + "\n").encode("utf-16"))
    with pytest.raises(ValueError, match=re.escape(str(path)) + ": starts with a UTF-16 byte-order mark"):
        load_docs(TASKS["hellaswag"], tmp_path)
    _write(tmp_path / "piqa/valid.jsonl", '{"goal": "g", "sol1": "a", "sol2": "b"}\n' * 2)
    (tmp_path / "piqa/valid-labels.lst").write_bytes(b"0\n\xff\n")
    with pytest.raises(ValueError, match=r"valid-labels\.lst:2: invalid UTF-8"):
        load_docs(TASKS["piqa"], tmp_path)
