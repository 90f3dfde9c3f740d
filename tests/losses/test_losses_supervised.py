"""Supervised multi-label losses (BCE, focal, asymmetric, ZLPR) vs torch / hand-written references."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hf_mlcl.losses import AsymmetricLoss, FocalLoss, SupervisedLoss, ZLPRLoss, get_loss


def _data(seed=0, n=6, n_labels=5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, n_labels, generator=g) * 3
    y = (torch.rand(n, n_labels, generator=g) < 0.4).float()
    return x, y


def ridnik_asl(x, y, gamma_neg=4.0, gamma_pos=1.0, clip=0.05, eps=1e-8):
    """Ridnik et al.'s official AsymmetricLoss (per element, before their final -sum)."""
    xs_pos = torch.sigmoid(x)
    xs_neg = 1 - xs_pos
    if clip > 0:
        xs_neg = (xs_neg + clip).clamp(max=1)
    los_pos = y * torch.log(xs_pos.clamp(min=eps))
    los_neg = (1 - y) * torch.log(xs_neg.clamp(min=eps))
    loss = los_pos + los_neg
    pt = xs_pos * y + xs_neg * (1 - y)
    gamma = gamma_pos * y + gamma_neg * (1 - y)
    return -(loss * torch.pow(1 - pt, gamma))


def test_registry_and_flags():
    for name, cls_name in [
        ("bce", "BCELoss"),
        ("focal", "FocalLoss"),
        ("asymmetric", "AsymmetricLoss"),
        ("zlpr", "ZLPRLoss"),
    ]:
        loss = get_loss(name)
        assert type(loss).__name__ == cls_name
        assert isinstance(loss, SupervisedLoss)
        assert loss.is_contrastive is False and loss.supports_keys is False


def test_bce_matches_torch():
    x, y = _data()
    want = F.binary_cross_entropy_with_logits(x, y)
    assert get_loss("bce")(x, y).item() == pytest.approx(want.item(), rel=1e-6)
    pw = torch.tensor([1.0, 2.0, 0.5, 3.0, 1.0])
    want_pw = F.binary_cross_entropy_with_logits(x, y, pos_weight=pw)
    assert get_loss("bce", pos_weight=pw)(x, y.to_sparse()).item() == pytest.approx(want_pw.item(), rel=1e-6)
    assert get_loss("bce", reduction="sum")(x, y.bool()).item() == pytest.approx(
        F.binary_cross_entropy_with_logits(x, y, reduction="sum").item(), rel=1e-6
    )


def test_focal_matches_hand_formula():
    x, y = _data(1)
    total = 0.0
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            p = 1 / (1 + math.exp(-x[i, j].item()))
            if y[i, j] > 0:
                total += -((1 - p) ** 2) * math.log(p)
            else:
                total += -(p**2) * math.log(1 - p)
    want = total / x.numel()  # ABALONE L_FCL: 1/N 1/L
    fn = get_loss("focal")
    assert fn.gamma == 2.0
    assert fn(x, y).item() == pytest.approx(want, rel=1e-5)
    # gamma = 0 is BCE; alpha-balancing
    assert FocalLoss(gamma=0.0)(x, y).item() == pytest.approx(
        F.binary_cross_entropy_with_logits(x, y).item(), rel=1e-6
    )
    el = FocalLoss(alpha=0.25, reduction="none")(x, y)
    el0 = FocalLoss(reduction="none")(x, y)
    torch.testing.assert_close(el, torch.where(y > 0, 0.25 * el0, 0.75 * el0))


def test_asymmetric_defaults_and_official_reference():
    x, y = _data(2)
    fn = get_loss("asymmetric")
    assert (fn.gamma_pos, fn.gamma_neg, fn.clip) == (0.0, 3.0, 0.3)  # ABALONE settings
    want = ridnik_asl(x, y, gamma_neg=3.0, gamma_pos=0.0, clip=0.3).mean()
    assert fn(x, y).item() == pytest.approx(want.item(), rel=1e-5)
    # Ridnik et al.'s own defaults, sum reduction as in their code
    fn2 = AsymmetricLoss(gamma_pos=1.0, gamma_neg=4.0, clip=0.05, reduction="sum")
    assert fn2(x, y).item() == pytest.approx(ridnik_asl(x, y).sum().item(), rel=1e-5)
    # clip 0, gammas 0 -> BCE
    assert AsymmetricLoss(0.0, 0.0, 0.0)(x, y).item() == pytest.approx(
        F.binary_cross_entropy_with_logits(x, y).item(), rel=1e-6
    )


@pytest.mark.parametrize("name", ["bce", "focal", "asymmetric", "zlpr"])
def test_extreme_logits_half_precision_and_gradcheck(name):
    x = torch.tensor([[80.0, -80.0, 0.0], [-30.0, 30.0, 1e-3]], requires_grad=True)
    y = torch.tensor([[1, 0, 1], [1, 0, 0]])
    out = get_loss(name)(x, y)
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(x.grad).all()
    xh = x.detach().to(torch.bfloat16)
    out_h = get_loss(name)(xh, y)
    assert out_h.dtype == torch.float32 and torch.isfinite(out_h)
    x64, y64 = _data(3, n=3, n_labels=3)
    x64 = x64.double().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v: get_loss(name)(v, y64), (x64,))


@pytest.mark.parametrize("name", ["bce", "focal", "asymmetric", "zlpr"])
def test_bad_inputs(name):
    x, y = _data()
    fn = get_loss(name)
    with pytest.raises(ValueError, match="shape mismatch"):
        fn(x, y[:, :4])
    with pytest.raises(ValueError, match="binary"):
        fn(x, y * 2)
    bad = x.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        fn(bad, y)
    with pytest.raises(ValueError, match="reduction"):
        get_loss(name, reduction="avg")


def zlpr_loop(x, y):
    """Su et al.'s ZLPR per sample, with plain loops: log(1 + sum_neg e^s) + log(1 + sum_pos e^-s)."""
    out = []
    for i in range(x.shape[0]):
        neg = sum(math.exp(x[i, j].item()) for j in range(x.shape[1]) if y[i, j] == 0)
        pos = sum(math.exp(-x[i, j].item()) for j in range(x.shape[1]) if y[i, j] != 0)
        out.append(math.log(1 + neg) + math.log(1 + pos))
    return out


def test_zlpr_matches_the_plain_formula_and_reductions():
    x, y = _data(4, n=7, n_labels=6)
    y[0] = 0  # no positive: only the negatives' term
    y[1] = 1  # no negative: only the positives' term
    want = zlpr_loop(x.double(), y)
    fn = get_loss("zlpr")
    assert fn(x, y).item() == pytest.approx(sum(want) / len(want), rel=1e-6)  # mean over samples
    for labels in (y.to_sparse(), y.bool()):
        assert fn(x, labels).item() == pytest.approx(sum(want) / len(want), rel=1e-6)
    assert ZLPRLoss(reduction="sum")(x, y).item() == pytest.approx(sum(want), rel=1e-6)
    per = ZLPRLoss(reduction="none")(x.double(), y)
    assert per.shape == (7,)
    torch.testing.assert_close(per, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    # gradient of the formula: d/ds_j = softmax over [0, negatives] for a negative, -softmax over [0, -positives]
    xd = x.double().requires_grad_(True)
    ZLPRLoss(reduction="sum")(xd, y).backward()
    pos = y > 0
    neg_w = torch.where(pos, 0.0, x.double().exp())
    pos_w = torch.where(pos, (-x.double()).exp(), 0.0)
    want_grad = neg_w / (1 + neg_w.sum(1, keepdim=True)) - pos_w / (1 + pos_w.sum(1, keepdim=True))
    torch.testing.assert_close(xd.grad, want_grad, rtol=1e-10, atol=1e-12)


def test_zlpr_decision_boundary_is_the_evaluations_default_threshold():
    """ZLPR's labels are the logits above 0: a linear head trained with it on separable features predicts
    every label right at sigmoid >= 0.5, the evaluation's default threshold."""
    from hf_mlcl.evaluation import compute_multilabel_metrics, sigmoid

    g = torch.Generator().manual_seed(0)
    y = (torch.rand(64, 5, generator=g) < 0.4).float()
    x = y * 2 - 1 + 0.1 * torch.randn(64, 5, generator=g)
    head = torch.nn.Linear(5, 5)
    opt = torch.optim.SGD(head.parameters(), lr=1.0)
    fn = ZLPRLoss()
    for _ in range(40):
        opt.zero_grad()
        fn(head(x), y).backward()
        opt.step()
    logits = head(x).detach()
    assert torch.equal(logits > 0, y > 0)
    m = compute_multilabel_metrics(y.numpy().astype(bool), sigmoid(logits.numpy()), threshold=0.5)
    assert m["micro_f1"] == 1.0 and m["macro_f1"] == 1.0
