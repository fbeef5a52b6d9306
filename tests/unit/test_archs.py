"""The two tables of model types: archs.SUPPORTED (what the policy packs) and images/scripts/
checkpoint.py's MODEL_TYPES (what a user's checkpoint directory may hold; served row-major
when the policy does not know it). checkpoint.py runs on the build host with the standard
library only, so it cannot import archs; this test keeps the two in agreement instead."""

from __future__ import annotations

import importlib.util

from image_support import REPO

from sglang_rvv import archs, tiny

_spec = importlib.util.spec_from_file_location("checkpoint_py", REPO / "images" / "scripts" / "checkpoint.py")
checkpoint = importlib.util.module_from_spec(_spec)  # images/scripts is not a package
_spec.loader.exec_module(checkpoint)


def test_every_architecture_the_policy_packs_is_one_a_checkpoint_directory_may_hold():
    assert set(archs.SUPPORTED) <= checkpoint.MODEL_TYPES


def test_the_generated_unknown_architecture_is_servable_but_not_packed():
    # tiny.py's row-major case must pass the directory check, or test_model_dir could not build it.
    unknown = set(tiny.ARCHS) - set(archs.SUPPORTED)
    assert unknown == {"mistral"} and unknown <= checkpoint.MODEL_TYPES
