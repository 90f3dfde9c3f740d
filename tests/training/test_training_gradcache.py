"""GradCache (Gao et al. 2021): chunked gradients equal the direct computation, dropout included."""

from __future__ import annotations

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

from hf_mlcl.labels.multihot import to_dense_bool
from hf_mlcl.losses import get_loss
from hf_mlcl.training import distributed as D
from hf_mlcl.training.gradcache import RandomState, gradcache_backward, split_inputs


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def test_gradcache_equals_direct_with_dropout_on():
    tok = tiny_tokenizer()
    model = tiny_encoder(tok, dropout=0.3)
    model.train()
    batch = collator(tok)([dict(r) for r in tiny_split(12)])
    labels = batch.pop("labels")
    loss_fn = get_loss("sd")
    chunks = split_inputs(batch, 4)
    assert [c["input_ids"].shape[0] for c in chunks] == [4, 4, 4]

    def encode(b):
        return model(**b).embeddings

    # Direct: the same chunks encoded with graphs from the same RNG start, concatenated, one backward.
    torch.manual_seed(123)
    direct_emb = torch.cat([encode(c) for c in chunks])
    direct_loss = loss_fn(direct_emb, labels)
    direct_loss.backward()
    direct = _grads(model)
    model.zero_grad()

    torch.manual_seed(123)
    gc_loss, gc_emb = gradcache_backward(encode, batch, lambda z: loss_fn(z, labels), 4)
    cached = _grads(model)
    model.zero_grad()
    assert torch.allclose(gc_loss, direct_loss.detach(), atol=1e-6)
    assert torch.allclose(gc_emb, direct_emb.detach(), atol=1e-6)
    assert max_rel_diff(cached, direct) < 1e-5

    # Without the RNG replay the re-encoding draws other dropout masks: the gradients are wrong.
    torch.manual_seed(123)
    with torch.no_grad():
        reps = [encode(c) for c in chunks]
    emb = torch.cat(reps).requires_grad_(True)
    loss_fn(emb, labels).backward()
    for c, g in zip(chunks, emb.grad.split(4)):
        encode(c).backward(g)
    assert max_rel_diff(_grads(model), direct) > 1e-2


def test_random_state_replay_restores_stream():
    state = RandomState("cpu")
    a = torch.rand(3)
    after = torch.random.get_rng_state()
    with state.replay():
        assert torch.equal(torch.rand(3), a)
    assert torch.equal(torch.random.get_rng_state(), after)


def test_random_state_replays_an_accelerators_generator_of_any_kind(monkeypatch):
    """The accelerator's RNG is captured and replayed for any device type torch has a module for (XPU here, a
    stand-in module on the CPU), not only CUDA; the generator's state after the replay is the one before it."""
    import types

    generator = {0: torch.tensor([1], dtype=torch.uint8), 1: torch.tensor([7], dtype=torch.uint8)}
    fake = types.SimpleNamespace(
        is_available=lambda: True,
        device_count=lambda: 2,
        current_device=lambda: 1,
        get_rng_state=lambda index: generator[index].clone(),
        set_rng_state=lambda state, index: generator.__setitem__(index, state.clone()),
    )
    real = torch.get_device_module
    monkeypatch.setattr(torch, "get_device_module", lambda kind=None: fake if kind == "xpu" else real(kind))
    state = RandomState("xpu")
    assert (state.device_type, state.device_index) == ("xpu", 1)
    generator[1] = torch.tensor([9], dtype=torch.uint8)  # the device's stream moves on (a dropout draws)
    with state.replay():
        assert generator[1].item() == 7  # the snapshot, on the snapshot's device only
        assert generator[0].item() == 1
    assert generator[1].item() == 9
    assert RandomState("cpu").device_type is None


def test_split_inputs_sparse_and_passthrough():
    x = {"input_ids": torch.arange(10).view(5, 2), "labels": torch.eye(5).to_sparse(), "flag": 3}
    parts = split_inputs(x, 2)
    assert [p["input_ids"].shape[0] for p in parts] == [2, 2, 1]
    assert torch.equal(parts[1]["labels"].to_dense(), torch.eye(5)[2:4])
    assert parts[2]["flag"] == 3


def test_single_process_gather_is_identity():
    z = torch.randn(3, 2, requires_grad=True)
    assert D.all_gather_with_grad(z)[0] is z
    assert D.gather_candidates(z, torch.ones(3, 2)) == (None, None)
    assert to_dense_bool(torch.eye(3).to_sparse()).dtype == torch.bool


def test_trainer_gradcache_step_matches_direct_step(tmp_path):
    """ContrastiveTrainer with gradcache_chunk_size=2 produces the direct step's gradients (dropout on)."""
    from hf_mlcl.training import ContrastiveTrainer

    tok = tiny_tokenizer()
    ds = tiny_split(8)
    results = {}
    for chunk in (0, 2):
        model = tiny_encoder(tok, dropout=0.2)
        cap = GradCapture(model)
        args = base_args(
            tmp_path / f"gc{chunk}", per_device_train_batch_size=8, gradcache_chunk_size=chunk, loss="msc"
        )
        tr = ContrastiveTrainer(
            model=model, args=args, train_dataset=ds, data_collator=collator(tok), callbacks=[cap]
        )
        if chunk == 0:
            # the direct reference encodes the batch in the same 4 chunks (same dropout masks as GradCache)
            orig = tr._encode
            tr._encode = lambda m, b, orig=orig: torch.cat([orig(m, c) for c in split_inputs(b, 2)])
        out = tr.train()
        results[chunk] = (out.training_loss, cap.grads[0])
    assert abs(results[0][0] - results[2][0]) < 1e-5
    assert max_rel_diff(results[2][1], results[0][1]) < 1e-4
