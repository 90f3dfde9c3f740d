"""hf_mlcl losses inside sentence-transformers: a tiny SentenceTransformer built from a config (no
network). The loss equals hf_mlcl's own on the model's embeddings, multi-hot and id-list labels agree,
the GradCache variant gives the plain loss's gradients, SentenceTransformerTrainer trains with it, and
the saved model card cites the loss's paper."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("sentence_transformers")

from datasets import ClassLabel, Dataset, Features, Value  # noqa: E402
from datasets import Sequence as HFSequence  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer  # noqa: E402

from hf_mlcl.integrations.sentence_transformers import (  # noqa: E402
    CachedMultiLabelContrastiveLoss,
    MultiLabelContrastiveLoss,
    add_lora_adapter,
    to_sentence_transformers_dataset,
)
from hf_mlcl.losses import get_loss  # noqa: E402

NAMES = ["cardio", "renal", "neuro", "onco", "pulm"]


@pytest.fixture
def tiny_st(tmp_path, bert_tokenizer, tiny_bert_config):
    from transformers import BertModel

    torch.manual_seed(0)
    BertModel(tiny_bert_config).save_pretrained(tmp_path / "bert")
    bert_tokenizer.save_pretrained(tmp_path / "bert")
    word = Transformer(str(tmp_path / "bert"), max_seq_length=32)
    return SentenceTransformer(modules=[word, Pooling(word.get_embedding_dimension(), "mean")], device="cpu")


def _split(n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    words = "heart kidney brain tumour lung pain acute chronic scan dose".split()
    texts, labels = [], []
    for _ in range(n):
        labs = sorted(
            set(
                torch.randint(
                    0, len(NAMES), (int(torch.randint(1, 3, (1,), generator=g)),), generator=g
                ).tolist()
            )
        )
        texts.append(" ".join(words[int(i)] for i in torch.randint(0, len(words), (6,), generator=g)))
        labels.append(labs)
    feats = Features({"text": Value("string"), "labels": HFSequence(ClassLabel(names=NAMES))})
    return Dataset.from_dict({"text": texts, "labels": labels}, features=feats)


def _features(model, texts):
    return [model.preprocess(texts)]


def test_dataset_conversion_pads_ids_or_builds_multi_hot():
    ds = _split(6)
    ids = to_sentence_transformers_dataset(ds)
    mh = to_sentence_transformers_dataset(ds, label_format="multi_hot")
    assert ids.column_names == ["text", "label"] and mh.column_names == ["text", "label"]
    width = max(len(r) for r in ds["labels"])
    for row, padded, hot in zip(ds["labels"], ids["label"], mh["label"]):
        assert padded == list(row) + [-1] * (width - len(row))
        assert hot == [int(i in row) for i in range(len(NAMES))]


@pytest.mark.parametrize("name", ["sd", "mulsupcon", "msc", "jaccard"])
def test_loss_equals_hf_mlcl_on_the_embeddings_for_both_label_formats(tiny_st, name):
    ds = _split(8)
    multi = torch.tensor(to_sentence_transformers_dataset(ds, "multi_hot")["label"])
    ids = torch.tensor(to_sentence_transformers_dataset(ds)["label"])
    tiny_st.eval()
    torch.manual_seed(1)
    loss = MultiLabelContrastiveLoss(tiny_st, name, num_labels=len(NAMES))
    with torch.no_grad():
        emb = tiny_st(_features(tiny_st, list(ds["text"]))[0])["sentence_embedding"]
        value_mh = loss(_features(tiny_st, list(ds["text"])), multi)
        value_ids = loss(_features(tiny_st, list(ds["text"])), ids)
        ref = loss.loss_fn(emb, multi.float())  # the module's own hf_mlcl loss object (msc: its prototypes)
    assert torch.isfinite(value_mh) and value_mh.item() > 0
    assert value_mh.item() == pytest.approx(ref.item(), rel=1e-6)
    assert value_ids.item() == pytest.approx(value_mh.item(), rel=1e-6)
    if name != "msc":  # a fresh registry loss gives the same number (no learnable parts)
        assert value_mh.item() == pytest.approx(get_loss(name)(emb, multi.float()).item(), rel=1e-6)


def test_ws_mulsupcon_takes_its_training_statistics_through_the_module(tiny_st):
    """ws_mulsupcon weights classes by training-set statistics: the module hands them on (label ids too)."""
    ds = _split(8)
    ids = torch.tensor(to_sentence_transformers_dataset(ds)["label"])
    loss = MultiLabelContrastiveLoss(tiny_st, "ws_mulsupcon", num_labels=len(NAMES))
    with pytest.raises(ValueError, match="set_label_statistics"):
        loss(_features(tiny_st, list(ds["text"])), ids)
    loss.set_label_statistics(ids)
    assert torch.isfinite(loss(_features(tiny_st, list(ds["text"])), ids))


def test_label_errors_name_the_problem(tiny_st):
    feats = _features(tiny_st, ["a b", "c d"])
    with pytest.raises(ValueError, match="label-id lists need num_labels"):
        MultiLabelContrastiveLoss(tiny_st, "sd")(feats, torch.tensor([[0, -1], [1, 2]]))
    with pytest.raises(ValueError, match="label id 7 is outside \\[0, 5\\)"):
        MultiLabelContrastiveLoss(tiny_st, "sd", num_labels=5)(feats, torch.tensor([[0, -1], [7, 2]]))
    checked_once = MultiLabelContrastiveLoss(tiny_st, "sd", num_labels=5)
    checked_once(
        feats, torch.tensor([[0, -1], [1, 2]])
    )  # the first batch's values are checked, later ones not
    for bad in (5, -3):  # still named, not an index error of the scatter
        with pytest.raises(ValueError, match=f"label id {bad} is outside \\[0, 5\\)"):
            checked_once(feats, torch.tensor([[0, -1], [bad, 2]]))
    with pytest.raises(ValueError, match="lists of integer label ids \\(got 'joy'\\).*make_features"):
        to_sentence_transformers_dataset(
            Dataset.from_dict({"text": ["a", "b"], "labels": [["joy", "anger"], ["joy"]]})
        )
    with pytest.raises(ValueError, match="one text column"):
        MultiLabelContrastiveLoss(tiny_st, "sd", num_labels=5)(feats * 2, torch.tensor([[0], [1]]))
    with pytest.raises(ValueError, match="unknown loss 'nope'"):
        MultiLabelContrastiveLoss(tiny_st, "nope")
    with pytest.raises(ValueError, match="supervised loss"):
        MultiLabelContrastiveLoss(tiny_st, "bce")


@pytest.mark.parametrize("train_mode", [False, True])
def test_cached_variant_gives_the_plain_gradients(tiny_st, train_mode):
    """Dropout off: identical to the plain loss. Dropout on: identical to encoding the same mini-batches
    with graphs one after the other (the RNG replay makes the second pass draw the first pass's masks)."""
    ds = _split(12)
    labels = torch.tensor(to_sentence_transformers_dataset(ds)["label"])
    texts = list(ds["text"])
    tiny_st.train(train_mode)
    plain_loss = MultiLabelContrastiveLoss(tiny_st, "sd", num_labels=len(NAMES))

    def grads(fn):
        tiny_st.zero_grad()
        torch.manual_seed(123)
        value = fn()
        value.backward()
        return value.item(), {n: p.grad.clone() for n, p in tiny_st.named_parameters() if p.grad is not None}

    def chunked_reference():
        from sentence_transformers.base.losses.gradcache import _create_minibatch

        (features,) = _features(tiny_st, texts)
        emb = torch.cat(
            [tiny_st(_create_minibatch(features, b, b + 5))["sentence_embedding"] for b in range(0, 12, 5)]
        )
        return plain_loss.compute_loss(emb, labels)

    cached_loss = CachedMultiLabelContrastiveLoss(tiny_st, "sd", mini_batch_size=5, num_labels=len(NAMES))
    ref_value, ref = grads(
        chunked_reference if train_mode else lambda: plain_loss(_features(tiny_st, texts), labels)
    )
    cached_value, cached = grads(lambda: cached_loss(_features(tiny_st, texts), labels))
    assert cached_value == pytest.approx(ref_value, rel=1e-5)
    assert ref.keys() == cached.keys() and len(ref) > 10
    for name, g in ref.items():
        torch.testing.assert_close(cached[name], g, rtol=1e-4, atol=1e-6, msg=name)


def _msc_losses(model, mini_batch_size=4):
    """The plain and the cached msc loss with the same prototypes."""
    plain = MultiLabelContrastiveLoss(model, "msc", num_labels=len(NAMES))
    cached = CachedMultiLabelContrastiveLoss(
        model, "msc", mini_batch_size=mini_batch_size, num_labels=len(NAMES)
    )
    cached.loss_fn.load_state_dict(plain.loss_fn.state_dict())
    return plain, cached


@pytest.mark.parametrize("scale", [0.5, 65536.0], ids=["accumulation_2", "fp16_loss_scale"])
def test_cached_loss_parameters_get_the_plain_gradients_under_the_trainers_scaling(tiny_st, scale):
    """The trainer scales the loss before its backward (1/2 under gradient accumulation 2, 2^16 under fp16
    loss scaling): the cached loss's own parameters (msc's prototypes) get the plain loss's gradient times
    that scale, as the model's parameters do (formerly: unscaled, 2x resp. 1/65536 of the plain one)."""
    ds = _split(12)
    labels = torch.tensor(to_sentence_transformers_dataset(ds)["label"])
    texts = list(ds["text"])
    tiny_st.eval()
    plain, cached = _msc_losses(tiny_st)

    def grads(loss):
        tiny_st.zero_grad()
        loss.loss_fn.zero_grad()
        value = loss(_features(tiny_st, texts), labels)
        (value * scale).backward()
        model = {n: p.grad.clone() for n, p in tiny_st.named_parameters() if p.grad is not None}
        return value.item(), loss.loss_fn.prototypes.grad.clone(), model

    v_plain, p_plain, m_plain = grads(plain)
    v_cached, p_cached, m_cached = grads(cached)
    assert v_cached == pytest.approx(v_plain, rel=1e-6)
    assert p_plain.abs().max() > 0
    torch.testing.assert_close(p_cached, p_plain, rtol=1e-4, atol=1e-7 * scale)
    for name, g in m_plain.items():
        torch.testing.assert_close(m_cached[name], g, rtol=1e-4, atol=1e-6 * scale, msg=name)


def test_cached_loss_with_prototypes_trains_as_the_plain_loss_under_accumulation(
    tmp_path, bert_tokenizer, tiny_bert_config
):
    """Three SentenceTransformerTrainer steps of two micro-batches each (SGD, dropout off): the cached and the
    plain msc loss end with the same prototypes and the same model."""
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from transformers import BertModel

    torch.manual_seed(0)
    BertModel(tiny_bert_config).save_pretrained(tmp_path / "bert")
    bert_tokenizer.save_pretrained(tmp_path / "bert")

    def run(cached: bool):
        word = Transformer(str(tmp_path / "bert"), max_seq_length=32)
        model = SentenceTransformer(
            modules=[word, Pooling(word.get_embedding_dimension(), "mean")], device="cpu"
        )
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        torch.manual_seed(1)
        plain, cached_loss = _msc_losses(model)
        loss = cached_loss if cached else plain
        args = SentenceTransformerTrainingArguments(
            output_dir=str(tmp_path / f"out{int(cached)}"),
            per_device_train_batch_size=8,
            gradient_accumulation_steps=2,
            max_steps=3,
            learning_rate=0.5,
            optim="sgd",
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            use_cpu=True,
            disable_tqdm=True,
            seed=3,
        )
        start = loss.loss_fn.prototypes.detach().clone()
        SentenceTransformerTrainer(
            model=model,
            args=args,
            train_dataset=to_sentence_transformers_dataset(_split(48, seed=2)),
            loss=loss,
        ).train()
        return (
            start,
            loss.loss_fn.prototypes.detach().clone(),
            {n: p.detach().clone() for n, p in model.named_parameters()},
        )

    start, protos_plain, model_plain = run(False)
    start_cached, protos_cached, model_cached = run(True)
    torch.testing.assert_close(start_cached, start)
    assert (protos_plain - start).abs().max() > 1e-3  # the prototypes learned
    torch.testing.assert_close(protos_cached, protos_plain, rtol=1e-4, atol=1e-6)
    for name, p in model_plain.items():
        torch.testing.assert_close(model_cached[name], p, rtol=1e-4, atol=1e-6, msg=name)


def test_label_similarity_reaches_the_loss_and_the_card_as_json(tiny_st):
    import json

    ds = _split(8)
    labels = torch.tensor(to_sentence_transformers_dataset(ds)["label"])
    related = torch.eye(len(NAMES))
    related[0, 1] = related[1, 0] = 0.5
    loss = MultiLabelContrastiveLoss(tiny_st, "jaccard", num_labels=len(NAMES), label_similarity=related)
    tiny_st.eval()
    with torch.no_grad():
        emb = tiny_st(_features(tiny_st, list(ds["text"]))[0])["sentence_embedding"]
        value = loss(_features(tiny_st, list(ds["text"])), labels)
    multi = torch.tensor(to_sentence_transformers_dataset(ds, "multi_hot")["label"]).float()
    assert value.item() == pytest.approx(
        get_loss("jaccard", label_similarity=related)(emb, multi).item(), rel=1e-6
    )
    config = json.loads(json.dumps(loss.get_config_dict()))
    assert config["label_similarity"] == "tensor(5, 5)"


def test_lora_adapter_trained_with_an_hf_mlcl_loss_saves_and_reloads_as_sentence_transformers_expects(
    tiny_st, tmp_path
):
    """add_lora_adapter on the tiny BERT (MiniLM's architecture) with its default targets: a
    SentenceTransformerTrainer run with the SD loss moves the adapter only; model.save writes the adapter in
    sentence-transformers' layout and SentenceTransformer(path) reloads base + adapter to the same embeddings."""
    import json

    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    add_lora_adapter(tiny_st, r=4, alpha=8, dropout=0.0)
    before = {n: p.detach().clone() for n, p in tiny_st.named_parameters()}
    trainable = {n for n, p in tiny_st.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        max_steps=2,
        learning_rate=5e-2,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    loss = MultiLabelContrastiveLoss(tiny_st, "sd", num_labels=len(NAMES))
    SentenceTransformerTrainer(
        model=tiny_st, args=args, train_dataset=to_sentence_transformers_dataset(_split(16)), loss=loss
    ).train()
    moved = {n for n, p in tiny_st.named_parameters() if not torch.equal(before[n], p.detach())}
    assert moved and moved <= trainable and any("lora_B" in n for n in moved)
    tiny_st.save(str(tmp_path / "saved"))
    files = set(os.listdir(tmp_path / "saved"))
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files and "model.safetensors" not in files
    config = json.loads((tmp_path / "saved" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tmp_path / "bert") and config["r"] == 4
    assert sorted(config["target_modules"]) == sorted(
        ["query", "key", "value", "intermediate.dense", "output.dense"]
    )
    texts = list(_split(6, seed=3)["text"])
    tiny_st.eval()
    reloaded = SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    torch.testing.assert_close(
        torch.as_tensor(reloaded.encode(texts)), torch.as_tensor(tiny_st.encode(texts)), rtol=1e-5, atol=1e-5
    )
    base = SentenceTransformer(
        modules=[Transformer(str(tmp_path / "bert"), max_seq_length=32), Pooling(32, "mean")], device="cpu"
    )
    assert not torch.allclose(
        torch.as_tensor(base.encode(texts)), torch.as_tensor(tiny_st.encode(texts)), atol=1e-4
    )


def test_gather_flag_is_the_plain_loss_in_one_process(tiny_st):
    ds = _split(8)
    labels = torch.tensor(to_sentence_transformers_dataset(ds)["label"])
    tiny_st.eval()
    with torch.no_grad():
        a = MultiLabelContrastiveLoss(tiny_st, "sd", num_labels=5, gather_across_devices=True)(
            _features(tiny_st, list(ds["text"])), labels
        )
        b = MultiLabelContrastiveLoss(tiny_st, "sd", num_labels=5)(
            _features(tiny_st, list(ds["text"])), labels
        )
    assert a.item() == pytest.approx(b.item(), rel=1e-7)


def test_sentence_transformer_trainer_trains_and_the_card_cites_the_paper(tiny_st, tmp_path):
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    train = to_sentence_transformers_dataset(_split(32, seed=1))
    loss = CachedMultiLabelContrastiveLoss(tiny_st, "mulsupcon", mini_batch_size=8, num_labels=len(NAMES))
    assert loss.get_config_dict()["loss"] == "mulsupcon" and "gao2021scaling" in loss.citation
    before = {n: p.detach().clone() for n, p in tiny_st.named_parameters()}
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=16,
        max_steps=3,
        learning_rate=1e-3,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = SentenceTransformerTrainer(model=tiny_st, args=args, train_dataset=train, loss=loss)
    out = trainer.train()
    assert out.global_step == 3 and torch.isfinite(torch.tensor(out.training_loss))
    moved = sum(not torch.equal(before[n], p.detach()) for n, p in tiny_st.named_parameters())
    assert moved > 10
    tiny_st.save(str(tmp_path / "saved"))
    card = open(os.path.join(tmp_path, "saved", "README.md"), encoding="utf-8").read()
    assert "CachedMultiLabelContrastiveLoss" in card
    assert "zhang2024mulsupcon" in card and "gao2021scaling" in card  # the papers' BibTeX
    assert '"loss": "mulsupcon"' in card  # get_config_dict


@pytest.mark.parametrize("cached", [False, True])
def test_a_trainer_step_reads_nothing_on_the_host_with_the_nan_inf_filter_off(tiny_st, tmp_path, cached):
    """With logging_nan_inf_filter=False (Trainer's filter reads every step's loss), a non-logging
    SentenceTransformerTrainer step makes no host read outside the backbone's own mask check: the loss
    checked the labels (ids and values) and the embeddings on the first batch only. The cached variant
    adds sentence-transformers' own reads: its mini-batches are cut to their longest text by reading the
    attention mask (``_create_minibatch``), none of them hf_mlcl's."""
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    from hf_mlcl.host_sync import TRANSFORMERS_MASK_PREPARATION, SyncCountingCallback
    from hf_mlcl.labels.host_reads import accelerator_path

    train = to_sentence_transformers_dataset(_split(32, seed=1))
    kw = dict(mini_batch_size=4) if cached else {}
    loss = (CachedMultiLabelContrastiveLoss if cached else MultiLabelContrastiveLoss)(
        tiny_st, "mulsupcon", num_labels=len(NAMES), **kw
    )
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        max_steps=3,
        learning_rate=1e-3,
        report_to="none",
        save_strategy="no",
        logging_steps=100,
        use_cpu=True,
        disable_tqdm=True,
        logging_nan_inf_filter=False,
    )
    callback = SyncCountingCallback(steps=[2])
    trainer = SentenceTransformerTrainer(
        model=tiny_st, args=args, train_dataset=train, loss=loss, callbacks=[callback]
    )
    with accelerator_path(), callback:
        trainer.train()
    counter = callback.counters[2]
    if cached:
        outside = counter.events_outside(
            TRANSFORMERS_MASK_PREPARATION, "sentence_transformers/base/losses/gradcache.py"
        )
        assert outside == [] and counter.count > 0, counter.report()
    else:
        outside = counter.events_outside(TRANSFORMERS_MASK_PREPARATION)
        assert outside == [] and counter.count == 1, counter.report()
    assert not loss._batch_loss.checks.pending


# ------------------------------------------------------------------------------------------ real model
def _embed(model, texts):
    emb = model.encode(texts, batch_size=128, convert_to_numpy=True, normalize_embeddings=True)
    return emb


def _probe_f1(train_x, train_y, dev_x, dev_y):
    """One logistic regression per label (sklearn, C=1) on the frozen embeddings; one global threshold
    tuned on dev for micro-F1 (same protocol for every encoder); micro / macro-F1 on dev."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier

    from hf_mlcl.evaluation import compute_multilabel_metrics, tune_global_threshold

    keep = train_y.sum(0) > 0  # labels absent from the train subset cannot be learned by either encoder
    clf = OneVsRestClassifier(LogisticRegression(C=1.0, max_iter=1000)).fit(train_x, train_y[:, keep])
    scores = np.zeros(dev_y.shape, dtype=np.float64)
    scores[:, keep] = clf.predict_proba(dev_x)
    thr = tune_global_threshold(dev_y, scores)
    m = compute_multilabel_metrics(dev_y, scores, threshold=thr)
    return m["micro_f1"], m["macro_f1"]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_minilm_on_goemotions_loss_falls_and_the_probe_beats_the_untrained_encoder(minilm_path, tmp_path):
    """The real all-MiniLM-L6-v2 trained by SentenceTransformerTrainer with the SD loss on 1,200 GoEmotions
    train texts (seeded subset, one epoch of 25 steps, batch 48): the loss on 400 dev texts falls, and a
    logistic probe on the trained embeddings beats the untrained ones on dev (micro- and macro-F1)."""
    import numpy as np
    from conftest import SHARED_DATA
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    from hf_mlcl.data import load_mlc_dataset

    src = os.path.join(SHARED_DATA, "goemotions")
    if not os.path.isfile(os.path.join(src, "train.tsv")):
        pytest.skip("../shared/data/goemotions is not present")
    dd = load_mlc_dataset("goemotions", data_dir=src, splits=("train", "validation"))
    rng = np.random.default_rng(0)
    train = dd["train"].select(np.sort(rng.choice(len(dd["train"]), 1200, replace=False)))
    dev = dd["validation"].select(np.sort(rng.choice(len(dd["validation"]), 400, replace=False)))
    num_labels = 28
    train_st = to_sentence_transformers_dataset(train, label_format="ids")
    dev_ids = torch.tensor(to_sentence_transformers_dataset(dev, label_format="ids")["label"])
    dev_y = np.asarray(to_sentence_transformers_dataset(dev, label_format="multi_hot")["label"], dtype=bool)
    train_y = np.asarray(
        to_sentence_transformers_dataset(train, label_format="multi_hot")["label"], dtype=bool
    )

    torch.manual_seed(0)
    model = SentenceTransformer(minilm_path, device="cpu")
    model.max_seq_length = 48
    loss = MultiLabelContrastiveLoss(model, "sd", num_labels=num_labels)

    def dev_loss() -> float:
        model.eval()
        with torch.no_grad():
            feats = model.preprocess(list(dev["text"]))
            emb = model(feats)["sentence_embedding"]
            return loss.compute_loss(emb, dev_ids).item()

    loss_before = dev_loss()
    before = _probe_f1(_embed(model, list(train["text"])), train_y, _embed(model, list(dev["text"])), dev_y)
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=48,
        num_train_epochs=1,
        learning_rate=5e-5,
        warmup_steps=0.1,
        report_to="none",
        save_strategy="no",
        logging_steps=5,
        use_cpu=True,
        seed=0,
        dataloader_drop_last=True,
        disable_tqdm=True,
    )
    SentenceTransformerTrainer(model=model, args=args, train_dataset=train_st, loss=loss).train()
    loss_after = dev_loss()
    after = _probe_f1(_embed(model, list(train["text"])), train_y, _embed(model, list(dev["text"])), dev_y)
    print(
        f"\nST+SD on GoEmotions (1200 train / 400 dev): dev loss {loss_before:.4f} -> {loss_after:.4f}; "
        f"probe dev micro-F1 {before[0]:.4f} -> {after[0]:.4f}, macro-F1 {before[1]:.4f} -> {after[1]:.4f}"
    )
    assert loss_after < loss_before
    assert after[0] > before[0] and after[1] > before[1]


class _Embedder(torch.nn.Module):
    """A SentenceTransformer as ContrastiveTrainer's encoder (its forward returns ``embeddings``)."""

    def __init__(self, st):
        super().__init__()
        self.st = st

    def forward(self, input_ids, attention_mask, token_type_ids=None, **_):
        features = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            features["token_type_ids"] = token_type_ids
        return {"embeddings": self.st(features)["sentence_embedding"]}


def _no_dropout_st(folder):
    word = Transformer(str(folder), max_seq_length=32)
    model = SentenceTransformer(modules=[word, Pooling(word.get_embedding_dimension(), "mean")], device="cpu")
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


@pytest.mark.parametrize(
    "loss,contrast_set,momentum,cached",
    [
        ("mulsupcon", None, 0.5, False),  # the paper's "keys" set, warm-up: the queue joins once filled
        ("sd", "queries+queue", 0.5, True),  # GradCache: keys one mini-batch at a time
        ("mulsupcon", None, None, False),  # no key encoder: the embeddings without gradient
    ],
)
def test_queue_trains_as_contrastive_trainer(
    tmp_path, bert_tokenizer, tiny_bert_config, loss, contrast_set, momentum, cached
):
    """Six SentenceTransformerTrainer steps with a queue of 16 (batch 8: the whole split, so both trainers see
    the same texts every step) equal ContrastiveTrainer's six steps with the same queue, contrast set and
    momentum (momentum=None is ContrastiveTrainer's momentum 0 without dropout): the same loss at every step,
    the same queue, the same weights. A batch-mode run differs, so the queue is what is compared."""
    import copy

    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    from hf_mlcl.training import ContrastiveTrainer, ContrastiveTrainingArguments

    torch.manual_seed(0)
    from transformers import BertModel

    BertModel(tiny_bert_config).save_pretrained(tmp_path / "bert")
    bert_tokenizer.save_pretrained(tmp_path / "bert")
    split = _split(8, seed=4)
    common = dict(
        per_device_train_batch_size=8,
        max_steps=6,
        learning_rate=0.5,
        optim="sgd",
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        max_grad_norm=0.0,
    )

    def st_run(queue_size):
        model = _no_dropout_st(tmp_path / "bert")
        start = copy.deepcopy(model)
        cls = CachedMultiLabelContrastiveLoss if cached else MultiLabelContrastiveLoss
        extra = {"mini_batch_size": 3} if cached else {}
        st_loss = cls(
            model,
            loss,
            num_labels=len(NAMES),
            queue_size=queue_size,
            contrast_set=contrast_set if queue_size else None,
            momentum=momentum,
            **extra,
        )
        args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path / f"st{queue_size}"), **common)
        trainer = SentenceTransformerTrainer(
            model=model, args=args, loss=st_loss, train_dataset=to_sentence_transformers_dataset(split)
        )
        trainer.train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        return start, model, st_loss, losses

    start, st_model, st_loss, st_losses = st_run(16)
    ref_model = _Embedder(start)
    ref_args = ContrastiveTrainingArguments(
        output_dir=str(tmp_path / "ref"),
        loss=loss,
        queue_size=16,
        contrast_set=contrast_set,
        momentum=0.0 if momentum is None else momentum,
        dataloader_num_workers=0,
        **common,
    )
    from hf_mlcl.training import EmbeddingQueue

    ref = ContrastiveTrainer(
        model=ref_model,
        args=ref_args,
        train_dataset=split,
        processing_class=bert_tokenizer,
        num_labels=len(NAMES),
        queue=EmbeddingQueue(16, 32, len(NAMES)),  # the embedder has no config naming its width
    )
    ref.train()
    ref_losses = [h["loss"] for h in ref.state.log_history if "loss" in h]

    assert len(st_losses) == len(ref_losses) == 6
    assert st_losses == pytest.approx(ref_losses, rel=1e-4)
    _, _, _, batch_losses = st_run(0)
    assert abs(batch_losses[-1] - st_losses[-1]) > 1e-3  # the queue changed the training
    assert len(st_loss.queue) == 16
    torch.testing.assert_close(st_loss.queue.embeddings, ref.queue.embeddings, rtol=1e-4, atol=1e-5)
    assert torch.equal(st_loss.queue.labels, ref.queue.labels)
    if momentum is not None:
        assert ref.momentum_encoder is not None and st_loss.key_encoder is not None
    for (name, p), q in zip(st_model.named_parameters(), ref_model.st.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)


def test_a_queue_with_a_momentum_encoder_refuses_a_sharded_model(tiny_st):
    """A key encoder copied from ZeRO-3-partitioned parameters would hold this process's shard only: the first
    training batch stops with the fix named, before any key is computed."""
    ds = _split(6)
    labels = torch.tensor(to_sentence_transformers_dataset(ds)["label"])
    loss = MultiLabelContrastiveLoss(tiny_st, "mulsupcon", num_labels=len(NAMES), queue_size=8)
    next(tiny_st.parameters()).ds_id = 0  # what DeepSpeed ZeRO-3 marks a partitioned parameter with
    with pytest.raises(ValueError, match="cannot copy a model sharded by zero3; pass momentum=None"):
        loss(_features(tiny_st, list(ds["text"])), labels)
    plain = MultiLabelContrastiveLoss(
        tiny_st, "mulsupcon", num_labels=len(NAMES), queue_size=8, momentum=None
    )
    assert plain(_features(tiny_st, list(ds["text"])), labels).isfinite()
