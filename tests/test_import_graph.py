"""tools/import_graph.py over spcli/ and benches/: no import circle, no lower layer importing a higher one."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _graph_module():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "tools" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_import_circle():
    graph = _graph_module()
    assert graph.circles(graph.graph()) == []


def test_no_layer_imports_a_higher_one():
    graph = _graph_module()
    assert graph.climbs(graph.graph()) == []


def test_the_checks_can_fail(tmp_path, monkeypatch):
    """A circle and a climb written into a copy of a tiny tree are found (the graph reads files, not imports)."""
    graph = _graph_module()
    (tmp_path / "spcli" / "models").mkdir(parents=True)
    (tmp_path / "spcli" / "job").mkdir()
    (tmp_path / "benches").mkdir()
    (tmp_path / "spcli" / "__init__.py").write_text("")
    (tmp_path / "spcli" / "models" / "__init__.py").write_text("")
    (tmp_path / "spcli" / "job" / "__init__.py").write_text("")
    (tmp_path / "spcli" / "models" / "lookup.py").write_text("def f():\n    from spcli.job import run\n")
    (tmp_path / "spcli" / "job" / "run.py").write_text("from spcli.models import lookup\n")
    monkeypatch.setattr(graph, "ROOT", tmp_path)
    edges = graph.graph()
    assert graph.circles(edges) == [["spcli.job.run", "spcli.models.lookup"]]
    assert graph.climbs(edges) == [("spcli.models.lookup", "spcli.job.run")]
    assert graph.function_imports() == [("spcli/models/lookup.py", 2, "spcli.job.run")]


def test_every_spcli_module_has_a_layer():
    graph = _graph_module()
    unplaced = [m for m in graph.modules() if m.startswith("spcli") and graph.layer(m) is None]
    assert unplaced == []
