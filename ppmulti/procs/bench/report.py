"""``ppmulti bench``'s outputs: the markdown table, the PNG (matplotlib Agg) and the JSON of one measuring run."""

from __future__ import annotations

import json
from pathlib import Path

from ppmulti.common.atomic import atomic_save, atomic_write_text


def markdown(result: dict) -> str:
    plan, machine = result["plan"], result["machine"]
    lines = ["## ppmulti bench", "",
             f"{machine['cores']} cores, load {machine['load_1min']:.1f} at the end; images "
             f"{plan['img']} px{' (one size, no multi-scale)' if plan.get('one_size') else ''}, "
             f"global batch {plan['batch']} (split across ranks), {plan['steps']} steps per case of which the "
             f"first {plan['warmup']} are left out, worker_num {plan['workers']}, median of {plan['repeat']} "
             f"interleaved round(s).", ""]
    busiest = max(machine["load_1min"], machine.get("load_start", 0.0))
    if busiest > machine["cores"]:
        lines += [f"**The machine was busy** (load average up to {busiest:.1f} on {machine['cores']} cores, "
                  "measured at the start and end): other work shared the cores, so these figures are provisional; "
                  "only ratios of neighbouring cases mean much, and `--repeat 3` or more helps.", ""]
    lines += ["| model | ranks | threads/rank | images/s | speed-up | step | launch to first step | "
             "peak RSS per rank | CPU busy (rank 0) | data wait/step |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        speed = f"{r['speedup']:.2f}x" if "speedup" in r else "1.00x"
        rss = " / ".join(f"{v:.0f} MB" for v in r["peak_rss_mb"])
        lines.append(f"| {r['model']} | {r['ranks']} | {r['threads']} | {r['img_s']:.2f} | {speed} | "
                     f"{r['step_s'] * 1e3:.0f} ms | {r['launch_to_first_step_s']:.1f} s | {rss} | "
                     f"{r['cpu_util']:.2f} cores | {r['data_wait_s'] * 1e3:.0f} ms |")
    p, ld = result["ppdet"], result["loader"]
    lines += ["", "| comparison | measured | ratio | goal |", "| --- | --- | --- | --- |",
              f"| ppmulti loop vs ppdet's Trainer ({p['model']}, 1 rank; {' / '.join(p.get('conv_kernels', []))}) | "
              f"{p['ppmulti_img_s']:.2f} vs "
              f"{p['ppdet_img_s']:.2f} img/s | {p['ratio']:.2f} | >= 0.97 |",
              f"| data loader alone vs what the model consumes ({ld['model']}, worker_num {ld['worker_num']}) | "
              f"{ld['loader_img_s']:.1f} vs {ld['model_img_s']:.2f} img/s | {ld['ratio']:.1f}x | >= 3x |"]
    for r in result["rows"]:
        if r["ranks"] == 2 and "speedup" in r:
            one = r["img_s"] / r["speedup"] if r["speedup"] else 0
            lines.append(f"| 2 ranks vs 1 ({r['model']}) | {r['img_s']:.2f} vs {one:.2f} img/s | "
                         f"{r['speedup']:.2f}x | >= 1.7x |")
    if "allreduce" in result:
        a = result["allreduce"]
        lines.append(f"| gloo all-reduce of {a['model']}'s gradients ({a['bytes'] / 1e6:.1f} MB, {a['ranks']} ranks) | "
                     f"{a['seconds'] * 1e3:.1f} ms ({a['effective_GB_s']:.2f} GB/s bus) | "
                     f"{a['share_of_step']:.1%} of a step | |")
    if "heartbeat" in result:
        h = result["heartbeat"]
        lines.append(f"| watchdog progress reports ({h['model']}, {h['ranks']} ranks): step with vs without | "
                     f"{h['step_s_with']:.3f} vs {h['step_s_without']:.3f} s ({h['overhead']:+.1%}); "
                     f"{h['beats_per_step']:.0f} reports x {h['beat_us']:.2f} us | "
                     f"{h['beat_share_of_step']:.4%} of a step | <= 1% |")
    if "bound" in result:
        b = result["bound"]
        lines += ["", f"CPU per image: training {b['train_cpu_s_per_img'] * 1e3:.0f} ms (rank 0, one thread), "
                  f"loading {ld['cpu_s_per_img'] * 1e3:.0f} ms. With {b['ranks']} ranks on {b['ranks']} cores every "
                  f"image's compute and loading share those cores: at most {b['speedup']:.2f}x one rank "
                  f"(loading = {b['load_over_compute']:.0%} of compute), whatever else is tuned."]
    return "\n".join(lines) + "\n"


def figure(result: dict, path: Path) -> None:
    """Images/s per model and rank count, and the three ratios against their goals."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax, bx = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    models = list(dict.fromkeys(r["model"] for r in result["rows"]))
    ranks = sorted({r["ranks"] for r in result["rows"]})
    width = 0.8 / max(1, len(ranks))
    for j, n in enumerate(ranks):
        values = [next((r["img_s"] for r in result["rows"] if r["model"] == m and r["ranks"] == n), 0.0)
                  for m in models]
        ax.bar([i + j * width for i in range(len(models))], values, width, label=f"{n} rank(s)")
    ax.set_xticks([i + width * (len(ranks) - 1) / 2 for i in range(len(models))], models)
    ax.set_ylabel("images/s (global)")
    ax.set_title("training throughput")
    ax.legend()
    names, values, goals = [], [], []
    names.append("loop / ppdet")
    values.append(result["ppdet"]["ratio"])
    goals.append(0.97)
    for r in result["rows"]:
        if "speedup" in r:
            names.append(f"{r['model']} {r['ranks']}r/1r")
            values.append(r["speedup"])
            goals.append(1.7 if r["ranks"] == 2 else float(r["ranks"]) * 0.85)
    names.append("loader / model")
    values.append(result["loader"]["ratio"])
    goals.append(3.0)
    bx.bar(range(len(names)), values, color="tab:blue", label="measured")
    bx.scatter(range(len(names)), goals, color="tab:red", marker="_", s=600, label="goal", zorder=3)
    bx.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    bx.set_yscale("log")   # the loader ratio is 10-30x, the others near 1
    bx.set_title("ratios against goals (log scale)")
    bx.legend()
    fig.tight_layout()
    atomic_save(path, lambda tmp: fig.savefig(tmp, format="png"))


def write(result: dict, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / "bench.md", "json": out / "bench.json", "png": out / "bench.png"}
    atomic_write_text(paths["md"], markdown(result))
    atomic_write_text(paths["json"], json.dumps(result, indent=1) + "\n")
    figure(result, paths["png"])
    return paths
