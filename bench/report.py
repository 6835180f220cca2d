"""The summary: summary.md with one table row per figure and one PNG of ratios per benchmark."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from bench import machine


def write(out: Path, index: dict, results: list[dict]) -> Path:
    lines = [
        "# Benchmarks",
        "",
        f"Machine: {machine.one_line(index['machine'])}.",
        f"Run: {'quick' if index['quick'] else 'full'}, finished {index['finished_at']}. "
        "Each figure is a ratio against a baseline measured in the same run (interleaved "
        "rounds, medians); absolute figures on a shared machine are noisy.",
        *(
            f"Run again alone: {name} ({why})."
            for name, why in index.get("rerun_alone", {}).items()
        ),
        "",
        *_TABLE_HEAD,
    ]
    for result in results:
        lines += _rows(result, headline=True)
    lines += ["", "## All figures", "", *_TABLE_HEAD]
    for result in results:
        lines += _rows(result, headline=False)
    for result in results:
        lines += ["", f"## {result['title']}", ""]
        if "error" in result:
            lines.append(f"Failed: `{_error_line(result['error'])}`")
            continue
        if "skipped" in result:
            lines.append(f"Not run here: {result['skipped']}")
            continue
        lines.append(f"Baseline: {result['baseline']}. Setup: {result['setup']}.")
        lines += [f"- {note}" for note in result.get("notes", [])]
        plot = _plot(out, result)
        if plot is not None:
            lines += ["", f"![{result['title']}]({plot.name})"]
    summary = out / "summary.md"
    summary.write_text("\n".join(lines) + "\n")
    return summary


_TABLE_HEAD = (
    "| Benchmark | Figure | Value | Baseline | Ratio | Target |",
    "|---|---|---|---|---|---|",
)


def table(out: Path) -> str:
    """The summary's machine line and headline table (figures with a target), for the README."""
    text = (out / "summary.md").read_text().splitlines()
    start = next(i for i, line in enumerate(text) if line.startswith("| Benchmark"))
    end = next((i for i in range(start, len(text)) if not text[i].startswith("|")), len(text))
    return "\n".join([text[2], "", *text[start:end]])


def _rows(result: dict, *, headline: bool) -> list[str]:
    """Table rows; the headline keeps the figures with a target (else the first figure)."""
    if "error" in result:
        return [f"| {result['title']} | failed (see below) | | | | |"]
    if "skipped" in result:
        return [f"| {result['title']} | not run here | | | | |"]
    rows = result["metrics"]
    if headline:
        rows = [m for m in rows if m["target"]] or rows[:1]
    return [
        f"| {result['title']} | {m['label']} | {_value(m['value'], m['unit'])} | "
        f"{_baseline(m)} | {_ratio(m['ratio'])} | {m['target'] or ''} |"
        for m in rows
    ]


def _error_line(error: str) -> str:
    """The line that names the error (a traceback's last "...Error: ..."), else the last."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    named = [line for line in lines if "Error" in line or "error:" in line]
    return (named or lines or ["?"])[-1]


def _value(value, unit: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float) and abs(value) >= 100:
        return f"{value:,.0f} {unit}"
    return f"{value:.3g} {unit}" if isinstance(value, float) else f"{value} {unit}"


def _baseline(m: dict) -> str:
    if m["baseline"] is None:
        return m["baseline_label"] or ""
    return f"{m['baseline_label']}: {_value(m['baseline'], m['unit'])}"


def _ratio(ratio) -> str:
    return "" if ratio is None else f"{ratio:.2f}"


def _plot(out: Path, result: dict) -> Path | None:
    rows = [m for m in result["metrics"] if m["ratio"] is not None]
    if not rows:
        return None
    figure, axes = plt.subplots(figsize=(6.4, 0.45 * len(rows) + 1.2), dpi=80)
    labels = [m["label"] for m in rows][::-1]
    ratios = [m["ratio"] for m in rows][::-1]
    axes.barh(labels, ratios, color="#4c72b0")
    axes.axvline(1.0, color="black", linewidth=0.8)
    axes.set_xlabel("ratio to baseline (1.0 = baseline)")
    axes.set_title(result["title"], fontsize=10)
    axes.tick_params(axis="y", labelsize=8)
    for y, ratio in enumerate(ratios):
        axes.text(ratio, y, f" {ratio:.2f}", va="center", fontsize=8)
    figure.tight_layout()
    path = out / f"{result['name']}.png"
    figure.savefig(path)
    plt.close(figure)
    return path
