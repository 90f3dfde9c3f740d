"""The joint objective, (1 - w) * supervised + w * contrastive: equal to a hand-written training loop step for
step, GradCache and a queue in it, evaluation of every row, and its one-line errors."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _training_helpers import (
    LABELS,
    base_args,
    collator,
    max_rel_diff,
    tiny_encoder,
    tiny_split,
    tiny_tokenizer,
)

from hf_mlcl.modeling import MLCLForMultiLabelClassification
from hf_mlcl.training import JointTrainer, JointTrainingArguments

TEMPERATURE = 0.1


def _classifier(
    tok, dropout: float = 0.0, seed: int = 0, pooling: str = "mean"
) -> MLCLForMultiLabelClassification:
    """A tiny classifier; mean pooling keeps the rows' pooled states apart, so the contrastive term and its
    gradient are far from degenerate."""
    encoder = tiny_encoder(tok, dropout=dropout, seed=seed, pooling=pooling)
    torch.manual_seed(seed + 1)
    return MLCLForMultiLabelClassification.from_encoder(encoder, id2label=LABELS, freeze_encoder=False)


def _args(tmp_path, **kw) -> JointTrainingArguments:
    defaults = dict(per_device_eval_batch_size=3, max_steps=3, lr_scheduler_type="constant", loss="any")
    defaults.update(temperature=TEMPERATURE, contrastive_weight=0.3)
    return base_args(tmp_path, JointTrainingArguments, **{**defaults, **kw})


def _supcon_any(emb: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """SupCon (Khosla et al. eq. 2) with the multi-label ANY rule: positives share a label, written out."""
    z = F.normalize(emb, dim=-1)
    sim = z @ z.T / TEMPERATURE
    eye = torch.eye(len(z), dtype=torch.bool)
    logp = sim - torch.logsumexp(sim.masked_fill(eye, float("-inf")), dim=1, keepdim=True)
    pos = ((labels @ labels.T) > 0) & ~eye
    count = pos.sum(1)
    per_anchor = -(logp * pos).sum(1) / count.clamp_min(1)
    has = count > 0
    return per_anchor[has].mean()


def _weights(model) -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in model.named_parameters()}


def _recorded_losses(trainer) -> list[float]:
    seen: list[float] = []
    record = trainer._record_components

    def keep(parts):
        seen.append(float(parts["loss"].detach()))
        record(parts)

    trainer._record_components = keep
    return seen


def _written_out_losses(reference, tok, ds, w, supervised_fn, head=None, max_grad_norm=0.0, norms=None):
    """Three steps of ``(1 - w) * supervised + w * SupCon(ANY)`` on ``reference``, batches of 4 rows in order,
    AdamW as the trainer builds it (the contrastive term through ``head`` when given, trained with the model);
    ``max_grad_norm > 0`` clips the model and the head, each by its own norm (the head's norms appended to
    ``norms``)."""
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3, weight_decay=0.0, eps=1e-8)
    if head is not None:
        optimizer.add_param_group({"params": list(head.parameters()), "weight_decay": 0.0})
    rows = [ds[i] for i in range(len(ds))]
    expected = []
    for step in range(3):
        batch = collator(tok)(rows[4 * step : 4 * step + 4])
        labels = batch.pop("labels").to_dense().to(next(reference.parameters()).dtype)
        out = reference(**batch)
        embeddings = out.embeddings if head is None else head(out.embeddings)
        loss = (1 - w) * supervised_fn(out.logits, labels) + w * _supcon_any(embeddings, labels)
        optimizer.zero_grad()
        loss.backward()
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(reference.parameters(), max_grad_norm)
            if head is not None and norms is not None:
                norms.append(float(torch.nn.utils.clip_grad_norm_(head.parameters(), max_grad_norm)))
        optimizer.step()
        expected.append(float(loss.detach()))
    return expected


def _focal(logits: torch.Tensor, y: torch.Tensor, gamma: float = 1.5) -> torch.Tensor:
    """Lin et al. 2017's focal loss per label entry, written out, averaged over the N x L entries."""
    p = torch.sigmoid(logits)
    return -(y * (1 - p) ** gamma * torch.log(p) + (1 - y) * p**gamma * torch.log(1 - p)).mean()


def _asymmetric(
    logits: torch.Tensor, y: torch.Tensor, gamma_neg: float = 2.0, clip: float = 0.1
) -> torch.Tensor:
    """Ridnik et al.'s asymmetric loss (gamma+ 0) per entry, negatives on p_m = max(p - clip, 0), mean over N x L."""
    p = torch.sigmoid(logits)
    p_m = (p - clip).clamp_min(0)
    return -(y * torch.log(p) + (1 - y) * p_m**gamma_neg * torch.log(1 - p_m)).mean()


def _zlpr(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """ZLPR (Su et al. 2022) per sample, log(1 + sum_neg e^s) + log(1 + sum_pos e^-s), averaged over samples."""
    neg = torch.log(1 + (torch.exp(logits) * (1 - y)).sum(1))
    pos = torch.log(1 + (torch.exp(-logits) * y).sum(1))
    return (neg + pos).mean()


SUPERVISED = {
    "bce": ({}, F.binary_cross_entropy_with_logits),
    "focal": ({"supervised_loss_kwargs": {"gamma": 1.5}}, _focal),
    "zlpr": ({}, _zlpr),
    "asymmetric": ({"supervised_loss_kwargs": {"gamma_neg": 2.0, "clip": 0.1}}, _asymmetric),
}


@pytest.mark.parametrize("supervised", list(SUPERVISED))
def test_joint_trainer_equals_a_hand_written_supervised_plus_supcon_loop(tmp_path, supervised):
    """Each supervised loss (its keywords passed on) joins the contrastive term as in a loop written out. In
    float64, which the joint loss keeps: AdamW divides a near-zero gradient by its own root mean square, so in
    float32 rounding, which differs between CPUs' kernels, moved a weight by 1.4e-5 after three steps."""
    kw, supervised_fn = SUPERVISED[supervised]
    tok = tiny_tokenizer()
    ds = tiny_split(12)
    w = 0.3
    model = _classifier(tok).double()
    reference = copy.deepcopy(model)
    args = _args(tmp_path, supervised_loss=supervised, **kw)
    trainer = JointTrainer(model=model, args=args, train_dataset=ds, data_collator=collator(tok))
    seen = _recorded_losses(trainer)
    trainer.train()

    expected = _written_out_losses(reference, tok, ds, w, supervised_fn)
    np.testing.assert_allclose(seen, expected, rtol=1e-10)
    assert max_rel_diff(_weights(model), _weights(reference)) < 1e-10


def test_a_projection_head_feeds_the_contrastive_term_and_is_left_out_of_the_classifier(tmp_path):
    """contrastive_projection_dim: Khosla et al.'s two-layer head maps the pooled representation for the
    contrastive term only; it trains as in a loop written out, is checkpointed, and the classifier has none."""
    tok = tiny_tokenizer()
    ds = tiny_split(12)
    w = 0.3
    model = _classifier(tok)
    reference = copy.deepcopy(model)
    args = _args(tmp_path, contrastive_projection_dim=8)
    trainer = JointTrainer(model=model, args=args, train_dataset=ds, data_collator=collator(tok))
    again = JointTrainer(model=_classifier(tok), args=args, train_dataset=ds, data_collator=collator(tok))
    # seeded from args.seed with its own generator: every process starts from the same head
    assert max_rel_diff(_weights(again.projection), _weights(trainer.projection)) == 0
    from hf_mlcl.training.joint import _seeded_projection

    state = torch.random.get_rng_state()
    built = _seeded_projection(32, 8, seed=args.seed)
    assert torch.equal(torch.random.get_rng_state(), state)  # nothing drawn from the global generator
    assert max_rel_diff(_weights(built), _weights(trainer.projection)) == 0
    bound = 32**-0.5  # nn.Linear's default range
    assert 0.9 * bound < built.dense.weight.abs().max() <= bound
    head = copy.deepcopy(trainer.projection)
    seen = _recorded_losses(trainer)
    trainer.train()

    expected = _written_out_losses(reference, tok, ds, w, F.binary_cross_entropy_with_logits, head=head)
    np.testing.assert_allclose(seen, expected, rtol=1e-5)
    assert max_rel_diff(_weights(model), _weights(reference)) < 1e-5
    assert max_rel_diff(_weights(trainer.projection), _weights(head)) < 1e-5
    assert not any("projection" in name for name in model.state_dict())  # the classifier keeps no head
    assert set(trainer.extra_state_dict()["projection"]) == {
        f"{n}.{k}" for n in ("dense", "out_proj") for k in ("weight", "bias")
    }
    again.load_extra_state_dict(trainer.extra_state_dict())  # what a resume reads from a checkpoint
    assert max_rel_diff(_weights(again.projection), _weights(trainer.projection)) == 0
    with pytest.raises(ValueError, match="projects the batch only"):
        _args(tmp_path, contrastive_projection_dim=8, queue_size=8)


def test_max_grad_norm_clips_the_model_and_the_projection_head_each_by_its_own_norm(tmp_path):
    """The projection head trains beside the model, as a loss's own parameters do: ``max_grad_norm`` clips the
    model's gradients by their norm (Trainer) and the head's by theirs, as in a loop written out."""
    tok = tiny_tokenizer()
    ds = tiny_split(12)
    model = _classifier(tok)
    reference = copy.deepcopy(model)
    args = _args(tmp_path, contrastive_projection_dim=8, max_grad_norm=0.05)
    trainer = JointTrainer(model=model, args=args, train_dataset=ds, data_collator=collator(tok))
    head = copy.deepcopy(trainer.projection)
    trainer.train()

    norms: list[float] = []
    _written_out_losses(reference, tok, ds, 0.3, F.binary_cross_entropy_with_logits, head, 0.05, norms)
    assert min(norms) > 0.05  # every step clips the head too
    assert max_rel_diff(_weights(model), _weights(reference)) < 1e-5
    assert max_rel_diff(_weights(trainer.projection), _weights(head)) < 1e-5


def test_gradcache_and_a_queue_train_the_joint_objective(tmp_path):
    tok = tiny_tokenizer()
    ds = tiny_split(16)
    losses = {}
    for chunk in (0, 2):
        model = _classifier(tok)
        trainer = JointTrainer(
            model=model,
            args=_args(tmp_path / f"gc{chunk}", gradcache_chunk_size=chunk, max_steps=2),
            train_dataset=ds,
            data_collator=collator(tok),
        )
        losses[chunk] = _recorded_losses(trainer)
        trainer.train()
    np.testing.assert_allclose(losses[2], losses[0], rtol=1e-5)
    queued = JointTrainer(
        model=_classifier(tok),
        args=_args(tmp_path / "queue", queue_size=8, loss="mulsupcon", max_steps=4),
        train_dataset=ds,
        data_collator=collator(tok),
    )
    queued.train()
    logs = [h for h in queued.state.log_history if "loss" in h]
    assert len(queued.queue) == 8 and queued.queue.embeddings.shape[1] == 32  # the pooled width
    assert all({"loss_supervised", "loss_contrastive"} <= set(h) for h in logs)


def test_at_w_1_the_joint_objective_is_stage_1_with_its_queue_and_momentum_encoder(tmp_path):
    """w = 1 leaves the contrastive term alone: JointTrainer with a queue (momentum keys, the loss paper's
    contrast set) trains the classifier exactly as ContrastiveTrainer trains it on its pooled embeddings."""
    from hf_mlcl.training import ContrastiveTrainer, ContrastiveTrainingArguments, EmbeddingQueue

    tok = tiny_tokenizer()
    ds = tiny_split(16)
    joint_model = _classifier(tok)
    stage1_model = copy.deepcopy(joint_model)
    common = dict(
        max_steps=4, lr_scheduler_type="constant", loss="mulsupcon", temperature=TEMPERATURE, queue_size=8
    )
    joint = JointTrainer(
        model=joint_model,
        args=base_args(tmp_path / "joint", JointTrainingArguments, contrastive_weight=1.0, **common),
        train_dataset=ds,
        data_collator=collator(tok),
    )
    stage1 = ContrastiveTrainer(
        model=stage1_model,
        args=base_args(tmp_path / "stage1", ContrastiveTrainingArguments, knn_k=0, **common),
        train_dataset=ds,
        data_collator=collator(tok),
        queue=EmbeddingQueue(8, 32, len(LABELS)),  # the pooled width
    )
    joint.train()
    stage1.train()
    losses = [[h["loss"] for h in t.state.log_history if "loss" in h] for t in (joint, stage1)]
    assert len(losses[0]) == 4 and losses[0] == losses[1]  # the queue joins from step 2
    assert max_rel_diff(_weights(joint_model), _weights(stage1_model)) == 0
    assert torch.equal(joint.queue.embeddings, stage1.queue.embeddings)


def test_evaluation_scores_every_row_and_tunes_the_threshold(tmp_path):
    tok = tiny_tokenizer()
    train, validation = tiny_split(8), tiny_split(10, seed=1)  # 10 rows: eval batches of 3 leave 1
    trainer = JointTrainer(
        model=_classifier(tok),
        args=_args(tmp_path, max_steps=1),
        train_dataset=train,
        eval_dataset=validation,
        data_collator=collator(tok),
    )
    trainer.train()
    metrics = trainer.evaluate()
    assert "eval_micro_f1" in metrics and "eval_loss" in metrics
    scores, truth = trainer.predict_scores(validation)
    assert scores.shape == truth.shape == (10, len(LABELS))
    assert 0.0 < trainer.tune_threshold(scores, truth) < 1.0


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(contrastive_weight=1.5), "contrastive_weight must lie in"),
        (dict(n_views=2), "n_views must be 1"),
        (dict(supervised_loss="sd"), "'sd' is a contrastive loss; the joint objective trains its head"),
        (dict(supervised_loss="bcee"), "unknown supervised_loss 'bcee'"),
        (dict(loss="bce"), r"loss 'bce' is a supervised loss .* head loss is supervised_loss \(loss names"),
        (dict(threshold="often"), "threshold must be"),
        (
            dict(supervised_loss_kwargs={"reduction": "none"}),
            r"supervised_loss BCELoss has reduction='none' .* use reduction 'mean' or 'sum'",
        ),
    ],
)
def test_arguments_stop_in_one_line(tmp_path, kw, message):
    """Each wrong argument stops at construction, before any model loads, in one line naming its field."""
    with pytest.raises(ValueError, match=message) as err:
        _args(tmp_path, **kw)
    assert "\n" not in str(err.value)


def test_the_loss_func_and_the_contrastive_stage_name_where_a_wrong_kind_of_loss_belongs(tmp_path):
    from hf_mlcl.integrations.trainer import JointLossFunc
    from hf_mlcl.training import ContrastiveTrainingArguments

    with pytest.raises(ValueError, match=r"head loss is supervised_loss \(loss names the contrastive term\)"):
        JointLossFunc("bce")
    with pytest.raises(ValueError, match="unknown supervised_loss 'nope'"):
        JointLossFunc("jaccard", supervised_loss="nope")
    with pytest.raises(ValueError, match="reduction='none' .* training backpropagates one number"):
        JointLossFunc("jaccard", supervised_loss_kwargs={"reduction": "none"})  # an (N, L) loss: no backward
    with pytest.raises(ValueError, match="use ProbingTrainer / train_probe for bce"):
        ContrastiveTrainingArguments(str(tmp_path), use_cpu=True, loss="bce")


def test_output_dir_stays_the_first_positional_argument(tmp_path):
    from hf_mlcl.training import ContrastiveTrainingArguments, ProbingTrainingArguments

    for cls in (ContrastiveTrainingArguments, ProbingTrainingArguments, JointTrainingArguments):
        assert cls(str(tmp_path / cls.__name__), use_cpu=True).output_dir == str(tmp_path / cls.__name__)


def test_a_frozen_encoder_or_a_supervised_contrastive_loss_is_refused(tmp_path):
    tok = tiny_tokenizer()
    frozen = MLCLForMultiLabelClassification.from_encoder(tiny_encoder(tok), id2label=LABELS)
    with pytest.raises(ValueError, match="freeze_encoder=False"):
        JointTrainer(
            model=frozen, args=_args(tmp_path), train_dataset=tiny_split(8), data_collator=collator(tok)
        )
    from hf_mlcl.losses import get_loss

    with pytest.raises(ValueError, match="is a contrastive loss"):
        JointTrainer(
            model=_classifier(tok),
            args=_args(tmp_path),
            train_dataset=tiny_split(8),
            data_collator=collator(tok),
            supervised_loss_fn=get_loss("sd"),
        )


@pytest.mark.parametrize("accumulation", [1, 2])
def test_a_plain_trainer_with_joint_loss_func_trains_as_joint_trainer(tmp_path, accumulation):
    from transformers import Trainer, TrainingArguments

    from hf_mlcl.integrations.trainer import JointLossFunc

    tok, ds = tiny_tokenizer(), tiny_split(24)
    kw = dict(max_steps=3, gradient_accumulation_steps=accumulation, per_device_train_batch_size=4)
    ref = JointTrainer(
        model=_classifier(tok),
        args=_args(tmp_path / "ref", **kw),
        train_dataset=ds,
        data_collator=collator(tok),
    )
    ref_out = ref.train()
    plain_args = TrainingArguments(
        output_dir=str(tmp_path / "plain"),
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        train_sampling_strategy="sequential",
        seed=0,
        dataloader_drop_last=True,
        **kw,
    )
    model = _classifier(tok)
    loss = JointLossFunc("any", contrastive_weight=0.3, temperature=TEMPERATURE, num_labels=len(LABELS))
    plain = Trainer(
        model=model, args=plain_args, train_dataset=ds, data_collator=collator(tok), compute_loss_func=loss
    )
    out = plain.train()
    assert out.training_loss == pytest.approx(ref_out.training_loss, rel=1e-5)
    assert max_rel_diff(_weights(model), _weights(ref.model)) < 1e-5
    with pytest.raises(ValueError, match="contrastive_weight must lie"):
        JointLossFunc("any", contrastive_weight=-0.1)
