"""Running a notebook headless and reading what its cells printed."""

from __future__ import annotations

from nbclient import NotebookClient


def execute(nb, folder, kernel_name: str = "python3", timeout: int = 600):
    """Run every cell of `nb` (in place) with `folder` as the kernel's working directory."""
    NotebookClient(nb, timeout=timeout, kernel_name=kernel_name, resources={"metadata": {"path": str(folder)}}).execute()
    return nb


def outputs_of(cell) -> str:
    text = []
    for out in cell.get("outputs", []):
        if out.output_type == "error":
            text.append(f"ERROR {out.ename}: {out.evalue}")
        text.append(out.get("text", ""))
        text.extend(str(v) for k, v in out.get("data", {}).items() if k in ("text/html", "text/plain"))
    return "\n".join(text)


def errors_of(nb) -> list[str]:
    return [outputs_of(c) for c in nb.cells if any(o.output_type == "error" for o in c.get("outputs", []))]


def check_outputs(nb) -> dict[str, str]:
    """{puzzle id: what its check cell showed}."""
    return {c.id.removesuffix("-check"): outputs_of(c) for c in nb.cells if c.get("id", "").endswith("-check")}
