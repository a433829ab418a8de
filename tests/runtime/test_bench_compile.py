"""`stylevar bench --compile` reports the graphs it compiled and the recompile-limit hits (stylevar.runtime.compile); a
d20-shaped model with its 20 drop-path rates compiles at most K + 1 graphs for generation at batch 1, 2 and 8."""
from __future__ import annotations

import pytest

from stylevar.cli import main as cli_main
from stylevar.runtime.bench import BenchConfig, format_result, run
from tests.runtime.test_compile import d20_shaped

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # tens of seconds of tracing


def test_bench_counts_the_graphs_of_a_d20_shaped_model():
    configs = d20_shaped()
    K = len(configs[1].patch_nums)
    res = run(BenchConfig(preset=configs, compile=True, compile_backend="eager", batch_sizes=(1, 2, 8), repeats=1,
                          warmup=0, tf_batch=1))
    graphs = res.graphs
    assert graphs["backend"] == "eager" and graphs["recompile_limit_hits"] == 0
    assert 0 < graphs["generate"] <= K + 1, graphs
    assert graphs["teacher_forcing"] == 1  # one training graph for the 20 blocks
    assert graphs["total"] == graphs["generate"] + graphs["teacher_forcing"]
    assert res.preset == "custom (depth 20, width 32, 10 scales)"
    text = format_result(res)
    assert f"compiled (eager): {graphs['total']} graphs ({graphs['generate']} generate, 1 teacher forcing); " \
           f"recompile limit hit 0 times" in text


def test_the_command_prints_the_graph_count(capsys):
    rc = cli_main(["bench", "--preset", "tiny", "--compile", "--compile-backend", "eager", "--batch-sizes", "1",
                   "--repeats", "1", "--warmup", "0", "--tf-batch", "1"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "compiled (eager): " in out and "recompile limit hit 0 times" in out, out
