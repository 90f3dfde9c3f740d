"""Build the held-out AAPD split used in docs/RESULTS.md (the shared copy has no training texts).

train      = all 1,000 abstracts of the released validation files (text_val / label_val)
validation = test lines 1-500   (threshold tuning)
test       = test lines 501-1000 (reported metrics)

    python studies/make_aapd_split.py ../shared/data/aapd outputs/data/aapd_heldout
Writes text_{train,val,test}, label_{train,val,test} and labels.txt in the AAPD loader's format.
"""

from __future__ import annotations

import os
import shutil
import sys


def main(src: str, dst: str, n_val: int = 500) -> None:
    os.makedirs(dst, exist_ok=True)

    def lines(name: str) -> list[str]:
        with open(os.path.join(src, name), encoding="utf-8") as fh:
            return fh.read().splitlines()

    parts = {
        "train": (lines("text_val"), lines("label_val")),
        "val": (lines("text_test")[:n_val], lines("label_test")[:n_val]),
        "test": (lines("text_test")[n_val:], lines("label_test")[n_val:]),
    }
    for split, (texts, labels) in parts.items():
        if len(texts) != len(labels):
            raise ValueError(f"{split}: {len(texts)} texts but {len(labels)} label lines")
        for kind, rows in (("text", texts), ("label", labels)):
            with open(os.path.join(dst, f"{kind}_{split}"), "w", encoding="utf-8") as fh:
                fh.write("\n".join(rows) + "\n")
    shutil.copy(os.path.join(src, "labels.txt"), os.path.join(dst, "labels.txt"))
    print({k: len(v[0]) for k, v in parts.items()})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
