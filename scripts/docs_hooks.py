"""MkDocs hooks for the documentation site (mkdocs.yml names this file; nothing here is part of the package).

At build time this adds pages that are generated rather than written, so the Markdown in docs/ stays the single,
code-host-readable source:

- ``index.md``: the README, its links rewritten for the site;
- ``cli.md``: the command reference, from the CLI's own ``--help`` output (every command and subcommand);
- ``api/*.md``: API reference pages, rendered by mkdocstrings from the docstrings;
- ``project/*.md``: CONTRIBUTING, CHANGELOG, benchmarks/README, benchmarks/gpu/README and tests/README.

Links from these pages (and from docs/) to repository files outside docs/ are rewritten: to the generated page when
there is one, else to inline code naming the path. A link to a path that does not exist is left alone, so MkDocs'
strict mode reports it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[1]

# repository file -> page of the site
PROJECT_PAGES = {
    "README.md": "index.md",
    "CONTRIBUTING.md": "project/contributing.md",
    "CHANGELOG.md": "project/changelog.md",
    "benchmarks/README.md": "project/benchmarks.md",
    "benchmarks/gpu/README.md": "project/gpu-benchmarks.md",
    "tests/README.md": "project/tests.md",
}

# API page -> (title, intro, [objects rendered by mkdocstrings])
API_PAGES = {
    "api/reward.md": ("The Reward contract", "Every reward implements this interface; the base class owns input "
                      "handling, chunking, validation and locking.",
                      ["rewardkit.reward.Reward", "rewardkit.reward.RewardOutput", "rewardkit.reward.PairwiseOutput",
                       "rewardkit.reward.RewardBatch", "rewardkit.reward.RewardConfig", "rewardkit.errors"]),
    "api/registry.md": ("Registry and loading", "Rewards by name, plugins through the `rewardkit.rewards` entry point.",
                        ["rewardkit.registry"]),
    "api/rewards.md": ("Rewards", "One module per reward family.",
                       ["rewardkit.rewards.clipscore", "rewardkit.rewards.pickscore", "rewardkit.rewards.hpsv2",
                        "rewardkit.rewards.hpsv3", "rewardkit.rewards.imagereward", "rewardkit.rewards.aesthetic",
                        "rewardkit.rewards.editreward", "rewardkit.rewards.vqascore",
                        "rewardkit.rewards.unifiedreward", "rewardkit.rewards.preference", "rewardkit.rewards.evr",
                        "rewardkit.rewards.rational", "rewardkit.rewards.faithfulness",
                        "rewardkit.rewards.constraints", "rewardkit.rewards.detectors", "rewardkit.rewards.ocr",
                        "rewardkit.rewards.jpeg_compressibility",
                        "rewardkit.rewards.jpeg_incompressibility", "rewardkit.rewards.qwenvl"]),
    "api/compose.md": ("Composition", "Composites, the pure composition functions, rubric rewards and LoRA soups.",
                       ["rewardkit.compose.composite", "rewardkit.compose.functions", "rewardkit.compose.rubric",
                        "rewardkit.compose.soup", "rewardkit.compose.group", "rewardkit.compose.group_math"]),
    "api/judges.md": ("Judges", "Backends for MLLM judges and the failure policy.",
                      ["rewardkit.judges.base", "rewardkit.judges.policy", "rewardkit.judges.transformers_backend",
                       "rewardkit.judges.openai_backend", "rewardkit.judges.vllm_backend"]),
    "api/bench.md": ("Benchmarks", "The accuracy harness and its metrics.",
                     ["rewardkit.bench.harness", "rewardkit.bench.metrics", "rewardkit.bench.spec",
                      "rewardkit.bench.geneval"]),
    "api/train.md": ("Training", "Preference losses, data and the Bradley–Terry trainer.",
                     ["rewardkit.train.losses", "rewardkit.train.data", "rewardkit.train.preference_config",
                      "rewardkit.train.trainer"]),
    "api/rl.md": ("RL", "DiffusionNFT's math as pure functions, E²PO exploration and the bundled trainer.",
                  ["rewardkit.rl.schedule", "rewardkit.rl.solvers", "rewardkit.rl.nft", "rewardkit.rl.exploration",
                   "rewardkit.rl.config", "rewardkit.rl.trainer"]),
    "api/integrations.md": ("Integrations", "Adapters for RL trainers.",
                            ["rewardkit.integrations.flow_grpo", "rewardkit.integrations.trl",
                             "rewardkit.integrations.verl", "rewardkit.integrations.ddpo"]),
    "api/datasets.md": ("Datasets", "Scoring and filtering Parquet, WebDataset and Hugging Face datasets; Ray.",
                        ["rewardkit.datasets.scoring", "rewardkit.datasets.filtering", "rewardkit.datasets.sources",
                         "rewardkit.datasets.readers", "rewardkit.datasets.output", "rewardkit.datasets.expr",
                         "rewardkit.datasets.parrot", "rewardkit.datasets.ray_engine",
                         "rewardkit.integrations.ray"]),
    "api/serve.md": ("Serving", "The HTTP reward server and its client, in `rewardkit/serve/`: `rewardkit.server` "
                     "re-exports the server and loads a reward by name; `rewardkit.client` re-exports the client.",
                     ["rewardkit.server", "rewardkit.serve.client"]),
    "api/view.md": ("Reports", "`rewardkit view`: one static HTML page of score outputs, bench records and rl runs.",
                    ["rewardkit.view", "rewardkit.view.images", "rewardkit.view.scores", "rewardkit.view.multi",
                     "rewardkit.view.bench", "rewardkit.view.rl"]),
    "api/testing.md": ("Testing kit", "Tiny, randomly initialised real models for offline tests.",
                       ["rewardkit.testing", "rewardkit.conformance"]),
}

_LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")


def _rewrite_links(markdown: str, repo_path: str, page_path: str) -> str:
    """Links in ``repo_path`` (a file of the repository) as seen from ``page_path`` (its place in the site)."""
    repo_dir = posixpath.dirname(repo_path)
    page_dir = posixpath.dirname(page_path)

    def fix(m: re.Match) -> str:
        text, target = m.group(1), m.group(2)
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            return m.group(0)
        path, _, anchor = target.partition("#")
        full = posixpath.normpath(posixpath.join(repo_dir, path))
        if full.startswith("docs/"):
            site_target = full[len("docs/"):]
        elif full in PROJECT_PAGES:
            site_target = PROJECT_PAGES[full]
        elif (REPO / full).exists():  # a file or folder of the repository that the site does not carry
            label = text if text.startswith("`") else f"`{text}`"
            return label if text.strip("`") == full.rstrip("/") else f"{label} (`{full}`)"
        else:
            return m.group(0)  # broken: strict mode reports it
        rel = posixpath.relpath(site_target, page_dir or ".")
        return f"[{text}]({rel}{'#' + anchor if anchor else ''})"

    def fix_image(m: re.Match) -> str:  # a picture under docs/ (the README's first result), seen from the page
        alt, target = m.group(1), m.group(2)
        full = posixpath.normpath(posixpath.join(repo_dir, target))
        if re.match(r"^[a-z]+:", target) or not full.startswith("docs/"):
            return m.group(0)
        return f"![{alt}]({posixpath.relpath(full[len('docs/'):], page_dir or '.')})"

    return _IMAGE.sub(fix_image, _LINK.sub(fix, markdown))


def _help_of(parser: argparse.ArgumentParser) -> str:
    with contextlib.redirect_stdout(io.StringIO()):
        text = parser.format_help()
    return text


def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:  # argparse keeps subcommands here; there is no public accessor
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def cli_reference() -> str:
    import os

    os.environ.setdefault("COLUMNS", "100")  # argparse wraps at the terminal width: a fixed width for the page
    from rewardkit.cli import build_parser

    parser = build_parser()
    out = ["# Command reference", "",
           "Generated from the CLI's own `--help` when the site is built (`rewardkit <command> --help` prints the "
           "same text).", "", "```text", _help_of(parser).rstrip(), "```", ""]
    for name, sub in _subparsers(parser):
        out += [f"## `rewardkit {name}`", "", "```text", _help_of(sub).rstrip(), "```", ""]
        for subname, subsub in _subparsers(sub):
            out += [f"### `rewardkit {name} {subname}`", "", "```text", _help_of(subsub).rstrip(), "```", ""]
    return "\n".join(out)


def api_examples() -> dict[str, list[tuple[str, str, str]]]:
    """The runnable examples of the API pages (scripts/api_examples.py; tests/docs/test_api_examples.py runs them)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("rk_api_examples", REPO / "scripts" / "api_examples.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.API_EXAMPLES


def api_page(title: str, intro: str, objects: list[str], examples: list[tuple[str, str, str]] = ()) -> str:
    lines = [f"# {title}", "", intro, ""]
    if examples:
        lines += ["## Examples", "", "Each runs offline as shown and prints the output below it (the test suite runs "
                  "it), but one marked `# needs ...`, which is shown without output.", ""]
        for name, code, output in examples:
            lines += [f"**{name}**", "", "```python", code.rstrip(), "```", ""]
            if output:  # "" for an example that needs what the test suite lacks (`# needs a CUDA GPU`)
                lines += ["Output:", "", "```text", output.rstrip(), "```", ""]
        lines += ["## Reference", ""]
    for obj in objects:
        lines += [f"::: {obj}", ""]
    return "\n".join(lines)


def on_files(files, config):
    docs_dir = config["docs_dir"]
    for repo_path, page in PROJECT_PAGES.items():
        text = (REPO / repo_path).read_text(encoding="utf-8")
        files.append(File.generated(config, page, content=_rewrite_links(text, repo_path, page)))
    files.append(File.generated(config, "cli.md", content=cli_reference()))
    examples = api_examples()
    for page, (title, intro, objects) in API_PAGES.items():
        files.append(File.generated(config, page, content=api_page(title, intro, objects, examples.get(page, ()))))
    del docs_dir
    return files


# a Sphinx role left as text in a rendered page (scripts/griffe_roles.py turns them into cross-references):
# Markdown renders ":func:`x`" as ":func:<code>x</code>"
RAW_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|const|type):(?:<code>|`)[^<`]*")


def raw_roles(html: str) -> list[str]:
    """The raw Sphinx roles in a rendered page (code blocks aside: a page may show a role as an example)."""
    return RAW_ROLE.findall(re.sub(r"<pre\b.*?</pre>", "", html, flags=re.S))


def on_page_content(html, page, config, files):
    if page.file.src_uri.startswith("api/"):
        found = raw_roles(html)
        if found:
            from mkdocs.exceptions import PluginError

            raise PluginError(f"{page.file.src_uri}: {len(found)} raw Sphinx role(s) in the rendered page, e.g. "
                              f"{found[:3]} (scripts/griffe_roles.py should turn each into a cross-reference)")
    return html


def on_page_markdown(markdown, page, config, files):
    src = page.file.src_uri
    if page.file.generated_by is None and not src.startswith(("api/", "project/")) and src not in ("cli.md", "index.md"):
        return _rewrite_links(markdown, "docs/" + src, src)  # docs/*.md linking to benchmarks/README.md etc.
    return markdown
