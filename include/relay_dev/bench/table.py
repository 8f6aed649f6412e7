"""The human summary printed after a run: one line per figure, then machine facts and load."""

from __future__ import annotations

from typing import Any

from .options import SECTIONS
from .stats import fmt_number, fmt_ratio


def render_table(result: dict[str, Any]) -> str:
    """The human summary: one line per figure, then machine facts and load."""
    cols = ["section", "figure", "value", "unit", "baseline", "base value", "ratio"]
    rows: list[list[str]] = []
    for name in SECTIONS:
        sec = result["sections"].get(name, {})
        status = sec.get("status", "skipped")
        if status != "ok":
            why = f": {sec.get('error')}" if sec.get("error") else ""
            rows.append([name, f"{status.upper()}{why}"[:90], "", "", "", "", ""])
            if status == "skipped":
                continue
        for f in sec.get("figures", []):
            rows.append(
                [
                    name,
                    f["name"],
                    fmt_number(f["value"]),
                    f["unit"],
                    f.get("baseline_name") or "-",
                    fmt_number(f.get("baseline")),
                    fmt_ratio(f.get("ratio")),
                ]
            )
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    right = {2, 5, 6}

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    out = [line(cols), line(["-" * w for w in widths]), *(line(r) for r in rows)]
    m = result.get("machine", {})
    if m:
        out.append("")
        out.append(
            f"machine: {m.get('cores')} cores, {fmt_number(m.get('memory_gib'))} GiB, "
            f"Python {m.get('python')}, pyspark {m.get('pyspark')}, Java {m.get('java')}, "
            f"kafka-python {m.get('kafka_python')} (crc32c {'yes' if m.get('crc32c') else 'no'})"
        )
        out.append(f"load average (1/5/15 min): start {m.get('load_start')}, end {m.get('load_end')}")
    if result.get("results_file"):
        out.append(f"results: {result['results_file']}")
    out.append("overall: " + ("OK" if result.get("ok") else "FAILED (see sections above)"))
    return "\n".join(out)
