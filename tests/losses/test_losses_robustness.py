"""Robustness of EVERY registered contrastive loss (parametrised over ``list_losses()``).

(e) no NaN / inf: no positive anywhere, all-empty labels, N = 1, duplicate embeddings, bf16 / fp16
inputs, temperatures 0.01 and 10; (f) ``torch.autograd.gradcheck`` in float64; (g) ``ValueError``
naming the problem for bad inputs; plus registry behaviour and the components dict.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from hf_mlcl.losses import ContrastiveLoss, get_loss, get_loss_class, list_losses
from hf_mlcl.losses.registry import list_contrastive_losses

CONTRASTIVE = list_contrastive_losses()
L, D = 6, 5


def make_loss(name: str, num_labels: int = L, embedding_dim: int = D, **kwargs) -> ContrastiveLoss:
    """Build any registered contrastive loss for tests: fills the size keywords the constructor
    accepts (msc), a base loss for wrappers (hbl), and training-label statistics when required."""
    cls = get_loss_class(name)
    params = inspect.signature(cls.__init__).parameters
    if "num_labels" in params:
        kwargs.setdefault("num_labels", num_labels)
    if "embedding_dim" in params:
        kwargs.setdefault("embedding_dim", embedding_dim)
    if "base" in params and params["base"].default is inspect.Parameter.empty:
        kwargs.setdefault("base", "mulsupcon")
    if "k_min" in params:  # hbl: let the structural term fire on small test batches
        kwargs.setdefault("k_min", 1)
    loss = get_loss(name, **kwargs)
    if getattr(loss, "requires_label_statistics", False):
        g = torch.Generator().manual_seed(123)
        train = (torch.rand(64, num_labels, generator=g) < 0.3).float()
        train[0] = 0
        train[1, :] = 0
        train[1, 0] = 1
        loss.set_label_statistics(train)
    return loss


def batch(n: int = 8, n_labels: int = L, dim: int = D, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, dim, generator=g, dtype=dtype)
    y = (torch.rand(n, n_labels, generator=g) < 0.35).float()
    if n > 1:
        y[0] = 0  # empty label set
        y[1] = 0
        y[1, 2] = 1  # single label
    if n > 3:
        y[3] = y[2]  # repeated label set
    return z, y


def assert_finite_with_grad(loss_fn, z, y, zk=None, yk=None):
    z = z.clone().requires_grad_(True)
    zk = None if zk is None else zk.clone().requires_grad_(True)
    out = loss_fn(z, y, zk, yk)
    assert out.dim() == 0
    assert torch.isfinite(out), out
    assert out.requires_grad
    out.backward()
    assert z.grad is not None and torch.isfinite(z.grad).all()
    if zk is not None and zk.grad is not None:
        assert torch.isfinite(zk.grad).all()
    comps = loss_fn.components(z.detach(), y, None if zk is None else zk.detach(), yk)
    assert "loss" in comps
    assert comps["loss"].item() == pytest.approx(float(out.detach()), rel=1e-6, abs=1e-9)
    return out


def test_registry_lists_contract_names():
    names = list_losses()
    assert names == sorted(names)
    for required in (
        "all",
        "any",
        "similarity_dissimilarity",
        "jaccard",
        "mulsupcon",
        "bce",
        "focal",
        "asymmetric",
    ):
        assert required in names
    assert "sd" not in names  # alias, not canonical
    assert type(get_loss("sd")).__name__ == type(get_loss("similarity_dissimilarity")).__name__
    assert type(get_loss("SD")) is type(get_loss("similarity-dissimilarity"))
    for name in CONTRASTIVE:
        cls = get_loss_class(name)
        assert issubclass(cls, ContrastiveLoss) and cls.is_contrastive is True
        assert isinstance(cls.supports_keys, bool)
        assert cls.__doc__ and len(cls.__doc__) > 40  # every loss documents its paper / conventions


def test_unknown_loss_name_lists_valid_names():
    with pytest.raises(ValueError) as err:
        get_loss("supcon_typo")
    msg = str(err.value)
    assert "supcon_typo" in msg
    for name in list_losses():
        assert name in msg


@pytest.mark.parametrize("name", CONTRASTIVE)
class TestEveryContrastiveLoss:
    def test_no_positive_anywhere(self, name):
        # every row carries its own label: no two samples share one (msc still has prototypes)
        n = 5
        z, _ = batch(n)
        y = torch.eye(n, L)
        assert_finite_with_grad(make_loss(name), z, y)

    def test_all_empty_labels_gives_connected_zero(self, name):
        z, _ = batch(6)
        y = torch.zeros(6, L)
        out = assert_finite_with_grad(make_loss(name), z, y)
        assert out.item() == pytest.approx(0.0, abs=1e-6) or name in {"ws_mulsupcon"}

    def test_single_anchor(self, name):
        z, y = batch(1)
        y[0, 1] = 1
        assert_finite_with_grad(make_loss(name), z, y)
        fn = make_loss(name)
        if fn.supports_keys:
            zk, yk = batch(3, seed=1)
            yk[0] = y[0]
            assert_finite_with_grad(fn, z, y, zk, yk)

    @pytest.mark.parametrize("temperature", [None, 1e-3])  # 1e-3: the kernel's row-max shift path
    def test_keys_only_without_keys_gives_connected_zero(self, name, temperature):
        # the 'keys' contrast set before a memory bank holds a row: no sample candidate for any anchor
        # (msc's label prototypes stay candidates: a finite loss and gradient there)
        fn = make_loss(name) if temperature is None else make_loss(name, temperature=temperature)
        if not getattr(fn, "supports_keys_only", False):
            pytest.skip(f"{name} has no keys-only contrast set")
        z, y = batch(4)
        z.requires_grad_(True)
        out = fn(z, y, torch.zeros(0, D), torch.zeros(0, L), anchors_in_candidates=False)
        assert out.requires_grad
        out.backward()
        if hasattr(fn, "prototypes"):
            assert torch.isfinite(out) and torch.isfinite(z.grad).all()
        else:
            assert out.item() == 0.0 and torch.equal(z.grad, torch.zeros_like(z))

    def test_duplicate_embeddings(self, name):
        z, y = batch(7)
        z = z[:1].repeat(7, 1)
        assert_finite_with_grad(make_loss(name), z, y)

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
    def test_half_precision_inputs_are_upcast(self, name, dtype):
        z, y = batch(8)
        fn = make_loss(name)
        ref = fn(z.to(dtype).float(), y)
        out = assert_finite_with_grad(fn, z.to(dtype), y)
        assert out.dtype == torch.float32
        assert out.item() == pytest.approx(ref.item(), rel=1e-4, abs=1e-5)

    def test_autocast_is_switched_off_inside_the_loss(self, name):
        z, y = batch(8)
        fn = make_loss(name)
        ref = fn(z, y).item()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = fn(z, y)
        assert out.dtype == torch.float32
        assert out.item() == pytest.approx(ref, rel=1e-6, abs=1e-7)

    @pytest.mark.parametrize("temperature", [0.01, 10.0])
    def test_extreme_temperatures(self, name, temperature):
        z, y = batch(8)
        fn = make_loss(name, temperature=temperature)
        assert_finite_with_grad(fn, z, y)
        if fn.supports_keys:
            zk, yk = batch(4, seed=3)
            assert_finite_with_grad(fn, z, y, zk, yk)

    def test_sparse_labels_match_dense(self, name):
        z, y = batch(8)
        fn = make_loss(name)
        dense = fn(z, y).item()
        assert fn(z, y.to_sparse()).item() == pytest.approx(dense, rel=1e-5, abs=1e-7)
        assert fn(z, y.to_sparse_csr()).item() == pytest.approx(dense, rel=1e-5, abs=1e-7)
        assert fn(z, y.bool()).item() == pytest.approx(dense, rel=1e-5, abs=1e-7)

    def test_gradcheck_float64(self, name):
        z, y = batch(5, n_labels=4, dim=3, seed=2, dtype=torch.float64)
        y[0, 0] = 1
        y[4] = y[0]
        fn = make_loss(name, num_labels=4, embedding_dim=3, temperature=0.5).double()
        z = z.requires_grad_(True)
        assert fn(z, y).dtype == torch.float64
        assert torch.autograd.gradcheck(lambda e: fn(e, y), (z,), eps=1e-6, atol=1e-5)
        if fn.supports_keys:
            zk, yk = batch(3, n_labels=4, dim=3, seed=4, dtype=torch.float64)
            yk[0] = y[0]
            zk = zk.requires_grad_(True)
            assert torch.autograd.gradcheck(lambda e, k: fn(e, y, k, yk), (z, zk), eps=1e-6, atol=1e-5)

    # ------------------------------------------------------------------ (g) bad input
    def test_row_count_mismatch(self, name):
        z, y = batch(8)
        with pytest.raises(ValueError, match="row"):
            make_loss(name)(z, y[:7])

    def test_key_label_width_mismatch(self, name):
        fn = make_loss(name)
        if not fn.supports_keys:
            pytest.skip("loss has no keys mode")
        z, y = batch(8)
        zk, yk = batch(4, n_labels=L + 1)
        with pytest.raises(ValueError, match="label width"):
            fn(z, y, zk, yk)

    def test_non_binary_labels(self, name):
        z, y = batch(8)
        y[2, 1] = 2.0
        with pytest.raises(ValueError, match="binary"):
            make_loss(name)(z, y)
        with pytest.raises(ValueError, match="binary"):
            make_loss(name)(z, y.to_sparse())
        y[2, 1] = 0.5
        with pytest.raises(ValueError, match="binary"):
            make_loss(name)(z, y)

    def test_nan_embeddings(self, name):
        z, y = batch(8)
        z[3, 1] = float("nan")
        with pytest.raises(ValueError, match="NaN"):
            make_loss(name)(z, y)

    @pytest.mark.parametrize("temperature", [0.0, -0.1])
    def test_non_positive_temperature(self, name, temperature):
        with pytest.raises(ValueError, match="temperature"):
            make_loss(name, temperature=temperature)


def test_numpy_scalars_are_numbers_and_a_missing_argument_names_the_loss():
    """A temperature or label count from numpy is accepted; get_loss without msc's required sizes says which."""
    import numpy as np

    from hf_mlcl.losses import get_loss

    assert get_loss("any", temperature=np.float32(0.1)).temperature == pytest.approx(0.1)
    assert get_loss("msc", num_labels=np.int64(5), embedding_dim=8).num_labels == 5
    with pytest.raises(
        ValueError, match="cannot build loss 'msc' with \\[\\]: .*'num_labels' and 'embedding_dim'"
    ):
        get_loss("msc")
    # a keyword the loss does not take is a ValueError too where the loss inherits its __init__ (any)
    with pytest.raises(ValueError, match="cannot build loss 'any' with \\['label_similarity_threshold'\\]"):
        get_loss("any", label_similarity_threshold=0.3)
    with pytest.raises(ValueError, match="cannot build loss 'bce' with \\['gamma'\\]"):
        get_loss("bce", gamma=2.0)
