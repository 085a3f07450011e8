"""Bounded memory: preprocess's peak RSS does not grow with the size of a file (documents are streamed, a unit of
work at a time, at most two shard writers open per worker)."""
import os
import subprocess
import sys

import pytest
from text_files import paragraphs_of

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PEAK_RSS = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)")


def write_corpus(path, paragraphs: list[str], size: int) -> None:
  """One text file of about `size` bytes: the paragraphs repeated, blank lines between them."""
  block = ("\n\n".join(paragraphs) + "\n\n").encode()
  with open(path, "wb") as f:
    for _ in range(max(1, size // len(block))):
      f.write(block)


def peak_rss(path, vocab, output, workers: int = 1) -> int:
  """Peak RSS in bytes of `python -m tupe.data.preprocess` (the largest of its processes)."""
  command = [sys.executable, "-c", _PEAK_RSS, sys.executable, "-m", "tupe.data.preprocess", "--input", str(path),
             "--vocab", str(vocab), "--seq-len", "128", "--output", str(output), "--unit-mb", "1",
             "--workers", str(workers)]
  return int(subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True, timeout=1800).stdout)


@pytest.fixture(scope="module")
def paragraphs(shared_data):
  return paragraphs_of(shared_data / "corpus" / "wikitext" / "wiki.valid.raw.txt")


def test_peak_rss_does_not_grow_with_the_file(paragraphs, bert_vocab, tmp_path):
  """2 MB and 8 MB files: reading a file whole would take about 5x its size more, some 30 MB here. Within 12 MB:
  the peaks of the same code differ by up to 9 MB from run to run on a busy machine (the allocator's arenas, the
  threads' timing)."""
  rss = {}
  for mb in (2, 8):
    write_corpus(tmp_path / f"{mb}.txt", paragraphs, mb << 20)
    rss[mb] = peak_rss(tmp_path / f"{mb}.txt", bert_vocab, tmp_path / f"out{mb}")
  assert rss[8] < rss[2] + (12 << 20), rss


@pytest.mark.slow
def test_peak_rss_of_a_few_hundred_mb(paragraphs, bert_vocab, tmp_path):
  """A 300 MB file against a 10 MB one, with all the cores."""
  rss = {}
  for mb in (10, 300):
    write_corpus(tmp_path / f"{mb}.txt", paragraphs, mb << 20)
    rss[mb] = peak_rss(tmp_path / f"{mb}.txt", bert_vocab, tmp_path / f"out{mb}", workers=len(os.sched_getaffinity(0)))
  print("peak RSS by MB:", rss)
  assert rss[300] < rss[10] + (16 << 20), rss
