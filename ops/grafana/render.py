#!/usr/bin/env python3
"""Draws the panels of ops/grafana/parsley.json from a Prometheus, without Grafana.

Every panel's own PromQL expressions are evaluated by Prometheus' HTTP API
(/api/v1/query_range for time series, /api/v1/query for stat panels) over a time window,
and drawn with matplotlib in the dashboard's grid layout, with each panel's title, unit and
legend. Grafana's variables are replaced as Grafana would with every stage selected:
$stage by `.*`, $__rate_interval by --rate-interval, $__range by the window's length.

This is a picture of what the dashboard's queries return, not a Grafana screenshot: the
styling is matplotlib's.

    pip install matplotlib
    python3 ops/grafana/render.py --prometheus http://127.0.0.1:9090 \
        --start 1700000000 --end 1700000300 --out book/src/images/dashboard.png

Needs only the Python standard library and matplotlib.
"""

import argparse
import json
import math
import time
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent

# Grafana unit ids used by the dashboard, and the suffix each shows.
UNITS = {
    "s": "s",
    "recps": "rec/s",
    "ops": "ops/s",
    "short": "",
    "none": "",
}


def query(prometheus, path, params):
    url = f"{prometheus}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as answer:
        body = json.load(answer)
    if body.get("status") != "success":
        raise SystemExit(f"{url}: {body}")
    return body["data"]["result"]


def substitute(expr, rate_interval, range_secs):
    return (
        expr.replace("$__rate_interval", rate_interval)
        .replace("$__range", f"{int(range_secs)}s")
        .replace('"$stage"', '".*"')
    )


def legend(fmt, labels):
    if not fmt or fmt == "__auto":
        return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "value"
    out = fmt
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    return out


def human(value, unit):
    """A value as Grafana would show it, roughly: seconds scaled to ms/µs, large counts k/M."""
    if value is None or math.isnan(value):
        return "–"
    if unit == "s":
        if value == 0:
            return "0 s"
        if abs(value) < 1e-3:
            return f"{value * 1e6:.0f} µs"
        if abs(value) < 1:
            return f"{value * 1e3:.1f} ms"
        if abs(value) < 120:
            return f"{value:.2f} s"
        return f"{value / 60:.1f} min"
    suffix = UNITS.get(unit, "")
    for scale, letter in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{letter} {suffix}".strip()
    if value == int(value):
        return f"{int(value)} {suffix}".strip()
    return f"{value:.2f} {suffix}".strip()


def axis_formatter(unit):
    return matplotlib.ticker.FuncFormatter(lambda v, _pos: human(v, unit))


def parse_step(step):
    """Seconds of a step such as `2s` or `1m`."""
    factor = {"s": 1, "m": 60, "h": 3600}.get(step[-1])
    return float(step[:-1]) * factor if factor else float(step)


def range_series(prometheus, expr, start, end, step):
    """Each series of `expr` over the window: (labels, times, values), NaN for no sample."""
    params = {"query": expr, "start": start, "end": end, "step": step}
    out = []
    for series in query(prometheus, "/api/v1/query_range", params):
        points = [(float(t), float(v)) for t, v in series["values"]]
        if points:
            # Where a series has no sample (no stage running, no scrape) the line breaks, as
            # Grafana's does, instead of joining the points either side of the gap.
            gap = 2.5 * parse_step(step)
            times, values = [], []
            for n, (t, v) in enumerate(points):
                if n and t - points[n - 1][0] > gap:
                    times.append(datetime.fromtimestamp(t - 1))
                    values.append(float("nan"))
                times.append(datetime.fromtimestamp(t))
                values.append(v if math.isfinite(v) else float("nan"))
            out.append((series["metric"], times, values))
    return out


def draw_stat(ax, panel, prometheus, start, end, step, rate_interval, range_secs):
    # As Grafana's stat panel: the range query's last non-null value, over a sparkline.
    unit = panel["fieldConfig"]["defaults"].get("unit", "")
    found = []
    for target in panel["targets"]:
        expr = substitute(target["expr"], rate_interval, range_secs)
        found.extend(range_series(prometheus, expr, start, end, step))
    last = float("nan")
    if found:
        _, times, values = found[0]
        last = next((v for v in reversed(values) if not math.isnan(v)), float("nan"))
        spark = ax.twinx()
        spark.fill_between(times, values, alpha=0.15, color="#1f6f43", linewidth=0)
        spark.set_ylim(bottom=0)
        spark.set_axis_off()
    text = human(last, unit) if found else "No data"
    ax.text(0.5, 0.45, text, ha="center", va="center", fontsize=20, weight="bold",
            color="#1f6f43", transform=ax.transAxes, zorder=3)
    ax.set_xticks([])
    ax.set_yticks([])


def draw_timeseries(ax, panel, prometheus, start, end, step, rate_interval, range_secs):
    unit = panel["fieldConfig"]["defaults"].get("unit", "")
    drawn = 0
    idle = []
    for target in panel["targets"]:
        expr = substitute(target["expr"], rate_interval, range_secs)
        for labels, times, values in range_series(prometheus, expr, start, end, step):
            name = legend(target.get("legendFormat"), labels)
            known = [v for v in values if not math.isnan(v)]
            if not known:
                continue
            last = known[-1] if known else float("nan")
            peak = max(known, default=float("nan"))
            # Grafana leaves a gap where a series has no sample: so does the picture.
            if peak == 0 and min(known) == 0:
                ax.plot(times, values, linewidth=1.0, color="grey", alpha=0.6)
                idle.append(name)
            else:
                label = f"{name}   last {human(last, unit)}   max {human(peak, unit)}"
                ax.plot(times, values, linewidth=1.3, label=label)
            drawn += 1
    if idle:
        # Series at zero throughout share one legend line (Grafana lists each).
        shown = ", ".join(idle[:3]) + (f" and {len(idle) - 3} more" if len(idle) > 3 else "")
        text = f"0 throughout: {shown}"
        ax.plot([], [], color="grey", label=text if len(text) <= 75 else text[:72] + "…")
    if drawn == 0:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes, color="grey")
    ax.yaxis.set_major_formatter(axis_formatter(unit))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))
    ax.xaxis.set_major_locator(mdates.MinuteLocator())
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    if panel["fieldConfig"]["defaults"].get("min") == 0:
        ax.set_ylim(bottom=0)
    if drawn and not ax.get_legend_handles_labels()[0][: drawn - len(idle)]:
        ax.set_ylim(0, 1)
    if drawn:
        ax.legend(fontsize=7, loc="upper left", frameon=True, framealpha=0.85)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dashboard", default=str(HERE / "parsley.json"))
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090")
    parser.add_argument("--start", type=float, help="Unix seconds (default: --end less 15 min)")
    parser.add_argument("--end", type=float, help="Unix seconds (default: now)")
    parser.add_argument("--step", default="2s", help="query_range resolution")
    parser.add_argument(
        "--rate-interval",
        default="10s",
        help="what $__rate_interval stands for (Grafana: at least four scrape intervals)",
    )
    parser.add_argument("--out", default="dashboard.png")
    parser.add_argument("--dpi", type=int, default=90)
    args = parser.parse_args()

    end = args.end or time.time()
    start = args.start or end - 900
    range_secs = end - start
    dashboard = json.loads(Path(args.dashboard).read_text())
    panels = [p for p in dashboard["panels"]]
    for p in dashboard["panels"]:
        panels.extend(p.get("panels", []))
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)

    # One grid unit: 24 columns across, Grafana's row height about 30 px.
    unit_w, unit_h = 0.75, 0.42
    fig = plt.figure(figsize=(24 * unit_w, rows * unit_h + 0.8))
    when = f"{datetime.fromtimestamp(start):%Y-%m-%d %H:%M:%S} to {datetime.fromtimestamp(end):%H:%M:%S}"
    fig.suptitle(
        f"{dashboard['title']}: the dashboard's queries evaluated by Prometheus, {when} "
        f"(stage = All, $__rate_interval = {args.rate_interval})",
        fontsize=11,
        x=0.01,
        ha="left",
    )
    top = 1 - 0.8 / (rows * unit_h + 0.8)
    for panel in sorted(panels, key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"])):
        g = panel["gridPos"]
        left, width = g["x"] / 24, g["w"] / 24
        height = g["h"] / rows * top
        bottom = top - (g["y"] + g["h"]) / rows * top
        if panel["type"] == "row":
            fig.text(left + 0.005, bottom + height / 2, panel["title"], fontsize=11, weight="bold", va="center")
            continue
        pad_x, pad_top, pad_bottom = 0.048, 0.03, 0.02
        ax = fig.add_axes(
            [left + pad_x, bottom + pad_bottom, width - 1.25 * pad_x, height - pad_top - pad_bottom]
        )
        unit = panel["fieldConfig"]["defaults"].get("unit", "")
        shown = UNITS.get(unit, unit)
        ax.set_title(f"{panel['title']}" + (f"  ({shown})" if shown else ""), fontsize=9, loc="left")
        if panel["type"] == "stat":
            draw_stat(ax, panel, args.prometheus, start, end, args.step, args.rate_interval, range_secs)
        else:
            draw_timeseries(ax, panel, args.prometheus, start, end, args.step, args.rate_interval, range_secs)
    fig.savefig(args.out, dpi=args.dpi)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
