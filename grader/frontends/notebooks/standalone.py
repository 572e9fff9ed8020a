"""The standalone notebook's first code cell: the `puzzles` and `grader` packages, zipped and base64-encoded in the
cell, and the few lines that unpack them onto sys.path.

That makes puzzles-standalone.ipynb one file that runs wherever torch, numpy and matplotlib are installed (Colab
has them): no repository, no pip, no network. Since no pip checks the kernel's torch either, the cell first runs
torch_check.py's check, and stops there, saying what to install, when torch is missing or older than MIN_TORCH.
What it carries is the Python of puzzles/ (less the learner's stubs pN_*.py: the notebook's own cells are the
stubs) and of grader/, less the instructor's tools (../shipping.py); never solutions/ or tests/.

The zip is built the same way every time (sorted names, fixed timestamps), and the cell records a digest of what
it carries, so that `build --check` compares contents, not compressed bytes (which a different zlib may change).
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import io
import re
import zipfile
from pathlib import Path

import nbformat

from puzzles import sim

from ..shipping import shipped
from .cells import SETUP_MARK
from .torch_check import MIN_TORCH, torch_problem

GRADER_DIR = Path(__file__).resolve().parents[2]  # grader/ (this file is grader/frontends/notebooks/standalone.py)
PUZZLES_DIR = Path(sim.__file__).resolve().parent
_STUB = re.compile(r"p\d+_\w+\.py")
_DIGEST = re.compile(r"^# package contents: sha256 ([0-9a-f]{16})$", re.MULTILINE)


def package_files() -> dict[str, bytes]:
    """{path inside the zip: contents} for every file the notebook carries."""
    files = {}
    for top in (PUZZLES_DIR, GRADER_DIR):
        for path in sorted(top.rglob("*.py")):
            rel = path.relative_to(top.parent)
            if not shipped(rel) or (top == PUZZLES_DIR and len(rel.parts) == 2 and _STUB.fullmatch(path.name)):
                continue
            files[rel.as_posix()] = path.read_bytes()
    return files


def contents_digest(files: dict[str, bytes]) -> str:
    """What the cell carries and the code around it (so that a change to either makes `build --check` fail)."""
    h = hashlib.sha256((SETUP + TORCH_CHECK).encode())
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return h.hexdigest()[:16]


def package_zip(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, files[name], compresslevel=9)
    return buffer.getvalue()


# First of all, too old a torch (or none) is said plainly, with what to do (torch_check.py).
TORCH_CHECK = inspect.getsource(torch_problem) + f'''

_problem = torch_problem("{MIN_TORCH}")  # the oldest torch the puzzles are tested on (pyproject.toml)
if _problem:
    raise RuntimeError(_problem)
'''

SETUP = '''{mark}: unpack this notebook's copy of the puzzles' package (run me first)
# This cell carries the `puzzles` and `grader` packages (a zip, in base64) and puts them on sys.path, so that the
# notebook needs no repository and no network, only torch, numpy and matplotlib. Nothing to edit here.
# package contents: sha256 {digest}
{torch_check}
import base64, io, os, shutil, sys, tempfile, zipfile

_PACKAGE = (
{payload}
)
_home = os.path.join(tempfile.gettempdir(), "training-puzzles-{digest}")
if not os.path.isdir(_home):
    _unpacking = tempfile.mkdtemp(prefix="training-puzzles-")
    zipfile.ZipFile(io.BytesIO(base64.b64decode(_PACKAGE))).extractall(_unpacking)
    try:
        os.rename(_unpacking, _home)
    except OSError:  # another kernel unpacked it first
        shutil.rmtree(_unpacking, ignore_errors=True)
if _home not in sys.path:
    sys.path.insert(0, _home)
import grader
if os.path.dirname(os.path.dirname(os.path.abspath(grader.__file__))) == _home:
    print("The puzzles' package is ready.")
else:
    print(f"Note: this kernel had already imported grader from {{os.path.dirname(grader.__file__)}}; restart the "
          f"kernel and run this cell first to use this notebook's own copy.")'''


def setup_source(files: dict[str, bytes] | None = None) -> str:
    files = package_files() if files is None else files
    encoded = base64.b64encode(package_zip(files)).decode()
    payload = "\n".join(f'    "{encoded[i:i + 100]}"' for i in range(0, len(encoded), 100))
    return SETUP.format(mark=SETUP_MARK, digest=contents_digest(files), torch_check=TORCH_CHECK, payload=payload)


def embedded_files(source: str) -> dict[str, bytes]:
    """{path: contents} of the package a setup cell carries ({} for any other cell): what a learner who unpacks
    the notebook reads, for the release's leak check."""
    if not source.startswith(SETUP_MARK) or "_PACKAGE = (" not in source:
        return {}
    body = source.split("_PACKAGE = (", 1)[1].split("\n)", 1)[0]
    encoded = "".join(re.findall(r'"([A-Za-z0-9+/=]*)"', body))
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(encoded))) as z:
        return {name: z.read(name) for name in z.namelist()}


def recorded_digest(source: str) -> str | None:
    """The contents digest a setup cell records (None for any other cell)."""
    m = _DIGEST.search(source) if source.startswith(SETUP_MARK) else None
    return m.group(1) if m else None


def setup_cell():
    cell = nbformat.v4.new_code_cell(setup_source())
    cell["id"] = "setup"
    # Colab shows a form's title instead of its code; JupyterLab collapses the source. nbconvert (HTML, PDF: how a
    # notebook is shared and printed) leaves out the source of a cell marked transient.remove_source, as its own
    # TagRemovePreprocessor marks the cells it hides: else the page would open with about 440 KB of base64.
    # "remove-input" says the same to Jupyter Book and to nbconvert configured to remove tagged inputs.
    cell.metadata.update({"cellView": "form", "jupyter": {"source_hidden": True},
                          "transient": {"remove_source": True}, "tags": ["remove-input"]})
    return cell
