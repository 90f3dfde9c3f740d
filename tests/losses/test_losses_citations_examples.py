"""Every registered loss carries its citation and a short runnable example in its docstring."""

from __future__ import annotations

import doctest

import pytest
import torch

from hf_mlcl.hub.model_card import loss_paper
from hf_mlcl.losses import get_loss_class, list_losses


@pytest.mark.parametrize("name", list_losses())
def test_loss_docstring_example_runs(name):
    cls = get_loss_class(name)
    tests = doctest.DocTestFinder(recurse=False).find(cls, name=cls.__name__, globs={})
    examples = [t for t in tests if t.examples]
    assert examples, f"{cls.__name__} has no runnable example in its docstring"
    torch.manual_seed(0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in examples:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0 and result.attempted >= 4, result


@pytest.mark.parametrize("name", list_losses())
def test_model_card_reads_the_citation_from_the_loss_class(name):
    cls = get_loss_class(name)
    assert isinstance(cls.citation, str) and cls.display_name and cls.reference
    info = loss_paper(name)
    assert info == {"display": cls.display_name, "cite": cls.reference, "bibtex": cls.citation}
    if cls.citation:
        assert cls.citation.startswith("@") and cls.citation.rstrip().endswith("}")


def test_unknown_loss_name_gets_an_empty_citation():
    assert loss_paper("no_such_loss") == {"display": "no_such_loss", "cite": "", "bibtex": ""}
