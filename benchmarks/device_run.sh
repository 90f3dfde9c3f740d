#!/usr/bin/env bash
# Run benchmarks/gpu_suite.py on a GPU machine without internet, from a copy of the working tree that
# carries .device/ (made by benchmarks/prepare_device.py):
#   bash benchmarks/device_run.sh [gpu_suite.py options, e.g. --only llama_lora]
# The wheels go into a private folder put first on PYTHONPATH (the machine's own packages stay as they
# are); the project itself is read from the tree. With $OUT set, the results folder and the log are
# also written there: each measurement's file as soon as a cell finishes, then results.tgz and suite.log.
set -uo pipefail
cd "$(dirname "$0")/.."
SITE=${MLCL_DEVICE_SITE:-/tmp/hf_mlcl_site}
if [ ! -f "$SITE/.installed" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    .device/wheels/*.whl || exit 1
  touch "$SITE/.installed"
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export MLCL_DEVICE_DATA="$PWD/.device/data"
python3 -c "import torch, transformers, peft, deepspeed, sentence_transformers, pytorch_metric_learning; \
print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, \
'deepspeed', deepspeed.__version__, torch.cuda.get_device_name(0))" || exit 1
log=${OUT:-/tmp}/suite.log
[ -n "${OUT:-}" ] && export MLCL_SUITE_MIRROR="$OUT"   # every finished cell lands in $OUT at once
python3 benchmarks/gpu_suite.py "$@" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ]; then tar czf "$OUT/results.tgz" benchmarks/results; fi
exit "$rc"
