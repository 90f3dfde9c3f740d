"""ProbingTrainer (linear / finetune / logistic) and the train_contrastive -> train_probe entry points."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from _training_helpers import collator, probe_args, tiny_encoder, tiny_split, tiny_tokenizer
from transformers import TrainerCallback

from hf_mlcl.modeling import MLCLForMultiLabelClassification
from hf_mlcl.training import (
    ContrastiveTrainingArguments,
    DataArguments,
    ModelArguments,
    ProbingTrainer,
    fit_logistic_probe,
    train_contrastive,
    train_probe,
)
from hf_mlcl.training.state_file import STATE_FILE


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.mark.parametrize("probe,loss", [("linear", "bce"), ("finetune", "focal"), ("linear", "zlpr")])
def test_probe_trains_head_and_respects_freezing(tmp_path, tok, probe, loss):
    clf = MLCLForMultiLabelClassification.from_encoder(
        tiny_encoder(tok), num_labels=4, freeze_encoder=probe == "linear"
    )
    before = {n: p.detach().clone() for n, p in clf.named_parameters()}
    tr = ProbingTrainer(
        model=clf,
        args=probe_args(tmp_path, probe=probe, loss=loss),
        train_dataset=tiny_split(32),
        eval_dataset=tiny_split(16, 1),
        data_collator=collator(tok),
    )
    tr.train()
    changed = {n for n, p in clf.named_parameters() if not torch.equal(p, before[n])}
    assert {"classifier.weight", "classifier.bias"} <= changed
    assert any(n.startswith("backbone.") for n in changed) == (probe == "finetune")
    metrics = tr.evaluate()
    assert {"eval_loss", "eval_micro_f1", "eval_macro_f1", "eval_p@1"} <= set(metrics)
    scores, truth = tr.predict_scores(tiny_split(16, 1))
    thr = tr.tune_threshold(scores, truth)
    assert 0.0 < thr < 1.0 and scores.shape == truth.shape == (16, 4)


def test_fit_logistic_probe_folds_standardisation_like_sklearn():
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, size=(80, 5))
    y = np.stack([x[:, 0] + rng.normal(0, 1, 80) > 3, x[:, 1] < 3, np.zeros(80, bool)], 1)
    w, b, chosen = fit_logistic_probe(x, y, c_grid=(0.5,))
    mu, sd = x.mean(0), x.std(0)
    ref = LogisticRegression(C=0.5, max_iter=1000).fit((x - mu) / sd, y[:, 0])
    np.testing.assert_allclose(x @ w[0] + b[0], ref.decision_function((x - mu) / sd), rtol=1e-6, atol=1e-6)
    assert np.all(w[2] == 0) and b[2] < -10  # constant (never seen) label
    assert chosen[0] == 0.5 and np.isnan(chosen[2])


def test_logistic_probe_picks_the_c_with_fewer_false_positives_for_a_label_absent_from_validation():
    """Every C ties on F1 for a label without validation positives: the one predicting it less wins."""
    x = np.linspace(-3.0, 3.0, 120)[:, None]
    y = np.stack([x[:, 0] > 2.0, x[:, 0] > 0.0], 1)
    xv = np.array([[-2.0], [0.5], [1.0], [2.5], [2.8]])
    yv = np.stack([np.zeros(5, bool), xv[:, 0] > 0.0], 1)  # label 0: no positive in validation
    w, b, chosen = fit_logistic_probe(x, y, xv, yv, c_grid=(1.0, 1e-4))
    assert ((xv @ w[0] + b[0]) >= 0).sum() == 0
    assert chosen.tolist() == [1e-4, 1.0]  # label 1 keeps the C with the better F1
    w1, b1, _ = fit_logistic_probe(x, y, xv, yv, c_grid=(1.0,))
    assert ((xv @ w1[0] + b1[0]) >= 0).sum() == 2  # what the first C alone predicts


def test_logistic_probe_validation_scores_equal_predict(tmp_path, tok):
    """The validation scores kept by fit_logistic (from cached features) are what predict() gives."""
    clf = MLCLForMultiLabelClassification.from_encoder(tiny_encoder(tok), num_labels=4, freeze_encoder=True)
    tr = ProbingTrainer(
        model=clf,
        args=probe_args(tmp_path, probe="logistic"),
        train_dataset=tiny_split(32),
        eval_dataset=tiny_split(16, 1),
        data_collator=collator(tok),
    )
    val = tiny_split(16, 1)
    tr.fit_logistic(val)
    cached, cached_truth = tr.logistic_validation_scores
    scores, truth = tr.predict_scores(val)
    np.testing.assert_allclose(cached, scores, rtol=1e-5, atol=1e-6)
    assert np.array_equal(cached_truth, truth) and cached.shape == (16, 4) and cached.std() > 0


def test_probing_bad_configurations(tmp_path, tok):
    ds = tiny_split(8)
    unfrozen = MLCLForMultiLabelClassification.from_encoder(
        tiny_encoder(tok), num_labels=4, freeze_encoder=False
    )
    with pytest.raises(ValueError, match="needs a frozen encoder"):
        ProbingTrainer(
            model=unfrozen,
            args=probe_args(tmp_path, probe="linear"),
            train_dataset=ds,
            data_collator=collator(tok),
        )
    from hf_mlcl.losses import get_loss

    with pytest.raises(ValueError, match="contrastive loss"):
        ProbingTrainer(
            model=unfrozen,
            args=probe_args(tmp_path, probe="finetune"),
            train_dataset=ds,
            data_collator=collator(tok),
            loss_fn=get_loss("sd"),
        )
    with pytest.raises(ValueError, match="label-count mismatch"):
        five = MLCLForMultiLabelClassification.from_encoder(
            tiny_encoder(tok), num_labels=5, freeze_encoder=False
        )
        ProbingTrainer(
            model=five,
            args=probe_args(tmp_path, probe="finetune"),
            train_dataset=ds,
            data_collator=collator(tok),
        )
    with pytest.raises(
        ValueError, match="'sd' is a contrastive loss; the probe trains its head with a supervised"
    ):
        probe_args(tmp_path, loss="sd")
    with pytest.raises(ValueError, match="unknown probing loss 'nope'"):
        probe_args(tmp_path, loss="nope")
    assert probe_args(tmp_path, loss="asl").loss == "asl"  # an alias the registry knows is a supervised loss
    with pytest.raises(ValueError, match="per_device_train_batch_size must be a positive integer; got -1"):
        probe_args(tmp_path, per_device_train_batch_size=-1)
    with pytest.raises(ValueError, match="logistic_max_iter must be a positive number"):
        probe_args(tmp_path, logistic_max_iter=0)
    with pytest.raises(
        ValueError, match="loss FocalLoss has reduction='none' .* use reduction 'mean' or 'sum'"
    ):
        probe_args(tmp_path, loss="focal", loss_kwargs={"reduction": "none"})  # an (N, L) loss: no backward


# ------------------------------------------------------------------------------------ entry points
_BACKBONE = {
    "model_type": "bert",
    "vocab_size": 300,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 128,
}


def _data_args():
    opts = {
        "num_labels": 6,
        "num_train": 64,
        "num_validation": 32,
        "num_test": 32,
        "min_words": 8,
        "max_words": 20,
    }
    return DataArguments(dataset="synthetic", dataset_options=json.dumps(opts), max_length=32)


def test_load_data_caps_first_rows_or_a_seeded_random_subset():
    from hf_mlcl.training.stages import load_run_data

    full = load_run_data(_data_args()).dataset
    first = _data_args()
    first.max_train_samples, first.max_eval_samples = 10, 5
    data = load_run_data(first)
    ds, names = data.dataset, data.label_names
    assert len(ds["train"]) == 10 and len(ds["validation"]) == 5 and len(ds["test"]) == 32 and len(names) == 6
    assert ds["train"]["text"] == full["train"]["text"][:10]

    def seeded(seed):
        args = _data_args()
        args.max_train_samples, args.subset_seed = 10, seed
        return load_run_data(args).dataset["train"]["text"]

    a, b, c = seeded(3), seeded(3), seeded(4)
    assert a == b and a != c and a != full["train"]["text"][:10]
    positions = [full["train"]["text"].index(t) for t in a]
    assert positions == sorted(positions) and len(set(positions)) == 10  # distinct rows, file order kept
    with pytest.raises(ValueError, match="max_train_samples must be a positive"):
        DataArguments(max_train_samples=0)


def test_train_contrastive_then_probe_saves_hub_loadable_classifier(tmp_path):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    model_args = ModelArguments(backbone_config=json.dumps(_BACKBONE), projection_dim=16)
    enc_dir = tmp_path / "encoder"
    cargs = ContrastiveTrainingArguments(
        output_dir=str(enc_dir),
        loss="sd",
        n_views=2,
        per_device_train_batch_size=8,
        max_steps=3,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="steps",
        save_steps=3,
        knn_k=5,
    )
    result = train_contrastive(model_args, _data_args(), cargs)
    metrics = result.metrics
    assert {"train_loss", "eval_loss", "eval_knn_micro_f1"} <= set(metrics)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "metrics.json", "trainer_state.json"):
        assert os.path.isfile(enc_dir / name), name
    assert os.path.isfile(enc_dir / "checkpoint-3" / STATE_FILE)  # the trainer's extra state (safetensors)
    saved = json.loads(
        (enc_dir / "config.json").read_text()
    )  # the backbone's own (a sentence-transformers folder)
    assert (
        saved["model_type"] == "bert"
        and len(json.loads((enc_dir / "mlcl_config.json").read_text())["id2label"]) == 6
    )

    for probe, threshold in (("linear", "global"), ("logistic", "per_label")):
        out = tmp_path / f"probe-{probe}"
        pargs = probe_args(out, probe=probe, threshold=threshold, max_steps=3)
        result = train_probe(ModelArguments(), _data_args(), pargs, encoder_path=str(enc_dir))
        ptrainer, pmetrics = result.trainer, result.metrics
        assert {"validation_micro_f1", "test_micro_f1", "test_macro_f1", "test_p@1", "threshold"} <= set(
            pmetrics
        )
        on_disk = json.loads((out / "metrics.json").read_text())
        assert on_disk["test_micro_f1"] == pytest.approx(pmetrics["test_micro_f1"])
        thr = json.loads((out / "thresholds.json").read_text())
        assert thr["strategy"] == threshold and len(thr["label_names"]) == 6
        assert (
            (len(thr["threshold"]) == 6) if threshold == "per_label" else isinstance(thr["threshold"], float)
        )
        # Hub-style reload: a sentence-transformers folder giving each label's probability, and hf_mlcl's class;
        # the tokenizer from the folder alone; same logits; label names and threshold kept
        assert json.loads((out / "config.json").read_text())["model_type"] == "bert"
        clf = MLCLForMultiLabelClassification.from_pretrained(out).eval()
        tokz = AutoTokenizer.from_pretrained(out)
        assert (
            clf.config.id2label == ptrainer.model.config.id2label
            and clf.config.decision_threshold == pmetrics["threshold"]
        )
        texts = ["some text here", "another one"]
        batch = tokz(texts, return_tensors="pt", padding=True)
        with torch.no_grad():
            ref = ptrainer.model.eval()(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
            ).logits
            got = clf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        torch.testing.assert_close(got, ref)
        probs = SentenceTransformer(str(out), device="cpu").encode(texts, convert_to_tensor=True)
        torch.testing.assert_close(probs, torch.sigmoid(ref), rtol=1e-5, atol=1e-5)


def test_bce_baseline_finetunes_raw_backbone(tmp_path):
    out = tmp_path / "bce"
    result = train_probe(
        ModelArguments(backbone_config=json.dumps(_BACKBONE)),
        _data_args(),
        probe_args(out, probe="finetune", loss="bce", threshold="0.4", max_steps=3),
    )
    metrics = result.metrics
    assert metrics["threshold"] == 0.4 and metrics["probe"] == "finetune"
    assert "test_micro_f1" in metrics and os.path.isfile(out / "tokenizer.json")


class _Recorder(TrainerCallback):
    """Records which training hooks fired and the metrics each evaluation reported."""

    def __init__(self):
        self.events: list[str] = []
        self.eval_metrics: list[dict] = []

    def on_train_begin(self, args, state, control, **kw):
        self.events.append("train_begin")

    def on_step_end(self, args, state, control, **kw):
        self.events.append("step")

    def on_evaluate(self, args, state, control, metrics=None, **kw):
        self.eval_metrics.append(dict(metrics or {}))

    def on_train_end(self, args, state, control, **kw):
        self.events.append("train_end")


def test_entry_points_are_reproducible_for_a_seed(tmp_path):
    """Same seed -> identical weights and metrics: the seed is set before heads are initialised."""
    from safetensors.torch import load_file

    model_args = ModelArguments(backbone_config=json.dumps(_BACKBONE), projection_dim=16)

    def stage1(name, seed):
        cargs = ContrastiveTrainingArguments(
            output_dir=str(tmp_path / name),
            loss="mulsupcon",
            per_device_train_batch_size=8,
            max_steps=2,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            save_strategy="no",
            knn_k=0,
            seed=seed,
        )
        result = train_contrastive(model_args, _data_args(), cargs)
        metrics = result.metrics
        return metrics["train_loss"], load_file(str(tmp_path / name / "model.safetensors"))

    (la, wa), (lb, wb), (_, wc) = stage1("a", 3), stage1("b", 3), stage1("c", 4)
    assert la == lb and wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(not torch.equal(wa[k], wc[k]) for k in wa)

    def stage2(name):
        result = train_probe(
            ModelArguments(),
            _data_args(),
            probe_args(tmp_path / name, probe="finetune", max_steps=2),
            encoder_path=str(tmp_path / "a"),
        )
        metrics = result.metrics
        return metrics, load_file(str(tmp_path / name / "model.safetensors"))

    (ma, pa), (mb, pb) = stage2("p1"), stage2("p2")
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert ma["train_loss"] == mb["train_loss"] and ma["test_micro_f1"] == mb["test_micro_f1"]


def test_entry_points_forward_callbacks_to_the_trainer(tmp_path):
    model_args = ModelArguments(backbone_config=json.dumps(_BACKBONE), projection_dim=16)
    rec = _Recorder()
    cargs = ContrastiveTrainingArguments(
        output_dir=str(tmp_path / "enc"),
        loss="mulsupcon",
        per_device_train_batch_size=8,
        max_steps=2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
        knn_k=0,
    )
    result = train_contrastive(model_args, _data_args(), cargs, callbacks=[rec])
    trainer, metrics = result.trainer, result.metrics
    assert rec in trainer.callback_handler.callbacks
    assert rec.events == ["train_begin", "step", "step", "train_end"]
    assert rec.eval_metrics and rec.eval_metrics[-1]["eval_loss"] == pytest.approx(metrics["eval_loss"])

    rec2 = _Recorder()
    result = train_probe(
        ModelArguments(backbone_config=json.dumps(_BACKBONE)),
        _data_args(),
        probe_args(tmp_path / "bce", probe="finetune", loss="bce", max_steps=3),
        callbacks=[rec2],
    )
    ptrainer = result.trainer
    assert rec2 in ptrainer.callback_handler.callbacks
    assert rec2.events == ["train_begin", "step", "step", "step", "train_end"]


def test_lora_encoder_round_trip(tmp_path):
    """use_lora: checkpoints hold adapters (+ mlcl state), the final encoder is saved merged and probes load it."""
    enc_dir = tmp_path / "lora"
    model_args = ModelArguments(
        backbone_config=json.dumps(_BACKBONE),
        use_lora=True,
        lora_target_modules=["query", "value"],
        projection_dim=16,
    )
    cargs = ContrastiveTrainingArguments(
        output_dir=str(enc_dir),
        loss="sd",
        queue_size=16,
        per_device_train_batch_size=8,
        max_steps=2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="steps",
        save_steps=2,
        knn_k=0,
    )
    result = train_contrastive(model_args, _data_args(), cargs)
    trainer = result.trainer
    assert all("lora_" in n for n in trainer.momentum_encoder.trainable_names if "backbone" in n)
    assert os.path.isfile(enc_dir / "checkpoint-2" / "adapter_model.safetensors")
    assert (
        json.loads((enc_dir / "config.json").read_text())["model_type"] == "bert"
    )  # merged: no base to name
    result = train_probe(
        ModelArguments(),
        _data_args(),
        probe_args(tmp_path / "p", probe="linear", max_steps=1),
        encoder_path=str(enc_dir),
    )
    metrics = result.metrics
    assert 0.0 <= metrics["test_micro_f1"] <= 1.0
