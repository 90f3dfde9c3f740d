"""What each cell of ``benchmarks/gpu_suite.py`` measures, and whether a figure is older than that code.

A cell's *sources* are the library folders its timed path runs (``hf_mlcl/training/``, ``hf_mlcl/losses/``
...) and the recipe files it reads, with their ``_base_`` files. A figure measured at commit ``C`` is
*stale* when one of its cell's sources differs between ``C`` and the code compared against (``HEAD`` for
docs/PERFORMANCE.md, the working tree for a device call's plan); *unknown* when git cannot say (no
repository, a commit outside this clone, or a figure measured on uncommitted changes: its commit reads
``<sha>+...``). The measurement scripts themselves are not sources: they measure, they are not measured.

Git is asked once per commit (``git diff --name-only``); :class:`Changes` also takes a ready map
{commit: changed paths}, which is how a device call that carries no ``.git`` knows what changed.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections.abc import Iterable

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# the library code a training step runs: trainers, models, losses, label handling, the host-sync guard
TRAINING = (
    "hf_mlcl/training/",
    "hf_mlcl/modeling/",
    "hf_mlcl/losses/",
    "hf_mlcl/labels/",
    "hf_mlcl/host_sync.py",
)
LIBRARY = {
    "llama_lora": (*TRAINING, "hf_mlcl/recipes.py"),
    "throughput": (
        *TRAINING,
        "hf_mlcl/data/collator.py",
        "hf_mlcl/data/tokenizer.py",
        "hf_mlcl/integrations/",
    ),
    "plm_icd": (*TRAINING, "hf_mlcl/recipes.py"),
    "losses": ("hf_mlcl/losses/", "hf_mlcl/labels/"),
    "gradcache": TRAINING,
}
LAUNCHER_CONFIGS = {
    "fsdp": "recipes/accelerate/fsdp_llama_lora.yaml",
    "deepspeed": "recipes/accelerate/deepspeed_zero3.yaml",
}
# the folders whose content labels a device call's commit (what travels and is measured)
MEASURED_ROOTS = ("hf_mlcl", "recipes")
_BASE_ITEM = re.compile(r"^\s*-\s*['\"]?([^'\"#\s]+)")


def recipe_files(path: str, repo: str = REPO) -> list[str]:
    """``path`` (relative to ``repo``) and every ``_base_`` file it composes, recursively, in reading order."""
    out: list[str] = []

    def visit(rel: str) -> None:
        rel = os.path.normpath(rel).replace(os.sep, "/")
        if rel in out:
            return
        out.append(rel)
        full = os.path.join(repo, rel)
        if not os.path.isfile(full):
            return
        in_base = False
        for line in open(full, encoding="utf-8"):
            if line.startswith("_base_:"):
                in_base, rest = True, line.split(":", 1)[1].strip()
                if rest and not rest.startswith("#"):  # _base_: one.yaml, or an inline list
                    for item in rest.strip("[]").split(","):
                        if item.strip():
                            visit(os.path.join(os.path.dirname(rel), item.strip().strip("'\"")))
                continue
            if in_base:
                match = _BASE_ITEM.match(line)
                if match and line.startswith((" ", "-")):
                    visit(os.path.join(os.path.dirname(rel), match.group(1)))
                elif line.strip() and not line.lstrip().startswith("#"):
                    in_base = False

    visit(path)
    return out


def sources(measurement: str, cell: str, repo: str = REPO) -> tuple[str, ...]:
    """The paths (folders end in ``/``) whose code the cell ``measurement/cell`` measures."""
    paths = list(LIBRARY.get(measurement, ("hf_mlcl/",)))
    if measurement == "llama_lora":  # <run>-<launcher>[-direct | -fit80 | -fit141]
        run, launcher = cell.split("-")[:2]
        if run == "bce":
            paths.remove("hf_mlcl/losses/")
        paths += recipe_files(f"recipes/aapd/llama-3.1-8b-lora/{run}.yaml", repo)
        if "-fit" in cell:  # its settings are the memory model's choice, for the GPU sizes of llama_lora.py
            paths += [
                "benchmarks/memory_plan.py",
                "benchmarks/measurements/shapes.py",
                "benchmarks/measurements/llama_lora.py",
            ]
        if launcher in LAUNCHER_CONFIGS:
            paths.append(LAUNCHER_CONFIGS[launcher])
    elif measurement == "plm_icd":  # <run>-<dataset>
        run, dataset = cell.split("-", 1)
        if run == "bce":
            paths.remove("hf_mlcl/losses/")
        paths += recipe_files(f"recipes/{dataset}/plm-icd/{run}.yaml", repo)
    return tuple(paths)


def touches(changed: Iterable[str], paths: Iterable[str]) -> list[str]:
    """The ``paths`` (folders end in ``/``) that hold one of the ``changed`` files."""
    changed = list(changed)
    return [p for p in paths if any(c == p or (p.endswith("/") and c.startswith(p)) for c in changed)]


class Changes:
    """The files changed since a commit, from git (``against`` ``"HEAD"``, or None for the working tree) or
    from a ready map {commit: changed files} (``known``); None where it cannot be told."""

    def __init__(
        self, repo: str = REPO, against: str | None = "HEAD", known: dict[str, list[str]] | None = None
    ) -> None:
        self.repo, self.against, self.known = repo, against, known
        self._cache: dict[str, list[str] | None] = {}

    def since(self, commit: str | None) -> list[str] | None:
        if not commit or "+" in commit:
            return None
        if self.known is not None:
            return self.known.get(commit)
        if commit not in self._cache:
            self._cache[commit] = self._git(commit)
        return self._cache[commit]

    def _git(self, commit: str) -> list[str] | None:
        cmd = [
            "git",
            "diff",
            "--name-only",
            "--no-renames",
            commit,
            *([self.against] if self.against else []),
        ]
        try:
            proc = subprocess.run(cmd, cwd=self.repo, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        if proc.returncode != 0:
            return None
        untracked = (
            [] if self.against else (git("ls-files", "--others", "--exclude-standard", repo=self.repo) or "")
        )
        return proc.stdout.split() + (untracked.split() if untracked else [])

    def freshness(self, commit: str | None, paths: Iterable[str]) -> tuple[str, list[str]]:
        """("fresh" | "stale" | "unknown", the source paths that changed since ``commit``)."""
        changed = self.since(commit)
        if changed is None:
            return "unknown", []
        hit = touches(changed, paths)
        return ("stale" if hit else "fresh"), hit


def git(*args: str, repo: str = REPO) -> str | None:
    """A read-only git query's output, None where git cannot answer."""
    try:
        proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def tree_digest(repo: str = REPO, roots: tuple[str, ...] = MEASURED_ROOTS) -> str:
    """A digest of the measured folders' files as they lie on disk (caches left out): the same tree here
    and on the device machine gives the same digest, with or without .git."""
    paths = []
    for root in roots:
        for folder, dirs, files in os.walk(os.path.join(repo, root)):
            dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
            paths += [os.path.join(folder, f) for f in files if not f.endswith((".pyc", ".pyo"))]
    h = hashlib.sha256()
    for path in sorted(paths, key=lambda p: os.path.relpath(p, repo).replace(os.sep, "/")):
        h.update(os.path.relpath(path, repo).replace(os.sep, "/").encode() + b"\0")
        with open(path, "rb") as fh:
            h.update(hashlib.sha256(fh.read()).digest())
    return h.hexdigest()
