#!/usr/bin/python3
"""Draws bench results (results-MODE.json, from bench/run.exs) as a PNG.

usage: chart.py RESULTS.json OUT.png

One panel per metric, one bar per interceptor, each labelled with its value
and its ratio to direct; "n/a" where a metric does not apply (no proxy, or
h2 not offered).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"direct": "#9e9e9e", "condukt": "#1f77b4", "mitmproxy": "#ff7f0e", "squid": "#2ca02c"}
SHOWN = ["h1_rps", "h2_rps", "new_conns", "bulk_mb_s", "added_p50", "added_p99", "rss_per_conn", "rss_per_conn_h2"]


def main():
    data = json.load(open(sys.argv[1]))
    kinds = data["kinds"]
    metrics = {m["key"]: m for m in data["metrics"]}
    keys = [k for k in SHOWN if k in metrics]
    cols = 4
    rows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False)

    for ax, key in zip([a for r in axes for a in r], keys):
        m = metrics[key]
        values, labels = [], []
        direct = data["summary"].get("direct", {}).get(key)
        for kind in kinds:
            v = data["summary"][kind].get(key)
            if isinstance(v, (int, float)):
                values.append(v)
                ratio = ""
                if isinstance(direct, (int, float)) and direct and kind != "direct" and not key.startswith("added"):
                    ratio = f"\n{v / direct:.2f}× direct"
                labels.append(f"{v:,.0f}{ratio}" if abs(v) >= 100 else f"{v:,.1f}{ratio}")
            else:
                values.append(0)
                why = v.get("na", "") if isinstance(v, dict) else ""
                labels.append("n/a\n" + why.split(" (")[0] if why else "n/a")
        bars = ax.bar(kinds, values, color=[COLORS.get(k, "#777") for k in kinds])
        for bar, label in zip(bars, labels):
            ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=7)
        better = "higher is better" if m["better"] == "higher" else "lower is better"
        ax.set_title(f"{m['label']}\n({m['unit']}, {better})", fontsize=8)
        ax.tick_params(axis="x", labelsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.margins(y=0.25)

    for ax in [a for r in axes for a in r][len(keys):]:
        ax.axis("off")

    fig.suptitle(f"condukt-egress vs direct, mitmproxy, Squid ({data['mode']} mode, {data['date']})\n{data['machine']}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
