"""Every recipe of the study (studies/recipes) parses with the real argument dataclasses, as the runner parses it."""

from __future__ import annotations

import os
import warnings

import pytest

from hf_mlcl.recipes import STAGES, load_recipe, parse_stage, split_overrides

RECIPES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recipes")


def _recipes() -> list[str]:
    out = []
    for dirpath, _dirs, files in os.walk(RECIPES):
        out += [os.path.relpath(os.path.join(dirpath, f), RECIPES) for f in files if f.endswith(".yaml")]
    return sorted(out)


def test_the_study_has_its_recipes():
    # a base per dataset plus one recipe per loss, BCE and the frozen pretrained encoder
    assert {"full_minilm.yaml", "reuters21578.yaml", "goemotions_full.yaml"} <= set(_recipes())
    for study in ("reuters21578", "goemotions_full"):
        names = {os.path.basename(r) for r in _recipes() if r.startswith(study + os.sep)}
        assert {"bce.yaml", "pretrained.yaml", "jaccard.yaml", "hbl.yaml"} <= names, study


@pytest.mark.parametrize("rel", _recipes())
def test_every_study_recipe_parses(rel):
    recipe = load_recipe(os.path.join(RECIPES, rel))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        for stage in recipe.get("stages", STAGES):
            _, data_args, args = parse_stage(recipe, stage, split_overrides(["--use_cpu", "true"], STAGES))
            assert data_args.dataset and args.output_dir
