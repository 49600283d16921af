"""`rewardkit view` in a real headless browser: Chromium from the system's packages driven by Playwright
(never `playwright install`). Each report is opened from a file:// URL and checked against its input file:
rows, images and the numbers shown, sorting, filtering, the enlarged image, untrusted text rendered as text
(no dialog, no handler), a 10,000-row report's time to interactive, and axe-core's accessibility rules.

Without chromium (or Playwright, or axe-core for the accessibility test) these tests skip with the reason,
except in CI (CI=true), where .ci/install-system-deps.sh installs chromium and they must run.
Screenshots go to each test's tmp folder (``screenshots/``).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.view_rows import EXAMPLES, XSS, score_rows, write_jsonl

from rewardkit.view import build_report

pytestmark = pytest.mark.slow  # each test drives a browser

IN_CI = os.environ.get("CI", "").lower() == "true"
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
INTERACTIVE_BOUND_S = 5.0  # 10,000 rows; measured about 0.6 s on a 2-core CI machine (docs/view.md)


def _unavailable(reason: str):
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: .ci/install-system-deps.sh and the dev extra must provide it)")
    pytest.skip(reason)


def chromium_path() -> str | None:
    for p in (os.environ.get("REWARDKIT_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
              shutil.which("chromium-browser")):
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


@pytest.fixture(scope="module")
def browser():
    exe = chromium_path()
    if exe is None:
        _unavailable("chromium not found (apt-get install chromium, or set REWARDKIT_CHROMIUM)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install -e '.[dev]')")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="session")
def axe_js(tmp_path_factory) -> str:
    """axe-core's axe.min.js: $AXE_CORE_JS, the copy bundled by axe-playwright-python (`dev` extra), a cached
    npm install, or `npm install --prefix CACHE axe-core`."""
    env = os.environ.get("AXE_CORE_JS")
    if env and Path(env).is_file():
        return Path(env).read_text(encoding="utf-8")
    try:
        from importlib import resources

        bundled = resources.files("axe_playwright_python").joinpath("axe.min.js")
        if bundled.is_file():
            return bundled.read_text(encoding="utf-8")
    except ModuleNotFoundError:
        pass
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rewardkit-tests" / "axe"
    js = cache / "node_modules" / "axe-core" / "axe.min.js"
    if not js.is_file():
        npm = shutil.which("npm")
        if npm is None:
            _unavailable("axe-core not found and no npm to install it (set AXE_CORE_JS=.../axe.min.js)")
        cache.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(cache),
                            "axe-core@4"], capture_output=True, text=True, timeout=300)
        if r.returncode != 0 or not js.is_file():
            _unavailable(f"npm install axe-core failed: {r.stderr[-400:]}")
    return js.read_text(encoding="utf-8")


class Opened:
    """A report open in a page, with every dialog, page error and console error it caused."""

    def __init__(self, browser, html: Path, shots: Path):
        self.events: list[str] = []
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.page.on("dialog", lambda d: (self.events.append(f"dialog: {d.message}"), d.dismiss()))
        self.page.on("pageerror", lambda e: self.events.append(f"pageerror: {e}"))
        self.page.on("console", lambda m: self.events.append(f"console {m.type}: {m.text}")
                     if m.type in ("error", "warning") else None)
        self.page.on("request", lambda r: None if r.url.startswith(("file:", "data:")) else
                     self.events.append(f"request: {r.url}"))
        self.shots = shots
        shots.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        self.page.goto(html.resolve().as_uri())
        self.page.wait_for_selector("body[data-ready='1']", timeout=20000)
        self.load_s = time.perf_counter() - t0

    def shot(self, name: str) -> Path:
        p = self.shots / f"{name}.png"
        self.page.screenshot(path=str(p), full_page=True)
        return p

    def table_rows(self, table: str) -> list[list[str]]:
        return self.page.eval_on_selector_all(
            f"{table} tbody tr", "rows => rows.map(r => Array.from(r.cells).map(c => c.innerText.trim()))")

    def column(self, table: str, header: str) -> list[str]:
        idx = self.page.eval_on_selector_all(f"{table} thead th", "ths => ths.map(t => t.innerText.trim())")
        i = [h.rstrip(" ▲▼") for h in idx].index(header)
        return [r[i] for r in self.table_rows(table)]

    def images_loaded(self, selector: str) -> list[int]:
        return self.page.eval_on_selector_all(selector, "ims => ims.map(i => i.complete ? i.naturalWidth : -1)")


def fmt(x) -> str:
    """The page's number format (view.js fmt): 4 decimals, exponent form below 1e-3 or from 1e4."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if x == 0:
        return "0"
    if abs(x) >= 1e4 or abs(x) < 1e-3:
        m, e = f"{x:.3e}".split("e")
        return f"{m}e{int(e):+d}"  # (exact halves round differently in JS: not in these tests' data)
    return f"{x:.4f}"


def test_fmt_matches_javascript():
    assert [fmt(v) for v in (0.8125, -2e-05, 12346.0, None, 0)] == ["0.8125", "-2.000e-5", "1.235e+4", "–", "0"]


def _first_table(section: str) -> str:
    return f"section[data-kind='{section}'] table[data-rows]"


def test_score_report_shows_the_file_sorts_filters_and_escapes(browser, tmp_path):
    rows = score_rows(tmp_path)
    html = build_report([write_jsonl(tmp_path / "judge.jsonl", rows)], tmp_path / "report.html")
    o = Opened(browser, html, tmp_path / "screenshots")
    t = _first_table("scores")
    shown = o.table_rows(t)
    assert len(shown) == 3
    assert o.column(t, "prompt") == [r["prompt"] for r in rows]  # the markup is text
    assert o.column(t, "score") == [fmt(r["score"]) for r in rows]
    assert o.column(t, "alignment") == [fmt(r["dimensions"]["alignment"]) for r in rows]
    assert o.column(t, "quality") == [fmt(r["dimensions"]["quality"]) for r in rows]
    assert [c.split("\n")[0] for c in o.column(t, "valid")] == ["valid", "invalid", "valid"]
    assert rows[1]["error"] in o.column(t, "reason / rationale / judge answers")[1]
    assert "The apple is red." in o.column(t, "reason / rationale / judge answers")[0]
    assert o.images_loaded(f"{t} img") == [256, 256, 256]
    # nothing ran from the prompts or the judge answer: no dialog, no global, no injected element
    injected = "() => [window.__xss, document.querySelectorAll('img[src=x], main script').length]"
    assert o.page.evaluate(injected) == [None, 0]
    o.shot("scores")
    # sort by score: descending first (invalid last), then ascending
    o.page.click(f"{t} thead button[data-col=score]")
    assert o.column(t, "score") == [fmt(0.8125), fmt(-0.00002), "–"]
    assert o.page.get_attribute(f"{t} thead th:has(button[data-col=score])", "aria-sort") == "descending"
    o.page.click(f"{t} thead button[data-col=score]")
    assert o.column(t, "score") == [fmt(-0.00002), fmt(0.8125), "–"]
    o.page.click(f"{t} thead button[data-col=prompt]")
    assert o.column(t, "prompt") == sorted((r["prompt"] for r in rows), key=str.lower)
    # filter by text (prompt, reason, judge answers) and by validity
    o.page.fill("input[type=search]", "blurry")  # inside the first row's hypotheses
    o.page.wait_for_function("() => document.querySelectorAll('section[data-kind=scores] tbody tr').length === 1")
    assert o.column(t, "prompt") == [XSS[0]]
    o.page.fill("input[type=search]", "")
    o.page.select_option("select", "invalid")
    o.page.wait_for_function("() => document.querySelectorAll('section[data-kind=scores] tbody tr').length === 1")
    assert o.column(t, "prompt") == [XSS[1]]
    o.page.select_option("select", "valid")
    assert sorted(o.column(t, "prompt")) == sorted([XSS[0], XSS[2]])
    o.page.select_option("select", "all")
    # the judge answers: a table of hypotheses, built when opened
    o.page.click(f"{t} details summary")
    o.page.wait_for_function("() => document.querySelector('section[data-kind=scores] details table') !== null")
    assert "blurry" in o.page.inner_text(f"{t} details") and "<b>red</b>" in o.page.inner_text(f"{t} details")
    # click a thumbnail to enlarge it; Esc closes it and focus returns to the thumbnail
    o.page.click(f"{t} button.rk-thumb >> nth=0")
    assert o.page.evaluate("() => document.getElementById('rk-zoom').open")
    assert o.page.evaluate("() => document.getElementById('rk-zoom-img').naturalWidth") > 0
    assert XSS[1] in o.page.inner_text("#rk-zoom-caption") or XSS[0] in o.page.inner_text("#rk-zoom-caption")
    o.shot("scores-enlarged")
    o.page.keyboard.press("Escape")
    o.page.wait_for_function("() => !document.getElementById('rk-zoom').open", timeout=2000)
    o.page.wait_for_function("() => document.activeElement.classList.contains('rk-thumb')", timeout=2000)
    # keyboard: the sort headers are buttons
    o.page.focus(f"{t} thead button[data-col=n]")
    o.page.keyboard.press("Enter")
    assert o.page.get_attribute(f"{t} thead th:has(button[data-col=n])", "aria-sort") == "descending"
    assert o.events == [], o.events


def test_edit_rows_show_source_and_result_side_by_side(browser, tmp_path):
    edit = tmp_path / "edit.jsonl"
    for p in EXAMPLES.glob("edit_*.png"):
        shutil.copy(p, tmp_path / p.name)
    write_jsonl(edit, [{"image": str(tmp_path / f"edit_result_{c}_ball.png"), "prompt": f"make the ball {c}",
                        "score": s, "valid": True, "error": None,
                        "sources": [str(tmp_path / "edit_source_blue_ball.png")]}
                       for c, s in (("red", 1.25), ("green", -0.5))])
    html = build_report([edit], tmp_path / "r.html")
    # mailed: the page alone, somewhere else, the images and the JSONL gone
    (tmp_path / "mailbox").mkdir()
    mailed = shutil.copy(html, tmp_path / "mailbox" / "report.html")
    for p in [edit, *tmp_path.glob("*.png")]:
        p.unlink()
    o = Opened(browser, Path(mailed), tmp_path / "screenshots")
    t = _first_table("scores")
    figs = o.page.eval_on_selector_all(f"{t} tbody tr", "rows => rows.map(r => Array.from("
                                       "r.querySelectorAll('figure figcaption')).map(f => f.innerText))")
    assert figs == [["source", "result"], ["source", "result"]]
    assert o.images_loaded(f"{t} img") == [256] * 4
    assert o.column(t, "score") == ["1.2500", "-0.5000"]
    o.shot("edit")
    assert o.events == [], o.events


def test_folder_thumbnails_load_and_the_enlarged_view_links_the_original(browser, tmp_path):
    rows = score_rows(tmp_path)
    html = build_report([write_jsonl(tmp_path / "s.jsonl", rows)], tmp_path / "out" / "r.html", thumbs="folder")
    o = Opened(browser, html, tmp_path / "screenshots")
    t = _first_table("scores")
    srcs = o.page.eval_on_selector_all(f"{t} img", "ims => ims.map(i => i.getAttribute('src'))")
    assert srcs == ["r_files/i0.png", "r_files/i1.png", "r_files/i2.png"]  # beside the page, allowed by the CSP
    assert o.images_loaded(f"{t} img") == [256, 256, 256]
    o.page.click(f"{t} button.rk-thumb >> nth=2")
    assert o.page.get_attribute("#rk-zoom-link", "href") == "../t2i_open_sign.png"
    assert o.page.is_visible("#rk-zoom-link")
    o.page.keyboard.press("Escape")
    assert o.events == [], o.events


def test_two_rewards_side_by_side_with_ranks_and_scatter(browser, tmp_path):
    rows = score_rows(tmp_path)
    rows[1].update(score=0.1, valid=True, error=None)
    other = [dict(r, score=s) for r, s in zip(rows, (0.1, 0.2, 0.3))]
    html = build_report([write_jsonl(tmp_path / "clip.jsonl", rows), write_jsonl(tmp_path / "pick.jsonl", other)],
                        tmp_path / "r.html")
    o = Opened(browser, html, tmp_path / "screenshots")
    t = _first_table("rewards")
    assert o.column(t, "clip") == [fmt(r["score"]) for r in rows]
    assert o.column(t, "pick") == ["0.1000", "0.2000", "0.3000"]
    assert o.column(t, "rank (clip)") == ["1", "2", "3"] and o.column(t, "rank (pick)") == ["3", "2", "1"]
    assert o.column(t, "rank gap") == ["1.000 disagree", "0.000", "1.000 disagree"]
    assert o.page.eval_on_selector_all(f"{t} tbody tr", "rs => rs.map(r => r.className)") == [
        "rk-disagree", "", "rk-disagree"]
    assert o.page.inner_text("#rk-rho tbody") .split("\n")[0].split("\t")[-1] == "-1.000"
    pts = o.page.eval_on_selector_all("#rk-scatter circle.rk-pt", "cs => cs.map(c => c.getAttribute('data-n'))")
    assert sorted(pts) == ["1", "2", "3"]
    o.page.click(f"{t} thead button[data-col=gap]")
    assert o.column(t, "rank gap")[-1] == "0.000"
    o.shot("rewards")
    assert o.events == [], o.events


def test_bench_record_tables_and_wrong_pairs(browser, tmp_path, axe_js):
    from tests.helpers.bench_rewards import MeanPixel

    from rewardkit.bench import evaluate
    from rewardkit.bench.synthetic import write_synthetic_benchmarks

    write_synthetic_benchmarks(tmp_path / "data")
    res = evaluate(MeanPixel(), "mmrb2/t2i,genaibench/t2i", data_dir=tmp_path / "data", cache_dir=None,
                   n_boot=50, progress=False, wrong_examples=4)
    rec = res.save(tmp_path / "meanpixel.json")
    o = Opened(browser, build_report([rec], tmp_path / "r.html"), tmp_path / "screenshots")
    summary = o.table_rows("#rk-bench-summary")
    assert len(summary) == 1
    for b, cell in zip(("mmrb2/t2i", "genaibench/t2i"), summary[0][1:]):
        m = res[b].metrics[res[b].primary]
        assert cell.startswith(f"{100 * m.value:.2f} [{100 * m.ci[0]:.2f}, {100 * m.ci[1]:.2f}]")
    figs = o.page.query_selector_all("figure.rk-wrong-pair")
    assert len(figs) == 8
    assert all(w > 0 for w in o.images_loaded("figure.rk-wrong-pair img"))
    first = res["mmrb2/t2i"].wrong_pairs["pairs"][0]
    assert f"id {first['id']}: humans preferred {'A' if first['label'] == 1 else 'B'}, margin {fmt(first['margin'])}" \
        in figs[0].inner_text()
    o.shot("bench")
    assert o.events == [], o.events
    assert _axe(o, axe_js) == []


def _rl_run(root: Path) -> Path:
    from PIL import Image

    run = root / "run"
    run.mkdir()
    recs = [{"epoch": e, "reward/pickscore/mean": 0.1 * e, "reward/pickscore/std": 0.05, "policy_loss": 2 - 0.3 * e,
             "kl_div": 0.01 * e, "zero_std_group_ratio": 0.1} for e in range(1, 6)]
    recs += [{"epoch": e, "eval/reward/pickscore/mean": 0.05 + 0.12 * e} for e in (0, 2, 4)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    for e in (0, 2, 4):
        Image.new("RGB", (512, 256), (40 * e, 90, 160)).save(run / f"eval-epoch-{e:06d}.png")
    Image.new("RGB", (900, 300), (250, 250, 250)).save(run / "curves.png")
    return run


def test_rl_run_curves_and_grids(browser, tmp_path):
    o = Opened(browser, build_report([_rl_run(tmp_path)], tmp_path / "r.html"), tmp_path / "screenshots")
    charts = o.page.eval_on_selector_all("figure.rk-chart",
                                         "fs => fs.map(f => f.querySelector('figcaption').innerText)")
    assert charts[:3] == ["reward (train mean; evaluation of the EMA weights dashed)", "loss", "KL / deviation"]
    assert o.page.get_attribute("path[data-key='eval/reward/pickscore/mean']", "stroke-dasharray") == "6 4"
    assert o.page.get_attribute("path[data-key='eval/reward/pickscore/mean']", "stroke") == \
        o.page.get_attribute("path[data-key='reward/pickscore/mean']", "stroke")
    # the train reward line has one vertex per logged epoch
    d = o.page.get_attribute("figure.rk-chart path[data-key='reward/pickscore/mean']", "d")
    assert d.count("L") == 4 and d.startswith("M")
    assert "reward/pickscore/mean (last 0.5000)" in o.page.inner_text("figure.rk-chart >> nth=0")
    grids = o.page.eval_on_selector_all("details.rk-all-grids figure.rk-grid figcaption",
                                        "fs => fs.map(f => f.textContent)")
    assert grids == [f"epoch {e}: eval-epoch-{e:06d}.png" for e in (0, 2, 4)]
    o.page.click("details.rk-all-grids > summary")
    assert o.images_loaded("details.rk-all-grids figure.rk-grid img") == [512, 512, 512]
    o.shot("rl")
    assert o.events == [], o.events


def test_ten_thousand_rows_interactive_quickly(browser, tmp_path):
    rng = random.Random(0)
    shutil.copy(EXAMPLES / "t2i_red_apple.png", tmp_path / "a.png")
    rows = [{"image": str(tmp_path / "a.png"), "prompt": f"prompt {i} " + "word " * 8, "score": rng.gauss(0, 1),
             "valid": i % 17 != 0, "error": None if i % 17 else "no answer",
             "dimensions": {"a": rng.random(), "b": rng.random()},
             "rationale": "because " * 10} for i in range(10_000)]
    html = build_report([write_jsonl(tmp_path / "big.jsonl", rows)], tmp_path / "big.html")
    o = Opened(browser, html, tmp_path / "screenshots")
    t = _first_table("scores")
    t0 = time.perf_counter()
    o.page.click(f"{t} thead button[data-col=score]")
    first = o.column(t, "score")[0]
    sort_s = time.perf_counter() - t0
    best = max(r["score"] for r in rows if r["valid"])
    assert first == fmt(best)
    assert len(o.table_rows(t)) == 50
    assert "of 10000" in o.page.inner_text("section[data-kind=scores] .rk-status")
    total = o.load_s + sort_s
    print(f"10,000 rows: interactive after {o.load_s:.2f} s, first sort {sort_s:.3f} s")
    (tmp_path / "timing.txt").write_text(f"load {o.load_s:.3f} s, sort {sort_s:.3f} s\n")
    assert total < INTERACTIVE_BOUND_S, f"{total:.2f} s"
    assert o.events == [], o.events


def test_reports_pass_axe_core(browser, tmp_path, axe_js):
    rows = score_rows(tmp_path)
    rows2 = [dict(r, score=(r["score"] or 0) + 1, valid=True, error=None) for r in rows]
    pairs = write_jsonl(tmp_path / "compare.jsonl", [{"image_a": rows[0]["image"], "image_b": rows[2]["image"],
                                                      "prompt": "p", "prob_a": 0.7, "valid": True, "error": None}])
    html = build_report([write_jsonl(tmp_path / "a.jsonl", rows), write_jsonl(tmp_path / "b.jsonl", rows2), pairs,
                         _rl_run(tmp_path)], tmp_path / "all.html")
    o = Opened(browser, html, tmp_path / "screenshots")
    o.page.click("section[data-kind=scores] td.explain details summary >> nth=0")  # opened content is checked too
    o.page.click("section[data-kind=scores] details.rk-ranges > summary >> nth=0")  # and the range filters
    o.page.wait_for_function("() => document.querySelector('section[data-kind=scores] details table') !== null")
    o.shot("axe")
    result = _axe(o, axe_js)
    assert result == [], json.dumps(result, indent=1)
    o.page.click("section[data-kind=scores] button.rk-thumb >> nth=0")  # and with the enlarged image open
    assert _axe(o, axe_js) == []


def _axe(o: Opened, axe_js: str) -> list[dict]:
    """axe-core's violations on the page as it is now (every rule axe runs by default: WCAG 2 A / AA and
    best practices)."""
    if not o.page.evaluate("() => typeof window.axe !== 'undefined'"):
        o.page.evaluate(axe_js + "\n;0")  # CDP evaluation: the page's CSP does not apply to the test harness
    return o.page.evaluate("async () => { const r = await axe.run(document); "
                           "return r.violations.map(v => ({id: v.id, nodes: v.nodes.map(n => n.html).slice(0, 3)})); }")


# ---------------------------------------------------------------- issue 40: what W&B tables / FiftyOne users expect


def _best_of_n_rows(folder: Path) -> list[dict]:
    """Three prompts x three candidates (the example images), scores and one dimension; one invalid row."""
    for p in EXAMPLES.glob("t2i_*.png"):
        shutil.copy(p, folder / p.name)
    names = ["t2i_red_apple.png", "t2i_house_sunset.png", "t2i_open_sign.png"]
    rows = []
    for pi, prompt in enumerate(["a red apple", "a house at sunset", "an open sign"]):
        for ci, name in enumerate(names):
            score = float(3 * pi + (ci + pi) % 3)
            rows.append({"image": str(folder / name), "prompt": prompt, "score": score, "valid": True, "error": None,
                         "dimensions": {"quality": 10.0 - score}})
    rows[4].update(score=None, valid=False, error="judge gave no answer", dimensions={"quality": None})
    return rows


def test_gallery_group_by_prompt_and_value_range_filter(browser, tmp_path, axe_js):
    rows = _best_of_n_rows(tmp_path)
    html = build_report([write_jsonl(tmp_path / "bon.jsonl", rows)], tmp_path / "r.html")
    o = Opened(browser, html, tmp_path / "screenshots")
    sec = "section[data-kind='scores']"
    # gallery grid: one card per row, the score under each image, the same paging and filters
    o.page.select_option(f"{sec} select[id$='-l']", "gallery")
    cards = o.page.eval_on_selector_all(f"{sec} .rk-layout-gallery .rk-card .rk-score", "s => s.map(x => x.textContent)")
    assert cards == [fmt(r["score"]) if r["valid"] else "invalid" for r in rows]
    assert o.page.is_hidden(f"{sec} table[data-rows]")
    o.shot("gallery")
    assert _axe(o, axe_js) == []
    # grouped by prompt: best-of-N at a glance, each prompt's images side by side, best first, "best" marked
    o.page.select_option(f"{sec} select[id$='-l']", "group")
    groups = o.page.eval_on_selector_all(f"{sec} .rk-group", """gs => gs.map(g => ({
        prompt: g.querySelector('h3').textContent,
        scores: Array.from(g.querySelectorAll('.rk-score')).map(s => s.textContent),
        best: Array.from(g.querySelectorAll('.rk-badge')).length}))""")
    want = []
    for prompt in dict.fromkeys(r["prompt"] for r in rows):
        mine = sorted((r for r in rows if r["prompt"] == prompt), key=lambda r: -(r["score"] if r["valid"] else -1e9))
        want.append({"prompt": prompt, "scores": [fmt(r["score"]) if r["valid"] else "invalid" for r in mine],
                     "best": 1})
    assert groups == want
    assert "prompts 1\u20133 of 3" in o.page.inner_text(f"{sec} .rk-status")
    o.shot("grouped-by-prompt")
    assert _axe(o, axe_js) == []  # the new layouts pass axe-core too
    # a value range on the score column, with its histogram: rows outside are filtered out, in every layout
    o.page.click(f"{sec} details.rk-ranges > summary")
    bars = o.page.eval_on_selector_all(f"{sec} fieldset[data-key='score'] svg rect",
                                       "rs => rs.map(r => Number(r.getAttribute('data-count')))")
    assert len(bars) == 20 and sum(bars) == sum(r["valid"] for r in rows)
    o.page.fill(f"{sec} input[data-key='score'][data-bound='min']", "3")
    o.page.fill(f"{sec} input[data-key='score'][data-bound='max']", "5.5")
    o.page.select_option(f"{sec} select[id$='-l']", "table")
    o.page.wait_for_timeout(50)
    shown = [float(x) for x in o.column(f"{sec} table[data-rows]", "score")]
    assert shown == [r["score"] for r in rows if r["valid"] and 3 <= r["score"] <= 5.5]
    greyed = o.page.eval_on_selector_all(f"{sec} fieldset[data-key='score'] rect.rk-out", "rs => rs.length")
    assert 0 < greyed < 20
    o.shot("range-filter")
    assert o.events == [], o.events


def test_narrow_screen_enlarged_original_unreadable_label_and_nested_tables(browser, tmp_path):
    """390-px screen: the page does not overflow sideways (charts scale down); an embedded report enlarges an
    image to its full-resolution copy, not the thumbnail; a corrupt file says "unreadable"; the words of nested
    answer tables are never broken."""
    from PIL import Image

    big = tmp_path / "big.png"
    Image.new("RGB", (900, 600), (30, 120, 200)).save(big)
    (tmp_path / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    answers = [{"question": "Is there a red apple on the table?", "answer": "yes", "p_yes": 0.93},
               {"question": "Is the apple cut?", "answer": "no", "p_yes": 0.04}]
    rows = [{"image": str(big), "prompt": "a blue card", "score": 1.0, "valid": True, "error": None,
             "details": {"answers": answers}},
            {"image": str(tmp_path / "corrupt.png"), "prompt": "x", "score": None, "valid": False,
             "error": "not an image"}]
    html = build_report([write_jsonl(tmp_path / "s.jsonl", rows), _rl_run(tmp_path)], tmp_path / "r.html")
    o = Opened(browser, html, tmp_path / "screenshots")
    o.page.click("section[data-kind='scores'] button.rk-thumb")
    o.page.wait_for_function("() => document.getElementById('rk-zoom-img').complete")
    assert o.page.eval_on_selector("#rk-zoom-img", "i => i.naturalWidth") == 900  # not the 256-px thumbnail
    assert "(900\u00d7600)" in o.page.inner_text("#rk-zoom-caption")
    o.page.keyboard.press("Escape")
    assert "unreadable image corrupt.png" in o.page.inner_text("section[data-kind='scores']")
    o.page.click("section[data-kind='scores'] td.explain details > summary")
    o.page.wait_for_selector(".rk-nested td")
    cells = o.page.eval_on_selector_all(".rk-nested td", """tds => tds.filter(t => !/\\s/.test(t.textContent.trim()))
        .map(t => { const r = document.createRange(); r.selectNodeContents(t); return [t.textContent, r.getClientRects().length]; })""")
    assert cells and all(n == 1 for _t, n in cells), cells  # one line each: "yes", "0.93" never split
    o.page.set_viewport_size({"width": 390, "height": 844})
    o.page.wait_for_timeout(100)
    overflow = o.page.evaluate("() => document.documentElement.scrollWidth")
    charts = o.page.eval_on_selector_all("figure.rk-chart svg", "ss => ss.map(s => s.getBoundingClientRect().right)")
    assert overflow <= 390 and charts and max(charts) <= 390, (overflow, charts)
    o.shot("narrow-390")
    assert o.events == [], o.events


def test_rl_step_slider_and_dataset_scores_with_their_images(browser, tmp_path, tiny_clip_dir):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from rewardkit.cli import main

    run = _rl_run(tmp_path)
    data = tmp_path / "data.parquet"
    pq.write_table(pa.table({"prompt": ["an apple", "a sign"], "image": [
        (EXAMPLES / "t2i_red_apple.png").read_bytes(), (EXAMPLES / "t2i_open_sign.png").read_bytes()]}), data)
    assert main(["score", "--dataset", str(data), "-r", "clipscore", "-m", str(tiny_clip_dir), "--output",
                 str(tmp_path / "scores"), "--no-progress"]) == 0
    o = Opened(browser, build_report([run, tmp_path / "scores"], tmp_path / "r.html"), tmp_path / "screenshots")
    slider = "section[data-kind='rl'] input.rk-step"
    assert o.page.get_attribute(slider, "max") == "2"
    assert o.page.get_attribute(".rk-step-view figure.rk-grid", "data-epoch") == "4"  # the last step first
    for value, epoch in (("0", "0"), ("1", "2")):
        o.page.fill(slider, value)
        assert o.page.get_attribute(".rk-step-view figure.rk-grid", "data-epoch") == epoch
        assert o.page.inner_text(".rk-step-label").startswith(f"epoch {epoch}: eval-epoch-")
    assert o.images_loaded(".rk-step-view img") == [512]
    o.shot("rl-step-slider")
    sec = "section[data-kind='scores']"
    assert o.column(f"{sec} table[data-rows]", "prompt") == ["an apple", "a sign"]
    assert o.images_loaded(f"{sec} table[data-rows] img") == [256, 256]  # no "no image"
    assert "joined back to its image and prompt columns (image, prompt)" in o.page.inner_text(sec)
    o.shot("dataset-scores")
    assert o.events == [], o.events
