import os

# attn2d's Triton kernels run on CPU tensors through Triton's interpreter, which must be on
# before triton is imported; ATTN2D_GPU=1 compiles them for the CUDA device instead.
if os.environ.get("ATTN2D_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import attn2d  # noqa: F401,E402  (loads the binding once for every test)


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
