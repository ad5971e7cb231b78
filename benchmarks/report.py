"""Presenting results: a rich table, the JSON file, and PNG bar charts of the ratios."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["render_table", "write_json", "save_results", "plot_or_skip", "text_table", "plot", "format_value", "format_ms",
           "rows", "markdown"]


def format_value(value: float | None, unit: str) -> str:
    """A figure with its unit, rounded for reading."""
    if value is None:
        return "-"
    if unit in ("ms", "MiB"):
        return f"{value:,.1f} {unit}" if value >= 10 else f"{value:,.2f} {unit}"
    if value >= 100:
        return f"{value:,.0f} {unit}"
    return f"{value:,.1f} {unit}"


def format_ms(value: float) -> str:
    """A latency given in milliseconds, in µs below 1 ms and in seconds from 1 s."""
    if value < 1.0:
        return f"{value * 1000:.3g} µs"
    if value >= 1000.0:
        return f"{value / 1000:.3g} s"
    return f"{value:.3g} ms"


def _figure(m: dict[str, Any]) -> str:
    text = format_value(m["value"], m["unit"])
    lat = m.get("latency_ms")
    if lat and lat.get("samples") and m["unit"] != "ms":
        text += f"\n(p50 {format_ms(lat['p50'])}, p99 {format_ms(lat['p99'])})"
    elif lat and lat.get("samples"):
        text += f"\n(p99 {format_ms(lat['p99'])})"
    return text


def rows(document: dict[str, Any]) -> list[dict[str, str]]:
    """One row per (benchmark, anchor): the table's content as plain strings."""
    out: list[dict[str, str]] = []
    for entry in document["benchmarks"]:
        if entry["status"] != "ok":
            target = entry.get("target")
            out.append({"benchmark": entry["title"], "kvlog": entry["status"], "anchor": "",
                        "anchor_value": "", "ratio": "", "target": target["text"] if target else "",
                        "result": entry["status"], "note": entry.get("reason", "")[:200]})
            continue
        for i, anchor in enumerate(entry["anchors"]):
            target = _target_for(entry, anchor["key"], i)
            ratio = entry["ratios"][anchor["key"]]["ratio"]
            row = {
                "benchmark": entry["title"] if i == 0 else "",
                "kvlog": _figure(entry["subject"]) if i == 0 else "",
                "anchor": anchor["name"],
                "anchor_value": _figure(anchor),
                "ratio": "-" if ratio is None else (f"{ratio:.3g}x" if ratio < 1000 else f"{ratio:,.0f}x"),
                "target": "", "result": "", "note": "",
            }
            if target is not None:
                row["target"] = target["text"]
                row["result"] = {True: "pass", False: "MISS", None: "-"}[target["met"]]
                if "metric" in target and target.get("value") is not None:
                    row["note"] = _metric_note(entry, target)
                context = entry.get("context", {})
                notes = [(f"{name}: {context[key]['value'] / anchor['value']:.2f}x")
                         for key, name in _CONTEXT_NOTES
                         if key in context and context[key]["value"] and anchor["value"]]
                paired = anchor.get("paired_ratios")
                if paired:
                    notes.insert(0, "paired runs: " + ", ".join(
                        f"{r:.2f}x" if r < 100 else f"{r:,.0f}x" for r in paired))
                if notes:
                    row["note"] = "; ".join([row["note"], *notes] if row["note"] else notes)
            out.append(row)
    return out


def _targets(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """An entry's targets: ``targets`` where it has several, else its ``target``."""
    if entry.get("targets"):
        return list(entry["targets"])
    return [entry["target"]] if entry.get("target") else []


def _target_for(entry: dict[str, Any], anchor: str, row: int) -> dict[str, Any] | None:
    """The target judged against ``anchor``, or a target on the entry's own metric (on its first row)."""
    for target in _targets(entry):
        if target.get("anchor") == anchor or ("anchor" not in target and row == 0):
            return target
    return None


def _metric_note(entry: dict[str, Any], target: dict[str, Any]) -> str:
    """The figure a target on an entry's own metric is judged by, for the table's note."""
    if target["metric"] == "slowest_ms":
        runs = entry["subject"]["runs"]
        return f"runs {format_ms(min(runs))} to {format_ms(max(runs))}"
    return f"growth {target['value']:.1f} MiB"


#: Figures measured beside an anchor, shown in the table's note: (key, what it is).
_CONTEXT_NOTES = (
    ("settled", "with the index runs settled"),
    ("btree_per_commit", "writing the index B-tree per commit"),
    ("no_index", "without a key index"),
)


def render_table(document: dict[str, Any], file: IO[str] | None = None) -> None:
    """Print the results as a table (plain text when ``file`` is not a terminal)."""
    from rich.console import Console
    from rich.table import Table

    machine = document["machine"]
    title = (f"{document.get('title', 'kvlog benchmarks')} ({document['mode']}), {document['date']}, {machine['cpu']}, "
             f"{machine['cores']} cores, {machine['memory_gib']} GiB, Python {machine['python']}, "
             f"{document['wall_seconds']:.0f} s")
    table = Table(title=title, show_lines=True)
    for name, justify in (("benchmark", "left"), ("kvlog", "right"), ("anchor", "left"),
                          ("anchor value", "right"), ("kvlog / anchor", "right"), ("target", "left"),
                          ("result", "center")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in rows(document):
        result = row["result"]
        style = {"pass": "green", "MISS": "bold red", "error": "bold red", "skipped": "yellow"}.get(result)
        result_text = f"[{style}]{result}[/{style}]" if style else result
        target = row["target"] + (f"\n{row['note']}" if row["note"] else "")
        table.add_row(row["benchmark"], row["kvlog"], row["anchor"], row["anchor_value"],
                      row["ratio"], target, result_text)
    console = Console(file=file, width=max(150, Console(file=file).width))
    console.print(table)


def markdown(document: dict[str, Any]) -> str:
    """The results table in Markdown (for ``benchmarks/README.md``)."""
    machine = document["machine"]
    lines = [
        f"Mode `{document['mode']}`, {document['date']}, {machine['cpu']}, {machine['cores']} cores, "
        f"{machine['memory_gib']} GiB, {machine['os']}, Python {machine['python']}, "
        f"work dir on {machine['work_dir_filesystem']['type']}; wall time "
        f"{document['wall_seconds']:.0f} s; load average at start "
        f"{machine.get('load_average_start')}, at end {machine.get('load_average_end')}.",
        "",
        "| benchmark | kvlog | anchor | anchor value | kvlog / anchor | target | result |",
        "|---|---:|---|---:|---:|---|:---:|",
    ]
    for row in rows(document):
        cells = [row["benchmark"], row["kvlog"], row["anchor"], row["anchor_value"], row["ratio"],
                 row["target"] + (f" ({row['note']})" if row["note"] else ""), row["result"]]
        lines.append("| " + " | ".join(c.replace("\n", " ").replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def write_json(document: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write the results document (pretty-printed, keys in a stable order)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, target)
    return target


def save_results(document: dict[str, Any], target: Path) -> None:
    """Write ``document`` to ``target``, then draw its plots beside it and write it again listing them.

    The results are on disk before any chart is drawn, so a chart that fails loses nothing.
    """
    document["plots"] = []
    write_json(document, target)
    document["plots"] = plot_or_skip(document, target)
    write_json(document, target)
    document["path"] = str(target)


def plot_or_skip(document: dict[str, Any], target: Path) -> list[str]:
    """The charts :func:`plot` draws for ``document``, or none and one line on stderr saying why."""
    try:
        return [str(path) for path in plot(document, target)]
    except Exception as e:  # noqa: BLE001 - a chart is never worth the results it belongs to
        detail = " ".join(f"{type(e).__name__}: {e}".split())
        print(f"charts skipped for {target} (the results are written): {detail}", file=sys.stderr)
        return []


def text_table(document: dict[str, Any], title: str, fmt: Callable[[Any, str], str], *, id_width: int,
               anchor_width: int, name_width: int,
               notes: Callable[[dict[str, Any]], list[str]] = lambda entry: []) -> str:
    """A group's results as a plain-text table: figure, anchors, ratios, target, then ``notes(entry)``."""
    lines = [f"{title} ({document['mode']}, {document['date']}, {document['wall_seconds']:.0f} s; load "
             f"{document['machine'].get('loadavg_start')} -> {document['machine'].get('loadavg_end')})"]
    header = f"{'benchmark':<{id_width}} {'kvlog':>18} {'anchor':<{anchor_width}} {'ratio':>8}  target"
    lines += [header, "-" * len(header)]
    for e in document["benchmarks"]:
        if e["status"] != "ok":
            lines.append(f"{e['id']:<{id_width}} {e['status']}: {e.get('reason', '')[:100]}")
            continue
        subject = fmt(e["subject"]["value"], e["unit"])
        target = e.get("target")
        verdict = "" if target is None else f"{'met' if target.get('met') else 'NOT met'}: {target['text']}"
        for i, anchor in enumerate(e["anchors"]):
            ratio = e["ratios"][anchor["key"]]["ratio"]
            text = f"{anchor['name'][:name_width]} {fmt(anchor['value'], anchor['unit'])}"
            lines.append(f"{e['id'] if i == 0 else '':<{id_width}} {subject if i == 0 else '':>18} "
                         f"{text:<{anchor_width}} {'-' if ratio is None else f'{ratio:.3f}x':>8}  "
                         f"{verdict if i == 0 else ''}")
        lines += [f"{'':<{id_width}} {line}" for line in notes(e)]
    return "\n".join(lines)


def plot(document: dict[str, Any], out_json: str | os.PathLike[str]) -> list[Path]:
    """PNG bar charts next to ``out_json``: ``<stem>_ratios.png`` and ``<stem>_memory.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = Path(out_json)
    base.parent.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    labels: list[str] = []
    speedups: list[float] = []
    colors: list[str] = []
    target_marks: list[tuple[int, float]] = []
    for entry in document["benchmarks"]:
        if entry["status"] != "ok" or entry["id"] == "store.memory":
            continue
        for anchor in entry["anchors"]:
            speedup = entry["ratios"][anchor["key"]]["speedup"]
            if speedup is None:
                continue
            labels.append(f"{entry['title']}\nvs {anchor['name']}")
            speedups.append(speedup)
            target = next((g for g in _targets(entry) if g.get("anchor") == anchor["key"]), None)
            if target is not None:
                colors.append("tab:green" if target["met"] else "tab:red")
                # On the speedup scale: ``speedup_target`` where the entry gives one (a bound
                # on a lower-is-better figure turns into 1 / bound), else ``min_ratio``.
                tick = target.get("speedup_target", target.get("min_ratio"))
                if tick is not None:
                    target_marks.append((len(labels) - 1, float(tick)))
            else:
                colors.append("tab:blue" if speedup >= 1 else "tab:gray")
    if labels:
        fig, ax = plt.subplots(figsize=(11, 0.55 * len(labels) + 1.6))
        y = list(range(len(labels)))
        ax.barh(y, speedups, color=colors)
        ax.set_xscale("log")
        marks = [tick for _row, tick in target_marks]
        ax.set_xlim(min([*speedups, *marks, 1.0]) / 2, max([*speedups, *marks, 1.0]) * 2.5)
        ax.axvline(1.0, color="black", linewidth=1)
        for row, tick in target_marks:
            ax.plot([tick, tick], [row - 0.4, row + 0.4], color="black", linewidth=2.5)
        for row, value in enumerate(speedups):
            ax.text(value, row, f" {value:.2g}x", va="center", fontsize=8)
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("kvlog speed relative to the anchor (log scale; > 1: kvlog faster; "
                      "latency: anchor / kvlog). Black ticks: targets.")
        ax.set_title(f"{document.get('title', 'kvlog benchmarks')} ({document['mode']}), {document['date']}: "
                     "kvlog vs anchors, same run")
        fig.tight_layout()
        path = base.with_name(base.stem + "_ratios.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    memory = next((e for e in document["benchmarks"]
                   if e["id"] == "store.memory" and e["status"] == "ok"), None)
    if memory is not None:
        small = memory["anchors"][0]
        large = memory["subject"]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        names = [small["name"], large["name"]]
        details = [small.get("detail", {}), large.get("detail", {})]
        peaks = [small["value"], large["value"]]
        baseline = [d.get("baseline_kib", 0) / 1024 for d in details]
        ax.bar(names, peaks, color=["tab:blue", "tab:red" if not memory["target"]["met"] else "tab:green"],
               label="peak RssAnon")
        ax.bar(names, baseline, color="lightgray", label="after imports")
        ax.axhline(peaks[0] + memory["target"]["max"], color="black", linestyle="--",
                   label=f"target: small peak + {memory['target']['max']:.0f} MiB")
        for i, value in enumerate(peaks):
            ax.text(i, value, f"{value:.0f} MiB", ha="center", va="bottom")
        ax.set_ylabel("MiB")
        ax.set_title(f"peak anonymous RSS, growth {memory['growth_mib']:.0f} MiB "
                     f"({document['mode']}, {document['date'][:10]})")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = base.with_name(base.stem + "_memory.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
