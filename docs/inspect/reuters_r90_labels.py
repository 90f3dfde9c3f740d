"""Doc-figure helper only (not a loader): the ModApte-train R90 label lists of Reuters-21578, for
``hf_mlcl.analysis.inspect_labels``, until the library's own ``reuters21578`` loader (issue 14) lands;
then run ``hf-mlcl inspect reuters21578 --data-dir ../shared/data/reuters21578`` instead.

Usage (from the repository root): python docs/inspect/reuters_r90_labels.py ../shared/data/reuters21578 docs/inspect
"""

import glob
import os
import re
import sys
import time

from hf_mlcl.analysis import format_report, inspect_labels, write_report

DOC = re.compile(r"<REUTERS([^>]*)>(.*?)</REUTERS>", re.S)
TOPICS = re.compile(r"<TOPICS>(.*?)</TOPICS>", re.S)


def modapte(folder: str) -> dict[str, list[list[str]]]:
    """ModApte: TOPICS="YES" and LEWISSPLIT TRAIN / TEST; topic names per document."""
    out: dict[str, list[list[str]]] = {"TRAIN": [], "TEST": []}
    for path in sorted(glob.glob(os.path.join(folder, "reut2-*.sgm"))):
        with open(path, encoding="latin-1") as f:
            for attrs, body in DOC.findall(f.read()):
                split = re.search(r'LEWISSPLIT="([\w-]+)"', attrs).group(1)
                if 'TOPICS="YES"' in attrs and split in out:
                    topics = TOPICS.search(body)
                    out[split].append(re.findall(r"<D>(.*?)</D>", topics.group(1)) if topics else [])
    return out


if __name__ == "__main__":
    start = time.time()
    docs = modapte(sys.argv[1])
    r90 = sorted({t for d in docs["TRAIN"] for t in d} & {t for d in docs["TEST"] for t in d})
    index = {t: i for i, t in enumerate(r90)}
    rows = [[index[t] for t in d if t in index] for d in docs["TRAIN"]]
    rows = [r for r in rows if r]  # R90: documents with at least one of the 90 categories
    report = inspect_labels(rows, len(r90), label_names=r90)
    report["dataset"] = {"name": "reuters21578", "splits": ["train (ModApte, R90)"]}
    print(format_report(report))
    write_report(report, sys.argv[2], prefix="reuters21578")
    print(f"{time.time() - start:.1f} s")
