"""MomentumContrast: the MoCo queue, the key encoder and the loss paper's contrast set as one piece around any
contrastive loss, driven by a plain training loop (the loop of its docstring and docs/usage.md)."""

from __future__ import annotations

import gc

import pytest
import torch
from _training_helpers import collator, tiny_encoder, tiny_split, tiny_tokenizer

from hf_mlcl.losses import get_loss
from hf_mlcl.training import MomentumContrast
from hf_mlcl.training.memory import CandidateBuilder


@pytest.mark.parametrize("loss_name, contrast_set", [("mulsupcon", "keys"), ("msc", "queries+queue")])
def test_a_plain_loop_trains_with_the_papers_contrast_set_and_fills_the_queue(loss_name, contrast_set):
    tok = tiny_tokenizer()
    encoder = tiny_encoder(tok, dropout=0.1)
    loss = get_loss(loss_name, **({"num_labels": 4, "embedding_dim": 16} if loss_name == "msc" else {}))
    moco = MomentumContrast.build(loss, encoder, queue_size=8, num_labels=4, momentum=0.5)
    assert moco.contrast_set == contrast_set and moco.queue.dim == 16
    optimizer = torch.optim.SGD([*encoder.parameters(), *loss.parameters()], lr=0.1)
    coll, data = collator(tok), tiny_split(12)
    key_param = next(
        p for n, p in moco.key_encoder.module.named_parameters() if n.endswith("out_proj.weight")
    )
    for step in range(3):
        batch = coll([data[i] for i in range(4 * step, 4 * step + 4)])
        labels = batch.pop("labels")
        keys = moco.keys(batch, labels)
        assert not keys[0].requires_grad and keys[0].shape == (4, 16)
        embeddings = encoder(**batch).embeddings
        # the loss is the one of the paper's contrast set over this step's keys and the queue before them
        want = (
            CandidateBuilder(contrast_set, queue=moco.queue, queue_warmup=moco.candidates.queue_warmup)
            .step(embeddings, labels, keys)
            .components(loss)["loss"]
        )
        got = moco(embeddings, labels, keys)
        torch.testing.assert_close(got, want)
        assert len(moco.queue) == min(4 * (step + 1), 8)  # enqueued after the loss, a ring of 8
        slots = (4 * step + torch.arange(4)) % 8
        assert torch.equal(moco.queue.embeddings[slots], keys[0]) and torch.equal(
            moco.queue.labels[slots], keys[1]
        )
        got.backward()
        key_before = key_param.detach().clone()
        optimizer.step()
        optimizer.zero_grad()
        online = dict(encoder.named_parameters())["projection_head.out_proj.weight"].detach()
        moco.update(encoder)  # key = m key + (1 - m) online
        torch.testing.assert_close(key_param.detach(), 0.5 * key_before + 0.5 * online)
    state = moco.state_dict()
    assert set(state) == {"momentum_encoder", "queue"} and state["queue"]["n_filled"] == 8
    with pytest.raises(ValueError, match="has no queue state"):
        moco.load_state_dict({"momentum_encoder": state["momentum_encoder"]})


def test_a_loss_without_keys_is_refused():
    tok = tiny_tokenizer()
    no_keys = type("NoKeys", (torch.nn.Module,), {"is_contrastive": True, "supports_keys": False})()
    with pytest.raises(ValueError, match="supports_keys=False"):
        MomentumContrast.build(no_keys, tiny_encoder(tok), queue_size=8, num_labels=4)


def test_key_encoder_follows_every_optimizer_step_of_the_online_model_only():
    """UpdateAfterOptimizerSteps: one EMA step per optimizer step (not per backward of an accumulated step),
    none for an optimizer of other parameters, one through accelerate's optimizer wrapper; and the
    key encoder equals the EMA of the online weights written as a loop."""
    from accelerate import Accelerator

    from hf_mlcl.training.momentum import MomentumEncoder, UpdateAfterOptimizerSteps

    torch.manual_seed(0)
    online = torch.nn.Linear(4, 3)
    updates = UpdateAfterOptimizerSteps(MomentumEncoder(online, momentum=0.5), lambda: online)
    expected = [p.detach().clone() for p in online.parameters()]
    opt = torch.optim.SGD(online.parameters(), lr=0.1)
    other = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    for _ in range(3):
        for _ in range(2):  # accumulation: two backwards, one step
            online(torch.randn(5, 4)).square().sum().backward()
        opt.step()
        opt.zero_grad()
        other.step()
        expected = [0.5 * e + 0.5 * p.detach() for e, p in zip(expected, online.parameters())]
    assert updates.steps == 3
    for e, k in zip(expected, updates.key_encoder.module.parameters()):
        torch.testing.assert_close(k, e)
    wrapped = Accelerator(cpu=True).prepare_optimizer(torch.optim.SGD(online.parameters(), lr=0.1))
    assert wrapped is not wrapped.optimizer
    online(torch.randn(5, 4)).sum().backward()
    wrapped.step()
    assert updates.steps == 4
    key = updates.key_encoder.module
    before = [p.clone() for p in key.parameters()]
    del updates  # the hook goes with its owner: later steps leave the key encoder alone
    gc.collect()
    opt.step()
    for b, k in zip(before, key.parameters()):
        assert torch.equal(b, k)
