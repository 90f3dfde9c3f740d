"""Run a script in a fresh interpreter where hf_mlcl and the optional extras are not installed, as a consumer of a
saved model would (no Hub, no remote code unless the script asks for it); the script writes a JSON report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

# Modules that cannot be imported in the child unless a test names them as its consumer.
ABSENT = ("hf_mlcl", "deepspeed", "peft", "sentence_transformers", "setfit", "pytorch_metric_learning")

_PREAMBLE = """
import json, sys
ABSENT = {absent!r}
for _name in ABSENT:
    sys.modules[_name] = None  # import fails and importlib.util.find_spec answers None: not installed
for _name in ABSENT:
    try:
        __import__(_name)
    except ImportError:
        pass
    else:
        raise SystemExit(f"{{_name}} was importable; the test would prove nothing")
SPEC = json.load(open(sys.argv[1]))
REPORT = {{}}
"""
_EPILOGUE = """
REPORT["loaded"] = sorted({m.split(".")[0] for m in sys.modules if sys.modules[m] is not None} & set(ABSENT))
json.dump(REPORT, open(sys.argv[2], "w"))
"""


def run_outside(work, script: str, spec: dict, consumers: tuple[str, ...] = ()) -> dict:
    """Run ``script`` (reads ``SPEC``, fills ``REPORT``) in a subprocess without hf_mlcl and without the extras
    of :data:`ABSENT` except ``consumers``; returns ``REPORT``. The child sees no Hub and no test settings."""
    absent = tuple(name for name in ABSENT if name not in consumers)
    work.mkdir(parents=True, exist_ok=True)
    child = work / "child.py"
    child.write_text(_PREAMBLE.format(absent=absent) + textwrap.dedent(script) + _EPILOGUE)
    (work / "spec.json").write_text(json.dumps(spec))
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHONPATH", "HF_", "TRANSFORMERS_", "PYTEST"))
    }
    env.update(
        HF_HUB_OFFLINE="1",
        HF_HOME=str(work / "hf_home"),
        HF_MODULES_CACHE=str(work / "modules"),
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
    )
    proc = subprocess.run(
        [sys.executable, str(child), str(work / "spec.json"), str(work / "report.json")],
        cwd=str(work),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    report = json.loads((work / "report.json").read_text())
    assert report.pop("loaded") == [], "a module that should be absent was loaded"
    return report
