"""The profile a layer calibration leaves: written at the end of a run (`--write-profile`), or later from a
saved run's results.json (`--write-profile --from-results DIR`) on a machine whose cache lacks it, without
measuring again. The profile lives in the machine's cache; results.json travels with a repository."""

from __future__ import annotations

import json
from pathlib import Path

from spcli.errors import ConfigError
from spcli.models import lookup, profiles

SETTING = ("layer", "window", "pool", "rows", "chunk")  # what names one grid cell and the choice


def choice_score(choice: dict) -> dict:
    """The profile's fields for calibrate's choice: early exit at the chosen layer, no look-ahead."""
    return {"window": choice["window"], "lookahead": 0, "score_layers": str(choice["layer"]), "pool": choice["pool"],
            "rows": choice["rows"], "chunk": choice["chunk"]}


def store(results: dict, results_path: Path, model_path: Path) -> Path:
    """Write the profile of a calibrate run's results (as results.json holds them); returns its path."""
    choice, config = results["choice"], results["config"]
    recall = next(e["recall"] for e in results["grid"] if all(e[k] == choice[k] for k in SETTING))
    evidence = {"choice": choice, "recall": recall, "costs": results["costs"], "target": config["target_recall"],
                "max_cost": config["max_cost"], "tasks": results["tasks"], "lengths": list(config["lengths"]),
                "samples": config["samples"], "seed": config["seed"], "results": str(results_path.resolve())}
    return profiles.write_profile(model_path, results["speculator"], choice_score(choice), evidence)


def measured_key(results: dict) -> str | None:
    """The model folder's key when it was calibrated: recorded, or in the name of the profile it wrote."""
    if results.get("model_key"):
        return results["model_key"]
    return Path(results["profile"]).name.split("-")[0] if results.get("profile") else None


def reinstate(source: str, model: str, speculator: str | None) -> tuple[Path, dict]:
    """Write the profile from a saved layer calibration of `model` with `speculator`; returns (its path, the
    results). Refused where the run was of another model or speculator, or the model folder has changed."""
    path = Path(source).expanduser()
    path = path / "results.json" if path.is_dir() else path
    try:
        results = json.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"--from-results {path}: cannot read it ({e.strerror})") from None
    except ValueError as e:
        raise ConfigError(f"--from-results {path}: not JSON ({e})") from None
    if not isinstance(results, dict) or not results.get("choice") or "grid" not in results:
        raise ConfigError(f"--from-results {path}: no `choice` and `grid`; it is not the results.json of a layer "
                          "calibration (a --keep-for run writes no profile)")
    speculator = speculator or lookup.default_speculator(model)
    ran = (results["config"]["model"], results["speculator"])
    if ran != (model, speculator):
        raise ConfigError(f"--from-results {path} calibrated --model {ran[0]} --speculator {ran[1]}, not "
                          f"--model {model} --speculator {speculator}")
    model_path = lookup.locate(model)
    key, now = measured_key(results), profiles.model_key(model_path)
    if key is None:
        raise ConfigError(f"--from-results {path} records no model key (a run before keys were recorded, without "
                          "--write-profile); run `spcli calibrate` again")
    if key != now:
        raise ConfigError(f"--from-results {path}: the model folder {model_path} has changed since it was calibrated "
                          f"(key {key}, now {now}); run `spcli calibrate` again")
    return store(results, path, model_path), results
