"""The benchmark report: tables, the policy's and the board's targets, a CSV and plots from suite run directories.

``sglang-rvv report DIR [DIR...] [--out DIR]`` reads directories written by
``python -m sglang_rvv.bench suite``. For each it writes ``report.md``,
``metrics.csv`` and ``plots/*.png`` into the directory (or into ``--out`` for a
single one) and prints the markdown. With several directories it also compares
them side by side, one column per run (host/timestamp), and prints that instead;
``--out`` then receives the comparison's files.

Every number is computed here from the raw result files, so a report can be
re-rendered (or a new statistic added) without re-running anything.

This package holds the command; its modules each import only those listed before them:
:mod:`.stats` (sample and request statistics), :mod:`.summaries` (one run, per kind),
:mod:`.targets` (the targets and their verdicts), :mod:`.metrics` (the CSV rows),
:mod:`.markdown` (report.md and the comparison) and :mod:`.plots` (the PNGs);
:mod:`.board` (the board model's section, from ``board-model.json``) uses :mod:`.markdown`'s table and :mod:`.charts`;
:mod:`.peer` (``peer-compare.json``, modelled) and :mod:`.peer_bench` (``peer-bench.json``, llama-bench measured on
the board beside the suite's own numbers) use :mod:`.board`'s loader.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..results import Run, RunDirError, load_run
from .board import render as render_board
from .markdown import render_comparison, render_run
from .metrics import metric_rows, write_csv
from .peer import render as render_peer
from .peer_bench import render as render_peer_bench
from .plots import render_plots


def write_report(runs: list[Run], out_dir: Path) -> str:
    """report.md, metrics.csv and plots/ in ``out_dir``; returns the markdown."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = render_plots(runs, out_dir / "plots")
    write_csv(out_dir / "metrics.csv", [row for run in runs for row in metric_rows(run)])
    markdown = render_run(runs[0], plots, out_dir) if len(runs) == 1 else render_comparison(runs, plots, out_dir)
    if len(runs) == 1:
        markdown += render_board(runs[0].dir, out_dir) + render_peer(runs[0].dir) + render_peer_bench(runs[0])
    (out_dir / "report.md").write_text(markdown)
    return markdown


def add_arguments(parser) -> None:
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="run directories (results/<host>/<UTC ts>)")
    parser.add_argument("--out", type=Path, help="write the report files here instead of into the run directory "
                                                 "(with several DIRs: the comparison's files)")


def run(args) -> int:
    try:
        runs = [load_run(d) for d in args.dirs]
    except RunDirError as error:
        print(f"sglang-rvv report: error: {error}", file=sys.stderr)
        return 2
    if len(runs) == 1:
        markdown = write_report(runs, args.out or runs[0].dir)
        print(f"sglang-rvv report: wrote {args.out or runs[0].dir}/report.md", file=sys.stderr)
    else:
        for one in runs:
            write_report([one], one.dir)
        markdown = render_comparison(runs) if args.out is None else write_report(runs, args.out)
        print(f"sglang-rvv report: wrote report.md into each of {len(runs)} run directories"
              + (f" and the comparison into {args.out}" if args.out else ""), file=sys.stderr)
    print(markdown, end="")
    return 0
