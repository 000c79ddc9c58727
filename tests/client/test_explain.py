"""explain() reports per-graph lowering stats and Dynamo's graph breaks."""

import torch

from fxcc.client import backend
from fxcc.client.explain import explain


def test_explain_reports_graphs_and_breaks(tmp_path, monkeypatch):
    monkeypatch.delenv("FXCC_URL", raising=False)
    monkeypatch.setenv("FXCC_CACHE_DIR", str(tmp_path))
    backend.reset()

    def f(x):
        y = torch.sin(x) * 2
        print("a graph break")
        return torch.mm(y, y.t()).relu()

    report = explain(f)(torch.randn(8, 8))
    assert len(report.graph_breaks) == 1 and "print" in report.graph_breaks[0].lower()
    assert len(report.graphs) == 2
    text = str(report)
    assert "2 aten graph(s), 1 Dynamo graph break(s)" in text
    assert "aten.mm.default" in text  # matmul stays an extern call
    # CPU graphs run their plans step by step (CUDA graphs are a CUDA target's)
    assert text.count("runs as: step by step: target is interpret") == 2, text
