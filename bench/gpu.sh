#!/usr/bin/env bash
# The GPU figures of docs/BENCHMARKS.md, one JSON line per model and a ratio line per length on stdout:
# BERT-A, TUPE-A and ConvBERT (MLM objective) at base size, bfloat16, 65,536 tokens per step at lengths 128
# and 512, through bench.train_step (MFU against the data-sheet bf16 peak).
#
#   bash bench/gpu.sh fused     # cuDNN fused attention; attention dropout off (the kernel has none)
#   bash bench/gpu.sh recipe    # the papers' recipe: attention dropout 0.1 through the explicit path
#
# Extra arguments go to every bench.train_step run (e.g. --steps 20 --config.model.remat=dots); LENGTHS picks
# the sequence lengths (default "128 512"; e.g. LENGTHS=512 bash bench/gpu.sh fused, for one length per job).
# PYTHON picks the interpreter (default python).
set -euo pipefail
mode=${1:?usage: bash bench/gpu.sh fused|recipe [bench.train_step arguments]}
shift
case $mode in
  fused) attention=(--config.model.attention_backend=cudnn --config.model.attention_dropout=0.0) ;;
  recipe) attention=() ;;
  *) echo "error: unknown mode '$mode'; use fused or recipe" >&2; exit 2 ;;
esac
status=0
for seq in ${LENGTHS:-128 512}; do  # Every length runs even if one fails.
  "${PYTHON:-python}" -m bench.train_step --config configs/pretrain.py:bert_a,base --compare tupe_a,convbert_mlm \
      --batch $((65536 / seq)) --seq $seq --steps 10 --repeats 2 --dtype bfloat16 "${attention[@]}" "$@" || status=$?
done
exit $status
