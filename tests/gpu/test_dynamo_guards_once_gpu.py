"""On a GPU (torch 2.11 there): a frame recorded into fxcc's Dynamo package has its guards built once
and its package holds what torch's caching precompile saves (tests/client/test_dynamo_guards_once.py,
its checks with the model and inputs on CUDA); the package runs in a new process and a failing guard
traces. Where this torch lacked what the one build overrides, the guards would be built three times
and the first check fails on the count. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from tests.client.test_dynamo_guards_once import check_built_once, check_loaded

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]


def test_a_packaged_cuda_frame_builds_its_guards_once(tmp_path):
    check_built_once(tmp_path, "cuda")


def test_a_cuda_package_built_once_runs_and_guards_in_a_new_process(tmp_path):
    check_loaded(tmp_path, "cuda")
