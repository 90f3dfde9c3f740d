"""ContrastiveTrainer: steps, learning, exact resume, accumulation semantics, eval probe, bad configs."""

from __future__ import annotations

import math
import os
import shutil

import pytest
import torch
from _training_helpers import (
    GradCapture,
    base_args,
    collator,
    max_rel_diff,
    tiny_encoder,
    tiny_split,
    tiny_tokenizer,
)

from hf_mlcl.evaluation.knn import knn_probe_metrics
from hf_mlcl.training import ContrastiveTrainer, ContrastiveTrainingArguments
from hf_mlcl.training.state_file import STATE_FILE


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _losses(trainer) -> dict[int, float]:
    return {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}


def test_two_views_steps_log_components_and_eval_probe(tmp_path, tok):
    ds = tiny_split(32)
    args = base_args(
        tmp_path,
        loss="hbl",
        loss_kwargs={"base": "sd", "k_min": 2},
        n_views=2,
        max_steps=3,
        eval_strategy="steps",
        eval_steps=3,
        metric_for_best_model="knn_micro_f1",
        knn_k=3,
    )
    tr = ContrastiveTrainer(
        model=tiny_encoder(tok, 0.1),
        args=args,
        train_dataset=ds,
        eval_dataset=tiny_split(16, 1),
        data_collator=collator(tok, n_views=2),
    )
    tr.train()
    logs = [h for h in tr.state.log_history if "loss" in h]
    assert len(logs) == 3 and all(math.isfinite(h["loss"]) for h in logs)
    assert {"loss_base", "loss_hbl"} <= set(logs[0])  # hbl components are logged
    ev = [h for h in tr.state.log_history if "eval_loss" in h][0]
    for key in ("eval_knn_micro_f1", "eval_knn_macro_f1", "eval_knn_p@1"):
        assert 0.0 <= ev[key] <= 1.0
    assert tr.state.best_metric == ev["eval_knn_micro_f1"]


def test_loss_falls_on_learnable_set(tmp_path, tok):
    ds = tiny_split(16)
    args = base_args(
        tmp_path, loss="sd", per_device_train_batch_size=16, max_steps=20, learning_rate=3e-3, knn_k=3
    )
    tr = ContrastiveTrainer(model=tiny_encoder(tok), args=args, train_dataset=ds, data_collator=collator(tok))
    before = tr.evaluate(tiny_split(32, seed=7))
    tr.train()
    losses = list(_losses(tr).values())
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses
    after = tr.evaluate(tiny_split(32, seed=7))  # held-out texts (other word draws)
    assert after["eval_loss"] < before["eval_loss"]
    assert after["eval_knn_micro_f1"] > 0.5


def test_resume_gives_identical_next_step_with_queue_and_prototypes(tmp_path, tok):
    """msc (learnable prototypes in the optimizer) + MoCo queue + dropout: checkpoint-2 -> step 3 identical."""
    ds = tiny_split(32)
    kw = dict(
        loss="msc",
        queue_size=12,
        momentum=0.9,
        max_steps=3,
        save_strategy="steps",
        save_steps=2,
        train_sampling_strategy="random",
        knn_k=0,
    )
    full = ContrastiveTrainer(
        model=tiny_encoder(tok, 0.1),
        args=base_args(tmp_path / "a", **kw),
        train_dataset=ds,
        data_collator=collator(tok),
    )
    full.train()
    ref = _losses(full)
    assert len(full.queue) == 12 and os.path.isfile(tmp_path / "a" / "checkpoint-2" / STATE_FILE)

    def resumed_step3(ckpt, seed):
        tr = ContrastiveTrainer(
            model=tiny_encoder(tok, 0.1, seed=seed),
            args=base_args(tmp_path / "b", **kw),
            train_dataset=ds,
            data_collator=collator(tok),
        )
        tr.train(resume_from_checkpoint=str(ckpt))
        return tr, _losses(tr)[3]

    tr, loss3 = resumed_step3(
        tmp_path / "a" / "checkpoint-2", seed=5
    )  # other init: weights come from the ckpt
    assert loss3 == pytest.approx(ref[3], rel=1e-6, abs=1e-7)
    assert torch.allclose(tr.queue.embeddings, full.queue.embeddings, atol=1e-6)
    assert torch.allclose(tr.loss_fn.prototypes, full.loss_fn.prototypes, atol=1e-6)

    # the extra state matters: without it (fresh queue / prototypes / key encoder) step 3 differs
    crippled = tmp_path / "crippled"
    shutil.copytree(tmp_path / "a" / "checkpoint-2", crippled)
    os.remove(crippled / STATE_FILE)
    _, loss3_fresh = resumed_step3(crippled, seed=5)
    assert abs(loss3_fresh - ref[3]) > 1e-4


def test_gradient_accumulation_is_mean_of_micro_batch_gradients(tmp_path, tok):
    """GA 2 x batch 4: the step uses (g(rows 0-3) + g(rows 4-7)) / 2 -- in-batch candidates per micro-batch --
    which is NOT the gradient of the batch-8 loss."""
    ds = tiny_split(8)
    coll = collator(tok)

    def run(bs, ga):
        model = tiny_encoder(tok)
        cap = GradCapture(model)
        args = base_args(
            tmp_path / f"{bs}x{ga}",
            loss="sd",
            per_device_train_batch_size=bs,
            gradient_accumulation_steps=ga,
            knn_k=0,
        )
        tr = ContrastiveTrainer(model=model, args=args, train_dataset=ds, data_collator=coll, callbacks=[cap])
        tr.train()
        return tr, cap.grads[0], _losses(tr)[1]

    tr, acc_grad, acc_loss = run(4, 2)
    _, big_grad, big_loss = run(8, 1)

    model = tiny_encoder(tok)  # same init, manual reference
    model.train()
    micro = [coll([dict(r) for r in ds.select(range(i, i + 4))]) for i in (0, 4)]
    losses = [tr.compute_loss(model, b) for b in micro]
    (sum(losses) / 2).backward()
    ref = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert max_rel_diff(acc_grad, ref) < 1e-5
    assert acc_loss == pytest.approx(float(sum(losses).detach() / 2), rel=1e-5)
    assert max_rel_diff(acc_grad, big_grad) > 1e-2  # documented: not the batch-8 gradient
    assert abs(acc_loss - big_loss) > 1e-3


def test_label_statistics_are_set_for_ws_mulsupcon(tmp_path, tok):
    ds = tiny_split(16)
    tr = ContrastiveTrainer(
        model=tiny_encoder(tok),
        args=base_args(tmp_path, loss="ws_mulsupcon", knn_k=0),
        train_dataset=ds,
        data_collator=collator(tok),
    )
    assert tr.loss_fn.requires_label_statistics
    tr.train()
    assert math.isfinite(_losses(tr)[1])


def test_knn_probe_metrics_perfect_clusters():
    z = torch.tensor([[1.0, 0.0], [0.99, 0.1], [0.0, 1.0], [0.1, 0.99]])
    y = torch.tensor([[1, 0], [1, 0], [0, 1], [0, 1]])
    m = knn_probe_metrics(z, y, k=1)
    assert m == {"knn_micro_f1": 1.0, "knn_macro_f1": 1.0, "knn_p@1": 1.0}


def test_knn_p_at_1_shares_ties_and_ignores_the_label_order():
    """kNN scores are multiples of 1/k, so labels tie at the top: each counts with its share (the library's
    P@1), and reversing the label columns changes nothing. Tensors in bf16 or with grad are accepted."""
    torch.manual_seed(0)
    z = torch.randn(40, 8)
    y = (torch.rand(40, 6) < 0.4).int()
    m = knn_probe_metrics(z, y, k=4)
    assert knn_probe_metrics(z, y.flip(1), k=4) == pytest.approx(m, abs=1e-12)  # the mean's order only
    zn = torch.nn.functional.normalize(z, dim=-1)
    sim = zn @ zn.T
    sim.fill_diagonal_(float("-inf"))
    scores = y[sim.topk(4, dim=1).indices].float().mean(dim=1)
    top = scores == scores.max(dim=1, keepdim=True).values
    want = sum((top[i] & (y[i] > 0)).sum().item() / top[i].sum().item() for i in range(40)) / 40
    assert m["knn_p@1"] == pytest.approx(want, abs=1e-12)
    assert knn_probe_metrics(z.bfloat16(), y, k=4)["knn_p@1"] == pytest.approx(want, abs=0.1)
    assert knn_probe_metrics(z.requires_grad_(), y, k=4) == m


# ----------------------------------------------------------------------------------- bad configurations
def test_bad_configurations_fail_at_construction(tmp_path, tok):
    ds = tiny_split(8)
    enc = tiny_encoder(tok)

    def make(args, dataset=ds, **kw):
        return ContrastiveTrainer(
            model=enc, args=args, train_dataset=dataset, data_collator=kw.pop("coll", collator(tok)), **kw
        )

    with pytest.raises(ValueError, match="unknown loss 'nope'"):
        make(base_args(tmp_path, loss="nope"))
    with pytest.raises(ValueError, match="supervised loss"):
        make(base_args(tmp_path, loss="bce"))
    no_keys = type("NoKeys", (torch.nn.Module,), {"is_contrastive": True, "supports_keys": False})()
    with pytest.raises(ValueError, match="supports_keys=False"):
        make(base_args(tmp_path, queue_size=8), loss_fn=no_keys)
    with pytest.raises(ValueError, match="n_views must be 1 or 2"):
        ContrastiveTrainingArguments(output_dir=str(tmp_path), n_views=3)
    args = base_args(tmp_path)
    args.n_views = 3  # mutated after construction: the trainer re-checks
    with pytest.raises(ValueError, match="n_views must be 1 or 2"):
        make(args)
    with pytest.raises(ValueError, match="collator makes n_views=2"):
        make(base_args(tmp_path), coll=collator(tok, n_views=2))
    with pytest.raises(ValueError, match="no 'labels' column"):
        make(base_args(tmp_path), dataset=ds.remove_columns("labels"))
    with pytest.raises(ValueError, match="label-count mismatch"):
        make(base_args(tmp_path), num_labels=5)
    enc.config.id2label = {i: f"l{i}" for i in range(6)}
    with pytest.raises(ValueError, match="model.config.num_labels"):
        make(base_args(tmp_path))
    enc.config.id2label = {i: f"l{i}" for i in range(4)}
    from hf_mlcl.losses import get_loss

    with pytest.raises(ValueError, match="label-count mismatch"):
        make(base_args(tmp_path, loss="msc"), loss_fn=get_loss("msc", num_labels=7, embedding_dim=16))


def test_two_view_moco_keys_come_from_view_two_and_hbl_wraps_msc(tmp_path, tok):
    """n_views=2 + queue: the online encoder sees view 1 (B anchors), the key encoder view 2 (B keys per step);
    hbl(base=msc) receives num_labels / embedding_dim through its signature; prototypes are optimised."""
    ds = tiny_split(16)
    args = base_args(
        tmp_path,
        loss="hbl",
        loss_kwargs={"base": "msc", "k_min": 2},
        n_views=2,
        queue_size=32,
        max_steps=3,
        knn_k=0,
    )
    tr = ContrastiveTrainer(
        model=tiny_encoder(tok, 0.1), args=args, train_dataset=ds, data_collator=collator(tok, 2)
    )
    seen = []
    orig = tr._encode
    tr._encode = lambda m, b, orig=orig: seen.append(b["input_ids"].shape[0]) or orig(m, b)
    protos = tr.loss_fn.base.prototypes.detach().clone()
    assert any(
        p is tr.loss_fn.base.prototypes for g in tr.create_optimizer().param_groups for p in g["params"]
    )
    tr.train()
    assert seen == [4, 4, 4] and len(tr.queue) == 12
    assert not torch.equal(protos, tr.loss_fn.base.prototypes)
    assert all(h["queue_fill"] in (4.0, 8.0, 12.0) for h in tr.state.log_history if "queue_fill" in h)


@pytest.mark.parametrize(
    "loss, kw, want",
    [
        # keys, warm-up: the queue (8) joins at step 3, once filled by steps 1-2; anchors are not candidates
        ("mulsupcon", {}, [(4, False), (4, False), (12, False)]),
        # queries+queue, no warm-up: no keys at step 1, then the queue of the previous batches
        ("msc", {}, [(None, True), (4, True), (8, True)]),
        ("sd", {"contrast_set": "queries+keys", "queue_warmup": False}, [(4, True), (8, True), (12, True)]),
    ],
)
def test_moco_contrast_set_per_loss(tmp_path, tok, loss, kw, want):
    """What the trainer hands the loss in MoCo mode: each loss's paper contrast set and queue warm-up."""
    args = base_args(tmp_path, loss=loss, queue_size=8, max_steps=3, knn_k=0, **kw)
    tr = ContrastiveTrainer(
        model=tiny_encoder(tok), args=args, train_dataset=tiny_split(16), data_collator=collator(tok)
    )
    seen = []
    components = tr.loss_fn.components  # what the trainer calls: the loss and its parts

    def spy(z, y, keys=None, key_labels=None, anchors_in_candidates=True):
        seen.append((None if keys is None else keys.shape[0], anchors_in_candidates))
        return components(z, y, keys, key_labels, anchors_in_candidates=anchors_in_candidates)

    tr.loss_fn.components = spy
    tr.train()
    assert seen == want
    assert all(math.isfinite(v) for v in _losses(tr).values())


def test_hbl_gate_warning_and_contrast_set_errors(tmp_path, tok):
    ds = tiny_split(8)

    def make(**kw):
        return ContrastiveTrainer(
            model=tiny_encoder(tok),
            args=base_args(tmp_path, knn_k=0, **kw),
            train_dataset=ds,
            data_collator=collator(tok),
        )

    with pytest.warns(UserWarning, match="k_min=128 but an anchor has at most 3 candidates"):
        make(loss="hbl")
    with pytest.warns(UserWarning, match="at most 68 candidates"):  # keys: 4 current keys + queue 64
        make(loss="hbl", queue_size=64)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        make(loss="hbl", loss_kwargs={"k_min": 3})  # 3 in-batch candidates can reach k_min = 3
        make(loss="hbl", queue_size=124)  # 4 + 124 = 128
    with pytest.raises(ValueError, match="needs queue_size > 0"):
        base_args(tmp_path, contrast_set="keys")


def test_hbl_gate_warning_counts_other_processes_only_when_they_are_gathered():
    """Two processes of 4 rows: 7 in-batch candidates when gathered, 3 when each process keeps its own rows
    (the momentum keys of a queue come from both either way: tests/losses, max_candidates)."""
    import warnings
    from types import SimpleNamespace

    from hf_mlcl.losses import get_loss
    from hf_mlcl.training.contrastive_setup import warn_if_gate_cannot_open

    loss = get_loss("hbl", k_min=5)
    args = SimpleNamespace(
        world_size=2, per_device_train_batch_size=4, n_views=1, queue_size=0, gather_across_devices=True
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warn_if_gate_cannot_open(loss, args, None)
    args.gather_across_devices = False
    with pytest.warns(UserWarning, match="k_min=5 but an anchor has at most 3 candidates"):
        warn_if_gate_cannot_open(loss, args, None)


def test_flops_estimate_is_trainers_with_the_parameter_count_taken_once(tmp_path, tok, monkeypatch):
    """Trainer calls floating_point_ops at every step; the base trainer gives Trainer's number (6 x tokens x
    non-embedding parameters) but counts the parameters once, not by walking the model each step."""
    from transformers import Trainer

    args = base_args(tmp_path, max_steps=2)
    trainer = ContrastiveTrainer(
        model=tiny_encoder(tok),
        args=args,
        train_dataset=tiny_split(16),
        data_collator=collator(tok, n_views=args.n_views),
    )
    counted = []
    real = trainer.model.num_parameters
    monkeypatch.setattr(trainer.model, "num_parameters", lambda **kw: counted.append(kw) or real(**kw))
    batch = {"input_ids": torch.ones(4, 7, dtype=torch.long), "labels": torch.zeros(4, 3)}
    want = Trainer.floating_point_ops(trainer, batch)
    assert want == 6 * 28 * real(exclude_embeddings=True) > 0
    assert [trainer.floating_point_ops(batch) for _ in range(3)] == [want] * 3
    assert (
        trainer.floating_point_ops({**batch, "input_ids": torch.ones(2, 5, dtype=torch.long)})
        == want * 10 // 28
    )
    assert len(counted) == 2  # Trainer's own call above, then one for every later step
    assert trainer.floating_point_ops({"inputs_embeds": torch.ones(1, 2, 3)}) == 0
    trainer.train()  # total_flos sums the estimate over the steps, as Trainer's does
    assert trainer.state.total_flos > 0 and len(counted) == 2


def test_loss_parameters_own_step_unscales_and_clips_their_gradients(tmp_path, tok):
    """Under a sharding engine the loss parameters step in their own optimizer (:meth:`_step_loss_parameters`),
    their gradients clipped to ``max_grad_norm`` by their own norm. With fp16 their gradients carry the loss
    scale of ``accelerator.backward``: the accelerator's grad scaler unscales them before the clip, so the step
    equals the step on unscaled gradients, and on an inf gradient the step is skipped and the scaler's next
    update backs the scale off."""
    scale = 1024.0

    def prototypes_after_step(
        grad: torch.Tensor, scaler, max_grad_norm=0.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        tr = ContrastiveTrainer(
            model=tiny_encoder(tok),
            args=base_args(tmp_path, loss="msc", optim="sgd", knn_k=0, max_grad_norm=max_grad_norm),
            train_dataset=tiny_split(8),
            data_collator=collator(tok),
        )
        tr.accelerator.scaler = scaler
        protos = tr.loss_fn.prototypes
        before = protos.detach().clone()
        protos.grad = grad.clone()
        tr._step_loss_parameters(0.5)
        return before, protos.detach().clone()

    grad = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))  # 4 labels x width 16
    before, plain = prototypes_after_step(grad, None)
    assert torch.allclose(plain, before - 0.5 * grad, atol=1e-6)  # SGD, no weight decay on loss parameters

    scaler = torch.amp.GradScaler("cpu", init_scale=scale)
    scaler.scale(torch.ones(()))  # the scale of this step's backward (accelerator.backward scales the loss)
    _, scaled = prototypes_after_step(grad * scale, scaler)
    assert torch.allclose(scaled, plain, atol=1e-6)

    scaler = torch.amp.GradScaler("cpu", init_scale=scale)
    scaler.scale(torch.ones(()))
    bad = grad * scale
    bad[0, 0] = float("inf")
    before, skipped = prototypes_after_step(bad, scaler)
    assert torch.equal(skipped, before)  # the step is skipped, the prototypes stay finite
    scaler.update()  # the main optimizer's step updates the scale for both optimizers
    assert scaler.get_scale() == scale * 0.5

    norm = float(grad.norm())
    assert norm > 1.0
    _, clipped = prototypes_after_step(grad, None, max_grad_norm=1.0)
    assert torch.allclose(clipped, before - 0.5 * grad / norm, atol=1e-5)
    scaler = torch.amp.GradScaler("cpu", init_scale=scale)
    scaler.scale(torch.ones(()))
    # the scaled gradients are unscaled, then clipped
    _, clipped_scaled = prototypes_after_step(grad * scale, scaler, max_grad_norm=1.0)
    assert torch.allclose(clipped_scaled, clipped, atol=1e-6)


def test_transformers_label_names_is_refused_naming_the_option_for_the_datas_labels(tmp_path):
    """label_names is transformers' list of the batch's label keys: a user naming their labels with it got an
    accepted option that did nothing; every stage refuses it and names --label_names_file."""
    from hf_mlcl.training.stage_arguments import JointTrainingArguments, ProbingTrainingArguments

    for cls in (ContrastiveTrainingArguments, ProbingTrainingArguments, JointTrainingArguments):
        with pytest.raises(ValueError, match="pass --label_names_file"):
            cls(output_dir=str(tmp_path), label_names=["food"])
        assert cls(output_dir=str(tmp_path), label_names=["labels"]).label_names == ["labels"]
