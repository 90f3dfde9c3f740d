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


def _native_classifiers(tmp_path, encoder, bert_tokenizer, tiny_llama_config, llama_tokenizer) -> dict:
    """The blocks' other folders: the recipe's classifier with head='native', and a Llama LoRA classifier with a
    native head (a PEFT SEQ_CLS adapter over a tiny base saved locally); their probabilities for the snippets'
    text."""
    from transformers import LlamaModel

    from hf_mlcl.modeling import apply_lora
    from hf_mlcl.modeling.lora import save_lora_adapter
    from hf_mlcl.modeling.native import to_native_classifier

    native = MLCLForMultiLabelClassification.from_encoder(
        MLCLEncoder.from_backbone(encoder.backbone.config, pooling="cls"),
        id2label=["sports", "politics"],
        head="native",
    ).eval()
    native.config.decision_threshold = [0.4, 0.6]  # as a probe stage tunes it
    assert save_native(native, str(tmp_path / "outputs/my_csv_native/classifier"), tokenizer=bert_tokenizer)
    base = tmp_path / "llama_base"
    LlamaModel(tiny_llama_config).save_pretrained(base)
    llama = MLCLForMultiLabelClassification.from_encoder(
        MLCLEncoder.from_backbone(str(base), pooling="last_token"),
        id2label=["sports", "politics"],
        head="native",
    )
    lora = apply_lora(llama, r=4, alpha=8, dropout=0.0, gradient_checkpointing=False, bf16=False).eval()
    save_lora_adapter(lora, str(tmp_path / "llama_saved"), str(base))
    assert to_native_classifier(
        str(tmp_path / "llama_saved"),
        tokenizer=llama_tokenizer,
        target=str(tmp_path / "outputs/llama/classifier"),
    )
    want = {}
    with torch.no_grad():
        batch = bert_tokenizer(["a new document"], return_tensors="pt")
        want["native"] = torch.sigmoid(native(**batch).logits)[0]
        batch = llama_tokenizer(["a new document"], return_tensors="pt")
        want["peft"] = lora.base_model.model(**batch).logits[0]
    return want


def test_every_block_of_use_your_model_runs(
    tmp_path, tiny_bert_config, bert_tokenizer, tiny_llama_config, llama_tokenizer
):
    python, bash = _blocks("python"), _blocks("bash")
    assert len(python) == 5 and len(bash) == 1
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
    want = _native_classifiers(tmp_path, encoder, bert_tokenizer, tiny_llama_config, llama_tokenizer)

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
        + "\nREPORT['labels'] = labels\nREPORT['pipeline'] = {s['label']: s['score'] for s in scores}"
        + "\nREPORT['threshold'] = threshold\nREPORT['peft'] = peft_logits[0].tolist()\n"
    )
    report = run_outside(
        tmp_path / "child",
        script,
        {"cwd": str(tmp_path)},
        consumers=("sentence_transformers", "onnxruntime", "peft"),
    )
    got = torch.tensor([report["pipeline"][n] for n in ("sports", "politics")])
    assert torch.allclose(got, want["native"], atol=1e-5) and report["threshold"] == [0.4, 0.6]
    assert torch.allclose(torch.tensor(report["peft"]), want["peft"], atol=1e-5)
    assert report["shapes"] == [[2, 32], [1, 2], [1, 2]]
    batch = bert_tokenizer(["a new document"], return_tensors="pt")
    with torch.no_grad():
        probs = torch.sigmoid(clf.eval()(**batch).logits)[0]
    want = {name for name, p, t in zip(["sports", "politics"], probs.tolist(), [0.4, 0.6]) if p >= t}
    assert set(report["labels"]) == want  # the per-label thresholds applied
