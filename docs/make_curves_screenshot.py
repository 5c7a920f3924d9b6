"""Regenerate docs/img/report-curves.png: the demo's report, its "Model metrics" section, in headless Chromium.

    python docs/make_curves_screenshot.py [--steps 400]

Runs ``telemetrain demo --in-process --no-crash`` into a temporary store (CPU, a few seconds; nothing downloaded),
builds the report's model of the run, writes the section alone as a page (the report's own CSS and markup) and
screenshots it with ``chromium --headless --screenshot``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from telemetrain.report.curves_html import curves_section
from telemetrain.report.html import _CSS
from telemetrain.report.load import load_run
from telemetrain.report.model import build_model

OUT = Path(__file__).resolve().parent / "img" / "report-curves.png"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("needs chromium (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "telemetrain.cli", "demo", "--steps", str(args.steps), "--root", tmp,
                        "--in-process", "--no-crash", "--seed", "0"], check=True, capture_output=True)
        (run_dir,) = [p for p in Path(tmp).glob("*/*") if (p / "run.json").exists()]
        model = build_model(load_run(run_dir))
        shown = [c for c in model.curves if c.title in ("train/train.loss", "val/val.accuracy", "val/val.loss",
                                                         "train/train.lr")]
        page = Path(tmp) / "curves.html"
        page.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'><style>{_CSS}</style></head><body><main>"
                        f"<section><h2>Model metrics</h2>{curves_section(shown)}</section></main></body></html>")
        OUT.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1360,700", f"--screenshot={OUT}", page.as_uri()], check=True,
                       capture_output=True, timeout=120)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
