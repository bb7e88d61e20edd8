"""Interoperability verbs: ``export``, ``import-hf``, ``generate`` and ``lm-eval``.

Python API: ``tablefree.export.export_hf`` / ``import_hf``, ``tablefree.generate.generate``, and the lm-eval
adapter ``tablefree.evaluate.lm_eval_adapter``.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from tablefree.checkpoint.model_dir import load_model, read_model_config
from tablefree.checkpoint.tokenizer import checked_tokenizer
from tablefree.cli.eval import limit_arg
from tablefree.export import EXPORT_FORMATS, export_hf, import_hf
from tablefree.fileio import read_json
from tablefree.generate import GenerateSpec, generate, print_stream


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    export = subparsers.add_parser(
        "export",
        help="export a checkpoint to a Hugging Face transformers directory",
        description="Write a plain transformers model directory (LlamaForCausalLM, or GPTNeoXForCausalLM for "
        "the LayerNorm/GELU variant): config.json, model.safetensors, generation_config.json, tokenizer "
        "files and a model card. Every interface is materialised as the V×d embedding table; its options "
        "(and tensors such as affine's A and b) are recorded for import-hf. "
        "Python API: tablefree.export.export_hf(checkpoint, out_dir).",
    )
    export.add_argument("checkpoint", help="checkpoint dir, run dir, or dir of step_* checkpoints (newest)")
    export.add_argument("out_dir", help="output directory")
    export.add_argument("--format", default="hf", choices=EXPORT_FORMATS, help="export format (default: hf)")
    export.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    export.add_argument(
        "--tokenizer", default=None, help="tokenizer.json to ship (default: the checkpoint's)"
    )
    export.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    export.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the checkpoint's sha256 digests and finite-weights check (faster; printed when used)",
    )
    export.set_defaults(func=run_export)

    importer = subparsers.add_parser(
        "import-hf",
        help="load a transformers Llama (or exported GPT-NeoX) directory as a tablefree checkpoint",
        description="Convert a LlamaForCausalLM directory (e.g. one written by `tablefree export`) into a "
        "tablefree checkpoint. The interface recorded at export is restored when the embedding table is "
        "exactly its table; otherwise the table becomes a learned interface (with a warning). config.json is "
        "checked against the weights' headers before anything is loaded. "
        "Python API: tablefree.export.import_hf(hf_dir, out_checkpoint).",
    )
    importer.add_argument("hf_dir", metavar="DIR", help="transformers model directory")
    importer.add_argument("--out", required=True, metavar="CHECKPOINT_DIR", help="checkpoint to write")
    importer.add_argument("--overwrite", action="store_true", help="replace a non-empty CHECKPOINT_DIR")
    importer.set_defaults(func=run_import)

    gen = subparsers.add_parser(
        "generate",
        help="generate text from a checkpoint (KV cache, streamed)",
        description="Continue a prompt with a KV cache, streaming the text to the terminal. Temperature 0 is "
        "greedy decoding (top-k and top-p then change nothing). Python API: tablefree.generate.generate(model, "
        "tokenizer, GenerateSpec(prompt, max_new_tokens, temperature=..., top_k=..., top_p=..., seed=...)).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    gen.add_argument("checkpoint", help="checkpoint dir, run dir, or dir of step_* checkpoints (newest)")
    gen.add_argument(
        "--prompt", default="", help="text to continue; empty starts a new document (default: %(default)r)"
    )
    gen.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate at most (>= 0)")
    gen.add_argument(
        "--temperature", type=float, default=1.0, help="softmax temperature (>= 0); 0 is greedy decoding"
    )
    gen.add_argument(
        "--top-k", type=int, default=None, help="sample from the k likeliest tokens (>= 1); none: all"
    )
    gen.add_argument(
        "--top-p",
        type=float,
        default=None,
        help="sample from the nucleus of this probability, in (0, 1]; none: all",
    )
    gen.add_argument("--seed", type=int, default=None, help="sampling seed; none: nondeterministic")
    gen.add_argument("--device", default="cpu", help="torch device, or auto for cuda when available")
    gen.add_argument("--no-echo", action="store_true", help="do not print the prompt before the continuation")
    gen.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the checkpoint's sha256 digests and finite-weights check (faster; printed when used)",
    )
    gen.set_defaults(func=run_generate)

    lm_eval = subparsers.add_parser(
        "lm-eval",
        help="run lm-evaluation-harness's CLI with the `tablefree` model registered",
        description="Everything after the verb goes to lm-eval's own CLI (`lm-eval run ...`), with the "
        "`tablefree` model adapter registered, e.g. `tablefree lm-eval --model tablefree --model_args "
        "checkpoint=PATH --tasks hellaswag`. Python API: import tablefree.evaluate.lm_eval_adapter, then "
        "lm_eval.simple_evaluate(model='tablefree', model_args={'checkpoint': PATH}, ...). "
        "Needs the interop extra (pip install 'tablefree[interop]').",
        add_help=False,
        prefix_chars="+",  # so that every --option reaches lm-eval untouched
    )
    lm_eval.add_argument("args", nargs=argparse.REMAINDER, help="lm-eval arguments")
    lm_eval.set_defaults(func=run_lm_eval)
    add_lm_eval_tasks(subparsers)


def add_lm_eval_tasks(subparsers: argparse._SubParsersAction) -> None:
    tasks = subparsers.add_parser(
        "lm-eval-tasks",
        help="write lm-eval task definitions that read the local evaluation files (offline)",
        description="For each task, a YAML that includes lm-eval's official task config and reads the same "
        "official-format files `tablefree eval` reads, for `lm-eval --include_path OUT_DIR` (no downloads). "
        "Python API: tablefree.evaluate.lm_eval_adapter.write_local_tasks(out_dir, data_dir, tasks, limit).",
    )
    tasks.add_argument("out_dir", help="directory for the YAML and data files")
    tasks.add_argument(
        "--eval-data", default=None, help="eval data dir (default: $TABLEFREE_EVAL_DATA, cache)"
    )
    tasks.add_argument(
        "--tasks",
        default=None,
        help="comma-separated task names, as `tablefree eval --tasks` takes them (default: all ten)",
    )
    tasks.add_argument(
        "--limit",
        type=limit_arg,
        default=None,
        metavar="N",
        help="first N >= 1 records of each task (default: all)",
    )
    tasks.add_argument(
        "--prefix", default="tablefree_", help="lm-eval task name prefix (default: tablefree_)"
    )
    tasks.set_defaults(func=run_lm_eval_tasks)


def _adapter():
    """The lm-eval adapter module; a clear error when the interop extra is missing."""
    try:
        from tablefree.evaluate import lm_eval_adapter
    except ModuleNotFoundError as error:
        raise ValueError(
            f"{error.name} is not installed; install the interop extra: pip install 'tablefree[interop]'"
        ) from None
    return lm_eval_adapter


def run_lm_eval_tasks(args: argparse.Namespace) -> int:
    names = _adapter().write_local_tasks(
        args.out_dir, args.eval_data, args.tasks, limit=args.limit, prefix=args.prefix
    )
    for ours, theirs in names.items():
        print(f"{ours:>14} -> {theirs}")
    print(
        f"run: tablefree lm-eval --model tablefree --model_args checkpoint=CHECKPOINT "
        f"--include_path {Path(args.out_dir).resolve()} --tasks {','.join(names.values())}"
    )
    return 0


def run_export(args: argparse.Namespace) -> int:
    out = export_hf(
        args.checkpoint,
        args.out_dir,
        dtype=args.dtype,
        tokenizer_path=args.tokenizer,
        overwrite=args.overwrite,
        verify=not args.no_verify,
    )
    print(f"exported {args.checkpoint} -> {out}")
    return 0


def run_import(args: argparse.Namespace) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = import_hf(args.hf_dir, args.out, overwrite=args.overwrite)
    for warning in caught:  # e.g. a recorded interface whose table was changed: imported as learned
        print(f"tablefree import-hf: warning: {warning.message}", file=sys.stderr)
    interface = read_model_config(out).interface
    print(f"imported {args.hf_dir} -> {out} (interface: {interface.name})")
    return 0


def run_generate(args: argparse.Namespace) -> int:
    spec = GenerateSpec(  # checked here, before any work
        args.prompt,
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    )
    if is_hf_export(args.checkpoint):
        raise FileNotFoundError(
            f"{args.checkpoint} is a Hugging Face model folder, not a tablefree checkpoint: convert it with "
            f"`tablefree import-hf {args.checkpoint} --out DIR`, then `tablefree generate DIR`, or load it with "
            "transformers' AutoModelForCausalLM"
        )
    model, directory = load_model(args.checkpoint, device=args.device, verify=not args.no_verify)
    tokenizer, _ = checked_tokenizer(directory)  # the tokenizer whose hash the checkpoint recorded
    if not args.no_echo:
        print_stream(args.prompt)
    try:
        generate(model, tokenizer, spec, stream=print_stream)
    finally:
        print()  # end the streamed line, also before an error message
    return 0


def is_hf_export(path: str | Path) -> bool:
    """A Hugging Face model folder (``config.json`` naming its architectures), as ``tablefree export`` writes."""
    config = Path(path) / "config.json"
    return config.is_file() and isinstance((read_json(config) or {}).get("architectures"), list)


def run_lm_eval(args: argparse.Namespace) -> int:
    run_cli = _adapter().run_cli
    if args.args in ([], ["-h"], ["--help"]):
        print("usage: tablefree lm-eval [lm-eval run arguments]  (see `lm-eval run --help` below)\n")
        run_cli(["run", "--help"] if args.args else ["--help"])
        return 0
    run_cli(args.args)
    return 0
