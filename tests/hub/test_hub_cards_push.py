"""Model cards (metadata, citations, atomic writes), the card-collecting callback, and push against a
mocked HfApi (exact file set; a failed push leaves the folder byte-identical)."""

from __future__ import annotations

import json
import os

import pytest
from _fake_hub import FakeHfApi
from huggingface_hub import ModelCard

from hf_mlcl.hub import (
    CARD_DATA_FILE,
    CARD_FILE,
    LOSS_PAPERS,
    CardData,
    ModelCardCallback,
    PushError,
    files_to_push,
    loss_paper,
    push_folder,
    render_model_card,
    save_model_card,
)
from hf_mlcl.hub import model_card as model_card_module


def _classifier_card(**kw) -> CardData:
    base = dict(
        kind="classifier",
        model_name="someone/aapd-sd-roberta",
        base_model="FacebookAI/roberta-base",
        dataset="aapd",
        num_labels=54,
        label_names=[f"cs.L{i}" for i in range(54)],
        loss="bce",
        contrastive_loss="sd",
        probe="linear",
        head="linear",
        hyperparameters={"learning_rate": 1e-3, "threshold": "global"},
        metrics={
            "test_micro_f1": 0.7123,
            "test_macro_f1": 0.51,
            "test_p@1": 0.9,
            "validation_micro_f1": 0.7,
            "test_p@5": 0.4,
            "threshold": 0.31,
        },
    )
    base.update(kw)
    return CardData(**base)


def test_classifier_card_has_model_index_citation_usage_and_limitations():
    card = render_model_card(_classifier_card())
    parsed = ModelCard(str(card))  # round-trip through the Hub's own parser
    data = parsed.data.to_dict()
    assert data["pipeline_tag"] == "text-classification" and data["library_name"] == "transformers"
    assert "datasets" not in data and data["base_model"] == "FacebookAI/roberta-base"  # aapd: no Hub dataset
    for dataset, listed in (
        ("go_emotions", ["google-research-datasets/go_emotions"]),  # a registered name: its Hub id
        ("someone/tickets", ["someone/tickets"]),  # a Hub dataset the run loaded
        ("synthetic", None),
    ):
        meta = ModelCard(str(render_model_card(_classifier_card(dataset=dataset)))).data.to_dict()
        assert meta.get("datasets") == listed, dataset
    results = {(r.metric_name, r.dataset_split): r.metric_value for r in parsed.data.eval_results}
    assert results[("micro-F1", "test")] == pytest.approx(0.7123)
    assert results[("macro-F1", "test")] == pytest.approx(0.51)
    configs = {r.metric_name: r.metric_config for r in parsed.data.eval_results}
    assert configs["micro-F1"] == "micro" and configs["macro-F1"] == "macro"  # one metric type, told apart
    assert results[("P@1", "test")] == pytest.approx(0.9)
    assert parsed.data.model_name == "someone/aapd-sd-roberta"
    small = _classifier_card()
    small.num_labels, small.metrics = 4, {**small.metrics, "test_p@15": 0.2}  # P@5 and P@15 exceed 4 labels
    names = {r.metric_name for r in ModelCard(str(render_model_card(small))).data.eval_results}
    assert "P@1" in names and "P@5" not in names and "P@15" not in names
    text = parsed.text
    assert "arXiv:2410.13439" in text and "@article{huang2024similarity" in text  # the SD paper
    assert 'pipeline("text-classification", model="someone/aapd-sd-roberta", trust_remote_code=True' in text
    assert "Intended use and limitations" in text and "| learning_rate | 0.001 |" in text
    assert "| test_micro_f1 | 0.7123 |" in text
    assert "first 20 shown" in text
    assert "PhysioNet" not in text


def test_encoder_card_and_mimic_limitations():
    card = CardData(
        kind="encoder",
        dataset="mimic3",
        loss="msc",
        loss_kwargs={"beta": 0.1},
        pooling="mean",
        base_model="/abs/local/path",
        metrics={"eval_knn_micro_f1": 0.4},
        hyperparameters={"projection_dim": 256, "temperature": 0.1},
    )
    parsed = ModelCard(str(render_model_card(card)))
    assert parsed.data.pipeline_tag == "feature-extraction"
    assert parsed.data.base_model is None  # a local absolute path is not a Hub id
    assert [(r.metric_name, r.dataset_split) for r in parsed.data.eval_results] == [
        ("kNN micro-F1", "validation")
    ]
    assert "AutoModel.from_pretrained(repo, trust_remote_code=True)" in parsed.text
    assert "MSC / ABALONE" in parsed.text and "@inproceedings{audibert2024exploring" in parsed.text
    assert "PhysioNet" in parsed.text and "256 dimensions" in parsed.text
    assert "/abs/local/path" not in parsed.text  # the body names no local path either


def test_native_classifier_card_needs_no_remote_code():
    card = CardData(
        kind="classifier",
        dataset="aapd",
        loss="bce",
        contrastive_loss="sd",
        probe="linear",
        layout="transformers",
        hyperparameters={"max_length": 64},
    )
    parsed = ModelCard(str(render_model_card(card)))
    assert parsed.data.library_name == "transformers" and parsed.data.pipeline_tag == "text-classification"
    assert "trust_remote_code" not in parsed.text and "max_length=64" in parsed.text
    remote = str(render_model_card(CardData(kind="classifier", dataset="aapd", loss="bce", probe="linear")))
    assert "top_k=None)" in remote and ", trust_remote_code=True, top_k=None)" in remote


def test_an_adapter_classifier_in_hf_mlcl_format_is_loaded_with_hf_mlcl_not_a_pipeline():
    """transformers' Auto classes given a Hub id that holds adapter_config.json load the base model it names: the
    card of an hf_mlcl-format adapter classifier shows hf_mlcl's loader only."""
    card = CardData(
        kind="classifier", dataset="aapd", loss="bce", probe="finetune", repo_id="someone/clf", adapter=True
    )
    text = str(render_model_card(card))
    assert 'MLCLForMultiLabelClassification.from_pretrained("someone/clf")' in text
    assert "pipeline(" not in text and "trust_remote_code" not in text and "AutoModelFor" not in text
    assert "label attention" not in text  # not the reason here


def test_sentence_transformers_encoder_card():
    card = CardData(
        kind="encoder",
        dataset="aapd",
        loss="sd",
        pooling="cls",
        base_model="roberta-base",
        layout="sentence-transformers",
        hyperparameters={"projection_dim": 128, "max_length": 128},
    )
    parsed = ModelCard(str(render_model_card(card)))
    assert (
        parsed.data.library_name == "sentence-transformers"
        and parsed.data.pipeline_tag == "sentence-similarity"
    )
    assert {"sentence-transformers", "feature-extraction"} <= set(parsed.data.tags)
    assert parsed.data.base_model == "roberta-base" and "**Base model:** [roberta-base]" in parsed.text
    assert "SentenceTransformer(" in parsed.text and "trust_remote_code" not in parsed.text
    assert "truncated at 128 tokens" in parsed.text


def test_baseline_classifier_card_without_contrastive_stage():
    card = render_model_card(_classifier_card(contrastive_loss=None, probe="finetune", metrics={}))
    assert "supervised baseline" in str(card) and "fine-tuned end to end" in str(card)
    assert ModelCard(str(card)).data.eval_results is None


def test_every_registered_loss_has_a_citation():
    from hf_mlcl.losses import list_losses

    missing = [n for n in list_losses() if n not in LOSS_PAPERS]
    assert not missing, f"add these losses to hf_mlcl.hub.model_card.LOSS_PAPERS: {missing}"
    assert loss_paper("sd") == LOSS_PAPERS["similarity_dissimilarity"]
    for name in (
        "all",
        "any",
        "mulsupcon",
        "similarity_dissimilarity",
        "jaccard",
        "msc",
        "ws_mulsupcon",
        "hbl",
    ):
        assert LOSS_PAPERS[name]["bibtex"].startswith("@"), name


def test_card_writing_is_atomic(tmp_path, monkeypatch):
    folder = str(tmp_path)
    save_model_card(_classifier_card(), folder)
    before = (tmp_path / CARD_FILE).read_bytes()
    assert CardData.load(folder) == _classifier_card()

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(model_card_module.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        save_model_card(_classifier_card(dataset="rcv1"), folder)
    assert (tmp_path / CARD_FILE).read_bytes() == before  # old card intact
    assert sorted(os.listdir(folder)) == [CARD_FILE, CARD_DATA_FILE]  # no temp file left behind
    # card_data.json, which marks a stage finished, goes last: a run stopped at README.md leaves it as it
    # was (it used to be the new one, so the resumed stage counted as finished without its card)
    monkeypatch.undo()

    def killed(path, text):
        raise OSError("killed")

    monkeypatch.setattr(model_card_module, "atomic_write_text", killed)
    with pytest.raises(OSError, match="killed"):
        save_model_card(_classifier_card(dataset="rcv1"), folder)
    assert CardData.load(folder) == _classifier_card()


def test_unknown_card_kind_is_rejected():
    with pytest.raises(ValueError, match="kind"):
        CardData(kind="tokenizer")


# ------------------------------------------------------------------------------------------------ callback
class _Model:
    class config:  # noqa: N801 - mimics a PretrainedConfig
        backbone_name_or_path = None
        pooling = "cls"
        projection_dim = 32
        id2label = {0: "a", 1: "b", 2: "c"}


def test_callback_collects_args_metrics_and_writes_on_train_end(tmp_path):
    from transformers import TrainerControl, TrainerState

    from hf_mlcl.training.arguments import ContrastiveTrainingArguments, DataArguments, ModelArguments

    args = ContrastiveTrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        loss="mulsupcon",
        temperature=0.1,
        learning_rate=3e-5,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        report_to="none",
    )
    model_args = ModelArguments(backbone_config={"model_type": "bert"}, pooling="cls")
    data_args = DataArguments(dataset="synthetic", max_length=64)
    cb = ModelCardCallback("encoder", model_args=model_args, data_args=data_args, write_on_train_end=True)
    state, control = TrainerState(), TrainerControl()
    cb.on_train_begin(args, state, control, model=_Model())
    cb.on_evaluate(args, state, control, metrics={"eval_loss": 1.5, "eval_knn_micro_f1": 0.25, "epoch": 1.0})
    cb.on_evaluate(args, state, control, metrics={"eval_loss": 1.25, "eval_knn_micro_f1": 0.5})
    state.log_history = [{"loss": 2.0, "step": 1}, {"train_runtime": 3.0, "train_loss": 1.9, "step": 2}]
    cb.on_train_end(args, state, control)

    card = CardData.load(str(tmp_path))
    assert card.loss == "mulsupcon" and card.dataset == "synthetic" and card.base_model == "random-init bert"
    assert card.hyperparameters["learning_rate"] == 3e-5 and card.hyperparameters["temperature"] == 0.1
    assert card.hyperparameters["total_train_batch_size"] == 16 and card.hyperparameters["max_length"] == 64
    assert card.hyperparameters["lr_scheduler_type"] == "linear"  # enum stored as its value
    # what LoRA adapted, and how it was saved
    assert {"lora_target_modules", "merge_lora"} <= set(card.hyperparameters)
    assert card.metrics["eval_loss"] == 1.25 and card.metrics["eval_knn_micro_f1"] == 0.5
    assert card.metrics["train_loss"] == 1.9 and card.label_names == ["a", "b", "c"]
    assert "transformers" in card.framework_versions
    text = (tmp_path / CARD_FILE).read_text()
    assert "MulSupCon" in text and "| eval_knn_micro_f1 | 0.5000 |" in text
    assert (
        ModelCard(text).data.base_model is None
    )  # "random-init bert" is no Hub id: kept out of the metadata
    assert card.model_name == os.path.basename(os.path.dirname(str(tmp_path))) + "-" + tmp_path.name


def test_cards_state_what_the_run_did(tmp_path):
    """The loss paper's temperature when none was given, enum values not their names, no classifier head or
    unused momentum on an encoder card, a native head's own pooling, a logistic probe's settings instead of
    gradient ones, and the joint stage's settings kept out of the metrics."""
    from transformers import TrainerControl, TrainerState

    from hf_mlcl.training.arguments import ContrastiveTrainingArguments, DataArguments, ModelArguments
    from hf_mlcl.training.stage_arguments import JointTrainingArguments, ProbingTrainingArguments

    state, control = TrainerState(), TrainerControl()
    model_args = ModelArguments(backbone_config={"model_type": "bert"}, pooling="mean", head="native")
    data = DataArguments(dataset="synthetic")
    enc = ContrastiveTrainingArguments(
        output_dir=str(tmp_path / "e"), use_cpu=True, loss="sd", report_to="none"
    )
    cb = ModelCardCallback("encoder", model_args=model_args, data_args=data)
    cb.on_train_begin(enc, state, control, model=_Model())
    hp = cb.card.hyperparameters
    assert (
        hp["temperature"] == 0.07
        and hp["lr_scheduler_type"] == "linear"
        and hp["optim"] == "adamw_torch_fused"
    )
    assert "head" not in hp and "momentum" not in hp
    text = cb.save(str(tmp_path / "e")) and (tmp_path / "e" / CARD_FILE).read_text()
    assert "SchedulerType" not in text and "OptimizerNames" not in text

    class Native:
        class config:  # noqa: N801 - a native head on BERT: cls through the backbone's pooler
            backbone_name_or_path = None
            pooling = "cls"
            native_pooling = "pooler"
            id2label = {0: "a", 1: "b", 2: "c"}

    probe = ProbingTrainingArguments(
        output_dir=str(tmp_path / "p"), use_cpu=True, probe="logistic", report_to="none"
    )
    cb = ModelCardCallback("classifier", model_args=model_args, data_args=data)
    cb.on_train_begin(probe, state, control, model=Native())
    hp = cb.card.hyperparameters
    assert hp["pooling"] == cb.card.pooling == "cls, then the backbone's pooler (dense + tanh)"
    assert "learning_rate" not in hp and "num_train_epochs" not in hp and "total_train_batch_size" not in hp
    assert hp["logistic_max_iter"] == 1000 and hp["logistic_c_grid"]

    joint = JointTrainingArguments(
        output_dir=str(tmp_path / "j"), use_cpu=True, loss="jaccard", contrastive_weight=0.3, report_to="none"
    )
    cb = ModelCardCallback("classifier", model_args=model_args, data_args=data)
    cb.on_train_begin(joint, state, control, model=Native())
    cb.update_metrics({"contrastive_weight": 0.3, "contrastive_projection_dim": 0, "test_micro_f1": 0.5})
    assert cb.card.metrics == {"test_micro_f1": 0.5} and cb.card.hyperparameters["contrastive_weight"] == 0.3
    assert cb.card.hyperparameters["temperature"] == 0.1  # jaccard's paper
    assert cb.card.hyperparameters["threshold_strategy"] == "global"
    own = ContrastiveTrainingArguments(
        output_dir=str(tmp_path / "t"),
        use_cpu=True,
        loss="sd",
        loss_kwargs={"temperature": 0.5},
        report_to="none",
    )
    cb = ModelCardCallback("encoder", model_args=model_args, data_args=data)
    cb.on_train_begin(own, state, control, model=_Model())
    assert cb.card.hyperparameters["temperature"] == 0.5  # the loss's own keyword, as the loss runs


# ------------------------------------------------------------------------------------------------ push
def _fake_checkpoint(folder) -> None:
    files = {
        "config.json": '{"model_type": "mlcl"}',
        "model.safetensors": b"\x00\x01weights",
        "configuration_mlcl.py": "# remote code",
        "modeling_mlcl.py": "# remote code",
        "tokenizer.json": "{}",
        "tokenizer_config.json": "{}",
        "metrics.json": '{"test_micro_f1": 0.5}',
        "thresholds.json": '{"threshold": 0.3}',
        "training_args.bin": b"pickle",
        "trainer_state.json": "{}",
        "checkpoint-10/model.safetensors": b"old",
        "checkpoint-10/optimizer.pt": b"opt",
        "runs/events.out": b"tb",
        "plots/f1_vs_frequency.png": b"\x89PNG",
        "onnx/model.onnx": b"onnx graph",
        "onnx/model.onnx.data": b"onnx weights",
        ".tmp-README.md": "partial",
    }
    for rel, content in files.items():
        path = os.path.join(folder, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(content if isinstance(content, bytes) else content.encode())
    save_model_card(_classifier_card(), folder)


EXPECTED = [
    "README.md",
    "card_data.json",
    "config.json",
    "configuration_mlcl.py",
    "metrics.json",
    "model.safetensors",
    "modeling_mlcl.py",
    "onnx/model.onnx",
    "onnx/model.onnx.data",
    "plots/f1_vs_frequency.png",
    "thresholds.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "trainer_state.json",
]


def _snapshot(folder) -> dict[str, bytes]:
    out = {}
    for dirpath, _dirs, files in os.walk(folder):
        for f in files:
            with open(os.path.join(dirpath, f), "rb") as fh:
                out[os.path.relpath(os.path.join(dirpath, f), folder)] = fh.read()
    return out


def test_push_uploads_model_tokenizer_card_and_metrics_only(tmp_path):
    _fake_checkpoint(str(tmp_path))
    assert files_to_push(str(tmp_path)) == EXPECTED
    api = FakeHfApi()
    assert push_folder(str(tmp_path), "someone/aapd-sd", private=True, api=api) == "commit-info"
    assert [c[0] for c in api.calls] == ["create_repo", "create_commit"]
    assert api.calls[0][1]["exist_ok"] is True and api.calls[0][1]["private"] is True
    assert api.calls[1][1]["repo_id"] == "someone/aapd-sd"
    assert sorted(api.uploaded) == EXPECTED
    assert api.uploaded["model.safetensors"] == b"\x00\x01weights"
    assert json.loads(api.uploaded["card_data.json"])["dataset"] == "aapd"


def test_push_uploads_no_symlink_and_no_local_path(tmp_path):
    """A symlink inside the folder (to a secret elsewhere, file or folder) is not uploaded, and no uploaded file
    names a path of this machine: config.json's backbone_name_or_path goes as its folder name, the card's
    local base model, encoder and dataset paths are left out; an adapter on a local base is refused."""
    folder = tmp_path / "clf"
    _fake_checkpoint(str(folder))
    secret = tmp_path / "secret.txt"
    secret.write_text("password")
    (tmp_path / "private").mkdir()
    (tmp_path / "private" / "notes.json").write_text("{}")
    os.symlink(secret, folder / "plots" / "leak.png")
    os.symlink(tmp_path / "private", folder / "linked")
    base = str(tmp_path / "models" / "minilm")
    (folder / "config.json").write_text(json.dumps({"model_type": "mlcl", "backbone_name_or_path": base}))
    card = CardData.load(str(folder))
    card.base_model, card.encoder_path, card.dataset = base, str(tmp_path / "enc"), str(secret)
    save_model_card(card, str(folder))
    api = FakeHfApi()
    push_folder(str(folder), "someone/clf", api=api)
    assert "plots/leak.png" not in api.uploaded and not any(f.startswith("linked") for f in api.uploaded)
    everything = b"".join(api.uploaded.values()).decode("utf-8", errors="replace")
    assert str(tmp_path) not in everything and "password" not in everything
    assert json.loads(api.uploaded["config.json"])["backbone_name_or_path"] == "minilm"
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base, "r": 4}))
    api = FakeHfApi()
    with pytest.raises(ValueError, match="the adapter's base model is the local folder"):
        push_folder(str(folder), "someone/clf", api=api)
    assert api.calls == []


@pytest.mark.parametrize("fail_on", ["create_repo", "create_commit"])
def test_failed_push_leaves_the_checkpoint_byte_identical(tmp_path, fail_on):
    _fake_checkpoint(str(tmp_path))
    before = _snapshot(str(tmp_path))
    with pytest.raises(PushError, match="local folder is unchanged"):
        push_folder(str(tmp_path), "someone/aapd-sd", api=FakeHfApi(fail_on=fail_on))
    assert _snapshot(str(tmp_path)) == before


@pytest.mark.parametrize(
    "remove, match",
    [
        ("README.md", "no model card"),
        ("model.safetensors", "no model weights"),
        ("config.json", "no config.json"),
    ],
)
def test_incomplete_folder_is_refused_before_any_hub_call(tmp_path, remove, match):
    _fake_checkpoint(str(tmp_path))
    os.remove(tmp_path / remove)
    api = FakeHfApi()
    with pytest.raises(ValueError, match=match):
        push_folder(str(tmp_path), "someone/x", api=api)
    assert api.calls == []


def test_bad_repo_id_is_refused(tmp_path):
    with pytest.raises(ValueError, match="repo_id"):
        push_folder(str(tmp_path), "a/b/c", api=FakeHfApi())


def test_the_pushed_card_names_the_repo_and_none_of_the_local_paths(tmp_path):
    """A local card loads from its folder; the card the push uploads loads from the repo id and carries no
    local path (folder, data paths) in README.md or card_data.json; the local files stay as they were."""
    folder = tmp_path / "outputs" / "clf"
    _fake_checkpoint(str(folder))
    card = _classifier_card(
        model_name=None,
        folder="outputs/clf",
        dataset="my_data.csv",
        local_data={"dataset": "../../my_data.csv"},
    )
    save_model_card(card, str(folder))
    local = (folder / CARD_FILE).read_text()
    assert (
        'model="outputs/clf"' in local
        and 'AutoTokenizer.from_pretrained("outputs/clf", trust_remote_code=True)' in local
    )
    before = _snapshot(str(folder))
    api = FakeHfApi()
    push_folder(str(folder), "someone/my-clf", api=api)
    pushed = api.uploaded[CARD_FILE].decode()
    assert 'model="someone/my-clf"' in pushed and "outputs/clf" not in pushed and "../../" not in pushed
    assert ModelCard(pushed).data.model_name == "someone/my-clf"
    data = json.loads(api.uploaded[CARD_DATA_FILE])
    assert data["repo_id"] == "someone/my-clf" and data["folder"] is None and data["local_data"] == {}
    assert _snapshot(str(folder)) == before


def test_a_pushed_card_drops_relative_local_paths_from_any_working_directory(tmp_path, monkeypatch):
    """A base model, encoder or data file named relative to the run's directory is this machine's path
    however the push is started: it used to be published as the card's base_model ("models/tb") when the
    push ran where that relative path did not exist."""
    from transformers import TrainerControl, TrainerState

    from hf_mlcl.training.arguments import DataArguments, ModelArguments, ProbingTrainingArguments

    run = tmp_path / "run"
    for sub in ("models/tb", "data/mine", "out/encoder"):
        (run / sub).mkdir(parents=True)
    monkeypatch.chdir(run)
    args = ProbingTrainingArguments(output_dir="out/clf", use_cpu=True, report_to="none")
    cb = ModelCardCallback(
        "classifier",
        model_args=ModelArguments(model_name_or_path="models/tb"),
        data_args=DataArguments(dataset="data/mine"),
        encoder_path="out/encoder",
    )
    cb.on_train_begin(args, TrainerState(), TrainerControl(), model=_Model())
    _fake_checkpoint("out/clf")
    cb.save("out/clf")
    monkeypatch.chdir(tmp_path)  # the push runs from elsewhere, where none of the relative paths exists
    api = FakeHfApi()
    push_folder("run/out/clf", "someone/my-clf", api=api)
    pushed = api.uploaded[CARD_FILE].decode()
    assert ModelCard(pushed).data.base_model is None
    assert not any(path in pushed for path in ("models/tb", "data/mine", "out/encoder", str(tmp_path))), (
        pushed
    )
    data = json.loads(api.uploaded[CARD_DATA_FILE])
    assert (data["base_model"], data["encoder_path"], data["dataset"]) == (None, None, "mine")
    # a Hub id is kept
    hub = ModelCardCallback(model_args=ModelArguments(model_name_or_path="FacebookAI/roberta-base"))
    assert hub.card.base_model == "FacebookAI/roberta-base"


def test_the_hub_messages_name_the_endpoint_in_use(monkeypatch):
    """With HF_ENDPOINT (a mirror, a local Hub) the messages and the pushed address name it, not huggingface.co."""
    from huggingface_hub import constants

    from hf_mlcl.hub import check_model_source
    from hf_mlcl.hub.locate import hub_endpoint

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9/")  # nothing listens on port 9
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert hub_endpoint() == "http://127.0.0.1:9"
    with pytest.raises(ConnectionError, match=r"run where http://127.0.0.1:9 can be reached"):
        check_model_source("someone/not-cached-model-xyz", "--model_name_or_path")


def test_classifier_card_states_its_threshold_its_papers_and_no_contrastive_stage_it_lacks(tmp_path):
    """The tuned threshold's value, every paper behind the training (contrastive and supervised loss), the
    supervised baseline told as one stage without contrastive tags, and no path of this machine on the Hub."""
    text = str(render_model_card(_classifier_card()))
    assert "(`global`: 0.31)" in text  # a card written before threshold_strategy still reads
    per_label = _classifier_card(
        hyperparameters={"threshold_strategy": "per_label"}, metrics={"test_micro_f1": 0.5}
    )
    assert "(`per_label`: one per label)" in str(render_model_card(per_label))
    focal = str(render_model_card(_classifier_card(loss="focal")))
    assert "@article{huang2024similarity" in focal and "@inproceedings{lin2017focal" in focal
    baseline = ModelCard(str(render_model_card(_classifier_card(contrastive_loss=None, loss="bce"))))
    assert "two stages" not in baseline.text and "supervised baseline, no contrastive stage" in baseline.text
    assert "contrastive-learning" not in baseline.data.tags and "bce" in baseline.data.tags
    two_stage = ModelCard(str(render_model_card(_classifier_card())))
    assert {"contrastive-learning", "similarity_dissimilarity"} <= set(two_stage.data.tags)
    csv = tmp_path / "train.csv"
    csv.write_text("text,labels\n")
    local = _classifier_card(
        dataset_options={"data_files": {"train": str(csv), "test": [str(csv)]}, "seed": 3}
    )
    published = local.for_hub("me/clf")
    assert published.dataset_options == {
        "data_files": {"train": "train.csv", "test": ["train.csv"]},
        "seed": 3,
    }
    assert str(tmp_path) not in str(render_model_card(published))
