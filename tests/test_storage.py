"""tupe.store.storage, the one path layer: the same calls on a local disk and in a bucket (real GCS and S3
emulators)."""
import os
import pathlib
import re
import resource
import stat
import subprocess
import sys

from gcs_emulator import free_port
import pytest
from test_resume import REPO

from tupe.store import deadline
from tupe.store import jsonfile
from tupe.store import storage


@pytest.fixture(params=["local", "gs", "s3"])
def root(request, tmp_path):
  """A folder on the local disk (with a space and a non-ASCII name) or in a new bucket of an emulator."""
  if request.param == "local":
    return str(tmp_path / "run dé")
  return request.getfixturevalue({"gs": "gcs_bucket", "s3": "s3_bucket"}[request.param]) + "/run"


def test_write_read_append_list_remove(root):
  storage.write_text(f"{root}/a.txt", "hello")
  assert storage.read_text(f"{root}/a.txt") == "hello"
  storage.write_text(f"{root}/a.txt", "replaced")
  storage.append_text(f"{root}/a.txt", " world")
  assert storage.read_text(f"{root}/a.txt") == "replaced world"
  storage.write_bytes(f"{root}/sub/b.bin", b"\x00\x01")
  assert storage.read_bytes(f"{root}/sub/b.bin") == b"\x00\x01"
  assert storage.size(f"{root}/sub/b.bin") == 2
  assert [p.name for p in storage.iterdir(root)] == ["a.txt", "sub"]
  assert [p.name for p in storage.glob(f"{root}/*.txt")] == ["a.txt"]
  assert storage.walk_files(root) == ["a.txt", "sub/b.bin"]
  versions = storage.listing(root)
  assert list(versions) == ["a.txt", "sub/b.bin"] and storage.listing(f"{root}/sub") == {"b.bin": versions["sub/b.bin"]}
  assert [v.size for v in versions.values()] == [14, 2]
  assert storage.listing(f"{root}/sub/b.bin") == {} and storage.listing(f"{root}/missing") == {}
  assert storage.read_range(f"{root}/a.txt", 2, 7) == b"place" and storage.read_range(f"{root}/a.txt", 12, 20) == b"ld"
  storage.write_text(f"{root}/a.txt", "replaced world")  # the same bytes, written again
  assert storage.listing(root)["a.txt"].size == 14
  if not root.startswith("s3://"):  # (S3's ETag is the bytes' MD5: the same bytes keep it)
    assert storage.listing(root)["a.txt"] != versions["a.txt"]
  storage.copy(f"{root}/a.txt", f"{root}/c.txt")
  assert storage.read_text(f"{root}/c.txt") == "replaced world"
  assert [str(p) for p in storage.copy_tree(root, f"{root}/copy")] == [f"{root}/copy/{name}" for name in
                                                                       ("a.txt", "c.txt", "sub/b.bin")]
  assert storage.read_bytes(f"{root}/copy/sub/b.bin") == b"\x00\x01"
  assert [str(p) for p in storage.copy_tree(root, f"{root}/copy2", last=("a.txt",))] == [  # (an export's config.json)
      f"{root}/copy2/{name}" for name in ("c.txt", "copy/c.txt", "copy/sub/b.bin", "sub/b.bin", "copy/a.txt",
                                          "a.txt")]
  storage.remove(f"{root}/sub")
  storage.remove(f"{root}/copy")
  storage.remove(f"{root}/copy2")
  assert storage.walk_files(root) == ["a.txt", "c.txt"]
  assert storage.iterdir(f"{root}/missing") == []


def test_local_paths_expand_and_leave_no_temporaries(tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path))
  storage.write_text("~/x/y.txt", "1")
  assert (tmp_path / "x" / "y.txt").read_text() == "1"
  assert sorted(p.name for p in (tmp_path / "x").iterdir()) == ["y.txt"]
  monkeypatch.chdir(tmp_path)
  assert storage.path("x/y.txt") == storage.path(tmp_path / "x" / "y.txt")
  assert storage.is_remote("gs://b/x") and not storage.is_remote("x/gs://")


def test_a_local_write_cut_short_leaves_the_file_as_it_was(tmp_path):
  """A write that fails part way (a file size limit here, as a full disk) is one line, and the file keeps its old
  content whole, with no temporary file beside it: the new content goes to a file of its own, renamed over."""
  target = tmp_path / "results.json"
  storage.write_text(target, '{"old": 1}')
  soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
  resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))  # Python ignores SIGXFSZ: writes fail with EFBIG
  try:
    with pytest.raises(storage.StorageError, match=f"^cannot write {re.escape(str(target))}: File too large"):
      storage.write_text(target, "x" * 100_000)
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
  assert target.read_text() == '{"old": 1}' and [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_failures_are_one_line(gcs_bucket, tmp_path):
  missing_bucket = r"bucket gs://tupe-no-such-bucket does not exist \(create it, or fix its name\)$"
  with pytest.raises(storage.StorageError, match=r"^cannot read gs://tupe-no-such-bucket/a: " + missing_bucket):
    storage.read_text("gs://tupe-no-such-bucket/a")
  with pytest.raises(storage.StorageError, match=r"^cannot read \S+/missing.txt: not found$"):
    storage.read_text(tmp_path / "missing.txt")
  with pytest.raises(storage.StorageError, match=r"^cannot read gs://\S+/missing.txt: not found$"):
    storage.read_text(gcs_bucket + "/missing.txt")
  with pytest.raises(storage.StorageError, match=r"^cannot write in gs://tupe-no-such-bucket/run: " + missing_bucket):
    storage.check_writable("gs://tupe-no-such-bucket/run")
  storage.check_writable(gcs_bucket + "/run")
  storage.check_writable(tmp_path / "new" / "run")
  assert storage.walk_files(gcs_bucket) == [] and list(tmp_path.iterdir()) == []  # nothing left behind
  (tmp_path / "file").write_text("")
  with pytest.raises(storage.StorageError, match="is a file"):
    storage.check_writable(tmp_path / "file" / "run")
  for under_a_file in (tmp_path / "file" / "x.txt", tmp_path / "file" / "sub" / "x.txt"):  # mkdir: EEXIST, ENOTDIR
    with pytest.raises(storage.StorageError, match=f"^cannot write {under_a_file}: (File exists|Not a directory): a "
                                                   f"file stands where this path needs a folder; choose another "
                                                   f"path, or move the file$"):
      storage.write_text(under_a_file, "x")
  with pytest.raises(storage.StorageError, match="empty path"):
    storage.path("")
  with pytest.raises(storage.StorageError, match="must be local"):
    storage.local(gcs_bucket + "/x")


def test_an_unreachable_endpoint_is_one_line():
  """An s3:// store whose endpoint refuses the connection (nothing listens on its port): one line naming the path and
  what to check, after botocore's retries. (gcsfs's chain ends in the same OS error, after about 30 s of its
  retries.)"""
  port = free_port()
  env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
  env.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="a", AWS_SECRET_ACCESS_KEY="b",
             AWS_DEFAULT_REGION="us-east-1")
  read = ("from tupe.store import storage\ntry:\n  storage.read_text('s3://tupe-b/o')\n"
          "except storage.StorageError as e:\n  print(e)")
  proc = subprocess.run([sys.executable, "-c", read], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert re.fullmatch(
      rf"cannot read s3://tupe-b/o: no connection to the store \(.*Connect call failed \('127\.0\.0\.1', {port}\)\): "
      r"check that it is reachable from here, and its endpoint setting \(AWS_ENDPOINT_URL, STORAGE_EMULATOR_HOST\) "
      r"if one is set", proc.stdout.strip()), proc.stdout + proc.stderr[-3000:]


# File APIs that bypass the path layer: on a bucket URL they fail, or write a local folder named "gs:".
FORBIDDEN = re.compile("|".join([
    r"\b(import|from) (pathlib|shutil|glob)\b",
    r"(?<![\w.])open\(",
    r"\bos\.path\b",
    r"\bos\.(replace|rename|remove|unlink|makedirs|mkdir|rmdir|listdir|scandir|walk|access|fsync|fdopen)\(",
    r"(?<!storage)\.(read_text|write_text|read_bytes|write_bytes|mkdir|iterdir|unlink|rmtree|is_file|is_dir|exists|"
    r"glob|rglob|walk|touch)\(",
    r"\bnp\.(load|save|savez|savez_compressed)\((?!io\.BytesIO|buffer)",
    r"\.savefig\((?!buffer)",
    r"\btorch\.load\((?!io\.BytesIO)",
    r"\bsafetensors\.numpy\.(load_file|save_file)\(",
]))

# Modules allowed to use them, and why. The ones marked "to convert" are being moved onto tupe.store.storage.
ALLOWED = {
    "tupe/store/storage.py": "the path layer itself",
    "tupe/store/paths.py": "the path layer's paths: a local path made absolute (no I/O)",
    "tupe/store/atomic.py": "the path layer's local atomic write (and the umask, read from /proc/self/status)",
    "tupe/config_files.py": "config files are Python modules, imported from the local disk",
    "tupe/data/demo.py": "the demo corpus is harvested from the installed standard library and cached on the local "
                         "disk under a file lock",
    "tupe/data/packing.py": "in-memory examples spill their tokens to a local temporary file that data workers map",
    "tupe/data/shards.py": "array_record writes local files only: a shard is written locally, then moved into place "
                          "or uploaded",
    "tupe/hf/export.py": "transformers' save_pretrained writes a local folder; tupe.tools.export_hf stages a bucket's",
    "tupe/run/help.py": "--help reads the config files and the package's own source (comments, docstrings) from the "
                        "local disk, as config files are imported from it",
    "tupe/train/memory.py": "the host's available RAM is read from /proc/meminfo, a kernel file, never a workdir's",
}


def test_no_file_api_outside_storage():
  """Every file the package reads or writes goes through tupe.store.storage, but for the modules of ALLOWED."""
  root = pathlib.Path(__file__).resolve().parents[1]
  files = sorted(root.glob("tupe/**/*.py")) + [root / "train.py", root / "eval_glue.py"]
  found = []
  for file in files:
    name = file.relative_to(root).as_posix()
    if any(name == allowed or (allowed.endswith("/") and name.startswith(allowed)) for allowed in ALLOWED):
      continue
    for number, line in enumerate(file.read_text().splitlines(), 1):
      if FORBIDDEN.search(line.split("#", 1)[0]):
        found.append(f"{name}:{number}: {line.strip()}")
  assert not found, "file APIs outside tupe.store.storage (use it, or add the module to ALLOWED with a reason):\n" + \
      "\n".join(found)


def test_listings_see_what_another_client_wrote(gcs_emulator, gcs_bucket):
  """A bucket's listings are not cached: an object written by another process (here, a plain HTTP upload to the
  emulator) shows in the next listing, as a checkpoint or a lease that another host writes must."""
  import urllib.request

  storage.write_text(f"{gcs_bucket}/d/0", "")
  assert [p.name for p in storage.iterdir(f"{gcs_bucket}/d")] == ["0"] and not storage.exists(f"{gcs_bucket}/d/a")
  bucket = gcs_bucket.removeprefix("gs://")
  upload = urllib.request.Request(f"{gcs_emulator}/upload/storage/v1/b/{bucket}/o?uploadType=media&name=d/a",
                                  data=b"x", method="POST")
  with urllib.request.urlopen(upload) as response:
    assert response.status == 200
  assert [p.name for p in storage.iterdir(f"{gcs_bucket}/d")] == ["0", "a"] and storage.exists(f"{gcs_bucket}/d/a")
  assert storage.walk_files(gcs_bucket) == ["d/0", "d/a"]


@pytest.mark.parametrize("store", ["gs", "s3"])
def test_a_folder_is_never_a_file_while_another_host_probes_it(store, request):
  """Two hosts start one run in a bucket: one writes and removes its write probe in the workdir (all that is there)
  while the other asks whether the workdir is a file. Asked as "exists, then no folder" (two requests), the probe
  was often gone between them, and the second host refused its workdir as a file."""
  import threading

  run = request.getfixturevalue({"gs": "gcs_bucket", "s3": "s3_bucket"}[store]) + "/run"
  done = threading.Event()

  def probe():
    while not done.is_set():
      storage.check_writable(run)

  prober = threading.Thread(target=probe)
  prober.start()
  try:
    answers = [storage.is_file(run) for _ in range(60)]
  finally:
    done.set()
    prober.join()
  assert not any(answers), f"{sum(answers)} of 60 answers took the workdir for a file"
  storage.write_text(f"{run}.txt", "")
  assert storage.is_file(f"{run}.txt") and not storage.is_file(f"{run}/missing")


def test_an_append_never_writes_through_a_link(tmp_path):
  """A log in a workdir that is a link to a file elsewhere: the append is refused in one line, and that file is
  left as it was."""
  victim = tmp_path / "elsewhere.txt"
  victim.write_text("keep me\n")
  (tmp_path / "metrics.jsonl").symlink_to(victim)
  with pytest.raises(storage.StorageError, match=r"^cannot append to .*/metrics.jsonl: it is a symbolic link, and "
                                                 r"tupe writes through none"):
    storage.append_text(tmp_path / "metrics.jsonl", '{"step": 1}\n')
  assert victim.read_text() == "keep me\n"


@pytest.mark.parametrize("url, what", [("gs://b/odd dir/ü #1?x=y", "'#'"), ("s3://b/run?x=y", "'?'"),
                                       ("gs://b/a/../b", "a '.' or '..' segment"),
                                       ("s3://b/run\x07", "a control character")])
def test_a_bucket_path_orbax_would_misread_is_refused(url, what):
  with pytest.raises(storage.StorageError, match=f"^{re.escape(repr(url))}: a bucket path cannot hold "
                                                 f"{re.escape(what)}"):
    storage.path(url)
  storage.path("gs://b/odd dir/ü 1.x")  # spaces, unicode and dots in names are fine


def test_an_atomic_write_gives_the_mode_open_would(tmp_path):
  """A new file gets what `open` gives (0666 less the umask), not mkstemp's 0600, which made checkpoints and logs
  unreadable to the others of a team sharing runs; a rewritten file keeps its own mode."""
  # In a process of its own under umask 002 (whatever the suite's is): 0664, as open() gives there. (The child sets
  # it: a `preexec_fn` would fork this multithreaded JAX process, which may deadlock.)
  subprocess.run([sys.executable, "-c", f"import os; os.umask(0o002); from tupe.store import storage; "
                  f"storage.write_text({str(tmp_path)!r} + '/new.json', '{{}}'); "
                  f"storage.append_text({str(tmp_path)!r} + '/log.jsonl', '{{}}'); "
                  f"open({str(tmp_path)!r} + '/opened.json', 'w').close()"], cwd=REPO, check=True)
  mode = lambda name: stat.S_IMODE((tmp_path / name).stat().st_mode)
  # (an appended log, metrics.jsonl or runs.jsonl, was 0644 whatever the umask: a team's group could not append)
  assert mode("new.json") == mode("log.jsonl") == mode("opened.json") == 0o664
  (tmp_path / "private.json").write_text("{}")
  (tmp_path / "private.json").chmod(0o600)
  storage.write_text(tmp_path / "private.json", '{"a": 1}')
  assert mode("private.json") == 0o600 and (tmp_path / "private.json").read_text() == '{"a": 1}'


@pytest.mark.parametrize("data", [b"", b'{"a": ', b"null", b"[1]", b'"text"', b'{"a": "\xff"}'],
                         ids=["emptied", "cut", "null", "list", "string", "not-utf8"])
def test_json_that_is_not_an_object_reads_as_none_or_one_line(data, tmp_path):
  """The one reader of the JSON objects tupe writes: anything else is None to a record's reader, and one line naming
  the file and the fix to a file's (before: a JSONDecodeError's, AttributeError's or KeyError's traceback, each
  reader its own)."""
  assert jsonfile.parse(b'{"a": [1]}') == {"a": [1]} and jsonfile.parse(data) is None
  (tmp_path / "config.json").write_bytes(data)
  with pytest.raises(storage.StorageError, match=f"^{tmp_path / 'config.json'} does not hold a JSON object "
                                                 r"\(emptied or damaged\): delete it$"):
    jsonfile.read(tmp_path / "config.json", "delete it")


def test_text_in_another_encoding_is_one_line_and_a_byte_order_mark_is_dropped(tmp_path):
  """The one reader of text files (GLUE TSVs, vocabs, the analysis tool's sentences): a leading byte order mark is
  not text, and a file in another encoding is one line naming the file, the first bad byte and the fix (before:
  three readers, each with its own wording)."""
  (tmp_path / "bom.txt").write_bytes("\ufeff[PAD]\nété\n".encode("utf-8"))
  assert storage.read_text(tmp_path / "bom.txt") == "[PAD]\nété\n"
  (tmp_path / "latin.txt").write_bytes("Un été.\n".encode("latin-1"))
  with pytest.raises(storage.StorageError, match=rf"^{tmp_path / 'latin.txt'} is not UTF-8 text \(line 1, byte 3\): "
                                                 r"convert it \(e\.g\. iconv -f latin1 -t utf-8\)$"):
    storage.read_text(tmp_path / "latin.txt")
  with pytest.raises(storage.StorageError, match=rf"^vocab file {tmp_path / 'latin.txt'} is not UTF-8 text \(line 1, "
                                                 r"byte 3\): pass another$"):
    storage.read_text(tmp_path / "latin.txt", "pass another", "vocab file")
  (tmp_path / "latin.txt").write_bytes("[PAD]\r\nUn été.\n".encode("latin-1"))  # the line, counted in bytes
  with pytest.raises(storage.StorageError, match=r"is not UTF-8 text \(line 2, byte 10\)"):
    storage.read_text(tmp_path / "latin.txt")


@pytest.mark.parametrize("name", ["exists", "is_dir", "is_file", "makedirs", "read_bytes", "read_range", "write_bytes",
                                  "append_bytes", "size", "iterdir", "glob", "listing", "remove", "check_writable"])
def test_each_request_to_a_store_is_a_bounded_wait(name, monkeypatch):
  """Every operation that sends a request to a bucket goes through `deadline.call` with its verb and path (a store
  that does not answer: tests/test_deadline.py): a decorator moved onto another function fails here."""
  calls = []
  monkeypatch.setattr(deadline, "call", lambda what, fn, *args, **kwargs: calls.append(what))
  getattr(storage, name)("gs://bucket/run/x", *{"read_range": (0, 1), "write_bytes": (b"",),
                                                "append_bytes": (b"",)}.get(name, ()))
  assert len(calls) == 1 and calls[0].endswith(" gs://bucket/run/x"), calls
