#!/usr/bin/env bash
# The study of run_all.sh on one GPU in bf16: the same cells through the same
# runner (run.py with the recipes of studies/recipes/<study>), with `--bf16 true` added to both stages, written to
# studies/results/gpu_bf16/<study>/ ($MLCL_RESULTS) so they never mix with the CPU rows (fp32, 2 cores).
#   bash studies/run_gpu.sh reuters21578      # base rows, then every loss: probes, then fine-tunes
#   bash studies/run_gpu.sh goemotions_full   # base rows, then the two best losses (loss_choice.py on
#                                                  # the GPU study's own Reuters rows), probes and fine-tunes
#   bash studies/run_gpu.sh seeds STUDY       # seeds 2-3: frozen probes, BCE, the two best losses
# Choices are made on validation inside the GPU study (its own BCE learning-rate grid, --lr best / extend
# read $MLCL_RESULTS), exactly as run_all.sh does on the CPU.
# Wall times: the first cells of a study run alone on the GPU (the BCE fine-tune at the grid's first learning
# rate; on Reuters also one stage 1 with its linear probe), so their per-epoch times are those of one cell on
# the device. One MiniLM cell keeps an H100 far from busy, so the other cells then run several at a time
# side by side (one background queue each, OMP_NUM_THREADS=2) and their wall times include that sharing.
# Every cell is skipped once its metrics.json exists: a later call resumes where one stopped (an unfinished
# cell starts over unless its checkpoints are still in $MLCL_RUNS).
#   bash studies/run_gpu.sh papers STUDY       # every loss at its paper's stage-1 budget (epochs, batch, queue:
#                                                  # studies/paper_budgets.py), seed 1, with the study's base rows,
#                                                  # into studies/results/gpu_papers/<study>/
#   bash studies/run_gpu.sh papers-seeds STUDY # seeds 2-3 there: BCE and the two best losses on validation
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
case "${1:-}" in papers*) tree=gpu_papers ;; *) tree=gpu_bf16 ;; esac
export MLCL_RESULTS=${MLCL_RESULTS:-$HERE/results/$tree} PY=${PY:-python3} OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# own encoders and checkpoints: a bf16 GPU cell must not load the CPU study's float32 encoders or resume its runs
export MLCL_RUNS=${MLCL_RUNS:-$(cd "$HERE/../.." && pwd)/runs}/$tree
LINEAR="--probe.num_train_epochs 50 --patience 5"  # as in run_all.sh
study=${2:-$1}
pat=2; [ "$study" = goemotions_full ] && pat=3  # as in run_all.sh
c() { bash "$HERE/run_all.sh" full-cell "$study" "$@" --bf16 true; }  # one cell, logged like run_all.sh's
probes() { local S=$1 L; shift; for L in "$@"; do
  c --loss "$L" --probe linear --seed "$S" $LINEAR  # encodes and caches the features ...
  c --loss "$L" --probe logistic --seed "$S"        # ... that the logistic probe then loads
done; }
ft() { local S=$1 L; shift; for L in "$@"; do c --loss "$L" --probe finetune --lr best --seed "$S" --patience "$pat"; done; }
base() {  # frozen pretrained MiniLM, both probes (the linear one caches the features the logistic one loads)
  c --loss pretrained --probe linear --seed 1 $LINEAR
  c --loss pretrained --probe logistic --seed 1
}
pick() { $PY "$HERE/loss_choice.py" reuters21578 2; }  # reads $MLCL_RESULTS
budget() { $PY "$HERE/paper_budgets.py" "$1"; }  # a loss's stage-1 overrides at its paper's budget
# the papers' rows: each loss's stage 1 at its paper's budget; both probes, then the fine-tune, per loss
pprobes() { local S=$1 L; shift; for L in "$@"; do
  c --loss "$L" --probe linear --seed "$S" $LINEAR $(budget "$L")
  c --loss "$L" --probe logistic --seed "$S" $(budget "$L")
done; }
pft() { local S=$1 L; shift; for L in "$@"; do
  c --loss "$L" --probe finetune --lr best --seed "$S" --patience "$pat" $(budget "$L")
done; }
grid() {  # the base rows of a study (BCE has no stage 1: its rows are the study's own)
  c --loss bce --probe finetune --lr 5e-5 --seed 1 --patience "$pat"
  base & c --loss bce --probe finetune --lr 1e-4 --seed 1 --patience "$pat" & wait
  c --loss bce --probe finetune --lr extend --seed 1 --patience "$pat"
  [ "$study" = reuters21578 ] && c --loss bce --probe finetune --lr best --seed 1 --patience 3 --tag long --probe.num_train_epochs 20
}
case "$1" in
reuters21578)
  c --loss bce --probe finetune --lr 5e-5 --seed 1 --patience 2   # alone
  c --loss mulsupcon --probe linear --seed 1 $LINEAR             # alone: one stage 1 and its linear probe
  base & c --loss bce --probe finetune --lr 1e-4 --seed 1 --patience 2 &
  { c --loss mulsupcon --probe logistic --seed 1; probes 1 hbl; } &
  probes 1 sd all & probes 1 any jaccard & probes 1 msc ws_mulsupcon & wait
  c --loss bce --probe finetune --lr extend --seed 1 --patience 2
  ft 1 mulsupcon sd & ft 1 all any & ft 1 jaccard msc & ft 1 ws_mulsupcon hbl &
  c --loss bce --probe finetune --lr best --seed 1 --patience 3 --tag long --probe.num_train_epochs 20 & wait
  ;;
goemotions_full)
  c --loss bce --probe finetune --lr 5e-5 --seed 1 --patience 3   # alone
  L2=$(pick) || exit 1; echo "### the two best losses on the GPU study's Reuters validation rows: $L2"
  base & c --loss bce --probe finetune --lr 1e-4 --seed 1 --patience 3 &
  for L in $L2; do probes 1 "$L" & done; wait
  c --loss bce --probe finetune --lr extend --seed 1 --patience 3
  for L in $L2; do ft 1 "$L" & done; wait
  ;;
seeds)
  L2=$(pick) || exit 1
  for S in 2 3; do
    { c --loss pretrained --probe linear --seed "$S" $LINEAR; c --loss pretrained --probe logistic --seed "$S"; } &
    c --loss bce --probe finetune --lr best --seed "$S" --patience "$pat" &
    probes "$S" $L2 &
  done; wait
  for S in 2 3; do for L in $L2; do ft "$S" "$L" & done; done; wait
  ;;
papers)
  grid
  pprobes 1 msc jaccard & pprobes 1 sd all & pprobes 1 any hbl & pprobes 1 mulsupcon ws_mulsupcon & wait
  pft 1 msc jaccard & pft 1 sd all & pft 1 any hbl & pft 1 mulsupcon ws_mulsupcon & wait
  ;;
papers-seeds)
  L2=$(pick) || exit 1; echo "### the two best losses at the papers' budgets on Reuters validation: $L2"
  for S in 2 3; do
    c --loss bce --probe finetune --lr best --seed "$S" --patience "$pat" &
    [ "$study" = reuters21578 ] && c --loss bce --probe finetune --lr best --seed "$S" --patience 3 --tag long --probe.num_train_epochs 20 &
    { pprobes "$S" $L2; pft "$S" $L2; } &
  done; wait
  ;;
*) echo "usage: $0 reuters21578|goemotions_full|seeds STUDY|papers STUDY|papers-seeds STUDY"; exit 2 ;;
esac
