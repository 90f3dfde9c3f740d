#!/usr/bin/env bash
# The study of docs/RESULTS.md: Reuters-21578 R90 and GoEmotions, whole training sets, all-MiniLM-L6-v2.
# Run from the repository root. Every cell is skipped once its metrics.json exists, so rerunning a phase
# resumes it (a half-trained stage resumes from its last checkpoint in $MLCL_RUNS):
#   bash studies/run_all.sh full       # all the phases below, in order
#   bash studies/run_all.sh full-reuters-base     # Reuters R90: frozen probes, BCE lr 5e-5 / 1e-4 / a third on validation
#   bash studies/run_all.sh full-goemotions-base  # GoEmotions: the same
#   bash studies/run_all.sh full-reuters-losses   # Reuters: every loss -> logistic, linear; then each fine-tune
#   bash studies/run_all.sh full-goemotions-losses ["jaccard hbl"]  # the two best losses on GoEmotions
#   bash studies/run_all.sh full-seeds reuters21578 ["jaccard hbl"] # seeds 2-3: BCE + the two best losses
#     (without a list, studies/loss_choice.py names the two best on Reuters validation: frozen probes, seed 1)
#   bash studies/run_all.sh full-reuters     # two queues side by side (OMP_NUM_THREADS=1 each): the
#   bash studies/run_all.sh full-goemotions  # Reuters losses, 20-epoch BCE and seeds, resp. every GoEmotions
#     cell (full-goemotions waits for the Reuters probe rows before it names the two best losses)
#   bash studies/run_all.sh sampler-reuters ["all sd"]  # Reuters seed 1: stage 1 with positive-ensured batches
#     (--contrastive.batch_sampler positives) and both frozen probes, per loss (default: every loss)
#   bash studies/run_all.sh baselines   # TF-IDF (logistic regression, linear SVM) and SetFit on both studies
#   bash studies/run_all.sh full-cell reuters21578 --loss bce --probe finetune --lr best --seed 2 --patience 2
#     # one cell, logged like the phases' cells
#   bash studies/run_all.sh scale-reuters     # the data-scale study (issue 52, studies/scale.py) at Reuters'
#   bash studies/run_all.sh scale-goemotions  # subset sizes (500, 2,000) resp. GoEmotions' (1,000, 4,000);
#   bash studies/run_all.sh scale             # both, one queue (the two above: two queues side by side)
#   bash studies/run_all.sh tail-seeds reuters21578  # seeds 2-3 of the tail table's cells, with per-label F1
#   bash studies/run_all.sh joint-reuters     # the joint objective on the whole training sets: w 0.2, 0.5 and
#   bash studies/run_all.sh joint-goemotions  # past the better edge (seed 1), seeds 2-3 at the best w on validation
# Long runs: nohup nice -n 19 bash studies/run_all.sh full > $MLCL_RUNS/logs/study.log 2>&1 &
# (each cell also logs to $MLCL_RUNS/logs/<study>/<cell>.log).
# OMP_NUM_THREADS defaults to 2 (one queue on 2 cores); two queues of different studies side by side with
# OMP_NUM_THREADS=1 each never share a cell.
# Checkpoints: $MLCL_RUNS (default ../runs beside the repository); small outputs: studies/results/<study>/<cell>/seed<S>/.
# Tables: python studies/make_tables.py (rewrites the tables between the markers in docs/RESULTS.md).
set -u
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false
PY=${PY:-.venv/bin/python}
R="$PY studies/run.py"
LOSSES=$($PY studies/loss_choice.py --losses) || exit 1  # every loss of the study (loss_choice.LOSSES)
RUNS=${MLCL_RUNS:-$(cd "$(dirname "$0")/../.." && pwd)/runs}  # default: ../runs beside the checkout
# one logged cell: its own log file under $RUNS/logs/<study>/ (appended across runs), one line in the main log
logcell() {  # logcell STUDY NAME COMMAND...
  local study=$1 name=$2; shift 2
  local base; base=$(echo "$name" | tr -c 'A-Za-z0-9.-' '_' | sed 's/_*$//')
  [ ${#base} -gt 200 ] && base="${base:0:160}_$(echo "$name" | md5sum | cut -c1-12)"  # a file name fits 255 bytes
  local log="$RUNS/logs/$study/$base.log"
  mkdir -p "$(dirname "$log")"
  echo "### $(date -u +%F\ %T) $name (log: $log)"
  { echo "### $(date -u +%F\ %T) start, commit $(git rev-parse --short HEAD)"; "$@"; } >> "$log" 2>&1 \
    && grep -h "^RESULT\|^SKIP" "$log" | tail -1 || echo "FAILED: $study $name (see $log)"
}
fcell() { local study=$1; shift; logcell "$study" "$*" $R cell "$study" "$@"; }  # a cell of run.py
# a baseline cell (studies/baseline_tfidf.py, studies/baseline_setfit.py), its data folder named explicitly
DATA=${DATA:-../shared/data}  # the recipes' data_dir root, relative to the repository root
bcell() {
  local kind=$1 study=$2 dir; shift 2
  dir=$DATA/$([ "$study" = goemotions_full ] && echo goemotions || echo "$study")
  logcell "$study" "baseline_$kind $*" $PY "studies/baseline_$kind.py" "$study" "$@" --data_dir "$dir"
}
# BCE learning rates: 5e-5 and 1e-4, then a third chosen on validation from those two ("extend": 2e-4 if
# 1e-4 is the better, else 2e-5; studies/lr_grid.py): a grid must be able to grow past its better edge.
LRS="5e-5 1e-4 extend"
# linear probe: the encoder is frozen and encoded once (cache_features; run.py keeps the features of both
# probes in $MLCL_RUNS/<study>/features, so the linear probe loads what the logistic one encoded), so its
# epochs cost seconds:
# up to 50 epochs at the recipe's lr 1e-2, early stopping after 5 evaluations without improvement
LINEAR="--probe.num_train_epochs 50 --patience 5"
base_cells() {  # frozen pretrained MiniLM (both probes), then BCE fine-tuning at each learning rate
  local study=$1 pat=$2
  fcell "$study" --loss pretrained --probe logistic --seed 1
  fcell "$study" --loss pretrained --probe linear --seed 1 $LINEAR
  for LR in $LRS; do fcell "$study" --loss bce --probe finetune --lr "$LR" --seed 1 --patience "$pat"; done
}
probe_cells() {  # stage 1 with each loss and both frozen probes on it (minutes each)
  local study=$1 seed=$2; shift 2
  for L in "$@"; do
    fcell "$study" --loss "$L" --probe logistic --seed "$seed"
    fcell "$study" --loss "$L" --probe linear --seed "$seed" $LINEAR
  done
}
finetune_cells() {  # a fine-tune from each loss's stage-1 encoder at the BCE learning rate (hours each on Reuters)
  local study=$1 pat=$2 seed=$3; shift 3
  for L in "$@"; do fcell "$study" --loss "$L" --probe finetune --lr best --seed "$seed" --patience "$pat"; done
}
loss_cells() {  # every loss gets its probe rows before the first long fine-tune starts
  probe_cells "$1" "$3" "${@:4}"
  finetune_cells "$@"
}
# Reuters' chosen BCE run (2e-4) ended its 5 epochs still improving on validation (0.284, 0.324, 0.364):
# the same fine-tune with up to 20 epochs (patience 3) says whether the comparisons survive a converged
# baseline (cell bce_finetune-long-lr<lr>; studies/bce_choice.py LONG_BUDGET lists the studies that have it)
long_bce() { fcell "$1" --loss bce --probe finetune --lr best --seed "${2:-1}" --patience 3 --tag long --probe.num_train_epochs 20 "${@:3}"; }
# the bar's budget, chosen on validation (studies/bce_choice.py): "long" when that run beat the 5 epochs
bce_budget() {
  local b; b=$($PY studies/bce_choice.py "$1") || { echo "FAILED: bce_choice.py $1 (no seeds 2-3 of the longer BCE run)" >&2; return; }
  echo "### BCE budget of $1 chosen on validation: $b" >&2; echo "$b"
}
# the two losses that run on GoEmotions and get seeds 2-3: named, or chosen by studies/loss_choice.py
# (best seed-1 validation macro-F1 of a frozen probe on Reuters, once every loss has one)
pick() { if [ -n "${1:-}" ]; then echo "$1"; else $PY studies/loss_choice.py reuters21578 2; fi; }
# the same in a queue that runs beside full-reuters: wait (logging why) until every Reuters probe row is there
wait_pick() { local L; until L=$(pick ""); do sleep "${PICK_POLL_S:-600}"; done; echo "$L"; }
reuters_loss_cells() {  # every loss's probes, the 20-epoch BCE run, then every loss's fine-tune (seed 1)
  probe_cells reuters21578 1 $LOSSES
  long_bce reuters21578
  finetune_cells reuters21578 2 1 $LOSSES
}
seed_cells() {  # seeds 2-3: frozen pretrained probes and the losses' probes first (minutes each), then the
  # BCE baseline at its chosen learning rate (5 epochs, and the longer budget where bce_choice.py chose it),
  # then the losses' fine-tunes (hours each)
  local study=$1 pat=$2 S; shift 2
  for S in 2 3; do
    fcell "$study" --loss pretrained --probe logistic --seed "$S"
    fcell "$study" --loss pretrained --probe linear --seed "$S" $LINEAR
    probe_cells "$study" "$S" "$@"
  done
  for S in 2 3; do fcell "$study" --loss bce --probe finetune --lr best --seed "$S" --patience "$pat"; done
  if [ "$(bce_budget "$study")" = long ]; then for S in 2 3; do long_bce "$study" "$S"; done; fi
  for S in 2 3; do finetune_cells "$study" "$pat" "$S" "$@"; done
}

# Seeds 2-3 of the tail table's cells (the per-label F1 plot) again where they ran before per_label_f1.json was
# written (--rerun-without-per-label skips the others): TF-IDF SVM (seconds), the two best losses' logistic
# probes (minutes), BCE at its chosen learning rate and the longer budget where it was chosen (hours)
tail_seeds() {
  local study=$1 pat=$2 L2 S L again=--rerun-without-per-label
  L2=$(pick "") || return 1
  local B; B=$($PY studies/tail_table.py "$study")  # the tail table's baseline (best on validation), seed 1
  case "$B" in
    "tfidf "*) bcell tfidf "$study" --model "${B#tfidf }" --seed 1 $again ;;
    setfit*) bcell setfit "$study" --seed 1 $again ;;
  esac
  for S in 2 3; do bcell tfidf "$study" --model svm --seed "$S" $again; done
  for S in 2 3; do for L in $L2; do fcell "$study" --loss "$L" --probe logistic --seed "$S" $again; done; done
  for S in 2 3; do fcell "$study" --loss bce --probe finetune --lr best --seed "$S" --patience "$pat" $again; done
  if [ "$(bce_budget "$study")" = long ]; then for S in 2 3; do long_bce "$study" "$S" $again; done; fi
}

# The data-scale study (issue 52; studies/scale.py): each subset size's cells, run.py / the baselines with
# --train-size N (cells <cell>-n<N>; the full-size cells are its "all" rows). Every choice on validation per
# size: the BCE learning rate from the same grid (5e-5, 1e-4, then past the better edge, twice), the fine-tunes
# from stage 1 at that size's BCE rate; the two losses are loss_choice.py's (Reuters, full size), both probed at
# every size, the fine-tune from stage 1 with the one better on that size's validation probes (loss_choice.py
# --train-size). Epochs by the epoch rule (the full recipe's steps), 10 evaluations a fine-tune, patience 3
# evaluations. Order: the cheap rows over every size first, then each size's fine-tunes, smallest size first. Each cell's
# estimated minutes and each queue's hours: python studies/scale.py plan (from the full-size cells' wall times).
SCALE_PAT=3  # evaluations without a better validation macro-F1 (10 evaluations a fine-tune, studies/scale.py)
SCALE_LRS="$LRS extend2"  # a subset's grid grows once more past its best edge (lr_grid.py)
# The joint objective, (1 - w) * BCE + w * jaccard in one fine-tune (studies/recipes/<study>/joint.yaml): w from
# JOINT_WEIGHTS on seed 1 at BCE's learning rate (chosen on validation at that size), then up to three more w past
# the better edge (bce_choice.JOINT_LADDER: 0.05, 0.01, 0.001 below 0.2; 0.8 above 0.5; each skipped when the best
# w lies inside the grid), seeds 2-3 at the w with the best validation macro-F1. joint_cells STUDY PATIENCE [N]: at
# N training rows (without N: the whole split).
JOINT_WEIGHTS=$($PY studies/bce_choice.py --weights) || exit 1  # bce_choice.JOINT_WEIGHTS
joint_cells() {
  local study=$1 pat=$2 n=${3:-} W S
  local size=()
  [ -n "$n" ] && size=(--train-size "$n")
  for W in $JOINT_WEIGHTS extend extend2 extend3; do
    fcell "$study" --loss joint --probe finetune --lr best --weight "$W" --seed 1 --patience "$pat" "${size[@]}"
  done
  for S in 2 3; do
    fcell "$study" --loss joint --probe finetune --lr best --weight best --seed "$S" --patience "$pat" "${size[@]}"
  done
}
scell() { local study=$1 n=$2; shift 2; fcell "$study" "$@" --train-size "$n"; }  # a run.py cell at N rows
scale_cells() {  # scale_cells STUDY: every subset size's cells of the data-scale study
  local study=$1 sizes L2 N S L LR
  sizes=$($PY studies/scale.py sizes "$study") || return 1
  L2=$(pick "") || return 1
  for N in $sizes; do bcell tfidf "$study" --model logreg --seed 1 --train-size "$N"; done  # no seed changes it
  # stage 1 + logistic probe needs no choice of BCE's (minutes a run; the rows where contrastive paid at full size)
  for N in $sizes; do for S in 1 2 3; do for L in $L2; do scell "$study" "$N" --loss "$L" --probe logistic --seed "$S"; done; done; done
  for N in $sizes; do for S in 1 2 3; do bcell setfit "$study" --seed "$S" --train-size "$N"; done; done
  # the fine-tunes (hours each): one size's column complete (BCE, joint, stage 1 + fine-tune) before the next size's
  for N in $sizes; do
    for LR in $SCALE_LRS; do scell "$study" "$N" --loss bce --probe finetune --lr "$LR" --seed 1 --patience $SCALE_PAT; done
    for S in 2 3; do scell "$study" "$N" --loss bce --probe finetune --lr best --seed "$S" --patience $SCALE_PAT; done
    joint_cells "$study" $SCALE_PAT "$N"
    # stage 1 + fine-tune: the loss whose probe is better on this size's validation
    if ! L=$($PY studies/loss_choice.py "$study" --train-size "$N" $L2); then echo "FAILED: $study n$N fine-tunes"; continue; fi
    for S in 1 2 3; do scell "$study" "$N" --loss "$L" --probe finetune --lr best --seed "$S" --patience $SCALE_PAT; done
  done
}

case "${1:-}" in
full-reuters-base) base_cells reuters21578 2 ;;
full-goemotions-base) base_cells goemotions_full 3 ;;
full-reuters-losses) loss_cells reuters21578 2 1 $LOSSES ;;
full-goemotions-losses) L2=$(pick "${2:-}") || exit 1; loss_cells goemotions_full 3 1 $L2 ;;
baselines)  # TF-IDF + logistic regression (no seed changes it: one run) / linear SVM, then SetFit's recipe; seed 1
  # of every row on both studies before seeds 2 and 3 (SetFit: about an hour of 2 cores per cell)
  for study in reuters21578 goemotions_full; do for M in logreg svm; do bcell tfidf "$study" --model $M --seed 1; done; done
  for study in reuters21578 goemotions_full; do bcell setfit "$study" --seed 1; done
  for S in 2 3; do for study in reuters21578 goemotions_full; do bcell tfidf "$study" --model svm --seed "$S"; done; done
  for S in 2 3; do for study in reuters21578 goemotions_full; do bcell setfit "$study" --seed "$S"; done; done
  ;;
sampler-reuters)  # the positive-ensured sampler's effect on the frozen-probe rows (cells <loss>_<probe>-positives)
  for L in ${2:-$LOSSES}; do
    fcell reuters21578 --loss "$L" --probe logistic --seed 1 --batch-sampler positives
    fcell reuters21578 --loss "$L" --probe linear --seed 1 --batch-sampler positives $LINEAR
  done
  ;;
full-cell) shift; : "${1:?name the study and run.py cell arguments, e.g. full-cell reuters21578 --loss bce --probe finetune --lr best --seed 2 --patience 2}"; fcell "$@" ;;
full-seeds)   # seeds 2-3 of BCE (at the chosen lr) and of the two best losses (named, or by loss_choice.py)
  study=${2:?"name the study: reuters21578 or goemotions_full"}; pat=2; [ "$study" = goemotions_full ] && pat=3
  L2=$(pick "${3:-}") || exit 1
  seed_cells "$study" "$pat" $L2
  ;;
full-reuters)     # one queue's whole Reuters share: every loss (probes, then fine-tunes), then seeds 2-3
  reuters_loss_cells
  L2=$(pick "") || exit 1
  seed_cells reuters21578 2 $L2
  ;;
full-goemotions)  # the other queue's GoEmotions share: base rows, the two best losses, then seeds 2-3
  base_cells goemotions_full 3
  L2=$(wait_pick)
  loss_cells goemotions_full 3 1 $L2
  seed_cells goemotions_full 3 $L2
  ;;
full)     # the issue's order: BCE + frozen probes on both datasets, every loss on Reuters, the two best
  # losses on GoEmotions, then seeds 2-3 (one queue; full-reuters + full-goemotions split it in two)
  base_cells reuters21578 2
  base_cells goemotions_full 3
  reuters_loss_cells
  L2=$(pick "") || exit 1
  loss_cells goemotions_full 3 1 $L2
  seed_cells reuters21578 2 $L2
  seed_cells goemotions_full 3 $L2
  ;;
scale-reuters) scale_cells reuters21578 ;;       # one queue per study: run side by side with
scale-goemotions) scale_cells goemotions_full ;;  # OMP_NUM_THREADS=1 each, as full-reuters / full-goemotions
scale) scale_cells reuters21578; scale_cells goemotions_full ;;
tail-seeds)  # seeds 2-3 of the tail table's cells that predate their per-label F1 files, after the tail baseline's seed 1
  study=${2:?"name the study: reuters21578 or goemotions_full"}; pat=2; [ "$study" = goemotions_full ] && pat=3
  tail_seeds "$study" "$pat"
  ;;
joint-reuters) joint_cells reuters21578 2 ;;      # the joint objective on the whole training sets (the
joint-goemotions) joint_cells goemotions_full 3 ;;  # patience of the study's full-size fine-tunes)
*) echo "usage: $0 full|full-reuters|full-goemotions|full-reuters-base|full-goemotions-base|full-reuters-losses|full-goemotions-losses|full-seeds|full-cell|baselines|scale|scale-reuters|scale-goemotions|tail-seeds|joint-reuters|joint-goemotions" ; exit 2 ;;
esac
