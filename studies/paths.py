"""Where the study's files live: the repository, the small per-cell outputs and the checkpoints.

``$MLCL_RESULTS`` moves the per-cell outputs (default ``studies/results``), ``$MLCL_RUNS`` the checkpoints and
feature caches (default ``../runs`` beside the checkout). Every runner, choice rule and table reads them here.
"""

from __future__ import annotations

import os

STUDIES = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(STUDIES)
RESULTS = os.environ.get("MLCL_RESULTS", os.path.join(STUDIES, "results"))  # <study>/<cell>/seed<S>/
RUNS = os.environ.get("MLCL_RUNS", os.path.join(os.path.dirname(REPO), "runs"))  # beside the checkout
