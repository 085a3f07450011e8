"""bench.preprocess: a tiny run prints a record per run and the tokenization record, with their fields."""
import pytest

from bench import preprocess as bench_preprocess


def test_tiny_run(shared_data, capsys):
  del shared_data  # (The bench builds its corpus from it.)
  records = bench_preprocess.main(["--tiny", "--baseline-ref", ""])
  runs = [r for r in records if r["bench"] == "preprocess"]
  assert [r["workers"] for r in runs] == [1, 2] and runs[0]["speedup"] == pytest.approx(1.0)
  assert all(r["tokens"] > 100_000 and r["cpu_s"] > 0 and r["peak_rss_bytes"] > 0 for r in runs)
  assert 1 <= runs[1]["amdahl_speedup"] <= 2 and 0 < runs[1]["main_process_cpu_s"] < runs[1]["cpu_s"]
  (tokenize,) = [r for r in records if r["bench"] == "tokenize"]
  assert tokenize["sentences"] > 1000 and tokenize["ratio"] > 0
  assert len([line for line in capsys.readouterr().out.splitlines() if line.startswith("{")]) == 3
