"""The wheel a release publishes for this platform (scripts/python.mjs builds it into
target/wheels): abi3 and manylinux-tagged, it installs into a fresh virtual environment from
the file alone, with no Rust toolchain on PATH and no network, and runs."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[2]


def built_wheel():
    wheels = sorted((ROOT / "target" / "wheels").glob("*.whl"))
    if not wheels:
        pytest.skip("no wheel in target/wheels (node scripts/python.mjs builds it)")
    return wheels[-1]


def test_the_wheel_is_abi3_and_manylinux():
    name = built_wheel().name
    assert "-cp39-abi3-" in name, name
    if sys.platform.startswith("linux"):
        assert "manylinux_2_34_" in name, name


def test_the_wheel_installs_and_runs_without_rust(tmp_path):
    wheel = built_wheel()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    # PATH: the new environment and the system's tools, nothing that holds cargo or rustc.
    dirs = [str(python.parent)] + [d for d in ["/usr/local/bin", "/usr/bin", "/bin"] if os.path.isdir(d)]
    path = os.pathsep.join(d for d in dirs if not (Path(d) / "cargo").exists() and not (Path(d) / "rustc").exists())
    env = {"PATH": path, "HOME": str(tmp_path), "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    assert shutil.which("cargo", path=path) is None
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--quiet", str(wheel)], check=True, env=env, cwd=tmp_path)
    script = (
        "from expert_runtime import Runtime\n"
        "import sys\n"
        "with Runtime.load(sys.argv[1]) as rt:\n"
        "    s = rt.create_session()\n"
        "    r = s.complete('Hi', max_tokens=3, temperature=0)\n"
        "    print('OK', len(r.tokens) > 0, r.finish_reason)\n"
    )
    out = subprocess.run([str(python), "-c", script, str(FIXTURES / "qwen3-tiny")], check=True, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert out.stdout.split()[:2] == ["OK", "True"], out.stdout + out.stderr
    # It was installed from the file, not built: no build directory, no compiled sources.
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"], check=True, env=env, capture_output=True, text=True).stdout.strip()
    native = [n for n in (Path(site) / "expert_runtime").glob("_native*") if n.suffix in (".so", ".pyd")]
    assert native and all(".abi3." in n.name or n.suffix == ".pyd" for n in native), native
