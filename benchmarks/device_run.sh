#!/usr/bin/env bash
# One call on a GPU machine without internet, over a copy of the tree carrying .device/ (allow it 600 s):
#   bash benchmarks/device_run.sh                  # the planned cells, within 540 s (benchmarks/device_plan.py)
#   bash benchmarks/device_run.sh --plan           # print that plan, run nothing (here or there)
#   bash benchmarks/device_run.sh --only NAME ...  # other options: benchmarks/gpu_suite.py with them, unplanned
# .device/ is prepared here: `.venv/bin/python benchmarks/prepare_device.py` (wheels, data, plan.json), and
# before each call `.venv/bin/python benchmarks/device_plan.py --write` (plan.json: the commit measured and
# what changed since each recorded one; no .git travels). The wheels go into a private folder put first on
# PYTHONPATH; the project is read from the tree. With $OUT set, each measurement's file lands there as soon as
# a cell ends (MLCL_SUITE_MIRROR), then results.tgz and suite.log: 7 files in all.
set -uo pipefail
START=$(date +%s)
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--plan" ]; then
  shift
  PY=python3; [ -x .venv/bin/python ] && PY=.venv/bin/python
  exec "$PY" benchmarks/device_plan.py "$@"
fi
SITE=${MLCL_DEVICE_SITE:-/tmp/hf_mlcl_site}
if [ ! -f "$SITE/.installed" ]; then
  ls .device/wheels/*.whl >/dev/null 2>&1 || { echo "no .device/wheels: run benchmarks/prepare_device.py here and carry .device" >&2; exit 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    .device/wheels/*.whl || exit 1
  touch "$SITE/.installed"
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLCL_DEVICE_DATA="$PWD/.device/data"
python3 -c "import torch, transformers, peft, deepspeed, sentence_transformers, pytorch_metric_learning; \
print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, \
'deepspeed', deepspeed.__version__, torch.cuda.get_device_name(0))" || exit 1
echo "start-up took $(( $(date +%s) - START )) s"
log=${OUT:-/tmp}/suite.log
[ -n "${OUT:-}" ] && export MLCL_SUITE_MIRROR="$OUT"   # every finished cell lands in $OUT at once
if [ $# -eq 0 ]; then
  python3 benchmarks/device_plan.py --run --since "$START" 2>&1 | tee -a "$log"
else
  [ -n "${MLCL_GIT_COMMIT:-}" ] || export MLCL_GIT_COMMIT="$(python3 benchmarks/device_plan.py --label)"
  python3 benchmarks/gpu_suite.py "$@" 2>&1 | tee -a "$log"
fi
rc=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ]; then tar czf "$OUT/results.tgz" benchmarks/results; fi
exit "$rc"
