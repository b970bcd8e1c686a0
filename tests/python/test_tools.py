"""The `tools` extra (matplotlib, pillow) stays optional: importing attn2d loads neither, nor the
GAN code, and a command that needs one names `pip install attn2d[tools]` before doing any work."""

from __future__ import annotations

import subprocess
import sys

import pytest

from attn2d import _tools
from attn2d.cli import main as cli_main


def test_import_attn2d_loads_no_tools_and_no_gan_code():
    code = ("import sys, attn2d; "
            "print(sorted(m for m in ('matplotlib', 'PIL', 'attn2d.gan') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert proc.stdout.strip() == "[]", proc.stdout


@pytest.mark.parametrize("argv,module", [
    (["demo"], "matplotlib"),
    (["bench", "--quick"], "matplotlib"),
    (["train-gan", "--steps", "1"], "PIL"),
])
def test_command_without_its_tool_says_how_to_install_it(argv, module, monkeypatch, capsys,
                                                         tmp_path):
    monkeypatch.setitem(sys.modules, module, None)  # importlib.util.find_spec -> None
    assert cli_main(argv + ["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"attn2d {argv[0]}: error:" in err
    assert "pip install attn2d[tools]" in err
    assert _tools.PACKAGES[module] in err
    assert not (tmp_path / "out").exists()


def test_require_passes_where_installed_and_names_the_package_where_not(monkeypatch):
    _tools.require("x", "json")
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match=r"x needs pillow.*pip install attn2d\[tools\]"):
        _tools.require("x", "json", "PIL")
