"""Fuzz the evaluation-file readers: corrupted variants of every task's files, through everything that runs
before scoring (``prepare_task``: read, validate, build the prompts; ``encode_task``: tokenize).

Each variant must end in one of two ways:

* the project's own error (``ValueError`` / ``FileNotFoundError``) naming the corrupted file, and its line where
  the problem is on one; or
* a correct read: the records equal those an independent reader gets from the same bytes (UTF-8, an optional
  UTF-8 BOM, one JSON object per non-blank line), so nothing is silently garbled.

Anything else (a raw traceback, an error naming no file, a read that differs) fails the test. Seeded; the
outcome counts are printed (``pytest -s``) and go into docs/reliability.md.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tablefree.evaluate.evaluator import encode_task, prepare_task
from tablefree.evaluate.task_record import Task
from tablefree.evaluate.tasks import TASKS

SEED = 12
VARIANTS_PER_MUTATION = 5  # x 10 tasks x 10 mutations = 500 variants

_CHOICES = {"text": ["a rock", "a leaf", "the sun", "a cloud"], "label": ["A", "B", "C", "D"]}
VALID_RECORDS: dict[str, list[dict]] = {
    "hellaswag": [
        {
            "ind": 24,
            "activity_label": "Roof shingle removal",
            "ctx_a": "A man is sitting on a roof.",
            "ctx_b": "he",
            "endings": [
                "is using wrap to wrap a pair of skis.",
                "starts pulling up roofing on a roof.",
                "x",
                "y",
            ],
            "label": 1,
        },
        {
            "activity_label": "Clean [title] a sink",
            "ctx_a": "Fill the sink.",
            "ctx_b": "then",
            "endings": ["rinse it.", "café au lait — done.", "burn it", "eat it"],
            "label": "0",
        },
    ],
    "piqa": [
        {
            "goal": "How do I ready a guinea pig cage for it's new occupants?",
            "sol1": "Provide bedding.",
            "sol2": "No",
        },
        {
            "goal": "dresser",
            "sol1": "replace drawer with a bobby pin",
            "sol2": "finish, but with a screwdriver",
        },
    ],
    "lambada": [
        {"text": "In my palm is a clear stone, and inside it is a small ivory statuette. Take the statuette"},
        {"text": 'he said "go away." and she went'},
    ],
    "arc_easy": [
        {"id": "q1", "question": "Which is a living thing?", "choices": _CHOICES, "answerKey": "B"},
        {"id": "q2", "question": "What gives light?", "choices": _CHOICES, "answerKey": "C"},
    ],
    "arc_challenge": [
        {"id": "q3", "question": "Which floats?", "choices": _CHOICES, "answerKey": "D"},
        {"id": "q4", "question": "What is hard?", "choices": _CHOICES, "answerKey": "A"},
    ],
    "winogrande": [
        {
            "sentence": "Sarah was a much better surgeon than Maria so _ always got the easier cases.",
            "option1": "Sarah",
            "option2": "Maria",
            "answer": "2",
        },
        {
            "sentence": "The trophy does not fit in the suitcase because _ is too big.",
            "option1": "trophy",
            "option2": "suitcase",
            "answer": "1",
        },
    ],
    "openbookqa": [
        {"id": "7-980", "question_stem": "The sun is responsible for", "choices": _CHOICES, "answerKey": "C"},
        {
            "id": "7-584",
            "question_stem": "When food is reduced in the stomach",
            "choices": _CHOICES,
            "answerKey": " A",
        },
    ],
    "sciq": [
        {
            "question": "What type of organism is commonly used in preparation of foods?",
            "distractor1": "viruses",
            "distractor2": "protozoa",
            "distractor3": "gymnosperms",
            "correct_answer": "mesophilic organisms",
            "support": "Mesophiles grow best in moderate temperature.",
        },
        {
            "question": "What is Earth's star?",
            "distractor1": "Mars",
            "distractor2": "Vega",
            "distractor3": "Io",
            "correct_answer": "the Sun",
            "support": "",
        },
    ],
    "boolq": [
        {
            "question": "do iran and afghanistan speak the same language",
            "passage": "Persian is spoken.",
            "answer": True,
        },
        {"question": "is the sun a star", "passage": "The Sun is the star at the center.", "answer": False},
    ],
    "copa": [
        {
            "premise": "My body cast a shadow over the grass.",
            "choice1": "The sun was rising.",
            "choice2": "The grass was cut.",
            "question": "cause",
            "idx": 0,
            "label": 0,
        },
        {
            "premise": "The man turned on the faucet.",
            "choice1": "The toilet filled with water.",
            "choice2": "Water flowed from the spout.",
            "question": "effect",
            "idx": 1,
            "label": 1,
        },
    ],
}
PIQA_LABELS = b"0\n1\n"

WRONG_VALUES = [None, True, 1, -1, 2.5, "", "x", [], {}, ["a"], {"k": "v"}, 10**30, "3", "\u0000"]
BAD_BYTES = [b"\xff", b"\xfe", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xc0\xaf", b"\x80"]
BOMS = [b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff", b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff"]


def valid_files() -> dict[str, dict[str, bytes]]:
    """{task: {relative path: bytes}} of a small valid copy of every task's files."""
    files = {}
    for name, task in TASKS.items():
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in VALID_RECORDS[name])
        files[name] = {task.files[0]: text.encode("utf-8")}
        if name == "piqa":
            files[name][task.files[1]] = PIQA_LABELS
    return files


# ------------------------------------------------------------------------------------------------------------
# Mutations: each takes (bytes, rng) and returns the corrupted bytes


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data))]


def flip_bytes(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        out[rng.randrange(len(out))] ^= rng.choice([0x01, 0x20, 0x40, 0x80, 0xFF, rng.randrange(1, 256)])
    return bytes(out)


def _edit_record(data: bytes, rng: random.Random, edit: Callable[[dict, random.Random], None]) -> bytes:
    lines = _lines(data)
    candidates = [i for i, line in enumerate(lines) if line.strip().startswith(b"{")]
    if not candidates:  # the PIQA labels file: replace a label with a wrong value
        i = rng.randrange(len(lines))
        lines[i] = json.dumps(rng.choice(WRONG_VALUES)).encode()
        return b"\n".join(lines)
    i = rng.choice(candidates)
    record = json.loads(lines[i])
    edit(record, rng)
    lines[i] = json.dumps(record, ensure_ascii=rng.random() < 0.5).encode("utf-8")
    return b"\n".join(lines)


def _pick_container(record: dict, rng: random.Random) -> dict:
    nested = [v for v in record.values() if isinstance(v, dict) and v]
    return rng.choice(nested) if nested and rng.random() < 0.3 else record


def delete_field(data: bytes, rng: random.Random) -> bytes:
    def edit(record: dict, rng: random.Random) -> None:
        target = _pick_container(record, rng)
        target.pop(rng.choice(sorted(target)))

    return _edit_record(data, rng, edit)


def wrong_type(data: bytes, rng: random.Random) -> bytes:
    def edit(record: dict, rng: random.Random) -> None:
        target = _pick_container(record, rng)
        key = rng.choice(sorted(target))
        if isinstance(target[key], list) and target[key] and rng.random() < 0.5:
            target[key][rng.randrange(len(target[key]))] = rng.choice(WRONG_VALUES)
        else:
            target[key] = rng.choice(WRONG_VALUES)

    return _edit_record(data, rng, edit)


def huge_number(data: bytes, rng: random.Random) -> bytes:
    number = rng.choice([b"1" * 5000, b"-" + b"9" * 4301, b"1e999", b"-1e400", b"1" * 400 + b".5", b"NaN"])
    lines = _lines(data)
    i = rng.randrange(len(lines))
    # a field's value, or the whole line (for the labels file)
    lines[i] = (
        re.sub(rb':\s*("[^"]*"|\d+|true|false)', b": " + number, lines[i], count=1)
        if b":" in lines[i]
        else number
    )
    return b"\n".join(lines)


def deep_nesting(data: bytes, rng: random.Random) -> bytes:
    depth = rng.choice([2_000, 50_000, 200_000])
    opener, closer = rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
    nested = opener * depth + b"1" + closer * depth
    lines = _lines(data)
    i = rng.randrange(len(lines))
    if b":" in lines[i] and rng.random() < 0.7:
        lines[i] = re.sub(rb':\s*("[^"]*"|\d+|true|false)', lambda m: b": " + nested, lines[i], count=1)
    else:
        lines.insert(i, nested)
    return b"\n".join(lines)


def empty_lines(data: bytes, rng: random.Random) -> bytes:
    lines = _lines(data)
    for _ in range(rng.randint(1, 5)):
        lines.insert(rng.randrange(len(lines) + 1), rng.choice([b"", b" ", b"\t", b"\r", b"  \r", b"\x0b"]))
    if rng.random() < 0.3:  # Windows line ends
        return b"\r\n".join(lines)
    return b"\n".join(lines)


def non_utf8(data: bytes, rng: random.Random) -> bytes:
    if rng.random() < 0.3:
        text = data.decode("utf-8")
        return text.encode(rng.choice(["latin-1", "cp1252", "utf-16-le"]), errors="replace")
    position = rng.randrange(len(data) + 1)
    return data[:position] + rng.choice(BAD_BYTES) + data[position:]


def wrong_bom(data: bytes, rng: random.Random) -> bytes:
    bom = rng.choice(BOMS)
    if rng.random() < 0.3:
        return data.decode("utf-8").encode(rng.choice(["utf-16", "utf-32", "utf-16-be"]))
    if rng.random() < 0.2:  # a BOM in the middle: a stray U+FEFF before a line
        lines = _lines(data)
        i = rng.randrange(len(lines))
        lines[i] = bom + lines[i]
        return b"\n".join(lines)
    return bom + data


def swap_structure(data: bytes, rng: random.Random) -> bytes:
    """Records that parse but are not objects, or whose nested structures are of the wrong kind."""
    lines = _lines(data)
    i = rng.randrange(len(lines))
    lines[i] = rng.choice(
        [b"[]", b"null", b"42", b'"text"', b"{}", b"{", b"}", b'{"a": 1} {"b": 2}', b"[{}]"]
    )
    return b"\n".join(lines)


MUTATIONS: dict[str, Callable[[bytes, random.Random], bytes]] = {
    "truncate": truncate,
    "flip_bytes": flip_bytes,
    "delete_field": delete_field,
    "wrong_type": wrong_type,
    "huge_number": huge_number,
    "deep_nesting": deep_nesting,
    "empty_lines": empty_lines,
    "non_utf8": non_utf8,
    "wrong_bom": wrong_bom,
    "swap_structure": swap_structure,
}


# ------------------------------------------------------------------------------------------------------------
# The independent reader a correct read must agree with


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    keys = [key for key, _ in pairs]
    if len(set(keys)) < len(keys):
        raise ValueError(f"a key twice in {keys}")
    return dict(pairs)


def reference_records(task: Task, root: Path) -> list[dict]:
    """What the files say, read independently: UTF-8 (optional BOM), one JSON object per non-blank line."""

    def lines(path: Path) -> list[str]:
        text = path.read_bytes().decode("utf-8-sig")
        return [line for line in text.split("\n") if line.strip(" \t\r\n\x0b\x0c")]

    records = [json.loads(line, object_pairs_hook=unique_keys) for line in lines(root / task.files[0])]
    if task.name == "piqa":
        labels = lines(root / task.files[1])
        records = [{**r, "label": int(label)} for r, label in zip(records, labels, strict=True)]
    return records


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = " ".join(json.dumps(r) for records in VALID_RECORDS.values() for r in records)
    tokenizer.train_from_iterator([text], trainer=trainer)
    return tokenizer


def classify(task: Task, root: Path, corrupted: Path, tokenizer: Tokenizer) -> str:
    """``read`` or ``error+line`` / ``error`` (our error naming the corrupted file, with / without a line);
    raises AssertionError for anything else."""
    try:
        prepared = prepare_task(task, root)
        encode_task(prepared, tokenizer, max_len=10**9)
    except (ValueError, FileNotFoundError) as error:
        message = str(error)
        files = [str(root / name) for name in task.files]
        assert any(f in message for f in files), f"error names no file of {task.name}: {message[:300]}"
        assert "Traceback" not in message
        return "error+line" if re.search(r"\.(jsonl|lst):\d+: ", message) else "error"
    # a correct read: what an independent reader sees in the same bytes, nothing lost or altered
    try:
        expected = reference_records(task, root)
    except Exception as error:  # any failure of the reference: we accepted a bad file
        raise AssertionError(f"{task.name}: read a file the reference reader refuses ({error!r})") from None
    assert [doc.fields for doc in prepared.docs] == expected, f"{task.name}: garbled read of {corrupted}"
    return "read"


def test_corrupted_eval_files_end_in_our_error_or_a_correct_read(tmp_path, tokenizer) -> None:
    rng = random.Random(SEED)
    outcomes: Counter[str] = Counter()
    by_mutation: dict[str, Counter[str]] = {name: Counter() for name in MUTATIONS}
    failures = []
    variant = 0
    for task_name, files in valid_files().items():
        task = TASKS[task_name]
        for mutation_name, mutate in MUTATIONS.items():
            for _ in range(VARIANTS_PER_MUTATION):
                root = tmp_path / f"v{variant}"
                variant += 1
                for relative, data in files.items():
                    (root / relative).parent.mkdir(parents=True, exist_ok=True)
                    (root / relative).write_bytes(data)
                # mostly the documents file; for PIQA the labels file a third of the time
                relative = (
                    rng.choice(list(files)) if len(files) > 1 and rng.random() < 0.33 else task.files[0]
                )
                corrupted = root / relative
                corrupted.write_bytes(mutate(files[relative], rng))
                try:
                    outcome = classify(task, root, corrupted, tokenizer)
                except AssertionError as error:
                    failures.append(f"{task_name}/{mutation_name}: {error}")
                    continue
                except Exception as error:  # a raw exception: what this test hunts
                    failures.append(
                        f"{task_name}/{mutation_name}: raw {type(error).__name__}: {error!r}"[:400]
                    )
                    continue
                outcomes[outcome] += 1
                by_mutation[mutation_name][outcome] += 1
    print(f"\neval-file fuzz: {variant} variants, outcomes {dict(outcomes)}, failures {len(failures)}")
    for name, counts in by_mutation.items():
        print(f"  {name:<15} {dict(counts)}")
    assert not failures, "\n".join(failures[:20])
    assert variant >= 400
    # both ends are exercised: the mutations find errors, and harmless ones (blank lines, a UTF-8 BOM) still read
    assert outcomes["error+line"] > 0 and outcomes["read"] > 0


def test_the_valid_files_read_correctly(tmp_path, tokenizer) -> None:
    """The fuzz's starting point is itself a correct read of every task (so each error comes from a mutation)."""
    for task_name, files in valid_files().items():
        root = tmp_path / task_name
        for relative, data in files.items():
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / relative).write_bytes(data)
        assert classify(TASKS[task_name], root, root / TASKS[task_name].files[0], tokenizer) == "read"


def duplicate_key(data: bytes, rng: random.Random) -> tuple[bytes, int]:
    """One record with one of its keys written twice, the two values different (the wrong one first or last,
    at the top level or nested); returns the bytes and the line."""
    lines = _lines(data)
    number = rng.choice([i for i, line in enumerate(lines) if line.strip().startswith(b"{")])
    record = json.loads(lines[number])
    containers = [record, *(v for v in record.values() if isinstance(v, dict) and v)]
    container = rng.choice(containers)
    key = rng.choice(list(container))
    wrong = rng.choice([v for v in WRONG_VALUES if v != container[key]])
    marker = "__AGAIN__"
    items = list(container.items())
    items.insert(rng.choice([0, len(items)]), (marker, wrong))  # the wrong value first or last
    container.clear()
    container.update(items)
    text = json.dumps(record, ensure_ascii=False).replace(json.dumps(marker), json.dumps(key))
    lines[number] = text.encode("utf-8")
    return b"\n".join(lines), number + 1


def test_a_key_twice_in_an_eval_record_is_refused_naming_file_and_line(tmp_path, tokenizer) -> None:
    """Issue 26: a record naming a key twice with two values was scored with the last one, silently."""
    rng = random.Random(f"{SEED}-duplicate")
    refused = 0
    for task_name, files in valid_files().items():
        task = TASKS[task_name]
        for variant in range(3):
            root = tmp_path / f"{task_name}{variant}"
            for relative, data in files.items():
                (root / relative).parent.mkdir(parents=True, exist_ok=True)
                (root / relative).write_bytes(data)
            data, line = duplicate_key(files[task.files[0]], rng)
            (root / task.files[0]).write_bytes(data)
            with pytest.raises(ValueError, match="duplicate key") as caught:
                encode_task(prepare_task(task, root), tokenizer, max_len=10**9)
            assert f"{root / task.files[0]}:{line}: " in str(caught.value)
            refused += 1
    print(f"\neval-file duplicate keys: {refused} variants, all refused naming file and line")
    assert refused == 3 * len(TASKS)
