#!/usr/bin/env bash
# One GPU session's figures as one results file (docs/results/gpu_<date>.jsonl), in order of importance, each
# part under its own time limit so that one slow part cannot take the others' time:
#   1. tests/test_gpu.py as one JSON line (bench.pytest_line), run beside the first compilation;
#   2. the profile of TUPE-A against BERT-A at 512 x 128 (bench.profile; its lines in RESULTS.jsonl.profile, the
#      compiled programs gzipped beside them);
#   3. `bash bench/gpu.sh fused`: BERT-A, TUPE-A and ConvBERT (MLM) base at 128 and 512 (bench.train_step);
#   4. with ANCHOR=path/to/hf_torch_mlm_train.py, HF transformers in PyTorch on the same GPU (BERT and
#      ConvBERT base, the same 65,536 tokens per step), after each of our lengths (anchor128, anchor512);
#   5. "candidates" (not in the default PARTS): BERT-A base at 512 x 128 against itself with each candidate of
#      bench.ablations swapped in (decoder_grad) and with bias_grad swapped back, interleaved; then with its
#      layers scanned (model.scan_layers: parameters stacked [layers, ...], so the optimizer updates 25 leaves
#      where it updated 201: a multi-tensor update that needs no new code);
#   6. "flags" (not in the default PARTS): BERT-A base at 512 x 128 against itself compiled with one XLA option
#      at a time (bench.train_step --variant xla_...=VALUE), interleaved: cuBLAS for every matrix product, cuDNN's
#      LayerNorm, Triton for normalization fusions, cuDNN's GEMM fusions. An option this jaxlib's XLA lacks (or
#      refuses) is left out with XLA's line on stderr. About 75 s per variant on an H200 (a base model's
#      compilation, then its steps).
#
#   ANCHOR=anchors/hf_torch_mlm_train.py bash bench/gpu_round.sh docs/results/gpu_$(date +%F).jsonl
#
# PARTS picks parts (default "tests profile 128 512", and anchor128 and anchor512 after them where ANCHOR is set);
# a name it does not know, or an anchor part without the ANCHOR file, is refused before anything runs. The exit
# status is 1 if any part failed (its lines are then missing; the others' are there), and the tests' line is there
# either way (with "status" and no counts when pytest died). BENCH_ARGS are appended to every bench.train_step,
# bench.profile and bench.ablations command (later arguments win), e.g. a smoke run of the parts on the CPU before
# GPU time is spent on them:
#   JAX_PLATFORMS=cpu BENCH_ARGS="--tiny --batch 8 --seq 16 --steps 1 --devices 1 \
#     --config.model.attention_backend=xla" PARTS="profile 128 candidates flags" \
#     bash bench/gpu_round.sh /tmp/smoke.jsonl
# On an H200 (2026-11-28) the tests and the profile took 3 minutes, length 128 4, the anchor at 128 1.5 and
# length 512 about 3.5: split the parts across calls where a call has a 10-minute limit (docs/BENCHMARKS.md,
# "Prepared for the next GPU run", has the calls). JAX's compilation cache
# (and with it XLA's per-fusion autotuning cache) is shared by the runs, so the models after the first reuse its
# autotuning: their compile_time_s is not a cold compile.
set -uo pipefail
results=${1:?usage: bash bench/gpu_round.sh RESULTS.jsonl}
parts=" ${PARTS:-tests profile 128 ${ANCHOR:+anchor128 }512${ANCHOR:+ anchor512}} "
for part in $parts; do
  case $part in
    tests|profile|128|anchor128|512|anchor512|candidates|flags) ;;
    *) echo "error: PARTS names '$part'; use some of: tests profile 128 anchor128 512 anchor512 candidates" \
            "flags, separated by spaces" >&2; exit 2 ;;
  esac
done
if [[ $parts == *" anchor"* && ! -f ${ANCHOR:-} ]]; then
  echo "error: PARTS has an anchor part but ANCHOR='${ANCHOR:-}' is not a file: set ANCHOR to the path of" \
       "hf_torch_mlm_train.py" >&2
  exit 2
fi
mkdir -p "$(dirname "$results")"
# Each call's lines start with one of its own, naming its parts (bench.plot draws the file as a round, whichever
# parts ran; a round split across calls holds one per call).
printf '{"gpu_round": "bench/gpu_round.sh", "parts": "%s", "started": "%s"}\n' "${parts:1:-1}" \
    "$(date -u +%FT%TZ)" >>"$results"
export JAX_PLATFORMS=${JAX_PLATFORMS:-cuda} PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/tupe-gpu-round-cache}
py=${PYTHON:-python3}
read -ra extra <<<"${BENCH_ARGS:-}"
fused=(--config.model.attention_backend=cudnn --config.model.attention_dropout=0.0)
note() { echo "[$(date +%T)] $*" >&2; }
failed=0
run() {  # run SECONDS COMMAND...: one part, its JSON lines appended to $results
  local limit=$1; shift
  note "start: $*"
  timeout "$limit" "$@" >>"$results" || { note "ended with status $?: $*"; failed=1; }
}

if [[ $parts == *" tests "* ]]; then
  note "start: tests/test_gpu.py (in the background)"
  # --capture=sys: what XLA writes to the process's stderr (a fatal error that kills pytest) reaches the log.
  JAX_COMPILATION_CACHE_DIR=/tmp/tupe-gpu-test-cache XLA_PYTHON_CLIENT_PREALLOCATE=false \
      timeout 240 "$py" -m bench.pytest_line tests/test_gpu.py -q --capture=sys >"$results.tests" \
      2>"$results.tests.log" &
  tests=$!
fi
if [[ $parts == *" profile "* ]]; then
  trace=$(mktemp -d)
  note "start: profile"
  timeout 200 "$py" -m bench.profile --config configs/pretrain.py:bert_a,base --compare tupe_a --batch 512 \
      --seq 128 --steps 2 --top 60 --dtype bfloat16 --trace-dir "$trace" "${fused[@]}" "${extra[@]}" \
      >>"$results.profile" \
      || note "profile ended with status $?"
  for m in bert_a tupe_a; do
    [[ ! -f $trace/$m/train_step.hlo ]] || gzip -c "$trace/$m/train_step.hlo" >"$results.$m.hlo.gz"
  done
fi
if [[ -n ${tests:-} ]]; then
  wait "$tests"; status=$?; note "tests/test_gpu.py ended with status $status"
  if [[ ! -s $results.tests ]]; then  # pytest died before its line (the cause: $results.tests.log)
    printf '{"test_gpu": "tests/test_gpu.py", "status": %d, "error": "no counts: see %s"}\n' "$status" \
        "$(basename "$results").tests.log" >"$results.tests"
  fi
  [[ $status == 0 ]] || failed=1
  cat "$results.tests" >>"$results" && rm "$results.tests"
fi
step() {  # step SEQ: the three models at this length, interleaved (bench/gpu.sh fused)
  run 300 env LENGTHS="$1" PYTHON="$py" bash bench/gpu.sh fused "${extra[@]}"
}
anchor() {  # anchor SEQ VARIANTS ConvBERT's-VARIANTS
  run 120 "$py" "$ANCHOR" --model bert --batch $((65536 / $1)) --seq "$1" --variants "$2"
  run 90 "$py" "$ANCHOR" --model convbert --batch $((65536 / $1)) --seq "$1" --variants "$3"
}
[[ $parts != *" 128 "* ]] || step 128
[[ $parts != *" anchor128 "* ]] || anchor 128 eager-masked,compile-masked eager-full,eager-masked
[[ $parts != *" 512 "* ]] || step 512
[[ $parts != *" anchor512 "* ]] || anchor 512 compile-masked eager-masked
[[ $parts != *" candidates "* ]] || run 200 "$py" -m bench.ablations --config configs/pretrain.py:bert_a,base \
    --batch 512 --seq 128 --steps 10 --repeats 3 --dtype bfloat16 --ablate decoder_grad,bias_grad "${fused[@]}" \
    "${extra[@]}"
[[ $parts != *" candidates "* ]] || run 150 "$py" -m bench.train_step --config configs/pretrain.py:bert_a,base \
    --batch 512 --seq 128 --steps 10 --repeats 2 --dtype bfloat16 --variant model.scan_layers=True "${fused[@]}" \
    "${extra[@]}"
xla_options=(xla_gpu_enable_triton_gemm=false xla_gpu_enable_cudnn_layer_norm=true
             xla_gpu_experimental_enable_fusion_block_level_rewriter=true xla_gpu_cudnn_gemm_fusion_level=2)
if [[ $parts == *" flags "* ]]; then
  known=$("$py" -c '
import sys, jax, jax.numpy as jnp
from bench import train_step
lowered = jax.jit(lambda x: x + 1).lower(jnp.zeros(1))
for item in sys.argv[1:]:
  try:
    lowered.compile(train_step.split_variant(item)[1])
    print(f"--variant {item}")
  except jax.errors.JaxRuntimeError as e:
    print(f"left out: {item}: {e}", file=sys.stderr)' "${xla_options[@]}")
  # shellcheck disable=SC2086  # $known is "--variant OPTION" words, none with spaces
  run 420 "$py" -m bench.train_step --config configs/pretrain.py:bert_a,base --batch 512 --seq 128 --steps 10 \
      --repeats 3 --dtype bfloat16 "${fused[@]}" $known "${extra[@]}"
fi
note "done"
exit $failed
