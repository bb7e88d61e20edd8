"""``tablefree tokenizer train``, ``tablefree data prepare|scan|download-evals`` (Python API:
``tablefree.data.tokenizer.train_tokenizer``, ``tablefree.data.prepare.prepare_dataset``,
``tablefree.data.corpus.Corpus``, ``tablefree.evaluate.download.download_evals``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tablefree.data.corpus import Corpus
from tablefree.data.decoding import DEFAULT_MAX_EXPANSION
from tablefree.data.documents import SPLIT_RULES, split_rule_name
from tablefree.data.prepare import (
    DEFAULT_SHARD_TOKENS,
    DEFAULT_VAL_DOCUMENTS,
    DEFAULT_VAL_MAX_TOKENS,
    DEFAULT_VAL_SECTION_CHARS,
    DEFAULT_VOCAB_SIZE,
    KEYED_HASH_RULE,
    PLAN_RULE,
    HubSource,
    PrepareSpec,
    adopt_shards,
    merge_parts,
    prepare_part,
    prepare_single,
)
from tablefree.data.sources import MAX_JUNK_ITEMS
from tablefree.data.spans import DEFAULT_SPAN_BYTES
from tablefree.data.tokenizer import eot_id, tokenizer_hash, train_tokenizer
from tablefree.data.verify import verify_dataset


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    _add_tokenizer(subparsers)
    _add_data(subparsers)


def _add_corpus_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--text-field", default="text", help="JSONL field / parquet or Arrow column holding the text"
    )
    parser.add_argument("--strict", action="store_true", help="stop at the first junk (naming file and line)")
    parser.add_argument(
        "--strip-gutenberg",
        action="store_true",
        help="keep only the text between Project Gutenberg's START/END lines",
    )
    parser.add_argument(
        "--max-expansion",
        type=float,
        default=DEFAULT_MAX_EXPANSION,
        metavar="RATIO",
        help="refuse a .gz/.zst file that expands more than RATIO times its compressed bytes, plus 1 MiB "
        "(a decompression bomb; text compresses 3-5x; default: %(default)g)",
    )


def _add_tokenizer(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tokenizer",
        help="train a byte-level BPE tokenizer",
        description="Tokenizer tools. Python API: tablefree.data.tokenizer.",
    )
    verbs = parser.add_subparsers(dest="tokenizer_verb", metavar="VERB", required=True)
    train = verbs.add_parser(
        "train",
        help="train a byte-level BPE tokenizer on a corpus",
        description="Train a deterministic byte-level BPE tokenizer (with <|endoftext|>) on .txt/.jsonl/.parquet "
        "files or directories. Python API: tablefree.data.tokenizer.train_tokenizer(CORPUS, vocab_size, out_path).",
    )
    train.add_argument("corpus", nargs="+", help="files or directories")
    train.add_argument(
        "--vocab-size", type=int, required=True, help="vocabulary size, <|endoftext|> included"
    )
    train.add_argument("-o", "--out", required=True, help="where to write tokenizer.json")
    train.add_argument("--min-frequency", type=int, default=2, help="minimum count of a merged pair")
    _add_corpus_options(train)
    train.set_defaults(func=run_tokenizer_train)


def _add_data(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "data",
        help="prepare token shards, scan a corpus, verify a dataset, download evaluation data",
        description="Data tools. Python API: tablefree.data.prepare, tablefree.data.corpus, tablefree.evaluate.download.",
    )
    verbs = parser.add_subparsers(dest="data_verb", metavar="VERB", required=True)

    prepare = verbs.add_parser(
        "prepare",
        help="tokenize a corpus into train/val shards with a manifest",
        description="Tokenize a corpus (or a streamed hub dataset) into llm.c-format train/val shards with "
        "manifest.json; re-running after an interruption completes the missing shards. "
        "Python API: tablefree.data.prepare.prepare_dataset(CORPUS, OUT, tokenizer=..., ...).",
    )
    _add_prepare_arguments(prepare)
    prepare.add_argument(
        "--part",
        type=_part,
        metavar="I/N",
        help="prepare only the I-th of N shares of the corpus (contiguous runs of whole files, parquet row groups "
        "and .jsonl byte ranges; of a --hub dataset, its --hub-data-files), needs --tokenizer and --split-rule "
        "keyed-hash, into OUT/parts/; "
        "`data merge` with the same arguments joins the N parts (docs/data.md)",
    )
    prepare.set_defaults(func=run_prepare)

    merge = verbs.add_parser(
        "merge",
        help="join the parts of `data prepare --part I/N` into one dataset",
        description="Join the N parts that `data prepare --part I/N` wrote into OUT/parts/ into the dataset: "
        "shards, validation split and manifest byte-identical to a single `data prepare` of the same corpus with "
        "the same settings (the manifest's `created` time aside). Give the same CORPUS and options as the parts. "
        "Python API: prepare_dataset(CORPUS, OUT, tokenizer=..., merge=True).",
    )
    _add_prepare_arguments(merge)
    merge.set_defaults(func=run_prepare, part=None)

    scan = verbs.add_parser(
        "scan",
        help="report a corpus's files, encodings and junk",
        description="Read a corpus once and report files, documents, encodings (and fallbacks) and junk; a "
        "progress bar on stderr counts the bytes read. Python API: tablefree.data.corpus.Corpus(PATHS).scan().",
    )
    scan.add_argument("corpus", nargs="+", help="files or directories")
    scan.add_argument("--json", action="store_true", help="print JSON")
    scan.add_argument(
        "--no-progress", action="store_true", help="no progress bar (bytes read, file being read; on stderr)"
    )
    _add_corpus_options(scan)
    scan.set_defaults(func=run_scan)

    adopt = verbs.add_parser(
        "adopt",
        help="write a manifest for llm.c / modded-nanogpt shards so tablefree can train on them",
        description="Make a dataset directory of shards written by llm.c or modded-nanogpt (same header, uint16 "
        "tokens): check each header, copy the tokenizer in, and write manifest.json. "
        "Python API: tablefree.data.prepare.adopt_shards(DIR, tokenizer, train=[...], val=[...]).",
    )
    adopt.add_argument("dir", help="directory holding the .bin shards")
    adopt.add_argument("--tokenizer", required=True, help="the tokenizer the shards were made with")
    adopt.add_argument("--train", nargs="+", required=True, help="train shard files (in DIR), or a glob")
    adopt.add_argument("--val", nargs="*", default=[], help="val shard files (in DIR), or a glob")
    adopt.set_defaults(func=run_adopt)

    verify = verbs.add_parser(
        "verify",
        help="check a prepared dataset's shards against its manifest",
        description="Check every shard of a prepared dataset against manifest.json: present, header valid, "
        "token count as recorded, and (unless --no-hash) its sha256, its token ids below vocab_size and the "
        "tokenizer's hash. Exit status 1 when anything is wrong. "
        "Python API: tablefree.data.verify.verify_dataset(DIR, hashes=True).",
    )
    verify.add_argument("dir", help="dataset directory (holding manifest.json)")
    verify.add_argument(
        "--no-hash", action="store_true", help="check sizes and headers only (fast on any size)"
    )
    verify.set_defaults(func=run_verify)

    download = verbs.add_parser(
        "download-evals",
        help="download the zero-shot evaluation sets, verifying sha256",
        description="Download HellaSwag, PIQA, LAMBADA (and the extra sets) from their official locations into "
        "DIR, verifying each file's sha256. Python API: tablefree.evaluate.download.download_evals(DIR, ...).",
    )
    download.add_argument("dir", help="destination directory (use it as --eval-data / TABLEFREE_EVAL_DATA)")
    download.add_argument(
        "--tasks",
        default="all",
        help="comma-separated task names, as `tablefree eval --tasks` takes them (default: all)",
    )
    download.add_argument("--base-url", help="a mirror serving the files under the same relative paths")
    download.add_argument("--force", action="store_true", help="download again even if present and verified")
    download.set_defaults(func=run_download)
    _add_embedded_corpus(verbs)


def _add_prepare_arguments(prepare: argparse.ArgumentParser) -> None:
    prepare.add_argument("corpus", nargs="*", help="files or directories (omit with --hub)")
    prepare.add_argument("--out", required=True, help="dataset directory")
    prepare.add_argument(
        "--tokenizer", help="tokenizer.json, a directory holding one, or a hub id; default: train one"
    )
    prepare.add_argument(
        "--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE, help="when training a tokenizer"
    )
    prepare.add_argument(
        "--val-fraction",
        type=float,
        default=0.005,
        help="fraction of documents for val (at most max(this, 10%%) of the text is held out)",
    )
    prepare.add_argument(
        "--val-documents",
        type=int,
        default=DEFAULT_VAL_DOCUMENTS,
        help="validation documents wanted at least, from different sources (default: %(default)s)",
    )
    prepare.add_argument(
        "--val-section-chars",
        type=int,
        default=DEFAULT_VAL_SECTION_CHARS,
        help="characters of a validation section held out of a long document (default: %(default)s, ~20k tokens)",
    )
    prepare.add_argument(
        "--split-rule",
        choices=SPLIT_RULES,
        default=PLAN_RULE,
        help=f"how documents go to val: {KEYED_HASH_RULE} (each document alone, by a keyed hash of its file and "
        "position; nothing kept per document): pass it for a large corpus (millions of documents) and for every "
        f"--part run and `data merge`; or {PLAN_RULE} (default, so that the shipped studies' datasets are "
        "reproduced byte for byte: a seeded plan over every document's length, which needs one number per "
        "document in memory and one process)",
    )
    prepare.add_argument(
        "--val-max-tokens",
        type=int,
        default=DEFAULT_VAL_MAX_TOKENS,
        help=f"{KEYED_HASH_RULE} only: validation documents that start after val holds this many tokens are left "
        "out of both splits (default: %(default)s)",
    )
    prepare.add_argument(
        "--span-bytes",
        type=int,
        default=DEFAULT_SPAN_BYTES,
        help=f"{KEYED_HASH_RULE} only: an uncompressed .jsonl is read (and split into parts) in byte ranges of this "
        "size (default: %(default)s); parquet by row groups",
    )
    prepare.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="tokenizing processes")
    prepare.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS, help="tokens per shard")
    prepare.add_argument("--seed", type=int, default=0, help="seed of the train/val split")
    prepare.add_argument("--overwrite", action="store_true", help="discard a dataset or partial run in --out")
    prepare.add_argument("--no-progress", action="store_true", help="no progress bar")
    hub = prepare.add_argument_group("streaming a Hugging Face dataset (needs the `hub` extra and network)")
    hub.add_argument("--hub", metavar="NAME", help="dataset name, e.g. HuggingFaceFW/fineweb-edu")
    hub.add_argument("--hub-config", metavar="CONFIG", help="e.g. sample-10BT")
    hub.add_argument("--hub-split", default="train")
    hub.add_argument(
        "--hub-data-files", nargs="+", metavar="FILE", help="data files (e.g. with --hub parquet)"
    )
    hub.add_argument("--max-documents", type=int, help="stop after this many documents")
    _add_corpus_options(prepare)


def _part(text: str) -> tuple[int, int]:
    index, _, total = text.partition("/")
    try:
        part = int(index), int(total)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N (e.g. 2/8), got {text!r}") from None
    if not 1 <= part[0] <= part[1]:
        raise argparse.ArgumentTypeError(f"expected I/N with 1 <= I <= N, got {text!r}")
    return part


def _add_embedded_corpus(verbs: argparse._SubParsersAction) -> None:
    corpus = verbs.add_parser(
        "embedded-corpus",
        help="write the embedded default corpus (Python and PyTorch documentation text), offline",
        description="Gather English documentation text that ships with every Python and PyTorch install (the "
        "demo's default corpus, about 4.5 MB) into OUT as JSONL, one {text, source} document a line, with "
        "corpus.json beside it describing what was gathered. Deterministic for a given Python and PyTorch. "
        "Python API: tablefree.demo.gather_default_corpus(OUT). See docs/demo.md.",
    )
    corpus.add_argument("out", metavar="OUT", help="the JSONL file to write, e.g. corpus/docs.jsonl")
    corpus.set_defaults(func=run_embedded_corpus)


def run_tokenizer_train(args: argparse.Namespace) -> int:
    trained = train_tokenizer(
        args.corpus,
        args.vocab_size,
        args.out,
        text_field=args.text_field,
        strict=args.strict,
        gutenberg=args.strip_gutenberg,
        min_frequency=args.min_frequency,
        max_expansion=args.max_expansion,
    )
    for line in corpus_report(trained.summary.as_dict()):
        print(line)
    tokenizer = trained.tokenizer
    print(
        f"wrote {args.out}: vocab {trained.vocab_size}, eot_id {eot_id(tokenizer)}, "
        f"sha256 {tokenizer_hash(tokenizer)}"
    )
    if trained.shortfall():
        print(f"warning: {trained.shortfall()}", file=sys.stderr)
    return 0


def corpus_report(corpus: dict, max_items: int = 10) -> list[str]:
    """What reading a corpus found, as `data prepare` and `tokenizer train` print it: files, documents,
    encodings and fallbacks, then the junk by kind and the first items by file and line (or byte offset)."""
    lines = []
    if "encoding_fallbacks" in corpus:
        lines.append(
            f"read {corpus['files']} files, {corpus['documents']:,} documents; "
            f"encodings {corpus['encodings']} ({corpus['encoding_fallbacks']} fallbacks"
            + (": " + ", ".join(corpus["fallback_files"][:max_items]) if corpus.get("fallback_files") else "")
            + ")"
        )
    junk = corpus.get("junk_items", [])
    if junk:
        # counts by kind; a hub manifest prepared before they were kept lists every item instead
        total = sum(corpus["junk"].values()) if "junk" in corpus else len(junk)
        lines.append(
            f"junk skipped ({total:,}): " + ", ".join(f"{k} {n:,}" for k, n in corpus.get("junk", {}).items())
        )
        for item in junk[:max_items]:
            line = f":{item['line']}" if item["line"] is not None else ""
            lines.append(f"  {item['file']}{line}: {item['kind']}: {item['detail']}")
        if total > max_items:
            lines.append(
                f"  ... and {total - max_items:,} more (`tablefree data scan --json` names the first "
                f"{MAX_JUNK_ITEMS} of each file and kind and counts them all by file)"
            )
    return lines


def run_prepare(args: argparse.Namespace) -> int:
    hub = None
    if args.hub:
        hub = HubSource(args.hub, args.hub_config, args.hub_split, args.hub_data_files)
    elif not args.corpus:
        raise ValueError("give CORPUS paths, or --hub NAME")
    finished_before = (Path(args.out) / "manifest.json").exists() and not args.overwrite
    spec = PrepareSpec(
        corpus=tuple(args.corpus),
        hub=hub,
        tokenizer=args.tokenizer,
        vocab_size=args.vocab_size,
        split_rule=args.split_rule,
        val_fraction=args.val_fraction,
        val_documents=args.val_documents,
        val_section_chars=args.val_section_chars,
        val_max_tokens=args.val_max_tokens,
        workers=args.workers,
        shard_tokens=args.shard_tokens,
        seed=args.seed,
        text_field=args.text_field,
        strict=args.strict,
        gutenberg=args.strip_gutenberg,
        max_expansion=args.max_expansion,
        span_bytes=args.span_bytes,
        max_documents=args.max_documents,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
    if args.part is not None:
        manifest = prepare_part(spec, args.out, args.part)
    elif args.data_verb == "merge":
        manifest = merge_parts(spec, args.out)
    else:
        manifest = prepare_single(spec, args.out)
    if args.part is not None:
        index, total = args.part
        for split, info in manifest["splits"].items():
            print(f"part {index}/{total} {split}: {info['documents']:,} documents, {info['tokens']:,} tokens")
        print(
            f"written to {os.path.join(args.out, 'parts')}; after all {total} parts: `tablefree data merge` (same arguments)"
        )
        return 0
    for line in corpus_report(manifest["corpus"]):
        print(line)
    for split, info in manifest["splits"].items():
        print(
            f"{split}: {info['documents']:,} documents, {info['tokens']:,} tokens, {len(info['shards'])} shards"
            + (_train_documents_note(manifest) if split == "train" else "")
        )
    print(f"split rule: {split_rule_name(manifest['settings'])}")
    for line in validation_summary(manifest, args.val_documents):
        print(line)
    if args.tokenizer is None and manifest["vocab_size"] < args.vocab_size:
        print(
            f"warning: the corpus filled {manifest['vocab_size']} of the {args.vocab_size} tokens asked for "
            f"(--vocab-size); the dataset uses {manifest['vocab_size']}",
            file=sys.stderr,
        )
    done = "already held this dataset, nothing written:" if finished_before else "wrote"
    print(
        f"{done} {args.out}/manifest.json (tokenizer {manifest['tokenizer_hash'][:16]}…, vocab {manifest['vocab_size']})"
    )
    return 0


def _validation_parts(manifest: dict) -> tuple[int, int, int] | None:
    """(documents held out whole, sections, long documents the sections were cut from), when recorded."""
    items = (manifest.get("validation") or {}).get("items") or []
    if not items or "file" not in items[0]:
        return None
    whole = sum(1 for item in items if item.get("whole"))
    cut_from = {(item["file"], item.get("document_in_file")) for item in items if not item.get("whole")}
    return whole, len(items) - whole, len(cut_from)


def _train_documents_note(manifest: dict) -> str:
    """Why train + validation documents are not the documents read: the held-out ones, and the parts a long
    document leaves in train around its validation section (each counted as a document)."""
    parts, read = _validation_parts(manifest), (manifest.get("corpus") or {}).get("documents")
    if parts is None or not isinstance(read, int):
        return ""
    if (manifest.get("validation") or {}).get("dropped_documents"):
        return " (besides the validation documents the cap left out: see below)"
    whole, _, long = parts
    pieces = manifest["splits"]["train"]["documents"] - (read - whole)
    return (
        f" (the {read - whole:,} of {read:,} documents read not held out whole; the {long} long documents that "
        f"lent a section add {pieces} for the parts around it)"
        if long
        else f" (the {read - whole:,} of {read:,} documents read not held out)"
    )


def validation_summary(manifest: dict, wanted: int) -> list[str]:
    """What the validation split holds, and a warning when it is too small for a document-level bootstrap."""
    record = manifest.get("validation") or {}
    documents = record.get("documents", manifest["splits"]["val"]["documents"])
    lines = [f"validation: {documents:,} documents, {record.get('tokens', 0):,} tokens"]
    parts = _validation_parts(manifest)
    if "source_documents" in record and parts is not None:
        whole, sections, long = parts
        lines[0] += (
            f" ({whole} documents held out whole and {sections} sections of about {record['section_chars']:,} "
            f"characters cut from {long} long documents: {record['source_documents']} source documents)"
        )
    elif "source_documents" in record:
        lines[0] += (
            f" ({record['sections']} sections of {record['section_chars']:,} characters, "
            f"from {record['source_documents']} source documents)"
        )
    if record.get("dropped_documents"):
        lines.append(
            f"the validation cap (--val-max-tokens {record['max_tokens']:,}) left out {record['dropped_documents']:,} "
            "more validation documents: they are in neither split"
        )
    if documents < wanted or record.get("source_documents", documents) < 2:
        lines.append(
            f"warning: the validation split holds {documents} documents from "
            f"{record.get('source_documents', documents)} sources (wanted {wanted}): too few for a "
            "document-level bootstrap; use a larger corpus or a larger --val-fraction"
        )
    return lines


def run_scan(args: argparse.Namespace) -> int:
    summary = Corpus(
        args.corpus,
        text_field=args.text_field,
        strict=args.strict,
        gutenberg=args.strip_gutenberg,
        max_expansion=args.max_expansion,
    ).scan(progress=not args.no_progress)
    if args.json:
        json.dump(summary.as_dict(), sys.stdout, indent=2)
        print()
    else:
        print(summary.format())
    return 0


def run_adopt(args: argparse.Namespace) -> int:
    def expand(patterns: list[str]) -> list[Path]:
        files = []
        for pattern in patterns:
            matched = sorted(Path(args.dir).glob(pattern))
            if not matched:
                raise FileNotFoundError(f"no shard matches {pattern!r} in {args.dir}")
            files += matched
        return files

    manifest = adopt_shards(args.dir, args.tokenizer, expand(args.train), expand(args.val))
    for split, info in manifest["splits"].items():
        print(
            f"{split}: {len(info['shards'])} shards, {info['tokens']:,} tokens, {info['documents']:,} documents"
        )
    print(f"wrote {args.dir}/manifest.json")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    check = verify_dataset(args.dir, hashes=not args.no_hash)
    print(check.format())
    return 0 if check.ok else 1


def run_download(args: argparse.Namespace) -> int:
    from tablefree.evaluate.download import download_evals

    for path in download_evals(args.dir, tasks=args.tasks, base_url=args.base_url, force=args.force):
        print(f"ok {path}")
    return 0


def run_embedded_corpus(args: argparse.Namespace) -> int:
    from tablefree.demo import gather_default_corpus

    stats = gather_default_corpus(args.out)
    print(
        f"wrote {args.out}: {stats['documents']:,} documents, {stats['text_bytes'] / 1e6:.2f} MB of text "
        f"(Python {stats['python']}, torch {stats['torch']}; sha256 {stats['sha256'][:16]}…)"
    )
    return 0
