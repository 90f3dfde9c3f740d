"""A ContrastiveTrainer step that does not log reads no tensor value on the host (on a GPU: no
device-to-host synchronisation) — every registered loss in batch mode, MoCo queues, GradCache, gradient
accumulation — counted by hf_mlcl.host_sync between on_step_begin and on_step_end, the backbone's
forward included (MLCLEncoder hands a BERT-family backbone its padding mask prepared, so transformers'
own check of the mask is not made). The logged loss components are the
window averages the float path gave, the nan/inf filter is off by default, and the input checks run on
the first batch while a later non-finite loss still stops training at the next log."""

from __future__ import annotations

import math

import pytest
import torch
from _training_helpers import base_args, collator, tiny_encoder, tiny_split, tiny_tokenizer
from transformers import TrainerCallback

from hf_mlcl.host_sync import TRANSFORMERS_MASK_PREPARATION, SyncCountingCallback
from hf_mlcl.labels.host_reads import accelerator_path
from hf_mlcl.losses.registry import list_contrastive_losses
from hf_mlcl.training import ContrastiveTrainer, ContrastiveTrainingArguments


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _trainer(tmp_path, tok, **kw):
    args = base_args(tmp_path, **{"max_steps": 3, "logging_steps": 100, **kw})
    return ContrastiveTrainer(
        model=tiny_encoder(tok, dropout=0.1),
        args=args,
        train_dataset=tiny_split(32),
        data_collator=collator(tok, n_views=args.n_views),
    )


def _count_steps(trainer, steps) -> SyncCountingCallback:
    """Train with a counter armed inside ``steps``; no host read may be counted in them."""
    callback = SyncCountingCallback(steps=steps)
    trainer.add_callback(callback)
    with accelerator_path(), callback:
        trainer.train()
    assert sorted(callback.counters) == sorted(steps)
    for step, counter in callback.counters.items():
        assert counter.count == 0, f"step {step}:\n{counter.report()}"
    return callback


# hbl with k_min=2: its reliability gate opens on these small batches (its default never does)
LOSS_KWARGS = {"hbl": {"k_min": 2}}


@pytest.mark.parametrize("loss", list_contrastive_losses())
def test_a_batch_mode_step_reads_nothing_on_the_host(tmp_path, tok, loss):
    trainer = _trainer(tmp_path, tok, loss=loss, loss_kwargs=LOSS_KWARGS.get(loss))
    callback = _count_steps(trainer, [2])
    assert callback.counts[2] == 0  # the encoder forward included


@pytest.mark.parametrize("loss", ["msc", "mulsupcon"])
def test_a_moco_step_reads_nothing_on_the_host(tmp_path, tok, loss):
    # queue of 8 rows, batches of 4: full after step 2, so step 3 contrasts with it under any warm-up
    trainer = _trainer(tmp_path, tok, loss=loss, queue_size=8, max_steps=4)
    callback = _count_steps(trainer, [2, 3])
    assert len(trainer.queue) == 8
    assert callback.counts == {2: 0, 3: 0}  # online and momentum encoder forwards included


@pytest.mark.parametrize(
    "kw",
    [
        {"loss": "sd", "gradcache_chunk_size": 2},
        {"loss": "mulsupcon", "queue_size": 8, "n_views": 2, "gradcache_chunk_size": 2},
        {"loss": "hbl", "loss_kwargs": {"k_min": 2}, "gradient_accumulation_steps": 2},
    ],
    ids=["gradcache", "gradcache-moco-two-views", "accumulation"],
)
def test_gradcache_and_accumulation_steps_read_nothing_on_the_host(tmp_path, tok, kw):
    _count_steps(_trainer(tmp_path, tok, max_steps=4, **kw), [2, 3])


def test_the_nan_inf_filter_is_off_by_default_because_it_reads_every_step_loss(tmp_path, tok):
    assert ContrastiveTrainingArguments(output_dir=str(tmp_path)).logging_nan_inf_filter is False
    trainer = _trainer(tmp_path, tok, loss="sd", logging_nan_inf_filter=True)
    callback = SyncCountingCallback(steps=[2])
    trainer.add_callback(callback)
    with accelerator_path(), callback:
        trainer.train()
    sites = [site for _, site in callback.counters[2].events_outside(TRANSFORMERS_MASK_PREPARATION)]
    assert sites and all("transformers" in s and "trainer.py" in s for s in sites), sites


class _ComponentsOfEachMicroBatch(TrainerCallback):
    """Reference of the logged components: each micro-batch's components read as Python floats at once
    (the float path), summed in order and averaged over the logging window."""

    def __init__(self, trainer):
        self.windows, self._current = [], []
        record = trainer._record_components

        def spy(parts):
            self._current.append({k: float(v) for k, v in parts.items() if k != "loss"})
            record(parts)

        trainer._record_components = spy

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.windows.append((self._current, logs))
            self._current = []


@pytest.mark.parametrize("loss,kw", [("hbl", {"loss_kwargs": {"k_min": 2}}), ("ws_mulsupcon", {})])
def test_logged_components_are_the_window_averages_of_the_float_path(tmp_path, tok, loss, kw):
    trainer = _trainer(
        tmp_path, tok, loss=loss, max_steps=4, logging_steps=2, gradient_accumulation_steps=2, **kw
    )
    spy = _ComponentsOfEachMicroBatch(trainer)
    trainer.add_callback(spy)
    trainer.train()
    assert len(spy.windows) == 2
    names = set(spy.windows[0][0][0])
    assert names == ({"base", "hbl", "gate_open"} if loss == "hbl" else {"ws", "wm", "h"})
    for micro_batches, logs in spy.windows:
        assert len(micro_batches) == 4  # 2 steps x 2 micro-batches
        for name in names:
            total = 0.0
            for comps in micro_batches:
                total += comps[name]
            assert logs[f"loss_{name}"] == total / len(micro_batches)  # exactly: float64 sums, same order
    if loss == "hbl":
        assert 0 < spy.windows[0][1]["loss_gate_open"] <= 1 and spy.windows[0][1]["loss_hbl"] > 0


def test_the_first_batch_is_checked(tmp_path, tok):
    coll = collator(tok)

    def counts_not_memberships(rows):  # a collator whose labels are not 0/1
        out = coll(rows)
        out["labels"] = out["labels"] * 2
        return out

    args = base_args(tmp_path, max_steps=2, loss="sd")
    trainer = ContrastiveTrainer(
        model=tiny_encoder(tok),
        args=args,
        train_dataset=tiny_split(16),
        data_collator=counts_not_memberships,
        num_labels=4,
    )
    with pytest.raises(ValueError, match="binary"):
        trainer.train()
    assert trainer.state.global_step == 0


def _nan_from_call(model, first_nan_call: int):
    calls = []

    def hook(module, args, output):
        calls.append(1)
        return output * float("nan") if len(calls) >= first_nan_call else output

    model.projection_head.register_forward_hook(hook)


def test_nan_embeddings_of_the_first_batch_raise_at_once(tmp_path, tok):
    trainer = _trainer(tmp_path, tok, loss="sd")
    _nan_from_call(trainer.model, 1)
    with pytest.raises(ValueError, match="embeddings contain NaN or inf"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_a_later_non_finite_loss_stops_training_at_the_next_log_before_a_checkpoint(tmp_path, tok):
    trainer = _trainer(
        tmp_path, tok, loss="sd", max_steps=6, logging_steps=3, save_strategy="steps", save_steps=3
    )
    _nan_from_call(trainer.model, 2)  # step 2 onwards: past the checked first batch
    with pytest.raises(ValueError, match=r"NaN or inf in 2 training micro-batch\(es\)"):
        trainer.train()
    assert trainer.state.global_step == 3
    assert not (tmp_path / "checkpoint-3").exists()  # the log at step 3 raised before the save


def test_a_finite_run_logs_as_before(tmp_path, tok):
    trainer = _trainer(tmp_path, tok, loss="sd", max_steps=2, logging_steps=1)
    recorded, record = [], trainer._record_components
    trainer._record_components = lambda parts: (recorded.append(parts), record(parts))
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
    assert torch.is_tensor(recorded[-1]["loss"])


def test_the_loss_window_counts_every_non_finite_loss():
    from hf_mlcl.training.contrastive import _LossWindow

    window = _LossWindow()
    for value in (1.0, float("inf"), -3e38, float("-inf"), float("nan"), 0.0, 3e38):
        window.add({"loss": torch.tensor(value, requires_grad=True) * 1.0})
    with pytest.raises(ValueError, match=r"NaN or inf in 3 training micro-batch\(es\)"):
        window.raise_if_not_finite()
    window.add({"loss": torch.tensor(2.0)})
    window.raise_if_not_finite()  # a new window: finite
