"""Preprocessing throughput, scaling and memory: today's code (a git ref) and this one, side by side in one run.

  python -m bench.preprocess --mb 50 --workers 1,2 --baseline-ref main > preprocess.jsonl

Builds a corpus of --mb MB from the shared real text (one file of --mb MB, the rest of the shared files beside it),
then runs `python -m tupe.data.preprocess` on it: once with the code of --baseline-ref (checked out with git
archive; "" to skip), and once per --workers count with this code. Each run is a separate process; its wall time,
CPU time (user + system, its worker processes included) and peak RSS (the largest process) are measured from
outside with wait4. Then tokenization alone, in this process on one thread: HF `tokenizers` `encode_batch` against
`tupe.data.tokenizer.encode` on the same sentences, in CPU seconds.

Records (one JSON line each): {"bench": "preprocess", "code": "baseline"|"this", "workers", "mb", "wall_s",
"cpu_s", "mb_per_cpu_s", "tokens_per_cpu_s", "speedup" (against this code's 1 worker), "efficiency" (speedup /
workers), "main_process_cpu_s" (this code: the CPU of the process that plans and hands out units; the rest is
the workers'), "amdahl_speedup" (the speed-up that split allows on idle cores), "peak_rss_bytes", ...} and
{"bench": "tokenize", "hf_encode_batch_cpu_s", "tupe_encode_cpu_s", "ratio", ...}, each with the machine.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

import bench
from tupe import console
from tupe.errors import UserError

SHARED = bench.REPO.parent / "shared" / "data"
VOCAB = SHARED / "vocab" / "bert-base-uncased-vocab.txt"


def build_corpus(folder: str, mb: float, beside: bool) -> str:
  """A glob of: one file of about `mb` MB (the shared corpus's paragraphs, repeated) and, with `beside`, the shared
  text files."""
  from tupe.data import units  # pylint: disable=import-outside-toplevel

  files = [str(f) for f in sorted((SHARED / "corpus").glob("*/*.txt")) if f.name != "README.txt"]
  source = dict(format="text", documents="paragraphs", files=",".join(files), text_field="text")
  paragraphs = list(units.all_documents(source, units.plan_inputs(source)))
  block = ("\n\n".join(paragraphs) + "\n\n").encode()
  target = int(mb * 2**20)
  with open(os.path.join(folder, "huge.txt"), "wb") as f:
    written = 0
    while written < target:
      f.write(block[:target - written])
      written += min(len(block), target - written)
  for f in files if beside else ():
    if not _is_utf8(f):
      continue  # (Stray Latin-1 bytes: today's code refuses the whole file.)
    shutil.copyfile(f, os.path.join(folder, f"{f.parent.name}-{f.name}"))
  return os.path.join(folder, "*.txt")


def _is_utf8(path) -> bool:
  try:
    path.read_bytes().decode("utf-8")
    return True
  except UnicodeDecodeError:
    return False


def checkout(ref: str, folder: str) -> str:
  """The repository at `ref`, unpacked into `folder` (git archive)."""
  proc = subprocess.run(["git", "archive", ref], cwd=bench.REPO, capture_output=True)
  if proc.returncode:
    raise UserError(f"--baseline-ref {ref}: {proc.stderr.decode(errors='replace').strip()}; give a branch, tag or "
                    f"commit, or \"\" to leave the baseline out")
  archive = proc.stdout
  with tempfile.TemporaryFile() as tar_file:
    tar_file.write(archive)
    tar_file.seek(0)
    tarfile.open(fileobj=tar_file).extractall(folder)
  return folder


# Runs preprocess's main in a process that then prints its own CPU seconds (its workers' not included) on stderr.
_MAIN_CPU = ("import resource, sys; from tupe.data import parallel, preprocess; parallel.limit_threads(); "
             "preprocess.main(sys.argv); "  # (as its __main__ block: one core for the tokenizer)
             "u = resource.getrusage(resource.RUSAGE_SELF); "
             "print('MAIN_CPU', u.ru_utime + u.ru_stime, file=sys.stderr)")


def measure(command: list[str], cwd: str) -> dict:
  """Wall seconds, CPU seconds (the process and the children it waited for), peak RSS (the largest process) and,
  where the command prints it, the CPU seconds of the main process alone (the serial part)."""
  start = time.perf_counter()
  process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  stderr = process.stderr.read().decode()
  _, status, usage = os.wait4(process.pid, 0)
  wall = time.perf_counter() - start
  if status:
    raise SystemExit(f"error: {' '.join(command)} failed: {stderr[-2000:]}")
  result = dict(wall_s=wall, cpu_s=usage.ru_utime + usage.ru_stime, peak_rss_bytes=usage.ru_maxrss * 1024)
  for line in stderr.splitlines():
    if line.startswith("MAIN_CPU "):
      result["main_process_cpu_s"] = float(line.split()[1])
  return result


def run_preprocess(code: str, inputs: str, output: str, workers: int | None, seq_len: int) -> dict:
  source = open(os.path.join(code, "tupe", "data", "preprocess.py"), encoding="utf-8").read()
  ours = "--workers" in source
  command = [sys.executable, *(["-c", _MAIN_CPU] if ours else ["-m", "tupe.data.preprocess"]), "--input", inputs,
             "--vocab", str(VOCAB), "--seq-len", str(seq_len), "--output", output]
  command += ["--workers", str(workers)] if ours else ["--num-shards", "8"]
  result = measure(command, code)
  with open(os.path.join(output, "metadata.json"), encoding="utf-8") as f:
    result["tokens"] = sum(json.load(f)["num_tokens"].values())
  return result


def tokenize_cpu(inputs: str, max_chars: int, repeats: int) -> dict:
  """CPU seconds of HF encode_batch and of tupe's encode on the sentences of the first `max_chars` of the corpus,
  one thread, best of `repeats`, taking turns."""
  os.environ["TOKENIZERS_PARALLELISM"] = "false"
  from tupe.data import corpus  # pylint: disable=import-outside-toplevel
  from tupe.data import tokenizer  # pylint: disable=import-outside-toplevel

  text = open(sorted(glob.glob(inputs))[0], encoding="utf-8").read(max_chars)
  sentences = [s for block in text.split("\n\n") for s in corpus.split_sentences(" ".join(block.split()))]
  tok, _ = tokenizer.load_tokenizer(str(VOCAB))
  best = {"hf": float("inf"), "tupe": float("inf")}
  for _ in range(repeats):
    for name, fn in (("hf", lambda: tok.encode_batch(sentences, add_special_tokens=False)),
                     ("tupe", lambda: tokenizer.encode(tok, sentences))):
      start = time.process_time()
      fn()
      best[name] = min(best[name], time.process_time() - start)
  return dict(sentences=len(sentences), chars=len(text), hf_encode_batch_cpu_s=best["hf"],
              tupe_encode_cpu_s=best["tupe"], ratio=best["tupe"] / best["hf"])


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(prog="python -m bench.preprocess", description=console.summary(__doc__))
  parser.add_argument("--mb", type=float, default=50.0, help="size of the one huge file")
  parser.add_argument("--workers", default=f"1,2,{len(os.sched_getaffinity(0))}", type=bench.positive_ints,
                      help="comma-separated counts")
  parser.add_argument("--baseline-ref", default="main", help='git ref of today\'s code ("" to skip)')
  parser.add_argument("--seq-len", type=bench.positive_int, default=128)
  parser.add_argument("--tiny", action="store_true", help="a seconds-long smoke run")
  args = parser.parse_args(argv)
  if args.tiny:
    args.mb, args.workers = 0.5, [1, 2]
  workers = sorted(set(args.workers))
  records = []
  with tempfile.TemporaryDirectory(prefix="bench-preprocess-") as tmp:
    os.makedirs(f"{tmp}/corpus")
    inputs = build_corpus(f"{tmp}/corpus", args.mb, beside=not args.tiny)
    total_mb = sum(os.path.getsize(p) for p in glob.glob(inputs)) / 2**20
    runs = [("this", w, str(bench.REPO)) for w in workers]
    if args.baseline_ref:
      runs.insert(0, ("baseline", 1, checkout(args.baseline_ref, tmp + "/baseline")))
    one_worker = None
    for code, count, folder in runs:
      bench.progress(f"{code} code, {count} worker(s), {total_mb:.0f} MB")
      result = run_preprocess(folder, inputs, f"{tmp}/out-{code}-{count}", count, args.seq_len)
      if code == "this" and count == 1:
        one_worker = result["wall_s"]
      record = dict(bench="preprocess", code=code, ref=args.baseline_ref if code == "baseline" else "this",
                    workers=count if code == "this" else None, mb=total_mb, **result,
                    mb_per_cpu_s=total_mb / result["cpu_s"], tokens_per_cpu_s=result["tokens"] / result["cpu_s"],
                    mb_per_s=total_mb / result["wall_s"])
      if code == "this" and one_worker:
        record.update(speedup=one_worker / result["wall_s"], efficiency=one_worker / result["wall_s"] / count)
      if code == "this" and count > 1:  # Amdahl: the workers' share of the CPU divides by their number at best.
        record["amdahl_speedup"] = result["cpu_s"] / (result["main_process_cpu_s"]
                                                      + (result["cpu_s"] - result["main_process_cpu_s"]) / count)
      records.append(dict(record, **bench.machine()))
      bench.emit(records[-1])
    bench.progress("tokenization alone")
    records.append(dict(bench="tokenize", **tokenize_cpu(inputs, 1 << 20 if args.tiny else 8 << 20,
                                                         2 if args.tiny else 5), **bench.machine()))
    bench.emit(records[-1])
  return records


if __name__ == "__main__":
  bench.run(main)
