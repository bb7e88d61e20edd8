from __future__ import annotations

import itertools
import random

import pytest
from tokenizers import Tokenizer, models

from tablefree.cli import main
from tablefree.data.corpus import Corpus
from tablefree.data.tokenizer import (
    EOT,
    eot_id,
    is_split_safe,
    load_tokenizer,
    split_points,
    tokenizer_hash,
    train_tokenizer,
)

SMALL = "corpus/gutenberg-mix/literature/poetry"
SMALL_FILES = ["william.blake.poems.txt", "t.s.eliot.poems.txt", "edward.lear.book.of.nonsense.txt"]


@pytest.fixture(scope="module")
def small_corpus(shared_data):
    return [shared_data / SMALL / name for name in SMALL_FILES]


@pytest.fixture(scope="module")
def trained(small_corpus, tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    return train_tokenizer(small_corpus, 600, path).tokenizer, path


def test_training_is_deterministic_and_has_eot(trained, small_corpus, tmp_path) -> None:
    tokenizer, path = trained
    trained_again = train_tokenizer(small_corpus, 600, tmp_path / "again.json")
    again = trained_again.tokenizer
    assert tokenizer_hash(again) == tokenizer_hash(tokenizer) == tokenizer_hash(path)
    assert (tmp_path / "again.json").read_bytes() == path.read_bytes()
    assert tokenizer.get_vocab_size() == 600
    assert eot_id(tokenizer) == tokenizer.token_to_id(EOT) == 0
    assert trained_again.vocab_size == 600 and trained_again.shortfall() is None
    assert trained_again.summary.documents == len(small_corpus)  # what reading the corpus found comes with it
    other = train_tokenizer(small_corpus[:2], 600).tokenizer
    assert tokenizer_hash(other) != tokenizer_hash(tokenizer)


def test_any_text_round_trips_exactly(trained, small_corpus) -> None:
    tokenizer, _ = trained
    texts = [
        "Hello, world!  Two spaces,\ttabs,\r\nCRLF and a form feed\x0c.",
        "Unicode: café, naïve, 東京, emoji 🙂👍🏽, math ∑ᵢ xᵢ², RTL שלום",
        "\x00\x01 control bytes and a lone combining mark \u0301",
        f"text containing the literal {EOT} string",
        "",
        *Corpus(small_corpus[1]).documents(),  # decoded from Latin-1
    ]
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_load_tokenizer_file_dir_and_errors(trained, tmp_path, monkeypatch) -> None:
    tokenizer, path = trained
    assert tokenizer_hash(load_tokenizer(path)) == tokenizer_hash(tokenizer)
    assert tokenizer_hash(load_tokenizer(path.parent)) == tokenizer_hash(tokenizer)
    with pytest.raises(FileNotFoundError, match="tokenizer file not found"):
        load_tokenizer(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match=r"not a Hugging Face tokenizer\.json"):
        load_tokenizer(tmp_path / "bad.json")
    # Nothing downloads in tests: the hub download is replaced by one that fails as an offline machine does
    # (HF_HUB_OFFLINE alone stops working once huggingface_hub has read its settings in an earlier test).
    huggingface_hub = pytest.importorskip("huggingface_hub")
    asked = []

    def offline(repo_id: str, filename: str, **kwargs) -> str:
        asked.append((repo_id, filename))
        raise OSError("offline: no network")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(FileNotFoundError, match=r"hub.*OSError: offline"):
        load_tokenizer("HuggingFaceTB/SmolLM-135M")
    assert asked == [("HuggingFaceTB/SmolLM-135M", "tokenizer.json")]


def test_eot_id_alternatives_and_absence() -> None:
    tokenizer = Tokenizer(models.BPE())
    with pytest.raises(ValueError, match="no end-of-text token"):
        eot_id(tokenizer)
    tokenizer.add_special_tokens(["<s>", "</s>"])
    assert eot_id(tokenizer) == tokenizer.token_to_id("</s>")


def test_piecewise_encoding_is_exact(trained, small_corpus) -> None:
    """prepare encodes long documents in pieces cut by split_points; the tokens must equal the whole's."""
    tokenizer, _ = trained
    assert is_split_safe(tokenizer)
    rng = random.Random(0)
    alphabet = [
        "a",
        "Z",
        " ",
        "  ",
        "\n",
        "\n\n",
        "\t",
        "'s",
        ".",
        "1",
        "é",
        "\r\n",
        " \n",
        "\xa0",
        "\x0b",
        "\x85",
        "\x1c",
        "\u2003",
        "\n  ",
    ]
    texts = ["".join(rng.choice(alphabet) for _ in range(3000)) for _ in range(20)]
    texts += list(Corpus(small_corpus).documents())
    for text in texts:
        cuts = [0, *split_points(text, 97), len(text)]
        assert len(cuts) > 2
        pieces = [text[a:b] for a, b in itertools.pairwise(cuts)]
        assert "".join(pieces) == text
        joined = [i for e in tokenizer.encode_batch(pieces, add_special_tokens=False) for i in e.ids]
        assert joined == tokenizer.encode(text, add_special_tokens=False).ids


def test_tokenizer_train_verb(small_corpus, tmp_path, capsys) -> None:
    out = tmp_path / "t.json"
    assert main(["tokenizer", "train", *map(str, small_corpus), "--vocab-size", "400", "-o", str(out)]) == 0
    assert load_tokenizer(out).get_vocab_size() == 400
    assert tokenizer_hash(out) in capsys.readouterr().out
    assert main(["tokenizer", "train", str(small_corpus[0]), "--vocab-size", "100", "-o", str(out)]) == 1


def test_tokenizer_train_reports_junk_and_an_unfilled_vocabulary(tmp_path, capsys) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text('{"text": "ab ab ab ab abc abc"}\n{broken\n', encoding="utf-8")
    out = tmp_path / "t.json"
    assert main(["tokenizer", "train", str(corpus), "--vocab-size", "300", "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert "a.jsonl:2: invalid-json" in captured.out  # junk named as `data prepare` names it
    got = load_tokenizer(out).get_vocab_size()
    assert got < 300
    assert f"the corpus filled {got} of the 300 tokens asked for" in captured.err
