"""Helpers shared by the runtime's tests."""

import os


def site_in(path: str, marker: str) -> str:
    """How the runtime names the line of the file `path` that ends with `# marker`."""
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# {marker}"):
                return f"{os.path.basename(path)}:{lineno}: {line.strip()}"
    raise LookupError(marker)
