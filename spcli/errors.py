"""Errors a user can act on, and the exit codes they map to.

Exit codes (documented in the README, docs/guide/run.md and `spcli --help`):
  0   done: every row written (some rows may carry an `error`)
  1   internal failure (a bug): traceback with --debug
  2   bad input or configuration: one line naming the file, row and field
  65  `spcli run --fail-on-error`: done, but some rows are error rows (sysexits' EX_DATAERR)
  75  interrupted, resumable (SIGTERM/SIGINT/SIGUSR1): run the same command again
  130 Ctrl-C outside a run's safe stop (a second Ctrl-C, or a command that is not `run`)
`spcli status` has its own: 0 done, 3 not done yet (running, waiting, interrupted), 4 failed, 2 not a run directory.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_ROWS_FAILED = 65  # EX_DATAERR: `spcli run --fail-on-error` when any row is an error row
EXIT_INTERRUPTED = 75  # EX_TEMPFAIL: "try again later"


class SpcliError(Exception):
    """An error with a message the user can act on; the CLI prints it on one line."""

    exit_code = EXIT_USAGE


class ConfigError(SpcliError):
    """An option or a combination of options is invalid."""


class InputError(SpcliError):
    """An input file cannot be read at all (a bad record becomes an error row instead)."""


class ModelError(SpcliError):
    """A model name cannot be resolved, or its weights are not on this machine."""


class OutputError(SpcliError):
    """The output directory cannot be used (not writable, locked, or from another config)."""


class RecordError(SpcliError):
    """One record is bad: it becomes an error row, the run goes on."""


class Interrupted(SpcliError):
    """A signal asked the run to stop; what was complete is committed."""

    exit_code = EXIT_INTERRUPTED


class EngineDied(SpcliError):
    """The engine cannot go on (its processes died, or a device error that is not out-of-memory): the
    run stops after committing what is complete, rather than turning every later record into an error row."""

    exit_code = EXIT_FAILURE
    stopped_message = "a stop signal reached the engine's processes too, so the batch in flight was dropped"


class NotImplementedFeature(SpcliError):
    """A documented option whose implementation is not there yet."""

    exit_code = EXIT_USAGE


class StopAtSafePoint(Exception):
    """Raised inside a batch (after a first SIGINT) at a point where dropping the batch is safe."""
