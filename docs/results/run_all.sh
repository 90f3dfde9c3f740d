#!/usr/bin/env bash
# Exact commands behind docs/RESULTS.md (CPU, 2 shared cores). Run from the repository root:
#   bash docs/results/run_all.sh phase1     # GoEmotions, seed 1, every loss + logistic probe, BCE fine-tune
#   bash docs/results/run_all.sh phase2     # seeds 2-3 (BCE, jaccard, hbl), jaccard fine-tune
#   bash docs/results/run_all.sh phase3     # GoEmotions: fine-tune after every loss, seeds 2-3 for every loss
#   bash docs/results/run_all.sh aapd       # AAPD held-out split, seed 1: every loss + logistic probe and fine-tune
#   bash docs/results/run_all.sh budget     # GoEmotions fine-tuning with 10 epochs instead of 2 (BCE, hbl)
#   bash docs/results/run_all.sh aapd-budget  # AAPD fine-tuning with 10 epochs (BCE, jaccard)
#   bash docs/results/run_all.sh plots      # embedding projections of the best / worst loss
# OMP_NUM_THREADS defaults to 2 (one queue on the 2 cores); session 2 ran phase3 and aapd side by side
# with OMP_NUM_THREADS=1 each.
# Checkpoints: $MLCL_RUNS (default /work/runs); small outputs: docs/results/<dataset>/<loss>_<probe>/seed<S>/.
# Tables: python docs/results/make_tables.py (rewrites the tables between the markers in docs/RESULTS.md).
set -u
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false
PY=${PY:-.venv/bin/python}
R="$PY docs/results/run.py"
LOSSES="mulsupcon sd all any jaccard msc ws_mulsupcon hbl"
cell() { echo "### $(date -u +%T) run.py cell $*"; $R cell "$@" || echo "FAILED: $*"; }

case "${1:-}" in
phase1)
  cell goemotions --loss pretrained --probe logistic --seed 1
  cell goemotions --loss bce --probe finetune --seed 1
  for L in $LOSSES; do cell goemotions --loss $L --probe logistic --seed 1; done
  ;;
phase2)   # extra seeds for BCE and the two best losses of phase 1 (by test macro-F1), one fine-tune
  for S in 2 3; do for L in jaccard hbl; do cell goemotions --loss $L --probe logistic --seed $S; done; done
  for S in 2 3; do cell goemotions --loss bce --probe finetune --seed $S; done
  cell goemotions --loss jaccard --probe finetune --seed 1
  ;;
plots)    # 2-D projections for the best / worst stage-1 loss by 3-seed mean probe macro-F1 (after phase3)
  $R embed goemotions --loss hbl --seed 1 --n 1000   # best: mulsupcon + hbl, 0.185
  $R embed goemotions --loss msc --seed 1 --n 1000   # worst: msc, 0.173
  ;;
phase3)   # GoEmotions: fine-tuning after every loss, seeds 2-3 for every loss (session 2)
  for L in $LOSSES; do cell goemotions --loss $L --probe finetune --seed 1; done
  for S in 2 3; do for L in $LOSSES; do
    cell goemotions --loss $L --probe logistic --seed $S
    cell goemotions --loss $L --probe finetune --seed $S
  done; done
  ;;
aapd)     # AAPD held-out split (build it first: python docs/results/make_aapd_split.py ../shared/data/aapd outputs/data/aapd_heldout)
  cell aapd --loss pretrained --probe logistic --seed 1
  cell aapd --loss bce --probe finetune --seed 1
  for L in $LOSSES; do cell aapd --loss $L --probe logistic --seed 1; done
  for L in $LOSSES; do cell aapd --loss $L --probe finetune --seed 1; done
  ;;
budget)   # is the weak fine-tuning a budget artefact? 10 epochs (200 steps) instead of 2, same lr
  for S in 1 2 3; do for L in bce hbl; do
    cell goemotions --loss $L --probe finetune --seed $S --tag 10ep --probe.num_train_epochs 10
  done; done
  ;;
aapd-budget)  # AAPD fine-tuning with 10 epochs (320 steps): BCE and the best loss by dev macro-F1 (jaccard)
  cell aapd --loss bce --probe finetune --seed 1 --tag 10ep --probe.num_train_epochs 10
  cell aapd --loss jaccard --probe finetune --seed 1 --tag 10ep --probe.num_train_epochs 10
  ;;
*) echo "usage: $0 phase1|phase2|phase3|aapd|budget|aapd-budget|plots" ; exit 2 ;;
esac
