#!/usr/bin/python3
"""Draws the benchmark plots that cairnbench describes in plots.json.

Usage: plot.py PLOTS.json OUTDIR   (matplotlib, from Debian's python3-matplotlib)
"""
import json
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def draw(spec, outdir):
    panels = spec["panels"]
    if not panels:
        return
    n = len(panels)
    cols = min(n, 3 if spec["kind"] == "bars" else 2)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(max(6.5 * cols, 11), 4.3 * rows + (0 if spec["kind"] == "bars" else 1)), squeeze=False)
    names = []
    for p in panels:
        for s in p["series"]:
            if s["name"] not in names:
                names.append(s["name"])
    # native in black, cairn stacks in strong colours, peers and tools in
    # the paler ones.
    strong = plt.get_cmap("tab10")
    pale = plt.get_cmap("tab20")
    color, ns, np_ = {}, 0, 0
    for name in names:
        if name == "native":
            color[name] = "black"
        elif name.startswith("cairn"):
            color[name] = strong([0, 3, 2, 1, 4, 5, 6, 8, 9][ns % 9])
            ns += 1
        else:
            color[name] = pale([1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 0, 2, 4, 6, 8][np_ % 15])
            np_ += 1
    for idx, p in enumerate(panels):
        ax = axes[idx // cols][idx % cols]
        if spec["kind"] == "bars":
            labels = [s["name"] for s in p["series"]]
            y = [s["y"][0] for s in p["series"]]
            lo = [s["y"][0] - s["lo"][0] for s in p["series"]]
            hi = [s["hi"][0] - s["y"][0] for s in p["series"]]
            ax.bar(range(len(y)), y, yerr=[lo, hi], capsize=3,
                   color=[color[name] for name in labels])
            ax.set_xticks(range(len(y)))
            ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
        else:
            for s in p["series"]:
                style = "-" if s["name"] in ("native",) or s["name"].startswith("cairn") else "--"
                width = 2.2 if style == "-" else 1.2
                ax.errorbar(s["x"], s["y"], yerr=[[a - b for a, b in zip(s["y"], s["lo"])],
                                                   [b - a for a, b in zip(s["y"], s["hi"])]],
                            label=s["name"], color=color[s["name"]], linestyle=style,
                            linewidth=width, marker="o", markersize=3, capsize=2)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel(p.get("xlabel", ""))
            ax.grid(True, which="major", alpha=0.3)
        ax.set_title(p["title"], fontsize=10)
        ax.set_ylabel(p["ylabel"])
    for idx in range(n, rows * cols):
        axes[idx // cols][idx % cols].axis("off")
    if spec["kind"] != "bars":
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8)
        fig.suptitle(spec["title"])
        fig.tight_layout(rect=(0, 0.04 + 0.03 * math.ceil(len(labels) / 6), 1, 0.97))
    else:
        fig.suptitle(spec["title"])
        fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(f"{outdir}/{spec['file']}", dpi=90)
    plt.close(fig)


def main():
    specs = json.load(open(sys.argv[1]))
    for spec in specs:
        draw(spec, sys.argv[2])


if __name__ == "__main__":
    main()
