"""spcli/job/batch.py: a streamed row's time before the engine took it (its ttft_s before vLLM's part); the end line on groups."""

from spcli.job.batch import row_wait
from spcli.io.records import Record


def test_a_row_scored_while_vllm_starts_does_not_count_the_start():
    # read at 0, scored by 3, vLLM up at 20, submitted at 21: 3 s scoring + 1 s after vLLM was up
    assert row_wait(0.0, 3.0, 21.0, ready_at=20.0) == 4.0


def test_a_row_scored_after_the_start_counts_all_its_wait():
    # vLLM up at 1; read at 10, scored by 12, submitted at 15 (waited for room in vLLM): 5 s
    assert row_wait(10.0, 12.0, 15.0, ready_at=1.0) == 5.0


def test_a_row_submitted_as_vllm_comes_up_counts_its_scoring_only():
    assert row_wait(0.0, 2.5, 20.0, ready_at=20.0) == 2.5


def test_the_rows_finished_rows_wait_on_are_those_read_before_the_last_finished_one():
    """Issue 40: at a Ctrl-C the streaming loop lets these finish (commits are prefixes in read order)."""
    from spcli.io.shards import Shard
    from spcli.io.schema import RowResult
    from spcli.job.loop import Reorder, ShardEnd

    reorder = Reorder(committer=None, manifest=None, cfg=None, progress=None, warned=set())
    recs = [Record(0, i, f"r{i}", prompt="x") for i in range(6)]
    reorder.order.extend([*recs[:3], ShardEnd(Shard(0, "a.jsonl")), *recs[3:]])
    assert reorder.needed() == set(), "nothing finished: nothing to wait for"
    reorder.finished[id(recs[2])] = RowResult(id="r2", shard="a.jsonl", row=2)
    reorder.finished[id(recs[4])] = RowResult(id="r4", shard="a.jsonl", row=4)
    assert reorder.needed() == {id(recs[0]), id(recs[1]), id(recs[3])}, "r5 is after every finished row"


def test_the_end_line_counts_rows_without_a_key_apart_from_those_that_could_share():
    """A record without a group key (one message, no prompt text) could share with none: not counted as could."""
    from collections import Counter

    from spcli.config.run import RunConfig
    from spcli.job.batch import sharing_line

    notes = Counter({"documents": 5, "questions": 0, "rows alone: one question": 4, "rows alone: no key": 4,
                     "rows alone: keeps differ": 2})
    line = sharing_line(notes, RunConfig(inputs=("x",), out="y"))
    assert "2 rows alone that could share (keeps differ 2), 4 rows alone as their document's only record, " \
           "4 rows without a group key" in line, line
    del notes["rows alone: no key"]
    assert "group key" not in sharing_line(notes, RunConfig(inputs=("x",), out="y"))
