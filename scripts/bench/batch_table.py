"""Issue 18's table from the batch-size reports of scripts/bench/goodput_batches.sh: per batch,
every method's goodput (tokens of all rows / wall time of the batch; median of the repeats) against
plain decoding, and the controller against the best of plain decoding and constant k (by
medians), both as the ratio of medians and paired: the median over repeats of the controller's
speed over that method's in the same repeat (the methods of a repeat run back to back, so slow
drifts of the host cancel in the pair; they do not in the medians of separate runs).

    python scripts/bench/batch_table.py runs/goodput18/greedy_b{1,2,4,8,16,32}.json
"""

from __future__ import annotations

import json
import statistics
import sys

CONTROLLER = "sd:policy=goodput"


def short(method: str) -> str:
    return "SV" if "policy=sv" in method else method


def table(paths: list[str]) -> str:
    lines = []
    for path in paths:
        report = json.load(open(path))
        rows = {r["method"]: r for r in report["results"] if r["category"] == "all"}
        if not lines:
            names = list(rows)
            head = [short(n) for n in names] + [
                "controller ÷ max(ar, best k)",
                "paired",
                "controller MAT",
            ]
            lines.append("| batch | " + " | ".join(head) + " |")
            lines.append("|---:|" + "---:|" * len(head))
        speeds = {name: row["tokens_per_s"] for name, row in rows.items()}
        constant = [n for n in speeds if n == "ar" or n.startswith("sd:k=")]
        best = max(constant, key=speeds.__getitem__)
        cells = [
            f"{speeds[n]:.2f} ({rows[n]['speedup']:.2f}×)" if n in rows else "—" for n in names
        ]
        ratio = speeds[CONTROLLER] / speeds[best]
        pairs = zip(
            rows[CONTROLLER]["tokens_per_s_repeats"],
            rows[best]["tokens_per_s_repeats"],
            strict=True,
        )
        paired = statistics.median(mine / theirs for mine, theirs in pairs)
        mat = rows[CONTROLLER]["mean_accepted_tokens"]
        cells += [f"{ratio:.3f} (÷ {short(best)})", f"{paired:.3f}", f"{mat:.2f}"]
        partial = "" if report.get("complete") else f" (partial: {report['prompts_done']} prompts)"
        lines.append(f"| {report['config']['batch_size']}{partial} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(sys.argv[1:]))
