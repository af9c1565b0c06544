"""Wall time of one command, written to a results file like every benchmark's figures.

    python benchmarks/timed_command.py NAME --what "SENTENCE" -- COMMAND [ARG ...]

Runs COMMAND (no shell: `env VAR=value COMMAND ...` sets variables) with its output passed through, and
when it succeeds writes benchmarks/results/NAME.json (benchmarks/results_file.py) with one row
{"wall_s", "exit_status"}; `command` there is COMMAND. Exits with COMMAND's status. The commands a user
runs whole are timed this way, e.g.

    python benchmarks/timed_command.py make_test --what "The README's test command on a fresh clone." -- make test
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], usage="%(prog)s NAME --what TEXT -- COMMAND")
    parser.add_argument("name", help="the results file's name (benchmarks/results/NAME.json)")
    parser.add_argument("--what", required=True, help="one sentence: what the command's wall time measures")
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:split]), argv[split + 1 :]
    if not command:
        parser.error("give the command to time after --")
    started = time.perf_counter()
    status = subprocess.run(command).returncode
    wall_s = round(time.perf_counter() - started, 1)
    print(f"{shlex.join(command)}: exit status {status} after {wall_s} s", file=sys.stderr)
    if status == 0:
        from results_file import portable, write_results

        row = {"wall_s": wall_s, "exit_status": status}
        write_results(args.name, [row], args.what, command=shlex.join(portable(word) for word in command))
    return status


if __name__ == "__main__":
    sys.exit(main())
