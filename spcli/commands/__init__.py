"""Sub-commands beyond `run` and `models`; each module defines `register(app)`."""

from spcli.commands import bench, calibrate, eval, export, inspect, plan, slurm, status

ALL = (inspect, export, status, slurm, eval, bench, calibrate, plan)
