"""A long-lived `supervisor` process for the fuzz test: one command per stdin line, one JSON result per stdout line.

Runs each command through click exactly as the console script does, under an address-space
limit (RLIMIT_AS, set after the imports), and reports the exit code, the output, a traceback
when one escaped (any exception other than SystemExit: a bug), and the peak RSS so far.
Starting Python once instead of once per example keeps hundreds of examples within seconds.
"""

from __future__ import annotations

import json
import resource
import sys
import traceback

from click.testing import CliRunner

from supervisor.cli.main import cli


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    headroom = int(sys.argv[1])
    # Warm every command's lazy imports before the limit, so the limit bounds the input's cost only.
    for args in (["analyze", "--help"], ["policy", "explain", "--help"], ["validate", "--help"]):
        CliRunner().invoke(cli, args)
    import supervisor.cli.dryrun  # noqa: F401
    import supervisor.traces  # noqa: F401

    cap = _vm_size() + headroom
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    print(json.dumps({"ready": True, "cap": cap}), flush=True)
    for line in sys.stdin:
        args = json.loads(line)
        res = CliRunner().invoke(cli, args)
        exc = res.exception
        tb = None
        if exc is not None and not isinstance(exc, SystemExit):
            tb = "".join(traceback.format_exception(exc))[-4000:]
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = {"code": res.exit_code, "output": res.output[-3000:], "traceback": tb, "peak_kb": peak_kb}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
