"""Worker of test_training_run_lock.py's two-process test, launched by `torchrun --nproc_per_node 2` (gloo, CPU).

Both processes start stage 1 into ``ROOT/encoder``, whose lock the test holds: each writes the error it stops
with to ``ROOT/rank<R>.txt`` (none: ``-``). A process that waited for the other in a collective would not end.
"""

from __future__ import annotations

import faulthandler
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _training_helpers import exit_if_gloo_threads  # noqa: E402

from hf_mlcl.training import ContrastiveTrainingArguments, DataArguments, ModelArguments  # noqa: E402
from hf_mlcl.training import distributed as D  # noqa: E402
from hf_mlcl.training.preflight import InputError  # noqa: E402
from hf_mlcl.training.stages import run_contrastive_stage  # noqa: E402

if __name__ == "__main__":
    faulthandler.dump_traceback_later(60, exit=True)  # a process left waiting ends with its stack
    root = sys.argv[1]
    args = ContrastiveTrainingArguments(
        output_dir=os.path.join(root, "encoder"), use_cpu=True, max_steps=1, report_to=[], disable_tqdm=True
    )
    error = "-"
    try:
        run_contrastive_stage(
            ModelArguments(model_name_or_path="unused"), DataArguments(dataset="synthetic"), args
        )
    except InputError as e:
        error = str(e)
    with open(os.path.join(root, f"rank{D.rank()}.txt"), "w", encoding="utf-8") as fh:
        fh.write(error)
    D.shutdown()
    exit_if_gloo_threads()
