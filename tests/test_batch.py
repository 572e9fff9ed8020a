"""`python -m grader batch`: a class of submissions, each in its own process; the bad ones get error rows and the
others are graded as usual."""

import csv
import json
import shutil
import subprocess
import sys

import nbformat

from grader.frontends.notebook_file import build_notebook
from grader.frontends.targets import REPO

ROOT = REPO

HANG = "import time\n\ndef data_parallel_step(dist, x_shard, target_shard, layers, lr):\n    time.sleep(600)\n"
HOG = ("import torch\n\ndef data_parallel_step(dist, x_shard, target_shard, layers, lr):\n"
       "    hog = torch.empty(2**36, dtype=torch.float64)\n")
CRASH = "import os\nprint('garbage ' * 1000)\nos._exit(3)\n"
GARBAGE = ("print('\\x00\\xff garbage', flush=True)\n\ndef data_parallel_step(dist, x_shard, target_shard, layers, lr):\n"
           "    for w1, w2 in layers:\n        w1.data = object()\n")


def test_batch_grades_a_class_and_survives_bad_submissions(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copytree(ROOT / "solutions", subs / "alice")
    shutil.copytree(ROOT / "tests" / "naive", subs / "bob")
    nbformat.write(build_notebook(ROOT, solved=True), str(subs / "carol.ipynb"))
    for name, source in (("dave", HANG), ("erin", HOG), ("frank", CRASH), ("gina", GARBAGE)):
        (subs / name).mkdir()
        (subs / name / "p3_data_parallel.py").write_text(source)
    out, js = tmp_path / "results.csv", tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "grader", "batch", str(subs), "--out", str(out), "--json", str(js),
                           "--timeout", "20", "--memory-mb", "3000", "--seed", "4", "-p", "p3", "--jobs", "3"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "[7/7]" in proc.stderr  # progress, as it goes
    rows = {r["submission"]: r for r in csv.DictReader(out.open())}
    assert rows["alice"]["p3"] == "pass" and rows["alice"]["passed"] == "1"
    assert rows["bob"]["p3"] == "fail"
    assert rows["carol.ipynb"]["p3"] == "pass"
    assert rows["dave"]["p3"] == "error" and "timed out" in rows["dave"]["error"]
    assert rows["frank"]["p3"] == "error" and "crashed" in rows["frank"]["error"]
    data = {s["name"]: s for s in json.loads(js.read_text())["submissions"]}
    [erin] = data["erin"]["puzzles"]
    assert erin["status"] == "error" and "allocate" in erin.get("error", ""), erin
    [gina] = data["gina"]["puzzles"]
    assert gina["status"] == "error", gina
