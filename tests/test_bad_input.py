"""The bad-input matrix of issue 3, end to end through `spcli.cli.main` (as the process runs it).

Record-level problems become rows with `error` set and `output` null (one run over a file holding
every case, then one test per case); file-level problems exit 2 with one line and no traceback.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spcli.cli import main
from spcli.io import commit
from test_job_run import ARGS, read_outputs

FAST = [*ARGS, "--max-tokens", "2"]


def cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """`spcli ARGV` in this process, through the same error handling as the console script."""
    old = sys.argv
    sys.argv = ["spcli", *argv]
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = old
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def last_line(err: str) -> str:
    """The error line (model loading may have drawn progress bars on stderr before it)."""
    assert "Traceback" not in err
    return err.rstrip("\n").rsplit("\n", 1)[-1].rsplit("\r", 1)[-1]


# ------------------------------------------------------------------ record-level: error rows
LONG = "word " * 5000  # > 4096 positions of the tiny model
CASES = {  # id -> (input line, error message after "FILE:row N (line N+1): ")
    "malformed": ('{"id": "malformed", "prompt": "unterminated', "malformed JSON (unexpected end of data at column 44)"),
    "not_object": ('["id", "prompt"]', "record must be a JSON object, got list"),
    "prompt_missing": ('{"id": "prompt_missing"}', "field 'prompt' (or 'messages') is missing or null"),
    "prompt_null": ('{"id": "prompt_null", "prompt": null}', "field 'prompt' (or 'messages') is missing or null"),
    "prompt_empty": ('{"id": "prompt_empty", "prompt": ""}', "field 'prompt' is empty"),
    "prompt_not_string": ('{"id": "prompt_not_string", "prompt": 42}', "field 'prompt' must be a string, got int"),
    "messages_not_list": ('{"id": "messages_not_list", "messages": "hello"}',
                          "field 'messages' must be a non-empty list of {role, content} objects"),
    "messages_no_role": ('{"id": "messages_no_role", "messages": [{"content": "hi"}]}',
                         "field 'messages'[0].role must be one of system, user, assistant, tool, developer, got None"),
    "messages_no_content": ('{"id": "messages_no_content", "messages": [{"role": "user"}]}',
                            "field 'messages'[0].content must be a string or a list of text parts"),
    "messages_image_part": ('{"id": "messages_image_part", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}',
                            "field 'messages[0].content'[0] must be a text part {\"type\": \"text\", \"text\": ...}, got 'image_url'"),
    "lone_surrogate": ('{"id": "lone_surrogate", "prompt": "a \\ud800 b"}',
                       "record is valid JSON but not valid Unicode (a lone surrogate escape such as \\ud800); encode its text as UTF-8"),
    "messages_bad_role": ('{"id": "messages_bad_role", "messages": [{"role": "robot", "content": "hi"}]}',
                          "field 'messages'[0].role must be one of system, user, assistant, tool, developer, got 'robot'"),
    "both": ('{"id": "both", "prompt": "a", "messages": [{"role": "user", "content": "b"}]}',
             "record has both 'prompt' and 'messages'; give one"),
    "utf8": (b'{"id": "utf8", "prompt": "caf\xe9 au lait"}', "invalid UTF-8 at byte 29"),
    "huge_line": (b'{"id": "huge_line", "prompt": "' + b"y" * (50 << 20) + b'"}',
                  f"record is {(50 << 20) + 33} bytes, more than --max-record-bytes {8 << 20}"),
    "keep_zero": ('{"id": "keep_zero", "prompt": "a b c", "keep": 0}', "field 'keep' must be in (0, 1], got 0"),
    "keep_big": ('{"id": "keep_big", "prompt": "a b c", "keep": 1.01}', "field 'keep' must be in (0, 1], got 1.01"),
    "max_tokens_zero": ('{"id": "max_tokens_zero", "prompt": "a b c", "max_tokens": 0}',
                        "field 'max_tokens' must be in [1, 1048576], got 0"),
    "max_tokens_float": ('{"id": "max_tokens_float", "prompt": "a b c", "max_tokens": 1.5}',
                         "field 'max_tokens' must be an integer, got 1.5"),
    # issue 59's list
    "not_number": ("42", "record must be a JSON object, got int"),
    "id_list": ('{"id": ["x"], "prompt": "a b c"}', "field 'id' must be a non-empty string or integer, got ['x']"),
    "id_bool": ('{"id": true, "prompt": "a b c"}', "field 'id' must be a non-empty string or integer, got True"),
    "id_float": ('{"id": 1.5, "prompt": "a b c"}', "field 'id' must be a non-empty string or integer, got 1.5"),
    "prompt_whitespace": ('{"id": "prompt_whitespace", "prompt": " \\n\\t  "}', "field 'prompt' is empty"),
    "top_p_big": ('{"id": "top_p_big", "prompt": "a b c", "top_p": 1.5}', "field 'top_p' must be in (0, 1], got 1.5"),
    "top_k_neg": ('{"id": "top_k_neg", "prompt": "a b c", "top_k": -2}',
                  "field 'top_k' must be -1, 0 (all tokens) or >= 1, got -2"),
    "temperature_neg": ('{"id": "temperature_neg", "prompt": "a b c", "temperature": -1}',
                        "field 'temperature' must be in [0, 100], got -1"),
    "stop_number": ('{"id": "stop_number", "prompt": "a b c", "stop": 5}',
                    "field 'stop' must be a non-empty string or a list of them, got 5"),
    "stop_object": ('{"id": "stop_object", "prompt": "a b c", "stop": {"a": 1}}',
                    "field 'stop' must be a non-empty string or a list of them, got {'a': 1}"),
    "best_of": ('{"id": "best_of", "prompt": "a b c", "best_of": 2}',
                "field 'best_of' (2; one output per record) is a generation parameter --engine hf does not apply (it "
                "applies temperature, max_tokens, seed, top_p, top_k, min_p, presence_penalty, frequency_penalty, "
                "repetition_penalty, stop); remove it from the record"),
}
# ids taken by the reader when the record has none it could read
GENERATED = {k: "matrix:{row}" for k in ("malformed", "not_object", "utf8", "not_number", "id_list", "id_bool",
                                         "id_float")}  # no id to read


@pytest.fixture(scope="module")
def matrix(tmp_path_factory, tiny_dir):
    """One run over a file with a good record, every bad case, a duplicate id and an over-long prompt."""
    d = tmp_path_factory.mktemp("matrix")
    src = d / "matrix.jsonl"
    lines: list[bytes] = [b'{"id": "good", "prompt": "a perfectly fine prompt"}']
    rows = {}
    for key, (line, _) in CASES.items():
        rows[key] = len(lines)
        lines.append(line if isinstance(line, bytes) else line.encode())
    rows["dup"] = len(lines)
    lines.append(b'{"id": "good", "prompt": "same id as line 1"}')
    rows["too_long"] = len(lines)
    lines.append(json.dumps({"id": "too_long", "prompt": LONG}).encode())
    src.write_bytes(b"\n".join(lines) + b"\n")
    out = d / "out"
    proc = subprocess.run([sys.executable, "-m", "spcli", "run", str(src), "--out", str(out), "--model", str(tiny_dir), *FAST],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    by_row = {r["row"]: r for r in read_outputs(out)}
    return src, rows, by_row, proc


def test_matrix_run_keeps_every_row_once(matrix):
    src, rows, by_row, proc = matrix
    assert sorted(by_row) == list(range(len(CASES) + 3))
    assert f"done: {len(CASES) + 3} rows ({len(CASES) + 2} failed: " in proc.stdout
    assert by_row[0]["error"] is None and by_row[0]["output"] is not None
    for r in by_row.values():
        if r["error"] is not None:
            assert r["output"] is None and r["finish_reason"] is None and r["kept_indices"] == []


@pytest.mark.parametrize("case", list(CASES))
def test_bad_record_becomes_an_exact_error_row(matrix, case):
    src, rows, by_row, _ = matrix
    row = by_row[rows[case]]
    assert row["id"] == GENERATED.get(case, case).format(row=rows[case])
    assert row["error"] == f"{src}:row {rows[case]} (line {rows[case] + 1}): {CASES[case][1]}"
    assert row["output"] is None


def test_chat_content_as_openai_text_parts_reads_as_one_string(tmp_path):
    from spcli.config.run import FieldConfig
    from spcli.io.read import read_records
    from spcli.io.shards import discover

    src = tmp_path / "parts.jsonl"
    parts = [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world."}]
    src.write_text(json.dumps({"id": "parts", "messages": [{"role": "user", "content": parts}]}) + "\n"
                   + json.dumps({"id": "plain", "messages": [{"role": "user", "content": "Hello, world."}]}) + "\n")
    a, b = read_records(discover([str(src)])[0], FieldConfig())
    assert a.error is None and a.id == "parts"
    assert a.messages == b.messages == [{"role": "user", "content": "Hello, world."}]


def test_duplicate_id_is_an_error_row_naming_the_first(matrix):
    src, rows, by_row, _ = matrix
    dup = by_row[rows["dup"]]
    assert dup["id"] == "good" and dup["output"] is None
    assert dup["error"] == f"{src}:row {rows['dup']} (line {rows['dup'] + 1}): duplicate id 'good' (first at {src}:row 0 (line 1)); ids must be unique"
    assert by_row[0]["error"] is None, "the first occurrence is kept"


def test_prompt_longer_than_the_context_is_an_error_row_by_default(matrix, tiny_dir):
    from transformers import AutoTokenizer

    src, rows, by_row, _ = matrix
    n = len(AutoTokenizer.from_pretrained(tiny_dir)(LONG)["input_ids"])
    assert n > 4096
    row = by_row[rows["too_long"]]
    assert row["error"] == (f"{src}:row {rows['too_long']} (line {rows['too_long'] + 1}): prompt has {n} tokens, more than the 4094 allowed "
                            "(the model's max_position_embeddings 4096 minus max_tokens 2; the prompt alone exceeds the "
                            "model's 4096 positions); use --truncate left|middle to cut it")


def test_lower_max_tokens_is_suggested_only_where_it_makes_the_prompt_fit(tiny_dir):
    """Issue 31: a 48,540-token row was told to lower --max-tokens, which could never fit it."""
    from spcli.models.load import load_stack
    from spcli.stages.tokenize import kept_positions
    from spcli.errors import RecordError

    stack = load_stack(str(tiny_dir), "self:2", "float32", "cpu", with_base=False)
    limit = stack.prompt_limit(64)
    with pytest.raises(RecordError, match="minus max_tokens 64; lower --max-tokens"):
        kept_positions(4090, stack.max_prompt_tokens(64), "error", limit)
    with pytest.raises(RecordError, match="the prompt alone exceeds the model's 4096 positions") as e:
        kept_positions(48540, stack.max_prompt_tokens(64), "error", limit)
    assert "lower --max-tokens" not in str(e.value)


@pytest.mark.parametrize("policy", ["left", "middle"])
def test_truncate_policies_cut_an_over_long_prompt(tmp_path, tiny_dir, write_jsonl, capsys, policy):
    src = write_jsonl([{"id": "long", "prompt": LONG}])
    code, out, err = cli(["run", str(src), "--out", str(tmp_path / "o"), "--model", str(tiny_dir), *FAST,
                          "--keep", "1.0", "--truncate", policy], capsys)
    assert code == 0, err
    (row,) = read_outputs(tmp_path / "o")
    assert row["error"] is None and row["num_prompt_tokens"] == 4094


# ------------------------------------------------------------------ file-level: exit 2, one line
def expect_exit_2(argv, capsys, message: str) -> None:
    code, out, err = cli(argv, capsys)
    assert code == 2, err
    assert last_line(err) == f"spcli: error: {message}"


def run_argv(src, out, tiny_dir, *extra) -> list[str]:
    return ["run", *([str(s) for s in src] if isinstance(src, list) else [str(src)]), "--out", str(out),
            "--model", str(tiny_dir), *FAST, *extra]


def test_duplicate_id_across_shards_is_an_error_row_naming_the_other_file(tmp_path, tiny_dir, write_jsonl, capsys):
    a = write_jsonl([{"id": "x", "prompt": "first of its id"}, {"id": "y", "prompt": "another"}], name="a.jsonl")
    b = write_jsonl([{"id": "x", "prompt": "same id, other shard"}], name="b.jsonl")
    code, stdout, err = cli(run_argv([a, b], tmp_path / "o", tiny_dir), capsys)
    assert code == 0 and stdout.startswith("done: 3 rows (1 failed: "), err
    rows = read_outputs(tmp_path / "o")
    (dup,) = [r for r in rows if r["error"] is not None]
    assert dup["id"] == "x" and dup["output"] is None
    assert dup["error"] == f"{b}:row 0 (line 1): duplicate id 'x' (first at {a}:row 0 (line 1)); ids must be unique"


@pytest.mark.parametrize("column", [pa.array([1, 2], pa.int64()), pa.array([["a"], ["b"]]), pa.array([b"x", b"y"])],
                         ids=["int", "list", "binary"])
def test_parquet_prompt_column_of_another_type_gives_an_error_row_per_row(tmp_path, tiny_dir, capsys, column):
    path = tmp_path / "typed.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "prompt": column}), path)
    code, stdout, err = cli(run_argv(path, tmp_path / "o", tiny_dir), capsys)
    assert code == 0 and stdout.startswith("done: 2 rows (2 failed: "), err
    got = {type(v).__name__ for v in column.to_pylist()}.pop()
    assert [(r["id"], r["error"]) for r in read_outputs(tmp_path / "o")] == [
        (i, f"{path}:row {n}: field 'prompt' must be a string, got {got}") for n, i in enumerate("ab")]


def test_an_empty_shard_among_good_ones_is_a_warning_and_the_others_run(tmp_path, tiny_dir, capsys):
    d = tmp_path / "shards"
    d.mkdir()
    (d / "a.jsonl").write_text(json.dumps({"id": "a", "prompt": "a fine prompt"}) + "\n")
    (d / "b.jsonl").write_bytes(b"")
    pq.write_table(pa.table({"id": ["c"], "prompt": ["another fine prompt"]}), d / "c.parquet")
    code, stdout, err = cli(run_argv(d, tmp_path / "o", tiny_dir), capsys)
    assert code == 0 and stdout.startswith("done: 2 rows (0 failed)"), err
    assert f"WARNING {d / 'b.jsonl'}: empty file (no records)\n" in err
    assert sorted(r["id"] for r in read_outputs(tmp_path / "o")) == ["a", "c"]


def test_truncated_parquet(tmp_path, tiny_dir, capsys):
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"prompt": ["some text"] * 200}), good)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(good.read_bytes()[:-100])
    code, _, err = cli(run_argv(cut, tmp_path / "o", tiny_dir), capsys)
    assert code == 2 and err.startswith(f"spcli: error: {cut}: not a readable Parquet file (") and err.count("\n") == 1


def test_corrupt_parquet_data(tmp_path, tiny_dir, capsys):
    path = tmp_path / "rot.parquet"
    pq.write_table(pa.table({"prompt": [f"{i} " * 50 for i in range(300)]}), path, compression="zstd")
    data = bytearray(path.read_bytes())
    off = pq.ParquetFile(path).metadata.row_group(0).column(0).data_page_offset
    data[off + 40: off + 400] = bytes(360)
    path.write_bytes(bytes(data))
    code, _, err = cli(run_argv(path, tmp_path / "o", tiny_dir), capsys)
    assert code == 2 and last_line(err).startswith(f"spcli: error: {path}: corrupt Parquet data in row group 0 (rows 0-299): ")
    assert [line for line in err.splitlines() if not line.startswith("INFO ")] == [last_line(err)], "one error line after the banner"


def test_parquet_without_prompt_column(tmp_path, tiny_dir, capsys):
    path = tmp_path / "cols.parquet"
    pq.write_table(pa.table({"id": ["a"], "text": ["hello"]}), path)
    expect_exit_2(run_argv(path, tmp_path / "o", tiny_dir), capsys,
                  f"{path}: Parquet file has no 'prompt' or 'messages' column (columns: id, text); "
                  "name yours with --prompt-field or --messages-field")


@pytest.mark.parametrize("name", ["empty.jsonl", "empty.parquet"])
def test_empty_file_is_zero_rows_and_a_warning(tmp_path, tiny_dir, capsys, name):
    """A 0-byte Parquet file is read as a 0-byte JSONL file is: no records, a warning (it used to stop the run)."""
    path = tmp_path / name
    path.write_bytes(b"")
    code, out, err = cli(run_argv(path, tmp_path / "o", tiny_dir), capsys)
    assert code == 0, err
    assert f"WARNING {path}: empty file (no records)\n" in err
    assert out.startswith("done: 0 rows (0 failed)")
    assert read_outputs(tmp_path / "o") == []


def test_directory_with_no_shards(tmp_path, tiny_dir, capsys):
    d = tmp_path / "inputs"
    d.mkdir()
    (d / "README.txt").write_text("no shards here")
    expect_exit_2(run_argv(d, tmp_path / "o", tiny_dir), capsys,
                  f"{d}: directory has no shards (*.jsonl, *.jsonl.gz, *.parquet); not shards: README.txt")


@pytest.mark.parametrize("groups", ["consecutive", "shard"])
def test_truncated_gzip(tmp_path, tiny_dir, capsys, groups):
    data = gzip.compress(b"".join(b'{"id": "g%d", "prompt": "row %d"}\n' % (i, i) for i in range(300)))
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    code, _, err = cli(run_argv(path, tmp_path / "o", tiny_dir, "--groups", groups), capsys)
    assert code == 2
    assert last_line(err).startswith(f"spcli: error: {path}: compressed file is truncated or corrupt (")
    done = read_outputs(tmp_path / "o") if (tmp_path / "o" / "manifest.json").exists() else []
    assert all(r["error"] is None for r in done)
    if groups == "consecutive":
        assert done, "rows before the cut are committed"
    else:  # the first pass reads the whole file before any row is made (spcli.io.group_order)
        assert done == []


def test_unknown_model(tmp_path, write_jsonl, capsys):
    src = write_jsonl([{"prompt": "x"}])
    code, _, err = cli(["run", str(src), "--out", str(tmp_path / "o"), "--model", "no-such-model"], capsys)
    assert code == 2 and err.startswith("spcli: error: unknown model 'no-such-model': use one of smollm2-135m, ")


@pytest.mark.parametrize("keep", ["0", "1.5", "-0.1"])
def test_keep_outside_0_1(tmp_path, write_jsonl, tiny_dir, capsys, keep):
    src = write_jsonl([{"prompt": "x"}])
    expect_exit_2(["run", str(src), "--out", str(tmp_path / "o"), "--model", str(tiny_dir), "--keep", keep], capsys,
                  f"--keep must be in (0, 1] or auto, got {float(keep)}")


def unmount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True).returncode:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)  # busy: detach now, free when unused


@pytest.fixture()
def read_only_dir(tmp_path):
    """A directory nobody can write: a read-only tmpfs when root (root ignores permissions), else chmod 555."""
    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() == 0:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(d)], capture_output=True).returncode:
            pytest.skip("root, but cannot mount a read-only tmpfs here")
        yield d, "Read-only file system"
        unmount(d)
    else:
        d.chmod(0o555)
        yield d, "Permission denied"
        d.chmod(0o755)


def test_output_directory_not_writable(tmp_path, write_jsonl, tiny_dir, capsys, read_only_dir):
    d, reason = read_only_dir
    src = write_jsonl([{"prompt": "x"}])
    expect_exit_2(run_argv(src, d, tiny_dir), capsys, f"{d}: output directory is not writable ({reason})")
    expect_exit_2(run_argv(src, d / "sub", tiny_dir), capsys, f"{d / 'sub'}: output directory cannot be created ({reason})")


def test_output_path_is_a_file(tmp_path, write_jsonl, tiny_dir, capsys):
    src = write_jsonl([{"prompt": "x"}])
    (tmp_path / "f").write_text("")
    expect_exit_2(run_argv(src, tmp_path / "f", tiny_dir), capsys, f"{tmp_path / 'f'}: output path exists and is not a directory")


def test_file_level_error_in_a_real_process_has_no_traceback(tmp_path, tiny_dir):
    path = tmp_path / "cols.parquet"
    pq.write_table(pa.table({"text": ["hello"]}), path)
    proc = subprocess.run([sys.executable, "-m", "spcli", *run_argv(path, tmp_path / "o", tiny_dir)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr == (f"spcli: error: {path}: Parquet file has no 'prompt' or 'messages' column (columns: text); "
                           "name yours with --prompt-field or --messages-field\n")


# ------------------------------------------------------------------ disk full
def prompts(n: int) -> list[dict]:
    return [{"id": f"d{i}", "prompt": f"disk full test prompt {i} " * 3} for i in range(n)]


class _FullAfter:
    """`os` for spcli.io.commit whose write() fails with ENOSPC after `budget` successful writes."""

    def __init__(self, budget: int):
        self.budget = budget

    def __getattr__(self, name):
        return getattr(os, name)

    def write(self, fd, data):
        if self.budget <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.budget -= 1
        return os.write(fd, data)


def assert_consistent(out: Path) -> list[dict]:
    """Every part the manifest lists is whole; no temp file or unlisted part is left visible as committed."""
    rows = read_outputs(out)
    assert len({r["row"] for r in rows}) == len(rows)
    return rows


@pytest.mark.parametrize("budget", [0, 1, 4, 5])  # fail in the first manifest, a part, a later part, a manifest
def test_disk_full_commits_nothing_partial_and_resumes(tmp_path, write_jsonl, tiny_dir, capsys, monkeypatch, budget):
    src = write_jsonl(prompts(12))
    out = tmp_path / "o"
    argv = run_argv(src, out, tiny_dir, "--batch-size", "2", "--commit-interval", "0")
    monkeypatch.setattr(commit, "os", _FullAfter(budget))
    code, _, err = cli(argv, capsys)
    assert code == 2, err
    line = last_line(err)
    assert line.startswith(f"spcli: error: {out}: disk full (No space left on device) while committing ")
    assert line.endswith("; nothing partial was committed: fix it and run the same command again to resume")
    if budget == 0:  # the very first commit failed: a directory this run created is removed again
        assert not out.exists()
    else:
        assert not [p for p in out.iterdir() if p.name.endswith(".tmp")], "temp files are removed"
        assert not (out / ".lock").exists()
    if (out / "manifest.json").exists():
        assert len(assert_consistent(out)) < 12
    monkeypatch.undo()
    code, stdout, err = cli(argv, capsys)
    assert code == 0, err
    assert sorted(r["id"] for r in assert_consistent(out)) == sorted(f"d{i}" for i in range(12))


def test_disk_full_on_a_real_small_filesystem(tmp_path, write_jsonl, tiny_dir, capsys):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; the ENOSPC injection test covers this case")
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        filler = mnt / "filler"
        with open(filler, "wb") as f:
            f.write(b"\0" * (1024 - 48) * 1024)  # leave ~48 KiB: a few parts and manifests, then ENOSPC
        src = write_jsonl(prompts(40))
        out = mnt / "o"
        argv = run_argv(src, out, tiny_dir, "--batch-size", "2", "--commit-interval", "0")
        code, _, err = cli(argv, capsys)
        assert code == 2, err
        assert last_line(err).startswith(f"spcli: error: {out}: disk full (No space left on device) while committing ")
        partial = assert_consistent(out)
        assert 0 < len(partial) < 40
        filler.unlink()
        code, _, err = cli(argv, capsys)
        assert code == 0, err
        assert sorted(r["id"] for r in assert_consistent(out)) == sorted(f"d{i}" for i in range(40))
    finally:
        unmount(mnt)


# ------------------------------------------------------------------ a pipeline learns of error rows
def test_fail_on_error_exits_65_where_rows_failed_and_status_json_counts_them(tmp_path, write_jsonl, tiny_dir, capsys):
    """Issue 59: a run with failed rows exited 0; a pipeline had to parse the output to know."""
    src = write_jsonl([{"id": "ok", "prompt": "a perfectly fine prompt"}, {"id": "bad", "prompt": 42}])
    out = tmp_path / "o"
    code, stdout, err = cli(run_argv(src, out, tiny_dir), capsys)
    assert code == 0 and stdout.startswith("done: 2 rows (1 failed: "), err
    code, stdout, _ = cli(run_argv(src, out, tiny_dir, "--fail-on-error"), capsys)  # the finished directory: same code
    assert code == 65 and stdout.startswith("nothing to do: 2 rows already done (1 failed: ")
    code, stdout, _ = cli(["status", str(out), "--json", "--no-slurm"], capsys)
    status = json.loads(stdout)
    assert code == 0 and (status["phase"], status["rows"], status["failed_rows"]) == ("done", 2, 1)
    good = write_jsonl([{"id": "ok", "prompt": "a perfectly fine prompt"}], name="good.jsonl")
    code, _, err = cli(run_argv(good, tmp_path / "o2", tiny_dir, "--fail-on-error"), capsys)
    assert code == 0, err
