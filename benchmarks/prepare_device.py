"""Prepare ``.device/``: what a device call needs that can be made here (the GPU machine has no internet).

Run it in the project's environment on a machine with PyPI access:

    .venv/bin/python benchmarks/prepare_device.py

It writes ``.device/wheels/``, ``.device/data/mimic3_full_codes.txt`` and ``.device/plan.json`` (refresh it
before every call). On the GPU machine, over a copy of the tree that carries ``.device``:
``bash benchmarks/device_run.sh`` (allow it 600 s).

Method: docs/benchmarks.md, "Preparing a device call (benchmarks/prepare_device.py)"
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = (
    "transformers",
    "peft",
    "accelerate",
    "datasets",
    "dill",
    "multiprocess",
    "evaluate",
    "sentence-transformers",
    "pytorch-metric-learning",
    "hjson",
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "typing-inspection",
)
SOURCE_ONLY = ("deepspeed",)
# GPU-only packages this machine does not install (Liger-Kernel needs Triton): pure-Python wheels, pinned here
GPU_ONLY = {"liger-kernel": "0.8.5"}
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
MIMIC_CODES = os.path.join("data", "mimic_splits", "mimic3_caml", "ALL_CODES_plmicd.txt")


def installed(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError as err:
        raise SystemExit(
            f"{name} is not installed in this environment; run `make install` (and "
            f"`.venv/bin/pip install -e '.[deepspeed]'`) first, then this script with .venv/bin/python"
        ) from err


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, ".device"))
    ap.add_argument("--shared", default=os.path.join(os.path.dirname(REPO), "shared"))
    ap.add_argument("--python-version", default="3.12", help="the GPU machine's Python")
    opts = ap.parse_args(argv)
    wheels = os.path.join(opts.out, "wheels")
    shutil.rmtree(wheels, ignore_errors=True)
    os.makedirs(wheels)
    platform_args = [arg for p in PLATFORMS for arg in ("--platform", p)]
    for name in PACKAGES:
        pip(
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            opts.python_version,
            "--implementation",
            "cp",
            *platform_args,
            "-d",
            wheels,
            f"{name}=={installed(name)}",
        )
    for name, version in GPU_ONLY.items():
        pip("download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", wheels, f"{name}=={version}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in SOURCE_ONLY:
            pip(
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary=:all:",
                "-d",
                tmp,
                f"{name}=={installed(name)}",
            )
            sdist = next(os.path.join(tmp, f) for f in os.listdir(tmp) if f.startswith(name))
            env = {**os.environ, "DS_BUILD_OPS": "0"}
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "wheel",
                    "--quiet",
                    "--no-deps",
                    "--no-build-isolation",
                    "-w",
                    wheels,
                    sdist,
                ],
                check=True,
                env=env,
            )
    data = os.path.join(opts.out, "data")
    os.makedirs(data, exist_ok=True)
    codes = os.path.join(opts.shared, MIMIC_CODES)
    if os.path.isfile(codes):
        shutil.copyfile(codes, os.path.join(data, "mimic3_full_codes.txt"))
    else:
        print(f"{codes} not found: the plm_icd measurement's MIMIC-III cell will say so", file=sys.stderr)
    import device_plan

    device_plan.main(["--write", "--plan-file", os.path.join(opts.out, "plan.json")])
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(opts.out) for f in fs)
    print(f"{opts.out}: {len(os.listdir(wheels))} wheels, {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
