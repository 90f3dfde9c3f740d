"""Classifiers with head='native' save as their family's XForSequenceClassification: transformers' pipeline and
AutoModelForSequenceClassification load them without hf_mlcl or remote code and give hf_mlcl's probabilities;
hf_mlcl reads them back; a probe run writes them."""

from __future__ import annotations

import json
import os

import pytest
import torch
from _outside import run_outside
from transformers import AutoTokenizer, DistilBertConfig

from hf_mlcl.modeling import MLCLEncoder, MLCLForMultiLabelClassification
from hf_mlcl.modeling.native import to_native_classifier

TEXTS = [
    "the patient was admitted with chest pain and shortness of breath",
    "graph neural network learning theory quantum physics",
    "joy anger",
]
NAMES = ["cardio", "renal", "neuro"]

_TRANSFORMERS = """
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

for name, folder in SPEC["folders"].items():
    model = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=False).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(SPEC["texts"], padding=True, return_tensors="pt")
    with torch.no_grad():
        probs = torch.sigmoid(model(**batch).logits)
    tagger = pipeline("text-classification", model=folder, top_k=None, trust_remote_code=False)
    scores = [{row["label"]: row["score"] for row in rows} for rows in tagger(SPEC["texts"])]
    REPORT[name] = {"class": type(model).__name__, "probs": probs.tolist(), "pipeline": scores,
                    "threshold": model.config.decision_threshold, "problem_type": model.config.problem_type}
"""


@pytest.fixture
def classifiers(tiny_bert_config, tiny_roberta_config, tiny_llama_config, bert_tokenizer, llama_tokenizer):
    torch.manual_seed(0)
    made = {}
    for name, config, tokenizer in (
        ("bert", tiny_bert_config, bert_tokenizer),
        ("roberta", tiny_roberta_config, bert_tokenizer),
        ("llama", tiny_llama_config, llama_tokenizer),
    ):
        encoder = MLCLEncoder.from_backbone(config, pooling="mean", projection_dim=8)
        clf = MLCLForMultiLabelClassification.from_encoder(encoder, id2label=NAMES, head="native")
        with torch.no_grad():
            for p in clf.classifier.parameters():
                p.normal_(0, 0.5)
        clf.config.decision_threshold = 0.4
        made[name] = (clf.eval(), tokenizer)
    return made


def _probs(clf, tokenizer) -> torch.Tensor:
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    batch = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        return torch.sigmoid(clf(**batch).logits)


def _close(got, want) -> None:
    got = torch.as_tensor(got, dtype=torch.float32)
    assert (
        torch.nn.functional.cosine_similarity(got, want).min() >= 0.99999 and (got - want).abs().max() <= 1e-5
    )


def test_native_classifiers_load_in_transformers_without_hf_mlcl(tmp_path, classifiers):
    folders, want = {}, {}
    for name, (clf, tokenizer) in classifiers.items():
        assert clf.classifier.bias is None if name == "llama" else clf.classifier.bias is not None
        folder = tmp_path / name
        clf.save_pretrained(folder)
        assert to_native_classifier(str(folder), tokenizer=tokenizer)
        assert not any(f.endswith(".py") for f in os.listdir(folder))
        folders[name], want[name] = str(folder), _probs(clf, tokenizer)
    report = run_outside(tmp_path / "child", _TRANSFORMERS, {"folders": folders, "texts": TEXTS})
    classes = {
        "bert": "BertForSequenceClassification",
        "roberta": "RobertaForSequenceClassification",
        "llama": "LlamaForSequenceClassification",
    }
    for name, got in report.items():
        assert got["class"] == classes[name]
        assert got["threshold"] == 0.4 and got["problem_type"] == "multi_label_classification"
        _close(got["probs"], want[name])
        _close(
            [[row[n] for n in NAMES] for row in got["pipeline"]], want[name]
        )  # sigmoid, every label by name


def test_a_tokenizer_padding_with_the_eos_it_appends_gives_the_native_classifier_hf_mlcls_scores(
    tmp_path, llama_tokenizer, tiny_llama_config
):
    """LlamaForSequenceClassification pools the last token that is not its pad id: with the EOS as the pad and
    an EOS appended to every text it read the token before the EOS (logits 11 apart); the saved folder pads
    with the UNK token instead."""
    import copy

    from tokenizers import processors
    from transformers import AutoModelForSequenceClassification

    from hf_mlcl.data.tokenizer import ensure_pad_token
    from hf_mlcl.modeling import save_native

    tok = copy.deepcopy(llama_tokenizer)
    bos, eos = tok.bos_token_id, tok.eos_token_id
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{tok.bos_token} $A {tok.eos_token}",
        special_tokens=[(tok.bos_token, bos), (tok.eos_token, eos)],
    )
    tok.pad_token = None
    assert ensure_pad_token(tok) == eos and tok("a")["input_ids"][-1] == eos
    tiny_llama_config.pad_token_id = eos
    torch.manual_seed(0)
    encoder = MLCLEncoder.from_backbone(tiny_llama_config, pooling="last_token")
    clf = MLCLForMultiLabelClassification.from_encoder(
        encoder, id2label=dict(enumerate(NAMES)), head="native"
    )
    torch.nn.init.normal_(clf.classifier.weight)
    clf.eval()
    with torch.no_grad():
        want = clf(**tok(TEXTS, padding=True, return_tensors="pt")).logits
    save_native(clf, str(tmp_path), tokenizer=tok)
    saved = AutoTokenizer.from_pretrained(tmp_path)
    native = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert saved.pad_token_id == native.config.pad_token_id == tok.unk_token_id != eos
    with torch.no_grad():
        got = native(**saved(TEXTS, padding=True, return_tensors="pt")).logits
    assert (got - want).abs().max() <= 1e-4


def test_hf_mlcl_reads_its_native_classifiers_back(tmp_path, classifiers):
    for name, (clf, tokenizer) in classifiers.items():
        clf.config.freeze_encoder = True
        clf.save_pretrained(tmp_path / name)
        assert to_native_classifier(str(tmp_path / name), tokenizer=tokenizer, max_seq_length=48)
        settings = json.loads((tmp_path / name / "mlcl_config.json").read_text())
        assert settings["layout"] == "transformers" and settings["max_seq_length"] == 48
        # the folder's tokenizer truncates where the classifier was trained (pipelines, truncation=True)
        assert AutoTokenizer.from_pretrained(str(tmp_path / name)).model_max_length == 48
        loaded = MLCLForMultiLabelClassification.from_pretrained(str(tmp_path / name))
        assert loaded.config.head == "native" and loaded.config.decision_threshold == 0.4
        assert not any(p.requires_grad for p in loaded.backbone.parameters())  # a frozen encoder stays frozen
        for key, value in clf.state_dict().items():
            assert torch.equal(loaded.state_dict()[key], value), (name, key)
    with pytest.raises(ValueError, match="is a classifier"):
        MLCLEncoder.from_pretrained(str(tmp_path / "bert"))
    # from_pretrained's attn_implementation reaches the backbone, as for any transformers model
    eager = MLCLForMultiLabelClassification.from_pretrained(
        str(tmp_path / "bert"), attn_implementation="eager"
    )
    assert eager.backbone.config._attn_implementation == "eager"
    _close(_probs(eager, classifiers["bert"][1]), _probs(classifiers["bert"][0], classifiers["bert"][1]))


def test_native_head_errors_name_the_fix(tiny_bert_config, bert_tokenizer):
    distil = DistilBertConfig(vocab_size=len(bert_tokenizer), dim=32, n_layers=1, n_heads=2, hidden_dim=64)
    with pytest.raises(ValueError, match="not available for 'distilbert' backbones"):
        MLCLForMultiLabelClassification.from_encoder(
            MLCLEncoder.from_backbone(distil), id2label=NAMES, head="native"
        )
    encoder = MLCLEncoder.from_backbone(tiny_bert_config, pooling="mean")
    with pytest.raises(ValueError, match="set pooling='cls'"):
        MLCLForMultiLabelClassification.from_encoder(encoder, id2label=NAMES, head="native", pooling="mean")


def test_a_probe_run_with_a_native_head_writes_a_transformers_classifier(tmp_path):
    from hf_mlcl.training import DataArguments, ModelArguments, ProbingTrainingArguments, train_probe

    options = {
        "num_labels": 6,
        "num_train": 32,
        "num_validation": 16,
        "num_test": 16,
        "min_words": 4,
        "max_words": 12,
    }
    data = DataArguments(dataset="synthetic", dataset_options=json.dumps(options), max_length=16)
    backbone = {
        "model_type": "bert",
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 64,
    }
    out = tmp_path / "clf"
    args = ProbingTrainingArguments(
        output_dir=str(out),
        probe="linear",
        per_device_train_batch_size=8,
        max_steps=2,
        learning_rate=5e-2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        cache_features=True,
    )
    result = train_probe(ModelArguments(backbone_config=json.dumps(backbone), head="native"), data, args)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and len(config["id2label"]) == 6
    assert config["decision_threshold"] == result.metrics["threshold"]
    assert sorted(os.listdir(out)).count(".model-staging") == 0 and "modeling_mlcl.py" not in os.listdir(out)
    trained = result.trainer.accelerator.unwrap_model(result.trainer.model).eval()
    loaded = MLCLForMultiLabelClassification.from_pretrained(str(out))
    for key, value in trained.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_the_converters_say_what_a_folder_holds(tmp_path, tiny_bert_config, bert_tokenizer):
    """An encoder given to the classifier converter, and a folder converted already, are one-line errors."""
    from hf_mlcl.modeling.native import to_sentence_transformers

    encoder = MLCLEncoder.from_backbone(tiny_bert_config, pooling="cls", projection_dim=8)
    encoder.save_pretrained(tmp_path / "enc")
    with pytest.raises(
        ValueError, match="holds an MLCLEncoder, not an MLCLForMultiLabelClassification: convert it"
    ):
        to_native_classifier(str(tmp_path / "enc"))
    assert to_sentence_transformers(str(tmp_path / "enc"), tokenizer=bert_tokenizer)
    with pytest.raises(
        ValueError, match="is already in its native form .mlcl_config.json.: nothing to convert"
    ):
        to_sentence_transformers(str(tmp_path / "enc"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ValueError, match="holds no hf_mlcl model"):
        to_native_classifier(str(tmp_path / "other"))


def test_a_converted_copy_takes_the_saved_tokenizer_along(tmp_path, tiny_bert_config, bert_tokenizer):
    """to_sentence_transformers(..., target=...) without a tokenizer: the folder's own goes with the copy, which
    sentence-transformers then loads on its own."""
    from sentence_transformers import SentenceTransformer

    from hf_mlcl.modeling.native import to_sentence_transformers

    torch.manual_seed(0)
    encoder = MLCLEncoder.from_backbone(tiny_bert_config, pooling="cls", projection_dim=8).eval()
    encoder.save_pretrained(tmp_path / "enc")
    bert_tokenizer.save_pretrained(tmp_path / "enc")
    assert to_sentence_transformers(str(tmp_path / "enc"), target=str(tmp_path / "st"))
    loaded = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    # without tokenizer files transformers builds a default tokenizer of a few tokens, and loading still works
    assert loaded.tokenizer.get_vocab() == bert_tokenizer.get_vocab()
    assert loaded.encode(TEXTS).shape == (len(TEXTS), 32)


def test_a_classifier_keeps_its_encoders_segment_length(tiny_bert_config):
    """from_encoder without chunk_size takes the encoder's (a segmented encoder trained at 16 stays at 16)."""
    encoder = MLCLEncoder.from_backbone(tiny_bert_config, pooling="mean", chunk_size=16, segmented=True)
    assert MLCLForMultiLabelClassification.from_encoder(encoder, id2label=NAMES).config.chunk_size == 16
    other = MLCLForMultiLabelClassification.from_encoder(encoder, id2label=NAMES, chunk_size=32)
    assert other.config.chunk_size == 32


def test_float32_heads_over_a_bf16_backbone_stay_float32_through_a_save(tmp_path, tiny_bert_config):
    """The heads train in float32 over a bf16 backbone; the saved config's bf16 dtype must not round them."""
    encoder = MLCLEncoder.from_backbone(
        tiny_bert_config, pooling="mean", projection_dim=8, dtype=torch.bfloat16
    )
    assert encoder.projection_head.dense.weight.dtype == torch.float32
    encoder.save_pretrained(tmp_path / "enc")
    again = MLCLEncoder.from_pretrained(str(tmp_path / "enc"))
    assert next(again.backbone.parameters()).dtype == torch.bfloat16
    for name, value in encoder.projection_head.state_dict().items():
        assert torch.equal(again.projection_head.state_dict()[name], value), name
