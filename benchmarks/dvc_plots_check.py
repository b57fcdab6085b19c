"""Look at `dvc plots show` as a person would, with the network unplugged: run it as the README says, open
dvc_plots/index.html in headless Chromium with no network, and check that every declared plot is drawn.

    python -m benchmarks.dvc_plots_check              # writes outputs/ui_check/dvc_plots.png (the whole page)
    python -m benchmarks.dvc_plots_check --out DIR

No network: Chromium runs under `unshare -n` (a network namespace with nothing in it; needs root or user
namespaces), else with every host name unresolvable (--host-resolver-rules). Needs Chromium (Debian: apt-get install
chromium). Exits 1 if a plot `dvc plots show --json` names is missing from the page or drawn 0 px tall (a vega plot
without its <svg>/<canvas>, an image that did not load), or if the page loads anything over the network.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "dvc_plots" / "index.html"
PROBE_ID = "speclab-plot-check"
# Run once the page's scripts have: each plot div's height, its vega drawing (svg/canvas) and images, and every
# resource the page fetched, written into the page for --dump-dom.
PROBE = """
<script>
window.addEventListener("load", function () {
  setTimeout(function () {
    var plots = {};
    document.querySelectorAll("body > div[id]").forEach(function (div) {
      var drawing = div.querySelector("svg.marks, canvas.marks, canvas");
      plots[div.id] = {
        height: div.getBoundingClientRect().height,
        drawing: drawing ? drawing.getBoundingClientRect().height : 0,
        marks: div.querySelectorAll(".role-mark").length,
        images: Array.prototype.map.call(div.querySelectorAll("img"), function (i) {
          return i.complete ? i.naturalHeight : 0; })
      };
    });
    var pre = document.createElement("pre");
    pre.id = "%s";
    pre.textContent = JSON.stringify({page_height: document.documentElement.scrollHeight, plots: plots,
      resources: performance.getEntriesByType("resource").map(function (e) { return e.name; })});
    document.body.appendChild(pre);
  }, 3000);
});
</script>
""" % PROBE_ID
# A tag that fetches from the network when the page loads (a link in an <a> or a URL in a script's text does not).
NETWORK_LOAD = re.compile(r"<(?:script|img|link|iframe|embed|object|source)\b[^>]*?\b(?:src|href|data)\s*=\s*"
                          r"[\"']?\s*(?:https?:)?//", re.I)
CSS_LOAD = re.compile(r"@import|url\(\s*[\"']?\s*(?:https?:)?//", re.I)


def html_id(name: str) -> str:
    """The id DVC gives a plot's div (dvc_render.base.Renderer.remove_special_chars)."""
    return name.translate({ord(c): "_" for c in r"!@#$%^&*()[]{};,<>?\/:.|`~=_+ "})


def network_loads(html: str) -> list[str]:
    """What in the page would be fetched over the network (empty for a page that renders offline)."""
    return [m.group(0)[:120] for m in NETWORK_LOAD.finditer(html)] + [m.group(0) for m in CSS_LOAD.finditer(html)]


def offline_prefix() -> tuple[list[str], str]:
    """How to run Chromium with no network: `unshare -n` where it works, else nothing (host names are unresolvable
    either way, by --host-resolver-rules)."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        return [unshare, "-n"], "no network namespace (unshare -n)"
    return [], "host names unresolvable (--host-resolver-rules)"


def chromium_cmd(chromium: str, width: int, height: int) -> list[str]:
    prefix, _ = offline_prefix()
    return [*prefix, chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--host-resolver-rules=MAP * ~NOTFOUND", "--no-first-run", "--disable-background-networking",
            f"--window-size={width},{height}", "--virtual-time-budget=10000", "--allow-file-access-from-files"]


def dvc_bin() -> str:
    local = ROOT / ".venv" / "bin" / "dvc"
    return str(local) if local.exists() else (shutil.which("dvc") or "dvc")


def check(measured: dict, names: list[str]) -> dict[str, str]:
    """Per declared plot: '' when drawn, else why not."""
    problems = {}
    for name in names:
        plot = measured["plots"].get(html_id(name))
        if plot is None:
            problems[name] = "not on the page"
        elif plot["height"] <= 0:
            problems[name] = "0 px tall"
        elif plot["images"] and min(plot["images"]) <= 0:
            problems[name] = "an image did not load"
        elif not plot["images"] and plot["drawing"] <= 0:
            problems[name] = "no vega drawing (svg/canvas 0 px tall or absent)"
        else:
            problems[name] = ""
    return problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "outputs" / "ui_check"))
    ap.add_argument("--width", type=int, default=1600, help="window width (px): the widest figure fits")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not chromium:
        raise SystemExit("dvc_plots_check: Chromium not found: apt-get install chromium")
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    listed = subprocess.run([dvc_bin(), "plots", "show", "--json"], cwd=ROOT, env=env, check=True,
                            capture_output=True, text=True)
    names = sorted(json.loads(listed.stdout)["data"])
    subprocess.run([dvc_bin(), "plots", "show"], cwd=ROOT, env=env, check=True, capture_output=True)  # the README's
    html = PAGE.read_text(encoding="utf-8")
    loads = network_loads(html)
    probe = PAGE.with_name(".check.html")  # beside index.html, so the images' relative paths hold
    end = html.rindex("</body>")  # the last: vega-embed's own code holds the string "</body>"
    probe.write_text(html[:end] + PROBE + html[end:], encoding="utf-8")
    try:
        dom = subprocess.run([*chromium_cmd(chromium, args.width, 6000), "--dump-dom", probe.as_uri()],
                             check=True, capture_output=True, text=True, timeout=180).stdout
    finally:
        probe.unlink()
    found = re.search(rf'<pre id="{PROBE_ID}">(.*?)</pre>', dom, re.S)
    if not found:
        raise SystemExit("dvc_plots_check: the page's scripts did not run to the end (no measurements)")
    measured = json.loads(found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                          .replace("&amp;", "&"))
    fetched = [r for r in measured["resources"] if re.match(r"(https?:)?//", r)]
    problems = check(measured, names)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    png = out / "dvc_plots.png"
    height = max(600, min(int(measured["page_height"]) + 20, 30000))
    subprocess.run([*chromium_cmd(chromium, args.width, height), f"--screenshot={png}", PAGE.as_uri()],
                   check=True, capture_output=True, timeout=180)
    drawn = [n for n, why in problems.items() if not why]
    print(f"dvc_plots_check: {offline_prefix()[1]}; {PAGE.relative_to(ROOT)}")
    for name in names:
        plot = measured["plots"].get(html_id(name), {})
        print(f"  {'ok  ' if not problems[name] else 'FAIL'} {name}: {plot.get('height', 0):.0f} px"
              + (f" ({problems[name]})" if problems[name] else ""))
    print(f"dvc_plots_check: {len(drawn)} of {len(names)} declared plots drawn; network loads in the page: "
          f"{loads or 'none'}; fetched over the network: {fetched or 'none'}; screenshot {png} "
          f"({args.width}x{height})")
    sys.exit(1 if len(drawn) < len(names) or loads or fetched else 0)


if __name__ == "__main__":
    main()
