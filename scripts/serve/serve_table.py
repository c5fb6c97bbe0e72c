"""The markdown table of BENCHMARKS-2026-11 §9 from bench-serve reports:
python serve_table.py DIR NAME...
(DIR/NAME.c1.json and DIR/NAME.json, as scripts/serve/serve_bench*.sh write them)."""

import json
import sys
from pathlib import Path


def cell(level: dict) -> str:
    if not level["requests"]:
        return f"0 done in {level['duration_s']:.0f} s (level time limit)"
    extra = f", MAT {level['mean_accepted_tokens']:.2f}" if level.get("acceptance_rate") else ""
    if level["timed_out"]:
        extra += f", {level['requests']} done in {level['duration_s']:.0f} s (level time limit)"
    ttft, tpot = level["ttft_p50_ms"], level["tpot_p50_ms"]
    return f"{level['tokens_per_s']:.1f} ({ttft:.0f} / {tpot:.1f}{extra})"


def main(folder: str, names: list[str]) -> None:
    rows: dict[int, dict[str, dict]] = {}
    for name in names:
        for path in (Path(folder) / f"{name}.c1.json", Path(folder) / f"{name}.json"):
            for level in json.loads(path.read_text())["levels"]:
                rows.setdefault(level["concurrency"], {})[name] = level
    print(
        "| concurrency | " + " | ".join(f"{n} tok/s (TTFT p50 / TPOT p50 ms)" for n in names) + " |"
    )
    print("|---|" + "---|" * len(names))
    for concurrency in sorted(rows):
        cells = [cell(rows[concurrency][n]) if n in rows[concurrency] else "-" for n in names]
        print(f"| {concurrency} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
