"""A Python that does not have this project importable: a fresh virtual environment that borrows the running
interpreter's site-packages (torch, numpy, matplotlib, nbformat, ipykernel) through a plain path line in a .pth
file. A plain path line does not run the .pth files of the directory it names, so the project's editable install
there (a .pth with an import hook) stays inactive: `import grader` fails until something installs or unpacks it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path


def fresh_venv(where: Path) -> Path:
    """Create the environment; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=where).stdout.strip()
    Path(site, "borrowed-site-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def clean_env(**extra) -> dict:
    """The environment without what would make the project importable from elsewhere (PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(extra)
    return env


def run(python: Path, *args, cwd: Path, check: bool = False, timeout: float = 600, **env):
    return subprocess.run([str(python), *args], cwd=cwd, env=clean_env(**env), capture_output=True, text=True,
                          check=check, timeout=timeout)


def kernel_spec(python: Path, jupyter_dir: Path, name: str, **env) -> None:
    """A Jupyter kernel that runs in `python`; found when JUPYTER_PATH names `jupyter_dir`."""
    folder = jupyter_dir / "kernels" / name
    folder.mkdir(parents=True)
    spec = {"argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"], "display_name": name,
            "language": "python", "env": env}
    (folder / "kernel.json").write_text(json.dumps(spec))
