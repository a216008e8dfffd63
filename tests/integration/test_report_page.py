"""report.html as a page a researcher would share (#51 item 1), in a real headless browser: Debian's chromium
(dev.sh installs it) driven by playwright by its path, once, at 1280 and at 420 px, on a finished sweep the test
writes (``sweepgen``: run folders, a step-0 baseline, claims; one run folder with a name klsweep did not make).
Measured in the browser: the page no wider than the window (tables scroll inside their own box), every figure
loaded and no wider than the page, no console error, nothing fetched but the file itself, every link resolving
(a section's anchor, a file beside the report, a run's folder), the table of contents, the claims table, the
methods folded under each table and no section empty by construction; report.md in the same order with the
same links. Screenshots of both widths go to the folder the test prints ($KLSWEEP_SCREENSHOTS, else a new
temporary folder)."""

from __future__ import annotations

import html
import os
import re
import shutil
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import sweepgen

from klsweep import report as rp
from klsweep.report import render

CI = os.environ.get("CI") == "true"
WIDTHS = (1280, 420)
ODD_RUN = 'run #1 "odd" <name>?'  # a run folder's name that a link must quote

CLAIMS = """claims:
  - name: "(a) k1 in the loss behaves like no KL: in-domain accuracy"
    metric: in_domain
    test: tost
    direction: equivalent
    margin: 0.05
    a: {kl.estimator: k1, kl.placement: loss, offpolicy.lag: 0, kl.beta: 0.1}
    b: {kl.beta: 0, offpolicy.lag: 0}
  - name: "(b) unbiased KL configurations do better on-policy: in-domain"
    metric: in_domain
    test: welch
    direction: greater
    a: {unbiased: true, offpolicy.lag: 0, kl.beta: 0.1}
    b: {unbiased: false, offpolicy.lag: 0, kl.beta: 0.1}
"""

# what the page measures of itself once loaded (its figures decoded)
MEASURE = """() => {
  const firstText = document.querySelector('h1 ~ p, h1 ~ div p');  // the summary's first line
  const outside = p => !p.closest('details, figure, .summary, nav');
  return {
    window: window.innerWidth,
    page: document.documentElement.scrollWidth,
    viewport: document.querySelector('meta[name=viewport]')?.content ?? null,
    textLeft: firstText.getBoundingClientRect().left,
    textWidth: firstText.getBoundingClientRect().width,
    fontSize: parseFloat(getComputedStyle(firstText).fontSize),
    images: [...document.images].map(i => ({natural: i.naturalWidth, shown: i.getBoundingClientRect().width,
                                            right: i.getBoundingClientRect().right})),
    boxes: [...document.querySelectorAll('.scroll')].map(b => ({
      section: b.closest('section')?.id, right: b.getBoundingClientRect().right, overflow: b.scrollWidth > b.clientWidth,
      scroll: getComputedStyle(b).overflowX})),
    links: [...document.querySelectorAll('a[href]')].map(a => [a.getAttribute('href'), a.href]),
    ids: [...document.querySelectorAll('[id]')].map(e => e.id),
    sections: [...document.querySelectorAll('main > section')].map(s => ({
      id: s.id, title: s.querySelector('h2').textContent, tables: s.querySelectorAll('table').length,
      details: s.querySelectorAll('details').length,
      words: [...s.querySelectorAll('p, li')].filter(outside).map(p => p.textContent.split(/\\s+/).length)})),
    toc: [...document.querySelectorAll('nav.toc a')].map(a => a.getAttribute('href')),
    claims: document.querySelectorAll('#claims table tbody tr').length,
  };
}"""


def _browser() -> str:
    """Debian's chromium and playwright to drive it: a failure under CI (dev.sh installs both), else a skip."""
    path = shutil.which("chromium")
    missing = "chromium (Debian: apt-get install chromium)" if path is None else None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing = "playwright (the test extra: pip install -e '.[test]')"
    if missing:
        if CI:
            pytest.fail(f"{missing} missing: ./dev.sh test installs it")
        pytest.skip(f"{missing} not installed")
    return path


def _sweep(root: Path) -> tuple[Path, Path]:
    """The shape of sweeps/tiny.yaml (14 configurations) x 2 seeds, finished and evaluated, one run folder
    renamed to ``ODD_RUN``; and a claims file for it."""
    sweep = sweepgen.write_sweep(root / "tiny", sweepgen.tiny_grid(), seeds=2)
    first = sorted(p for p in sweep.iterdir() if (p / "config.yaml").is_file())[0]
    first.rename(sweep / ODD_RUN)
    claims = root / "claims.yaml"
    claims.write_text(CLAIMS)
    return sweep, claims


def _shots_folder() -> Path:
    """$KLSWEEP_SCREENSHOTS, else a new folder of its own in the temporary directory (pytest's own are
    removed after three runs, and a reader looks later)."""
    named = os.environ.get("KLSWEEP_SCREENSHOTS")
    if not named:
        return Path(tempfile.mkdtemp(prefix="klsweep-report-page-"))
    Path(named).mkdir(parents=True, exist_ok=True)
    return Path(named)


def _check_link(href: str, url: str, ids: list[str], sweep: Path) -> str | None:
    """What is wrong with a link of the page (None: it resolves): an anchor to an id of the page, else a
    relative link to a file or folder that exists, inside the sweep's folder."""
    if href.startswith("#"):
        return None if href[1:] in ids else f"{href}: no such id"
    parts = urlsplit(url)
    if urlsplit(href).scheme or href.startswith("/"):
        return f"{href}: not relative to the report's folder"
    if parts.scheme != "file" or parts.query or parts.fragment:
        return f"{href} -> {url}: not a plain relative file link"
    target = Path(unquote(parts.path))
    if not target.exists():
        return f"{href} -> {target}: does not exist"
    if not target.resolve().is_relative_to(sweep.resolve()):
        return f"{href} -> {target}: outside the sweep"
    return None


def test_report_html_is_a_page_in_a_browser(tmp_path, capsys):
    chromium = _browser()
    from playwright.sync_api import sync_playwright

    sweep, claims = _sweep(tmp_path)
    report = rp.build_report(sweep, claims=claims, wandb=False)
    page_file = report.out_dir / "report.html"
    shots = _shots_folder()
    measured, problems, fetched = {}, [], []
    with sync_playwright() as p:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []  # root: chromium's sandbox refuses to start
        browser = p.chromium.launch(executable_path=chromium, args=args)
        try:
            for width in WIDTHS:
                page = browser.new_page(viewport={"width": width, "height": 900})
                page.on(
                    "console",
                    lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
                )
                page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
                page.on("request", lambda r: fetched.append(r.url))
                page.goto(page_file.as_uri(), wait_until="load")
                measured[width] = page.evaluate(MEASURE)
                page.screenshot(path=str(shots / f"report-{width}px.png"), full_page=True)
                page.close()
        finally:
            browser.close()
    with capsys.disabled():
        print(f"\nreport.html screenshots ({', '.join(f'{w} px' for w in WIDTHS)}): {shots}")

    assert not problems, problems
    assert fetched == [page_file.as_uri()] * len(WIDTHS), fetched  # the file itself: nothing else fetched
    for width, m in measured.items():
        assert m["viewport"] == "width=device-width, initial-scale=1"
        assert m["window"] == width and m["page"] <= width, (width, m["page"])  # never wider than the window
        assert m["textLeft"] >= 12, (width, m["textLeft"])  # text not flush at x = 0
        assert m["textWidth"] <= 60 * m["fontSize"], (width, m["textWidth"])  # a readable measure
        assert m["fontSize"] >= 14, (width, m["fontSize"])
        assert len(m["images"]) == 2, m["images"]
        for image in m["images"]:  # both figures decoded, scaled into the page
            assert image["natural"] > 0 and 0 < image["shown"] <= image["natural"] and image["right"] <= width
        assert {b["section"] for b in m["boxes"]} >= {"main", "stability", "audit", "claims", "runs"}
        for box in m["boxes"]:  # each table in a box of its own that scrolls sideways, inside the window
            assert box["scroll"] == "auto" and box["right"] <= width, (width, box)
        links = [(h, u) for h, u in m["links"]]
        bad = [why for h, u in links if (why := _check_link(h, u, m["ids"], sweep))]
        assert not bad, bad
        # the table of contents: every section, in the page's order
        assert m["toc"] == [f"#{s['id']}" for s in m["sections"]], m["toc"]
        assert m["claims"] == 2
    narrow = measured[420]
    assert any(b["overflow"] for b in narrow["boxes"])  # wide tables scroll in their box, not the page

    m = measured[1280]
    hrefs = {h for h, _ in m["links"]}
    odd = render.run_links(report)[list(report.runs["run"]).index(ODD_RUN)]
    assert odd in hrefs and "#" not in odd and "?" not in odd and '"' not in odd, odd
    assert {f"../{r}/" for r in report.runs["run"] if r != ODD_RUN} < hrefs  # every run's folder
    for name in (
        "main.csv",
        "main.tex",
        "claims.csv",
        "runs.csv",
        "tables.json",
        "curves.png",
        "curves.pdf",
        "eval_bars.png",
        "report.md",
    ):
        assert name in hrefs, name
    ids = [s["id"] for s in m["sections"]]
    assert "reference" not in ids  # no figure of the study matches: no section for it
    for s in m["sections"]:
        if s["tables"]:  # methods folded under the table, no long paragraph above it
            assert s["details"] == 1 and all(w <= 40 for w in s["words"]), s
        assert s["tables"] or s["words"], s  # no section empty

    # report.md: the same sections in the same order, the same links
    md = (report.out_dir / "report.md").read_text()
    titles = re.findall(r"^## (.+)$", md, re.M)
    assert [render.md_text(s["title"]) for s in m["sections"]] == titles
    md_links = set(re.findall(r"\]\(([^)\s]+)\)", md))
    assert md_links == hrefs, md_links ^ hrefs


def test_a_section_empty_by_construction_is_left_out_or_said_in_one_line(tmp_path):
    """No claims, no environment recorded, no figure of the study matching: the claims and environment
    sections are one line each, without the methods text of a table that is not there; the study's reference
    numbers get no section; both pages alike."""
    from klsweep.report.statistics import RULE

    sweep = sweepgen.write_sweep(tmp_path / "s", [{"kl.estimator": "k1"}, {"kl.estimator": "k3"}], seeds=2)
    report = rp.build_report(sweep, formats=("md", "html"), wandb=False)
    md = (report.out_dir / "report.md").read_text()
    page = (report.out_dir / "report.html").read_text()
    for text in (md, page):
        assert "Beside the study" not in text and RULE[:60] not in text
    for anchor, line in (("claims", render.NONE["claims"]), ("environment", render.NONE["environment"])):
        section = md.split(f'<a id="{anchor}"></a>')[1].split("<a id=")[0]
        assert section.split("\n\n")[1:3] == [f"## {render.md_text(render.TITLES[anchor])}", line], section
        section = page.split(f'<section id="{anchor}">')[1].split("</section>")[0].strip()
        said = render.html_inline(line)  # its `code` as <code>
        assert section == f'<h2>{html.escape(render.TITLES[anchor])}</h2>\n<p class="none">{said}</p>', (
            section
        )
