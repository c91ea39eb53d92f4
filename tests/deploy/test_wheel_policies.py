"""A wheel install (the Docker image's `pip install .`) still finds the shipped policies by name."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.slow  # builds the wheel: ~10 s
def test_shipped_policies_resolve_from_a_wheel_install(tmp_path: Path) -> None:
    pytest.importorskip("setuptools")
    src = tmp_path / "src"  # built from a copy: setuptools leaves build/ behind in its source tree
    src.mkdir()
    for part in ("pyproject.toml", "README.md", "supervisor", "policies"):
        if (ROOT / part).is_dir():
            shutil.copytree(ROOT / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / part, src / part)
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(dist), str(src)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = dist.glob("spike_supervisor-*.whl")
    shipped = sorted(p.name for p in (ROOT / "policies").glob("*.yaml"))

    # Lay the wheel out as pip does: the package into site-packages, data files under the prefix.
    prefix = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True, timeout=120)
    py = prefix / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [py, "-c", "import site; print(site.getsitepackages()[0])"], text=True
        ).strip()
    )
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            head, _, rest = name.partition("/")
            if head.endswith(".data"):
                kind, _, inner = rest.partition("/")
                assert kind == "data", name
                target = prefix / inner
            else:
                target = site / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(name))
    assert sorted(p.name for p in (prefix / "share" / "spike-supervisor" / "policies").iterdir()) == shipped
    # The project's dependencies come from this interpreter's site-packages, after the wheel's copy.
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    probe = (
        "from supervisor.core.policy.loader import resolve_policy_path, shipped_policies, load_policy\n"
        "import supervisor; print(supervisor.__file__)\n"
        "print(resolve_policy_path('default'))\n"
        "print(load_policy('conservative').name)\n"
        "print(','.join(shipped_policies()))\n"
    )
    out = subprocess.run([py, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    module, default, conservative, names = out.stdout.splitlines()
    assert module.startswith(str(site))  # the installed copy, not the source tree
    assert default == str(prefix / "share" / "spike-supervisor" / "policies" / "default.yaml")
    assert conservative == "conservative"
    assert names.split(",") == [n.removesuffix(".yaml") for n in shipped]
