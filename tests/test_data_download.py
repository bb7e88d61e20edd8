from __future__ import annotations

import functools
import hashlib
import io
import json
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tablefree.cli import main
from tablefree.evaluate.download import EVAL_FILES, download_evals


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def serve():
    servers = []

    def start(directory) -> str:
        handler = functools.partial(QuietHandler, directory=str(directory))
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def known_sums(shared_data) -> dict[str, str]:
    lines = (shared_data / "SHA256SUMS-eval").read_text().split("\n")
    return {name: digest for digest, name in (line.split() for line in lines if line.strip())}


def test_every_eval_file_has_the_published_sha256(shared_data) -> None:
    assert {f.path: f.sha256 for f in EVAL_FILES} == known_sums(shared_data)


def test_downloads_are_derived_from_the_task_records() -> None:
    """One record per task: its files, URLs and sha256s are what download-evals fetches, under its name."""
    from tablefree.evaluate.tasks import TASKS

    assert [(f.task, f.path, f.url, f.sha256) for f in EVAL_FILES] == [
        (task.name, d.path, d.url, d.sha256) for task in TASKS.values() for d in task.data
    ]
    assert {f.task for f in EVAL_FILES} == set(TASKS)


def test_download_from_a_mirror_verifies_and_skips(shared_data, serve, tmp_path) -> None:
    url = serve(shared_data / "eval")
    out = tmp_path / "eval"
    paths = download_evals(out, base_url=url)
    sums = known_sums(shared_data)
    assert sorted(p.relative_to(out).as_posix() for p in paths) == sorted(sums)
    for path in paths:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sums[path.relative_to(out).as_posix()]
    assert not list(out.rglob(".*.tmp"))
    # Present and verified: kept without touching the network (a dead mirror would fail otherwise).
    mtime = (out / "hellaswag_val.jsonl").stat().st_mtime_ns
    download_evals(out, ["hellaswag"], base_url="http://127.0.0.1:9")
    assert (out / "hellaswag_val.jsonl").stat().st_mtime_ns == mtime


def test_corrupted_file_and_404_are_errors(shared_data, serve, tmp_path) -> None:
    mirror = tmp_path / "mirror"
    (mirror / "piqa").mkdir(parents=True)
    data = bytearray((shared_data / "eval/lambada_test.jsonl").read_bytes())
    data[1000] ^= 0x20
    (mirror / "lambada_test.jsonl").write_bytes(bytes(data))
    url = serve(mirror)
    out = tmp_path / "eval"
    with pytest.raises(ValueError, match=r"sha256 mismatch for lambada_test\.jsonl"):
        download_evals(out, ["lambada_openai"], base_url=url)
    assert not (out / "lambada_test.jsonl").exists() and not list(out.rglob("*.tmp"))
    with pytest.raises(FileNotFoundError, match="HTTP 404"):
        download_evals(out, ["piqa"], base_url=url)
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        download_evals(out, ["nope"])


def test_parquet_source_is_converted_to_the_known_jsonl(shared_data, serve, tmp_path) -> None:
    """The extra sets come from hub parquet files; a parquet holding the same rows converts byte-exactly."""
    mirror = tmp_path / "hub"
    mirror.mkdir()
    for name in ("arc_easy_validation", "sciq_validation", "boolq_validation"):
        rows = [
            json.loads(line) for line in (shared_data / f"eval/extra/{name}.jsonl").read_text().splitlines()
        ]
        buffer = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), buffer)
        (mirror / f"{name}.parquet").write_bytes(buffer.getvalue())
    url = serve(mirror)
    out = tmp_path / "eval"
    urls = {
        f"extra/{n}.jsonl": f"{url}/{n}.parquet"
        for n in ("arc_easy_validation", "sciq_validation", "boolq_validation")
    }
    paths = download_evals(out, ["arc_easy", "sciq", "boolq"], urls=urls)
    for path in paths:
        assert path.read_bytes() == (shared_data / "eval" / path.relative_to(out)).read_bytes()


def test_download_verb(shared_data, serve, tmp_path, capsys) -> None:
    url = serve(shared_data / "eval")
    assert (
        main(["data", "download-evals", str(tmp_path / "e"), "--tasks", "piqa,copa", "--base-url", url]) == 0
    )
    assert capsys.readouterr().out.count("ok ") == 3
    # the same names as `tablefree eval --tasks`, with lm-eval's name as an alias
    assert main(["data", "download-evals", str(tmp_path / "e"), "--tasks", "lambada", "--base-url", url]) == 0
    assert capsys.readouterr().out.count("ok ") == 1
    assert (
        main(
            [
                "data",
                "download-evals",
                str(tmp_path / "e"),
                "--tasks",
                "lambada_openai,hellaswag,piqa",
                "--base-url",
                url,
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.count("ok ") == 4
    shutil.rmtree(tmp_path / "e")
    assert (
        main(
            ["data", "download-evals", str(tmp_path / "e"), "--tasks", "piqa", "--base-url", url + "/missing"]
        )
        == 1
    )
    assert "HTTP 404" in capsys.readouterr().err
