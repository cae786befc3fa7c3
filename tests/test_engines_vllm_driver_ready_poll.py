"""Issue 40: the driver asks vLLM's workers whether a window is scored by time, not on every loop turn (each ask
is a collective_rpc that holds the engine core between steps)."""

from __future__ import annotations

from spcli.engines.vllm.driver.ready_poll import ReadyPoll, SecondsPerToken


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_ask_before_the_window_is_due_then_at_most_one_per_interval_and_done_is_final():
    clock, answers = Clock(), iter([False, False, True])
    poll = ReadyPoll(lambda: next(answers), expected_s=2.0, every_s=0.5, clock=clock)
    for _ in range(100):  # a hundred loop turns before the window is due: not one ask
        assert not poll.ready()
    assert poll.num_asked == 0
    clock.now += 2.0
    assert not poll.ready() and poll.num_asked == 1  # due: asked, not done yet
    for _ in range(50):
        clock.now += 0.01
        poll.ready()
    assert poll.num_asked == 2, "0.5 s of turns later: one more ask, not fifty"
    clock.now += 0.5
    assert poll.ready() and poll.num_asked == 3
    assert poll.ready() and poll.num_asked == 3, "a done window is never asked about again"


def test_the_pace_of_the_last_windows_says_when_the_next_is_due():
    pace = SecondsPerToken()
    assert pace.expected_s(4096) == 0.0, "nothing measured yet: ask at once"
    pace.update(wall_s=2.0, tokens=4000)
    assert pace.expected_s(6000) == 3.0
    pace.update(wall_s=0.0, tokens=100)  # an empty or instant window measures nothing
    assert pace.expected_s(2000) == 1.0
