"""When the driver asks vLLM's workers whether a window's scoring is done (--speculator-overlap).

Each ask is a `collective_rpc`: the engine core answers it between two steps, and with async scheduling the
driver's wait for that answer is a step the GPU does not overlap (issue 40). So the driver does not ask on every
loop turn: not before the window is expected to be done (its prompt tokens at the speculator's last measured
seconds per token), then at most once per `every_s`. Only a `False` answer costs a wait; the answer `True` is
final, and `result()` (which blocks) is what the loop calls when vLLM has nothing else to run.
"""

from __future__ import annotations

import time

READY_POLL_S = 0.05  # at most one readiness ask per 50 ms once the window is due (a few vLLM steps on a GPU)


class SecondsPerToken:
    """The speculator's pace on the workers, from the windows collected so far (the slowest rank's own time over
    the most tokens one rank scored)."""

    def __init__(self):
        self.value: float | None = None

    def update(self, wall_s: float, tokens: int) -> None:
        if tokens > 0 and wall_s > 0:
            self.value = wall_s / tokens

    def expected_s(self, tokens: int) -> float:
        return 0.0 if self.value is None else self.value * tokens


class ReadyPoll:
    """ready(): whether `ask()` said done; asks only once the work is due and then every `every_s` at most."""

    def __init__(self, ask, expected_s: float, every_s: float = READY_POLL_S, clock=time.monotonic):
        self.ask, self.every_s, self.clock = ask, every_s, clock
        self.next_ask = clock() + expected_s
        self.num_asked = 0
        self.is_done = False

    def ready(self) -> bool:
        if self.is_done:
            return True
        now = self.clock()
        if now < self.next_ask:
            return False
        self.num_asked += 1
        self.is_done = bool(self.ask())
        self.next_ask = now + self.every_s
        return self.is_done
