"""One Markdown table from one or more matrix runs: ``python -m bench.matrix.report runs/matrix/*/results.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.matrix.run import Result, table


def main(paths: list[str]) -> int:
    results: list[Result] = []
    for p in paths:
        data = json.loads(Path(p).read_text(encoding="utf-8"))
        m = data["meta"]
        print(
            f"- `{p}`: started {m['started']}, {len(data['results'])} cells in {m['wall_s'] / 60:.1f} min, "
            f"{m['jobs']} jobs at once on {m['cores']} cores, host load average {m['loadavg_before'][0]} "
            f"before / {m['loadavg_after'][0]} after"
        )
        results += [Result(**r) for r in data["results"]]
    print()
    print(table(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
