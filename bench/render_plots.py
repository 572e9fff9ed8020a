"""Render the plots of every puzzle's reference solution and naive answer, to look at them.

    .venv/bin/python bench/render_plots.py                 # all puzzles, into out/plots/
    .venv/bin/python bench/render_plots.py -p p3 p6 --seed 1 --out /tmp/plots

For each puzzle it grades solutions/ and tests/naive/ and writes
    out/plots/solutions/pN_memory.png, pN_schedule.png
    out/plots/naive/pN_memory.png, pN_schedule.png
    out/plots/compare/pN_schedule.png, pN_memory.png      (reference above, naive below, one time axis)
    out/plots/compare/p5_vs_p6_schedule.png, ..._memory.png (GPipe vs 1F1B, both references)
and prints the peak tables. A puzzle whose files are broken (someone is editing them) is skipped with a note.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _load_specs() -> None:
    """Import grader.specs; if one spec module is broken mid-edit, load the others one by one."""
    try:
        importlib.import_module("grader.specs")
        return
    except Exception as exc:  # noqa: BLE001 - a spec being edited
        print(f"note: grader.specs failed to import ({type(exc).__name__}: {exc}); loading specs one by one")
    for name in [m for m in sys.modules if m == "grader.specs" or m.startswith("grader.specs.")]:
        del sys.modules[name]
    importlib.import_module("grader.spec")
    package = types.ModuleType("grader.specs")
    package.__path__ = [str(REPO / "grader" / "specs")]
    sys.modules["grader.specs"] = package
    specs = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if not (info.name.startswith("p") and "_" in info.name):
            continue
        try:
            spec = importlib.import_module(f"grader.specs.{info.name}").SPEC
        except Exception as exc:  # noqa: BLE001
            print(f"skip {info.name}: its spec does not import ({type(exc).__name__}: {exc})")
            continue
        specs[spec.id] = spec
    package.SPECS = dict(sorted(specs.items(), key=lambda kv: int(kv[0][1:].split("_")[0] or 0)))


PAIRS = [("p5", "p6", ("GPipe (p5 reference)", "1F1B (p6 reference)"))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-p", "--puzzles", nargs="*", help="puzzle ids (default: every puzzle with a spec)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(REPO / "out" / "plots"))
    parser.add_argument("--quiet", action="store_true", help="no peak tables")
    args = parser.parse_args(argv)

    _load_specs()
    from grader.backends.simulator import grade_file
    from grader.frontends import plots
    from grader.specs import SPECS

    out = Path(args.out)
    ids = args.puzzles or list(SPECS)
    written, references = [], {}
    for pid in ids:
        spec = SPECS.get(pid)
        if spec is None:
            print(f"skip {pid}: no spec")
            continue
        results = {}
        for target, folder in (("solutions", REPO / "solutions"), ("naive", REPO / "tests" / "naive")):
            path = folder / spec.filename
            if not path.exists():
                print(f"skip {pid} {target}: no {path.relative_to(REPO)}")
                continue
            try:
                result = grade_file(spec, path, args.seed)
            except Exception as exc:  # noqa: BLE001 - a spec mid-edit
                print(f"skip {pid} {target}: grading raised {type(exc).__name__}: {exc}")
                continue
            if not result.figures:
                print(f"skip {pid} {target}: {result.status}: {(result.error or '').splitlines()[:1]}")
                continue
            results[target] = result
            t0 = time.perf_counter()
            paths = plots.write_plots(result, out / target)
            written += paths
            print(f"{pid} {target:<9} {result.status:<5} makespan {result.makespan_ticks:>10,} ticks  "
                  f"-> {', '.join(str(p.relative_to(out)) for p in paths)}  ({time.perf_counter() - t0:.2f} s)")
            if not args.quiet:
                print("    " + plots.peak_table(result).replace("\n", "\n    "))
        if "solutions" in results:
            references[pid] = results["solutions"]
        if len(results) == 2:
            titles = (f"{pid} reference", f"{pid} naive")
            for what in ("schedule", "memory"):
                fig = plots.comparison_figure(results["solutions"], results["naive"], titles, what=what)
                written.append(plots.save(fig, out / "compare" / f"{pid}_{what}.png"))
            print(f"{pid} compare   -> compare/{pid}_schedule.png, compare/{pid}_memory.png")
    # the pairs a learner compares across puzzles: GPipe vs 1F1B (time and stage 0's memory)
    for a_id, b_id, titles in PAIRS:
        if a_id in ids and b_id in ids and a_id in references and b_id in references:
            for what in ("schedule", "memory"):
                fig = plots.comparison_figure(references[a_id], references[b_id], titles, what=what)
                written.append(plots.save(fig, out / "compare" / f"{a_id}_vs_{b_id}_{what}.png"))
            print(f"{a_id} vs {b_id} -> compare/{a_id}_vs_{b_id}_schedule.png, compare/{a_id}_vs_{b_id}_memory.png")
    print(f"{len(written)} PNGs under {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
