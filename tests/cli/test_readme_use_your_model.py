"""README's "Use your model" section runs as it stands: its Python blocks in a process where hf_mlcl and the extras
it does not name cannot be imported, its commands with the installed `hf-mlcl`, on an encoder and a classifier
shaped as the custom-CSV recipe saves them (a mean-pooled encoder, a linear head), where it saves them (tiny
models built from configs)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import torch
from _outside import run_outside

from hf_mlcl.modeling import MLCLEncoder, MLCLForMultiLabelClassification, save_native

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
SECTION = README.split("## Use your model", 1)[1].split("\n## ", 1)[0]


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", SECTION, flags=re.S)


def test_every_block_of_use_your_model_runs(tmp_path, tiny_bert_config, bert_tokenizer):
    python, bash = _blocks("python"), _blocks("bash")
    assert len(python) == 3 and len(bash) == 1
    torch.manual_seed(0)
    encoder = MLCLEncoder.from_backbone(tiny_bert_config, pooling="mean", projection_dim=8)
    assert save_native(
        encoder, str(tmp_path / "outputs/my_csv/encoder"), tokenizer=bert_tokenizer, max_seq_length=128
    )
    clf = MLCLForMultiLabelClassification.from_encoder(
        encoder, id2label=["sports", "politics"]
    )  # the recipe's
    clf.config.decision_threshold = [0.4, 0.6]
    assert save_native(  # a sentence-transformers folder: the head as a Dense module with a sigmoid
        clf, str(tmp_path / "outputs/my_csv/classifier"), tokenizer=bert_tokenizer, max_seq_length=128
    )
    (tmp_path / "new_texts.csv").write_text("text\nthe match ended late\nthe vote was close\n")

    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    for line in bash[0].strip().splitlines():
        if line.startswith("source .venv/bin/activate"):
            continue  # the test's interpreter is the environment's
        command = line.split("#")[0].strip()
        proc = subprocess.run(
            command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, (command, proc.stderr[-3000:])
    rows = [json.loads(line) for line in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rows] == ["the match ended late", "the vote was close"]

    script = (
        "import os\nos.chdir(SPEC['cwd'])\n"
        + "\n".join(python)
        + "\nREPORT['shapes'] = [list(embeddings.shape), list(logits.shape), list(probs.shape)]"
        + "\nREPORT['labels'] = labels\n"
    )
    report = run_outside(
        tmp_path / "child", script, {"cwd": str(tmp_path)}, consumers=("sentence_transformers", "onnxruntime")
    )
    assert report["shapes"] == [[2, 32], [1, 2], [1, 2]]
    batch = bert_tokenizer(["a new document"], return_tensors="pt")
    with torch.no_grad():
        probs = torch.sigmoid(clf.eval()(**batch).logits)[0]
    want = {name for name, p, t in zip(["sports", "politics"], probs.tolist(), [0.4, 0.6]) if p >= t}
    assert set(report["labels"]) == want  # the per-label thresholds applied
