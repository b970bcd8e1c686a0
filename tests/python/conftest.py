import os

import pytest
import torch

import attn2d  # noqa: F401  (loads the binding once for every test)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("ATTN2D_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: set ATTN2D_SLOW=1 to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
